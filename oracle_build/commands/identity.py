"""identity: check a built oracle against its pin, every file hashed (--quick: only the files
whose size or mtime moved)."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_pin_args,
    homes,
    pin_and_target,
    print_identity,
)
from oracle_build.core.errors import EXIT_OK, OracleMissing, OutputFailed, PreflightFailed
from oracle_build.core.log import say


def register(sub: Subparsers) -> None:
    i = sub.add_parser("identity", help="check an oracle's identity against its pin",
                       epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(i)
    i.add_argument("--venv", help="check this venv instead of the pin's built one")
    i.add_argument("--quick", action="store_true",
                   help="hash only the files whose size or mtime changed (seconds faster on "
                   "a large oracle; it cannot see an edit that keeps a file's size and puts "
                   "its mtime back, which the default check, every file hashed, finds)")
    i.add_argument("--deep", action="store_true",
                   help="every file hashed: the default now (kept for scripts that pass it)")
    i.set_defaults(func=run_identity)


def run_identity(args: argparse.Namespace) -> int:
    from oracle_build.core.errors import IdentityMismatch
    from oracle_build.core.layout import oracle_path
    from oracle_build.oracle import identity

    pin, target = pin_and_target(args)
    home, _ = homes(args)
    venv = Path(args.venv) if args.venv else oracle_path(home, pin.key)
    if not (venv.exists() or venv.is_symlink()):
        raise OracleMissing(f"no oracle for pin {pin.id} at {venv}",
                            hint="run `nox -s build_oracle` first")
    every_file = not args.quick
    if args.quick:
        say("quick check: files whose size and mtime are unchanged are not hashed (an edit "
            "that keeps both passes it); without --quick every file is hashed")
    ident = identity.check(pin, pin.target(target), venv, deep=every_file)
    # the compiler its engines would be given (engine/compiler.py), as capture and verify name it
    from oracle_build import host
    from oracle_build.engine import compiler as runtime

    try:
        ident.runtime_compiler = runtime.choose(pin.target(target),
                                                host.hold(pin.target(target))).line()
    except PreflightFailed as exc:  # the oracle is what it is; its engines could not start
        ident.runtime_compiler = f"run-time compiler: none ({exc.message.splitlines()[0]})"
    print_identity(ident, args.json)
    if every_file:
        from oracle_build.contracts.record import DeepIdentity
        from oracle_build.core.files import atomic_write_json
        from oracle_build.core.layout import beside_record, build_record_path, utc_now

        hashed = ident.files.hashed if ident.files is not None else 0
        seconds = ident.files.seconds if ident.files is not None else 0.0
        say(f"deep check: {hashed} files hashed in {seconds:.1f}s")
        if build_record_path(venv).is_file() and not venv.is_symlink():
            # beside the venv, never in it (a check writes nothing into the oracle); a home
            # that cannot be written (a read-only mount) keeps no record, and says so
            deep = DeepIdentity(utc=utc_now(), ok=ident.ok, files_hashed=hashed,
                                seconds=round(seconds, 3), mismatches=len(ident.mismatches))
            try:
                atomic_write_json(beside_record(venv, "deep-identity"),
                                  deep.model_dump(mode="json"))
            except OutputFailed as exc:
                say(f"note: the deep check's record was not kept ({exc.message})")
    if not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(venv))
    return EXIT_OK
