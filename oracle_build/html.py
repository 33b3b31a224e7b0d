"""One self-contained HTML page for a verify or a diff: no network, no external script, font
or image; it opens from a CI artifact or a file manager.

At the top the verdict per golden in the terminal's words (identity, configuration, tokens,
gate) and what ran; then per golden the settings that differ (before any token), then per
prompt the generated tokens as a strip of cells shaded by the reference's top-2 margin
(near-ties stand out, exact ties are outlined), the first divergence marked, both
continuations side by side after it, and a small chart of the margin along the sequence
with the band drawn as a line. Hovering a cell (its ``title``) shows the reference's top-k
there with logprobs in nats. Prompts that diverge are drawn open in the page itself; the
others are drawn from the embedded data when opened (a 2,000-prompt golden stays a few
MB and opens at once).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from pathlib import Path

from oracle_build.contracts.page import Page, PageGolden, PagePrompt
from oracle_build.contracts.reports import FieldDiff
from oracle_build.core.errors import OutputFailed
from oracle_build.core.files import atomic_write_bytes

CSS = """
:root { --ink:#1d232b; --muted:#5b6673; --line:#d5dbe2; --ok:#1d7a46; --bad:#b3261e;
        --warn:#9a5b00; --bg:#ffffff; --panel:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: var(--bg); }
header { padding: 18px 28px; border-bottom: 1px solid var(--line); background: var(--panel); }
header h1 { font-size: 20px; margin: 0 0 6px; }
header .meta { color: var(--muted); margin: 0; }
main { padding: 8px 28px 40px; max-width: 1400px; }
table { border-collapse: collapse; margin: 10px 0; }
th, td { text-align: left; padding: 5px 12px 5px 0; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600;
         font-size: 12px; color: #fff; background: var(--muted); }
.badge.pass, .badge.same { background: var(--ok); }
.badge.drift, .badge.moved, .badge.oracle_mismatch { background: var(--bad); }
.badge.config_difference, .badge.config_unrecorded, .badge.near { background: var(--warn); }
.word.bad { color: var(--bad); font-weight: 600; } .word.ok { color: var(--ok); }
.word.warn { color: var(--warn); font-weight: 600; }
section.golden { margin-top: 26px; border-top: 2px solid var(--line); padding-top: 8px; }
section.golden h2 { font-size: 17px; margin: 8px 0 2px; }
.path { color: var(--muted); font-family: ui-monospace, Menlo, Consolas, monospace; margin: 0; }
details.prompt { margin: 10px 0; border: 1px solid var(--line); border-radius: 6px;
                 padding: 6px 10px; background: #fff; }
details.prompt > summary { cursor: pointer; font-weight: 600; }
details.prompt[data-kind="real"] { border-left: 4px solid var(--bad); }
details.prompt[data-kind="near_tie"], details.prompt[data-kind="exact_tie"] {
    border-left: 4px solid var(--warn); }
.prompt-text { color: var(--muted); white-space: pre-wrap; margin: 6px 0; }
.strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 8px 0;
         font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
.t { padding: 1px 3px; border-radius: 3px; border: 1px solid transparent; white-space: pre;
     cursor: default; min-width: 10px; }
.t.tie { outline: 2px dashed #6a3ea1; outline-offset: -2px; }
.t.fork { border: 2px solid var(--bad); font-weight: 700; }
.t.after { opacity: 0.55; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin: 8px 0; }
.side { background: var(--panel); border-radius: 6px; padding: 8px 10px; }
.side h4 { margin: 0 0 4px; font-size: 13px; }
.side .seq { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap;
             word-break: break-word; }
.side .seq .first { background: #ffd9d6; font-weight: 700; }
.legend { color: var(--muted); font-size: 12px; }
.legend .t { display: inline-block; }
svg.chart { display: block; margin: 4px 0 8px; background: var(--panel); border-radius: 4px; }
"""

SCRIPT = r"""
(function () {
  var data = JSON.parse(document.getElementById('data').textContent);
  var pieces = data.pieces || {};
  var shown = {' ': '\u00b7', '\n': '\u23ce', '\t': '\u21e5', '\r': '\u21a4'};
  function piece(id) {
    var p = pieces[String(id)];
    if (p === undefined || p === '') return '#' + id;
    return p.replace(/[ \n\t\r]/g, function (c) { return shown[c]; });
  }
  function shade(m, band) {
    if (m === null || m === undefined) return '#eef1f4';
    var x = Math.min(m / Math.max(3 * band, 1e-9), 1);
    return 'hsl(' + (8 + 40 * x) + ',90%,' + (58 + 40 * x) + '%)';
  }
  function cell(p, i, band) {
    var s = document.createElement('span');
    var m = p.margins[i];
    s.className = 't' + (p.ties.indexOf(i) >= 0 ? ' tie' : '');
    s.style.background = shade(m, band);
    s.textContent = piece(p.reference[i]);
    s.title = 'position ' + i + ': ' + JSON.stringify(piece(p.reference[i])) + ' (id ' +
      p.reference[i] + ')\ntop-2 margin ' + (m === null ? 'unknown' : m.toFixed(4) + ' nats');
    return s;
  }
  function render(el) {
    if (el.dataset.drawn) return;
    var g = data.goldens[+el.dataset.golden], p = g.prompts[+el.dataset.index];
    var strip = document.createElement('div');
    strip.className = 'strip';
    for (var i = 0; i < p.reference.length; i++) strip.appendChild(cell(p, i, g.band_nats || 0.5));
    el.appendChild(strip);
    el.dataset.drawn = '1';
  }
  document.querySelectorAll('details.prompt[data-lazy]').forEach(function (el) {
    el.addEventListener('toggle', function () { if (el.open) render(el); });
  });
  document.documentElement.dataset.ready = '1';  // the page's own script ran to its end
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _shade(margin: float | None, band: float) -> str:
    if margin is None:
        return "#eef1f4"
    x = min(margin / max(3 * band, 1e-9), 1.0)
    return f"hsl({8 + 40 * x:.0f},90%,{58 + 40 * x:.0f}%)"


WORD_CLASS = {"OK": "ok", "same": "ok", "PASS": "ok", "match": "ok"}


def _word(text: str) -> str:
    cls = WORD_CLASS.get(text.split(" ")[0], "bad" if text[:1].isupper() else "warn")
    if text.startswith(("not judged", "not run", "-")):
        cls = "warn"
    return f'<span class="word {cls}">{_e(text)}</span>'


def _diffs(title: str, diffs: list[FieldDiff], ref: str, cand: str) -> str:
    if not diffs:
        return ""
    rows = "".join(f"<tr><td><code>{_e(d.field)}</code></td><td>{_e(_fmt(d.golden))}</td>"
                   f"<td>{_e(_fmt(d.current))}</td></tr>" for d in diffs)
    return (f"<h3>{_e(title)}</h3><table class=\"diffs\"><tr><th>setting</th><th>{_e(ref)}"
            f"</th><th>{_e(cand)}</th></tr>{rows}</table>")


def _fmt(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


VISIBLE = {" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5", "\r": "\u21a4"}


def _piece(page: Page, token: int, *, visible: bool = False) -> str:
    """A token's text (its id when the tokenizer was not at hand); ``visible``: spaces and
    line breaks drawn (a cell of a strip), control characters escaped."""
    text = page.pieces.get(str(token))
    if text is None:
        return f"#{token}"
    if visible:
        text = "".join(VISIBLE.get(ch, ch) for ch in text)
    return "".join(ch if ch.isprintable() or ch in "\n\t" else f"\\x{ord(ch):02x}"
                   for ch in text) or f"#{token}"


def _title(page: Page, p: PagePrompt, i: int) -> str:
    token = p.reference[i]
    lines = [f"position {i}: {json.dumps(_piece(page, token))} (id {token})"]
    if i < len(p.topk) and p.topk[i]:
        lines.append("reference top-k (logprob, nats):")
        lines += [f"  {json.dumps(_piece(page, t))} {t}: {lp:.4f}" for t, lp in p.topk[i]]
    margin = p.margins[i] if i < len(p.margins) else None
    lines.append("top-2 margin: " + ("unknown" if margin is None else f"{margin:.4f} nats")
                 + (" (exact tie)" if i in p.ties else ""))
    if p.fork is not None and i == p.fork:
        cand = p.candidate[i] if i < len(p.candidate) else None
        lines.append(f"FIRST DIVERGENCE: {page.candidate_label} took "
                     + (f"{json.dumps(_piece(page, cand))} (id {cand})" if cand is not None
                        else "nothing (it stopped)"))
    return "\n".join(lines)


def _chart(p: PagePrompt, band: float) -> str:
    """The margin along the sequence, the band as a dashed line, the fork as a red line."""
    n = max(len(p.margins), 1)
    width, height, pad = 720, 90, 4
    known = [m for m in p.margins if m is not None]
    top = max([band * 2, *known]) if known else band * 2
    top = max(top, 1e-6)

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(n - 1, 1))

    def y(m: float) -> float:
        return height - pad - (height - 2 * pad) * min(m / top, 1.0)

    points = " ".join(f"{x(i):.1f},{y(m):.1f}" for i, m in enumerate(p.margins) if m is not None)
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} '
             f'{height}" role="img" aria-label="top-2 margin along the sequence">',
             f'<line x1="{pad}" x2="{width - pad}" y1="{y(band):.1f}" y2="{y(band):.1f}" '
             f'stroke="#9a5b00" stroke-dasharray="4 3"><title>band {band} nats</title></line>',
             f'<polyline fill="none" stroke="#2f5d8a" stroke-width="1.5" points="{points}"/>']
    for i in p.ties:
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(0):.1f}" r="3" fill="#6a3ea1"/>')
    if p.fork is not None:
        parts.append(f'<line class="fork" x1="{x(p.fork):.1f}" x2="{x(p.fork):.1f}" y1="{pad}" '
                     f'y2="{height - pad}" stroke="#b3261e" stroke-width="2"><title>first '
                     f'divergence at {p.fork}</title></line>')
    parts.append(f'<text x="{width - pad}" y="12" text-anchor="end" font-size="10" '
                 f'fill="#5b6673">margin (nats), top {top:.2f}; band {band}</text></svg>')
    return "".join(parts)


def _prompt(page: Page, g: PageGolden, gi: int, pi: int, p: PagePrompt) -> str:
    band = g.band_nats or 0.5
    text = p.text if p.text is not None else f"prompt ids {p.prompt_ids[:40]}" + (
        " ..." if len(p.prompt_ids) > 40 else "")
    if p.fork is None:
        head = f"{_e(p.id)}: token-identical, {len(p.reference)} tokens"
    else:
        at = (f"golden margin {p.reference_margin:.4f} nats" if p.reference_margin is not None
              else "outside the reference's top-k")
        head = (f"{_e(p.id)}: diverges at {p.fork} of {len(p.reference)} "
                f"({_e(p.kind)}, {_e(at)})")
    attrs = (f'class="prompt" data-golden="{gi}" data-index="{pi}" data-prompt="{_e(p.id)}" '
             f'data-kind="{_e(p.kind)}" data-fork="{"" if p.fork is None else p.fork}"')
    if p.fork is None:  # drawn from the embedded data when opened
        return (f"<details {attrs} data-lazy><summary>{head}</summary>"
                f"<p class=\"prompt-text\">{_e(text)}</p></details>")
    cells = []
    for i, token in enumerate(p.reference):
        cls = "t" + (" tie" if i in p.ties else "") + (" fork" if i == p.fork else "") + (
            " after" if i > p.fork else "")
        margin = p.margins[i] if i < len(p.margins) else None
        cells.append(f'<span class="{cls}" data-i="{i}" data-m="'
                     f'{"" if margin is None else repr(margin)}" style="background:'
                     f'{_shade(margin, band)}" title="{_e(_title(page, p, i))}">'
                     f"{_e(_piece(page, token, visible=True))}</span>")

    def seq(tokens: list[int]) -> str:
        after = tokens[p.fork:] if p.fork is not None else []
        out = [f'<span class="first">{_e(_piece(page, after[0]))}</span>'] if after else []
        out += [_e(_piece(page, t)) for t in after[1:]]
        before = "".join(_e(_piece(page, t)) for t in tokens[max(0, p.fork - 12):p.fork]) \
            if p.fork else ""
        return (f'<div class="seq"><span class="ctx">... {before}</span>{"".join(out)}'
                + ("" if after else " <em>(ends here)</em>") + "</div>")

    sides = (f'<div class="sides"><div class="side reference"><h4>{_e(page.reference_label)}'
             f"</h4>{seq(p.reference)}</div><div class=\"side candidate\"><h4>"
             f"{_e(page.candidate_label)}</h4>{seq(p.candidate)}</div></div>")
    return (f"<details {attrs} open><summary>{head}</summary>"
            f"<p class=\"prompt-text\">{_e(text)}</p>{_chart(p, band)}"
            f"<div class=\"strip\">{''.join(cells)}</div>{sides}</details>")


def render(page: Page) -> str:
    oracle = " · ".join(f"{k} {_e(v)}" for k, v in page.oracle.items())
    rows = []
    for gi, g in enumerate(page.goldens):
        w = g.words
        rows.append(f'<tr><td><a href="#g{gi}">{_e(g.name)}</a></td><td><span class="badge '
                    f'{_e(g.status)}">{_e(g.status.replace("_", " "))}</span></td>'
                    + "".join(f"<td>{_word(w.get(k, '-'))}</td>"
                              for k in ("identity", "configuration", "tokens", "gate"))
                    + "</tr>")
    body = [f"<header><h1>{_e(page.title)}</h1><p class=\"meta\">{oracle}</p>"
            f"<p class=\"meta\">ran {_e(page.created_utc)}"
            + (f" · exit code {page.exit_code}" if page.exit_code is not None else "")
            + "</p></header><main>",
            "<table class=\"verdicts\"><tr><th>golden</th><th>verdict</th><th>identity</th>"
            "<th>configuration</th><th>tokens</th><th>gate</th></tr>" + "".join(rows)
            + "</table>",
            '<p class="legend">cells: the reference\'s tokens, shaded by its top-2 margin '
            '(<span class="t" style="background:hsl(8,90%,58%)">near-tie</span> to '
            '<span class="t" style="background:hsl(48,90%,98%)">confident</span>), '
            '<span class="t tie">exact tie</span> outlined, the '
            '<span class="t fork">first divergence</span> framed; hover a cell for its '
            "top-k (logprobs in nats).</p>"]
    for gi, g in enumerate(page.goldens):
        body.append(f'<section class="golden" id="g{gi}"><h2>{_e(g.name)} <span class="badge '
                    f'{_e(g.status)}">{_e(g.status.replace("_", " "))}</span></h2>'
                    f'<p class="path">{_e(g.path)}</p>')
        if g.why:
            body.append(f"<p>{_e(g.why)}</p>")
        body.append(_diffs("identity: what differs", g.identity, page.reference_label,
                           page.candidate_label))
        body.append(_diffs("configuration: the settings that differ", g.configuration,
                           page.reference_label, page.candidate_label))
        body.append(_diffs("context (recorded, not failing)", g.context,
                           page.reference_label, page.candidate_label))
        if g.summary:
            body.append(f"<p><strong>{_e(g.summary)}</strong>"
                        + ("" if g.logprobs_identical is None else
                           " · top-k logprobs " + ("bit-identical" if g.logprobs_identical
                                                   else "differ")) + "</p>")
        body += [_prompt(page, g, gi, pi, p) for pi, p in enumerate(g.prompts)]
        body.append("</section>")
    data = embedded_json(page.model_dump(mode="json"))
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{_e(page.title)}"
            f"</title><style>{CSS}</style></head><body>{''.join(body)}</main>"
            f"<script type=\"application/json\" id=\"data\">{data}</script>"
            f"<script>{SCRIPT}</script></body></html>\n")


def embedded_json(value: object) -> str:
    """JSON for a <script type="application/json"> block that no value can end or bend: `<`,
    `>` and `&` as \\u escapes (outside strings JSON has none), so neither `</script>` nor
    `<!--<script>` (which puts the HTML parser in its double-escaped state, turning the page's
    own script into data) can appear in it. JSON.parse reads the same value."""
    data = json.dumps(value, separators=(",", ":"))
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# The page runs its own inline script and style and nothing else: no network at all, no
# other script (an injected one would not run), no plugin, form or base URL. Style
# attributes are the server-drawn cells' shades (numbers, never a value read).
CSP = ("default-src 'none'; script-src " + _sha256_source(SCRIPT) + "; style-src "
       + _sha256_source(CSS) + "; style-src-attr 'unsafe-inline'; img-src 'none'; "
       "connect-src 'none'; base-uri 'none'; form-action 'none'")


def write(page: Page, path: Path) -> Path:
    """The page, written atomically (OutputFailed naming the path when it cannot be)."""
    try:
        atomic_write_bytes(path, render(page).encode())
    except OSError as exc:
        raise OutputFailed(f"cannot write {path}: {exc}") from None
    return path
