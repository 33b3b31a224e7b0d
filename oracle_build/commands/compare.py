"""compare: another engine's output (a candidate file) against a golden, offline. Per
prompt the first divergence and the golden's margin there from its recorded top-k."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oracle_build import judge
from oracle_build.commands.common import (
    Subparsers,
)
from oracle_build.contracts.candidate import Candidate, pair
from oracle_build.contracts.golden import Golden
from oracle_build.core.errors import EXIT_OK


def compare_candidate(golden: Golden, cand: Candidate, path: Path) -> list[judge.TokenResult]:
    band = golden.gate.band_nats
    results = []
    for i, cp in pair(golden, cand, path):
        g = golden.prompts[i]
        results.append(judge.compare_prompt(g.id, g.prompt_token_ids, g.token_ids,
                                            golden.prompt_topk(i),
                                            cp.prompt_token_ids, cp.token_ids, cp.topk, band))
    return results


# ----------------------------------------------------------------------------- command line


def register(sub: Subparsers) -> None:
    cp = sub.add_parser("compare", help="offline: another engine's output against a golden",
                        description="Per prompt: the first divergence, the golden's margin "
                        "there from its recorded top-k, near-tie or real; no oracle needed. "
                        "Exit 0 when the golden's gate passes, 1 on drift, 2 on bad input.",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("golden")
    cp.add_argument("candidate", help="JSON: {candidate_schema: 1, prompts: [{id?, "
                    "prompt_token_ids, token_ids, topk?}]}")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from oracle_build import judge
    from oracle_build.contracts.candidate import load_candidate
    from oracle_build.contracts.golden import load_golden

    golden_path = Path(args.golden)
    golden = load_golden(golden_path)
    judge.admit_gate(golden, golden_path)  # the gate verify applies, and no other
    cand_path = Path(args.candidate)
    results = compare_candidate(golden, load_candidate(cand_path), cand_path)
    summary = judge.summarize(results)
    passed = judge.gate_passes(golden.gate.kind, results)
    if args.json:
        print(json.dumps({"golden": args.golden, "candidate": args.candidate,
                          "results": [r.as_dict() for r in results],
                          "summary": summary.line(golden.gate.kind), "passed": passed},
                         indent=2))
    else:
        for r in results:
            where = "match" if r.index is None else (
                f"diverges at {r.index}: golden {r.golden_token}, candidate {r.new_token}, "
                f"golden margin "
                + ("outside top-k" if r.golden_margin is None else f"{r.golden_margin:.4f}")
                + f" -> {r.kind}")
            ids = "" if r.prompt_ids_equal else "  PROMPT IDS DIFFER"
            print(f"  {r.prompt}: {where}{ids}")
        print(summary.line(golden.gate.kind))
    return EXIT_OK if passed else 1
