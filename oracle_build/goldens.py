"""Writing goldens, and what a golden carries: the publish transaction (top-k file first,
golden.json linked last as the commit point, never overwritten) and the pin a golden carries,
unpacked into the home only once its hash is the recorded one. contracts/golden.py describes
the files; this module is the act of writing them, where the path checks live."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from oracle_build import devices
from oracle_build.contracts.base import printable, safe_name
from oracle_build.contracts.golden import (
    EmbeddedPin,
    Golden,
    Recorded,
    as_format2,
    golden_json,
)
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.contracts.targets import Target
from oracle_build.core.errors import BadInput, OutputFailed, Refused
from oracle_build.core.files import atomic_write_bytes, json_value
from oracle_build.core.layout import stamp


def publish(golden: Golden, path: Path, *, replace: bool) -> Path | None:
    """Write ``golden`` to ``path``, with its top-k sidecar first; golden.json, linked last
    and atomically, is the commit point, so a reader sees the whole golden or none. Never
    overwrites: with ``replace`` the old golden.json (and its sidecar) move to replaced/ and
    are kept. Returns where the old one went."""
    golden, sidecar = as_format2(golden)
    data = golden_json(golden).encode()
    try:
        return _publish(data, path, sidecar, replace=replace)
    except OSError as exc:
        raise OutputFailed(f"cannot write {path}: {exc.strerror or exc}; nothing was written "
                           "(the golden is published whole or not at all)",
                           hint="check the folder's permissions and free space") from None


def _old_sidecar(path: Path) -> str | None:
    try:
        ref = json_value(path.read_text(encoding="utf-8")).get("topk")
    except (OSError, ValueError, AttributeError):
        return None
    name = ref.get("file") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and "/" not in name and not name.startswith(".") \
        else None


def _publish(data: bytes, path: Path, sidecar: tuple[str, bytes] | None, *,
             replace: bool) -> Path | None:
    kept: Path | None = None
    if path.exists() and not replace:
        raise Refused(f"{path} exists; a golden is never overwritten",
                      hint="--replace --reason TEXT writes the new one and keeps the old "
                      "under replaced/")
    new_side: Path | None = None
    wrote_side = False
    if sidecar is not None:
        new_side = path.parent / sidecar[0]
        try:
            atomic_write_bytes(new_side, sidecar[1], overwrite=False)
            wrote_side = True
        except FileExistsError:  # the same rows (the name is their hash): keep, or mend
            if new_side.read_bytes() != sidecar[1]:
                atomic_write_bytes(new_side, sidecar[1], overwrite=True)
    old_side: str | None = None
    try:
        if path.exists():
            kept = path.parent / "replaced" / f"{path.stem}.{stamp()}.json"
            kept.parent.mkdir(parents=True, exist_ok=True)
            old_side = _old_sidecar(path)
            if old_side is not None and (path.parent / old_side).exists() and not (
                    kept.parent / old_side).exists():
                (kept.parent / old_side).hardlink_to(path.parent / old_side)
            path.rename(kept)
        atomic_write_bytes(path, data, overwrite=False)
    except FileExistsError:
        if wrote_side and new_side is not None:
            new_side.unlink(missing_ok=True)
        raise Refused(f"{path} appeared while this capture ran (another capture?); "
                      "nothing overwritten") from None
    except BaseException:
        if wrote_side and new_side is not None and kept is None:
            new_side.unlink(missing_ok=True)
        raise
    if old_side is not None and (new_side is None or old_side != new_side.name):
        (path.parent / old_side).unlink(missing_ok=True)  # kept under replaced/
    return kept


def golden_pin(rec: Recorded, path: Path, *, unpack_to: Path | None = None) -> Pin:
    """The golden's pin: the file its spec names relative to the golden's folder when
    it is there (the tree's current pin: if it changed since the capture, identity says
    so); otherwise the copy the golden carries (a golden copied into another tree),
    unpacked under ``unpack_to`` and checked against the recorded hash."""
    rel = rec.spec.get("pin")
    if not isinstance(rel, str):
        raise BadInput(path, [("spec.pin", "missing")])
    pin_path = (path.parent / rel).resolve()
    embedded = rec.oracle.embedded_pin
    if embedded is not None and unpack_to is not None:
        pin = unpack_pin(embedded, unpack_to, rec.oracle.pin_key, rec.oracle.pin_hash,
                         path)
        if not pin_path.exists():
            return pin
    if not pin_path.exists():
        raise BadInput(path, [("spec.pin", f"{pin_path} not found, and the golden carries "
                               "no copy of its pin (captured before goldens did)")],
                       hint="pass --pin FILE")
    return load_pin(pin_path)


def unpack_pin(embedded: EmbeddedPin, pins: Path, pin_key: str, pin_hash: str,
               golden_path: Path) -> Pin:
    """A golden's copy of its pin (and lock), as ``pins/<pin_key>/``: unpacked into a fresh
    folder under ``pins``, loaded and hashed there, and moved into place only when its hash is
    the one the golden records; otherwise removed, and nothing else was written. Names were
    checked as safe names when the golden was read."""
    for name in (pin_key, embedded.pin_name, embedded.lock_name):
        if name is not None:
            safe_name(name)  # the contract's rule, again where the path is made
    final = pins / pin_key
    try:
        pins.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{pin_key}.", dir=pins))
    except OSError as exc:
        raise OutputFailed(f"cannot write under {pins}: {exc.strerror or exc}") from None
    try:
        atomic_write_bytes(staging / embedded.pin_name, embedded.pin_toml.encode())
        if embedded.lock_name is not None and embedded.lock_text is not None:
            atomic_write_bytes(staging / embedded.lock_name, embedded.lock_text.encode())
        try:
            pin = load_pin(staging / embedded.pin_name)
        except BadInput as exc:
            raise BadInput(golden_path, [("oracle.embedded_pin", f"not a valid pin: "
                                          f"{exc.message}"[:600])]) from None
        if pin.content_hash != pin_hash:
            raise BadInput(golden_path, [("oracle.embedded_pin", f"hashes to "
                                          f"{pin.content_hash}; the golden records pin_hash "
                                          f"{pin_hash}")],
                           hint="the golden was edited or damaged: re-capture it")
        if final.is_dir() and not final.is_symlink():
            # the same bytes, not only the same hash: a pin's kernel_variant is outside its
            # hash, and this golden's copy is the one it was captured under
            try:
                same = (final / embedded.pin_name).read_bytes() == \
                    (staging / embedded.pin_name).read_bytes() and \
                    load_pin(final / embedded.pin_name).content_hash == pin_hash
            except (BadInput, OSError):
                same = False
            if same:
                return load_pin(final / embedded.pin_name)
            shutil.rmtree(final)  # another golden's copy, or a damaged earlier unpack (ours)
        elif final.exists() or final.is_symlink():
            final.unlink()
        os.rename(staging, final)
        return load_pin(final / embedded.pin_name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def run_variant(rec: Recorded, path: Path, target: Target,
                asked: str | None) -> str | None:
    """The CPU kernel variant a golden re-runs under: ``asked`` (--kernel-variant), else the
    one it recorded (read from its engine; for an older golden, its identity's), so a golden
    holds on every CPU that has its variant's instructions. None: the pin target's."""
    variant = asked or rec.kernel_variant
    if variant is None or not devices.module(target).BY_CPU_VARIANT:
        return None
    known = devices.known_variants(target)
    if variant not in known:
        where = ("--kernel-variant" if asked else "engine.kernel_variant.resolved"
                 if rec.engine.kernel_variant is not None else "oracle.identity.cpu_variant")
        raise BadInput(path if not asked else Path("--kernel-variant"),
                       [(where, f"{printable(variant)} is not a CPU kernel variant of an "
                         f"{target.machine} oracle (known: {', '.join(known)})")])
    return variant


def numbers_differ(old: Golden, new: Golden) -> tuple[list[str], int, int]:
    """Where ``new``'s numbers are not ``old``'s, bit for bit: every prompt's tokens, every
    leg's tokens, every top-k row (ids and logprobs, exactly). Returns the differences (at
    most 20, each naming prompt and position) and the tokens and top-k cells compared."""
    out: list[str] = []
    tokens = cells = 0
    if [p.id for p in old.prompts] != [p.id for p in new.prompts]:
        return ["the prompts are not the same ones"], 0, 0
    for i, (a, b) in enumerate(zip(old.prompts, new.prompts, strict=True)):
        tokens += len(a.token_ids)
        if list(a.token_ids) != list(b.token_ids):
            first = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False))
                          if x != y), min(len(a.token_ids), len(b.token_ids)))
            out.append(f"prompt {a.id}: tokens differ from position {first}")
            continue
        rows_a, rows_b = old.prompt_topk(i), new.prompt_topk(i)
        if (rows_a is None) != (rows_b is None):
            out.append(f"prompt {a.id}: top-k recorded in only one of them")
            continue
        for pos, (ra, rb) in enumerate(zip(rows_a or [], rows_b or [], strict=True)):
            pairs_a = [(int(t), float(lp)) for t, lp in ra]
            pairs_b = [(int(t), float(lp)) for t, lp in rb]
            cells += len(pairs_a)
            if pairs_a != pairs_b:
                out.append(f"prompt {a.id} position {pos}: top-k differs")
                break
    if old.legs is not None and new.legs is not None and old.legs.tokens != new.legs.tokens:
        out.append("the legs' tokens differ")
    return out[:20], tokens, cells
