"""The ``compare`` command: its arguments and --help, one call to services/compare.py, and
what it prints."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oracle_build.commands.common import (
    Subparsers,
)
from oracle_build.core.errors import EXIT_DRIFT, EXIT_OK
from oracle_build.core.log import emit
from oracle_build.services.compare import compare


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
    out = compare(Path(args.golden), Path(args.candidate))
    if args.json:
        emit(json.dumps({"golden": args.golden, "candidate": args.candidate,
                          "results": [r.as_dict() for r in out.results],
                          "summary": out.summary, "passed": out.passed}, indent=2))
    else:
        for r in out.results:
            where = "match" if r.index is None else (
                f"diverges at {r.index}: golden {r.golden_token}, candidate {r.new_token}, "
                f"golden margin "
                + ("outside top-k" if r.golden_margin is None else f"{r.golden_margin:.4f}")
                + f" -> {r.kind}")
            ids = "" if r.prompt_ids_equal else "  PROMPT IDS DIFFER"
            emit(f"  {r.prompt}: {where}{ids}")
        emit(out.summary)
    return EXIT_OK if out.passed else EXIT_DRIFT
