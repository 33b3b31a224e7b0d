"""lock: regenerate a pin's hash-locked dependency list."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    Subparsers,
)
from oracle_build.core.errors import EXIT_OK


def register(sub: Subparsers) -> None:
    lk = sub.add_parser("lock", help="regenerate a pin's hash-locked dependency list")
    lk.add_argument("--pin", required=True)
    lk.set_defaults(func=run_lock)


def run_lock(args: argparse.Namespace) -> int:
    from oracle_build.recipe.lock import generate_lock

    generate_lock(Path(args.pin))
    return EXIT_OK
