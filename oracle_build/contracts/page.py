"""The data of an HTML report (`verify --html`, `diff --html`): what the page shows, as a
model, embedded in the page as JSON (``<script type="application/json" id="data">``) so a
reader or a test can take the numbers from the page itself.

``reference`` is the golden (verify) or oracle A (diff); ``candidate`` this run or oracle
B. Margins are the reference's top-2 gap at each position in nats (logprob of its best
token minus the second's; None where the reference recorded fewer than two).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from oracle_build.contracts.base import Strict
from oracle_build.contracts.reports import FieldDiff

PAGE_SCHEMA = 1


class PagePrompt(Strict):
    id: str
    text: str | None = None
    prompt_ids: list[int]
    reference: list[int]
    candidate: list[int]  # empty when token-identical to the reference (the page stays small)
    margins: list[float | None]  # the reference's top-2 margin at each position
    ties: list[int] = Field(default_factory=list)  # positions of an exact top-2 tie
    fork: int | None  # the first divergence
    kind: str  # match, exact_tie, near_tie, real
    reference_margin: float | None = None  # at the fork, as verify reports it
    candidate_margin: float | None = None
    # the reference's top-k rows, one per position ([id, logprob] best first), for a prompt
    # that diverges; none for one that does not (its margins say the top-2 gap)
    topk: list[list[tuple[int, float]]] = Field(default_factory=list)
    candidate_topk: list[list[tuple[int, float]]] = Field(default_factory=list)  # from the fork


class PageGolden(Strict):
    name: str
    path: str
    status: str
    words: dict[str, str]  # identity, configuration, tokens, gate: the terminal's words
    # how each word reads (ok, warn, bad), from the verdict: the page colours it so
    tones: dict[str, Literal["ok", "warn", "bad"]] = Field(default_factory=dict)
    why: str = ""
    identity: list[FieldDiff] = Field(default_factory=list)
    configuration: list[FieldDiff] = Field(default_factory=list)
    context: list[FieldDiff] = Field(default_factory=list)
    summary: str = ""
    band_nats: float | None = None
    logprobs_identical: bool | None = None
    # tokens match and the numbers moved: the reports' one sentence (report/words.py)
    numbers: str | None = None
    prompts: list[PagePrompt] = Field(default_factory=list)


class Page(Strict):
    page_schema: Literal[1]
    kind: Literal["verify", "diff"]
    title: str
    created_utc: str
    oracle: dict[str, str]  # what ran: pin, vLLM, target, CPU variant (and B's, for diff)
    reference_label: str
    candidate_label: str
    exit_code: int | None = None
    goldens: list[PageGolden]
    pieces: dict[str, str] = Field(default_factory=dict)  # token id -> text, when known
