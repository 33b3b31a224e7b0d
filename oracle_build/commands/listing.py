"""list: every oracle a cache holds, and which hosts' oracles agree."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oracle_build.commands.cacheopts import CACHE_HELP, add_cache_args, cache_options
from oracle_build.commands.common import EXIT_CODES_HELP, Subparsers
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit

DEFAULT_TRUSTED = Path("pins") / "trusted-keys"


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "list", help="every oracle the cache holds: pin, target, host, signer, fingerprints",
        description="List every oracle in the cache's repository: its pin (id and hash), "
        "target, vLLM version, when and on which host it was built, the device identity "
        "saw (a GPU and its arch, or the CPU and its kernel variant), which key signed it "
        "(trusted here, untrusted, or unsigned), its content fingerprint and, where its "
        "numerics battery passed, the battery's fingerprint; then which oracles share a "
        "numerics fingerprint (they compute the same numbers). Nothing is pulled but "
        "manifests, configs and signatures; a damaged artifact is listed with its problem.",
        epilog=CACHE_HELP + f"\n\n--trusted-keys defaults to {DEFAULT_TRUSTED} (from the "
        "current folder).\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cache_args(p, required=True)
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.set_defaults(func=run_list)


def run_list(args: argparse.Namespace) -> int:
    from oracle_build.cache import fleet

    opts = cache_options(args, required=True)
    assert opts is not None
    trusted = opts.trusted_keys or DEFAULT_TRUSTED.resolve()
    entries = fleet.list_cache(opts, trusted)
    if args.json:
        emit(json.dumps({"cache": str(opts.ref), "trusted_keys": str(trusted),
                          "oracles": [e.as_dict() for e in entries]}, indent=2))
    else:
        emit(fleet.render(entries, str(opts.ref)))
    return EXIT_OK
