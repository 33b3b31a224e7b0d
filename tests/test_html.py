"""The HTML report (`verify --html`, `diff --html`): parsed (every diverging prompt there,
the fork at the right index, the margins verify's JSON report gives), self-contained, a
large golden within bounds, and opened in a real headless Chromium (a screenshot that is
not blank, no console errors)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracle_build import judge
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.page import PAGE_SCHEMA, Page, PageGolden
from oracle_build.report import html
from oracle_build.report import page as pages
from tests.conftest import TINY_SPEC, BuiltOracle, copy_tree_for_golden, golden_says

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Parsed(HTMLParser):
    """The page's prompts (details.prompt), their cells (span.t) and the embedded data."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[str, dict[str, Any]] = {}
        self.current: dict[str, Any] | None = None
        self.in_data = False
        self.data = ""
        self.external: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for name in ("src", "href"):
            value = a.get(name) or ""
            if value and not value.startswith("#"):
                self.external.append(f"{tag} {name}={value}")
        if tag == "link":
            self.external.append("link")
        if tag == "details" and "prompt" in (a.get("class") or ""):
            self.current = {"fork": a.get("data-fork"), "kind": a.get("data-kind"),
                            "lazy": "data-lazy" in a, "cells": []}
            self.prompts[str(a.get("data-prompt"))] = self.current
        if tag == "span" and self.current is not None and (a.get("class") or "").startswith("t"):
            self.current["cells"].append({"class": a.get("class"), "i": a.get("data-i"),
                                          "m": a.get("data-m"), "title": a.get("title")})
        if tag == "script":
            self.scripts += 1
            self.in_data = a.get("id") == "data"

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.current = None
        if tag == "script":
            self.in_data = False

    def handle_data(self, data: str) -> None:
        if self.in_data:
            self.data += data


def parse(path: Path) -> Parsed:
    parsed = Parsed()
    parsed.feed(path.read_text())
    return parsed


def parse_drawn(path: Path, tmp: Path) -> Parsed:
    """The page as a real browser holds it once its own script ran: the token cells are
    drawn by the page's script (its one renderer of a cell), not written in the file."""
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'drawn-profile'}", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout.split(">", 2)[1], dom.stdout[:500]
    parsed = Parsed()
    parsed.feed(dom.stdout)
    return parsed


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB(A) PNG (what Chromium writes) into rows of pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = bpp = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - bpp] if x >= bpp else 0
            up = prev[x]
            ul = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + left) & 255
            elif f == 2:
                line[x] = (line[x] + up) & 255
            elif f == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif f == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else ul
                line[x] = (line[x] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def screenshot(page: Path, png: Path, tmp: Path) -> str:
    """Open ``page`` in headless Chromium, write a screenshot; return its console output."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp / 'chromium-profile'}", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--window-size=1400,1500",
         f"--screenshot={png}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    return proc.stderr


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line and (
        "Uncaught" in line or ":ERROR:" in line or "error" in line.lower())]


# ----------------------------------------------------------------------------- pages


def drifted_page(tmp_path: Path, text0: str | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """The committed golden as the reference and a candidate that takes another token at a
    near-tie of prompt 0 and at a real divergence of prompt 1, judged by judge itself; the
    page drawn from them (pieces absent: ids shown)."""
    golden = load_golden(TINY_SPEC)
    results, prompts = [], []
    for i, p in enumerate(golden.prompts):
        rows = golden.prompt_topk(i)
        assert rows is not None
        cand = list(p.token_ids)
        if i == 0:
            near = next(j for j, r in enumerate(rows) if 0 < r[0][1] - r[1][1] <= 0.5)
            cand = [*cand[:near], int(rows[near][1][0]), *cand[near + 1:]]
        elif i == 1:
            cand = [*cand[:3], next(t for t in range(300) if t not in {e[0] for e in rows[3]})]
        r = judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids, rows,
                                 p.prompt_token_ids, cand, None, golden.gate.band_nats)
        results.append(r.as_dict())
        text = text0 if (i == 0 and text0 is not None) else p.text
        prompts.append(pages.prompt(p.id, text, p.prompt_token_ids, p.token_ids, rows, cand,
                                    None, r.row()))
    page = Page(page_schema=PAGE_SCHEMA, kind="verify", title="oracle-build verify",
                created_utc="2026-12-01T00:00:00Z", oracle={"pin": "cpu-test"},
                reference_label="golden", candidate_label="this run", exit_code=1,
                goldens=[PageGolden(name=golden.name, path=str(TINY_SPEC), status="drift",
                                    words={"identity": "OK", "configuration": "same",
                                           "tokens": "drift", "gate": "strict: FAIL"},
                                    band_nats=golden.gate.band_nats, prompts=prompts)])
    return html.write(page, tmp_path / "report.html"), results


def test_the_page_marks_each_divergence_where_judge_found_it(tmp_path: Path) -> None:
    path, results = drifted_page(tmp_path)
    assert not parse(path).external, parse(path).external  # nothing fetched from anywhere
    parsed = parse_drawn(path, tmp_path)
    golden = load_golden(TINY_SPEC)
    for r, p in zip(results, golden.prompts, strict=True):
        shown = parsed.prompts[p.id]
        if r["index"] is None:
            assert shown["lazy"] and shown["fork"] == "" and not shown["cells"]
            continue
        assert shown["fork"] == str(r["index"]) and shown["kind"] == r["kind"]
        fork = [c for c in shown["cells"] if "fork" in (c["class"] or "")]
        assert [c["i"] for c in fork] == [str(r["index"])]
        # every cell's margin is the golden's own top-2 gap there
        rows = golden.prompt_topk(golden.prompts.index(p))
        assert rows is not None
        for c in shown["cells"]:
            i = int(c["i"])
            assert float(c["m"]) == pytest.approx(rows[i][0][1] - rows[i][1][1], abs=1e-6)
        assert "FIRST DIVERGENCE" in (fork[0]["title"] or "")
    data = Page.model_validate_json(parsed.data)
    assert [p.reference_margin for p in data.goldens[0].prompts] == [r["golden_margin"]
                                                                     for r in results]


def test_a_large_golden_stays_small(tmp_path: Path) -> None:
    """2,000 prompts x 256 tokens x top-20, ten of them diverging: under 20 MB."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30000, size=(2000, 256, 20))
    lps = -np.sort(rng.exponential(1.0, size=(2000, 256, 20)), axis=2)
    prompts = []
    for i in range(2000):
        rows = [list(zip(ids[i, j].tolist(), lps[i, j].tolist(), strict=True))
                for j in range(256)]
        ref = ids[i, :, 0].tolist()
        cand = list(ref)
        if i % 200 == 7:
            cand[100] = int(ids[i, 100, 1])
        r = judge.compare_prompt(f"p{i}", [1, 2], ref, rows, [1, 2], cand, None, 0.5)
        prompts.append(pages.prompt(f"p{i}", None, [1, 2], ref, rows, cand, None, r.row()))
    page = Page(page_schema=PAGE_SCHEMA, kind="verify", title="large", created_utc="t",
                oracle={}, reference_label="golden", candidate_label="this run",
                goldens=[PageGolden(name="large", path="large", status="drift",
                                    words={}, band_nats=0.5, prompts=prompts)],
                pieces={str(t): f"w{t}" for t in range(30000)})
    path = html.write(page, tmp_path / "large.html")
    size = path.stat().st_size
    assert size < 20 * 2**20, size
    parsed = parse(path)
    diverging = [k for k, v in parsed.prompts.items() if not v["lazy"]]
    assert diverging == [f"p{i}" for i in range(2000) if i % 200 == 7]
    assert all(parsed.prompts[k]["fork"] == "100" for k in diverging)


def test_the_page_opens_in_chromium(tmp_path: Path) -> None:
    """A real browser: the screenshot is not blank, the page logs no console error (and the
    check sees one when a page has it)."""
    path, _ = drifted_page(tmp_path)
    png = tmp_path / "report.png"
    log = screenshot(path, png, tmp_path)
    assert not console_errors(log), console_errors(log)
    _width, bpp, rows = png_pixels(png)
    background = rows[-1][:bpp]  # the page's own background at the bottom
    inked = sum(1 for row in rows for x in range(0, len(row), bpp * 7)
                if row[x:x + bpp] != background)
    assert inked > 2000, inked  # text, cells and charts: far from blank
    reds = sum(1 for row in rows for x in range(0, len(row), bpp * 3)
               if row[x] > 200 and row[x + 1] < 120 and row[x + 2] < 120)
    assert reds > 50, reds  # the near-tie cells and the fork markers are drawn
    broken = tmp_path / "broken.html"
    broken.write_text("<!doctype html><html><body><p>x</p><script>undefinedThing();"
                      "</script></body></html>")
    assert console_errors(screenshot(broken, tmp_path / "broken.png", tmp_path))


def test_a_prompt_cannot_stop_the_pages_own_script(tmp_path: Path) -> None:
    """A prompt text holding `<!--<script>` (it put the HTML parser into its double-escaped
    state: the page's own script became data, and nothing was drawn on opening) and a
    `</script>`: embedded as \\u escapes; the page carries a CSP allowing only its own inline
    script and style, and in a real browser it draws as before, with no console error (a
    CSP that blocked its own script or style would log one)."""
    hostile = "x <!--<script> y </script><script>alert(1)</script> & z"
    path, _ = drifted_page(tmp_path, text0=hostile)
    text = path.read_text()
    block = text.split('<script type="application/json" id="data">', 1)[1].split("</script>")[0]
    assert "<" not in block and ">" not in block and "&" not in block
    assert json.loads(block)["goldens"][0]["prompts"][0]["text"] == hostile
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', text)
    assert csp and csp.group(1).startswith("default-src 'none'; script-src 'sha256-")
    assert "connect-src 'none'" in csp.group(1) and "unsafe-eval" not in csp.group(1)
    assert text.index("Content-Security-Policy") < text.index("<style>")
    log = screenshot(path, tmp_path / "hostile.png", tmp_path)
    assert not console_errors(log), console_errors(log)
    # the page's own script ran to its end (it marks the page), the injected one did not
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", f"--user-data-dir={tmp_path / 'dom-profile'}",
         "--dump-dom", path.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout.split(">", 2)[1], dom.stdout[:500]


# ----------------------------------------------------------------------------- real engine


@dataclass
class Verified:
    report: dict[str, Any]
    page: Path


@pytest.fixture(scope="module")
def verified(cpu_oracle: BuiltOracle, host_golden: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Verified]:
    """verify --json --html of a golden edited as another oracle's would be: a near-tie on
    prompt 0, a real divergence on prompt 1; one engine start."""
    tmp = tmp_path_factory.mktemp("html")
    folder = copy_tree_for_golden(tmp, source=host_golden)
    doc = json.loads((folder / "golden.json").read_text())
    p0 = doc["prompts"][0]
    near = next(i for i, pos in enumerate(p0["topk"]) if 0 < pos[0][1] - pos[1][1] <= 0.5)
    golden_says(doc, 0, near, p0["topk"][near][1][0], keep_original=True)
    p1 = doc["prompts"][1]
    outside = next(t for t in range(300) if t not in {e[0] for e in p1["topk"][3]})
    golden_says(doc, 1, 3, outside, keep_original=False)
    (folder / "golden.json").write_text(json.dumps(doc))
    page = tmp / "verify.html"
    proc = subprocess.run(
        [sys.executable, "-m", "oracle_build", "verify", str(folder), "--json", "--html",
         str(page), "--home", str(cpu_oracle.home)], capture_output=True, text=True,
        timeout=1800)
    assert proc.returncode == 1, proc.stderr[-3000:]
    yield Verified(json.loads(proc.stdout), page)


@pytest.mark.slow
def test_verify_html_agrees_with_its_json_report(verified: Verified, tmp_path: Path) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    parsed = parse_drawn(verified.page, tmp_path)
    (golden,) = verified.report["goldens"]
    tokens = {t["prompt"]: t for t in golden["tokens"]}
    diverging = {k for k, t in tokens.items() if t["index"] is not None}
    assert diverging == {k for k, v in parsed.prompts.items() if not v["lazy"]} == {
        "capital", "fibonacci"}
    data = Page.model_validate_json(parsed.data)
    for p in data.goldens[0].prompts:
        t = tokens[p.id]
        assert p.fork == t["index"] and p.kind == t["kind"]
        assert p.reference_margin == t["golden_margin"] and p.candidate_margin == t["new_margin"]
        if p.fork is not None:
            shown = parsed.prompts[p.id]
            assert [c["i"] for c in shown["cells"] if "fork" in c["class"]] == [str(p.fork)]
    # pieces from the engine host's tokenizer: text, not ids
    assert data.pieces and not any(re.fullmatch(r"#\d+", v) for v in data.pieces.values())
    assert data.oracle["CPU variant"] and data.oracle["vLLM"] == "0.32.0"
    # the words at the top are the terminal's
    assert data.goldens[0].words["identity"] == "OK"
    assert data.goldens[0].words["gate"] == "strict: FAIL"
    png = tmp_path / "verify.png"
    log = screenshot(verified.page, png, tmp_path)
    assert not console_errors(log)
    out = os.environ.get("ORACLE_BUILD_SCREENSHOT_OUT")  # the README's picture
    if out:
        shutil.copy2(png, out)


def test_diff_writes_the_same_page_with_a_and_b(tmp_path: Path) -> None:
    """diff's page: A is the reference, B the candidate; the settings the two engines
    resolved differently come before the tokens; the verdict words are diff's."""
    from oracle_build.contracts.reports import (
        DIFF_REPORT_SCHEMA,
        DiffReport,
        FieldDiff,
        GoldenDiff,
        OracleSide,
        TokenRow,
    )
    from oracle_build.report.page import diff_page

    golden = load_golden(TINY_SPEC)
    data = pages.PageData()
    results = []
    for i, p in enumerate(golden.prompts):
        rows = golden.prompt_topk(i)
        cand = list(p.token_ids)
        if i == 0:
            near = next(j for j, r in enumerate(rows or []) if 0 < r[0][1] - r[1][1] <= 0.5)
            cand[near] = int((rows or [])[near][1][0])
        r = judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids, rows,
                                 p.prompt_token_ids, cand, None, golden.gate.band_nats)
        results.append(r.as_dict())
    data.prompts[str(TINY_SPEC / "golden.json")] = [
        pages.prompt(p.id, p.text, p.prompt_token_ids, p.token_ids, golden.prompt_topk(i),
                     [r["new_token"] if r["index"] == j else t for j, t in
                      enumerate(p.token_ids)], None, TokenRow(**r))
        for i, (p, r) in enumerate(zip(golden.prompts, results, strict=True))]
    side = {"pin_id": "cpu", "target": "cpu", "torch": "2.13.0+cpu", "transformers": "5.19.0",
            "venv": "/v"}
    report = DiffReport(
        diff_schema=DIFF_REPORT_SCHEMA, created_utc="2026-12-01T00:00:00Z",
        a=OracleSide(pin_key="cpu-aaaa", pin_hash="a" * 64, vllm="0.32.0", **side),
        b=OracleSide(pin_key="cpu-bbbb", pin_hash="b" * 64, vllm="0.31.0", **side),
        packages=[], goldens=[GoldenDiff(
            name=golden.name, path=str(TINY_SPEC / "golden.json"),
            verdict="moved at near-ties only", tokens=results, logprobs_identical=False,
            configuration=[FieldDiff(field="engine.resolved.block_size", golden=16,
                                     current=32, cls="numerics")],
            summary="near-tie 1/3")])
    path = tmp_path / "diff.html"
    html.write(diff_page(report, data), path)
    parsed = parse(path)
    page = Page.model_validate_json(parsed.data)
    assert page.kind == "diff" and page.reference_label == "A cpu-aaaa"
    assert page.candidate_label == "B cpu-bbbb"
    assert page.goldens[0].configuration[0].field == "engine.resolved.block_size"
    text = path.read_text()
    assert text.index("engine.resolved.block_size") < text.index('class="prompt"')
    forked = [k for k, v in parsed.prompts.items() if not v["lazy"]]
    assert forked == [golden.prompts[0].id]
    assert parsed.prompts[forked[0]]["fork"] == str(results[0]["index"])
