"""The ``numerics`` command: its arguments and --help, one call to services/numerics.py, and
what it prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_pin_args,
    add_variant_arg,
    find_default_pin,
    homes,
    pin_and_target,
)
from oracle_build.contracts.pins import Pin
from oracle_build.core import verdicts
from oracle_build.core.errors import (
    as_data,
)
from oracle_build.core.log import emit, say
from oracle_build.services.numerics import (
    numerics,
)


def register(sub: Subparsers) -> None:
    nm = sub.add_parser(
        "numerics", help="the kernel battery: ORACLE_NUMERICS_OK when this oracle computes "
        "the same numbers as its golden set",
        description="One generated model per kernel family our users' models use (Llama "
        "fp32 and bf16, Qwen3, Qwen3-MoE, Gemma2, Nemotron-H hybrid Mamba2, Qwen3-Next gated "
        "delta net + MoE). The golden set for this pin, target and the CPU kernel variant "
        "the pin holds (BATTERY/sets/<pin key>/<target>/<variant>/; --kernel-variant for "
        "another) is verified, each member under the variant it recorded: "
        "ORACLE_NUMERICS_OK only when every prompt is token-exact and every top-k logprob "
        "bit-identical, else ORACLE_NUMERICS_DRIFT with architecture, prompt, position and "
        "margin (exit 1). A member with exact tokens whose logprobs differ, captured on "
        "another CPU model, is NOT HELD across CPU models (ORACLE_NUMERICS_NOT_HELD, exit "
        "11), never drift. With no set for this key (a new gate host): it is captured, and "
        "the folder to commit is printed. Either way the set's fingerprint (sha256 over its "
        "tokens and logprobs) is printed and kept beside the oracle (outside it, bound to its "
        "anchor).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(nm)
    nm.add_argument("--battery", default="goldens/numerics",
                    help="the battery folder: specs/ and sets/ (default goldens/numerics)")
    nm.add_argument("--only", nargs="+", metavar="NAME",
                    help="only these members (spec names in BATTERY/specs)")
    add_variant_arg(nm, "the pin target's kernel_variant (the set of that variant is "
                    "verified; each member re-runs under the variant it recorded)")
    nm.set_defaults(func=run_numerics)


def run_numerics(args: argparse.Namespace) -> int:
    from oracle_build.contracts.reports import VERIFY_REPORT_SCHEMA, VerifyReport
    from oracle_build.report.text import render

    pin_path = Path(args.pin) if args.pin else find_default_pin()
    pin, _target = pin_and_target(argparse.Namespace(**{**vars(args), "pin": str(pin_path)}))
    assert isinstance(pin, Pin)
    home, _ = homes(args)
    out = numerics(pin=pin, pin_path=pin_path, target=args.target, battery=Path(args.battery),
                   home=home, only=args.only or None, kernel_variant=args.kernel_variant)
    unusual = [v for v in out.verified if v.status != "pass" or not v.logprobs_identical]
    if unusual:  # the whole verify report for members that did not pass bit for bit
        emit(render(VerifyReport(report_schema=VERIFY_REPORT_SCHEMA, created_utc="",
                                  exit_code=out.exit_code, goldens=unusual)))
    for v in out.verified:
        logprobs = {True: "top-k logprobs bit-identical", False: "top-k logprobs DIFFER",
                    None: "nothing run"}[v.logprobs_identical]
        emit(f"  {v.name:<12} {v.status.upper():<10} {v.summary.split(';')[0]}; {logprobs}")
    if out.captured:
        emit(f"captured the golden set for this pin, target and CPU kernel variant: "
              f"{', '.join(out.captured)}")
        emit(f"  commit it: git add {out.set_dir}")
    if out.line:
        emit(verdicts.numerics(out.line, out.fingerprint or None))
    for line in out.drift + out.not_held:
        emit(as_data(line, 2000))  # prompt ids, CPU models: values read from the goldens
    if args.only:
        say("(fingerprint over the members run with --only, not the whole battery)")
    return out.exit_code
