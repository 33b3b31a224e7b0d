"""Killed at every step, run concurrently, run in a hostile environment: nothing lost, no
false ORACLE_IDENTITY_OK, and the next run completes. Real builds, real engine."""

from __future__ import annotations

import ast
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from oracle_build import identity
from oracle_build.cli import main
from oracle_build.golden import load_golden
from tests.conftest import CPU_PIN, REPO, TINY_SPEC, BuiltOracle, reliability

pytestmark = pytest.mark.slow
BUILD_STEPS = ["preflight", "venv", "fetch", "install", "identity", "publish"]


def start(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **env})


def kill_at(proc: subprocess.Popen[str], marker: str, sig: int, delay: float) -> bool:
    """Send ``sig`` to the run's process group ``delay`` s after ``marker`` appears. Returns
    whether the run was still going when the signal was sent (False: it had finished)."""
    assert proc.stderr is not None
    alive = False
    for line in proc.stderr:
        if marker in line:
            time.sleep(delay)
            alive = proc.poll() is None
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            break
    else:
        raise AssertionError(f"the run never printed {marker!r}")
    proc.communicate(timeout=300)
    return alive


def assert_no_false_oracle(home: Path, pin_key: str) -> None:
    venv = home / "oracles" / pin_key
    if venv.exists():  # only a complete venv may stand there, and it must pass
        assert (venv / "oracle-build" / "build-record.json").exists()
        from oracle_build.pins import load_pin

        pin = load_pin(CPU_PIN)
        assert identity.check(pin, pin.target("cpu"), venv).ok


def test_build_killed_at_every_step_then_recovers(cpu_oracle: BuiltOracle,
                                                  tmp_path: Path) -> None:
    home = tmp_path / "home"
    rng = random.Random(20261129)
    args = ["build", "--pin", str(CPU_PIN), "--home", str(home), "--wheelhouse",
            str(cpu_oracle.wheelhouse)]
    for n, step in enumerate(BUILD_STEPS, start=1):
        for sig in (signal.SIGKILL, signal.SIGINT):
            for delay in (0.0, rng.uniform(0.5, 6.0)):  # at the boundary, inside the step
                proc = start(args)
                kill_at(proc, f"==> [{n}/6] {step}", sig, delay)
                assert_no_false_oracle(home, cpu_oracle.pin.key)
                reliability("kill points survived", f"build_oracle {step} "
                            f"{'SIGKILL' if sig == signal.SIGKILL else 'SIGINT'}")
                if (home / "oracles" / cpu_oracle.pin.key).exists():
                    # killed after the commit point: the oracle is whole; start over
                    shutil.rmtree(home / "oracles")
    done = subprocess.run([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(identity.OK_LINE)


def test_capture_killed_at_every_point_leaves_no_golden(cpu_oracle: BuiltOracle,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["capture", str(TINY_SPEC), "--out", str(out), "--home", str(cpu_oracle.home)]
    for marker, delay in (("checking oracle identity", 0.5), ("==> engine", 0.0),
                          ("==> engine", 6.0), ("==> engine", 20.0)):
        for sig in (signal.SIGKILL, signal.SIGINT):
            proc = start(args)
            killed_mid_run = kill_at(proc, marker, sig, delay)
            folder = out / "tiny-llama-greedy"
            if not killed_mid_run:  # it finished first: the golden must be whole
                assert proc.returncode == 0
                load_golden(folder / "golden.json")
                shutil.rmtree(folder)
                continue
            assert not (folder / "golden.json").exists()
            leftovers = list(folder.iterdir()) if folder.exists() else []
            assert not leftovers, leftovers  # no partial or temporary file
            reliability("kill points survived",
                        f"capture {marker.strip('=> ')} +{delay:g}s "
                        f"{'SIGKILL' if sig == signal.SIGKILL else 'SIGINT'}")
    assert main(args) == 0  # the next run completes normally
    assert (out / "tiny-llama-greedy" / "golden.json").exists()


def test_two_builds_of_one_pin_end_with_one_venv(cpu_oracle: BuiltOracle,
                                                 tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["build", "--pin", str(CPU_PIN), "--home", str(home), "--wheelhouse",
            str(cpu_oracle.wheelhouse)]
    a = start(args)
    time.sleep(1.0)
    b = start(args)
    _, err_a = a.communicate(timeout=900)
    _, err_b = b.communicate(timeout=900)
    assert a.returncode == 0 and b.returncode == 0, (err_a[-1500:], err_b[-1500:])
    assert "waiting: another run" in err_b
    assert "nothing rebuilt" in err_b  # the second found the first's oracle and checked it
    assert [p.name for p in (home / "oracles").iterdir()] == [cpu_oracle.pin.key]
    reliability("concurrency", "two build_oracle runs, one pin")


def test_two_captures_one_golden_and_verify_alongside(cpu_oracle: BuiltOracle,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["capture", str(TINY_SPEC), "--out", str(out), "--home", str(cpu_oracle.home)]
    first = start(args)
    time.sleep(2.0)
    second = start(args)
    before = (TINY_SPEC / "golden.json").read_bytes()
    verify = subprocess.run([sys.executable, "-m", "oracle_build", "verify", str(TINY_SPEC),
                             "--home", str(cpu_oracle.home)], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    _, err1 = first.communicate(timeout=900)
    _, err2 = second.communicate(timeout=900)
    assert sorted([first.returncode, second.returncode]) == [0, 8], (err1[-800:], err2[-800:])
    assert len(list(out.rglob("golden.json"))) == 1
    assert verify.returncode == 0, verify.stdout[-2000:]  # unaffected by the capture
    assert (TINY_SPEC / "golden.json").read_bytes() == before
    reliability("concurrency", "two captures of one spec")
    reliability("concurrency", "verify while a capture runs")


@contextmanager
def small_fs(path: Path, size: str, *, readonly: bool = False) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_read_only_goldens_folder(cpu_oracle: BuiltOracle, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with small_fs(tmp_path / "ro", "1m", readonly=True) as ro:
        code = main(["capture", str(TINY_SPEC), "--out", str(ro), "--home",
                     str(cpu_oracle.home)])
    err = capsys.readouterr().err
    assert code == 14 and "cannot write goldens" in err and "nothing was run" in err
    reliability("hostile environment", "read-only goldens folder")


def test_disk_fills_during_capture(cpu_oracle: BuiltOracle, tmp_path: Path) -> None:
    with small_fs(tmp_path / "small", "2m") as fs:
        proc = start(["capture", str(TINY_SPEC), "--out", str(fs), "--home",
                      str(cpu_oracle.home)])
        assert proc.stderr is not None
        for line in proc.stderr:
            if "==> engine" in line:  # another process fills the disk mid-capture
                with (fs / "filler").open("wb") as fh:
                    try:
                        while True:
                            fh.write(b"\0" * 65536)
                    except OSError:
                        pass
                break
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 14, err[-1500:]
        assert "No space left on device" in err
        assert [p.name for p in fs.rglob("*") if p.is_file()] == ["filler"]
    reliability("hostile environment", "disk full during capture")


def test_disk_fills_during_build(cpu_oracle: BuiltOracle, tmp_path: Path) -> None:
    with small_fs(tmp_path / "small", "400m") as fs:
        home = fs / "home"
        done = subprocess.run(
            [sys.executable, "-m", "oracle_build", "build", "--pin", str(CPU_PIN), "--home",
             str(home), "--wheelhouse", str(cpu_oracle.wheelhouse)], cwd=REPO,
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "ORACLE_BUILD_MIN_FREE_GIB": "0.1"})
        assert done.returncode == 5, done.stderr[-1500:]
        assert "No space left on device" in done.stderr or "os error 28" in done.stderr
        assert not (home / "oracles" / cpu_oracle.pin.key).exists()
        assert "full log:" in done.stderr
    reliability("hostile environment", "disk full during build")


def test_user_site_and_pythonpath_cannot_inject(cpu_oracle: BuiltOracle, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "userbase"
    site = base / "lib" / "python3.11" / "site-packages" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text('__version__ = "0.32.0"\n')
    monkeypatch.setenv("PYTHONUSERBASE", str(base))
    monkeypatch.setenv("PYTHONPATH", str(site.parent))
    monkeypatch.setenv("VLLM_USE_PRECOMPILED", "0")
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), cpu_oracle.venv)
    assert ident.ok and str(base) not in str(ident.facts["python"]["sys_path"])
    assert "VLLM_USE_PRECOMPILED" not in ident.facts["env"]
    reliability("hostile environment", "fake vllm in PYTHONPATH and the user site")


def test_symlinked_home(cpu_oracle: BuiltOracle, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "home-link"
    link.symlink_to(cpu_oracle.home)
    assert main(["identity", "--pin", str(CPU_PIN), "--home", str(link)]) == 0
    out = capsys.readouterr().out
    assert f"vllm_file {cpu_oracle.home.resolve()}" in out  # resolved, the real path shown
    code = main(["identity", "--pin", str(CPU_PIN), "--venv",
                 str(link / "oracles" / cpu_oracle.pin.key)])
    assert code == 3 and "reached through a symlink" in capsys.readouterr().out
    reliability("hostile environment", "oracle home through a symlink")


def test_no_field_ever_reaches_a_shell() -> None:
    """Every subprocess call takes an argument list; nothing calls a shell."""
    offenders = []
    for path in (REPO / "oracle_build").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ("os.system", "os.popen", "subprocess.getoutput",
                            "subprocess.getstatusoutput"):
                    offenders.append(f"{path.name}:{node.lineno} {name}")
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                  and kw.value.value is False):
                        offenders.append(f"{path.name}:{node.lineno} shell=")
    assert offenders == []
    reliability("security", "no shell anywhere")
