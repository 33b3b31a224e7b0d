"""Killed at every step, run concurrently, run in a hostile environment: nothing lost, no
false ORACLE_IDENTITY_OK, and the next run completes. Real builds, real engine."""

from __future__ import annotations

import ast
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.core import layout
from oracle_build.core.filelock import held
from oracle_build.engine.caches import CompileCache
from oracle_build.oracle import identity
from tests.conftest import (
    COMPILE_CACHE_ENV,
    CPU_PIN,
    REPO,
    TINY_SPEC,
    BuiltOracle,
    default_compiler,
    reliability,
    site_packages,
)
from tests.srcpkg import make_repo, write_pin

pytestmark = pytest.mark.slow
BUILD_STEPS = ["preflight", "venv", "fetch", "install", "identity", "publish"]
# probes the staging venv and compares: writes nothing, so its start and a point inside it
# leave the same state behind; one kill per signal inside it (each costs a full install)
READ_ONLY_STEPS = {"identity"}


def start(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **env})


class Watched:
    """A CLI run whose progress (stderr) is read as it comes, so a test knows which step
    it is in from the run's own output, not from a delay. Once the run's group is frozen
    (SIGSTOP) nothing more is written, so ``settled`` reads the pipe to its end under the
    reader's lock: the phase judged then is the phase the run was frozen in, however far
    behind a loaded machine left the reader."""

    def __init__(self, args: list[str], freeze_on: str | None = None) -> None:
        """``freeze_on``: the reader itself freezes the run (SIGSTOP to its group) the moment
        a line holding this marker arrives, without the polling delay of ``wait_for``: a
        step of a few milliseconds is then still running when the kill comes."""
        self.freeze_on = freeze_on
        self.frozen = threading.Event()
        self.lines: list[str] = []
        self._partial = b""
        self._eof = False
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        assert self.proc.stderr is not None
        self._fd = self.proc.stderr.fileno()
        os.set_blocking(self._fd, False)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            select.select([self._fd], [], [], 0.05)
            with self._lock:
                self._drain()
                if self._eof:
                    return

    def _drain(self) -> None:
        """Take every byte the pipe holds now (the caller holds the lock)."""
        while not self._eof:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                chunk = b"\n" if self._partial else b""
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            for raw in whole:
                line = raw.decode(errors="replace") + "\n"
                if self.freeze_on and not self.frozen.is_set() and self.freeze_on in line:
                    with suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGSTOP)
                    self.frozen.set()
                self.lines.append(line)

    def wait_stopped(self, timeout: float = 10.0) -> None:
        """Wait until the kernel has stopped the run's process (a write under way when
        SIGSTOP came ends first), or it has ended. Uninterruptible sleep (D) counts: the
        process stops on leaving it, before it writes again (seen: a parent in vfork
        waiting for its child, itself stopped before its exec)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            except OSError:
                return
            if stat[stat.rindex(")") + 2] in "TtZXD":
                return
            time.sleep(0.005)
        raise AssertionError(f"run {self.proc.pid} not stopped within {timeout}s: {stat}")

    def settled(self, phases: dict[str, str]) -> str | None:
        """The phase of a frozen run: every byte it wrote before the freeze is read first."""
        with self._lock:
            self._drain()
            return self.phase(phases)

    def wait_for(self, marker: str, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while not any(marker in line for line in self.lines):
            if self.proc.poll() is not None and not self.reader.is_alive():
                raise AssertionError(f"the run ended (exit {self.proc.returncode}) without "
                                     f"printing {marker!r}:\n{''.join(self.lines[-30:])}")
            assert time.monotonic() < deadline, f"no {marker!r} within {timeout}s"
            time.sleep(0.02)

    def phase(self, phases: dict[str, str]) -> str | None:
        """The phase the run is in: the last line matching one of ``phases`` (marker ->
        phase name) decides."""
        current = None
        for line in self.lines:
            for marker, name in phases.items():
                if marker in line:
                    current = name
        return current

    def kill_in(self, phase: str, phases: dict[str, str], sig: int, delay: float) -> bool:
        """``delay`` s into ``phase``: freeze the run's process group (SIGSTOP), read what it
        had printed, send ``sig`` and let it go on. True only when the run was alive and
        still in ``phase`` at that instant: only such kills count as landed."""
        marker = next(m for m, n in phases.items() if n == phase)
        try:
            self.wait_for(marker)
        except BaseException:  # the run's pipe is closed whatever happens (no leak into a
            self.close(kill=True)  # later test's unraisable-exception check)
            raise
        if not self.frozen.is_set():
            time.sleep(delay)
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGSTOP)
        self.wait_stopped()
        landed = self.proc.poll() is None and self.settled(phases) == phase
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
            os.killpg(self.proc.pid, signal.SIGCONT)
        self.close()
        return landed

    def close(self, *, kill: bool = False) -> None:
        """Wait for the run to end (``kill``: end it first), then close its pipe."""
        if kill and self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=300)
        self.reader.join(timeout=60)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def build_phases(steps: list[str]) -> dict[str, str]:
    """A build's progress: "==> [i/n] step" starts a step, "    step: 1.2s" ends it."""
    out = {}
    for n, step in enumerate(steps, start=1):
        out[f"==> [{n}/{len(steps)}] {step}"] = step
        out[f"    {step}: "] = f"after {step}"
    return out


CAPTURE_PHASES = {"checking oracle identity": "identity", "==> engine": "engine",
                  "    wrote ": "published"}


def assert_no_false_oracle(home: Path, pin: Pin) -> bool:
    """What a killed build left in oracles/ is never a false oracle: either a whole oracle
    that passes identity (killed after its publish: True), or an interrupted publish (killed
    between the rename and the anchor, written last), which identity refuses by that name
    (never ORACLE_IDENTITY_OK) and the next build sets aside under incomplete/."""
    venv = home / "oracles" / pin.key
    if not venv.exists():
        return False
    assert (venv / "oracle-build" / "build-record.json").exists()
    ident = identity.check(pin, pin.target("cpu"), venv)
    if ident.ok:
        return True
    assert identity.OK_LINE not in ident.block()
    assert any("an interrupted publish" in found for _f, _e, found in ident.mismatches), \
        ident.mismatches
    return False


def assert_nothing_published_and_staging_kept(pin_path: str, home: Path) -> None:
    """A build killed before its publish: there is no oracle (identity says none was built,
    exit 7, and proves nothing), and the staging folder with its full log is kept for
    inspection (the build made both before its first step)."""
    assert main(["identity", "--pin", pin_path, "--home", str(home)]) == 7
    staged = list((home / "staging").iterdir())
    assert staged and all((s / layout.BUILD_LOG).exists() for s in staged), staged


def signame(sig: int) -> str:
    return "SIGKILL" if sig == signal.SIGKILL else "SIGINT"


def expected_exit(sig: int) -> int:
    return -signal.SIGKILL if sig == signal.SIGKILL else 130


def kill_every_step(args: list[str], pin: Pin, home: Path, plan_steps: list[str],
                    timings: dict[str, float], *, seed: int, label: str,
                    steps: list[str] | None = None,
                    between: Callable[[], None] = lambda: None) -> None:
    """Kill a build (``args``, whose plan has ``plan_steps``) once with SIGKILL and once
    with SIGINT in each of ``steps`` (default: every step of the plan):
    at the step's start (frozen by the reader the instant the step's line arrives) and at
    a random point inside it (``timings``: its duration in a real build). A step of
    milliseconds can still end first on a loaded machine: then up to four more tries at its
    start, so that every step and signal has a kill that landed. After each run: no false
    oracle; a whole one (killed after the commit point) and the staging folder go, and
    ``between`` resets what else the next run must not find."""
    phases = build_phases(plan_steps)  # "[i/n]": n counts every step of the plan
    pin_path = args[args.index("--pin") + 1]
    steps = steps or plan_steps
    assert set(steps) <= set(plan_steps), (steps, plan_steps)
    rng = random.Random(seed)
    landed: set[tuple[str, str]] = set()
    for step in steps:
        inside = rng.uniform(0.1, 0.8) * float(timings.get(step, 1.0))
        marker = next(m for m, n in phases.items() if n == step)
        delays, planned = ((inside, 0.0, 0.0, 0.0, 0.0), 1) if step in READ_ONLY_STEPS \
            else ((0.0, inside, 0.0, 0.0, 0.0, 0.0), 2)
        for sig in (signal.SIGKILL, signal.SIGINT):
            for attempt, delay in enumerate(delays):
                if attempt >= planned and (step, signame(sig)) in landed:
                    break
                run = Watched(args, freeze_on=marker if delay == 0.0 else None)
                if run.kill_in(step, phases, sig, delay):
                    assert run.proc.returncode == expected_exit(sig), "".join(run.lines[-20:])
                    landed.add((step, signame(sig)))
                    reliability("kill points survived", f"{label} {step} {signame(sig)}")
                    if not (home / "oracles" / pin.key).exists():
                        assert_nothing_published_and_staging_kept(pin_path, home)
                if assert_no_false_oracle(home, pin):
                    # killed after the commit point: the oracle is whole; start over (an
                    # interrupted publish stays: the next run must set it aside)
                    shutil.rmtree(home / "oracles")
                # a killed build keeps its staging folder for inspection (up to 3 GB): the
                # test has looked; free the disk before the next kill
                shutil.rmtree(home / "staging", ignore_errors=True)
                shutil.rmtree(home / "incomplete", ignore_errors=True)
                between()
    missed = [(s, signame(g)) for s in steps for g in (signal.SIGKILL, signal.SIGINT)
              if (s, signame(g)) not in landed]
    assert not missed, f"no kill landed inside these steps: {missed}"
    done = subprocess.run([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(identity.OK_LINE)


def small_source_build(tmp_path: Path) -> tuple[Path, Pin, Path, Path, list[str], list[str]]:
    """The small source package in a git repository under ``tmp_path``: its pin (path and
    loaded), a home and a wheelhouse there, the `build` arguments and the plan's steps."""
    repo = make_repo(tmp_path / "src" / "pkg")
    pin_path = write_pin(tmp_path, repo)
    pin = load_pin(pin_path)
    home, wheelhouse = tmp_path / "home", tmp_path / "wh"
    args = ["build", "--pin", str(pin_path), "--home", str(home), "--wheelhouse",
            str(wheelhouse)]
    steps = [s.name for s in recipe.plan(pin, "cpu", home=home,
                                         wheelhouse_root=wheelhouse).steps]
    return pin_path, pin, home, wheelhouse, args, steps


@pytest.mark.timeout(1800)
def test_source_build_killed_at_every_step_then_recovers(tmp_path: Path) -> None:
    """Every step of a build from source (preflight, venv, source, toolchain,
    build-requirements, wheel, check-wheel, install, identity, publish) on the small
    C-extension package: a
    real git repository, a real wheel build, a real venv, every step in seconds. The
    wheelhouse goes after each run, so that every run plans the same source build."""
    _pin_path, pin, home, wheelhouse, args, steps = small_source_build(tmp_path)
    assert steps == ["preflight", "venv", "source", "toolchain", "build-requirements",
                     "wheel", "check-wheel", "install", "identity", "publish"]
    first = subprocess.run([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((layout.build_record_path(layout.oracle_path(home, pin.key)))
                        .read_text())
    shutil.rmtree(home)
    shutil.rmtree(wheelhouse)
    kill_every_step(args, pin, home, steps, record["timings"], seed=20261201,
                    label="build_oracle (source)",
                    between=lambda: shutil.rmtree(wheelhouse, ignore_errors=True))


@pytest.mark.parametrize(("sig", "step"), [(signal.SIGKILL, "install"),
                                           (signal.SIGINT, "identity")])
def test_killed_build_leaves_no_oracle_and_recovers(tmp_path: Path, sig: int,
                                                    step: str) -> None:
    """One kill inside a step (its steps take milliseconds here: the run is frozen the
    instant the step's line arrives, then signalled), then the next run: the small source
    package's build (seconds). It was the CPU pin's, an install (about a minute) before each
    kill and a rebuild after: the CPU pin's kills in install and identity, with these same
    checks (exit code, no oracle, identity exit 7, the staging folder and its log kept) and
    the recovering build, are in test_faults_cpu_pin.py."""
    pin_path, pin, home, _wheelhouse, args, steps = small_source_build(tmp_path)
    phases = build_phases(steps)
    marker = next(m for m, n in phases.items() if n == step)
    run = Watched(args, freeze_on=marker)
    assert run.kill_in(step, phases, sig, 0.0)  # alive and inside the step when signalled
    assert run.proc.returncode == expected_exit(sig), "".join(run.lines[-20:])
    assert not layout.oracle_path(home, pin.key).exists()
    assert_nothing_published_and_staging_kept(str(pin_path), home)
    if sig == signal.SIGKILL:  # the next run completes normally
        rerun = subprocess.run([sys.executable, "-m", "oracle_build", *args], cwd=REPO,
                               capture_output=True, text=True, timeout=900)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert rerun.stdout.strip().endswith(identity.OK_LINE)


def assert_no_engine_outlives(harness: int, within: float = 15.0) -> None:
    """Nothing works on in the engine host's folder of a capture killed (issue 45 item 8:
    the host outlived a killed capture by about 30 s, the home's lock already free): the
    host dies with its harness (PR_SET_PDEATHSIG) or with its group (a Ctrl-C), vLLM's
    engine core with it."""
    from oracle_build.core import proc
    from oracle_build.engine.host import DRIVER_PREFIX

    deadline = time.monotonic() + within
    while True:
        folders = list(Path(tempfile.gettempdir()).glob(f"{DRIVER_PREFIX}{harness}-*"))
        alive = [pid for f in folders for pid in proc.leftovers(f)]
        if not alive:
            return
        assert time.monotonic() < deadline, \
            f"{len(alive)} processes still work in {folders} {within} s after the kill"
        time.sleep(0.2)


def test_capture_killed_at_every_point_leaves_no_golden(cpu_oracle: BuiltOracle,
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Each kill also leaves the compile cache's journal when it landed while the engine
    ran (it may have cut a kernel's compile short): the next run discards that cache, and
    it completes. The engines compile into a cache of the test's own: the journals are then
    this test's alone (not another worker's engine's), and no other test recompiles after
    its kills. Slow: runs the real vLLM engine (an engine start is about 20 s here, 40 s
    compiling from nothing)."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "compile-cache"))
    out = tmp_path / "out"
    args = ["capture", str(TINY_SPEC), "--out", str(out), "--home", str(cpu_oracle.home)]
    folder = out / "tiny-llama-greedy"
    landed = 0
    for phase, delay in (("identity", 0.5), ("engine", 0.0), ("engine", 6.0),
                         ("engine", 20.0)):
        for sig in (signal.SIGKILL, signal.SIGINT):
            start_line = next(m for m, n in CAPTURE_PHASES.items() if n == phase)
            run = Watched(args, freeze_on=start_line if delay == 0.0 else None)
            if not run.kill_in(phase, CAPTURE_PHASES, sig, delay):
                # it had left the phase: whatever it published must be whole
                if (folder / "golden.json").exists():
                    load_golden(folder / "golden.json")
                shutil.rmtree(folder, ignore_errors=True)
                continue
            assert run.proc.returncode == expected_exit(sig), "".join(run.lines[-20:])
            assert not (folder / "golden.json").exists()
            leftovers = list(folder.iterdir()) if folder.exists() else []
            assert not leftovers, leftovers  # no partial or temporary file
            assert_no_engine_outlives(run.proc.pid)
            landed += 1
            reliability("kill points survived",
                        f"capture {phase} +{delay:g}s {signame(sig)}")
    assert landed >= 6, f"only {landed} of 8 capture kills landed in their phase"
    journal = CompileCache.of(cpu_oracle.home, cpu_oracle.pin.key,
                              default_compiler(cpu_oracle)).journal
    left = journal.exists()
    capsys.readouterr()
    assert main(args) == 0  # the next run completes normally
    assert ("did not finish" in capsys.readouterr().err) == left
    assert not journal.exists()
    assert (out / "tiny-llama-greedy" / "golden.json").exists()


def test_two_builds_of_one_pin_end_with_one_venv(tmp_path: Path) -> None:
    """Two builds of one pin at once: the second waits on the first's build lock, then finds
    its oracle and re-checks it instead of building again. On the small source package (a
    build of seconds; it was the CPU pin's, a minute's install): the lock and the re-check
    do not depend on the pin's size, and the CPU oracle's re-check without a rebuild is
    test_oracle_cpu::test_rerun_rechecks_identity_without_building. The second starts once
    the first has printed its first step, when it holds the lock (taken before the plan)."""
    _pin_path, pin, home, _wheelhouse, args, _steps = small_source_build(tmp_path)
    a = Watched(args)
    a.wait_for("==> [1/")
    b = start(args)
    _, err_b = b.communicate(timeout=900)
    a.close()
    err_a = "".join(a.lines)
    assert a.proc.returncode == 0 and b.returncode == 0, (err_a[-1500:], err_b[-1500:])
    assert "waiting: another run" in err_b
    assert "nothing rebuilt" in err_b  # the second found the first's oracle and checked it
    assert sorted(p.name for p in (home / "oracles").iterdir()) == [
        pin.key, f"{pin.key}.anchor.json"]  # one venv and its anchor
    reliability("concurrency", "two build_oracle runs, one pin")


def test_two_captures_one_golden_and_verify_alongside(cpu_oracle: BuiltOracle,
                                                      host_golden: Path,
                                                      tmp_path: Path) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    out = tmp_path / "out"
    args = ["capture", str(TINY_SPEC), "--out", str(out), "--home", str(cpu_oracle.home)]
    first = start(args)
    time.sleep(2.0)
    second = start(args)
    before = (TINY_SPEC / "golden.json").read_bytes()
    verify = subprocess.run([sys.executable, "-m", "oracle_build", "verify", str(host_golden),
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


def test_an_engine_waits_for_the_host_wide_engine_lock(cpu_oracle: BuiltOracle,
                                                       host_golden: Path) -> None:
    """ORACLE_BUILD_ENGINE_LOCK (set by this run for all its workers, as a gate host shared
    by several homes sets it): while another process holds it, a verify proves identity,
    says it waits, and starts no engine; released, it runs and passes. Slow: one engine
    start."""
    lock = layout.engine_lock(cpu_oracle.home)
    assert lock == Path(os.environ["ORACLE_BUILD_ENGINE_LOCK"]).resolve()
    assert not lock.is_relative_to(cpu_oracle.home)  # the host's, not the home's own
    with held(lock, what="this test"):
        run = Watched(["verify", str(host_golden), "--home", str(cpu_oracle.home)])
        try:
            run.wait_for(f"holds {lock} for a vLLM engine")
            time.sleep(1.0)
            assert run.proc.poll() is None
            assert not any("starting its engine" in line for line in run.lines), run.lines
        except BaseException:
            run.close(kill=True)
            raise
    run.close()
    assert run.proc.returncode == 0, "".join(run.lines[-30:])
    assert any("starting its engine" in line for line in run.lines)
    reliability("concurrency", "an engine waits for the host-wide engine lock")


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
    """Slow: needs the session's real CPU oracle; the capture stops before any engine (nothing
    is run)."""
    with small_fs(tmp_path / "ro", "1m", readonly=True) as ro:
        code = main(["capture", str(TINY_SPEC), "--out", str(ro), "--home",
                     str(cpu_oracle.home)])
    err = capsys.readouterr().err
    assert code == 14 and "cannot write goldens" in err and "nothing was run" in err
    reliability("hostile environment", "read-only goldens folder")


def test_disk_fills_during_capture(cpu_oracle: BuiltOracle, tmp_path: Path) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
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
    """Slow: builds a real oracle venv (an install from the wheelhouse, about a minute)."""
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
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    base = tmp_path / "userbase"
    # the user site the oracle's python would read: lib/pythonX.Y under PYTHONUSERBASE
    site = base / site_packages(cpu_oracle.venv).relative_to(cpu_oracle.venv) / "vllm"
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
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    link = tmp_path / "home-link"
    link.symlink_to(cpu_oracle.home)
    assert main(["identity", "--pin", str(CPU_PIN), "--home", str(link)]) == 0
    out = capsys.readouterr().out
    assert f"vllm_file {cpu_oracle.home.resolve()}" in out  # resolved, the real path shown
    code = main(["identity", "--pin", str(CPU_PIN), "--venv",
                 str(link / "oracles" / cpu_oracle.pin.key)])
    out = capsys.readouterr().out
    assert code == 3 and "reached through a symlink" in out
    assert identity.MISMATCH_LINE in out.splitlines() and identity.OK_LINE not in out
    code = main(["identity", "--pin", str(CPU_PIN), "--venv",
                 str(link / "oracles" / cpu_oracle.pin.key), "--json"])
    facts = json.loads(capsys.readouterr().out)
    assert code == 3 and facts["ok"] is False
    assert [m["field"] for m in facts["mismatches"]] == ["venv_path"]
    assert main(["identity", "--pin", str(CPU_PIN), "--home", str(cpu_oracle.home),
                 "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["ok"] is True and facts["vllm"] == "0.32.0" and facts["mismatches"] == []
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


WHERE = ("import importlib.util, json, sys\n"
         "s = importlib.util.find_spec('vllm')\n"
         "print(json.dumps({'vllm': s.origin, 'no_user_site': sys.flags.no_user_site,\n"
         "                  'path': sys.path}))\n")


def test_isolated_mode_alone_keeps_injections_out(cpu_oracle: BuiltOracle,
                                                  tmp_path: Path) -> None:
    """-I on its own, with the environment NOT scrubbed first: a module beside the script,
    PYTHONPATH, and the user site (with a .pth in it) never reach the oracle's python.
    Without -I the first two do, so this test can fail."""
    def fake_vllm(where: Path) -> Path:
        (where / "vllm").mkdir(parents=True)
        (where / "vllm" / "__init__.py").write_text('__version__ = "0.32.0"\n')
        return where / "vllm" / "__init__.py"

    scripts = tmp_path / "scripts"
    beside = fake_vllm(scripts)
    (scripts / "where.py").write_text(WHERE)
    pythonpath = fake_vllm(tmp_path / "pythonpath")
    userbase = tmp_path / "userbase"
    user_site = userbase / site_packages(cpu_oracle.venv).relative_to(cpu_oracle.venv)
    fake_vllm(user_site)
    (user_site / "inject.pth").write_text(f"import sys; sys.path.insert(0, {str(user_site)!r})\n")
    python = str(cpu_oracle.venv / "bin" / "python")
    real = str(site_packages(cpu_oracle.venv) / "vllm" / "__init__.py")

    def where(*flags: str, **env: str) -> dict[str, Any]:
        done = subprocess.run([python, *flags, str(scripts / "where.py")], cwd=tmp_path,
                              capture_output=True, text=True, check=True,
                              env={**os.environ, **env})
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    # a module beside the script
    assert where()["vllm"] == str(beside)
    assert where("-I")["vllm"] == real
    # PYTHONPATH
    assert where(PYTHONPATH=str(pythonpath.parent.parent))["vllm"] == str(beside)  # still first
    (scripts / "vllm" / "__init__.py").unlink()
    (scripts / "vllm").rmdir()
    assert where(PYTHONPATH=str(pythonpath.parent.parent))["vllm"] == str(pythonpath)
    assert where("-I", PYTHONPATH=str(pythonpath.parent.parent))["vllm"] == real
    # the user site and a .pth in it
    isolated = where("-I", PYTHONUSERBASE=str(userbase))
    assert isolated["vllm"] == real and isolated["no_user_site"] == 1
    assert str(user_site) not in isolated["path"]
    assert where(PYTHONUSERBASE=str(userbase))["no_user_site"] == 0
    reliability("hostile environment", "isolated mode alone: script folder, PYTHONPATH, "
                "user site and .pth")
