"""Reports for CI: JUnit XML (one test case per golden prompt, as test reporters read it) and
the Markdown step summary ($GITHUB_STEP_SUMMARY), each in the same words as the terminal
(words.py)."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from oracle_build.contracts.reports import GoldenVerdict, TokenRow, VerifyReport
from oracle_build.core import verdicts
from oracle_build.core.errors import OutputFailed, as_data, defused_lines
from oracle_build.core.files import atomic_write_bytes
from oracle_build.core.log import say
from oracle_build.report.values import code, fmt, margin, md, nats
from oracle_build.report.words import gate_result, numbers_words, verdict_words


def junit_xml(report: VerifyReport) -> bytes:
    """JUnit XML, as CI systems read it (Jenkins, GitLab, GitHub test reporters): one
    <testsuite> per golden, one <testcase> per prompt (classname = golden, name = prompt).
    A drifted prompt is a <failure> carrying the first divergence, tokens and margins; an
    oracle or configuration difference is an <error> on every prompt of that golden (the
    tokens are not adjudicable), its text opening with the verdict's words; a golden not
    verifiable here is <skipped>. Valid against the JUnit schema CI reporters follow
    (Surefire's junit-10.xsd, which pytest's own junitxml is checked against): the golden's
    file is on its <testsuite>."""
    root = ET.Element("testsuites", name="oracle-build verify")
    totals = {"tests": 0, "failures": 0, "errors": 0}  # the schema has no skipped total here
    for v in report.goldens:
        suite = ET.SubElement(root, "testsuite", name=v.name, file=v.path)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        rows: list[tuple[str, TokenRow | None]] = [(t.prompt, t) for t in v.tokens] or [
            (p, None) for p in _prompt_ids(v.path)]
        for prompt, row in rows:
            _case(suite, v, prompt, row, counts)
        for key, n in counts.items():
            suite.set(key, str(n))
            if key in totals:
                totals[key] += n
    for key, n in totals.items():
        root.set(key, str(n))
    for node in root.iter():  # every text and attribute, whatever field it came from
        node.text = _xml_text(node.text)
        for name, value in node.attrib.items():
            node.set(name, _xml_text(value) or "")
    ET.indent(root)
    out: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return out + b"\n"


# what XML 1.0 cannot hold at all (ElementTree writes it as is, and no parser reads it back)
XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(value: str | None) -> str | None:
    """A text or attribute value the document can hold: characters XML 1.0 forbids shown
    escaped (``\\x01``), as every report shows what came from a file, and no line of it
    read as a verdict by a script that greps the file (put behind a bar, as errors are)."""
    if value is None:
        return None
    return defused_lines(
        XML_ILLEGAL.sub(lambda m: m.group().encode("unicode_escape").decode(), value))


def _case(suite: ET.Element, v: GoldenVerdict, prompt: str, row: TokenRow | None,
          counts: dict[str, int]) -> None:
    """One prompt's test case (``row``: its token result; None for a golden not run)."""
    case = ET.SubElement(suite, "testcase", classname=v.name, name=prompt)
    counts["tests"] += 1
    if v.status == "not_verifiable_here":
        ET.SubElement(case, "skipped", message=v.why[:500])
        counts["skipped"] += 1
    elif v.status in ("oracle_mismatch", "config_difference", "config_unrecorded"):
        words = verdict_words(v).columns()
        detail = "\n".join(f"{d.field}: golden {fmt(d.golden)}, current {fmt(d.current)}"
                           for d in v.identity + v.configuration)
        err = ET.SubElement(case, "error", type=v.status,
                            message=f"{v.status.upper()}: {v.why}"[:500])
        err.text = "; ".join(f"{k}: {w}" for k, w in words.items()) + "\n" + (
            detail or "\n".join(v.notes))
        counts["errors"] += 1
    elif row is not None and not row.tokens_equal:
        message = (f"first divergence at position {row.index}: golden token "
                   f"{row.golden_token}, new token {row.new_token}; golden margin "
                   f"{nats(row.golden_margin)}, new margin {nats(row.new_margin)}; {row.kind}")
        if v.status == "drift":
            node = ET.SubElement(case, "failure", type=row.kind, message=message)
            counts["failures"] += 1
        else:
            node = ET.SubElement(case, "system-out")
        node.text = message
    elif (moved := numbers_words(v)) is not None:  # tokens match, the numbers moved
        if v.status == "drift":  # a bit-exact gate
            ET.SubElement(case, "failure", type="numbers_moved", message=moved[:500])
            counts["failures"] += 1
        else:
            ET.SubElement(case, "system-out").text = moved


def _prompt_ids(path: str) -> list[str]:
    """A golden's prompt ids, for a report on a golden that was not run (its test cases
    are still its prompts)."""
    from oracle_build.contracts.golden import load_golden
    from oracle_build.core.errors import OracleBuildError

    try:
        return [p.id for p in load_golden(Path(path)).prompts]
    except OracleBuildError:
        return ["(golden)"]


def summary_md(report: VerifyReport) -> str:
    """Markdown for a CI job summary ($GITHUB_STEP_SUMMARY): per golden the identity line,
    configuration differences, the token table and the gate, in the terminal's words."""
    lines = [verdicts.summary_heading(report.exit_code), ""]
    for v in report.goldens:
        w = verdict_words(v)
        lines.append(verdicts.summary_golden(md(v.name), v.status))
        lines.append("")
        if v.why:
            lines.append(f"> {md(v.why)}")
            lines.append("")
        if v.status == "not_verifiable_here":
            continue
        lines.append(f"**identity:** {w.identity or '-'}")
        for d in v.identity:
            lines.append(f"- {code(d.field)}: golden {code(d.golden)}, current "
                         f"{code(d.current)}")
        lines.append("")
        lines.append(f"**configuration:** {w.configuration or '-'}")
        for d in v.configuration:
            lines.append(f"- {code(d.field)}: golden {code(d.golden)}, now {code(d.current)}")
        lines.append("")
        if v.tokens:
            lines.append("| prompt | ids | match | first divergence | golden tok | new tok | "
                         "golden margin | new margin | class |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for t in v.tokens:
                diverged = t.index is not None
                lines.append(
                    f"| {md(t.prompt)} | {'=' if t.prompt_ids_equal else 'DIFF'} | "
                    f"{t.n_golden if t.tokens_equal else t.index}/{t.n_golden} | "
                    f"{t.index if diverged else '-'} | "
                    f"{t.golden_token if diverged else '-'} | "
                    f"{t.new_token if diverged else '-'} | "
                    f"{margin(t.golden_margin) if diverged else '-'} | "
                    f"{margin(t.new_margin) if diverged else '-'} | {t.kind} |")
            lines.append("")
            lines.append(md(v.summary))
            lines.append("")
            moved = numbers_words(v)
            if moved:
                lines.append(f"**numbers:** {md(moved)}")
                lines.append("")
        if v.gate:
            lines.append(f"**gate:** {v.gate.kind} ({md(v.gate.reason)}): "
                         + gate_result(v.gate.passed))
            lines.append("")
    return defused_lines("\n".join(lines)) + "\n"  # the verdict headings unmarked


def ci_reports(report: VerifyReport, *, junit_path: str | None,
               summary_path: str | None) -> None:
    """--junit-xml, --summary-md, and $GITHUB_STEP_SUMMARY (appended) when set."""
    for path, what in ((junit_path, "junit xml"), (summary_path, "summary")):
        if not path:
            continue
        data = junit_xml(report) if what == "junit xml" else summary_md(report).encode()
        try:
            atomic_write_bytes(Path(path), data)
        except OSError as exc:  # checked before the run; a disk that filled since
            raise OutputFailed(f"cannot write the {what} {as_data(path)}: "
                               f"{exc.strerror or exc}") from None
        say(f"{what}: {path}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary_md(report))
        except OSError as exc:
            say(f"could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")
