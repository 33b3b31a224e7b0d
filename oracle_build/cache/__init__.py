"""The shared oracle cache in an OCI registry: ``push`` an oracle that passed identity (its
wheels, the built vLLM wheel, the pin, its lock and the build record, then its signed
provenance), ``pull`` one into the wheelhouse, verified against the pin, the lock and a
trusted key, so the build that follows installs it offline as from any wheelhouse.

The registry is only storage. The pin is the root of trust for every locked wheel (a
layer's digest must be the lock's sha256 for that wheel); the signature is the root for
the rest (the built vLLM wheel and the record); a reader never trusts the manifest over
the pin: a layer the lock does not name, or a locked wheel without its layer, is refused.

Write order (the manifest under its tag is the commit point, so a reader never sees half
a push): every blob; the manifest by digest; the signed statement in a manifest whose
subject is it (tagged ``sha256-<hex>.att`` for registries without the referrers API); then
the manifest under its tag, after checking once more that nobody else tagged it meanwhile.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from pydantic import ValidationError

from oracle_build.build.wheelhouse import Wheelhouse
from oracle_build.cache.ref import CacheRef, attestation_tag, tag_for
from oracle_build.cache.registry import Credentials, Registry, credentials_for
from oracle_build.cache.signing import SigningKey, load_trusted, verify
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
    Descriptor,
    Envelope,
    Manifest,
    OracleConfig,
    Statement,
)
from oracle_build.contracts.lock import LockEntry
from oracle_build.contracts.pins import GitSource, Pin
from oracle_build.contracts.record import BuildRecord, NumericsRecord, load_record
from oracle_build.core import layout
from oracle_build.core.errors import (
    CacheRefused,
    NotCached,
    OracleMissing,
    Refused,
    RegistryError,
)
from oracle_build.core.files import read_text, sha256_file
from oracle_build.core.log import fmt_seconds, say

__all__ = ["CacheOptions", "PullResult", "PushResult", "pull", "push"]


@dataclass(frozen=True)
class CacheOptions:
    """How a command uses the cache (build_oracle, push, pull)."""

    ref: CacheRef
    signing_key: SigningKey | None = None
    trusted_keys: Path | None = None  # default: the pin's folder's trusted-keys
    allow_unsigned: bool = False
    allow_untrusted: bool = False
    replace: bool = False
    credentials: Credentials | None = None

    def registry(self, *, push: bool) -> Registry:
        creds = self.credentials if self.credentials is not None else credentials_for(self.ref)
        return Registry(self.ref, creds, push=push)

    def trusted_path(self, pin: Pin) -> Path:
        return self.trusted_keys or pin.path.parent / "trusted-keys"


@dataclass(frozen=True)
class PushResult:
    tag: str
    digest: str
    uploaded: int
    present: int
    uploaded_bytes: int
    signed_by: str | None
    seconds: float
    already: bool = False


@dataclass(frozen=True)
class PullResult:
    tag: str
    digest: str
    signed_by: str | None
    fetched: int
    present: int
    fetched_bytes: int
    seconds: float
    record: BuildRecord


# a layer's title becomes a file name in the wheelhouse: a plain name, never a path
WHEEL_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl$")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- push


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
    if isinstance(src, GitSource):
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
    if rec.verdict != "ORACLE_NUMERICS_OK" or not rec.whole_battery or not rec.fingerprint:
        return None
    return rec.fingerprint.removeprefix("sha256:")


def statement(pin: Pin, target_name: str, record: BuildRecord, manifest_digest: str,
              tag: str, ref: CacheRef, numerics: str | None) -> dict[str, Any]:
    """The in-toto Statement (SLSA provenance v1) a push signs."""
    src = pin.model.vllm
    if isinstance(src, GitSource):
        dependency = {"uri": f"git+{src.repository}", "digest": {"gitCommit": src.commit}}
    else:
        dependency = {"uri": f"pypi:{src.distribution}=={src.version}",
                      "digest": {"sha256": src.sha256}}
    byproducts = [{"name": "content_fingerprint",
                   "digest": {"sha256": record.content_fingerprint}}]
    if numerics:
        byproducts.append({"name": "numerics_fingerprint", "digest": {"sha256": numerics}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{ref}:{tag}", "digest": {"sha256": manifest_digest.split(":")[1]}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"pin_id": pin.id, "pin_hash": pin.content_hash,
                                       "pin_key": pin.key, "target": target_name},
                "internalParameters": {"host": record.host, "installer":
                                       record.installer.model_dump(mode="json")},
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
            if "MANIFEST_BLOB_UNKNOWN" not in exc.message or attempt == 3:
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
    envelope = key.sign(_dumps(stmt))
    env_digest, env_size = reg.push_blob_bytes(_dumps(envelope.model_dump(mode="json")))
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
    reg.put_manifest(tag, _dumps(attestation))
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
        config_digest, config_size = reg.push_blob_bytes(_dumps(config.model_dump(
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
        data = _dumps(manifest)
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


# ----------------------------------------------------------------------------- pull


def _model(model: type[Any], data: bytes, where: str) -> Any:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}"
                             for e in exc.errors(include_url=False)[:5])
        raise CacheRefused(f"{where} is not what an oracle cache holds: {problems}") from None


def _provenance(reg: Registry, opts: CacheOptions, pin: Pin, target_name: str,
                digest: str) -> tuple[str | None, Statement | None]:
    """The signed statement for ``digest``: (key name, statement), or (None, None) when the
    artifact is unsigned and that is allowed."""
    candidates = []
    listed = reg.referrers(digest)
    if listed is not None:
        candidates = [m["digest"] for m in listed if isinstance(m, dict)
                      and m.get("artifactType") == DSSE_TYPE and isinstance(m.get("digest"), str)]
    candidates.append(attestation_tag(digest))
    attestation = None
    for reference in candidates:
        try:
            data, _ = reg.get_manifest(reference)
        except NotCached:
            continue
        attestation = _model(Manifest, data, f"{opts.ref}:{reference}")
        break
    if attestation is None:
        if opts.allow_unsigned:
            say(f"cache: WARNING {opts.ref} holds no provenance for {digest}; taken unsigned "
                "(--allow-unsigned)")
            return None, None
        raise CacheRefused(f"{opts.ref}: the artifact {digest} is unsigned (no provenance "
                           "beside it)", hint="push it with a signing key, or pull with "
                           "--allow-unsigned if you mean it")
    if attestation.subject is None or attestation.subject.digest != digest:
        raise CacheRefused(f"{opts.ref}: the provenance beside {digest} is about "
                           f"{attestation.subject.digest if attestation.subject else 'nothing'}")
    layers = [d for d in attestation.layers if d.mediaType == DSSE_TYPE]
    if len(layers) != 1:
        raise CacheRefused(f"{opts.ref}: the provenance of {digest} holds {len(layers)} DSSE "
                           "envelopes, not one")
    envelope = _model(Envelope, reg.blob_bytes(layers[0].digest, layers[0].size),
                      f"{opts.ref} provenance envelope")
    trusted_file = opts.trusted_path(pin)
    trusted = load_trusted(trusted_file) if trusted_file.is_file() else {}
    try:
        signed_by, payload = verify(envelope, trusted, trusted_file=trusted_file)
    except CacheRefused as exc:
        if not (opts.allow_untrusted and "does not trust" in exc.message):
            raise
        signed_by = None
        payload = base64.b64decode(envelope.payload)
        say(f"cache: WARNING {exc.message}; taken anyway (--allow-untrusted)")
    stmt: Statement = _model(Statement, payload, f"{opts.ref} provenance statement")
    if not any(s.digest.get("sha256") == digest.split(":")[1] for s in stmt.subject):
        raise CacheRefused(f"{opts.ref}: the signed statement is about "
                           f"{[s.digest for s in stmt.subject]}, not {digest}: replayed")
    params = stmt.parameters
    if (params.get("pin_hash"), params.get("target"), params.get("pin_id")) != (
            pin.content_hash, target_name, pin.id):
        raise CacheRefused(
            f"{opts.ref}: the signed provenance is for pin {params.get('pin_id')} "
            f"({str(params.get('pin_hash'))[:16]}) target {params.get('target')}, not "
            f"{pin.id} ({pin.content_hash[:16]}) target {target_name}: another artifact "
            "replayed under this tag")
    if signed_by:
        say(f"cache: provenance signed by {signed_by} (trusted in {trusted_file})")
    return signed_by, stmt


def _expected_layers(pin: Pin, target_name: str, manifest: Manifest, config: OracleConfig,
                     where: str) -> list[tuple[Descriptor, LockEntry | None]]:
    """Each layer paired with the lock entry it must be (None: the built vLLM wheel, whose
    sha256 the signed build record holds); refused unless the layers are exactly the
    lock's wheels (plus the built wheel for a from-source pin)."""
    entries = {(e.key, e.version): e for e in (pin.lock_entries or ())}
    src = pin.model.vllm
    built_key = None
    if isinstance(src, GitSource):
        built_key = (str(canonicalize_name(src.distribution)),
                     pin.expected_distribution_version(pin.target(target_name)))
    out: list[tuple[Descriptor, LockEntry | None]] = []
    seen: set[tuple[str, str]] = set()
    problems = []
    for layer in manifest.layers:
        title = layer.annotations.get(ANNOTATION_TITLE, "")
        try:
            if not WHEEL_FILE.match(title):
                raise ValueError(title)
            name, version, _b, _t = parse_wheel_filename(title)
        except (ValueError, InvalidWheelFilename):
            problems.append(f"a layer titled {title!r} is not a wheel file name")
            continue
        key = (str(canonicalize_name(name)), str(version))
        if key in seen:
            problems.append(f"{title}: listed twice")
            continue
        seen.add(key)
        if layer.mediaType != WHEEL_TYPE:
            problems.append(f"{title}: media type {layer.mediaType}")
        entry = entries.get(key)
        if entry is not None:
            if layer.sha256 not in entry.sha256:
                problems.append(f"{title}: sha256 {layer.sha256[:16]}... is not the lock's "
                                f"({', '.join(h[:16] + '...' for h in entry.sha256)})")
            out.append((layer, entry))
        elif key == built_key and config.record.wheel is not None and \
                layer.sha256 == config.record.wheel.sha256 and \
                title == config.record.wheel.file:
            out.append((layer, None))
        else:
            problems.append(f"{title}: not a wheel of the lock"
                            + (" (nor the build record's vLLM wheel)" if built_key else ""))
    for key, entry in entries.items():
        if key not in seen:
            problems.append(f"{entry.name}=={entry.version}: the lock's wheel has no layer")
    if built_key and built_key not in seen:
        problems.append(f"the built {built_key[0]}=={built_key[1]} has no layer")
    if problems:
        raise CacheRefused(f"{where}: the artifact is not this pin's oracle:\n  "
                           + "\n  ".join(problems[:12])
                           + (f"\n  ... and {len(problems) - 12} more"
                              if len(problems) > 12 else ""))
    return out


def pull(opts: CacheOptions, pin: Pin, target_name: str, *,
         wheelhouse_root: Path) -> PullResult:
    """Pull this pin's oracle for ``target_name`` into its wheelhouse. Every check that
    needs no wheel runs first (manifest, signature, statement, config, layers against the
    lock); then each missing wheel is streamed to the wheelhouse's incoming folder, its
    sha256 and size checked as it streams, and moved in only when they hold."""
    start = time.monotonic()
    if pin.lock_entries is None:
        raise Refused(f"pin {pin.id} has no lock: nothing pulled could be checked against it")
    tag = tag_for(pin.content_hash, target_name)
    where = f"{opts.ref}:{tag}"
    reg = opts.registry(push=False)
    try:
        data, digest = reg.get_manifest(tag)
        manifest: Manifest = _model(Manifest, data, where)
        if manifest.artifactType != ARTIFACT_TYPE or manifest.config.mediaType != CONFIG_TYPE:
            raise CacheRefused(f"{where} is a {manifest.artifactType or manifest.config.mediaType}"
                               f", not an oracle ({ARTIFACT_TYPE})")
        signed_by, _stmt = _provenance(reg, opts, pin, target_name, digest)
        config: OracleConfig = _model(OracleConfig, reg.blob_bytes(
            manifest.config.digest, manifest.config.size), f"{where} config")
        if (config.pin_hash, config.target, config.pin_id) != (pin.content_hash, target_name,
                                                                pin.id):
            raise CacheRefused(f"{where}: the config is for pin {config.pin_id} "
                               f"({config.pin_hash[:16]}) target {config.target}: another "
                               "artifact under this tag")
        if config.record.pin.get("content_hash") != pin.content_hash:
            raise CacheRefused(f"{where}: its build record is of pin "
                               f"{config.record.pin.get('content_hash')}")
        layers = _expected_layers(pin, target_name, manifest, config, where)
        wh = Wheelhouse.for_pin(wheelhouse_root, pin)
        built_version = pin.expected_distribution_version(pin.target(target_name))

        def have(entry: LockEntry | None) -> bool:
            if entry is None:
                return wh.find_built(pin.model.vllm.distribution, built_version) is not None
            return (wh.find(entry) or wh.borrow(entry)) is not None

        todo = [(layer, entry) for layer, entry in layers if not have(entry)]
        for stale in wh.incoming.glob("*.part") if wh.incoming.is_dir() else []:
            stale.unlink()  # an earlier pull stopped mid-blob
        present = len(layers) - len(todo)
        total = sum(layer.size for layer, _ in todo)
        say(f"cache: {where} ({digest}): {len(layers)} wheels, {present} already in the "
            f"wheelhouse, pulling {len(todo)} ({total / 2**20:.1f} MiB)")
        fetched_bytes = 0
        if todo:
            wh.incoming.mkdir(parents=True, exist_ok=True)
        for n, (layer, entry) in enumerate(todo, start=1):
            title = layer.annotations[ANNOTATION_TITLE]
            part = wh.incoming / f"{title}.part"
            final = wh.incoming / title
            try:
                with open(part, "wb") as fh:
                    for chunk in reg.stream_blob(layer.digest, layer.size):
                        fh.write(chunk)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(part, final)
            except BaseException:
                part.unlink(missing_ok=True)
                raise
            if entry is not None:
                wh.add(final, origin="cache", expected=entry.sha256)
            else:
                wh.add(final, origin="built")
                final.unlink(missing_ok=True)
            fetched_bytes += layer.size
            if n % 20 == 0 or n == len(todo):
                say(f"    [{n}/{len(todo)}] {fetched_bytes / 2**20:.1f} of "
                    f"{total / 2**20:.1f} MiB, {fmt_seconds(time.monotonic() - start)}")
    finally:
        reg.close()
    seconds = time.monotonic() - start
    say(f"cache: pulled {where} in {fmt_seconds(seconds)}; built on "
        f"{config.record.host.get('hostname', '?')} ({config.record.created_utc})")
    return PullResult(tag, digest, signed_by, len(todo), present, fetched_bytes, seconds,
                      config.record)
