"""push: a built oracle to the oracle cache, with signed provenance."""

from __future__ import annotations

import argparse

from oracle_build.commands.cacheopts import CACHE_HELP, add_cache_args, cache_options
from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_pin_args,
    homes,
    pin_and_target,
)
from oracle_build.core import verdicts
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit, say


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "push", help="push a built oracle to the oracle cache (OCI registry), signed",
        description="Push the oracle built for this pin and target (it must pass identity "
        "first): its wheels (blobs the registry already holds are not uploaded again), a "
        "config with the pin, its lock and the build record, the manifest, and an in-toto "
        "SLSA provenance statement signed with --signing-key. The tag is written last: a "
        "push stopped at any point leaves nothing a pull would take. An existing tag is "
        "not overwritten unless --replace.",
        epilog=CACHE_HELP + "\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(p)
    add_cache_args(p, required=True)
    p.add_argument("--replace", action="store_true", help="overwrite an existing tag")
    p.add_argument("--unsigned", action="store_true",
                   help="push without provenance (pulls refuse it unless --allow-unsigned)")
    p.set_defaults(func=run_push)


def run_push(args: argparse.Namespace) -> int:
    from oracle_build import cache
    from oracle_build.oracle import identity

    opts = cache_options(args, required=True)
    assert opts is not None
    pin, target = pin_and_target(args)
    home, wheelhouse = homes(args)
    from oracle_build.core.layout import oracle_path

    identity.require(pin, pin.target(target), oracle_path(home, pin.key))
    say(verdicts.identity_then("pushing"))
    result = cache.push(opts, pin, target, home=home, wheelhouse_root=wheelhouse,
                        unsigned=args.unsigned)
    emit(f"{opts.ref}:{result.tag}@{result.digest}")
    return EXIT_OK
