"""Advisory file locks, so two runs for the same pin or golden never interleave."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oracle_build.core.errors import OutputFailed, Refused, as_data
from oracle_build.core.log import say


def _refused(path: Path, what: str, why: str) -> OutputFailed:
    return OutputFailed(f"cannot use the lock file {as_data(str(path))} for {what}: {why}",
                        hint="a regular file in a folder the tool can write (the home, or "
                        "ORACLE_BUILD_ENGINE_LOCK's)")


@contextmanager
def held(path: Path, *, what: str, wait: bool = True) -> Iterator[None]:
    """The lock at ``path``, opened only as a regular file of its own: a symlink there is
    refused (O_NOFOLLOW: a lock pointed at a victim file would overwrite it with a pid), and
    so is a FIFO, a device or a socket (O_NONBLOCK, then fstat), each exit 14, named."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    except OSError as exc:  # a read-only home, a lock path under a regular file, a symlink
        why = ("a symlink: refused (a lock is a file of its own)" if exc.errno == errno.ELOOP
               else str(exc.strerror or exc))
        raise _refused(path, what, why) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refused(path, what, "not a regular file (a FIFO, a device or a socket)")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = as_data(os.pread(fd, 64, 0).decode(errors="replace").strip() or "?")
            if not wait:
                raise Refused(f"another run holds {path} (pid {holder}) for {what}",
                              hint="wait for it to finish, or drop --no-wait") from None
            say(f"waiting: another run (pid {holder}) holds {path} for {what}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
