"""import and export: vllm.cpp's golden formats in and out (the logic is interop/vllmcpp.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
)
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit, say


def register(sub: Subparsers) -> None:
    im = sub.add_parser(
        "import", help="read a vllm.cpp golden (oracle.json, any schema; or a greedy battery) "
        "into our golden format",
        description="Reads vllm.cpp's legacy oracle.json, oracle.json with a schema-2 capture "
        "block (attributed or unattributed), or a greedy battery folder (greedy_ids.npy, "
        "greedy_dist.npy, p{i}_prompt.i32, optional our_ids.npy / neartie_gap_mnats.npy), and "
        "writes OUT/<name>/golden.json. Never invents a value: what the source did not record "
        "is marked unrecorded with the source's own reasons; the source files' sha256 are kept.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    im.add_argument("path", help="oracle.json, or a folder holding it or a battery")
    im.add_argument("--out", default="goldens", help="goldens folder (default: goldens)")
    im.add_argument("--name", help="golden name (default: the source folder's name)")
    im.set_defaults(func=run_import)
    exp = sub.add_parser(
        "export", help="write a golden as a vllm.cpp battery + attributed oracle.json",
        description="Writes DIR/greedy_ids.npy, greedy_dist.npy (from the legs), "
        "p{i}_prompt.i32 and an oracle.json whose schema-2 capture block is attributed (all 20 "
        "resolved keys, legs >= 2, legs_agree true). Refuses a golden that cannot satisfy that "
        "contract, and never overwrites DIR.", epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    exp.add_argument("--format", choices=["vllm.cpp"], required=True)
    exp.add_argument("golden")
    exp.add_argument("dir")
    exp.set_defaults(func=run_export)


def run_import(args: argparse.Namespace) -> int:
    from oracle_build.interop.vllmcpp import import_to

    dest = import_to(Path(args.path), Path(args.out), name=args.name)
    say(f"imported {args.path} -> {dest}")
    emit(dest)
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    from oracle_build.contracts.golden import golden_file, load_golden
    from oracle_build.interop.vllmcpp import export

    path = golden_file(Path(args.golden))
    dest = export(load_golden(path), path, Path(args.dir))
    say(f"exported {path} -> {dest} (vllm.cpp battery + attributed oracle.json)")
    emit(dest)
    return EXIT_OK
