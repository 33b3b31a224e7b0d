"""One function from a golden's verdict to its words (``verdict_words``), used by every
report: the terminal's table (text.py), the Markdown summary and JUnit XML (ci.py) and the
HTML page (html.py). A word is the tool's own, chosen from the verdict's status and its
parts (which differences it holds, whether tokens were compared, the gate's result), never
from a value read; ``None``: that column has nothing to say for this verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from oracle_build.contracts.reports import GateVerdict, GoldenVerdict
from oracle_build.core.verdicts import UNRECORDED_BANNER

COLUMNS = ("identity", "configuration", "tokens", "gate")
Tone = Literal["ok", "warn", "bad"]


@dataclass(frozen=True)
class Words:
    """A verdict's words, one per column (identity, then configuration, tokens, gate), and
    why its tokens are not adjudicable (``tokens_note``: None when they are)."""

    identity: str | None
    configuration: str | None
    tokens: str | None
    gate: str | None
    tokens_note: str | None = None

    # how each column reads: "ok", "warn" or "bad" (a page colours its words by it)
    tones: tuple[Tone, Tone, Tone, Tone] = ("warn", "warn", "warn", "warn")

    def columns(self) -> dict[str, str]:
        """The four columns as a table shows them ("-" where nothing is said)."""
        return {k: v or "-" for k, v in asdict(self).items() if k in COLUMNS}

    def column_tones(self) -> dict[str, Tone]:
        return dict(zip(COLUMNS, self.tones, strict=True))


def gate_result(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "not judged"}[passed]


def gate_words(gate: GateVerdict) -> str:
    return f"{gate.kind}: {gate_result(gate.passed)}"


def verdict_words(v: GoldenVerdict) -> Words:
    """A golden's verdict in words: identity (OK, ORACLE DIFFERS: another oracle ran as
    asked, ORACLE MISMATCH: nothing ran, NOT VERIFIABLE HERE), configuration (same,
    CONFIGURATION DIFFERENCE, or unrecorded), tokens (judge's summary line), gate."""
    if v.status == "not_verifiable_here":
        return Words("NOT VERIFIABLE HERE", None, None, None, tones=("bad", "warn", "warn",
                                                                    "warn"))
    unrecorded = v.status == "config_unrecorded"
    identity = None if unrecorded else ("OK" if not v.identity else
                                        "ORACLE DIFFERS" if v.tokens else "ORACLE MISMATCH")
    if unrecorded:
        configuration: str | None = UNRECORDED_BANNER
    elif v.tokens or v.configuration:
        configuration = "same" if not v.configuration else "CONFIGURATION DIFFERENCE"
    else:
        configuration = None
    note = None
    if v.tokens and not v.adjudicable:
        note = UNRECORDED_BANNER if unrecorded else (
            "NOT ADJUDICABLE: another oracle" if v.status == "oracle_mismatch"
            else "NOT ADJUDICABLE: configuration differs")
    tones: tuple[Tone, Tone, Tone, Tone] = (
        "warn" if identity is None else "ok" if not v.identity else "bad",
        "warn" if configuration is None else "ok" if not (v.configuration or unrecorded)
        else "bad",
        tokens_tone(v),
        "warn" if v.gate is None or v.gate.passed is None else "ok" if v.gate.passed
        else "bad")
    return Words(identity, configuration, (v.summary or None) if v.tokens else None,
                 gate_words(v.gate) if v.gate else None, note, tones)


def numbers_words(v: GoldenVerdict) -> str | None:
    """When every token matched but top-k logprobs moved: how many, of how many, and the
    largest difference, in one sentence every report shows on its own line (None: nothing to
    say, the numbers are the golden's or were not compared)."""
    moved = v.logprobs_moved
    if not moved or not moved.get("cells") or not v.tokens:
        return None
    if not all(t.tokens_equal for t in v.tokens):
        return None
    worst = moved.get("max_abs_delta")
    largest = f", max {worst:.1e} nats" if isinstance(worst, float) else ""
    return (f"tokens match; numbers moved: {moved['cells']:,} of {moved['of']:,} top-k "
            f"logprobs differ{largest}: not the golden's oracle and configuration"
            + (" (its gate is bit-exact: FAIL)" if v.gate is not None and v.status == "drift"
               else ""))


def tokens_tone(v: GoldenVerdict) -> Tone:
    """ok: every prompt token-identical; warn: divergences at (near-)ties only, or none
    compared; bad: a real divergence."""
    if not v.tokens:
        return "warn"
    kinds = {t.kind for t in v.tokens}
    return "ok" if kinds == {"match"} else "bad" if "real" in kinds else "warn"
