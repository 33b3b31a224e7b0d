"""Benchmarks that cannot rot: every script under benchmarks/ runs here in its quick mode
(one round, small sizes), through the same code paths as its full mode, and each figure it
prints is read back as a number. A script that cannot produce a figure fails its test.
The full modes stay commands people run by hand (docs/performance.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.pins import load_pin
from tests.conftest import REPO, BuiltOracle
from tests.srcpkg import make_repo, write_locked_pin

BENCH = REPO / "benchmarks"
SECONDS = re.compile(r"median +([0-9.]+) s")
RATIO = re.compile(r"([0-9.]+)x")


def bench(script: str, *args: str, env: dict[str, str] | None = None,
          timeout: float = 1500) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def figure(out: str, label: str, pattern: re.Pattern[str] = SECONDS) -> float:
    """The number on the line starting with ``label``: it must be there, and positive."""
    line = next((ln for ln in out.splitlines() if ln.strip().startswith(label)), None)
    assert line is not None, f"no {label!r} figure:\n{out[-3000:]}"
    found = pattern.search(line)
    assert found is not None, line
    value = float(found.group(1))
    assert value > 0, line
    return value


def test_large_golden_makes_a_golden_verify_reads(tmp_path: Path) -> None:
    """The bundled golden's record names a top-k sidecar; the generated file holds its rows
    inline, and is a golden the tool loads (it was refused before: the rot this test found)."""
    out = bench("large_golden.py", str(tmp_path / "g" / "golden.json"), "7", "5", "20")
    assert "7 prompts" in out
    golden = load_golden(tmp_path / "g" / "golden.json")
    assert [len(p.token_ids) for p in golden.prompts] == [5] * 7
    assert all(len(row) == 20 for p in golden.prompts for row in p.topk)


@dataclass
class SmallOracle:
    pin: Path
    home: Path
    wheelhouse: Path


@pytest.fixture(scope="module")
def small_oracle(tmp_path_factory: pytest.TempPathFactory) -> SmallOracle:
    """The small source package's oracle, its pin locked (tests/srcpkg.py): built in
    seconds, pushed and pulled in seconds. The quick modes of recovery.py and cache.py run
    on it ("small sizes"): the same code paths as on the CPU pin (a rebuild from the
    wheelhouse, the floor install, identity; a push, a recovery from the registry, its
    floor, a pull's memory), the CPU pin's figures being their full mode, by hand
    (docs/performance.md). They installed the CPU oracle four times (about six minutes)."""
    root = tmp_path_factory.mktemp("small-oracle")
    pin = write_locked_pin(root, make_repo(root / "src" / "pkg"))
    home, wheelhouse = root / "home", root / "wheelhouse"
    built = subprocess.run([sys.executable, "-m", "oracle_build", "build", "--pin", str(pin),
                            "--home", str(home), "--wheelhouse", str(wheelhouse)],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return SmallOracle(pin, home, wheelhouse)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_speed_and_recovery_quick(cpu_oracle: BuiltOracle, host_golden: Path,
                                  small_oracle: SmallOracle, tmp_path: Path) -> None:
    """all.py --quick: ci_speed.py (a bare engine run, verify, capture, verify's own work)
    on the CPU oracle, and recovery.py (a rebuild from the wheelhouse, the floor install,
    identity) on the small locked pin. Slow: four engine starts are what ci_speed's figures
    measure."""
    out = bench("all.py", "--quick", "--golden", str(host_golden), "--work",
                str(tmp_path / "work"), "--pin", str(small_oracle.pin),
                env={"ORACLE_BUILD_HOME": str(cpu_oracle.home),
                     "ORACLE_BUILD_WHEELHOUSE": str(small_oracle.wheelhouse)})
    assert f"recovery benchmark, pin {load_pin(small_oracle.pin).key}" in out
    for label in ("(1) bare engine run", "(2) verify, CLI", "(4) bare engine run",
                  "capture, CLI", "(5) verify's own work", "(b) rebuild", "(c) floor",
                  "(d) identity check", "bare `import vllm`"):
        figure(out, label)
    figure(out, "(d') identity --deep", RATIO)
    figure(out, "ratio: ", RATIO)
    figure(out, "ratio (b)/(c)", RATIO)
    # the oracle's python started in a folder of the run's own, not one left in /tmp
    assert (tmp_path / "work" / "recovery" / "neutral").is_dir()
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_cache_quick(small_oracle: SmallOracle, tmp_path: Path) -> None:
    """cache.py --quick against a real registry, on the small locked pin's oracle: push
    twice, a recovery from it and its floor, the peak RSS of a pull and of one 64 MiB blob.
    Slow: a real registry, a real build from the cache."""
    out = bench("cache.py", "--quick", "--work", str(tmp_path / "work"), "--pin",
                str(small_oracle.pin),
                env={"ORACLE_BUILD_HOME": str(small_oracle.home),
                     "ORACLE_BUILD_WHEELHOUSE": str(small_oracle.wheelhouse)})
    assert f"pin {load_pin(small_oracle.pin).key}, registry" in out
    assert "pull of the oracle (2 wheels)" in out  # the lock's wheel and the built one
    for label in ("(p1) push", "(p2) push again"):
        line = next(ln for ln in out.splitlines() if ln.startswith(label))
        assert float(line.split()[-2]) > 0, line
    figure(out, "(r) recovery")
    figure(out, "(f) floor")
    figure(out, "ratio (r)/(f)", RATIO)
    for label in ("(m1) peak RSS", "(m2) one"):
        line = next(ln for ln in out.splitlines() if ln.startswith(label))
        assert re.search(r"[0-9]+ MB", line), line
    assert "same size" in out
    assert (tmp_path / "work" / "neutral").is_dir()  # the floor's start folder, not in /tmp


@pytest.mark.slow
def test_reliability_quick(tmp_path: Path) -> None:
    """reliability.py --quick: the fuzz suite and the fast fault case, their counts rendered
    into a copy of docs/reliability.md between its markers (the page itself is untouched).
    Slow: a pytest run of its own."""
    doc = tmp_path / "reliability.md"
    shutil.copy2(REPO / "docs" / "reliability.md", doc)
    before = (REPO / "docs" / "reliability.md").read_text()
    out = bench("reliability.py", "--quick", "--doc", str(doc), timeout=900)
    text = doc.read_text()
    assert "**all readers**" in out and "no shell anywhere" in text
    tried = re.search(r"\| \*\*all readers\*\* \| \*\*([0-9]+)\*\* \|", text)
    assert tried is not None and int(tried.group(1)) > 0
    assert (REPO / "docs" / "reliability.md").read_text() == before


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_variant_quick(cpu_oracle: BuiltOracle) -> None:
    """variant.py --quick: capture and verify of the embedded default under the held
    variant and under native, paired. Slow: four engine starts are what it measures."""
    out = bench("variant.py", "--quick", "--home", str(cpu_oracle.home))
    for label in ("capture held", "capture native", "verify held", "verify native"):
        figure(out, label)
    figure(out, "capture: held / native", RATIO)
    figure(out, "verify: held / native", RATIO)


def test_every_benchmark_script_runs_here() -> None:
    """A script under benchmarks/ without a quick-mode run in this file would rot unseen."""
    source = Path(__file__).read_text()
    scripts = sorted(p.name for p in BENCH.glob("*.py") if p.name != "__init__.py")
    run_by_all = {"ci_speed.py", "recovery.py"}  # all.py runs their quick modes
    missing = [s for s in scripts if s not in run_by_all and f'bench("{s}"' not in source]
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_source_build_quick() -> None:
    """The source build's benchmark on the small sdist: its floor (the plan's own wheel
    command without a launcher, and the installs), a cold build into an empty compiler cache
    and a warm one in another home; every figure and both ratios printed; the three legs'
    compiled bytes the same (the path map: the floor's compiler, with no ccache, is given
    absolute paths in a third home). Slow: three builds of a real package with real venvs."""
    out = bench("source_build.py", "--quick", "--rounds", "2")
    for label in ("floor", "cold", "warm"):
        figure(out, label)
        figure(out, f"{label:<6} cpu")  # its CPU time, measured
    # the second round runs its legs in the other order, and each round has its own ratio
    assert "round 1: floor, cold, warm" in out and "round 2: cold, warm, floor" in out, out
    assert out.index("round 2 cold:") < out.index("round 2 floor:"), out
    figure(out, "round 1 cold / floor:", RATIO)
    figure(out, "round 2 cold / floor:", RATIO)
    figure(out, "cold / floor:", RATIO)
    figure(out, "cold / floor, CPU time:", RATIO)
    figure(out, "warm / cold:", RATIO)
    assert re.search(r"median of the rounds: [0-9.]+x", out), out
    compiled = [line for line in out.splitlines() if line.startswith("    vllm/")]
    assert len(compiled) == 2, out  # one compiled file, in each of two rounds
    assert all("same in cold, warm, floor" in line for line in compiled), out
    # the compiler cache's cost on a miss, per translation unit, as Ninja runs the compile
    out = bench("source_build.py", "--quick", "--units", "csrc/ops.c")
    figure(out, "csrc/ops.c: bare")  # its median, in seconds
    figure(out, "csrc/ops.c: bare", re.compile(r"ccache / bare: ([0-9.]+)x"))
