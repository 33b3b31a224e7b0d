"""What the commands' command lines share: the exit-code epilog, the --pin/--target and
--home options, the default pin's discovery, the oracle home, and the identity block."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oracle_build import devices
from oracle_build.contracts.pins import Pin
from oracle_build.core.env import tool_variable
from oracle_build.core.errors import PreflightFailed
from oracle_build.core.log import emit
from oracle_build.oracle.identity import Identity

Subparsers = Any  # argparse's _SubParsersAction (private, and generic in typeshed)

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
  11 verify: a golden's target is not this host's, or this CPU lacks its kernel variant's
     instructions (named; records still checked); ORACLE_NUMERICS_NOT_HELD
  12 the vLLM engine failed to start or to generate (log tail and path shown)
  13 the model's files are not the ones the spec or golden pins (sha256)
  14 an output could not be written (read-only folder, disk full, a path under a file)
  15 the oracle cache's registry failed (unreachable, 5xx, connection reset) after retries
  16 the registry refused the credentials (401/403), or none were found for it
  17 the oracle cache holds no artifact for this pin and target
  18 a cache artifact was refused: unsigned, untrusted key, bad signature, corrupted blob,
     a wheel not in the lock, a missing layer, or another pin's or target's artifact
  19 build --check: a cold rebuild of the source pin gave other compiled bytes (the files
     and their differing ELF sections named); ORACLE_NOT_REPRODUCED
  70 internal error: a bug in oracle-build, never a verdict (traceback in the log named)
  130 interrupted
"""

PINS_DIR = Path("pins")


def find_default_pin() -> Path:
    """The pin under ./pins (not its subfolders: pins/previous holds older pins kept for
    `diff`; not a pin that says `default = false`) that has a target for this host, GPU pins
    first. Two that fit equally well are an error, never a silent alphabetical choice."""
    from oracle_build import host
    from oracle_build.contracts.compiled import COMPILED_SUFFIX
    from oracle_build.contracts.pins import load_pin

    env = tool_variable("ORACLE_BUILD_PIN")
    if env:
        return Path(env)
    if not PINS_DIR.is_dir():
        raise PreflightFailed("no --pin given and no ./pins folder",
                              hint="run from the repository, or pass --pin FILE")
    here = host.host()
    candidates: list[tuple[int, Path]] = []
    for path in sorted(PINS_DIR.glob("*.toml")):
        if path.name.endswith(COMPILED_SUFFIX):  # a pin's compiled bytes, not a pin
            continue
        pin = load_pin(path)
        if not pin.model.default:
            continue
        for target in pin.model.targets.values():
            if devices.fits(target, here)[0]:
                candidates.append((devices.gpu_first(target), path))
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


def pin_and_target(args: argparse.Namespace, *, plan_only: bool = False) -> tuple[Pin, str]:
    """The pin (--pin, or the default) and its target (--target, or this host's)."""
    from oracle_build import host
    from oracle_build.contracts.pins import load_pin

    pin = load_pin(Path(args.pin) if args.pin else find_default_pin())
    if plan_only:
        if args.target:
            pin.target(args.target)
            return pin, args.target
        return pin, devices.choose_target(pin, host.host()) if len(pin.model.targets) != 1 \
            else next(iter(pin.model.targets))
    return pin, devices.choose_target(pin, host.host(), args.target,
                                      no_gpu=getattr(args, "no_gpu", False))


def homes(args: argparse.Namespace) -> tuple[Path, Path]:
    """The oracle home and the wheelhouse root (options, then environment, then defaults)."""
    from oracle_build.core.layout import default_home, default_wheelhouse

    home = Path(args.home).expanduser().resolve() if args.home else default_home()
    wheelhouse = (Path(args.wheelhouse).expanduser().resolve() if args.wheelhouse
                  else default_wheelhouse(home))
    return home, wheelhouse


def print_identity(ident: Identity, as_json: bool) -> None:
    """The identity block in the shape our users know (or its facts as JSON)."""
    if as_json:
        emit(json.dumps(ident.summary(), indent=2))
    else:
        emit(ident.block())


def add_home_args(p: argparse.ArgumentParser, *, with_json: bool = True,
                  json_help: str = "print the result as JSON") -> None:
    """The options every engine-running command shares."""
    if with_json:
        p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--home", help="oracle home (env ORACLE_BUILD_HOME)")
    p.add_argument("--wheelhouse", help=argparse.SUPPRESS)


def add_pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin", help="pin file (default: the pin under ./pins with a target for "
                   "this host; env ORACLE_BUILD_PIN)")
    p.add_argument("--target", help="target name in the pin (default: detected from the host)")
    p.add_argument("--home", help="where oracle venvs live (env ORACLE_BUILD_HOME, default "
                   "~/.cache/oracle-build)")
    p.add_argument("--wheelhouse", help="wheel store keyed by pin hash; put it on storage that "
                   "survives a reimage (env ORACLE_BUILD_WHEELHOUSE, default HOME/wheelhouse)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


VARIANT_HELP = ("hold every CPU engine of this run to this kernel variant (x86_64-avx2, "
                "x86_64-avx512, x86_64-avx512_bf16, x86_64-avx512_bf16-amx, or native: this "
                "host's own) instead of {default}; recorded like any setting")


def add_variant_arg(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--kernel-variant", metavar="VARIANT",
                   help=VARIANT_HELP.format(default=default))
