"""The oracle cache, measured in one run against a real registry on this machine.

    python benchmarks/cache.py [--runs 3] [--big-gib 2.2] [--work DIR]
    python benchmarks/cache.py --quick      # CI: one round, a 64 MiB blob for (m2); every
                                            # figure still produced
    python benchmarks/cache.py --pin PIN    # another pin's oracle (default: pins/cpu.toml);
                                            # CI's quick run takes a small one (seconds)

Needs the CPU oracle built in the default home (`nox` does it) and Debian's docker-registry.

(p1) push of the oracle into an empty registry; (p2) the same push again with --replace:
     every blob is already there, so only the manifest, config and signature are written;
(r)  recovery into a fresh home from the registry (pull + verify + offline install +
     identity: `build --cache`), a cold uv cache, no wheelhouse;
(f)  the floor of the same work without oracle-build: the same blobs fetched with a plain
     HTTP client (no checks), the same offline uv install compiling bytecode, the first
     `import vllm`; (r) and (f) paired, round by round. Target: (r) <= 1.10x (f).
(m1) peak RSS of a pull of the CPU oracle (its wheels) into a fresh wheelhouse;
(m2) peak RSS of pushing and of pulling one blob larger than 2 GB. Target: <= 150 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packaging.utils import parse_wheel_filename  # noqa: E402

from benchmarks import fmt, neutral_dir  # noqa: E402
from oracle_build.cache.ref import parse, tag_for  # noqa: E402
from oracle_build.cache.registry import Registry  # noqa: E402
from oracle_build.cache.signing import generate  # noqa: E402
from oracle_build.contracts.lock import LockEntry  # noqa: E402
from oracle_build.contracts.pins import load_pin  # noqa: E402
from oracle_build.core import env as envmod  # noqa: E402
from oracle_build.core import layout  # noqa: E402
from oracle_build.oracle.venv import uv  # noqa: E402
from tests import registry as regmod  # noqa: E402

PIN = REPO / "pins" / "cpu.toml"
CLI = [sys.executable, "-m", "oracle_build"]


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def rss_of(code: str) -> tuple[float, float]:
    """Run ``code`` in a fresh interpreter; (peak RSS in MB, seconds)."""
    wrapper = ("import resource, sys, time\nt = time.monotonic()\n" + code +
               "\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
               "time.monotonic() - t)")
    out = subprocess.run([sys.executable, "-c", wrapper], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--big-gib", type=float, default=2.2)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true",
                    help="CI's mode: one round, a 64 MiB blob for (m2); the oracle of "
                    "ORACLE_BUILD_HOME")
    ap.add_argument("--pin", type=Path, default=PIN,
                    help="the pin whose oracle (built in the default home, ORACLE_BUILD_HOME) "
                    "is pushed and recovered (default: pins/cpu.toml)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.big_gib = 1, 1 / 16
    work = args.work or Path(tempfile.mkdtemp(prefix="oracle-cache-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pin = load_pin(args.pin)
    home = layout.default_home()
    record_path = layout.build_record_path(layout.oracle_path(home, pin.key))
    if not record_path.is_file():
        print(f"no oracle of {args.pin} in {home}: build it first (`nox` for the CPU pin)")
        return 2
    server = regmod.start(work / "registry")
    results: dict[str, object] = {}
    try:
        ref = server.ref()
        secret, _public, key = generate("bench-1", work / "keys")
        trusted = work / "trusted-keys"
        trusted.write_text(key.public_line + "\n")
        print(f"oracle-cache benchmark, pin {pin.key}, registry {ref}, work {work}", flush=True)

        push = [*CLI, "push", "--pin", str(args.pin), "--cache", ref, "--signing-key",
                str(secret)]
        p1 = timed(push)
        p2 = timed([*push, "--replace"])
        print(f"(p1) push into an empty registry:            {p1:7.2f} s", flush=True)
        print(f"(p2) push again, every blob already there:   {p2:7.2f} s", flush=True)
        results.update(p1_push_s=p1, p2_push_again_s=p2)

        with Registry(parse(ref)) as reg:
            manifest = json.loads(reg.get_manifest(tag_for(pin.content_hash, "cpu"))[0])
        layers = [(d["annotations"]["org.opencontainers.image.title"], d["digest"])
                  for d in manifest["layers"]]
        req = work / "req.txt"
        # what the recovery installs: the artifact's wheels, each by its layer's digest
        parsed = [(parse_wheel_filename(title), digest) for title, digest in layers]
        req.write_text("".join(
            LockEntry(str(name), str(version), (digest.removeprefix("sha256:"),))
            .requirement_line() + "\n" for (name, version, _b, _t), digest in parsed))
        env = {**envmod.build_env(), **envmod.UV}
        neutral = neutral_dir(work)
        rs: list[float] = []
        fs: list[float] = []
        for n in range(args.runs):
            fresh = work / f"home-r{n}"
            renv = {**os.environ, "XDG_CACHE_HOME": str(work / f"xdg-r{n}")}
            # a fresh home and a wheelhouse of its own (never ORACLE_BUILD_WHEELHOUSE's):
            # every wheel comes from the registry
            rs.append(timed([*CLI, "build", "--pin", str(args.pin), "--cache", ref,
                             "--trusted-keys", str(trusted),
                             "--home", str(fresh), "--wheelhouse", str(fresh / "wheelhouse")],
                            env=renv))
            shutil.rmtree(fresh)
            shutil.rmtree(work / f"xdg-r{n}", ignore_errors=True)
            # the floor: plain fetch, the same install, the first import
            start = time.monotonic()
            wheels = work / f"floor-wheels{n}"
            wheels.mkdir()
            for title, digest in layers:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v2/team/oracles/"
                                            f"blobs/{digest}") as resp, \
                        open(wheels / title, "wb") as fh:
                    shutil.copyfileobj(resp, fh, 1 << 20)
            venv = work / f"floor{n}"
            fenv = {**env, "XDG_CACHE_HOME": str(work / f"xdg-f{n}")}
            subprocess.run([uv(), "venv", "--python", pin.model.python, "--no-project",
                            str(venv)],
                           env=fenv, check=True, capture_output=True)
            subprocess.run([uv(), "pip", "install", "--python", str(venv / "bin/python"),
                            "--compile-bytecode", "--offline", "--no-index", "--find-links",
                            str(wheels), "--no-deps", "--require-hashes", "-r", str(req)],
                           env=fenv, check=True, capture_output=True)
            subprocess.run([str(venv / "bin/python"), "-I", "-c", "import vllm"], cwd=neutral,
                           env=fenv, check=True, capture_output=True)
            fs.append(time.monotonic() - start)
            for path in (wheels, venv, work / f"xdg-f{n}"):
                shutil.rmtree(path, ignore_errors=True)
            print(f"  round {n + 1}: recovery {rs[-1]:.2f} s, floor {fs[-1]:.2f} s", flush=True)
        ratio = statistics.median(rs) / statistics.median(fs)
        print(f"(r) recovery from the registry into a fresh home: {fmt(rs)}", flush=True)
        print(f"(f) floor (plain fetch + offline install + first import): {fmt(fs)}", flush=True)
        print(f"    ratio (r)/(f): {ratio:.2f}x  (target <= 1.10x)", flush=True)
        results.update(r_recovery_s=rs, f_floor_s=fs, r_over_f=ratio)

        # (m1) a pull's peak memory
        m1, m1s = rss_of(
            "from oracle_build.cli import main\n"
            f"assert main(['pull', '--pin', {str(args.pin)!r}, '--cache', {ref!r}, "
            f"'--trusted-keys', {str(trusted)!r}, "
            f"'--home', {str(work / 'home-m1')!r}, "
            f"'--wheelhouse', {str(work / 'home-m1' / 'wheelhouse')!r}]) == 0")
        print(f"(m1) peak RSS, pull of the oracle ({len(layers)} wheels): {m1:.0f} MB "
              f"({m1s:.1f} s)  (target <= 150 MB)", flush=True)
        shutil.rmtree(work / "home-m1", ignore_errors=True)
        # (m2) one blob larger than 2 GB, pushed and pulled
        big = work / "big.bin"
        block = os.urandom(1 << 20)
        with open(big, "wb") as fh:
            for _ in range(int(args.big_gib * 1024)):
                fh.write(block)
        h = hashlib.sha256()
        with open(big, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        digest, size = f"sha256:{h.hexdigest()}", big.stat().st_size
        setup = (f"from oracle_build.cache.ref import parse\n"
                 f"from oracle_build.cache.registry import Registry\n"
                 f"reg = Registry(parse({ref!r}))\n")
        m2_push, m2_push_s = rss_of(setup + f"reg.upload_blob({digest!r}, {size}, "
                                    f"lambda: open({str(big)!r}, 'rb'))")
        m2_pull, m2_pull_s = rss_of(setup + f"with open({str(work / 'big.out')!r}, 'wb') as fh:\n"
                                    f"    for c in reg.stream_blob({digest!r}, {size}):\n"
                                    "        fh.write(c)")
        same = (work / "big.out").stat().st_size == size
        print(f"(m2) one {size / 2**30:.2f} GiB blob: push peak RSS {m2_push:.0f} MB "
              f"({m2_push_s:.1f} s), pull peak RSS {m2_pull:.0f} MB ({m2_pull_s:.1f} s, "
              f"verified, {'same size' if same else 'SIZE DIFFERS'})  (target <= 150 MB)",
              flush=True)
        results.update(m1_pull_rss_mb=m1, m2_push_rss_mb=m2_push, m2_pull_rss_mb=m2_pull,
                       m2_blob_bytes=size)
        for path in (big, work / "big.out"):
            path.unlink(missing_ok=True)
    finally:
        server.stop()
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
