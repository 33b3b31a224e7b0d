"""Command line: ``python -m oracle_build <command>`` (also the ``oracle-build`` script).

The only place that catches errors: each failure kind maps to its exit code
(see errors.py and the README). Results go to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from oracle_build import __version__
from oracle_build.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OracleBuildError,
    OracleMissing,
    PreflightFailed,
)
from oracle_build.core.log import say

EXIT_CODES_HELP = """exit codes:
  0  success (ORACLE_IDENTITY_OK / verify passed / ORACLE_NUMERICS_OK or a set captured)
  1  token drift (verify); ORACLE_NUMERICS_DRIFT (tokens or top-k logprobs)
  2  bad input: a pin, spec, golden or candidate file is invalid (file and field named)
  3  oracle identity mismatch (ORACLE_IDENTITY_OK is never printed then)
  4  configuration difference (verify)
  5  a build or install command failed (tail and log path shown)
  6  preflight: this host does not fit (target, disk, memory, Python, CUDA)
  7  no oracle built for this pin yet
  8  refused: would overwrite a golden, lock held with --no-wait, legs disagree
  9  source: shallow clone, dirty tree, wrong commit, unsafe git transport
  10 a pin value the step needs is recorded as unestablished
  11 verify: a golden's target or CPU kernel variant is not this host's (records still checked)
  12 the vLLM engine failed to start or to generate (log tail and path shown)
  13 the model's files are not the ones the spec or golden pins (sha256)
  14 an output could not be written (read-only folder, disk full, a path under a file)
  70 internal error: a bug in oracle-build, never a verdict (traceback in the log named)
  130 interrupted
"""

PINS_DIR = Path("pins")


def _find_default_pin() -> Path:
    """The pin under ./pins (not its subfolders: pins/previous holds older pins kept for
    `diff`) that has a target for this host, GPU pins first. Two that fit equally well are
    an error, never a silent alphabetical choice."""
    from oracle_build import host
    from oracle_build.contracts.pins import load_pin

    env = os.environ.get("ORACLE_BUILD_PIN")
    if env:
        return Path(env)
    if not PINS_DIR.is_dir():
        raise PreflightFailed("no --pin given and no ./pins folder",
                              hint="run from the repository, or pass --pin FILE")
    here = host.host()
    candidates: list[tuple[int, Path]] = []
    for path in sorted(PINS_DIR.glob("*.toml")):
        pin = load_pin(path)
        for target in pin.model.targets.values():
            if host.fits(target, here)[0]:
                candidates.append((0 if target.device != "cpu" else 1, path))
                break
    if not candidates:
        raise PreflightFailed(f"no pin under {PINS_DIR}/ has a target for this host",
                              hint="pass --pin FILE")
    candidates.sort()
    best = [path for rank, path in candidates if rank == candidates[0][0]]
    if len(best) > 1:
        raise PreflightFailed(f"several pins under {PINS_DIR}/ fit this host: "
                              f"{', '.join(str(p) for p in best)}",
                              hint="pass --pin FILE (or set ORACLE_BUILD_PIN), or move the "
                              "pins not meant as a default into a subfolder (pins/previous/)")
    return candidates[0][1]


def _pin_and_target(args: argparse.Namespace, *, plan_only: bool = False) -> tuple[object, str]:
    from oracle_build import host
    from oracle_build.contracts.pins import load_pin

    pin_path = Path(args.pin) if args.pin else _find_default_pin()
    pin = load_pin(pin_path)
    if plan_only:
        if args.target:
            pin.target(args.target)
            return pin, args.target
        return pin, host.choose_target(pin, host.host()) if len(pin.model.targets) != 1 \
            else next(iter(pin.model.targets))
    return pin, host.choose_target(pin, host.host(), args.target)


def _homes(args: argparse.Namespace) -> tuple[Path, Path]:
    from oracle_build.core.layout import default_home, default_wheelhouse

    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    wheelhouse = (Path(args.wheelhouse).expanduser().resolve() if args.wheelhouse
                  else default_wheelhouse(home))
    return home, wheelhouse


def cmd_build(args: argparse.Namespace) -> int:
    from oracle_build import build
    from oracle_build.contracts.pins import Pin

    pin, target = _pin_and_target(args, plan_only=args.dry_run)
    assert isinstance(pin, Pin)
    home, wheelhouse = _homes(args)
    mirror = args.mirror or os.environ.get("ORACLE_BUILD_VLLM_MIRROR")
    externals = args.externals or os.environ.get("ORACLE_BUILD_EXTERNALS")
    ext_dir = Path(externals).resolve() if externals else None
    if args.dry_run:
        p = build.plan(pin, target, home=home, wheelhouse_root=wheelhouse, mirror=mirror,
                       externals_dir=ext_dir,
                       checkout=Path(args.checkout).resolve() if args.checkout else None)
        if args.json:
            print(json.dumps(p.as_dict(), indent=2))
        else:
            print(p.render())
        return EXIT_OK
    outcome = build.build_oracle(pin, target, home=home, wheelhouse_root=wheelhouse,
                                 mirror=mirror, externals_dir=ext_dir,
                                 checkout=Path(args.checkout).resolve() if args.checkout else None,
                                 rebuild=args.rebuild,
                                 wait=not args.no_wait)
    _print_identity(outcome.identity, args.json)
    if not outcome.built:
        say(f"identity re-checked in {outcome.seconds:.1f}s (nothing rebuilt)")
    return EXIT_OK


def _print_identity(ident: object, as_json: bool) -> None:
    from oracle_build.identity import Identity

    assert isinstance(ident, Identity)
    if as_json:
        print(json.dumps(ident.summary(), indent=2))
    else:
        print(ident.block())


def cmd_identity(args: argparse.Namespace) -> int:
    from oracle_build import identity
    from oracle_build.contracts.pins import Pin
    from oracle_build.core.errors import IdentityMismatch
    from oracle_build.core.layout import oracle_path

    pin, target = _pin_and_target(args)
    assert isinstance(pin, Pin)
    home, _ = _homes(args)
    venv = Path(args.venv) if args.venv else oracle_path(home, pin.key)
    if not (venv.exists() or venv.is_symlink()):
        raise OracleMissing(f"no oracle for pin {pin.id} at {venv}",
                            hint="run `nox -s build_oracle` first")
    ident = identity.check(pin, pin.target(target), venv, deep=args.deep)
    _print_identity(ident, args.json)
    if args.deep:
        from oracle_build.core.files import atomic_write_json
        from oracle_build.core.layout import beside_record, build_record_path, utc_now

        hashed = ident.files.hashed if ident.files is not None else 0
        seconds = ident.files.seconds if ident.files is not None else 0.0
        say(f"deep check: {hashed} files hashed in {seconds:.1f}s")
        if build_record_path(venv).is_file() and not venv.is_symlink():
            # beside the build record, never in it: its sha256 is what goldens record
            atomic_write_json(beside_record(venv, "deep-identity"), {
                "utc": utc_now(), "ok": ident.ok, "files_hashed": hashed,
                "seconds": round(seconds, 3), "mismatches": len(ident.mismatches)})
    if not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(venv))
    return EXIT_OK


def cmd_lock(args: argparse.Namespace) -> int:
    from oracle_build.build.lock import generate_lock

    generate_lock(Path(args.pin))
    return EXIT_OK


def cmd_externals(args: argparse.Namespace) -> int:
    import platform

    from oracle_build.build.checkout import externals_block
    from oracle_build.core.errors import EXIT_UNESTABLISHED

    block = externals_block(Path(args.checkout), device=args.device,
                            machine=args.machine or platform.machine(),
                            mirrors=Path(args.externals) if args.externals else None)
    print(block.toml, end="")
    if block.missing:
        say("still unestablished (the build refuses them until filled):\n  "
            + "\n  ".join(block.missing))
        return EXIT_UNESTABLISHED
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from oracle_build.contracts import schemas

    for path in schemas.write():
        print(path)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from oracle_build.commands.verify import only_other_variants, verify
    from oracle_build.report import render

    home, _ = _homes(args)
    pin_override = None
    if args.oracle:
        from oracle_build.contracts.pins import load_pin

        pin_override = load_pin(Path(args.oracle))
    report = verify([Path(p) for p in args.goldens], home=home, pin_override=pin_override,
                    cross_target=args.cross_target)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(render(report))
    _ci_reports(report, args)
    if not args.goldens and only_other_variants(report) and DEFAULT_SPEC.is_dir():
        # The main job on a machine of another CPU kernel variant (AVX2 vs AVX-512 BF16 vs
        # AMX): the bundled goldens are not this host's numbers. End well, and prove what
        # this host can: capture the embedded default here, then verify that capture.
        from oracle_build.commands.capture import capture
        from oracle_build.core.layout import captures_dir

        say(f"the bundled goldens were captured under another CPU kernel variant (this host: "
            f"{_host_variant()}); proving what this host can instead: capturing "
            f"{DEFAULT_SPEC} here and verifying that capture")
        written = capture([DEFAULT_SPEC], home=home, out=captures_dir(home))
        own = verify(written, home=home)
        print(own.model_dump_json(indent=2) if args.json else render(own))
        _ci_reports(own, args)
        if own.exit_code == EXIT_OK:
            print(f"this host's own capture verified ({written[0]}); the bundled goldens are "
                  "NOT VERIFIABLE HERE (another CPU kernel variant), not drift")
        return own.exit_code
    return report.exit_code


def _ci_reports(report: object, args: argparse.Namespace) -> None:
    """--junit-xml, --summary-md, and $GITHUB_STEP_SUMMARY (appended) when set."""
    from oracle_build.contracts.reports import VerifyReport
    from oracle_build.core.files import atomic_write_bytes
    from oracle_build.report import junit_xml, summary_md

    assert isinstance(report, VerifyReport)
    if args.junit_xml:
        atomic_write_bytes(Path(args.junit_xml), junit_xml(report))
        say(f"junit xml: {args.junit_xml}")
    if args.summary_md:
        atomic_write_bytes(Path(args.summary_md), summary_md(report).encode())
        say(f"summary: {args.summary_md}")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(summary_md(report))
        except OSError as exc:
            say(f"could not append to GITHUB_STEP_SUMMARY ({step_summary}): {exc}")


def _host_variant() -> str | None:
    from oracle_build import host

    return host.host().cpu_variant


def cmd_numerics(args: argparse.Namespace) -> int:
    from oracle_build.commands.numerics import numerics
    from oracle_build.contracts.pins import Pin
    from oracle_build.contracts.reports import VERIFY_REPORT_SCHEMA, VerifyReport
    from oracle_build.report import render

    pin_path = Path(args.pin) if args.pin else _find_default_pin()
    pin, _target = _pin_and_target(argparse.Namespace(**{**vars(args), "pin": str(pin_path)}))
    assert isinstance(pin, Pin)
    home, _ = _homes(args)
    out = numerics(pin=pin, pin_path=pin_path, target=args.target, battery=Path(args.battery),
                   home=home, only=args.only or None)
    unusual = [v for v in out.verified if v.status != "pass" or not v.logprobs_identical]
    if unusual:  # the whole verify report for members that did not pass bit for bit
        print(render(VerifyReport(report_schema=VERIFY_REPORT_SCHEMA, created_utc="",
                                  exit_code=out.exit_code, goldens=unusual)))
    for v in out.verified:
        logprobs = {True: "top-k logprobs bit-identical", False: "top-k logprobs DIFFER",
                    None: "nothing run"}[v.logprobs_identical]
        print(f"  {v.name:<12} {v.status.upper():<10} {v.summary.split(';')[0]}; {logprobs}")
    if out.captured:
        print(f"captured the golden set for this pin, target and CPU kernel variant: "
              f"{', '.join(out.captured)}")
        print(f"  commit it: git add {out.set_dir}")
    if out.line:
        print(out.line + (f" {out.fingerprint}" if out.fingerprint else ""))
    for line in out.drift:
        print(line)
    if args.only:
        say("(fingerprint over the members run with --only, not the whole battery)")
    return out.exit_code


def cmd_diff(args: argparse.Namespace) -> int:
    from oracle_build.commands.diff import diff, render
    from oracle_build.contracts.pins import load_pin

    home, _ = _homes(args)
    report, record = diff(load_pin(Path(args.pin_a)), load_pin(Path(args.pin_b)),
                          [Path(p) for p in args.goldens], home=home, target=args.target)
    print(report.model_dump_json(indent=2) if args.json else render(report, record))
    return EXIT_OK


def cmd_margin(args: argparse.Namespace) -> int:
    from oracle_build.commands.analyze import margin

    home, _ = _homes(args)
    report = margin(Path(args.golden), args.prompt, args.position, home=home,
                    candidate=Path(args.candidate) if args.candidate else None, k=args.k)
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(f"{report['golden']} prompt {report['prompt']} position {report['position']} "
          f"(teacher-forced on the {report['prefix']}'s prefix, prefix caching off)")
    for rank, (tok, lp) in enumerate(report["topk"], start=1):
        marks = []
        if tok == report.get("golden_token"):
            marks.append("golden")
        if tok == report.get("candidate_token"):
            marks.append("candidate")
        print(f"  {rank:>2}. token {tok:>7}  logprob {lp:+.6f}  {' '.join(marks)}")
    m = report["top2_margin_nats"]
    print(f"top-2 margin: {'n/a' if m is None else f'{m:.6f} nats'}")
    if "candidate_gap_mnats" in report:
        print(f"candidate gap: {report['candidate_gap_mnats']} mnats")
    return EXIT_OK


def cmd_determinism(args: argparse.Namespace) -> int:
    from oracle_build.commands.analyze import determinism

    home, _ = _homes(args)
    report = determinism(Path(args.source), home=home, legs=args.legs)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for leg in report["per_leg"]:
            extra = (f", matches golden {leg['matches_golden']}/{report['prompts']}"
                     if "matches_golden" in leg else "")
            print(f"leg {leg['leg']}: matches leg 0 {leg['matches_leg0']}/{report['prompts']}"
                  + extra)
        print(("DETERMINISTIC" if report["deterministic"] else "NON-DETERMINISTIC")
              + f" under this configuration ({report['legs']} legs, one process)")
    return EXIT_OK if report["deterministic"] else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from oracle_build import judge
    from oracle_build.commands.compare import compare_candidate
    from oracle_build.contracts.candidate import load_candidate
    from oracle_build.contracts.golden import load_golden

    golden_path = Path(args.golden)
    golden = load_golden(golden_path)
    judge.admit_gate(golden, golden_path)  # the gate verify applies, and no other
    cand_path = Path(args.candidate)
    results = compare_candidate(golden, load_candidate(cand_path), cand_path)
    summary = judge.summarize(results)
    passed = judge.gate_passes(golden.gate.kind, results)
    if args.json:
        print(json.dumps({"golden": args.golden, "candidate": args.candidate,
                          "results": [r.as_dict() for r in results],
                          "summary": summary.line(golden.gate.kind), "passed": passed},
                         indent=2))
    else:
        for r in results:
            where = "match" if r.index is None else (
                f"diverges at {r.index}: golden {r.golden_token}, candidate {r.new_token}, "
                f"golden margin "
                + ("outside top-k" if r.golden_margin is None else f"{r.golden_margin:.4f}")
                + f" -> {r.kind}")
            ids = "" if r.prompt_ids_equal else "  PROMPT IDS DIFFER"
            print(f"  {r.prompt}: {where}{ids}")
        print(summary.line(golden.gate.kind))
    return EXIT_OK if passed else 1


def cmd_import(args: argparse.Namespace) -> int:
    from oracle_build.interop.vllmcpp import import_to

    dest = import_to(Path(args.path), Path(args.out), name=args.name)
    say(f"imported {args.path} -> {dest}")
    print(dest)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from oracle_build.contracts.golden import golden_file, load_golden
    from oracle_build.interop.vllmcpp import export

    path = golden_file(Path(args.golden))
    dest = export(load_golden(path), path, Path(args.dir))
    say(f"exported {path} -> {dest} (vllm.cpp battery + attributed oracle.json)")
    print(dest)
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from oracle_build.commands.explain import explain, parse_vary

    home, _ = _homes(args)
    report, dest = explain(Path(args.golden), home=home,
                           vary=parse_vary(args.vary) if args.vary else None,
                           budget=args.budget, pin_path=Path(args.pin) if args.pin else None,
                           model_path=Path(args.model) if args.model else None,
                           out=Path(args.out) if args.out else None)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        for c in report.candidates:
            if c.status != "ok":
                print(f"  {c.name}: {c.status.upper().replace('_', ' ')}"
                      + (f" ({c.error})" if c.error else ""))
                continue
            cells = []
            for p in c.prompts:
                if p.reproduces:
                    cells.append(f"{p.id} =")
                else:
                    m = "outside top-k" if p.golden_margin is None else f"{p.golden_margin:.3f}"
                    cells.append(f"{p.id} @{p.index} ({m}, {p.kind})")
            print(f"  {c.name}: " + "; ".join(cells))
        print(report.answer)
        print(f"engine starts: {report.engine_starts} (budget {report.budget}); record: {dest}")
    return EXIT_OK


DEFAULT_SPEC = Path("goldens/tiny-llama-greedy")


def cmd_capture(args: argparse.Namespace) -> int:
    from oracle_build.commands.capture import capture
    from oracle_build.core.layout import captures_dir

    home, _ = _homes(args)
    out = Path(args.out).resolve() if args.out else None
    paths = [Path(p) for p in args.specs]
    if not paths:
        # The embedded default. Its committed golden is never overwritten, so a capture
        # with no arguments writes a fresh one under the oracle home instead.
        paths = [DEFAULT_SPEC]
        if out is None and (DEFAULT_SPEC / "golden.json").exists() and not args.replace:
            out = captures_dir(home)
            say(f"no spec given: capturing the embedded default {DEFAULT_SPEC} into {out} "
                "(its committed golden is never overwritten)")
    written = capture(paths, home=home, replace=args.replace,
                      allow_nondeterministic=args.allow_nondeterministic,
                      target=args.target, out=out, reason=args.reason)
    for path in written:
        print(path)
    return EXIT_OK


def _add_home_args(p: argparse.ArgumentParser, *, with_json: bool = True,
                   json_help: str = "print the result as JSON") -> None:
    """The options every engine-running command shares."""
    if with_json:
        p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--home", help="oracle home (env ORACLE_BUILD_HOME)")
    p.add_argument("--wheelhouse", help=argparse.SUPPRESS)


def _add_pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin", help="pin file (default: the pin under ./pins with a target for "
                   "this host; env ORACLE_BUILD_PIN)")
    p.add_argument("--target", help="target name in the pin (default: detected from the host)")
    p.add_argument("--home", help="where oracle venvs live (env ORACLE_BUILD_HOME, default "
                   "~/.cache/oracle-build)")
    p.add_argument("--wheelhouse", help="wheel store keyed by pin hash; put it on storage that "
                   "survives a reimage (env ORACLE_BUILD_WHEELHOUSE, default HOME/wheelhouse)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="oracle-build",
        description="Rebuild a pinned vLLM oracle from its pin, prove its identity, capture "
        "and verify goldens.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"oracle-build {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser(
        "build", aliases=["build-oracle"],
        help="build the pinned oracle venv and assert its identity",
        description="Build the pin's oracle into an isolated venv for this host's target, in "
        "a staging folder, and move it into place only after its identity passes. With the "
        "venv already in place: re-check identity (seconds).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_pin_args(b)
    b.add_argument("--mirror", help="git source for vLLM instead of the pin's URL: a local "
                   "mirror/clone folder or a .bundle file (env ORACLE_BUILD_VLLM_MIRROR)")
    b.add_argument("--externals", help="folder holding a local git mirror of each CMake "
                   "external, named as in the pin (env ORACLE_BUILD_EXTERNALS)")
    b.add_argument("--checkout", help="a vLLM checkout at the pinned commit to plan from: its "
                   "externals, precompiled switches, build requirements and Rust front end "
                   "are read now (the build reads them again from its own clone)")
    b.add_argument("--rebuild", action="store_true",
                   help="replace the oracle even if one is in place (e.g. after drift)")
    b.add_argument("--dry-run", action="store_true",
                   help="print every step, command and environment variable; run nothing")
    b.add_argument("--no-wait", action="store_true",
                   help="if another build of this pin holds the lock, fail instead of waiting")
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("identity", help="check an oracle's identity against its pin",
                       epilog=EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_pin_args(i)
    i.add_argument("--venv", help="check this venv instead of the pin's built one")
    i.add_argument("--deep", action="store_true",
                   help="hash every file instead of only those whose size or mtime changed "
                   "(for a host whose clock or filesystem cannot be trusted); the build record "
                   "keeps when it last ran")
    i.set_defaults(func=cmd_identity)

    lk = sub.add_parser("lock", help="regenerate a pin's hash-locked dependency list")
    lk.add_argument("--pin", required=True)
    lk.set_defaults(func=cmd_lock)

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
    ex.add_argument("--device", choices=["cuda", "cpu", "rocm"], default="cuda",
                    help="the build's device (default cuda)")
    ex.add_argument("--machine", choices=["x86_64", "aarch64"],
                    help="the build host's machine (default: this host's)")
    ex.add_argument("--externals", metavar="MIRRORS",
                    help="folder of local git mirrors, one per external, named as printed")
    ex.set_defaults(func=cmd_externals)

    c = sub.add_parser(
        "capture", help="run the oracle and write goldens that record their full configuration",
        description="For each spec (goldens/<name> or its spec.toml): check the oracle's "
        "identity, start the engine once per distinct configuration, run every leg, and "
        "publish goldens/<name>/golden.json atomically. Never overwrites a golden. With no "
        "spec: the embedded default (goldens/tiny-llama-greedy), written under the oracle "
        "home when its committed golden exists.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("specs", nargs="*", help="spec folders or spec.toml files")
    c.add_argument("--out", help="write goldens to OUT/<name>/golden.json instead of next to "
                   "their spec")
    c.add_argument("--replace", action="store_true",
                   help="replace an existing golden (needs --reason); the old one is kept "
                   "under replaced/")
    c.add_argument("--reason", help="why the golden is re-baselined (a pin bump, a fixed "
                   "spec): recorded in the new golden with the replaced golden's oracle")
    c.add_argument("--allow-nondeterministic", action="store_true",
                   help="publish even if the legs disagree, marked non-deterministic (never "
                   "usable for a strict gate)")
    c.add_argument("--target", help="pin target (default: detected)")
    _add_home_args(c, with_json=False)
    c.set_defaults(func=cmd_capture)

    v = sub.add_parser(
        "verify", help="re-run goldens: identity, then configuration, then tokens",
        description="For each golden (default: every goldens/*/golden.json): check the "
        "oracle's identity against the golden's, re-run under the golden's recorded "
        "configuration (one engine start per distinct configuration), report configuration "
        "differences before any token result, then per prompt the first divergence and the "
        "margin there, classified near-tie or real, and apply the golden's gate. Never "
        "modifies a golden.", epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("goldens", nargs="*", help="golden folders or golden.json files")
    v.add_argument("--oracle", "--pin", metavar="PIN", dest="oracle",
                   help="run the goldens on this pin's built oracle instead of their own: "
                   "identity differences first (ORACLE DIFFERS, package by package), then the "
                   "configuration and the tokens and margins, not adjudicable; exit 3. "
                   "Without it: the pin file the golden's spec names, or, when that file is "
                   "not there, the copy of its pin the golden carries, found in the home by "
                   "its hash (nothing is built)")
    v.add_argument("--junit-xml", metavar="PATH",
                   help="also write a JUnit XML report (one test case per golden prompt) for "
                   "CI test reporters")
    v.add_argument("--summary-md", metavar="PATH",
                   help="also write a Markdown summary (identity, configuration, token table, "
                   "gate); appended to $GITHUB_STEP_SUMMARY too when that is set")
    v.add_argument("--cross-target", action="store_true",
                   help="run goldens recorded for another target on this host's target of "
                   "their pin (or of --oracle's): the target difference is reported at "
                   "identity level, tokens shown, not adjudicable; exit 3")
    _add_home_args(v, json_help="machine-readable report "
                   "(schema: oracle_build/contracts/schemas/verify-report.schema.json)")
    v.set_defaults(func=cmd_verify)

    nm = sub.add_parser(
        "numerics", help="the kernel battery: ORACLE_NUMERICS_OK when this oracle computes "
        "the same numbers as its golden set",
        description="One generated model per kernel family our users' models use (Llama "
        "fp32 and bf16, Qwen3, Qwen3-MoE, Gemma2, Nemotron-H hybrid Mamba2, Qwen3-Next gated "
        "delta net + MoE). The golden set for this pin, target and CPU kernel variant "
        "(BATTERY/sets/<pin key>/<target>/<variant>/) is verified: ORACLE_NUMERICS_OK only "
        "when every prompt is token-exact and every top-k logprob bit-identical, else "
        "ORACLE_NUMERICS_DRIFT with architecture, prompt, position and margin (exit 1). "
        "With no set for this key (a new gate host): it is captured, and the folder to "
        "commit is printed. Either way the set's fingerprint (sha256 over its tokens and "
        "logprobs) is printed and kept in the oracle's build record.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_pin_args(nm)
    nm.add_argument("--battery", default="goldens/numerics",
                    help="the battery folder: specs/ and sets/ (default goldens/numerics)")
    nm.add_argument("--only", nargs="+", metavar="NAME",
                    help="only these members (spec names in BATTERY/specs)")
    nm.set_defaults(func=cmd_numerics)

    df = sub.add_parser(
        "diff", help="what moves between two oracles, over goldens' recorded configurations",
        description="Runs both pins' built oracles (each must pass its own identity), one "
        "engine at a time, under each golden's recorded prompts, batch composition, sampling "
        "and engine arguments (default: every goldens/*/golden.json), and reports per golden "
        "and prompt the first divergence between A and B with both margins, classed exact "
        "tie, near-tie or real, whether the top-k logprobs are bit-identical, the settings "
        "the two engines resolved differently, and the package diff; it ends with one line "
        "per golden: same / moved at near-ties only / moved. The record (schema: "
        "oracle_build/contracts/schemas/diff.schema.json) is written under HOME/diffs/ for a "
        "pin-bump pull request to attach. Nothing under goldens/ is written. Exit 0 whatever "
        "moved (a diff is a report, not a gate).",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    df.add_argument("pin_a", metavar="PIN_A", help="the reference pin (e.g. the current one)")
    df.add_argument("pin_b", metavar="PIN_B", help="the pin compared with it")
    df.add_argument("goldens", nargs="*", help="golden folders or golden.json files")
    df.add_argument("--target", help="pin target (default: detected)")
    _add_home_args(df, json_help="print the record (diff.schema.json) instead of the text")
    df.set_defaults(func=cmd_diff)

    mg = sub.add_parser("margin", help="teacher-forced top-k and top-2 margin at one position",
                        description="Re-run the golden's configuration (prefix caching off) on "
                        "prompt ids + the golden's tokens before POSITION, one new token, "
                        "logprobs k; print the top-k and the top-2 margin in nats. With "
                        "--candidate, on the candidate's prefix, and its gap in mnats.",
                        epilog=EXIT_CODES_HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    mg.add_argument("golden")
    mg.add_argument("prompt", help="prompt id or index")
    mg.add_argument("position", type=int)
    mg.add_argument("--candidate", help="candidate output file (see `compare`)")
    mg.add_argument("-k", type=int, default=20, help="top-k (default 20)")
    _add_home_args(mg)
    mg.set_defaults(func=cmd_margin)

    dt = sub.add_parser("determinism", help="K legs of a golden's (or spec's) configuration "
                        "in one process: is the oracle deterministic under it?",
                        epilog="exit 0 deterministic, 1 not; other codes as below\n\n"
                        + EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    dt.add_argument("source", help="golden folder/json, or spec folder/toml")
    dt.add_argument("--legs", type=int, default=5)
    _add_home_args(dt)
    dt.set_defaults(func=cmd_determinism)

    cp = sub.add_parser("compare", help="offline: another engine's output against a golden",
                        description="Per prompt: the first divergence, the golden's margin "
                        "there from its recorded top-k, near-tie or real; no oracle needed. "
                        "Exit 0 when the golden's gate passes, 1 on drift, 2 on bad input.",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("golden")
    cp.add_argument("candidate", help="JSON: {candidate_schema: 1, prompts: [{id?, "
                    "prompt_token_ids, token_ids, topk?}]}")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(func=cmd_compare)

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
    im.set_defaults(func=cmd_import)

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
    exp.set_defaults(func=cmd_export)

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
    _add_home_args(xp)
    xp.set_defaults(func=cmd_explain)

    sc = sub.add_parser("schema", help="regenerate the committed JSON Schemas "
                        "(oracle_build/schemas/*.json) from the models")
    sc.set_defaults(func=cmd_schema)

    for register in _extra_commands:
        register(sub)
    return top


_extra_commands: list[Callable[[argparse._SubParsersAction], None]] = []  # type: ignore[type-arg]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except OracleBuildError as exc:
        say(exc.render())
        return exc.exit_code
    except KeyboardInterrupt:
        say("oracle-build: interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of ours: never exit 1 (drift), never a bare traceback
        log = _internal_error_log(args, exc)
        say(f"oracle-build: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            f"(a bug in oracle-build, not a verdict; traceback in {log})")
        return EXIT_INTERNAL


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _internal_error_log(args: argparse.Namespace, exc: BaseException) -> str:
    """The traceback, written under the home's logs (or the temp folder if that fails)."""
    import tempfile
    import traceback

    from oracle_build.core.layout import default_home, log_path

    text = (f"oracle-build {__version__}: internal error\nargv: {sys.argv}\n\n"
            + "".join(traceback.format_exception(exc)))
    try:
        home = Path(args.home).expanduser().resolve() if getattr(args, "home", None) \
            else default_home()
        path = log_path(home, "internal-error", str(getattr(args, "command", "cli")))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)
    except Exception:
        fd, name = tempfile.mkstemp(prefix="oracle-build-internal-error-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return name


if __name__ == "__main__":
    sys.exit(main())
