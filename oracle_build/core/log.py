"""Console output: what we are about to do, which step runs, and how long it took."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from oracle_build.core import interrupt
from oracle_build.core.errors import defused_lines


def say(message: object = "") -> None:
    """Progress and facts for the human go to stderr; stdout stays for results. With
    ``emit``, the only writers of the tool's console: every line through the one renderer
    (core.errors.defused_lines: control characters escaped, a line that reads as a verdict
    behind a bar unless core/verdicts.py made it)."""
    print(defused_lines(str(message)), file=sys.stderr, flush=True)


def emit(message: object = "", *, end: str = "\n") -> None:
    """A command's result on stdout (a report, an identity block, JSON), through the same
    renderer as ``say``."""
    print(defused_lines(str(message)), end=end, flush=True)


def fmt_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


@dataclass
class Steps:
    """Numbered steps with durations, kept for the build record."""

    total: int
    timings: dict[str, float] = field(default_factory=dict)
    _index: int = 0

    @property
    def current(self) -> int:
        return self._index

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        interrupt.check()  # a Ctrl-C a finalizer swallowed stops the work here
        self._index += 1
        say(f"==> [{self._index}/{self.total}] {name}")
        start = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - start
            self.timings[name] = round(elapsed, 3)
            say(f"    {name}: {fmt_seconds(elapsed)}")
