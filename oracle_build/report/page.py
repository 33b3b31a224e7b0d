"""The data of an HTML report, built from what verify and diff have in hand: the
reference's tokens and top-k rows, the run's, the per-prompt results judge gave, and the
token pieces the engine host decoded (contracts/page.py); the page of a verify or a diff
report from it, each golden in the terminal's words (words.py). html.py draws it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.page import PAGE_SCHEMA, Page, PageGolden, PagePrompt
from oracle_build.contracts.reports import DiffReport, DiffVerdict, TokenRow, VerifyReport
from oracle_build.report.words import Tone, numbers_words, verdict_words

if TYPE_CHECKING:
    from oracle_build.contracts.golden import Golden
    from oracle_build.oracle.opening import Oracle

Rows = Sequence[Sequence[Any]] | None


def _margins(rows: Rows, n: int) -> tuple[list[float | None], list[int]]:
    """The top-2 gap at each position (rows best first), and where it is an exact tie."""
    margins: list[float | None] = []
    ties: list[int] = []
    for i in range(n):
        row = rows[i] if rows is not None and i < len(rows) else None
        if not row or len(row) < 2:
            margins.append(None)
            continue
        gap = float(row[0][1]) - float(row[1][1])
        margins.append(round(gap, 6))
        if gap == 0.0:
            ties.append(i)
    return margins, ties


def _rows(rows: Rows, start: int = 0) -> list[list[tuple[int, float]]]:
    if rows is None:
        return []
    return [[(int(t), float(lp)) for t, lp in (row or [])] for row in list(rows)[start:]]


def prompt(pid: str, text: str | None, prompt_ids: Sequence[int],
           reference: Sequence[int], reference_rows: Rows,
           candidate: Sequence[int], candidate_rows: Rows,
           result: TokenRow) -> PagePrompt:
    """One prompt as the page shows it; ``result`` is judge's TokenResult as the JSON report
    holds it (the fork and both margins are taken from it, never recomputed)."""
    margins, ties = _margins(reference_rows, len(reference))
    fork = result.index
    return PagePrompt(
        id=pid, text=text, prompt_ids=list(prompt_ids), reference=list(reference),
        candidate=list(candidate) if fork is not None else [], margins=margins, ties=ties,
        fork=fork, kind=result.kind, reference_margin=result.golden_margin,
        candidate_margin=result.new_margin,
        topk=_rows(reference_rows) if fork is not None else [],
        candidate_topk=_rows(candidate_rows, fork) if fork is not None else [])


def wanted_ids(reference: Sequence[int], rows: Rows) -> set[int]:
    """The ids whose text a page shows for this reference (its tokens and top-k)."""
    ids = set(int(t) for t in reference)
    for row in rows or []:
        ids.update(int(t) for t, _lp in row or [])
    return ids


def oracle_facts(oracle: Oracle) -> dict[str, str]:
    ident = oracle.identity
    return {"pin": oracle.pin.key, "vLLM": str(ident.facts.get("modules", {}).get(
        "vllm", {}).get("version")), "target": oracle.target_name,
        "device": ident.device_label(), "CPU variant": str(ident.cpu_variant or "-")}


@dataclass
class PageData:
    """What verify gathers for an HTML report while it runs."""

    prompts: dict[str, list[PagePrompt]] = field(default_factory=dict)  # by golden path
    pieces: dict[str, str] = field(default_factory=dict)
    oracle: dict[str, str] = field(default_factory=dict)

    def add(self, path: Path, golden: Golden, leg: list[dict[str, Any]],
            results: list[TokenRow], pieces: dict[str, str] | None,
            oracle: Oracle | None) -> None:
        self.prompts[str(path)] = [
            prompt(p.id, p.text, p.prompt_token_ids, p.token_ids, golden.prompt_topk(i),
                   out["token_ids"], out.get("topk"), r)
            for i, (p, out, r) in enumerate(zip(golden.prompts, leg, results, strict=True))]
        self.pieces.update(pieces or {})
        if oracle is not None and not self.oracle:
            self.oracle = oracle_facts(oracle)


def _host_label() -> str:
    from oracle_build import host

    h = host.host()
    return f"{h.machine} {h.cpu_variant or ''}".strip()


def _band(path: str, prompts: list[PagePrompt]) -> float | None:
    return load_golden(Path(path)).gate.band_nats if prompts else None


def verify_page(report: VerifyReport, data: PageData) -> Page:
    """The page of verify's ``report``: the same verdicts, in the same words, with what
    verify gathered (this host's machine and CPU variant, when no oracle was opened)."""
    goldens = []
    for v in report.goldens:
        prompts = data.prompts.get(v.path, [])
        words = verdict_words(v)
        goldens.append(PageGolden(
            name=v.name, path=v.path, status=v.status, words=words.columns(),
            tones=words.column_tones(),
            why=v.why, identity=v.identity, configuration=v.configuration, context=v.context,
            summary=v.summary, band_nats=_band(v.path, prompts),
            logprobs_identical=v.logprobs_identical, numbers=numbers_words(v),
            prompts=prompts))
    return Page(page_schema=PAGE_SCHEMA, kind="verify", title="oracle-build verify",
                created_utc=report.created_utc, oracle=data.oracle or {"host": _host_label()},
                reference_label="golden", candidate_label="this run",
                exit_code=report.exit_code, goldens=goldens, pieces=data.pieces)


# a diff's verdict as the page's badge (its status class)
DIFF_STATUS: dict[DiffVerdict, str] = {
    "same": "same", "moved": "moved", "moved at near-ties only": "near",
    "not run": "drift", "engine failed on A": "drift", "engine failed on B": "drift"}


DIFF_TONE: dict[DiffVerdict, Tone] = {
    "same": "ok", "moved": "bad", "moved at near-ties only": "warn", "not run": "warn",
    "engine failed on A": "bad", "engine failed on B": "bad"}


def diff_page(report: DiffReport, data: PageData) -> Page:
    """The page of diff's ``report``: A as the reference, B as the candidate."""
    goldens = []
    for g in report.goldens:
        prompts = data.prompts.get(g.path, [])
        words = {"identity": "A and B each their pin's", "configuration":
                 "same" if not g.configuration else f"{len(g.configuration)} settings differ",
                 "tokens": g.summary or g.verdict, "gate": "a diff is a report, not a gate"}
        tones: dict[str, Tone] = {
            "identity": "ok", "configuration": "ok" if not g.configuration else "warn",
            "tokens": DIFF_TONE[g.verdict], "gate": "warn"}
        goldens.append(PageGolden(
            name=g.name, path=g.path, status=DIFF_STATUS[g.verdict], words=words, tones=tones,
            why=g.why or g.verdict,
            configuration=[d for d in g.configuration if d.cls != "context"],
            context=[d for d in g.configuration if d.cls == "context"], summary=g.summary,
            band_nats=_band(g.path, prompts), logprobs_identical=g.logprobs_identical,
            prompts=prompts))
    a, b = report.a, report.b
    return Page(page_schema=PAGE_SCHEMA, kind="diff",
                title=f"oracle-build diff: {a.pin_key} vs {b.pin_key}",
                created_utc=report.created_utc,
                oracle={"A": f"{a.pin_key} (vLLM {a.vllm}, torch {a.torch}, target "
                             f"{a.target})",
                        "B": f"{b.pin_key} (vLLM {b.vllm}, torch {b.torch}, target "
                             f"{b.target})",
                        "packages that differ": str(len(report.packages))},
                reference_label=f"A {a.pin_key}", candidate_label=f"B {b.pin_key}",
                goldens=goldens, pieces=data.pieces)
