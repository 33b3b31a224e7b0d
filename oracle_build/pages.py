"""The data of an HTML report, built from what verify and diff have in hand: the
reference's tokens and top-k rows, the run's, the per-prompt results judge gave, and the
token pieces the engine host decoded (contracts/page.py; html.py draws it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build.contracts.page import PagePrompt

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
           result: dict[str, Any]) -> PagePrompt:
    """One prompt as the page shows it; ``result`` is judge's TokenResult as the JSON report
    holds it (the fork and both margins are taken from it, never recomputed)."""
    margins, ties = _margins(reference_rows, len(reference))
    fork = result.get("index")
    return PagePrompt(
        id=pid, text=text, prompt_ids=list(prompt_ids), reference=list(reference),
        candidate=list(candidate) if fork is not None else [], margins=margins, ties=ties,
        fork=fork,
        kind=str(result.get("kind")), reference_margin=result.get("golden_margin"),
        candidate_margin=result.get("new_margin"),
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
            results: list[dict[str, Any]], pieces: dict[str, str] | None,
            oracle: Oracle | None) -> None:
        self.prompts[str(path)] = [
            prompt(p.id, p.text, p.prompt_token_ids, p.token_ids, golden.prompt_topk(i),
                   out["token_ids"], out.get("topk"), r)
            for i, (p, out, r) in enumerate(zip(golden.prompts, leg, results, strict=True))]
        self.pieces.update(pieces or {})
        if oracle is not None and not self.oracle:
            self.oracle = oracle_facts(oracle)
