"""The one subprocess wrapper.

Takes an argument list (never a shell string), echoes the command, appends its
output to a log file, shows which step runs and for how long on long steps,
and on failure raises with the tail of the output and the log's path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oracle_build.core.env import SHOWN_PREFIXES, build_env
from oracle_build.core.errors import BuildFailed
from oracle_build.core.log import fmt_seconds, say

TAIL_LINES = 40
HEARTBEAT_SECONDS = 30.0


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    output: str  # stdout+stderr, interleaved (only kept when capture=True)
    seconds: float

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
) -> Result:
    """Run ``argv``. Output goes to ``log`` (appended) and, with capture, is returned."""
    args = [os.fspath(a) for a in argv]
    if not args or not all(isinstance(a, str) for a in args):
        raise TypeError("run() takes a non-empty argument list")
    cmdline = shlex.join(args)
    label = what or Path(args[0]).name
    if echo:
        say(f"    $ {cmdline}")
    logf = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        logf = log.open("a", encoding="utf-8", errors="replace")
        logf.write(f"\n$ {cmdline}\n")
        if cwd is not None:
            logf.write(f"# cwd: {cwd}\n")
        for item in _env_diff(env):
            logf.write(f"# env: {item}\n")
        logf.flush()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    kept: list[str] = []
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
    except FileNotFoundError as exc:
        if logf:
            logf.close()
        raise BuildFailed(f"{label}: command not found: {args[0]}", hint=hint) from exc

    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            last = tail[-1].strip()[:120] if tail else ""
            say(f"    ... {label} running {fmt_seconds(time.monotonic() - start)}: {last}")

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if capture:
                kept.append(line)
            if logf:
                logf.write(line)
        proc.wait(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
        if proc.stdout is not None:
            proc.stdout.close()
        if logf:
            logf.write(f"# exit {proc.returncode} after {time.monotonic() - start:.1f}s\n")
            logf.close()
    seconds = time.monotonic() - start
    result = Result(args, proc.returncode, "".join(kept), seconds)
    if check and proc.returncode != 0:
        shown = "".join(tail).rstrip()
        where = f"\n  full log: {log}" if log else ""
        raise BuildFailed(
            f"{label} exited with {proc.returncode} after {fmt_seconds(seconds)}\n"
            f"  $ {cmdline}\n  last lines:\n"
            + "\n".join("    | " + ln for ln in shown.splitlines())
            + where,
            hint=hint,
        )
    return result


def query(argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, timeout: float = 60) -> Result:
    """A short read-only question to a tool (its version, a listing): output captured, not
    echoed, never raising. A tool that is absent, fails or hangs answers with a non-zero
    return code (127 absent, 124 timed out) and its output."""
    args = [os.fspath(a) for a in argv]
    start = time.monotonic()
    try:
        done = subprocess.run(args, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, env=dict(env) if env is not None
                              else None, cwd=cwd, timeout=timeout, check=False)
    except FileNotFoundError:
        return Result(args, 127, "", time.monotonic() - start)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        return Result(args, 124, out, time.monotonic() - start)
    except OSError as exc:
        return Result(args, 126, str(exc), time.monotonic() - start)
    return Result(args, done.returncode, done.stdout + done.stderr, time.monotonic() - start)


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

    def environment(self) -> dict[str, str]:
        env = build_env()
        for key in self.unset:
            env.pop(key, None)
        env.update(self.env)
        return env

    def render(self) -> list[str]:
        lines = [f"      (only {self.when})"] if self.when else []
        lines += [f"      {k}={v}" for k, v in sorted(self.env.items())]
        lines += [f"      unset {k}" for k in self.unset]
        if self.cwd:
            lines.append(f"      (cd {self.cwd})")
        lines.append("      $ " + shlex.join(self.argv))
        return lines

    def as_dict(self) -> dict[str, object]:
        return {"argv": self.argv, "env": self.env, "unset": list(self.unset),
                "cwd": self.cwd, "when": self.when}


def run_cmd(cmd: Cmd, *, log: Path | None = None, capture: bool = False, check: bool = True,
            echo: bool = True, hint: str | None = None) -> Result:
    return run(cmd.argv, env=cmd.environment(), cwd=Path(cmd.cwd) if cmd.cwd else None,
               log=log, capture=capture, check=check, echo=echo, what=cmd.what or None,
               hint=hint)
