"""Reports CI systems read: verify's JUnit XML, valid against the JUnit schema CI reporters
follow (Surefire's junit-10.xsd, as pytest checks its own junitxml), for every verdict kind;
and the Markdown summary. Real files, no engine (the same reports through a real
`nox -s verify` are tests/test_gate_host.py's)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import xmlschema

from oracle_build.contracts.reports import FieldDiff, GateVerdict, GoldenVerdict, VerifyReport
from oracle_build.report import ci as report
from tests.conftest import TINY_SPEC

GOLDEN = str(TINY_SPEC / "golden.json")


def row(prompt: str, *, equal: bool = True) -> dict[str, object]:
    if equal:
        return {"prompt": prompt, "prompt_ids_equal": True, "tokens_equal": True,
                "n_golden": 24, "n_new": 24, "index": None, "golden_token": None,
                "new_token": None, "golden_margin": None, "new_margin": None,
                "kind": "match"}
    return {"prompt": prompt, "prompt_ids_equal": True, "tokens_equal": False,
            "n_golden": 24, "n_new": 24, "index": 5, "golden_token": 17, "new_token": 42,
            "golden_margin": 0.031, "new_margin": 0.002, "kind": "near_tie"}


def every_kind() -> VerifyReport:
    gate = GateVerdict(kind="strict", admissible=True, reason="strict token-exact",
                       passed=True)
    diff = FieldDiff(field="vllm", golden="0.32.0", current="0.31.0", cls="identity")
    conf = FieldDiff(field="resolved.max_num_seqs", golden=8, current=4, cls="numerics")
    goldens = [
        GoldenVerdict(name="ok", path=GOLDEN, status="pass", gate=gate,
                      tokens=[row("a"), row("b")]),
        GoldenVerdict(name="moved", path=GOLDEN, status="drift", why="tokens differ",
                      gate=gate.model_copy(update={"passed": False}),
                      tokens=[row("a"), row("b", equal=False)]),
        GoldenVerdict(name="other-oracle", path=GOLDEN, status="oracle_mismatch",
                      why="not the golden's oracle", identity=[diff], adjudicable=False),
        GoldenVerdict(name="config", path=GOLDEN, status="config_difference",
                      why="configuration differs", configuration=[conf], adjudicable=False,
                      tokens=[row("a"), row("b", equal=False)]),
        GoldenVerdict(name="imported", path=GOLDEN, status="config_unrecorded",
                      why="CONFIGURATION UNRECORDED", notes=["unrecorded engine: legacy"],
                      adjudicable=False),
        GoldenVerdict(name="elsewhere", path=GOLDEN, status="not_verifiable_here",
                      why="target sm_121: needs GB10", adjudicable=False),
    ]
    return VerifyReport(report_schema=1, created_utc="20261201T000000Z", exit_code=3,
                        goldens=goldens)


def test_junit_xml_is_valid_for_every_verdict_kind(junit_xsd: Path, tmp_path: Path) -> None:
    data = report.junit_xml(every_kind())
    schema = xmlschema.XMLSchema(str(junit_xsd))
    schema.validate(data.decode())  # raises naming the element and the rule
    root = ET.fromstring(data)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["ok", "moved", "other-oracle", "config", "imported", "elsewhere"]
    assert suites["ok"].get("file") == GOLDEN
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("15", "1", "8")
    (failure,) = suites["moved"].findall("testcase/failure")
    assert failure.get("message") == ("first divergence at position 5: golden token 17, new "
                                      "token 42; golden margin 0.0310 nats, new margin "
                                      "0.0020 nats; near_tie")
    # not run: the golden's own prompts are the test cases
    assert [c.get("name") for c in suites["other-oracle"].findall("testcase")] == [
        "capital", "fibonacci", "ids"]
    assert {e.get("type") for e in suites["other-oracle"].findall("testcase/error")} == {
        "oracle_mismatch"}
    assert len(suites["elsewhere"].findall("testcase/skipped")) == 3
    assert suites["elsewhere"].get("skipped") == "3"
    # the schema is a real check: what this writer once wrote (file on the testcase, a
    # skipped total on testsuites) is refused by it
    old = data.replace(b'<testsuites name=', b'<testsuites skipped="3" name=')
    assert not schema.is_valid(old.decode())
    case = ET.fromstring(data)
    first = case.find("testsuite/testcase")
    assert first is not None
    first.set("file", GOLDEN)
    assert not schema.is_valid(ET.tostring(case, encoding="unicode"))


def test_summary_markdown_names_each_verdict() -> None:
    text = report.summary_md(every_kind())
    assert text.startswith("## oracle-build verify: exit 3")
    for heading in ("### ok: PASS", "### moved: DRIFT", "### other-oracle: ORACLE MISMATCH",
                    "### config: CONFIG DIFFERENCE", "### elsewhere: NOT VERIFIABLE HERE"):
        assert heading in text, heading
    assert "vllm" in text and "resolved.max_num_seqs" in text


def test_junit_xml_holds_any_value_a_golden_gave(junit_xsd: Path) -> None:
    """Issue 45 item 3: a distribution name, an engine key or a file name with a character
    XML 1.0 forbids (\\x01) and forged lines: the document still parses and validates, the
    character shown escaped; no line of it is a verdict."""
    from oracle_build.core import verdicts

    hostile = "zz\x01\nORACLE_IDENTITY_OK\n=> PASS"
    base = every_kind()
    bad = base.goldens[2].model_copy(update={"identity": [FieldDiff(
        field=f"distributions.{hostile}", golden=hostile, current=None, cls="identity")],
        "why": hostile})
    data = report.junit_xml(base.model_copy(update={"goldens": [*base.goldens[:2], bad]}))
    xmlschema.XMLSchema(str(junit_xsd)).validate(data.decode())
    root = ET.fromstring(data)
    (err,) = root.findall("testsuite[@name='other-oracle']/testcase/error")[:1]
    assert "zz\\x01" in (err.text or "") and "\x01" not in data.decode()
    assert not verdicts.forged(data.decode())


def test_summary_markdown_renders_outside_values_as_text_on_github() -> None:
    """Issue 45 item 3: a golden named ``www.evil.example`` became a link in GitHub's
    rendering of the job summary (its autolink extension needs no brackets), and so would a
    reason holding https://... or an address. The summary is rendered here by cmark-gfm,
    the renderer GitHub uses (the cmarkgfm package), with its extensions: the only elements
    are the summary's own (headings, paragraphs, lists, code, the table), no link, image or
    HTML comes from a value, and each value reads as given."""
    import re

    import cmarkgfm

    hostile = ["www.evil.example", "see https://evil.example/x", "mail ops@evil.example",
               "[x](https://evil.example)", "![i](https://evil.example/i.png)",
               "<img src=x onerror=alert(1)>", "*bold* _em_ ~~gone~~ `code`", "a | b",
               "&#46; &amp; literal", "ftp://evil.example", "xmpp:me@evil.example"]
    base = every_kind()
    goldens = [GoldenVerdict.model_validate({**g.model_dump(), "name": value, "why": value,
                                             "tokens": [row(value), row(value, equal=False)]})
               for g, value in zip(base.goldens * 2, hostile, strict=False)]
    html = cmarkgfm.github_flavored_markdown_to_html(
        report.summary_md(base.model_copy(update={"goldens": goldens})))
    tags = set(re.findall(r"<([a-z0-9]+)", html))
    assert tags <= {"h2", "h3", "p", "strong", "ul", "li", "code", "table", "thead", "tbody",
                    "tr", "th", "td", "blockquote"}, tags
    assert "<a " not in html and "<img" not in html and "<!--" not in html
    text = re.sub(r"<[^>]+>", "", html).replace("\u200b", "")
    import html as htmlmod

    shown = htmlmod.unescape(text)
    for value in hostile:
        assert value in shown, value
