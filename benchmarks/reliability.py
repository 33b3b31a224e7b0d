"""Run the fault and bad-input suite and write its figures into docs/reliability.md.

    python benchmarks/reliability.py            # runs tests/test_fuzz.py and tests/test_faults.py

docs/reliability.md's figures (between the reliability markers) is regenerated from what
the suite counted in this run: inputs tried per reader, kill points survived, concurrency
and hostile-environment cases. A failing suite writes nothing.
"""

from __future__ import annotations

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
    out = Path(tempfile.mkdtemp(prefix="reliability-")) / "figures.json"
    env = {**os.environ, "ORACLE_BUILD_RELIABILITY_OUT": str(out)}
    code = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_fuzz.py",
                           "tests/test_faults.py"], cwd=REPO, env=env, check=False).returncode
    if code != 0:
        print("the suite failed; docs/reliability.md left as it was", file=sys.stderr)
        return code
    data = json.loads(out.read_text())
    readme = REPO / "docs" / "reliability.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print("docs/reliability.md has no reliability markers", file=sys.stderr)
        return 2
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + render(data) + tail)
    print(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
