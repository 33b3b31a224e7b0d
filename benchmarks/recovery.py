"""Reimage recovery and overhead figures, measured in one run on this machine.

    python benchmarks/recovery.py [--runs 3] [--skip-cold] [--with-pip] [--work DIR]
    python benchmarks/recovery.py --quick    # CI: one round of (b), (c), (d), (d'); no cold
                                             # build, no (c0); every figure still produced
    python benchmarks/recovery.py --pin PIN  # another pin's oracle (default: pins/cpu.toml);
                                             # CI's quick run takes a small one (seconds)

(a) a cold build of the CPU oracle (empty wheelhouse: every wheel downloaded);
(b) a rebuild from the wheelhouse (fresh home, wheelhouse kept);
(c) the floor: the same work without oracle-build, a bare offline uv install of the same
    wheels into an empty venv compiling their bytecode (`--compile-bytecode`: an oracle's
    bytecode is part of its identity, so it is compiled at install) plus the first
    `import vllm`; (c0) for the record, the plain install without bytecode plus the first
    import (which then compiles only what it imports) (--with-pip: the install with pip,
    once);
(d) the identity check alone against a bare `import vllm` in the same venv.
(b) and (c) run paired, round by round. Prints medians and ratios; targets: (b) <= 1.05x
(c); (d) <= 1.2x. verify's and capture's speed is benchmarks/ci_speed.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import fmt, neutral_dir  # noqa: E402
from oracle_build.contracts.lock import LockEntry  # noqa: E402
from oracle_build.contracts.pins import load_pin  # noqa: E402
from oracle_build.core import env as envmod  # noqa: E402
from oracle_build.core import layout  # noqa: E402
from oracle_build.oracle import identity  # noqa: E402
from oracle_build.oracle.venv import uv  # noqa: E402

PIN = REPO / "pins" / "cpu.toml"
CLI = [sys.executable, "-m", "oracle_build"]


def timed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def run(argv: list[str], *, cwd: Path = REPO, env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, check=True, cwd=cwd, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env)


def cold_env(work: Path, tag: str) -> dict[str, str]:
    """A fresh XDG cache (so a fresh uv cache), as after a reimage; the wheelhouse survives."""
    cache = work / f"xdg-{tag}"
    shutil.rmtree(cache, ignore_errors=True)
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def requirements(record: dict[str, Any]) -> str:
    """What an oracle's build installed, as hash-checked requirement lines (its build
    record's distributions: every wheel's name, version and sha256), for the floor."""
    return "".join(LockEntry(d["name"], d["version"], (d["sha256"],)).requirement_line() + "\n"
                   for d in record["distributions"])


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def measure_identity(pin: Any, target: Any, oracle_venv: Path, runs: int, neutral: Path,
                     env: dict[str, str], results: dict[str, object]) -> None:
    # (d) identity alone vs a bare import of vllm in the same venv
    ds, bare, deep = [], [], []
    for _ in range(runs):  # paired: a bare import, the quick check, the full check
        bare.append(timed(lambda: run([str(oracle_venv / "bin/python"), "-I", "-B", "-c",
                                       "import vllm"], cwd=neutral, env=env)))
        ds.append(timed(lambda: identity.check(pin, target, oracle_venv)))
        deep.append(timed(lambda: identity.check(pin, target, oracle_venv, deep=True)))
    # the first import in a new venv also compiles every module's bytecode: (b)'s identity
    print(f"(d) identity check (probe):                    {fmt(ds)}", flush=True)
    print(f"    bare `import vllm`:                        {fmt(bare)}", flush=True)
    print(f"    ratio: {median(ds) / median(bare):.2f}x  (target <= 1.2x)", flush=True)
    results.update(d_identity_s=ds, d_bare_import_s=bare,
                   d_ratio=median(ds) / median(bare))
    # (d') every installed file hashed (identity's and build_oracle's default; --quick
    # hashes only files whose size or mtime moved)
    files = identity.check(pin, target, oracle_venv).files
    size_gb = sum(f.stat().st_size for f in oracle_venv.rglob("*")
                  if f.is_file() and not f.is_symlink()) / 1e9
    print(f"(d') identity --deep ({files.files if files else '?'} files, {size_gb:.1f} GB): "
          f"{fmt(deep)}; {median(deep) / median(bare):.2f}x a bare import", flush=True)
    print(f"    every file hashed / quick: {median(deep) / median(ds):.2f}x  (target <= 1.15x)",
          flush=True)
    results.update(d_deep_s=deep, d_deep_files=files.files if files else None,
                   d_deep_gb=size_gb)



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-cold", action="store_true", help="skip (a), which downloads 1.3 GB")
    ap.add_argument("--with-pip", action="store_true", help="also time pip for (c), once")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--quick", action="store_true",
                    help="CI's mode: one round, --skip-cold, without (c0); the oracle and "
                    "wheelhouse of ORACLE_BUILD_HOME / ORACLE_BUILD_WHEELHOUSE")
    ap.add_argument("--identity-only", action="store_true",
                    help="only (d) and (d'), on the default home's built oracle")
    ap.add_argument("--pin", type=Path, default=PIN,
                    help="the pin whose oracle is rebuilt (default: pins/cpu.toml); with "
                    "--skip-cold its wheels come from the default wheelhouse "
                    "(ORACLE_BUILD_WHEELHOUSE)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.skip_cold = 1, True
    work = args.work or Path(tempfile.mkdtemp(prefix="oracle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pin = load_pin(args.pin)
    target = pin.target("cpu")
    python = pin.model.python
    wheelhouse = work / "wheelhouse"
    results: dict[str, object] = {}
    print(f"oracle-build recovery benchmark, pin {pin.key}, work {work}", flush=True)

    if args.identity_only:
        measure_identity(pin, target, layout.oracle_path(layout.default_home(), pin.key),
                         args.runs, neutral_dir(work),
                         {**envmod.build_env(), **envmod.UV}, results)
        (work / "results.json").write_text(json.dumps(results, indent=2))
        return 0
    # (a) cold build
    if not args.skip_cold:
        shutil.rmtree(wheelhouse, ignore_errors=True)
        home = work / "home-cold"
        a = timed(lambda: run([*CLI, "build", "--pin", str(args.pin), "--home", str(home),
                               "--wheelhouse", str(wheelhouse)]))
        results["a_cold_build_s"] = a
        print(f"(a) cold build (download + install + identity): {a:7.2f} s (1 run)", flush=True)
    else:
        seed = layout.default_wheelhouse(layout.default_home()) / pin.key
        if not seed.is_dir():
            print("--skip-cold needs a filled default wheelhouse; run without it once")
            return 2
        # hard links where the file system allows (no 1.3 GB copied; wheels are never edited)
        shutil.copytree(seed, wheelhouse / pin.key, dirs_exist_ok=True,
                        copy_function=link_or_copy)

    # (b) rebuild from the wheelhouse and (c) the floor, paired: each round runs both
    req = work / "req.txt"  # written from the first rebuild's record
    env = {**envmod.build_env(), **envmod.UV}
    neutral = neutral_dir(work)
    bs: list[float] = []
    cs: list[float] = []
    c0s: list[float] = []
    for n in range(args.runs):
        home = work / f"home-b{n}"
        env_b = cold_env(work, f"b{n}")
        bs.append(timed(lambda home=home, env_b=env_b: run(  # type: ignore[misc]
            [*CLI, "build", "--pin", str(args.pin), "--home", str(home), "--wheelhouse",
             str(wheelhouse)], env=env_b)))
        record = json.loads((layout.oracle_path(home, pin.key) / "oracle-build" /
                             "build-record.json").read_text())
        assert record["origin"] == "wheelhouse", record["origin"]
        if not n:
            req.write_text(requirements(record))
        shutil.rmtree(work / f"xdg-b{n}", ignore_errors=True)  # a cold uv cache is 4 GB
        if n:
            shutil.rmtree(home)
        venv = work / f"floor{n}"

        def floor(venv: Path = venv, fenv: dict[str, str] = env,
                  compile_bytecode: bool = True) -> None:
            """The same work by hand: a venv, the locked wheels installed offline (their
            bytecode compiled, as the oracle's is), and the first `import vllm`."""
            run([uv(), "venv", "--python", python, "--no-project", str(venv)], env=fenv)
            run([uv(), "pip", "install", "--python", str(venv / "bin/python"),
                 *(["--compile-bytecode"] if compile_bytecode else []),
                 "--offline", "--no-index", "--find-links", str(wheelhouse / pin.key),
                 "--no-deps", "--require-hashes", "-r", str(req)], env=fenv)
            run([str(venv / "bin/python"), "-I", "-c", "import vllm"], cwd=neutral, env=fenv)

        cold = {**env, "XDG_CACHE_HOME": str(work / f"xdg-c{n}")}
        cs.append(timed(lambda venv=venv, cold=cold: floor(venv, cold)))  # type: ignore[misc]
        shutil.rmtree(venv)
        shutil.rmtree(work / f"xdg-c{n}", ignore_errors=True)  # a cold cache is 4 GB
        if not args.quick:
            cold = {**env, "XDG_CACHE_HOME": str(work / f"xdg-p{n}")}
            c0s.append(timed(lambda venv=venv, cold=cold: floor(  # type: ignore[misc]
                venv, cold, compile_bytecode=False)))
            shutil.rmtree(venv)
            shutil.rmtree(work / f"xdg-p{n}", ignore_errors=True)
        print(f"  round {n + 1}: rebuild {bs[-1]:.2f} s, floor {cs[-1]:.2f} s"
              + (f", plain floor {c0s[-1]:.2f} s" if c0s else ""), flush=True)
    print(f"(b) rebuild from the wheelhouse (cold uv cache): {fmt(bs)}", flush=True)
    steps = record["timings"]
    print("    its steps (last run): " + ", ".join(f"{k} {v:.1f}s" for k, v in steps.items()),
          flush=True)
    oracle_venv = layout.oracle_path(work / "home-b0", pin.key)
    print(f"(c) floor: offline uv install --compile-bytecode + first `import vllm`, cold "
          f"cache: {fmt(cs)}", flush=True)
    print(f"    ratio (b)/(c): {median(bs) / median(cs):.2f}x  (target <= 1.05x)", flush=True)
    results.update(b_rebuild_s=bs, c_floor_s=cs, b_over_c=median(bs) / median(cs))
    if c0s:
        print(f"(c0) plain floor: the install without bytecode + first `import vllm`: "
              f"{fmt(c0s)}", flush=True)
        print(f"    ratio (b)/(c0): {median(bs) / median(c0s):.2f}x  (for the record: the "
              "price of bytecode as identity)", flush=True)
        results.update(c0_plain_floor_s=c0s, b_over_c0=median(bs) / median(c0s))
    if args.with_pip:
        venv = work / "pipfloor"

        def pip_floor() -> None:
            run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
            run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install",
                 "--no-index", "--find-links", str(wheelhouse / pin.key), "--no-deps",
                 "--require-hashes", "-r", str(req)])

        p = timed(pip_floor)
        results["c_pip_s"] = p
        print(f"(c') the same with pip: {p:7.2f} s (1 run); pip/uv {p / median(cs):.1f}x",
              flush=True)

    measure_identity(pin, target, oracle_venv, args.runs, neutral, env, results)

    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"figures: {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
