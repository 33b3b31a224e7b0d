"""One module per command: its options (``register``), its run and its rendering. The CLI
(``cli.py``) only builds the parser from this table and maps errors to exit codes."""

from __future__ import annotations

from types import ModuleType

from oracle_build.commands import (
    analyze,
    build,
    capture,
    compare,
    cudakernels,
    diff,
    explain,
    externals,
    identity,
    keygen,
    listing,
    lock,
    numerics,
    pull,
    push,
    schema,
    verify,
    vllmcpp,
)

# in the order `--help` lists them
COMMANDS: tuple[ModuleType, ...] = (build, identity, push, pull, listing, keygen, lock,
                                    externals, cudakernels,
                                    capture, verify, numerics, diff, analyze,
                                    compare, vllmcpp, explain, schema)
