"""The engine's compile caches (oracle_build/engine/caches.py): the tool's own folder per
oracle, a journal while an engine runs on it, and a cache an unfinished run wrote into
discarded before the next engine starts.

The failure this guards against happened in CI: a capture killed while torch's inductor
linked a kernel left an empty ``.main.so`` in the host's shared /tmp/torchinductor_root,
and every engine started after it, in any home, failed with ``file too short``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle_build.core import layout
from oracle_build.core.errors import OutputFailed
from oracle_build.core.filelock import held
from oracle_build.engine import caches
from oracle_build.engine.caches import CompileCache
from tests.conftest import COMPILE_CACHE_ENV, REPO, BuiltOracle, default_compiler


def driver_module() -> object:
    """inside/driver.py as the oracle's python loads it (standard library at import)."""
    spec = importlib.util.spec_from_file_location(
        "driver_under_test", REPO / "oracle_build" / "inside" / "driver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cache_is_the_homes_or_the_variables(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    assert layout.compile_cache(tmp_path, "cpu-abc") == tmp_path / "compile-cache" / "cpu-abc"
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "shared"))
    assert layout.compile_cache(tmp_path / "home", "cpu-abc") == \
        (tmp_path / "shared" / "cpu-abc").resolve()


def test_a_clean_run_leaves_no_journal_and_keeps_the_cache(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    cache = CompileCache(tmp_path / "cpu-abc")
    with cache.in_use("verify x") as use:
        assert json.loads(cache.journal.read_text())["pid"] == os.getpid()
        (cache.root / "inductor").mkdir()
        (cache.root / "inductor" / "k.main.so").write_bytes(b"\x7fELF kernel")
        use.clean = True
    assert not cache.journal.exists()
    with cache.in_use("verify x") as use:  # the next run keeps what the last one compiled
        assert (cache.root / "inductor" / "k.main.so").read_bytes() == b"\x7fELF kernel"
        use.clean = True
    assert "discard" not in capsys.readouterr().err


@pytest.mark.parametrize("how", ["failed", "raised"])
def test_an_unfinished_run_has_its_cache_discarded_by_the_next(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    """An engine that answered not-ok, or a harness interrupted while it ran (the exception
    stands for a KeyboardInterrupt): the journal stays, and the next run starts from an
    empty cache."""
    cache = CompileCache(tmp_path / "cpu-abc")
    poisoned = cache.root / "inductor" / "n2" / "k.main.so"
    try:
        with cache.in_use("capture tiny") as use:
            poisoned.parent.mkdir(parents=True)
            poisoned.write_bytes(b"")  # what a linker killed as it opened its output leaves
            if how == "raised":
                raise KeyboardInterrupt
            use.clean = False
    except KeyboardInterrupt:
        pass
    assert cache.journal.exists()
    assert "the next engine start discards its compile cache" in capsys.readouterr().err
    with cache.in_use("verify tiny") as use:
        err = capsys.readouterr().err
        assert "did not finish" in err and "capture tiny" in err and str(cache.root) in err
        assert not poisoned.exists()
        assert emptied(cache)  # an empty cache for this start
        use.clean = True
    assert not cache.journal.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-abc", "cpu-abc.lock"]


def test_a_killed_runs_journal_is_read_as_data(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A journal left by a SIGKILL (written here as the kill leaves it), one that is not
    JSON, and one whose words hold an escape: each means discard, and none is printed raw."""
    cache = CompileCache(tmp_path / "cpu-abc")
    cache.root.mkdir()
    for text, said in ((json.dumps({"pid": 4242, "started": "2026-12-03T11:14:49Z",
                                    "what": "capture tiny"}), "pid 4242"),
                       ("{truncated", "journal unreadable"),
                       (json.dumps({"what": "x\x1b[2Jy"}), "what x\\x1b[2Jy")):
        (cache.root / "old.so").write_bytes(b"")
        cache.journal.write_text(text)
        assert cache.recover() is True
        err = capsys.readouterr().err
        assert said in err and "\x1b" not in err
        assert not cache.journal.exists()
        assert emptied(cache)
    assert cache.recover() is False  # no journal: nothing discarded


def emptied(cache: CompileCache) -> bool:
    """Only the cache's own folders are left, each empty (made again: an engine host that
    started before the discard points at them)."""
    # and the engine's made HOME (issue 63), empty like the rest
    return sorted(p.name for p in cache.root.iterdir()) == \
        sorted([*(sub for _name, sub in caches.VARIABLES), "home"]) and \
        not any(p.is_file() for p in cache.root.rglob("*"))


def test_before_a_host_starts_a_free_cache_is_recovered_a_held_one_left(
        tmp_path: Path) -> None:
    """open_oracle asks before it starts an engine host: with the lock free, a journal
    means discard now; while an engine holds the lock, its journal is live and stays."""
    cache = CompileCache(tmp_path / "cpu-abc")
    (cache.root / "inductor").mkdir(parents=True)
    (cache.root / "inductor" / "k.main.so").write_bytes(b"")
    cache.journal.write_text("{}")
    with held(cache.lock, what="an engine elsewhere"):
        cache.recover_before_start()
        assert cache.journal.exists() and (cache.root / "inductor" / "k.main.so").exists()
    cache.recover_before_start()
    assert not cache.journal.exists() and emptied(cache)


def test_a_cache_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = CompileCache(blocker / "cpu-abc")
    with pytest.raises(OutputFailed) as info, cache.in_use("verify"):
        pass
    assert str(blocker) in info.value.message


def test_the_driver_points_each_cache_below_the_folder_and_keeps_the_callers(
        tmp_path: Path) -> None:
    """In a process of its own, as the driver runs (setting the variables in this one would
    leak them to every later test's engine: a caller's cache, used as it is)."""
    driver = driver_module()
    assert tuple(driver.COMPILE_CACHES) == caches.VARIABLES  # type: ignore[attr-defined]
    assert driver.COMPILE_CACHE_VARIABLE == caches.INSIDE_VARIABLE  # type: ignore[attr-defined]
    code = ("import importlib.util, json, os, sys\n"
            "spec = importlib.util.spec_from_file_location('driver', sys.argv[1])\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n"
            "module.use_compile_caches()\n"
            "import tempfile\n"
            "seen = {k: os.environ.get(k) for k in sys.argv[2:]}\n"
            "seen['gettempdir'] = tempfile.gettempdir()\n"
            "print(json.dumps(seen))\n")
    names = [name for name, _sub in caches.VARIABLES]
    before = {name: os.environ.get(name) for name in names}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update({"TRITON_CACHE_DIR": "/callers/triton", "TMPDIR": str(tmp_path / "callers"),
                caches.INSIDE_VARIABLE: str(tmp_path)})
    done = subprocess.run([sys.executable, "-I", "-c", code,
                           str(REPO / "oracle_build" / "inside" / "driver.py"), *names,
                           caches.INSIDE_VARIABLE], env=env, capture_output=True, text=True,
                          check=True)
    seen = json.loads(done.stdout)
    assert seen == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                    "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
                    "TRITON_CACHE_DIR": "/callers/triton",  # the caller's own cache
                    # the temporary folder is always the cache's (inductor's headers)
                    "TMPDIR": str(tmp_path / "tmp"), "gettempdir": str(tmp_path / "tmp"),
                    caches.INSIDE_VARIABLE: None}
    assert CompileCache(tmp_path / "bare").variables() == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "bare" / "inductor"),
        "VLLM_CACHE_ROOT": str(tmp_path / "bare" / "vllm"),
        "TRITON_CACHE_DIR": str(tmp_path / "bare" / "triton"),
        "TMPDIR": str(tmp_path / "bare" / "tmp")}
    assert (tmp_path / "bare" / "tmp").is_dir()
    assert {name: os.environ.get(name) for name in names} == before  # this process's own


@pytest.mark.slow
def test_a_poisoned_cache_fails_one_start_and_the_next_recovers(
        cpu_oracle: BuiltOracle, host_golden: Path, tmp_path: Path) -> None:
    """The CI failure, reproduced in a cache of the test's own: once this golden's kernels
    are compiled into it, every one truncated to nothing, as a kill leaves one. The verify
    after fails (exit 12, and says the cache goes), the next discards it, compiles from
    nothing, and passes; no golden records where the cache was. Slow: three engine starts.
    (A first version poisoned a copy of the run's shared cache: it held other tests'
    kernels, not necessarily this golden's, and the verify passed.)"""
    own = tmp_path / "caches"
    env = {**os.environ, COMPILE_CACHE_ENV: str(own)}
    args = [sys.executable, "-m", "oracle_build", "verify", str(host_golden), "--home",
            str(cpu_oracle.home)]

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900, check=False)

    # the pin's cache, this run-time compiler's folder of it (issue 63)
    mine = CompileCache.of_pin(own / cpu_oracle.pin.key, default_compiler(cpu_oracle)).root
    journal = mine.parent / f"{mine.name}.running.json"
    warm = verify()  # this golden's kernels, compiled into a cache of the test's own
    assert warm.returncode == 0, warm.stderr[-3000:]
    kernels = list(mine.rglob("*.main.so"))
    assert kernels, "the engine compiled no kernel: nothing to poison"
    # inductor's precompiled headers went to the cache's tmp/, not the host's /tmp
    assert list((mine / "tmp").glob("torchinductor_*/precompiled_headers/*.gch"))
    for kernel in kernels:
        kernel.write_bytes(b"")

    poisoned = verify()
    assert poisoned.returncode == 12, poisoned.stderr[-3000:]
    assert "the next engine start discards its compile cache" in poisoned.stderr
    assert journal.exists()

    recovered = verify()
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert "did not finish" in recovered.stderr and "discarding" in recovered.stderr
    # the tool's cache paths are not recorded: no context difference names one
    assert "TORCHINDUCTOR_CACHE_DIR" not in recovered.stdout + recovered.stderr
    assert not journal.exists()
    rebuilt = list(mine.rglob("*.main.so"))
    assert rebuilt and all(k.stat().st_size > 0 for k in rebuilt)
