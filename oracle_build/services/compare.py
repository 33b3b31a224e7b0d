"""compare: another engine's output (a candidate file) against a golden, offline. Per
prompt the first divergence and the golden's margin there from its recorded top-k."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oracle_build import judge
from oracle_build.contracts.candidate import Candidate, load_candidate, pair
from oracle_build.contracts.golden import Golden, load_golden


def compare_candidate(golden: Golden, cand: Candidate, path: Path) -> list[judge.TokenResult]:
    band = golden.gate.band_nats
    results = []
    for i, cp in pair(golden, cand, path):
        g = golden.prompts[i]
        results.append(judge.compare_prompt(g.id, g.prompt_token_ids, g.token_ids,
                                            golden.prompt_topk(i),
                                            cp.prompt_token_ids, cp.token_ids, cp.topk, band))
    return results


@dataclass(frozen=True)
class Comparison:
    """A candidate judged against a golden: per prompt its result, the summary line and
    whether the golden's gate passes."""

    golden: Golden
    results: list[judge.TokenResult]
    summary: str
    passed: bool


def compare(golden_path: Path, candidate_path: Path) -> Comparison:
    """The candidate file against the golden, under the gate verify applies and no other."""
    golden = load_golden(golden_path)
    judge.admit_gate(golden, golden_path)
    results = compare_candidate(golden, load_candidate(candidate_path), candidate_path)
    return Comparison(golden, results, judge.summarize(results).line(golden.gate.kind),
                      judge.gate_passes(golden.gate.kind, results))
