"""pull: a cached oracle's wheels into the wheelhouse, verified against the pin, the lock
and a trusted key."""

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
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "pull", help="pull a cached oracle's wheels into the wheelhouse, verified",
        description="Pull this pin's oracle for the target from the cache into the "
        "wheelhouse, without installing it: the manifest, its signed provenance (a trusted "
        "key, this pin, this target), the config, and every layer against the pin's lock, "
        "all before any wheel; then each missing wheel streamed, its sha256 and size checked "
        "as it streams, moved in only when they hold. `build_oracle -- --cache REF` pulls "
        "and installs in one step.",
        epilog=CACHE_HELP + "\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(p)
    add_cache_args(p, required=True)
    p.set_defaults(func=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    from oracle_build import cache

    opts = cache_options(args, required=True)
    assert opts is not None
    pin, target = pin_and_target(args, plan_only=True)
    _home, wheelhouse = homes(args)
    result = cache.pull(opts, pin, target, wheelhouse_root=wheelhouse)
    emit(f"{opts.ref}:{result.tag}@{result.digest}  signed by "
          f"{result.signed_by or 'nobody (allowed unsigned or untrusted)'}; "
          f"{result.fetched} wheels pulled, {result.present} already present")
    return EXIT_OK
