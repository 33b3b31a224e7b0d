"""The ``explain`` command: its arguments and --help, one call to services/explain.py, and
what it prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_home_args,
    homes,
)
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit
from oracle_build.services.explain import explain, parse_vary


def register(sub: Subparsers) -> None:
    xp = sub.add_parser(
        "explain", help="find which setting moves a divergent token",
        description="Run the oracle under candidate configurations: the golden's recorded one "
        "(for an unrecorded golden: the engine's defaults, with --pin and --model), each "
        "setting varied one at a time, then combinations of the settings that moved tokens. "
        "Reports per prompt which configurations reproduce the golden and, for the others, "
        "the first divergence and its margin; ends with a plain answer. Writes a JSON record "
        "(never into the golden).", epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    xp.add_argument("golden")
    xp.add_argument("--vary", action="append", metavar="SETTING=V1,V2",
                    help="vary only these (repeatable); 'batch' is the batch composition "
                    "(per_prompt, all). Default: dtype, kv_cache_dtype, enforce_eager, batch, "
                    "max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, "
                    "enable_prefix_caching, max_model_len, block_size")
    xp.add_argument("--budget", type=int, default=12, help="most engine starts (default 12)")
    xp.add_argument("--pin", help="for an unrecorded golden: the pin of the oracle to run")
    xp.add_argument("--model", help="for an unrecorded golden: the model folder")
    xp.add_argument("--out", help="where to write the record (default: HOME/explain/...)")
    add_home_args(xp)
    xp.set_defaults(func=run_explain)


def run_explain(args: argparse.Namespace) -> int:

    home, _ = homes(args)
    report, dest = explain(Path(args.golden), home=home,
                           vary=parse_vary(args.vary) if args.vary else None,
                           budget=args.budget, pin_path=Path(args.pin) if args.pin else None,
                           model_path=Path(args.model) if args.model else None,
                           out=Path(args.out) if args.out else None)
    if args.json:
        emit(report.model_dump_json(indent=2))
    else:
        for c in report.candidates:
            if c.status != "ok":
                emit(f"  {c.name}: {c.status.upper().replace('_', ' ')}"
                      + (f" ({c.error})" if c.error else ""))
                continue
            cells = []
            for p in c.prompts:
                if p.reproduces:
                    cells.append(f"{p.id} =")
                else:
                    m = "outside top-k" if p.golden_margin is None else f"{p.golden_margin:.3f}"
                    cells.append(f"{p.id} @{p.index} ({m}, {p.kind})")
            emit(f"  {c.name}: " + "; ".join(cells))
        emit(report.answer)
        emit(f"engine starts: {report.engine_starts} (budget {report.budget}); record: {dest}")
    return EXIT_OK
