"""build (build-oracle): build the pin's oracle for this host's target, or re-check the one
in place; --dry-run prints the plan that would run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oracle_build.commands.cacheopts import CACHE_HELP, add_cache_args, cache_options
from oracle_build.commands.common import (
    EXIT_CODES_HELP,
    Subparsers,
    add_pin_args,
    homes,
    pin_and_target,
    print_identity,
)
from oracle_build.contracts.pins import Pin
from oracle_build.core.env import tool_variable
from oracle_build.core.errors import EXIT_OK
from oracle_build.core.log import emit, say


def register(sub: Subparsers) -> None:
    b = sub.add_parser(
        "build", aliases=["build-oracle"],
        help="build the pinned oracle venv and assert its identity",
        description="Build the pin's oracle into an isolated venv for this host's target, in "
        "a staging folder, and move it into place only after its identity passes. With the "
        "venv already in place: re-check identity (seconds).",
        epilog="with --cache REF: the build first pulls this pin's oracle from the cache "
        "(verified against the lock and a trusted key) and installs it offline; when the "
        "cache lacks it (or it is refused, or the registry is unreachable: said why), it "
        "builds as without, and after identity passes pushes it when a signing key is "
        "given.\n\n" + CACHE_HELP + "\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pin_args(b)
    b.add_argument("--mirror", help="git source for vLLM instead of the pin's URL: a local "
                   "mirror/clone folder or a .bundle file (env ORACLE_BUILD_VLLM_MIRROR)")
    b.add_argument("--externals", help="folder holding the CMake externals' local sources: a "
                   "git mirror of each, named as in the pin, or (for an external the pin names "
                   "by its git tree) any source archive whose files hash to that tree (env "
                   "ORACLE_BUILD_EXTERNALS)")
    b.add_argument("--checkout", help="a vLLM checkout at the pinned commit to plan from: its "
                   "externals, precompiled switches, build requirements and Rust front end "
                   "are read now (the build reads them again from its own clone)")
    b.add_argument("--rebuild", action="store_true",
                   help="replace the oracle even if one is in place (e.g. after drift)")
    b.add_argument("--recompile", action="store_true",
                   help="a source pin: compile even when the wheelhouse holds the wheel an "
                   "earlier build made for this pin (through the compiler cache: minutes when "
                   "it is warm), so that this build's record holds its toolchain")
    b.add_argument("--dry-run", action="store_true",
                   help="print every step, command and environment variable; run nothing")
    b.add_argument("--no-compiler-cache", action="store_true",
                   help="compile every object anew (ccache into a throwaway folder, and a "
                   "wheel built earlier for this pin is not reused); by "
                   "default a source build compiles through ccache in <home>/ccache "
                   "(ORACLE_BUILD_COMPILER_CACHE names a folder homes can share; "
                   "ORACLE_BUILD_COMPILER_CACHE_SIZE bounds it, default 8G)")
    b.add_argument("--stop-after", metavar="STEP",
                   help="run the build up to this step of the plan (its names are printed: "
                   "source, patches, toolchain, externals, ...) or to 'configure' (the wheel "
                   "build stopped once CMake has configured), then stop: nothing published, "
                   "the staging folder removed, the log kept in <home>/logs/")
    b.add_argument("--check", action="store_true",
                   help="a source pin's oracle in place: rebuild it cold (no compiler cache) "
                   "in a scratch folder and compare every compiled file with the installed "
                   "one's, byte for byte, naming the ELF sections of any that differ; exit 0 "
                   "(ORACLE_REPRODUCED) only when all are identical, 19 when not; the scratch "
                   "build removed (as long as a cold build: an hour for vLLM on 2 cores)")
    b.add_argument("--no-gpu", action="store_true",
                   help="a GPU target on a host without its GPU (never implied: without it "
                   "such a host is refused): every step and check runs but the device ones "
                   "(the driver, the GPU's name and capability, the kernel check on the "
                   "GPU); the compiled-arch check still holds the built libraries to the "
                   "target's. "
                   "Its last line names the checks that did not run; it never prints "
                   "ORACLE_IDENTITY_OK. The first identity check on the gate host runs them")
    b.add_argument("--no-wait", action="store_true",
                   help="if another build of this pin holds the lock, fail instead of waiting")
    add_cache_args(b, required=False)
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    from oracle_build import cache, recipe

    pin, target = pin_and_target(args, plan_only=args.dry_run)
    home, wheelhouse = homes(args)
    mirror = args.mirror or tool_variable("ORACLE_BUILD_VLLM_MIRROR")
    externals = args.externals or tool_variable("ORACLE_BUILD_EXTERNALS")
    ext_dir = Path(externals).resolve() if externals else None
    # what every flag makes of the plan, once: the dry run, a build stopped after a step
    # and the whole build take the same (a flag dropped on one path planned another build)
    planned = recipe.PlanOptions(mirror=mirror, externals_dir=ext_dir,
                              checkout=Path(args.checkout).resolve() if args.checkout else None,
                              compiler_cache=not args.no_compiler_cache, no_gpu=args.no_gpu)
    if args.dry_run:
        p = recipe.plan(pin, target, home=home, wheelhouse_root=wheelhouse,
                        stop_after=args.stop_after,
                        reuse_built=not (args.stop_after or args.recompile
                                         or args.no_compiler_cache), **planned.kwargs())
        if args.json:
            emit(json.dumps(p.as_dict(), indent=2))
        else:
            emit(p.render())
        return EXIT_OK
    if args.check:
        return run_check(args, pin, target, home, wheelhouse, mirror, ext_dir)
    if args.stop_after:
        seconds = recipe.build_until(
            pin, target, args.stop_after, home=home, wheelhouse_root=wheelhouse,
            wait=not args.no_wait, **planned.kwargs())
        say(f"stopped after {args.stop_after} in {seconds:.1f}s, as asked (no oracle "
            "published)")
        return EXIT_OK
    opts = cache_options(args, required=False)
    fill = None
    if opts is not None:
        def fill() -> None:
            cache.pull_or_say(opts, pin, target, wheelhouse)
    outcome = recipe.build_oracle(pin, target, home=home, wheelhouse_root=wheelhouse,
                                  rebuild=args.rebuild,
                                  wait=not args.no_wait, fill_wheelhouse=fill,
                                  reuse_built=not (args.no_compiler_cache or args.recompile),
                                  **planned.kwargs())
    print_identity(outcome.identity, args.json)
    if not outcome.built:
        say(f"identity re-checked in {outcome.seconds:.1f}s (nothing rebuilt)")
    if opts is not None:
        cache.push_or_say(opts, pin, target, home, wheelhouse)
    return EXIT_OK


def run_check(args: argparse.Namespace, pin: Pin, target: str, home: Path, wheelhouse: Path,
              mirror: str | None, ext_dir: Path | None) -> int:
    from oracle_build import recipe
    from oracle_build.core import verdicts
    from oracle_build.core.errors import EXIT_NOT_REPRODUCED, Refused, as_data
    from oracle_build.core.log import fmt_seconds

    if args.rebuild or args.stop_after or args.cache or args.no_compiler_cache:
        raise Refused("--check rebuilds cold in a scratch folder and compares: it takes none "
                      "of --rebuild, --stop-after, --cache, --no-compiler-cache")
    outcome = recipe.check_rebuild(pin, target, home=home, wheelhouse_root=wheelhouse,
                                   mirror=mirror, externals_dir=ext_dir, no_gpu=args.no_gpu)
    if args.json:
        emit(json.dumps({"same": outcome.same, "seconds": round(outcome.seconds, 1),
                          "files": {n: {"installed": a, "rebuilt": b,
                                        "differs_in": outcome.where.get(n, [])}
                                    for n, (a, b) in outcome.compared.items()}}, indent=2))
    else:
        for name, (a, _rebuilt) in outcome.compared.items():
            if name in outcome.where:
                emit(f"  differs {as_data(name)}: " + ", ".join(
                    as_data(w) for w in outcome.where[name]))
            else:
                emit(f"  same    {as_data(name)}  sha256 {a}")
        emit(f"cold rebuild and comparison in {fmt_seconds(outcome.seconds)}")
        emit(verdicts.reproduced(outcome.same, len(outcome.compared)))
    return EXIT_OK if outcome.same else EXIT_NOT_REPRODUCED
