"""Issue 45 item 8: what a killed run leaves behind is ended or cleared by the next run, and a
child does not outlive a harness killed outright. Real processes, real folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oracle_build.core import layout, proc
from oracle_build.core.files import atomic_write_bytes, clear_stale_temporaries
from oracle_build.engine import host
from oracle_build.recipe import clear_dead_staging
from oracle_build.services.capture import writable_or_refuse
from tests.conftest import REPO


def gone(pid: int, within: float = 10.0) -> bool:
    """``pid`` ended (or is a zombie nobody reaps) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if state[state.rindex(")") + 2] in "ZX":
            return True
        time.sleep(0.05)
    return False


# the system calls a Python thread sleeps in while it waits for a child (Popen's timed wait:
# waitpid, then nanosleep; the untimed one: wait4), by machine
WAIT_SYSCALLS = {"x86_64": {"35", "230", "61", "247"}, "aarch64": {"101", "115", "260", "95"}}


def waiting(pid: int, within: float = 30.0) -> None:
    """Return once ``pid``'s main thread sleeps in a wait for its child (Popen's timed wait
    polls: waitpid, then a nanosleep), not for the GIL (a futex) or running: a signal sent
    then lands in the wait, not in the lines before it (seen on a loaded CI machine: a SIGINT
    between the harness's print and its ``try`` killed it with -2, not 130). A running task's
    wchan reads "0" as a hidden one does: the task's state tells them apart (R: running, keep
    looking), and where the kernel hides wchan, the system call it sleeps in says which wait
    it is (a 1 s grace there was what a loaded machine outran)."""
    import platform

    deadline = time.monotonic() + within
    task = Path(f"/proc/{pid}/task/{pid}")
    calls = WAIT_SYSCALLS.get(platform.machine())
    while time.monotonic() < deadline:
        try:
            where = (task / "wchan").read_text().strip()
            stat = (task / "stat").read_text()
        except OSError:
            return  # ended: the caller's wait says how
        state = stat[stat.rindex(")") + 2]
        if state == "S" and ("nanosleep" in where or where == "do_wait"):
            return
        if state == "S" and where in ("", "0"):  # wchan hidden: ask the system call
            try:
                call = (task / "syscall").read_text().split()[0]
            except (OSError, IndexError):
                call = None
            if call is None or calls is None:
                time.sleep(1.0)  # neither readable here: a moment's grace
                return
            if call in calls:
                return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not start waiting within {within}s")


def test_waiting_is_not_fooled_by_a_running_harness(tmp_path: Path) -> None:
    """The helper the Ctrl-C tests rest on: a harness that is still running 2 s after the
    line the test waits for (a loaded machine) is not yet waiting; `waiting` returns only once
    it sleeps in its wait for its child (it returned after a fixed 1 s before: a running
    task's wchan reads "0", which it took for a hidden one)."""
    script = tmp_path / "busy.py"
    script.write_text(textwrap.dedent("""
        import subprocess, time
        child = subprocess.Popen(["sleep", "30"])
        print("ready", flush=True)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:  # running, as a loaded machine would keep it
            pass
        try:
            child.wait(timeout=60)
        finally:
            child.kill()
    """))
    harness = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               text=True)
    assert harness.stdout is not None
    with harness.stdout:
        try:
            assert harness.stdout.readline().strip() == "ready"
            start = time.monotonic()
            waiting(harness.pid)
            assert time.monotonic() - start >= 1.8
        finally:
            harness.kill()
            harness.wait()


def dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_child_dies_with_a_harness_killed_outright(tmp_path: Path) -> None:
    """A build's `uv` went on installing after its harness was SIGKILLed (issue 45 item 8):
    every child starts in its own process group with PR_SET_PDEATHSIG, so the kernel ends it
    when the harness dies, however it died."""
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from oracle_build.core import proc
        live = proc.Live(["sleep", "300"], echo=False)
        print(live.proc.pid, flush=True)
        time.sleep(300)
    """))
    harness = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               text=True)
    assert harness.stdout is not None
    with harness.stdout:  # closed however the test ends (no leak into a later test)
        try:
            child = int(harness.stdout.readline())
            assert os.getpgid(child) == child  # its own group: a Ctrl-C of ours ends it whole
            assert not gone(child, within=0.5)
        finally:
            harness.kill()
            harness.wait()
    assert gone(child), f"sleep {child} outlived its harness"


def test_a_ctrl_c_ends_the_childs_whole_group(tmp_path: Path) -> None:
    """A child in a session of its own no longer sees the terminal's SIGINT: the harness,
    interrupted while it waits, ends the child's whole group (a compiler under ninja under
    pip) before it exits 130."""
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from oracle_build.core import proc
        live = proc.Live(["sh", "-c", "sleep 300 & echo $!; wait"], echo=False, capture=True)
        import time
        while not live.tail:
            time.sleep(0.05)
        print(live.tail[0].strip(), flush=True)
        try:
            live.finish()
        except KeyboardInterrupt:
            sys.exit(130)
    """))
    harness = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               text=True)
    assert harness.stdout is not None
    with harness.stdout:  # closed however the test ends (no leak into a later test)
        try:
            grandchild = int(harness.stdout.readline())
            waiting(harness.pid)
            harness.send_signal(signal.SIGINT)
            assert harness.wait(timeout=30) == 130
        finally:
            harness.kill()
            harness.wait()
    assert gone(grandchild), f"sleep {grandchild} (a grandchild) outlived the Ctrl-C"


def test_a_ctrl_c_a_finalizer_swallowed_still_ends_the_command_with_130(tmp_path: Path) -> None:
    """CI saw a build interrupted in its toolchain step publish and exit 0: the SIGINT's
    KeyboardInterrupt was raised inside a finalizer, where Python prints "Exception ignored"
    and drops it. Here the interrupt lands inside a ``__del__`` of a command that then
    returns 0: the command still exits 130."""
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(f"""
        import argparse, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from oracle_build import cli

        class Closing:
            def __del__(self):
                print("in __del__", flush=True)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # the Ctrl-C comes in here
                    time.sleep(0.01)

        def command(args):
            Closing()  # its finalizer runs at once, and swallows what is raised there
            print("the command went on", flush=True)
            return 0

        sys.exit(cli._run(argparse.Namespace(func=command)))
    """))
    harness = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert harness.stdout is not None and harness.stderr is not None
    with harness.stdout, harness.stderr:
        try:
            assert harness.stdout.readline() == "in __del__\n"
            harness.send_signal(signal.SIGINT)
            assert harness.wait(timeout=60) == 130
            out, err = harness.stdout.read(), harness.stderr.read()
        finally:
            harness.kill()
            harness.wait()
    assert "the command went on" in out  # the exception was swallowed ...
    assert "Exception ignored" in err and "KeyboardInterrupt" in err
    assert "oracle-build: interrupted" in err  # ... and the interrupt still counted


def test_the_next_build_clears_what_an_unfinished_one_left(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """A killed build left its staging folder (3.4 GB) and a process still working in it;
    the next build of the pin, under its lock, ends the process, keeps the log under logs/
    and removes the folder. Another pin's staging folder is not its business."""
    home = tmp_path / "home"
    dead = home / "staging" / "cpu-0123456789ab.20261204T120000Z-4242"
    other = home / "staging" / "cpu-source-ba9876543210.20261204T120000Z-4243"
    for folder in (dead, other):
        (folder / "venv").mkdir(parents=True)
        (folder / layout.BUILD_LOG).write_text("# the dead build's log\n")
    # a folder whose name only starts with the dead one's, and a process working there
    sibling = dead.with_name(dead.name + "1x")
    (sibling / "venv").mkdir(parents=True)
    bystander = subprocess.Popen(["sh", "-c", "sleep 300", str(sibling / "venv")],
                                 cwd=sibling, start_new_session=True)
    worker = subprocess.Popen(["sleep", "300"], cwd=dead / "venv", start_new_session=True)
    try:
        cleared = clear_dead_staging(home, "cpu-0123456789ab")
        assert cleared == [dead] and not dead.exists() and other.exists()
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None and sibling.exists()
        (log,) = (home / "logs").glob("build-unfinished-cpu-0123456789ab.*.log")
        assert log.read_text() == "# the dead build's log\n"
        err = capsys.readouterr().err
        assert "cleared what an unfinished build of cpu-0123456789ab left" in err
        assert "1 of its processes still running there, ended" in err and str(log) in err
    finally:
        for process in (worker, bystander):
            process.kill()
            process.wait()


def test_a_dead_harness_engine_folder_is_swept(tmp_path: Path) -> None:
    """A capture killed outright left /tmp/oracle-driver-* (and its engine host working in
    it for about 30 s): the next engine host's start ends what still works there and removes
    the folder; a live harness's folder stays."""
    mine = tmp_path / f"{host.DRIVER_PREFIX}{os.getpid()}-abcd"
    theirs = tmp_path / f"{host.DRIVER_PREFIX}{dead_pid()}-efgh"
    unrelated = tmp_path / f"{host.DRIVER_PREFIX}notapid"
    for folder in (mine, theirs, unrelated):
        folder.mkdir()
        (folder / "facts.json").write_text("{}")
    worker = subprocess.Popen(["sleep", "300"], cwd=theirs, start_new_session=True)
    try:
        assert proc.leftovers(theirs) == [worker.pid]
        assert host.sweep_dead_hosts(tmp_path) == [theirs]
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert mine.exists() and unrelated.exists() and not theirs.exists()
    finally:
        worker.kill()
        worker.wait()


def test_a_capture_clears_a_killed_publish_temporaries(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Killed at publish, a capture left its half-written files in the goldens folder: the
    next capture into it clears them (this package's temporary names, of dead processes
    only) before any engine starts; a golden, another file and a live writer's temporary
    stay."""
    folder = tmp_path / "tiny-llama-greedy"
    folder.mkdir()
    pid = dead_pid()
    stale = [f".topk.0a1b.safetensors.{pid}.k3j_9x2a.tmp", f".golden.json.{pid}.abcdefgh.tmp",
             f".golden.{pid}.zz_zz_zz.check"]
    live = f".golden.json.{os.getpid()}.abcdefgh.tmp"
    kept = ["golden.json", "notes.tmp", ".hidden", live]
    for name in stale + kept:
        (folder / name).write_text("x")
    writable_or_refuse(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)
    err = capsys.readouterr().err
    assert "cleared what an unfinished capture left" in err and stale[0] in err
    assert clear_stale_temporaries(folder) == []


def test_atomic_writes_name_their_writer(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file of an atomic write carries its writer's pid, which is what lets the
    next run tell a dead writer's leftover from a live one's."""
    target = tmp_path / "golden.json"
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write_bytes(target, b"{}")
    assert seen and seen[0].startswith(f".golden.json.{os.getpid()}.") and \
        seen[0].endswith(".tmp")
