"""Every value a report shows that came from a file, a run or a registry, as data: control
characters escaped (a newline cannot start a line of its own, an escape sequence cannot
rewrite the terminal), the length bounded; for Markdown, every character Markdown acts on
escaped, or the value put in a code span it cannot close. HTML escapes through its
template's autoescape (html.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from oracle_build.contracts.base import printable
from oracle_build.core.errors import as_data


def _plain(value: Any) -> Any:
    """A model (an unestablished pin value, say) as the JSON its file holds; anything else
    JSON cannot say, as its text: a value shown never fails the report."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(value)


def fmt(value: Any) -> str:
    """A value read from a golden, a pin or a run, as data, bounded to a table cell."""
    text = json.dumps(value, default=_plain) if not isinstance(value, str) else value
    text = printable(text)
    return text if len(text) <= 60 else text[:57] + "..."


def text(value: Any) -> str:
    """A sentence that may quote input (a why, a reason), as data on one line, bounded."""
    return as_data(str(value), 500)


# what acts mid-line (a value never starts a line here: each follows our own words)
MD_SPECIAL = re.compile(r"([\\`*_\[\]!<>|~&])")


# what GitHub's Markdown turns into a link with no bracket at all (its autolink extension:
# www.host, scheme://host, user@host): broken by a character reference for the dot and the
# colon (it renders as the character but is not one to the extension), and by a zero-width
# space after an at sign (the extension reads an address through references and escapes)
AUTOLINKED = re.compile(r"(?i)(?<=www)\.|:(?=//)|@")


def md(value: Any) -> str:
    """Text for Markdown that renders as the text: every character Markdown would act on
    escaped (no heading, link, autolink, image, emphasis or HTML from a value), on one
    line."""
    escaped = MD_SPECIAL.sub(r"\\\1", text(value))
    return AUTOLINKED.sub(lambda m: "@\u200b" if m.group() == "@" else f"&#{ord(m.group())};",
                          escaped)


def code(value: Any) -> str:
    """A value as a Markdown code span the value cannot close: the fence is one backtick
    longer than the longest run of backticks in it."""
    shown = fmt(value)
    run = max((len(m) for m in re.findall(r"`+", shown)), default=0)
    fence = "`" * (run + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def margin(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f}"


def nats(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f} nats"
