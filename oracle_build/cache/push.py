"""Push an oracle that passed identity, blob by blob, then its manifest, its signed
provenance, and the tag last (the commit point)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from oracle_build.cache.artifact import canonical_json, document
from oracle_build.cache.options import CacheOptions, PushResult
from oracle_build.cache.ref import CacheRef, attestation_tag, tag_for
from oracle_build.cache.registry import Registry
from oracle_build.cache.signing import SigningKey
from oracle_build.contracts.cache import (
    ANNOTATION_ORIGIN,
    ANNOTATION_TITLE,
    ARTIFACT_TYPE,
    BUILD_TYPE,
    CONFIG_SCHEMA,
    CONFIG_TYPE,
    DSSE_TYPE,
    OCI_EMPTY,
    OCI_MANIFEST,
    SLSA_PROVENANCE,
    STATEMENT_TYPE,
    WHEEL_TYPE,
    Manifest,
    OracleConfig,
    Statement,
)
from oracle_build.contracts.pins import ArchiveSource, FromSource, GitSource, Pin
from oracle_build.contracts.record import BuildRecord, NumericsRecord, load_record
from oracle_build.core import layout, verdicts
from oracle_build.core.errors import (
    OracleMissing,
    Refused,
    RegistryError,
)
from oracle_build.core.files import read_text, sha256_file
from oracle_build.core.log import fmt_seconds, say
from oracle_build.oracle import inventory
from oracle_build.recipe.wheelhouse import Wheelhouse


@dataclass(frozen=True)
class _Blob:
    path: Path
    sha256: str
    size: int
    origin: str  # "lock" or "built"

    def opener(self) -> IO[bytes]:
        return open(self.path, "rb")


def _oracle_wheels(pin: Pin, target_name: str, wh: Wheelhouse,
                   record: BuildRecord) -> list[_Blob]:
    """Every wheel the oracle installed, from the wheelhouse, each checked against the lock
    (or, for the built vLLM wheel, against the build record)."""
    entries = pin.lock_entries
    if entries is None:
        raise Refused(f"pin {pin.id} has no lock: its wheels have no sha256 to be trusted by, "
                      "so it cannot be cached", hint="establish the lock (`oracle-build lock`)")
    out, missing = [], []
    for entry in entries:
        path = wh.find(entry) or wh.borrow(entry)
        if path is None:
            missing.append(f"{entry.name}=={entry.version}")
            continue
        out.append(_Blob(path, sha256_file(path), path.stat().st_size, "lock"))
    src = pin.model.vllm
    if isinstance(src, FromSource):
        version = pin.expected_distribution_version(pin.target(target_name))
        built = wh.find_built(src.distribution, version)
        if built is None or record.wheel is None:
            missing.append(f"the built {src.distribution}=={version}")
        else:
            digest = sha256_file(built)
            if digest != record.wheel.sha256:
                raise Refused(f"the wheelhouse's built {built.name} has sha256 {digest}, the "
                              f"build record says {record.wheel.sha256}",
                              hint="rebuild the oracle (`build_oracle -- --rebuild`)")
            out.append(_Blob(built, digest, built.stat().st_size, "built"))
    if missing:
        raise OracleMissing(f"the wheelhouse {wh.root} lacks {', '.join(missing[:5])}"
                            + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                            hint="run build_oracle for this pin on this host first")
    return sorted(out, key=lambda b: b.path.name)


def _numerics_fingerprint(venv: Path) -> str | None:
    path = layout.beside_record(venv, "numerics")
    try:
        rec = NumericsRecord.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None
    if rec.verdict != verdicts.NUMERICS_OK or not rec.whole_battery or not rec.fingerprint:
        return None
    anchor = inventory.anchor_path(venv)
    if rec.anchor_sha256 is None or not anchor.is_file() or \
            sha256_file(anchor) != rec.anchor_sha256:
        say("cache: the numerics record beside the oracle is not bound to this oracle's "
            "anchor (another build, or written by hand): no numerics fingerprint is signed")
        return None
    return rec.fingerprint.removeprefix("sha256:")


def statement(pin: Pin, target_name: str, record: BuildRecord, manifest_digest: str,
              tag: str, ref: CacheRef, numerics: str | None) -> dict[str, Any]:
    """The in-toto Statement (SLSA provenance v1) a push signs."""
    src = pin.model.vllm
    if isinstance(src, GitSource):
        dependency = {"uri": f"git+{src.repository}", "digest": {"gitCommit": src.commit}}
    elif isinstance(src, ArchiveSource):
        dependency = {"uri": src.url, "digest": {"sha256": src.sha256}}
    else:
        dependency = {"uri": f"pypi:{src.distribution}=={src.version}",
                      "digest": {"sha256": src.sha256}}
    byproducts = [{"name": "content_fingerprint",
                   "digest": {"sha256": record.content_fingerprint}}]
    if numerics:
        byproducts.append({"name": "numerics_fingerprint", "digest": {"sha256": numerics}})
    internal: dict[str, Any] = {"host": record.host,
                                "installer": record.installer.model_dump(mode="json")}
    if record.compiled is not None:  # a source oracle: its recipe as it ran, and its bytes
        byproducts.append({"name": "compiled_fingerprint",
                           "digest": {"sha256": record.compiled.fingerprint}})
        byproducts += [{"name": f"compiled:{rel}", "digest": {"sha256": sha}}
                       for rel, sha in sorted(record.compiled.files.items())]
        internal.update(
            toolchain=(record.toolchain.model_dump(mode="json") if record.toolchain
                       else None),
            compiled_toolchain=record.compiled.toolchain,
            patches=[p.model_dump(mode="json") for p in record.patches or []],
            levers=list(record.compiled.levers))
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{ref}:{tag}", "digest": {"sha256": manifest_digest.split(":")[1]}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"pin_id": pin.id, "pin_hash": pin.content_hash,
                                       "pin_key": pin.key, "target": target_name},
                "internalParameters": internal,
                "resolvedDependencies": [dependency],
            },
            "runDetails": {
                "builder": {"id": f"oracle-build/{record.tool.version}",
                            "version": {"oracle-build": record.tool.version,
                                        "git_commit": record.tool.git_commit or ""}},
                "metadata": {"invocationId": f"{pin.key}.{target_name}",
                             "startedOn": record.created_utc,
                             "finishedOn": layout.utc_now()},
                "byproducts": byproducts,
            },
        },
    }


def _put_manifest_complete(reg: Registry, data: bytes, blobs: list[_Blob]) -> str:
    """PUT the manifest by digest. A registry that lost a blob meanwhile answers
    MANIFEST_BLOB_UNKNOWN (seen with two hosts uploading one blob at once: distribution
    replaces the first upload's link while committing the second): upload what is missing
    again and retry, a few times."""
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    for attempt in range(1, 4):
        try:
            return reg.put_manifest(digest, data)
        except RegistryError as exc:
            if not exc.blob_unknown or attempt == 3:
                raise
        missing = [b for b in blobs if not reg.has_blob(f"sha256:{b.sha256}")]
        say(f"    the registry lost {len(missing)} blob(s) meanwhile; uploading them again")
        for blob in missing:
            reg.upload_blob(f"sha256:{blob.sha256}", blob.size, blob.opener)
        time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def attest(reg: Registry, key: SigningKey, stmt: dict[str, Any], digest: str,
           size: int) -> str:
    """Sign ``stmt`` and store it beside the manifest ``digest`` (its subject), under the
    fallback tag a registry without the referrers API is read by. Returns that tag."""
    envelope = key.sign(document(Statement, stmt))
    env_digest, env_size = reg.push_blob_bytes(canonical_json(envelope.model_dump(mode="json")))
    empty_digest, empty_size = reg.push_blob_bytes(b"{}")
    attestation = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": DSSE_TYPE,
        "config": {"mediaType": OCI_EMPTY, "digest": empty_digest, "size": empty_size},
        "layers": [{"mediaType": DSSE_TYPE, "digest": env_digest, "size": env_size}],
        "subject": {"mediaType": OCI_MANIFEST, "digest": digest, "size": size},
        "annotations": {"org.opencontainers.image.created": layout.utc_now(),
                        "dev.oracle-build.signed-by": key.name},
    }
    tag = attestation_tag(digest)
    reg.put_manifest(tag, document(Manifest, attestation))
    return tag


def push(opts: CacheOptions, pin: Pin, target_name: str, *, home: Path,
         wheelhouse_root: Path, unsigned: bool = False) -> PushResult:
    """Push the oracle built at ``home`` for this pin and target (it must pass identity:
    the caller checked). Blobs already in the registry are not uploaded again."""
    start = time.monotonic()
    if opts.signing_key is None and not unsigned:
        raise Refused("no signing key: a pushed oracle carries signed provenance, and pulls "
                      "refuse an unsigned one", hint="--signing-key FILE (or "
                      "ORACLE_BUILD_SIGNING_KEY; `oracle-build keygen` makes one), or "
                      "--unsigned if you mean it")
    venv = layout.oracle_path(home, pin.key)
    record_path = layout.build_record_path(venv)
    if not record_path.is_file():
        raise OracleMissing(f"no oracle for pin {pin.key} at {venv}",
                            hint="run build_oracle first")
    record = load_record(record_path)
    if record.pin.get("content_hash") != pin.content_hash:
        raise Refused(f"the oracle at {venv} was built from another pin "
                      f"({record.pin.get('content_hash')})")
    wh = Wheelhouse.for_pin(wheelhouse_root, pin)
    blobs = _oracle_wheels(pin, target_name, wh, record)
    tag = tag_for(pin.content_hash, target_name)
    reg = opts.registry(push=True)
    try:
        reg.ping()
        existing = reg.has_manifest(tag)
        if existing is not None and not opts.replace:
            say(f"cache: {opts.ref}:{tag} is already there ({existing or 'digest not given'}); "
                "not overwritten (--replace overwrites it)")
            return PushResult(tag, existing or "", 0, len(blobs), 0, None,
                              time.monotonic() - start, already=True)
        uploaded = present = uploaded_bytes = 0
        say(f"cache: pushing {len(blobs)} wheels of {pin.key} ({target_name}) to {opts.ref}")
        for n, blob in enumerate(blobs, start=1):
            digest = f"sha256:{blob.sha256}"
            if reg.has_blob(digest):
                present += 1
                continue
            reg.upload_blob(digest, blob.size, blob.opener)
            uploaded += 1
            uploaded_bytes += blob.size
            if blob.size > 50 << 20 or uploaded % 25 == 0:
                say(f"    [{n}/{len(blobs)}] {blob.path.name} ({blob.size / 2**20:.1f} MiB); "
                    f"{uploaded_bytes / 2**20:.1f} MiB uploaded, "
                    f"{fmt_seconds(time.monotonic() - start)}")
        say(f"    {uploaded} uploaded ({uploaded_bytes / 2**20:.1f} MiB), {present} already "
            "in the registry")
        config = OracleConfig(config_schema=CONFIG_SCHEMA, pin_id=pin.id,
                              pin_hash=pin.content_hash, pin_key=pin.key, target=target_name,
                              pin_toml=read_text(pin.path),
                              lock_txt=read_text(pin.lock_path) if pin.lock_path else None,
                              record=record)
        config_digest, config_size = reg.push_blob_bytes(canonical_json(config.model_dump(
            mode="json")))
        src = pin.model.vllm
        annotations = {
            "org.opencontainers.image.created": layout.utc_now(),
            "org.opencontainers.image.title": f"vLLM oracle {pin.key} ({target_name})",
            "org.opencontainers.image.description": pin.model.description or pin.id,
            "org.opencontainers.image.version": pin.expected_runtime_version(),
            "org.opencontainers.image.revision": (src.commit if isinstance(src, GitSource)
                                                  else src.sha256),
            "org.opencontainers.image.vendor": "oracle-build",
            "dev.oracle-build.pin.id": pin.id,
            "dev.oracle-build.pin.hash": pin.content_hash,
            "dev.oracle-build.target": target_name,
            "dev.oracle-build.content-fingerprint": record.content_fingerprint,
        }
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": WHEEL_TYPE, "digest": f"sha256:{b.sha256}", "size": b.size,
                        "annotations": {ANNOTATION_TITLE: b.path.name,
                                        ANNOTATION_ORIGIN: b.origin}} for b in blobs],
            "annotations": annotations,
        }
        data = document(Manifest, manifest)
        digest = _put_manifest_complete(reg, data, blobs)
        signed_by = None
        if opts.signing_key is not None:
            stmt = statement(pin, target_name, record, digest, tag, opts.ref,
                             _numerics_fingerprint(venv))
            attest(reg, opts.signing_key, stmt, digest, len(data))
            signed_by = opts.signing_key.name
        # the commit point, after one more look: another host may have tagged it meanwhile
        again = reg.has_manifest(tag)
        if again is not None and again != existing and not opts.replace:
            say(f"cache: another push tagged {tag} meanwhile ({again}); that one stands")
            return PushResult(tag, again, uploaded, present, uploaded_bytes, signed_by,
                              time.monotonic() - start, already=True)
        reg.put_manifest(tag, data)
    finally:
        reg.close()
    seconds = time.monotonic() - start
    say(f"cache: pushed {opts.ref}:{tag} ({digest}) in {fmt_seconds(seconds)}"
        + (f", signed by {signed_by}" if signed_by else ", UNSIGNED"))
    return PushResult(tag, digest, uploaded, present, uploaded_bytes, signed_by, seconds)
