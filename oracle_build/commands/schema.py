"""schema: regenerate the committed JSON Schemas from the models."""

from __future__ import annotations

import argparse

from oracle_build.commands.common import (
    Subparsers,
)
from oracle_build.core.errors import EXIT_OK


def register(sub: Subparsers) -> None:
    sc = sub.add_parser("schema", help="regenerate the committed JSON Schemas "
                        "(oracle_build/contracts/schemas/*.json) from the models")
    sc.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    from oracle_build.contracts import schemas

    for path in schemas.write():
        print(path)
    return EXIT_OK
