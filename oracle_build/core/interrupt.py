"""A Ctrl-C is never lost. Python turns SIGINT into KeyboardInterrupt at the main thread's next
check, wherever that falls: a signal the kernel hands to another thread (a reader or hashing
thread, as it may after the process was stopped and continued) is acted on only when the main
thread next runs Python code, and if that is inside a finalizer (a ``__del__``, a weakref
callback) the exception is printed as "Exception ignored" and dropped: the command then ran on
and exited 0 (seen in CI: a build interrupted in its toolchain step published and said
ORACLE_IDENTITY_OK). Here the handler also records that it ran, so a command ends with the
interrupt's exit code whatever became of the exception, and a build stops at its next step."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_received = threading.Event()


def _handler(signum: int, frame: FrameType | None) -> None:
    _received.set()
    raise KeyboardInterrupt


def received() -> bool:
    """Whether a Ctrl-C came while ``watched`` was in force (raised or not)."""
    return _received.is_set()


def check() -> None:
    """Raise the interrupt a finalizer swallowed (a build checks before each step)."""
    if _received.is_set():
        raise KeyboardInterrupt


@contextmanager
def watched() -> Iterator[None]:
    """SIGINT recorded as well as raised, for the duration. Only from the main thread, and
    only where Python's own handler is in force (a process started with SIGINT ignored, as a
    shell's background job is, keeps ignoring it)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _received.clear()
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
