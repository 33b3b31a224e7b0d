"""numerics: does this oracle compute the same numbers, across the kernel families our
users' models use?

The battery (goldens/numerics/specs/): one generated model per kernel family. A golden set
is keyed by the pin's hash, the target and the CPU kernel variant the oracle runs
(goldens/numerics/sets/<pin key>/<target>/<variant>/<name>/). With a set for this oracle:
verify every member; ORACLE_NUMERICS_OK only when every prompt is token-exact and every
recorded top-k logprob is bit-identical, otherwise ORACLE_NUMERICS_DRIFT naming the
architecture, prompt, position and margin (exit 1); a logprob-only difference on a golden
captured on another CPU model is ORACLE_NUMERICS_NOT_HELD (exit 11), never drift. The
variant is the one the pin holds (``--kernel-variant`` for another), so a set captured on
one CPU model is verified on every CPU with that variant's instructions. Without one (the
first build on a new gate host): capture it and say which folder to commit. A one-line
fingerprint (sha256 over the set's tokens and logprobs) is printed and written to the
oracle's build record, so two hosts compare in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle_build import devices, host
from oracle_build.checkpoints import families
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.record import NumericsRecord
from oracle_build.contracts.reports import GoldenVerdict
from oracle_build.contracts.spec import load_spec
from oracle_build.core import verdicts
from oracle_build.core.errors import (
    EXIT_DRIFT,
    EXIT_NOT_HERE,
    EXIT_OK,
    BadInput,
    PreflightFailed,
    as_data,
)
from oracle_build.core.files import atomic_write_bytes, atomic_write_json, read_text, sha256_file
from oracle_build.core.layout import beside_record, build_record_path, utc_now
from oracle_build.core.log import say
from oracle_build.oracle import inventory
from oracle_build.oracle.opening import Oracle, Oracles
from oracle_build.services import capture as capture_svc
from oracle_build.services import verify as verify_svc

OK_LINE = verdicts.NUMERICS_OK
DRIFT_LINE = verdicts.NUMERICS_DRIFT
NOT_HELD_LINE = verdicts.NUMERICS_NOT_HELD
CAPTURED_LINE = verdicts.NUMERICS_CAPTURED
PIN_LINE = re.compile(r'^pin\s*=\s*"[^"\n]*"\s*$', re.M)


@dataclass
class Outcome:
    set_dir: Path
    verified: list[GoldenVerdict] = field(default_factory=list)
    captured: list[str] = field(default_factory=list)
    fingerprint: str | None = None
    exit_code: int = EXIT_OK
    line: str = OK_LINE
    drift: list[str] = field(default_factory=list)
    # members whose tokens are exact but whose logprobs differ, captured on another CPU model:
    # bit-identity under the held variant does not carry across those CPUs (never drift)
    not_held: list[str] = field(default_factory=list)


def variant_of(oracle: Oracle) -> str:
    """The third part of a golden set's key: the CPU kernel variant on CPU targets, the
    device (name and sm) on GPU targets."""
    if devices.module(oracle.target).BY_CPU_VARIANT:
        variant = oracle.identity.cpu_variant
        if not variant:
            raise BadInput(str(oracle.venv.path), [(
                "cpu_kernels.variant", "the identity probe could not tell which CPU kernel "
                "library vLLM loaded; a golden set cannot be keyed")])
        return variant
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", oracle.identity.device_label()).strip("-")


def set_dir(battery: Path, pin: Pin, target: str, variant: str) -> Path:
    return battery / "sets" / pin.key / target / variant


def battery_specs(battery: Path, only: list[str] | None) -> list[Path]:
    specs = sorted((battery / "specs").glob("*.toml"))
    if not specs:
        raise BadInput(battery / "specs", "no battery specs (<name>.toml) in this folder")
    if only:
        known = {p.stem for p in specs}
        unknown = sorted(set(only) - known)
        if unknown:
            raise BadInput(battery / "specs", [("--only", f"no battery member {', '.join(unknown)}"
                                                f" (members: {', '.join(sorted(known))})")])
        specs = [p for p in specs if p.stem in only]
    for path in specs:
        spec = load_spec(path)  # every spec validated before anything runs
        if spec.name != path.stem:
            raise BadInput(path, [("name", f"{spec.name!r}: a battery spec's name is its file "
                                   f"name ({path.stem!r})")])
    return specs


def place_spec(spec_path: Path, member_dir: Path, pin_path: Path) -> Path:
    """Copy a battery spec into the set, its pin line pointing at ``pin_path`` from there."""
    text = read_text(spec_path)
    rel = os.path.relpath(pin_path.resolve(), member_dir.resolve())
    new, count = PIN_LINE.subn(f'pin = "{rel}"', text, count=1)
    if count != 1:
        raise BadInput(spec_path, [("pin", "no `pin = \"...\"` line to point at the pin")])
    dest = member_dir / "spec.toml"
    member_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dest, new.encode())
    return dest


def fingerprint(goldens: list[Path]) -> str:
    """sha256 over the set's tokens and top-k logprobs, members by name: two hosts whose
    fingerprints are equal computed the same numbers, bit for bit."""
    data = []
    for path in sorted(goldens, key=lambda p: p.parent.name):
        golden = load_golden(path)
        data.append([golden.name, [[p.id, p.token_ids, _rows(golden.prompt_topk(i))]
                                   for i, p in enumerate(golden.prompts)]])
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _rows(rows: Any) -> list[list[Any]] | None:
    """Rows as JSON lists, whether held inline (format 1) or in a sidecar (format 2)."""
    return None if rows is None else [[[int(t), float(lp)] for t, lp in row] for row in rows]


def drift_lines(v: GoldenVerdict) -> list[str]:
    out = []
    for t in v.tokens:
        if t.index is None:
            continue
        margin = t.golden_margin
        out.append(f"  {v.name}: prompt {t.prompt} position {t.index}: golden "
                   f"token {t.golden_token}, now {t.new_token} (golden margin "
                   f"{'unknown' if margin is None else f'{margin:.4f}'} nats, "
                   f"{t.kind})")
    d = v.logprobs_difference
    if d and not out:
        delta = d.get("max_abs_delta")
        out.append(f"  {v.name}: prompt {d['prompt']} position {d['position']}: tokens "
                   f"exact, top-k logprobs differ (max |delta| "
                   f"{'n/a' if delta is None else f'{delta:.3g}'} nats; golden {d['golden']}, "
                   f"now {d['current']})")
    return out


def numerics(*, pin: Pin, pin_path: Path, target: str | None, battery: Path, home: Path,
             only: list[str] | None = None, kernel_variant: str | None = None) -> Outcome:
    """``kernel_variant``: the CPU kernel variant whose set is verified (default: the pin
    target's); each set's goldens re-run under the variant they recorded."""
    specs = battery_specs(battery, only)
    target_name = devices.choose_target(pin, host.host(), target)
    lacking = host.missing_instructions(pin.target(target_name), kernel_variant)
    if lacking:
        raise PreflightFailed(
            f"CPU kernel variant {devices.held_name(pin.target(target_name), kernel_variant)} "
            f"needs instructions this host's CPU lacks: {', '.join(lacking)}",
            hint="its golden set is checked on a host with them; --kernel-variant chooses "
            "another set")
    oracles = Oracles(home)
    oracle = oracles.get(pin, target_name, variant=kernel_variant)  # identity first (exit 3)
    where = set_dir(battery, pin, target_name, variant_of(oracle))
    out = Outcome(where)
    say(f"numerics battery: {len(specs)} members; golden set {where}")
    # every member's layout read from the oracle's transformers in one run, not one each
    families.layouts(list(families.FAMILIES), oracle.venv,
                     str(oracle.identity.summary()["transformers"]), home)
    present = [s for s in specs if (where / s.stem / "golden.json").exists()]
    missing = [s for s in specs if s not in present]
    if present:
        report = verify_svc.verify([where / s.stem / "golden.json" for s in present],
                                   home=home, oracles=oracles)
        out.verified = report.goldens
        out.exit_code = report.exit_code
    if missing:
        say(f"no golden for {', '.join(s.stem for s in missing)} in this set: capturing "
            f"{'them' if len(missing) > 1 else 'it'} (first run for this pin, target and "
            "variant)")
        placed = [place_spec(s, where / s.stem, pin_path) for s in missing]
        capture_svc.capture(placed, home=home, target=target_name, oracles=oracles,
                            kernel_variant=kernel_variant)
        out.captured = [s.stem for s in missing]
    out.drift, out.not_held = differences(out.verified)
    if out.drift:
        out.exit_code, out.line = EXIT_DRIFT, DRIFT_LINE
    elif out.not_held and out.exit_code == EXIT_OK:
        out.exit_code, out.line = EXIT_NOT_HERE, NOT_HELD_LINE
    elif out.exit_code != EXIT_OK:
        out.line = ""  # identity / configuration / not-here: verify's report says which
    elif not present:
        out.line = CAPTURED_LINE
    out.fingerprint = fingerprint([where / s.stem / "golden.json" for s in specs])
    if out.exit_code == EXIT_OK or out.drift or out.not_held:
        record(oracle, out, complete=only is None)
    return out


def differences(verified: list[GoldenVerdict]) -> tuple[list[str], list[str]]:
    """The members that drifted, and those whose tokens are exact but whose logprobs differ
    on a golden captured on another CPU model: bit-identity under the held variant does
    not carry across those two CPUs for that family (reported as such, never as drift)."""
    drift: list[str] = []
    not_held: list[str] = []
    for v in verified:
        if v.status == "pass" and v.logprobs_identical is False:
            other_cpu = captured_elsewhere(Path(v.path))
            if other_cpu:
                not_held += [f"{line} [not held across CPU models: {other_cpu}]"
                             for line in drift_lines(v)] or [f"  {v.name}: {other_cpu}"]
                continue
        if v.status == "drift" or (v.status == "pass" and v.logprobs_identical is False):
            drift += drift_lines(v) or [f"  {v.name}: {v.why or v.status}"]
    return drift, not_held


def captured_elsewhere(golden_path: Path) -> str:
    """'' when the golden was captured on this host's CPU model; else which CPU it was
    (a golden from before CPU models were recorded: unrecorded)."""
    golden = load_golden(golden_path)
    recorded_host = golden.run.host if golden.run is not None else {}
    here = host.cpu_model()
    theirs = recorded_host.get("cpu_model")
    if theirs and theirs == here["cpu_model"] and recorded_host.get("cpu_vendor") == here[
            "cpu_vendor"]:
        return ""
    shown = as_data(str(theirs), 200) if theirs else "a CPU model it did not record"
    return (f"captured on {shown}, this host "
            f"{here['cpu_model'] or 'unknown'}")


def record(oracle: Oracle, out: Outcome, *, complete: bool) -> None:
    """The fingerprint and verdict, beside the oracle (never in it), bound to its anchor."""
    if not build_record_path(oracle.venv.path).is_file() or oracle.venv.path.is_symlink():
        return
    path = beside_record(oracle.venv.path, "numerics")
    anchor = inventory.anchor_path(oracle.venv.path)
    data = NumericsRecord(utc=utc_now(), set=str(out.set_dir),
                          anchor_sha256=sha256_file(anchor) if anchor.is_file() else None,
                          verdict=out.line or f"exit {out.exit_code}",
                          fingerprint=out.fingerprint, whole_battery=complete,
                          captured=out.captured, verified=[v.name for v in out.verified])
    atomic_write_json(path, data.model_dump(mode="json"))
