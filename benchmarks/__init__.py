"""The benchmarks (each script prints its figures; docs/performance.md quotes them) and the
one way they print a duration."""

from __future__ import annotations

import statistics
from pathlib import Path


def seconds(x: float) -> str:
    """A duration as a figure prints it: two decimals, four under 0.1 s (a step a fast
    machine does in milliseconds must not print as 0.00)."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.4f}"


def fmt(xs: list[float]) -> str:
    """The median of some runs, then each run: ``median   1.23 s  (runs: 1.20, 1.23)``."""
    return (f"median {seconds(statistics.median(xs)):>7} s  "
            f"(runs: {', '.join(seconds(x) for x in xs)})")


def neutral_dir(work: Path) -> Path:
    """An empty folder to start an oracle's python in (nothing importable beside it), inside
    the benchmark's own work folder: every run used to leave one in /tmp."""
    folder = work / "neutral"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
