"""Reports for people: verify's table (identity, then configuration, then tokens, then the
gate). The same reports are written for machines as JSON by their models (contracts/)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from oracle_build.contracts.base import printable
from oracle_build.contracts.reports import GoldenVerdict, VerifyReport
from oracle_build.core import verdicts
from oracle_build.core.errors import as_data
from oracle_build.core.files import atomic_write_bytes
from oracle_build.core.log import say

UNRECORDED_BANNER = "CONFIGURATION UNRECORDED: NOT ADJUDICABLE"


def _fmt(value: Any) -> str:
    """A value read from a golden, a pin or a run, as data: control characters (a newline
    that could start a line of its own, an escape sequence) shown escaped, length bounded."""
    text = json.dumps(value) if not isinstance(value, str) else value
    text = printable(text)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: Any) -> str:
    """A sentence that may quote input (a why, a reason), as data on one line, bounded."""
    return as_data(str(value), 500)


# what acts mid-line (a value never starts a line here: each follows our own words)
MD_SPECIAL = re.compile(r"([\\`*_\[\]!<>|~])")


def _md(value: Any) -> str:
    """Text for Markdown that renders as the text: every character Markdown would act on
    escaped (no heading, link, image, emphasis or HTML from a value), on one line."""
    return MD_SPECIAL.sub(r"\\\1", _text(value))


def _code(value: Any) -> str:
    """A value as a Markdown code span the value cannot close: the fence is one backtick
    longer than the longest run of backticks in it."""
    text = _fmt(value)
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _m(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f}"


def _nats(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f} nats"


def verdict_words(v: GoldenVerdict) -> dict[str, str]:
    """The terminal's words for a golden's verdict, one per column: identity, then
    configuration, then tokens, then the gate (the HTML page shows the same)."""
    words = {"identity": "-", "configuration": "-", "tokens": "-", "gate": "-"}
    if v.status == "not_verifiable_here":
        words["identity"] = "NOT VERIFIABLE HERE"
        return words
    if v.status == "config_unrecorded":
        words["configuration"] = UNRECORDED_BANNER
    else:
        words["identity"] = "OK" if not v.identity else "ORACLE DIFFERS" if v.tokens \
            else "ORACLE MISMATCH"
        if v.tokens or v.configuration:
            words["configuration"] = "same" if not v.configuration else \
                "CONFIGURATION DIFFERENCE"
    if v.tokens:
        words["tokens"] = v.summary or "-"
    if v.gate:
        words["gate"] = f"{v.gate.kind}: " + {True: "PASS", False: "FAIL",
                                             None: "not judged"}[v.gate.passed]
    return words


def render(report: VerifyReport) -> str:
    lines = []
    for v in report.goldens:
        lines.append(f"== {_text(v.name)}  ({_text(v.path)})")
        if v.status == "config_unrecorded":
            lines.append(f"  {UNRECORDED_BANNER}")
            lines += [f"    {n}" for n in v.notes]
        if v.status == "not_verifiable_here":
            lines.append(f"  NOT VERIFIABLE HERE: {_text(v.why)}")
            continue
        if v.status != "config_unrecorded":
            lines.append("  identity: " + ("OK" if not v.identity else "ORACLE DIFFERS" if
                                           v.tokens else "ORACLE MISMATCH"))
        for d in v.identity:
            lines.append(f"    {_text(d.field)}: golden {_fmt(d.golden)}, current "
                         f"{_fmt(d.current)}")
        if (v.tokens or v.configuration) and v.status != "config_unrecorded":
            lines.append("  configuration: " + ("same" if not v.configuration else
                                                 "CONFIGURATION DIFFERENCE"))
        for d in v.configuration:
            lines.append(f"    {_text(d.field)}: golden {_fmt(d.golden)}, now {_fmt(d.current)}")
        for d in v.context:
            lines.append(f"    (context, not failing) {_text(d.field)}: golden "
                         f"{_fmt(d.golden)}, now {_fmt(d.current)}")
        if v.tokens:
            note = "" if v.adjudicable else f"  [{UNRECORDED_BANNER}]" if (
                v.status == "config_unrecorded") else (
                "  [NOT ADJUDICABLE: another oracle]" if v.status == "oracle_mismatch"
                else "  [NOT ADJUDICABLE: configuration differs]")
            lines.append("  tokens:" + note)
            lines.append(f"    {'prompt':<20} {'ids':<4} {'match':<9} {'first div':>9} "
                         f"{'golden tok':>10} {'new tok':>8} {'golden margin':>14} "
                         f"{'new margin':>14}  class")
            for t in v.tokens:
                match = f"{t['n_golden'] if t['tokens_equal'] else t['index']}/{t['n_golden']}"
                lines.append(
                    f"    {t['prompt'][:20]:<20} {'=' if t['prompt_ids_equal'] else 'DIFF':<4} "
                    f"{match:<9} {('-' if t['index'] is None else t['index']):>9} "
                    f"{('-' if t['golden_token'] is None else t['golden_token']):>10} "
                    f"{('-' if t['new_token'] is None else t['new_token']):>8} "
                    f"{(_m(t['golden_margin']) if t['index'] is not None else '-'):>14} "
                    f"{(_m(t['new_margin']) if t['index'] is not None else '-'):>14}  "
                    f"{t['kind']}")
            lines.append(f"  {v.summary}")
        if v.gate:
            lines.append(f"  gate: {v.gate.kind} ({_text(v.gate.reason)}): "
                         + {True: "PASS", False: "FAIL", None: "not judged"}[v.gate.passed])
        lines.append(verdicts.golden(v.status, v.why if v.status != "config_unrecorded"
                                     else ""))
    counts: dict[str, int] = {}
    for v in report.goldens:
        counts[v.status] = counts.get(v.status, 0) + 1
    lines.append(verdicts.verify_closing(counts, report.exit_code))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- for CI


def junit_xml(report: VerifyReport) -> bytes:
    """JUnit XML, as CI systems read it (Jenkins, GitLab, GitHub test reporters): one
    <testsuite> per golden, one <testcase> per prompt (classname = golden, name = prompt).
    A drifted prompt is a <failure> carrying the first divergence, tokens and margins; an
    oracle or configuration difference is an <error> on every prompt of that golden (the
    tokens are not adjudicable); a golden not verifiable here is <skipped>. Valid against
    the JUnit schema CI reporters follow (Surefire's junit-10.xsd, which pytest's own
    junitxml is checked against): the golden's file is on its <testsuite>."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="oracle-build verify")
    totals = {"tests": 0, "failures": 0, "errors": 0}  # the schema has no skipped total here
    for v in report.goldens:
        suite = ET.SubElement(root, "testsuite", name=v.name, file=v.path)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        rows = v.tokens or [{"prompt": p, "tokens_equal": None} for p in _prompt_ids(v.path)]
        for t in rows:
            case = ET.SubElement(suite, "testcase", classname=v.name, name=str(t["prompt"]))
            counts["tests"] += 1
            if v.status == "not_verifiable_here":
                ET.SubElement(case, "skipped", message=v.why[:500])
                counts["skipped"] += 1
            elif v.status in ("oracle_mismatch", "config_difference", "config_unrecorded"):
                diffs = v.identity + v.configuration
                detail = "\n".join(f"{d.field}: golden {_fmt(d.golden)}, current "
                                   f"{_fmt(d.current)}" for d in diffs)
                err = ET.SubElement(case, "error", type=v.status,
                                    message=f"{v.status.upper()}: {v.why}"[:500])
                err.text = detail or "\n".join(v.notes)
                counts["errors"] += 1
            elif t.get("tokens_equal") is False:
                message = (f"first divergence at position {t['index']}: golden token "
                           f"{t['golden_token']}, new token {t['new_token']}; golden margin "
                           f"{_nats(t['golden_margin'])}, new margin "
                           f"{_nats(t['new_margin'])}; {t['kind']}")
                kind = "failure" if v.status == "drift" else "system-out"
                node = ET.SubElement(case, kind, **({"type": t["kind"], "message": message}
                                                    if kind == "failure" else {}))
                node.text = message
                if kind == "failure":
                    counts["failures"] += 1
        for key, n in counts.items():
            suite.set(key, str(n))
            if key in totals:
                totals[key] += n
    for key, n in totals.items():
        root.set(key, str(n))
    ET.indent(root)
    out: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return out + b"\n"


def _prompt_ids(path: str) -> list[str]:
    """A golden's prompt ids, for a report on a golden that was not run (its test cases
    are still its prompts)."""
    from pathlib import Path

    from oracle_build.contracts.golden import load_golden
    from oracle_build.core.errors import OracleBuildError

    try:
        return [p.id for p in load_golden(Path(path)).prompts]
    except OracleBuildError:
        return ["(golden)"]


def summary_md(report: VerifyReport) -> str:
    """Markdown for a CI job summary ($GITHUB_STEP_SUMMARY): per golden the identity line,
    configuration differences, the token table and the gate."""
    lines = [verdicts.summary_heading(report.exit_code), ""]
    for v in report.goldens:
        lines.append(verdicts.summary_golden(_md(v.name), v.status))
        lines.append("")
        if v.why:
            lines.append(f"> {_md(v.why)}")
            lines.append("")
        if v.status == "not_verifiable_here":
            continue
        lines.append("**identity:** " + ("OK" if not v.identity else
                                         ("ORACLE DIFFERS" if v.tokens else "ORACLE MISMATCH")))
        for d in v.identity:
            lines.append(f"- {_code(d.field)}: golden {_code(d.golden)}, current "
                         f"{_code(d.current)}")
        lines.append("")
        lines.append("**configuration:** " + ("same" if not v.configuration
                                              else "CONFIGURATION DIFFERENCE"))
        for d in v.configuration:
            lines.append(f"- {_code(d.field)}: golden {_code(d.golden)}, now {_code(d.current)}")
        lines.append("")
        if v.tokens:
            lines.append("| prompt | ids | match | first divergence | golden tok | new tok | "
                         "golden margin | new margin | class |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for t in v.tokens:
                diverged = t["index"] is not None
                lines.append(
                    f"| {_md(t['prompt'])} | {'=' if t['prompt_ids_equal'] else 'DIFF'} | "
                    f"{t['n_golden'] if t['tokens_equal'] else t['index']}/{t['n_golden']} | "
                    f"{t['index'] if diverged else '-'} | "
                    f"{t['golden_token'] if diverged else '-'} | "
                    f"{t['new_token'] if diverged else '-'} | "
                    f"{_m(t['golden_margin']) if diverged else '-'} | "
                    f"{_m(t['new_margin']) if diverged else '-'} | {t['kind']} |")
            lines.append("")
            lines.append(_md(v.summary))
            lines.append("")
        if v.gate:
            lines.append(f"**gate:** {v.gate.kind} ({_md(v.gate.reason)}): "
                         + {True: "PASS", False: "FAIL", None: "not judged"}[v.gate.passed])
            lines.append("")
    return "\n".join(lines) + "\n"


def ci_reports(report: VerifyReport, *, junit_path: str | None,
               summary_path: str | None) -> None:
    """--junit-xml, --summary-md, and $GITHUB_STEP_SUMMARY (appended) when set."""
    if junit_path:
        atomic_write_bytes(Path(junit_path), junit_xml(report))
        say(f"junit xml: {junit_path}")
    if summary_path:
        atomic_write_bytes(Path(summary_path), summary_md(report).encode())
        say(f"summary: {summary_path}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary_md(report))
        except OSError as exc:
            say(f"could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")
