"""keygen: an Ed25519 key pair for signing pushed oracles."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import Subparsers
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit, say


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "keygen", help="make an Ed25519 key pair for signing pushed oracles",
        description="Write NAME.secret (mode 0600: keep it on the build host, give it to "
        "push or build --signing-key) and NAME.public into --out, and print the public "
        "line to add to pins/trusted-keys. NAME ends in -<number> (Nix style) so keys can "
        "be rotated: trust gb10-builder-2 beside -1, then drop -1.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the key's name, e.g. gb10-builder-1")
    p.add_argument("--out", default=".", help="folder for the two files (default: here)")
    p.set_defaults(func=run_keygen)


def run_keygen(args: argparse.Namespace) -> int:
    from oracle_build.cache.signing import generate

    secret, public, key = generate(args.name, Path(args.out))
    say(f"secret key: {secret} (mode 0600; never commit it)")
    say(f"public key: {public}; add this line to pins/trusted-keys:")
    emit(key.public_line)
    return EXIT_OK
