"""Command line: ``python -m oracle_build <command>`` (also the ``oracle-build`` script).

Dispatch only: each command's options, run and rendering live in its module under
``commands/`` (the table below, as pip keeps ``commands/__init__.py``). This is the only place
that catches errors: each failure kind maps to its exit code (see core/errors.py and the
README); anything unforeseen is exit 70, never 1 (drift). Results go to stdout; progress to
stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from oracle_build import __version__
from oracle_build.commands import COMMANDS
from oracle_build.commands.common import EXIT_CODES_HELP
from oracle_build.core import interrupt
from oracle_build.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, OracleBuildError, OutputFailed
from oracle_build.core.log import say


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="oracle-build",
        description="Rebuild a pinned vLLM oracle from its pin, prove its identity, capture "
        "and verify goldens.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"oracle-build {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return top


def entry() -> int:
    """The process's entry (``python -m oracle_build``, the ``oracle-build`` script): main's
    exit code, whatever the interpreter was told. Under PYTHONINSPECT (or -i) Python would
    turn the ending SystemExit into a traceback, a prompt and exit 1 (drift's code): the
    streams are flushed and the process ends with the tool's own code instead."""
    try:
        code = main()
    except SystemExit as exc:  # argparse's usage errors and --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if sys.flags.inspect:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    original = sys.stdout
    sys.stdout = _Stdout(original)
    try:
        return _run(args)
    finally:
        if sys.stdout is not original and isinstance(sys.stdout, _Stdout):
            sys.stdout = original if not sys.stdout.broken else _devnull()


def _devnull() -> TextIO:
    return open(os.devnull, "w")


def _run(args: argparse.Namespace) -> int:
    try:
        with interrupt.watched():
            code = _command(args)
    except KeyboardInterrupt:  # one that came after the command's own handling
        code = EXIT_INTERRUPTED
        say("oracle-build: interrupted")
    if interrupt.received() and code != EXIT_INTERRUPTED:
        # a Ctrl-C whose KeyboardInterrupt a finalizer swallowed: still an interrupt
        say("oracle-build: interrupted")
        return EXIT_INTERRUPTED
    return code


def _command(args: argparse.Namespace) -> int:
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a report that cannot be written is an output error, here
        return code
    except OracleBuildError as exc:
        say(exc.render())
        return exc.exit_code
    except KeyboardInterrupt:
        say("oracle-build: interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of ours: never exit 1 (drift), never a bare traceback
        if _interrupted(exc):
            say("oracle-build: interrupted")
            return EXIT_INTERRUPTED
        return _internal(args, exc)


def _interrupted(exc: BaseException) -> bool:
    """An interrupt that became another error while the stack unwound is an interrupt: a
    Ctrl-C landing inside the standard library's own cleanup (shutil.rmtree closing a
    descriptor twice raises EBADF over the KeyboardInterrupt) is not a bug of ours."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _internal(args: argparse.Namespace, exc: BaseException) -> int:
    log = _internal_error_log(args, exc)
    say(f"oracle-build: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
        f"(a bug in oracle-build, not a verdict; traceback in {log})")
    return EXIT_INTERNAL


class _Stdout:
    """Standard output, whose failure to take a line (a full disk, /dev/full, a closed
    pipe) is an output error, exit 14, said on stderr, not an internal error: every print
    of every command goes through it. Once broken it takes nothing more (the interpreter's
    own flush at exit does not fail again)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def _failed(self, exc: OSError) -> OutputFailed:
        self.broken = True
        return OutputFailed(f"standard output: {exc.strerror or exc} (the report printed "
                            "there is incomplete)",
                            hint="write it where there is room, or use the command's file "
                            "options (--json to a file, --junit-xml, --summary-md, --html)")

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise self._failed(exc) from None

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            raise self._failed(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _internal_error_log(args: argparse.Namespace, exc: BaseException) -> str:
    """The traceback, written under the home's logs (or the temp folder if that fails)."""
    import tempfile
    import traceback

    from oracle_build.cache.ref import redacted
    from oracle_build.core.files import open_for_writing
    from oracle_build.core.layout import default_home, log_path

    argv = [redacted(a) if "://" in a else a for a in sys.argv]  # no password in a log
    text = (f"oracle-build {__version__}: internal error\nargv: {argv}\n\n"
            + "".join(traceback.format_exception(exc)))
    try:
        home = Path(args.home).expanduser().resolve() if getattr(args, "home", None) \
            else default_home()
        path = log_path(home, "internal-error", str(getattr(args, "command", "cli")))
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_for_writing(path, text=True) as fh:
            fh.write(text)
        return str(path)
    except Exception:
        fd, name = tempfile.mkstemp(prefix="oracle-build-internal-error-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return name


if __name__ == "__main__":
    sys.exit(main())
