"""externals: print the CMake externals a vLLM checkout fetches, as a pin block."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build import devices
from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
)
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit, say


def register(sub: Subparsers) -> None:
    ex = sub.add_parser(
        "externals", help="print the CMake externals a vLLM checkout fetches for a target, as "
        "the pin's [[externals]] block",
        description="Reads the checkout's CMakeLists.txt and cmake/ as CMake would for the "
        "device and machine (include() followed, if() evaluated, set() resolved) and prints "
        "every FetchContent external with its repository, tag or commit, and the *_SRC_DIR "
        "variable it honours. A tag is resolved to its commit in --externals MIRRORS/<name>. "
        "Exit 0 when every commit is established, 10 when some are not (listed on stderr).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("--checkout", required=True, help="a vLLM checkout at the pinned commit")
    ex.add_argument("--device", choices=devices.names(), default=devices.default_gpu(),
                    help=f"the build's device (default {devices.default_gpu()})")
    ex.add_argument("--machine", choices=["x86_64", "aarch64"],
                    help="the build host's machine (default: this host's)")
    ex.add_argument("--externals", metavar="MIRRORS",
                    help="folder of local git mirrors, one per external, named as printed")
    ex.set_defaults(func=run_externals)


def run_externals(args: argparse.Namespace) -> int:
    import platform

    from oracle_build.core.errors import EXIT_UNESTABLISHED
    from oracle_build.recipe.externals import externals_block

    block = externals_block(Path(args.checkout), device=args.device,
                            machine=args.machine or platform.machine(),
                            mirrors=Path(args.externals) if args.externals else None)
    emit(block.toml, end="")
    if block.missing:
        say("still unestablished (the build refuses them until filled):\n  "
            + "\n  ".join(block.missing))
        return EXIT_UNESTABLISHED
    return EXIT_OK
