"""One self-contained HTML page for a verify or a diff: no network, no external script, font
or image; it opens from a CI artifact or a file manager.

At the top the verdict per golden in the terminal's words (identity, configuration, tokens,
gate) and what ran; then per golden the settings that differ (before any token), then per
prompt the generated tokens as a strip of cells shaded by the reference's top-2 margin
(near-ties stand out, exact ties are outlined), the first divergence marked, both
continuations side by side after it, and a small chart of the margin along the sequence
with the band drawn as a line. Hovering a cell (its ``title``) shows the reference's top-k
there with logprobs in nats.

The page comes from one template (``templates/page.html.j2``) rendered by jinja2 with
autoescape on, so every value is escaped unless the template marks it safe, and only the
page's own style, script and data block are. Its tokens are drawn by its own script
(``templates/page.js``), the one renderer of a cell: prompts that diverge at load, the
others when opened (a 2,000-prompt golden stays a few MB and opens at once). The data the
script reads is the page's embedded JSON, escaped so that no value can end its block.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from oracle_build.contracts.page import Page, PagePrompt
from oracle_build.core.errors import OutputFailed
from oracle_build.core.files import atomic_write_bytes
from oracle_build.report.words import COLUMNS

TEMPLATES = Path(__file__).parent / "templates"
CSS = (TEMPLATES / "page.css").read_text()
SCRIPT = (TEMPLATES / "page.js").read_text()


@dataclass(frozen=True)
class Chart:
    """The margin along a prompt's sequence as the page's SVG draws it: numbers only."""

    width: int
    height: int
    pad: int
    band: float
    band_y: str
    zero_y: str
    top: float
    points: str
    ties: list[str]
    fork_x: str


def chart(p: PagePrompt, band: float) -> Chart:
    """The margin along the sequence, the band as a dashed line, the fork as a red line."""
    n = max(len(p.margins), 1)
    width, height, pad = 720, 90, 4
    known = [m for m in p.margins if m is not None]
    top = max([band * 2, *known]) if known else band * 2
    top = max(top, 1e-6)

    def x(i: int) -> str:
        return f"{pad + (width - 2 * pad) * (i / max(n - 1, 1)):.1f}"

    def y(m: float) -> str:
        return f"{height - pad - (height - 2 * pad) * min(m / top, 1.0):.1f}"

    points = " ".join(f"{x(i)},{y(m)}" for i, m in enumerate(p.margins) if m is not None)
    return Chart(width, height, pad, band, y(band), y(0), top, points,
                 [x(i) for i in p.ties], x(p.fork or 0))


def value(v: object) -> str:
    """A differing setting's value as the page shows it (escaped by the template)."""
    return json.dumps(v, default=str) if not isinstance(v, str) else v


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=False)
    return env.get_template("page.html.j2")


def render(page: Page) -> str:
    return _template().render(page=page, columns=COLUMNS, css=CSS, script=SCRIPT, csp=CSP,
                              data=embedded_json(page.model_dump(mode="json")),
                              chart=chart, value=value) + "\n"


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
# other script (an injected one would not run), no plugin, form or base URL. Inline style
# is what the page's script sets on its cells (a shade computed from a number).
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
