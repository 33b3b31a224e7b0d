"""The ``analyze`` command: its arguments and --help, one call to services/analyze.py, and
what it prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_home_args,
    homes,
)
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit
from oracle_build.services.analyze import determinism, margin


def register(sub: Subparsers) -> None:
    mg = sub.add_parser("margin", help="teacher-forced top-k and top-2 margin at one position",
                        description="Re-run the golden's configuration (prefix caching off) on "
                        "prompt ids + the golden's tokens before POSITION, one new token, "
                        "logprobs k; print the top-k and the top-2 margin in nats. With "
                        "--candidate, on the candidate's prefix, and its gap in mnats.",
                        epilog=EXIT_CODES_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    mg.add_argument("golden")
    mg.add_argument("prompt", help="prompt id or index")
    mg.add_argument("position", type=int)
    mg.add_argument("--candidate", help="candidate output file (see `compare`)")
    mg.add_argument("-k", type=int, default=20, help="top-k (default 20)")
    add_home_args(mg)
    mg.set_defaults(func=run_margin)
    dt = sub.add_parser("determinism", help="K legs of a golden's (or spec's) configuration "
                        "in one process: is the oracle deterministic under it?",
                        epilog="exit 0 deterministic, 1 not; other codes as below\n\n"
                        + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    dt.add_argument("source", help="golden folder/json, or spec folder/toml")
    dt.add_argument("--legs", type=int, default=5)
    add_home_args(dt)
    dt.set_defaults(func=run_determinism)


def run_margin(args: argparse.Namespace) -> int:

    home, _ = homes(args)
    report = margin(Path(args.golden), args.prompt, args.position, home=home,
                    candidate=Path(args.candidate) if args.candidate else None, k=args.k)
    if args.json:
        emit(report.model_dump_json(indent=2, exclude_unset=True))
        return EXIT_OK
    emit(f"{report.golden} prompt {report.prompt} position {report.position} "
          f"(teacher-forced on the {report.prefix}'s prefix, prefix caching off)")
    for rank, (tok, lp) in enumerate(report.topk, start=1):
        marks = []
        if tok == report.golden_token:
            marks.append("golden")
        if tok == report.candidate_token:
            marks.append("candidate")
        emit(f"  {rank:>2}. token {tok:>7}  logprob {lp:+.6f}  {' '.join(marks)}")
    m = report.top2_margin_nats
    emit(f"top-2 margin: {'n/a' if m is None else f'{m:.6f} nats'}")
    if report.candidate_gap_mnats is not None:
        emit(f"candidate gap: {report.candidate_gap_mnats} mnats")
    return EXIT_OK


def run_determinism(args: argparse.Namespace) -> int:

    home, _ = homes(args)
    report = determinism(Path(args.source), home=home, legs=args.legs)
    if args.json:
        emit(report.model_dump_json(indent=2, exclude_unset=True))
    else:
        for leg in report.per_leg:
            extra = (f", matches golden {leg.matches_golden}/{report.prompts}"
                     if leg.matches_golden is not None else "")
            emit(f"leg {leg.leg}: matches leg 0 {leg.matches_leg0}/{report.prompts}" + extra)
        emit(("DETERMINISTIC" if report.deterministic else "NON-DETERMINISTIC")
              + f" under this configuration ({report.legs} legs, one process)")
    return EXIT_OK if report.deterministic else 1
