"""Run the fault and bad-input suite and write its figures into docs/reliability.md.

    python benchmarks/reliability.py       # test_fuzz.py, test_faults.py, test_faults_cpu_pin.py
    python benchmarks/reliability.py --quick --doc OUT.md
        # CI: test_fuzz.py and test_faults.py's fast case only, rendered into OUT.md (a copy
        # of docs/reliability.md; the real page is written only by the full run)

docs/reliability.md's figures (between the reliability markers) is regenerated from what
the suite counted in this run: inputs tried per reader, kill points survived, concurrency
and hostile-environment cases. A failing suite writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"


def render(data: dict[str, dict[str, object]]) -> str:
    fuzz = data.get("fuzz", {})
    tried = fuzz.get("inputs_tried", {})
    outcomes = fuzz.get("outcomes", {})
    assert isinstance(tried, dict) and isinstance(outcomes, dict)
    lines = [START, "", "| reader | inputs tried | clear error (exit 2) | still valid, loaded |",
             "|---|---|---|---|"]
    for reader, n in sorted(tried.items()):
        bad = outcomes.get(f"{reader}: BadInput", "-")
        ok = outcomes.get(f"{reader}: loaded", "-")
        lines.append(f"| {reader} | {n} | {bad} | {ok} |")
    lines.append(f"| **all readers** | **{sum(tried.values())}** | | |")
    lines.append("")
    lines.append("Not one of them ended in a traceback, another exception, or a written file.")
    for section in ("kill points survived", "concurrency", "hostile environment", "security"):
        cases = data.get(section, {})
        if not cases:
            continue
        lines += ["", f"**{section.capitalize()}** ({sum(cases.values())}):"]  # type: ignore[arg-type]
        lines += [f"- {case}" + (f" x{n}" if n != 1 else "") for case, n in sorted(cases.items())]
    lines += ["", "Regenerate: `python benchmarks/reliability.py`.", END]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="CI's mode: the fuzz suite and the fast fault case only")
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "reliability.md",
                    help="the page whose figures are rewritten (default docs/reliability.md)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="reliability-"))
    out = scratch / "figures.json"
    env = {**os.environ, "ORACLE_BUILD_RELIABILITY_OUT": str(out)}
    tests = (["tests/test_fuzz.py", "tests/test_faults.py::test_no_field_ever_reaches_a_shell"]
             if args.quick else ["tests/test_fuzz.py", "tests/test_faults.py",
                                 "tests/test_faults_cpu_pin.py"])
    # a pytest of its own: its own basetemp, so it never prunes a calling suite's folders
    code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={scratch / 'tmp'}", *tests], cwd=REPO, env=env,
                          check=False).returncode
    if code != 0:
        print(f"the suite failed; {args.doc} left as it was", file=sys.stderr)
        return code
    data = json.loads(out.read_text())
    if not data.get("fuzz", {}).get("inputs_tried"):
        print("the suite ran but counted no fuzzed input: no figure to write", file=sys.stderr)
        return 1
    readme = args.doc
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"{readme} has no reliability markers", file=sys.stderr)
        return 2
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + render(data) + tail)
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
