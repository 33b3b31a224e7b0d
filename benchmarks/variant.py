"""The held CPU kernel variant against the host's own kernels, measured in one run on this
machine: capture and verify of the embedded default under the pin's variant (x86_64-avx2)
and under `--kernel-variant native`, paired (each round runs all four back to back, the
order alternating between rounds, so a noisy minute slows both sides).

    python benchmarks/variant.py [--rounds 3] [--home H]
    python benchmarks/variant.py --quick      # CI: one round; every figure still produced

Prints the medians and the held/native ratios. On an AVX2-only host native *is* AVX2, so the
ratio measures the cost of holding alone (it should be 1.0); on an AVX-512 or AMX host it is
the price of one golden on every CPU model. verify of the AVX2 golden under native is a
configuration difference there (exit 4): its time is still the engine's work.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import fmt  # noqa: E402
from oracle_build import host  # noqa: E402
from oracle_build.core import layout  # noqa: E402

SPEC = REPO / "goldens" / "tiny-llama-greedy"


def timed(argv: list[str], ok: tuple[int, ...]) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--home", default=str(layout.default_home()))
    ap.add_argument("--quick", action="store_true", help="one round (CI)")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    cli = [sys.executable, "-m", "oracle_build"]
    times: dict[str, list[float]] = {k: [] for k in ("capture held", "capture native",
                                                      "verify held", "verify native")}
    with tempfile.TemporaryDirectory(prefix="variant-bench-") as tmp:
        for n in range(rounds):
            order = ["held", "native"] if n % 2 == 0 else ["native", "held"]
            for which in order:
                flag = [] if which == "held" else ["--kernel-variant", "native"]
                out = Path(tmp) / f"{which}-{n}"
                times[f"capture {which}"].append(timed(
                    [*cli, "capture", str(SPEC), "--out", str(out), "--home", args.home, *flag],
                    (0,)))
                # the AVX2 golden under native: a configuration difference off AVX2 (4)
                times[f"verify {which}"].append(timed(
                    [*cli, "verify", str(SPEC), "--home", args.home, *flag],
                    (0,) if which == "held" else (0, 4)))
    print(f"held variant (pins/cpu.toml) vs native on this host ({host.host().cpu_variant}), "
          f"{rounds} paired round(s)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"  {k:<15} {fmt(v)}")
    for what in ("capture", "verify"):
        print(f"  {what}: held / native = {med[what + ' held'] / med[what + ' native']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
