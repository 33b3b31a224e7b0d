"""schema: regenerate the committed JSON Schemas from the models."""

from __future__ import annotations

import argparse

from oracle_build.commands.common import EXIT_CODES_HELP, Subparsers
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit


def register(sub: Subparsers) -> None:
    from oracle_build.contracts import schemas

    names = ", ".join(sorted(p.name.removesuffix(".schema.json")
                             for p in schemas.HERE.glob("*.schema.json")))
    sc = sub.add_parser(
        "schema", help="regenerate the committed JSON Schemas "
        "(oracle_build/contracts/schemas/*.json) from the models",
        description="Write the JSON Schema of every file oracle-build writes, from its model "
        f"in oracle_build/contracts/, into {schemas.HERE}: {names}. For a developer who "
        "changed a model: the tests fail while a committed schema differs from its model.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sc.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    from oracle_build.contracts import schemas

    for path in schemas.write():
        emit(path)
    return EXIT_OK
