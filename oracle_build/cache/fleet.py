"""What a cache holds: every oracle in one repository, as `oracle-build list` shows it.

Each tag of the oracle form (``pin-<hash16>.<target>``) is read as a pull reads it, up to
the wheels: its manifest, its config (the pin and the build record) and its signed
provenance, each validated; the wheels are never fetched. One artifact that is damaged,
unsigned or signed by a key not trusted here is listed as such, and the listing goes on;
a registry that cannot be listed at all is the command's error (exit 15/16).

The point is the fleet view: a team with a GB10, a Thor and an AMD box sees which hosts'
oracles agree (the same numerics fingerprint, where the battery passed on each).
"""

from __future__ import annotations

import base64
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oracle_build.cache.options import CacheOptions
from oracle_build.cache.pull import find_envelope, validated
from oracle_build.cache.signing import load_trusted, verify
from oracle_build.contracts.cache import ARTIFACT_TYPE, Manifest, OracleConfig, Statement
from oracle_build.core.errors import (
    CacheRefused,
    NotCached,
    RegistryError,
    UntrustedSigner,
    as_data,
)

ORACLE_TAG = re.compile(r"^pin-[0-9a-f]{16}\.[A-Za-z0-9_-]{1,64}$")


@dataclass
class Listed:
    tag: str
    digest: str = ""
    pin_id: str = ""
    pin_hash: str = ""
    target: str = ""
    vllm: str = ""
    built_utc: str = ""
    built_on: str = ""  # the builder's machine: hostname, CPU model or GPU
    device: str = ""  # what identity saw: a GPU and its arch, or the CPU and its variant
    signed_by: str = ""  # a trusted key's name; "" when not trusted or unsigned
    signature: str = ""  # trusted | untrusted (keyids) | unsigned | refused
    content_fingerprint: str = ""
    numerics_fingerprint: str = ""
    compiled_fingerprint: str = ""  # a source oracle's compiled bytes (CompiledFacts)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def list_cache(opts: CacheOptions, trusted_file: Path) -> list[Listed]:
    reg = opts.registry(push=False)
    try:
        tags = reg.list_tags()
        return [describe(reg, str(opts.ref), tag, trusted_file)
                for tag in sorted(t for t in tags if ORACLE_TAG.match(t))]
    finally:
        reg.close()


def describe(reg: Any, where: str, tag: str, trusted_file: Path) -> Listed:
    out = Listed(tag=tag)
    try:
        data, out.digest = reg.get_manifest(tag)
        manifest: Manifest = validated(Manifest, data, f"{where}:{tag}")
        if manifest.artifactType != ARTIFACT_TYPE:
            raise CacheRefused(f"{where}:{tag} is a {manifest.artifactType}, not an oracle")
        config: OracleConfig = validated(OracleConfig, reg.blob_bytes(
            manifest.config.digest, manifest.config.size), f"{where}:{tag} config")
        out.pin_id, out.pin_hash, out.target = config.pin_id, config.pin_hash, config.target
        record = config.record
        out.built_utc = record.created_utc
        out.content_fingerprint = record.content_fingerprint
        out.compiled_fingerprint = record.compiled.fingerprint if record.compiled else ""
        out.vllm = str(record.identity.get("vllm") or "")
        out.built_on = built_on(record.host)
        out.device = str(record.identity.get("device") or "") + (
            f" ({record.identity['cpu_variant']})" if record.identity.get("cpu_variant")
            else "")
        if not tag.startswith(f"pin-{config.pin_hash[:16]}.") or \
                not tag.endswith(f".{config.target}"):
            out.problems.append(f"its config is of pin {config.pin_hash[:16]} target "
                                f"{config.target}: not this tag's")
        signature(reg, where, out, trusted_file)
    except (CacheRefused, NotCached, RegistryError) as exc:
        out.problems.append(exc.message)
        out.signature = out.signature or "refused"
    return out


def signature(reg: Any, where: str, out: Listed, trusted_file: Path) -> None:
    envelope = find_envelope(reg, where, out.digest)
    if envelope is None:
        out.signature = "unsigned"
        return
    trusted = load_trusted(trusted_file) if trusted_file.is_file() else {}
    try:
        out.signed_by, payload = verify(envelope, trusted, trusted_file=trusted_file)
        out.signature = "trusted"
    except UntrustedSigner:
        out.signature = "untrusted (" + ", ".join(as_data(s.keyid, 64)
                                                  for s in envelope.signatures) + ")"
        payload = base64.b64decode(envelope.payload)  # shown, not believed
    stmt: Statement = validated(Statement, payload, f"{where}:{out.tag} provenance statement")
    if not any(s.digest.get("sha256") == out.digest.split(":")[1] for s in stmt.subject):
        out.problems.append("its signed statement is about another manifest: replayed")
        out.signed_by, out.signature = "", "refused"
        return
    params = stmt.parameters
    if (params.get("pin_hash"), params.get("target")) != (out.pin_hash, out.target):
        out.problems.append(f"its signed statement is of pin {str(params.get('pin_hash'))[:16]}"
                            f" target {params.get('target')}, its config of another: replayed")
        out.signed_by, out.signature = "", "refused"
        return
    for item in stmt.predicate.get("runDetails", {}).get("byproducts", []):
        if isinstance(item, dict) and item.get("name") == "numerics_fingerprint":
            digest = item.get("digest", {}).get("sha256") if isinstance(item.get("digest"),
                                                                         dict) else None
            if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16,128}", digest):
                out.numerics_fingerprint = digest


def built_on(host: dict[str, Any]) -> str:
    gpus = host.get("gpus") or []
    if gpus and isinstance(gpus[0], dict):
        what = str(gpus[0].get("name") or "GPU")
    else:
        what = str(host.get("cpu_model") or host.get("machine") or "")
    return f"{host.get('hostname') or '?'}: {what}"


def render(entries: list[Listed], where: str) -> str:
    """The table, then which oracles agree (one numerics fingerprint, several targets)."""
    if not entries:
        return f"{as_data(where)}: no oracles"
    rows: list[tuple[str, ...]] = [("pin", "target", "vllm", "built", "built on", "device",
                                    "signed", "content", "compiled", "numerics")]
    for e in entries:
        rows.append((f"{e.pin_id} {e.pin_hash[:12]}", e.target, e.vllm, e.built_utc[:16],
                     e.built_on, e.device, e.signed_by or e.signature,
                     e.content_fingerprint[:12] or "-", e.compiled_fingerprint[:12] or "-",
                     e.numerics_fingerprint[:12] or "-"))
    rows = [tuple(as_data(c, 60) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"{as_data(where)}: {len(entries)} oracle(s)"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    for e in entries:
        for problem in e.problems:
            lines.append(f"  {as_data(e.tag)}: {as_data(problem, 300)}")
    built: dict[tuple[str, str], list[Listed]] = {}
    for e in entries:
        if e.compiled_fingerprint and e.signature == "trusted":
            built.setdefault((e.pin_hash, e.compiled_fingerprint), []).append(e)
    if built:
        lines.append("compiled bytes (source oracles, trusted artifacts only):")
        for (_pin, fp), members in sorted(built.items()):
            lines.append(f"  {fp[:16]}: " + ", ".join(
                as_data(f"{m.pin_id}/{m.target} ({m.built_on})", 120) for m in members)
                + (" the same bytes" if len(members) > 1 else ""))
    groups: dict[str, list[Listed]] = {}
    for e in entries:
        if e.numerics_fingerprint and e.signature == "trusted":
            groups.setdefault(e.numerics_fingerprint, []).append(e)
    if groups:
        lines.append("numerics (the battery's fingerprint, trusted artifacts only):")
        for fp, members in sorted(groups.items()):
            lines.append(f"  {fp[:16]}: " + ", ".join(
                as_data(f"{m.pin_id}/{m.target} ({m.device or m.built_on})", 120)
                for m in members) + (" agree" if len(members) > 1 else ""))
    return "\n".join(lines)
