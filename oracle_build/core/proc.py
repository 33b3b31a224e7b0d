"""The one subprocess wrapper.

Takes an argument list (never a shell string), echoes the command, appends its
output to a log file, shows which step runs and for how long on long steps,
and on failure raises with the tail of the output and the log's path.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oracle_build.core.env import SHOWN_PREFIXES, build_env, current_base
from oracle_build.core.errors import BuildFailed
from oracle_build.core.files import open_for_writing
from oracle_build.core.log import fmt_seconds, say

TAIL_LINES = 40
HEARTBEAT_SECONDS = 30.0
# a build tool's progress line: ninja's "[n/N] ..." (also inside pip's indented echo)
PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]\s")


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    output: str  # stdout+stderr, interleaved (only kept when capture=True)
    seconds: float
    stopped: bool = False  # ended at its ``stop_at`` line, as asked

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _env_diff(env: Mapping[str, str] | None) -> list[str]:
    if env is None:
        return []
    base = os.environ
    shown = []
    for key in sorted(env):
        if base.get(key) != env[key]:
            shown.append(f"{key}={env[key]}")
    for key in sorted(set(base) - set(env)):
        if key.startswith(SHOWN_PREFIXES):
            shown.append(f"-{key}")
    return shown


_PR_SET_PDEATHSIG = 1


def _libc_prctl() -> object | None:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the next build's sweep is what remains
        return None


_PRCTL = _libc_prctl()


def _dies_with(parent: int) -> Callable[[], None] | None:
    """In the child, before its exec: the kernel sends it SIGKILL when the process that
    started it dies (PR_SET_PDEATHSIG; kept across exec), so a harness killed outright
    (SIGKILL, the OOM killer, a CI runner's cancel) leaves no `uv` installing into a staging
    folder nobody watches. Tied to the starting thread: only the main thread's children get
    it (a worker thread's end would kill them)."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _PRCTL

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # type: ignore[operator]
        if os.getppid() != parent:  # it died before the line above: go now
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


# A build's network: closed for every command that does not download, where the host
# allows it (a network namespace of the command's own, loopback up and nothing else), so a
# fetch the recipe does not know of (a future CMakeLists' FetchContent, a setup.py's
# download) fails instead of reaching the network.
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, the flags, the rest of the union (40 bytes)
CLOSURES = {
    "netns": "a network namespace of its own (unshare(CLONE_NEWNET), as root), loopback only",
    "userns": "a user and network namespace of its own (unshare(CLONE_NEWUSER | "
              "CLONE_NEWNET), unprivileged), loopback only",
}


def _unshare_network(how: str) -> None:
    """In the child, before its exec: a network namespace with only loopback, up."""
    import ctypes
    import fcntl
    import socket
    import struct

    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | (_CLONE_NEWUSER if how == "userns" else 0)
    if ctypes.CDLL(None, use_errno=True).unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if how == "userns":  # this user as itself inside: the files it writes stay its own
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        got = fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        up = struct.unpack(_IFREQ, got)[1] | _IFF_UP
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", up))


def _preexec(parent: int, closed: str | None) -> Callable[[], None] | None:
    dies = _dies_with(parent)
    if closed is None:
        return dies

    def both() -> None:
        if dies is not None:
            dies()
        _unshare_network(closed)

    return both


_closure: tuple[str | None, str] | None = None


def network_closure() -> tuple[str | None, str]:
    """How this host closes a build command's network: ("netns" or "userns", what it is),
    or (None, why it cannot). Measured once per process, by running /bin/true closed."""
    global _closure
    if _closure is not None:
        return _closure
    if not sys.platform.startswith("linux"):
        _closure = (None, f"no network namespaces on {sys.platform}")
        return _closure
    tried = []
    for how in (["netns", "userns"] if os.geteuid() == 0 else ["userns"]):
        try:
            done = subprocess.run(["/bin/true"], preexec_fn=functools.partial(
                _unshare_network, how), capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{how}: {str(exc)[:120]}")
            continue
        if done.returncode == 0:
            _closure = (how, CLOSURES[how])
            return _closure
        tried.append(f"{how}: /bin/true exited {done.returncode}")
    _closure = (None, "this host refuses a network namespace to this user ("
                + "; ".join(tried) + "): the build ran with the host's network")
    return _closure


def oracle_network() -> tuple[str | None, str]:
    """How a process of the oracle (identity probe, engine host, driver) has its network
    closed: inside a build, as the build's commands are; else as this host allows. Returns
    (the closure's key or None, the words every record and line uses: ``closed (<how>)`` or
    ``open (<why>)``)."""
    base = current_base()
    how = base.network if base is not None else network_closure()[0]
    if how is not None:
        return how, f"closed ({CLOSURES[how]})"
    why = network_closure()[1] if base is None else "the build's network is open"
    return None, f"open ({why.replace('the build ran', 'it runs')})"


def leftovers(folder: Path) -> list[int]:
    """Processes of this user still working in ``folder`` (their command line or working
    directory under it), other than this process's own group: what a build that died left
    running (a compiler, ninja, uv's bytecode workers)."""
    mine = os.getpgrp()
    needle = os.fsencode(os.fspath(folder))
    # the folder itself or a path under it, not a longer name it is the start of
    named = re.compile(re.escape(needle) + rb"(?=/|\x00|$)")
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getpgid(pid) == mine or entry.stat().st_uid != os.getuid():
                continue
            cmdline = (entry / "cmdline").read_bytes()
            try:
                cwd = os.fsencode(os.readlink(entry / "cwd"))
            except OSError:
                cwd = b""
        except (OSError, ProcessLookupError):
            continue
        if named.search(cmdline) or cwd == needle or cwd.startswith(needle + b"/"):
            found.append(pid)
    return found


def end_leftovers(folder: Path) -> int:
    """SIGKILL the process group of every process still working in ``folder``; how many
    processes there were."""
    pids = leftovers(folder)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


class Live:
    """A started command: its output streams to ``log`` (and a tail kept for errors) from a
    reader thread; it may be sent lines on its stdin (``stdin=True``) and is waited for with
    ``finish``. ``run`` is ``Live(...).finish(...)``; the engine host (a driver that has
    proved its identity and waits for its request) stays live between the two."""

    def __init__(self, argv: Sequence[str | os.PathLike[str]], *, log: Path | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 capture: bool = False, echo: bool = True, what: str | None = None,
                 hint: str | None = None, stdin: bool = False,
                 stop_at: str | None = None, closed: str | None = None) -> None:
        self.args = [os.fspath(a) for a in argv]
        # a line matching ``stop_at`` ends the command (its whole process group) there: the
        # real command, stopped at a point of its own output (CMake's "Build files have
        # been written"), not a copy of its first half
        self.stop_at = re.compile(stop_at) if stop_at else None
        self.stopped = False
        self.progress: tuple[int, int] | None = None
        if not self.args or not all(isinstance(a, str) for a in self.args):
            raise TypeError("run() takes a non-empty argument list")
        self.cmdline = shlex.join(self.args)
        self.label = what or Path(self.args[0]).name
        self.log, self.hint, self.capture = log, hint, capture
        if echo:
            say(f"    $ {self.cmdline}")
        self._logf = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._logf = open_for_writing(log, append=True, text=True)
            self._logf.write(f"\n$ {self.cmdline}\n")
            if cwd is not None:
                self._logf.write(f"# cwd: {cwd}\n")
            for item in _env_diff(env):
                self._logf.write(f"# env: {item}\n")
            self._logf.flush()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._kept: list[str] = []
        self.start = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                env=dict(env) if env is not None else None, cwd=cwd, text=True,
                encoding="utf-8", errors="replace", bufsize=1,
                # its own process group, ended whole when this process stops waiting for
                # it (finish), and with PDEATHSIG when this process dies outright
                start_new_session=True, preexec_fn=_preexec(os.getpid(), closed))
        except FileNotFoundError as exc:
            if self._logf:
                self._logf.close()
            raise BuildFailed(f"{self.label}: command not found: {self.args[0]}",
                              hint=hint) from exc
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line)
            if self.capture:
                self._kept.append(line)
            if self._logf:
                self._logf.write(line)
                self._logf.flush()
            m = PROGRESS.match(line)
            if m:
                self.progress = (int(m.group(1)), int(m.group(2)))
            if self.stop_at is not None and not self.stopped and self.stop_at.search(line):
                self.stopped = True
                self._kill_group(signal.SIGTERM)

    def _kill_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def _heartbeat(self) -> None:
        while not self._done.wait(HEARTBEAT_SECONDS):
            last = self.tail[-1].strip()[:120] if self.tail else ""
            where = f"[{self.progress[0]}/{self.progress[1]}] " if self.progress else ""
            say(f"    ... {self.label} running "
                f"{fmt_seconds(time.monotonic() - self.start)}: {where}{last}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: str) -> None:
        """One line to the command's stdin (which stays open)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, *, timeout: float | None = None, check: bool = True) -> Result:
        """Wait for the command's end (its stdin closed); with ``check``, a non-zero exit
        raises with the tail of its output and the log's path."""
        try:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            self._wait(timeout)
            self._reader.join()
        except BaseException:
            # its own session: a Ctrl-C reaches this process only, which ends the group
            self._kill_group(signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._done.set()
            self._reader.join(timeout=5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            if self._logf:
                self._logf.write(f"# exit {self.proc.returncode} after "
                                 f"{time.monotonic() - self.start:.1f}s\n")
                self._logf.close()
        seconds = time.monotonic() - self.start
        if self.stopped:  # what is left of its group goes with it
            self._kill_group(signal.SIGKILL)
        result = Result(self.args, self.proc.returncode, "".join(self._kept), seconds,
                        stopped=self.stopped)
        if check and self.proc.returncode != 0 and not self.stopped:
            shown = "".join(self.tail).rstrip()
            where = f"\n  full log: {self.log}" if self.log else ""
            failed = BuildFailed(
                f"{self.label} exited with {self.proc.returncode} after "
                f"{fmt_seconds(seconds)}\n  $ {self.cmdline}\n  last lines:\n"
                + "\n".join("    | " + ln for ln in shown.splitlines()) + where,
                hint=self.hint)
            failed.log = str(self.log) if self.log else None
            raise failed
        return result

    def _wait(self, timeout: float | None) -> None:
        """Wait for the command, polling (Popen's timed wait wakes every 50 ms) rather than
        blocked in the kernel: a Ctrl-C that the kernel handed to one of this process's other
        threads (a reader's, the heartbeat's) is acted on by the main thread within that
        time, not when the command ends by itself (core/interrupt.py)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                self.proc.wait(timeout=1.0 if left is None else max(0.0, min(1.0, left)))
                return
            except subprocess.TimeoutExpired:
                if left is not None and left <= 1.0:
                    raise

    def stop(self) -> None:
        """End it now (closing its stdin first: a waiting driver exits on its own)."""
        if self._done.is_set():
            return
        with contextlib.suppress(subprocess.TimeoutExpired):  # finish killed it
            self.finish(timeout=10, check=False)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    capture: bool = False,
    check: bool = True,
    echo: bool = True,
    what: str | None = None,
    timeout: float | None = None,
    hint: str | None = None,
    closed: str | None = None,
) -> Result:
    """Run ``argv``. Output goes to ``log`` (appended) and, with capture, is returned.
    ``closed``: its network closed that way (a ``CLOSURES`` key)."""
    live = Live(argv, log=log, env=env, cwd=cwd, capture=capture, echo=echo, what=what,
                hint=hint, closed=closed)
    return live.finish(timeout=timeout, check=check)


def query(argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, timeout: float = 60,
          closed: str | bool | None = True) -> Result:
    """A short read-only question to a tool (its version, a listing): output captured, not
    echoed, never raising. A tool that is absent, fails or hangs answers with a non-zero
    return code (127 absent, 124 timed out) and its output. Its network is closed as this
    host allows (``closed=True``, the default: a probe of a compiler, a git or a device
    reaches nothing of the host's but its own loopback), or that way (a ``CLOSURES`` key);
    ``closed=None``: open."""
    if closed is True:
        closed = network_closure()[0]
    elif closed is False:
        closed = None
    args = [os.fspath(a) for a in argv]
    start = time.monotonic()
    try:
        done = subprocess.run(args, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, env=dict(env) if env is not None
                              else None, cwd=cwd, timeout=timeout, check=False,
                              preexec_fn=(functools.partial(_unshare_network, closed)
                                          if closed else None))
    except FileNotFoundError:
        return Result(args, 127, "", time.monotonic() - start)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        return Result(args, 124, out, time.monotonic() - start)
    except (OSError, subprocess.SubprocessError) as exc:
        return Result(args, 126, str(exc), time.monotonic() - start)
    return Result(args, done.returncode, done.stdout + done.stderr, time.monotonic() - start)


@dataclass(frozen=True)
class Exchange:
    """What a short exchange with a helper program gave: its exit and its two streams."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def exchange(argv: Sequence[str | os.PathLike[str]], stdin: str, *,
             env: Mapping[str, str], timeout: float) -> Exchange:
    """A helper program asked one question (a credential helper: the server on its stdin):
    its stdout and stderr kept apart, in a process group of its own that dies with this
    process (PDEATHSIG). Its answer is what it wrote by the time it exited: a child it left
    holding its output does not hold us until the timeout, and whatever it started is ended
    with its group, answered or hung. Raises OSError when it cannot start, TimeoutError
    (an OSError) when it does not exit within ``timeout`` seconds."""
    args = [os.fspath(a) for a in argv]
    helper = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, errors="replace",
                              env=dict(env), start_new_session=True,
                              preexec_fn=_dies_with(os.getpid()))

    def end_group() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(helper.pid, signal.SIGKILL)

    try:
        assert helper.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            helper.stdin.write(stdin)
            helper.stdin.close()
        try:
            helper.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{Path(args[0]).name} did not answer within "
                               f"{fmt_seconds(timeout)}") from None
    except BaseException:
        end_group()
        helper.kill()
        helper.wait()
        raise
    finally:
        end_group()  # its children, if any: the pipes close, what it wrote is kept
        assert helper.stdout is not None and helper.stderr is not None
        with helper.stdout, helper.stderr:
            out, err = helper.stdout.read(), helper.stderr.read()
    return Exchange(args, helper.returncode, out, err)


@dataclass(frozen=True)
class Cmd:
    """A planned command: exactly what runs, as ``--dry-run`` prints it. Its environment is
    the build environment (``core.env.build_env()``) without ``unset``, plus ``env``."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    cwd: str | None = None
    what: str = ""
    when: str | None = None  # runs only under this condition (said in the plan)
    stop_at: str | None = None  # a regex: the command is ended at its first matching line
    # it downloads (pip download of the lock, a uv install from an index): it gets the
    # network and its settings (core.env.NETWORK_PASSED); every other build command runs
    # with the network closed where the host allows it
    network: bool = False

    def environment(self) -> dict[str, str]:
        env = build_env(network=self.network)
        env.update(self.env)
        for key in self.unset:  # unset wins: the plan prints `unset X`, so X never reaches it
            env.pop(key, None)
        return env

    def render(self) -> list[str]:
        lines = [f"      (only {self.when})"] if self.when else []
        lines += [f"      {k}={v}" for k, v in sorted(self.env.items())]
        lines += [f"      unset {k}" for k in self.unset]
        if self.network:
            lines.append("      (downloads: the network open, pip's configuration read)")
        if self.cwd:
            lines.append(f"      (cd {self.cwd})")
        lines.append("      $ " + shlex.join(self.argv))
        if self.stop_at:
            lines.append(f"      (stopped at the first line matching {self.stop_at!r})")
        return lines

    def as_dict(self) -> dict[str, object]:
        return {"argv": self.argv, "env": self.env, "unset": list(self.unset),
                "cwd": self.cwd, "when": self.when, "stop_at": self.stop_at,
                "network": self.network}


def run_cmd(cmd: Cmd, *, log: Path | None = None, capture: bool = False, check: bool = True,
            echo: bool = True, hint: str | None = None) -> Result:
    base = current_base()
    closed = base.network if base is not None and not cmd.network else None
    live = Live(cmd.argv, env=cmd.environment(), cwd=Path(cmd.cwd) if cmd.cwd else None,
                log=log, capture=capture, echo=echo, what=cmd.what or None, hint=hint,
                stop_at=cmd.stop_at, closed=closed)
    return live.finish(check=check)
