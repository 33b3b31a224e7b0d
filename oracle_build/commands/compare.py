"""compare: another engine's output (a candidate file) against a golden, offline. Per
prompt the first divergence and the golden's margin there from its recorded top-k."""

from __future__ import annotations

from pathlib import Path

from oracle_build import judge
from oracle_build.contracts.candidate import Candidate, pair
from oracle_build.contracts.golden import Golden


def compare_candidate(golden: Golden, cand: Candidate, path: Path) -> list[judge.TokenResult]:
    band = golden.gate.band_nats
    results = []
    for i, cp in pair(golden, cand, path):
        g = golden.prompts[i]
        results.append(judge.compare_prompt(g.id, g.prompt_token_ids, g.token_ids,
                                            golden.prompt_topk(i),
                                            cp.prompt_token_ids, cp.token_ids, cp.topk, band))
    return results
