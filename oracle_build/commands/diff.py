"""The ``diff`` command: its arguments and --help, one call to services/diff.py, and
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
from oracle_build.core.log import emit, say
from oracle_build.report import html
from oracle_build.report.page import PageData, diff_page
from oracle_build.report.text import render_diff
from oracle_build.services.diff import diff


def register(sub: Subparsers) -> None:
    df = sub.add_parser(
        "diff", help="what moves between two oracles, over goldens' recorded configurations",
        description="Runs both pins' built oracles (each must pass its own identity), one "
        "engine at a time, under each golden's recorded prompts, batch composition, sampling "
        "and engine arguments (default: every goldens/*/golden.json), and reports per golden "
        "and prompt the first divergence between A and B with both margins, classed exact "
        "tie, near-tie or real, whether the top-k logprobs are bit-identical, the settings "
        "the two engines resolved differently, and the package diff; it ends with one line "
        "per golden: same / moved at near-ties only / moved. The record (schema: "
        "oracle_build/contracts/schemas/diff.schema.json) is written under HOME/diffs/ for a "
        "pin-bump pull request to attach. Nothing under goldens/ is written. Exit 0 whatever "
        "moved (a diff is a report, not a gate).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    df.add_argument("pin_a", metavar="PIN_A", help="the reference pin (e.g. the current one)")
    df.add_argument("pin_b", metavar="PIN_B", help="the pin compared with it")
    df.add_argument("goldens", nargs="*", help="golden folders or golden.json files")
    df.add_argument("--target", help="pin target (default: detected)")
    df.add_argument("--html", metavar="FILE",
                    help="also write one self-contained HTML page: per golden the settings "
                    "the two engines resolved differently, then per prompt A's tokens shaded "
                    "by A's top-2 margin, the first divergence and both continuations")
    add_home_args(df, json_help="print the record (diff.schema.json) instead of the text")
    df.set_defaults(func=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    from oracle_build.contracts.pins import load_pin

    home, _ = homes(args)
    page = PageData() if args.html else None
    report, record = diff(load_pin(Path(args.pin_a)), load_pin(Path(args.pin_b)),
                          [Path(p) for p in args.goldens], home=home, target=args.target,
                          page=page)
    emit(report.model_dump_json(indent=2) if args.json else render_diff(report, record))
    if page is not None:
        html.write(diff_page(report, page), Path(args.html))
        say(f"HTML report: {args.html}")
    return EXIT_OK
