"""lock: regenerate a pin's hash-locked dependency list, or (--compiled) establish a source
pin's compiled bytes from its built oracle."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_pin_args,
    homes,
    pin_and_target,
)
from oracle_build.core.errors import EXIT_OK


def register(sub: Subparsers) -> None:
    lk = sub.add_parser(
        "lock", help="regenerate a pin's hash-locked dependency list (--compiled: establish a "
        "source pin's compiled bytes)",
        description="Resolve the pin's top-level requirements and write its lock (every "
        "wheel by sha256). With --compiled: write the sha256 of every file the compiler made "
        "in the pin's built oracle (read from its build record, once every other identity "
        "check passes) into the file the pin's `compiled` names; identity then holds every "
        "rebuild of this pin, target and toolchain to those bytes (docs/reproducible-"
        "builds.md).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(lk)
    lk.add_argument("--compiled", action="store_true",
                    help="establish the compiled bytes of the oracle in --home instead")
    lk.add_argument("--replace", action="store_true",
                    help="with --compiled: overwrite bytes already held for this toolchain "
                    "(refused otherwise: a rebuild with other bytes is not reproducible)")
    lk.set_defaults(func=run_lock)


def run_lock(args: argparse.Namespace) -> int:
    from oracle_build.recipe.lock import establish_compiled, generate_lock

    if not args.compiled:
        if not args.pin:
            from oracle_build.commands.common import find_default_pin

            args.pin = str(find_default_pin())
        generate_lock(Path(args.pin))
        return EXIT_OK
    pin, target = pin_and_target(args)
    home, _ = homes(args)
    establish_compiled(pin, target, home, replace=args.replace)
    return EXIT_OK
