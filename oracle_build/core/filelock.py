"""Advisory file locks, so two runs for the same pin or golden never interleave."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oracle_build.core.errors import OutputFailed, Refused, as_data
from oracle_build.core.log import say


@contextmanager
def held(path: Path, *, what: str, wait: bool = True) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only home, a lock path under a regular file
        raise OutputFailed(f"cannot open the lock file {as_data(str(path))} for {what}: "
                           f"{exc.strerror or exc}",
                           hint="a folder the tool can write (the home, or "
                           "ORACLE_BUILD_ENGINE_LOCK's)") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
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
