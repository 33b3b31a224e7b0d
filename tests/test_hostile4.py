"""The fourth hostile reading of main (issue 54): each case as the issue found it, a test that
failed on 93e0121 and passes now (docs/reliability.md, "The fourth hostile reading")."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from oracle_build.core import layout
from oracle_build.core.errors import BadInput, OutputFailed
from oracle_build.core.filelock import held


def test_a_symlinked_engine_lock_is_refused_and_its_target_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORACLE_BUILD_ENGINE_LOCK a symlink: the lock's own path is the link (its folder
    resolved, not its name), so held()'s O_NOFOLLOW refuses it, exit 14; before, the path was
    resolved first and the link's target was truncated to a pid and locked."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "engine.lock"
    link.symlink_to(victim)
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(link))
    path = layout.engine_lock(tmp_path / "home")
    assert path == link
    with pytest.raises(OutputFailed) as err, held(path, what="a vLLM engine"):
        pass
    assert err.value.exit_code == 14 and "symlink" in str(err.value)
    assert victim.read_text() == "precious\n"
    # a symlinked folder above the lock is resolved (a lock under /var/lock -> /run/lock)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(tmp_path / "via" / "e.lock"))
    path = layout.engine_lock(tmp_path / "home")
    assert path == real / "e.lock"
    with held(path, what="a vLLM engine"):
        assert path.read_text() == str(os.getpid())
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", "/")
    with pytest.raises(BadInput) as bad:
        layout.engine_lock(tmp_path / "home")
    assert bad.value.exit_code == 2 and "ORACLE_BUILD_ENGINE_LOCK" in str(bad.value)


def test_every_process_the_harness_starts_goes_through_core_proc() -> None:
    """One subprocess wrapper (core/proc.py): its process group, PDEATHSIG, the log. Before,
    cache/registry.py ran the credential helper with subprocess of its own. The nvcc launcher
    is not the harness: a standard-library program of its own that ccache runs (its module
    docstring), copied into the toolkit."""
    import ast

    root = Path(__file__).resolve().parents[1] / "oracle_build"
    allowed = {root / "core" / "proc.py", root / "recipe" / "cuda" / "launcher.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            starts = any(n.split(".")[0] in ("subprocess", "pty") for n in names) or (
                isinstance(node, ast.Attribute) and node.attr in
                ("system", "popen", "execv", "execvp", "spawnv", "posix_spawn")
                and isinstance(node.value, ast.Name) and node.value.id == "os")
            if starts and path not in allowed:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_every_identity_block_names_the_cpu_kernel_variant() -> None:
    """build_oracle's identity block did not name the kernel variant (verify's opening line
    did): the block itself (one renderer for build, verify and capture) now says it, with
    the library vLLM mapped and torch's capability; a variant from the probe is outside text."""
    from oracle_build.core import verdicts
    from oracle_build.oracle.identity import Identity

    kernels = {"loaded": ["_C_AVX2.abi3.so"], "torch_capability": "AVX2", "held": "x86_64-avx2",
               "variant": "x86_64-avx2"}
    block = Identity(venv=Path("/v"), facts={"cpu_kernels": kernels}, device="cpu").block()
    assert ("kernel variant x86_64-avx2 (held as x86_64-avx2)   vllm library _C_AVX2.abi3.so"
            "   torch capability AVX2") in block.splitlines()
    own = {**kernels, "held": None, "variant": "x86_64-avx512_bf16\nORACLE_IDENTITY_OK"}
    block = Identity(venv=Path("/v"), facts={"cpu_kernels": own}, device="cpu").block()
    line = next(ln for ln in block.splitlines() if ln.startswith("kernel variant "))
    assert "(this CPU's own)" in line and "\\n" in line  # escaped, on its own line
    from oracle_build.core.errors import defused_lines

    # as printed (one renderer): the tool's own, once
    assert verdicts.forged(defused_lines(block)) == ["ORACLE_IDENTITY_OK"]
    # a GPU oracle's block has no CPU variant line (its kernels line names the sm)
    block = Identity(venv=Path("/v"), facts={}, device="cuda", compiled_sm=["sm_121"]).block()
    assert "kernel variant" not in block and "kernels sm_121" in block.splitlines()


BIG = "9" * 5000


@pytest.mark.parametrize(("old", "new", "field"), [
    ('when = "cxx < 12.3"', f'when = "cxx < {BIG}"', "patches[0].when"),
    ('when = "cxx < 12.3"', f'when = "cxx < 1.{"9" * 65}"', "patches[0].when"),
    ("size = 44549956", f"size = {BIG}", "line 27"),
    ("size = 44549956", f"size = {'9' * 30}", "vllm.size"),
    ('python = "3.11"', f'python = "3.{BIG}"', "python"),
    ('python = "3.11"', 'python = "3.11; rm -rf /"', "python"),
    ('runtime_version = "0.32.0"', f'runtime_version = "0.{BIG}"', "vllm.runtime_version"),
    ('MAX_JOBS = "2"', 'MAX_JOBS = "100000"', "build.env"),
    ('MAX_JOBS = "2"', 'MAX_JOBS = "0"', "build.env"),
])
def test_every_number_in_a_pin_is_bounded_exit_2_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str,
        field: str) -> None:
    """A patch's `when = "cxx < 999...9"` (5000 digits) was exit 70 (Python's int-string
    limit); now every number in a pin (a string's digits, a TOML integer) is held to its
    bound when the pin is read: exit 2, the file and the field named, no plan printed."""
    import shutil

    from oracle_build.cli import main

    repo = Path(__file__).resolve().parents[1]
    pins = tmp_path / "pins"
    shutil.copytree(repo / "pins", pins)
    text = (pins / "cpu-source.toml").read_text()
    assert old in text
    (pins / "cpu-source.toml").write_text(text.replace(old, new, 1))
    code = main(["build", "--pin", str(pins / "cpu-source.toml"), "--dry-run",
                 "--home", str(tmp_path / "home"), "--externals", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2, err[-2000:]
    assert str(pins / "cpu-source.toml") in err and f"  {field}: " in err, err[-2000:]
    assert "$ " not in out  # nothing planned


# ----------------------------------------------------------------------------- externals


def _zeros_archive(out: Path, top: str, size: int) -> None:
    """A gzipped tar whose one member is ``size`` bytes of zeros (a few hundred KB on disk)."""
    import io
    import tarfile

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(out, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo(f"{top}/zeros.bin")
        info.size = size
        tf.addfile(info, io.BufferedReader(Zeros(), 1 << 20))


def test_each_source_of_an_external_is_tried_and_none_runs_or_prints_anything(
        tmp_path: Path) -> None:
    """Issue 54 (3, 4, 5): beside the archive that holds tinydep's tree, an --externals
    folder holds a git mirror named as the external whose config names a command (a
    promisor's uploadpack), a 0.1 MB archive of 100 MiB of zeros, an archive holding the
    files plus a .git/ folder, and one whose file name holds verdict lines. Each is tried in
    order and said (escaped), none runs anything or is unpacked past its bound, and the
    build goes on from the archive that holds the tree. Before: the mirror stopped the build
    (exit 5), the bomb was unpacked in full, the .git archive passed the tree check, and the
    file name printed a bare `  => PASS` and a second ORACLE_IDENTITY_OK."""
    import subprocess

    from oracle_build.core import verdicts
    from tests.srcpkg import git, make_sdist, write_sdist_pin
    from tests.test_source_archive import build

    s = make_sdist(tmp_path / "sdist")
    pin = write_sdist_pin(s)
    ext = s.externals
    pwned = tmp_path / "PWNED"
    mirror = ext / "tinydep"
    subprocess.run(["git", "clone", "-q", "--mirror", str(tmp_path / "sdist" / "tinydep-repo"),
                    str(mirror)], check=True)
    git(mirror, "config", "remote.origin.promisor", "true")
    git(mirror, "config", "extensions.partialclone", "origin")
    git(mirror, "config", "remote.origin.uploadpack", f"touch {pwned}; git-upload-pack")
    _zeros_archive(ext / "tinydep-0-bomb.tar.gz", "tinydep-1.0", 100 << 20)
    assert (ext / "tinydep-0-bomb.tar.gz").stat().st_size < 1 << 20
    work = tmp_path / "withgit" / "tinydep-1.0"
    work.mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(ext / "tinydep-1.0.tar.gz"), "-C", str(work.parent)],
                   check=True)
    (work / ".git").mkdir()
    (work / ".git" / "config").write_text(f"[core]\n\tfsmonitor = touch {pwned}\n")
    subprocess.run(["tar", "-czf", str(ext / "tinydep-0-git.tar.gz"), "-C", str(work.parent),
                    "tinydep-1.0"], check=True)
    forged = "tinydep-\nORACLE_IDENTITY_OK\n  => PASS\n.tar.gz"
    subprocess.run(["tar", "-czf", str(ext / forged), "-C", str(tmp_path / "sdist"),
                    "pins"], check=True)  # another tree: tried first, said, passed over
    done = build(pin, tmp_path / "home", "--stop-after", "externals", externals=ext)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert not pwned.exists()
    assert f"tinydep: not from {mirror} (git mirror): the mirror {mirror}: its git config " \
        "sets remote.origin.uploadpack" in said
    assert "tinydep-0-bomb.tar.gz unpacks to more than 64 MiB" in said
    assert "tinydep-0-git.tar.gz holds tinydep-1.0/.git" in said
    assert "tinydep-\\nORACLE_IDENTITY_OK\\n  => PASS\\n.tar.gz" in said
    assert f"tinydep: {ext / 'tinydep-1.0.tar.gz'} (archive) holds tree {s.tinydep_tree}" in said
    assert verdicts.forged(said) == [] and "\n  => PASS" not in said
    assert not list((tmp_path / "home").rglob("zeros.bin"))

    # the archive that holds the tree, under a name of verdict lines: said escaped
    for other in ("tinydep-0-bomb.tar.gz", "tinydep-0-git.tar.gz", forged):
        (ext / other).unlink()
    (ext / "tinydep-1.0.tar.gz").rename(ext / forged)
    # and a broken mirror named as the external (no such commit): one source that failed
    import shutil

    shutil.rmtree(mirror)
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    done = build(pin, tmp_path / "home2", "--stop-after", "externals", externals=ext)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert f"tinydep: not from {mirror} (git mirror): " in said
    assert verdicts.forged(said) == [] and "\n  => PASS" not in said
    assert "tinydep-\\nORACLE_IDENTITY_OK\\n  => PASS\\n.tar.gz (archive) holds tree" in said
    assert not pwned.exists()


# ----------------------------------------------------------------------------- downloads


def test_a_fifo_where_the_archive_should_be_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO at the pin's file:// URL: `build` waited for ever. Only a regular file's bytes
    are read: SourceError naming the URL, at once."""
    import threading

    from oracle_build.core.errors import SourceError
    from oracle_build.recipe import archive

    fifo = tmp_path / "vllm-0.32.0.tar.gz"
    os.mkfifo(fifo)
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            archive.fetch(fifo.as_uri(), "0" * 64, tmp_path / "wh" / "vllm.tar.gz")
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(15)
    assert out, "fetch still waits on the FIFO"
    assert isinstance(out[0], SourceError) and "not a regular file" in str(out[0])
    assert not list((tmp_path / "wh").glob("*.part"))


def _serve(body: Any) -> tuple[str, Any]:
    """A loopback HTTP server whose one answer is written by ``body(wfile)``."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                body(self.wfile)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/vllm.tar.gz", server


def test_a_dripping_or_endless_download_is_stopped(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that sends a byte every 0.2 s never tripped the read timeout and had no
    deadline; one that sends without end grew the .part file without bound when the pin
    has no size. Now: below SPEED_LIMIT over SPEED_TIME stops (curl's --speed-limit), and
    past MAX_DOWNLOAD (or the pin's size) stops, each named, no .part left."""
    import time

    from oracle_build.core.errors import SourceError
    from oracle_build.recipe import archive

    def drip(w: Any) -> None:
        for _ in range(100):
            w.write(b"x")
            w.flush()
            time.sleep(0.2)

    def endless(w: Any) -> None:
        for _ in range(1000):
            w.write(b"y" * 65536)

    monkeypatch.setattr(archive, "SPEED_TIME", 1.5)
    monkeypatch.setattr(archive, "SPEED_LIMIT", 1000)
    monkeypatch.setattr(archive, "CHUNK", 1)  # every byte read as it comes
    url, server = _serve(drip)
    start = time.monotonic()
    with pytest.raises(SourceError, match=r"bytes a second over the last .* below the 1000"):
        archive.fetch(url, "0" * 64, tmp_path / "a" / "vllm.tar.gz")
    assert time.monotonic() - start < 10  # the drip lasts 20 s
    server.shutdown()
    server.server_close()
    monkeypatch.setattr(archive, "CHUNK", 1 << 20)
    monkeypatch.setattr(archive, "MAX_DOWNLOAD", 1 << 20)
    url, server = _serve(endless)
    with pytest.raises(SourceError, match="sent more than the 1048576 bytes a download may be"):
        archive.fetch(url, "0" * 64, tmp_path / "b" / "vllm.tar.gz")
    with pytest.raises(SourceError, match=r"sent more than the 4096 bytes the pin records"):
        archive.fetch(url, "0" * 64, tmp_path / "c" / "vllm.tar.gz", size=4096)
    server.shutdown()
    server.server_close()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".part")]


def test_the_externals_command_reads_no_mirror_whose_config_names_a_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`externals --checkout DIR --externals MIRRORS` with a mirror whose config names a
    command (a promisor remote's uploadpack, a core.fsmonitor): before, git ran in it; now
    it is reported as the reason the external is unestablished, and nothing runs there."""
    import subprocess
    import tomllib

    from oracle_build.cli import main
    from tests.test_checkout import TREE, make_mirrors

    make_mirrors(tmp_path / "mirrors")
    pwned = tmp_path / "PWNED"
    cutlass = tmp_path / "mirrors" / "cutlass"
    for key, value in (("remote.origin.promisor", "true"),
                       ("remote.origin.uploadpack", f"touch {pwned}; git-upload-pack"),
                       ("core.fsmonitor", f"touch {pwned}; echo")):
        subprocess.run(["git", "-C", str(cutlass), "config", key, value], check=True)
    code = main(["externals", "--checkout", str(TREE), "--machine", "aarch64", "--externals",
                 str(tmp_path / "mirrors")])
    out, err = capsys.readouterr()
    assert code == 10, err[-2000:]
    entry = next(e for e in tomllib.loads(out)["externals"] if e["name"] == "cutlass")
    reason = entry["commit"]["reason"]
    assert "its git config sets core.fsmonitor, remote.origin.uploadpack" in reason
    assert "nothing run there" in reason and "cutlass" in err
    assert not pwned.exists()


@pytest.mark.parametrize("name", ["CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "CPPFLAGS",
                                  "NVCC_APPEND_FLAGS", "CCACHE_PREFIX", "LD_PRELOAD"])
def test_a_capture_spec_may_not_choose_the_engines_compiler(name: str) -> None:
    """Issue 54 (1): torch inductor compiles the engine's CPU kernels with CXX at run time,
    so a spec's [env] naming a compiler or its flags is refused naming the key (LD_* was
    already: the loader)."""
    from oracle_build.core.env import spec_env_problems

    problems = spec_env_problems({name: "gcc", "OMP_NUM_THREADS": "2"}, "env")
    assert [field for field, _ in problems] == [f"env.{name}"]
    if not name.startswith("LD_"):
        assert "compiler" in problems[0][1]


@pytest.mark.skipif(not __import__("shutil").which("ccache"), reason="needs ccache")
def test_the_compiler_cache_reads_no_configuration_but_the_tools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 54 (1): a compiler cache folder whose ccache.conf says `prefix_command =
    /tmp/wrap.sh` ran the wrapper around every compile, unrecorded. Now the build's ccache
    is pointed (CCACHE_CONFIGPATH) at a file nothing writes: ccache itself, asked for its
    configuration under the build's settings, shows no prefix_command; the folder's file is
    said once."""
    import subprocess

    from oracle_build.recipe import toolchain

    folder = tmp_path / "cc"
    folder.mkdir()
    (folder / "ccache.conf").write_text(f"prefix_command = {tmp_path}/wrap.sh\n")
    monkeypatch.setenv("ORACLE_BUILD_COMPILER_CACHE", str(folder))
    staging = tmp_path / "staging"
    staging.mkdir()
    cache = toolchain.compiler_cache(tmp_path / "home", staging)
    assert "ccache.conf is not read" in capsys.readouterr().err
    env = {**os.environ, **cache.env(staging, toolchain.PathMap(staging, ()))}
    shown = subprocess.run(["ccache", "-p"], env=env, capture_output=True, text=True,
                           check=True).stdout
    assert "wrap.sh" not in shown and f"cache_dir = {folder}" in shown
    # without it, the same folder's file is what ccache reads: the test can tell
    env.pop("CCACHE_CONFIGPATH")
    plain = subprocess.run(["ccache", "-p"], env=env, capture_output=True, text=True,
                           check=True).stdout
    assert "wrap.sh" in plain
    assert not (staging / "ccache.conf.none").exists()


# the small sdist's CMakeLists, one line more: a download no externals parser can see (a
# future vLLM's may hold one), against a loopback server the test runs on the host
PROBE_CMAKE = """
file(DOWNLOAD "http://127.0.0.1:{port}/probe" "${{CMAKE_BINARY_DIR}}/probe.txt"
     STATUS probe_status TIMEOUT 5)
message(STATUS "probe: ${{probe_status}}")
"""
# a caller's CMake toolchain file that runs a command and plants bytes in every object
TOOLCHAIN = """execute_process(COMMAND "{touch}" "{pwned}")
set(CMAKE_C_FLAGS_INIT "-include {planted}")
"""


def _counting_server() -> tuple[int, list[str], Any]:
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1], seen, server


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not __import__("shutil").which("ccache"), reason="needs ccache")
def test_a_build_takes_nothing_of_the_callers_environment_and_has_no_network(
        tmp_path: Path) -> None:
    """Issue 54 (1, 2): the small sdist, whose CMakeLists also downloads from a server the
    test runs on the host's loopback, built by a caller whose environment names a CMake
    toolchain file (it runs a command and plants bytes in every object), CPATH, CFLAGS,
    a pip index, its own locale and time zone. The control first: the same toolchain file
    and download in a plain CMake run on this host run the command and reach the server.
    The build: exit 0, the command never ran, no planted bytes, the server saw nothing; the
    caller's variables said once, by name; the record lists the environment the build ran
    with (no variable of the caller's but the locale) and says the network was closed, as
    identity does. Then `--check`: its second build's environment is stripped of the
    caller's locale and time zone, and the bytes are the same."""
    import json
    import shutil
    import subprocess
    import sys

    from oracle_build.contracts.pins import load_pin
    from tests.conftest import REPO
    from tests.srcpkg import make_sdist, write_sdist_pin

    port, seen, server = _counting_server()
    try:
        pwned = tmp_path / "PWNED"
        planted = tmp_path / "planted.h"
        planted.write_text('const char planted[] __attribute__((used)) = "PLANTED-BYTES";\n')
        tc = tmp_path / "tc.cmake"
        tc.write_text(TOOLCHAIN.format(touch=shutil.which("touch"), pwned=pwned,
                                       planted=planted))
        hostile = {"CMAKE_TOOLCHAIN_FILE": str(tc), "CPATH": str(tmp_path),
                   "CFLAGS": "-DPLANTED=1", "CMAKE_GENERATOR": "Unix Makefiles",
                   "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "LANG": "C.UTF-8",
                   "TZ": "Asia/Tokyo", "SOME_API_TOKEN": "hunter2"}
        # the control: what this environment does to a plain CMake run here
        control = tmp_path / "control"
        control.mkdir()
        (control / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.20)\nproject(control C)\n"
            + PROBE_CMAKE.format(port=port))
        done = subprocess.run(["cmake", "-S", str(control), "-B", str(control / "b")],
                              env={**os.environ, **hostile}, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert pwned.exists() and seen == ["/probe"], (seen, done.stdout[-2000:])
        pwned.unlink()
        seen.clear()

        # issue 63: the package's own code, which the build's identity probe imports, reaches
        # for the same server and notes the HOME it runs with
        homes = tmp_path / "homes-seen"
        s = make_sdist(tmp_path / "w", cmake_extra=PROBE_CMAKE.format(port=port),
                       init_extra=INIT_REACHES.format(port=port, homes=str(homes)))
        pin = write_sdist_pin(s)
        env = {**os.environ, **hostile,
               "ORACLE_BUILD_COMPILER_CACHE": str(tmp_path / "cc")}

        def ob(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "oracle_build", "build", "--pin", str(pin), "--home",
                 str(tmp_path / "home"), "--externals", str(s.externals), *args],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                check=False)

        first = ob()
        assert first.returncode == 0, first.stderr[-3000:]
        assert not pwned.exists(), "the caller's toolchain file ran"
        assert seen == [], f"the build reached the host's network: {seen}"
        note = next(ln for ln in first.stderr.splitlines()
                    if ln.startswith("note: the build's environment is built"))
        for name in ("CMAKE_TOOLCHAIN_FILE", "CPATH", "CFLAGS", "CMAKE_GENERATOR"):
            assert name in note
        assert "hunter2" not in first.stderr + first.stdout
        key = load_pin(pin).key
        venv = layout.oracle_path(tmp_path / "home", key)
        (lib,) = venv.glob("lib/python3.*/site-packages/vllm/_C*.so")
        assert b"PLANTED-BYTES" not in lib.read_bytes()
        record = json.loads(layout.build_record_path(venv).read_text())
        environment = record["environment"]
        assert environment["network"].startswith("closed (a network namespace")
        for name in ("CMAKE_TOOLCHAIN_FILE", "CPATH", "CFLAGS", "CMAKE_GENERATOR"):
            assert name in environment["dropped"] and name not in environment["base"]
            assert environment["wheel"].get(name) != hostile[name]  # CFLAGS: the path map
        assert set(environment["base"]) <= {"PATH", "HOME", "TMPDIR", "SOURCE_DATE_EPOCH",
                                            "LANG", "TZ", "USER", "LOGNAME", "TERM",
                                            "LANGUAGE", "NO_COLOR", "MAX_JOBS",
                                            "PIP_CONFIG_FILE"} | {
            k for k in environment["base"] if k.startswith("LC_")}
        assert environment["base"]["TZ"] == "Asia/Tokyo"
        assert environment["base"]["HOME"] == "<staging>/home"
        assert environment["wheel"]["CMAKE_ARGS"]
        assert "SOME_API_TOKEN" not in environment["wheel"]
        # the build log holds CMake's own word: the download failed, inside the namespace
        (kept,) = (venv / "oracle-build").glob("build.log")
        assert "probe: 7;" in kept.read_text() or "probe: 6;" in kept.read_text()
        assert "built with the network closed (" in first.stdout
        # the identity probe ran the package's __init__ closed, with the build's HOME
        seen_homes = homes.read_text().split()
        assert seen_homes and os.environ["HOME"] not in seen_homes
        assert all(h.endswith("/home") and "staging" in h for h in seen_homes), seen_homes
        assert "runs with the network closed (" in first.stdout

        check = ob("--check")
        assert check.returncode == 0, check.stderr[-3000:]
        assert "stripped: LANG=C.UTF-8, TZ=UTC" in check.stderr
        assert "ORACLE_REPRODUCED: 1 compiled files compared" in check.stdout
        assert not pwned.exists() and seen == []
    finally:
        server.shutdown()
        server.server_close()


# what the package's vllm/__init__.py also does in the build test (issue 63): reach for the
# host's loopback server, and note its HOME
INIT_REACHES = """
import os as _os, urllib.request as _u
try:
    _u.urlopen("http://127.0.0.1:{port}/from-init", timeout=3).read()
except OSError:
    pass
with open({homes!r}, "a") as _f:
    _f.write(_os.environ.get("HOME", "-") + "\\n")
"""


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="Linux namespaces")
@pytest.mark.parametrize("how", ["netns", "userns"])
def test_a_closed_command_reaches_nothing_but_its_own_loopback(how: str) -> None:
    """Issue 54 (2): each way core.proc closes a command's network (root's network namespace,
    an unprivileged user's user and network namespace): the child's loopback is up (it can
    listen on and reach itself), and a server on the host's loopback is out of its reach;
    the same child unclosed reaches it (the control)."""
    import socket
    import sys

    from oracle_build.core import proc

    if how == "netns" and os.geteuid() != 0:
        pytest.skip("a network namespace alone needs root")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    child = ("import socket, sys\n"
             "own = socket.socket(); own.bind(('127.0.0.1', 0)); own.listen(1)\n"
             "socket.create_connection(own.getsockname(), timeout=5).close()\n"
             f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
             "except OSError:\n    sys.exit(3)\n")
    try:
        closed = proc.Live([sys.executable, "-c", child], capture=True, echo=False,
                           closed=how).finish(check=False)
        assert closed.returncode == 3, closed.output
        control = proc.Live([sys.executable, "-c", child], capture=True,
                            echo=False).finish(check=False)
        assert control.returncode == 0, control.output
    finally:
        server.close()
    assert proc.network_closure()[0] in ("netns", "userns")


# the package's own writers of its console; inside/ scripts run in the oracle venv and speak
# JSON to the harness (they import nothing of it), the nvcc launcher is a program of its own
CONSOLE_WRITERS = {"core/log.py"}
OWN_PROGRAMS = ("inside/", "recipe/cuda/launcher.py")


def test_every_line_the_tool_prints_goes_through_the_one_renderer() -> None:
    """Issue 54 (3) by construction: no module writes to stdout or stderr but core/log.py
    (``say``, ``emit``: every line through ``errors.defused_lines``), and no module but
    core/verdicts.py marks a line as a verdict (``verdict_line``); the mark itself is only
    errors.py's. A call site that formats an unescaped value can then print neither a
    verdict line nor a terminal escape: the renderer stands between every value and the
    console."""
    import ast

    from tests.conftest import REPO

    package = REPO / "oracle_build"
    writers, markers = [], []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith(OWN_PROGRAMS):
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                    f, ast.Attribute) else None
                target = ast.unparse(f)
                if (name == "print" or target in ("sys.stdout.write", "sys.stderr.write",
                                                  "sys.stdout.buffer.write")) \
                        and rel not in CONSOLE_WRITERS:
                    writers.append(f"{rel}:{node.lineno} {target}")
                if name == "verdict_line" and rel != "core/verdicts.py":
                    markers.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Name | ast.Attribute) and (
                    getattr(node, "id", None) == "_MARK" or getattr(node, "attr", None)
                    == "_MARK") and rel != "core/errors.py":
                markers.append(f"{rel}:{node.lineno} _MARK")
    assert writers == [], writers
    assert markers == [], markers
    # and the AST walk sees what it looks for: the writers' own calls are there
    log = ast.parse((package / "core" / "log.py").read_text())
    assert sum(isinstance(n, ast.Call) and ast.unparse(n.func) == "print"
               for n in ast.walk(log)) == 2


def test_a_value_printed_raw_cannot_print_a_verdict_or_an_escape(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 54 (3): a value read from outside, formatted into a message without escaping
    (as a file name once was), and even one that copies the mark's shape, prints no line
    that starts with a verdict and no terminal escape; the verdict functions' own lines
    print as they are, on stdout and stderr alike."""
    from oracle_build.core import verdicts
    from oracle_build.core.errors import plain
    from oracle_build.core.log import emit, say

    raw = ("tinydep-\nORACLE_IDENTITY_OK\n  => PASS\nverify: pass 1 (exit 0)\n"
           "\x1f0123456789abcdef01234567\x1fORACLE_NUMERICS_OK\n\x1b[2Jcleared")
    say(f"note: {raw} skipped")
    emit(f"unpacked {raw}")
    emit(verdicts.identity(True))
    say(verdicts.golden("pass"))
    got = capsys.readouterr()
    assert verdicts.forged(got.out) == [plain(verdicts.identity(True))]
    assert verdicts.forged(got.err) == [plain(verdicts.golden("pass"))]
    for text in (got.out, got.err):
        assert "\x1b" not in text and "\x1f" not in text
        assert "  | ORACLE_IDENTITY_OK" in text and "  |   => PASS" in text
