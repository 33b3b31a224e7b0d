"""The ``capture`` command: its arguments and --help, one call to services/capture.py, and
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
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit
from oracle_build.services.capture import (
    capture,
)


def register(sub: Subparsers) -> None:
    c = sub.add_parser(
        "capture", help="run the oracle and write goldens that record their full configuration",
        description="For each spec (goldens/<name> or its spec.toml): check the oracle's "
        "identity, start the engine once per distinct configuration, run every leg, and "
        "publish goldens/<name>/golden.json atomically. Never overwrites a golden. With no "
        "spec: the embedded default (goldens/tiny-llama-greedy), written under the oracle "
        "home when its committed golden exists.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("specs", nargs="*", help="spec folders or spec.toml files")
    c.add_argument("--out", help="write goldens to OUT/<name>/golden.json instead of next to "
                   "their spec")
    c.add_argument("--replace", action="store_true",
                   help="replace an existing golden (needs --reason); the old one is kept "
                   "under replaced/")
    c.add_argument("--reason", help="why the golden is re-baselined (a pin bump, a fixed "
                   "spec): recorded in the new golden with the replaced golden's oracle")
    c.add_argument("--migrate", action="store_true",
                   help="bring existing goldens up to what a capture records today (the "
                   "whole CPU kernel-variant hold, the CPU model): each is run again under "
                   "its own variant and replaced only when every token and top-k logprob is "
                   "the old one's, bit for bit (else exit 8, left as it is); the new golden "
                   "records the migration (replaces.reproduced)")
    c.add_argument("--allow-nondeterministic", action="store_true",
                   help="publish even if the legs disagree, marked non-deterministic (never "
                   "usable for a strict gate)")
    c.add_argument("--target", help="pin target (default: detected)")
    add_variant_arg(c, "the pin target's kernel_variant")
    add_home_args(c, with_json=False)
    c.set_defaults(func=run_capture)


def run_capture(args: argparse.Namespace) -> int:
    home, _ = homes(args)
    written = capture([Path(p) for p in args.specs], home=home, replace=args.replace,
                      allow_nondeterministic=args.allow_nondeterministic,
                      target=args.target, out=Path(args.out).resolve() if args.out else None,
                      reason=args.reason, kernel_variant=args.kernel_variant,
                      migrate=args.migrate)
    for path in written:
        emit(path)
    return EXIT_OK
