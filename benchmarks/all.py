"""Every speed figure the README quotes, in one run: benchmarks/ci_speed.py (verify and
capture against a bare engine run, through the CLI and through nox; verify's own work on a
2,000 x 256 x top-20 golden) then benchmarks/recovery.py --skip-cold (a rebuild from the
wheelhouse against install + first import; identity against a bare import).

    python benchmarks/all.py [--runs 3]
    python benchmarks/all.py --quick          # each script's quick mode (CI)
    python benchmarks/all.py --quick --pin P  # recovery.py on pin P (CI: a small one)

Each script's lines are shown as they come; the ratios are gathered at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="each script's --quick (CI's mode)")
    ap.add_argument("--golden", type=Path, default=None, help="ci_speed.py's --golden")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder; each script works in a folder of its own inside")
    ap.add_argument("--pin", type=Path, default=None,
                    help="recovery.py's --pin (default: pins/cpu.toml); CI's quick run takes "
                    "a small pin, whose rebuild takes seconds")
    args = ap.parse_args()
    ratios: list[str] = []
    start = time.monotonic()
    golden = ["--golden", str(args.golden)] if args.golden else []
    pin = ["--pin", str(args.pin)] if args.pin else []
    for script, extra in (("ci_speed.py", golden), ("recovery.py", ["--skip-cold", *pin])):
        mode = ["--quick"] if args.quick else ["--runs", str(args.runs)]
        if args.work:
            mode += ["--work", str(args.work / script.removesuffix(".py"))]
        proc = subprocess.Popen([sys.executable, str(HERE / script), *mode, *extra],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if "x  (target" in line or "(target <=" in line or "(quick" in line:
                ratios.append(f"{script}: {line.strip()}")
        if proc.wait() != 0:
            print(f"{script} exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
    print(f"\nall figures in {time.monotonic() - start:.0f} s; the targets:")
    for line in ratios:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
