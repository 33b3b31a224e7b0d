"""The ``verify`` command: its arguments and --help, one call to services/verify.py, and
what it prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_home_args,
    add_variant_arg,
    homes,
)
from oracle_build.core.files import check_writable
from oracle_build.core.log import emit, say
from oracle_build.report import html
from oracle_build.report.ci import ci_reports
from oracle_build.report.page import PageData, verify_page
from oracle_build.report.text import render
from oracle_build.services.verify import (
    verify,
)


def register(sub: Subparsers) -> None:
    v = sub.add_parser(
        "verify", help="re-run goldens: identity, then configuration, then tokens",
        description="For each golden (default: every goldens/*/golden.json): check the "
        "oracle's identity against the golden's, re-run under the golden's recorded "
        "configuration (one engine start per distinct configuration), report configuration "
        "differences before any token result, then per prompt the first divergence and the "
        "margin there, classified near-tie or real, and apply the golden's gate. Never "
        "modifies a golden.", epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("goldens", nargs="*", help="golden folders or golden.json files")
    v.add_argument("--oracle", "--pin", metavar="PIN", dest="oracle",
                   help="run the goldens on this pin's built oracle instead of their own: "
                   "identity differences first (ORACLE DIFFERS, package by package), then the "
                   "configuration and the tokens and margins, not adjudicable; exit 3. "
                   "Without it: the pin file the golden's spec names, or, when that file is "
                   "not there, the copy of its pin the golden carries, found in the home by "
                   "its hash (nothing is built)")
    v.add_argument("--junit-xml", metavar="PATH",
                   help="also write a JUnit XML report (one test case per golden prompt) for "
                   "CI test reporters")
    v.add_argument("--summary-md", metavar="PATH",
                   help="also write a Markdown summary (identity, configuration, token table, "
                   "gate); appended to $GITHUB_STEP_SUMMARY too when that is set")
    v.add_argument("--html", metavar="FILE",
                   help="also write one self-contained HTML page: the verdict per golden, "
                   "then per prompt the tokens shaded by the golden's top-2 margin, the "
                   "first divergence and both continuations, the top-k on hover (opens "
                   "from a CI artifact; nothing else changes)")
    add_variant_arg(v, "each golden's own (a variant other than the golden's is a "
                    "configuration difference, exit 4)")
    v.add_argument("--cross-target", action="store_true",
                   help="run goldens recorded for another target on this host's target of "
                   "their pin (or of --oracle's): the target difference is reported at "
                   "identity level, tokens shown, not adjudicable; exit 3")
    add_home_args(v, json_help="machine-readable report "
                   "(schema: oracle_build/contracts/schemas/verify-report.schema.json)")
    v.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    home, _ = homes(args)
    pin_override = None
    if args.oracle:
        from oracle_build.contracts.pins import load_pin

        pin_override = load_pin(Path(args.oracle))
    for option, value in (("--junit-xml", args.junit_xml), ("--summary-md", args.summary_md),
                          ("--html", args.html)):
        if value:
            check_writable(Path(value), what=option)
    page = PageData() if args.html else None
    report = verify([Path(p) for p in args.goldens], home=home, pin_override=pin_override,
                    cross_target=args.cross_target, page=page,
                    kernel_variant=args.kernel_variant)
    if args.json:
        emit(report.model_dump_json(indent=2))
    else:
        emit(render(report))
    ci_reports(report, junit_path=args.junit_xml, summary_path=args.summary_md)
    if page is not None:
        html.write(verify_page(report, page), Path(args.html))
        say(f"HTML report: {args.html}")
    return report.exit_code

