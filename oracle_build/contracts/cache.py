"""What the oracle cache stores in an OCI registry, and reads back: everything pulled is
someone else's until checked, so each is a strict model (the registry is only storage; the
pin is the root of trust for the wheels, the signature for the rest).

One artifact per pin hash and target (tag ``pin-<hash prefix>.<target>``): an OCI image
manifest whose layers are the oracle's wheels (each digest the lock's sha256; the built vLLM
wheel's the build record's), whose config blob holds the pin, its lock and the build record,
and beside it a DSSE envelope holding an in-toto Statement (SLSA provenance v1), signed
with Ed25519, in a manifest whose ``subject`` is the artifact (tag ``sha256-<hex>.att``
where the registry has no referrers API).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oracle_build.contracts.base import SafeName, Sha256, Strict
from oracle_build.contracts.record import BuildRecord

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
ARTIFACT_TYPE = "application/vnd.oracle-build.oracle.v1"
CONFIG_TYPE = "application/vnd.oracle-build.oracle.config.v1+json"
WHEEL_TYPE = "application/vnd.oracle-build.wheel.v1"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
INTOTO_PAYLOAD = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://oracle-build.dev/oracle/v1"
CONFIG_SCHEMA = 1

# the OCI distribution spec's grammars
TAG = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$")
REPOSITORY = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

# what a reader holds in memory at once: manifests, the config and envelopes are small;
# blobs (wheels, up to several GB) are streamed
MAX_DOCUMENT_BYTES = 8 << 20

Digest = Annotated[str, Field(pattern=DIGEST.pattern)]
ANNOTATION_TITLE = "org.opencontainers.image.title"
ANNOTATION_ORIGIN = "dev.oracle-build.wheel.origin"  # "lock" or "built"


class Oci(BaseModel):
    """OCI documents may carry fields this reader does not use: they are kept, not refused
    (a registry or another client adds its own); what is used is checked strictly."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Descriptor(Oci):
    mediaType: str
    digest: Digest
    size: int = Field(ge=0, le=1 << 42)
    annotations: dict[str, str] = Field(default_factory=dict)
    artifactType: str | None = None

    @property
    def sha256(self) -> str:
        return self.digest.removeprefix("sha256:")


class Manifest(Oci):
    schemaVersion: Literal[2]
    mediaType: Literal["application/vnd.oci.image.manifest.v1+json"]
    artifactType: str | None = None
    config: Descriptor
    layers: list[Descriptor]
    subject: Descriptor | None = None
    annotations: dict[str, str] = Field(default_factory=dict)


class Index(Oci):
    """The referrers API's answer."""

    schemaVersion: Literal[2]
    mediaType: Literal["application/vnd.oci.image.index.v1+json"] = \
        "application/vnd.oci.image.index.v1+json"
    manifests: list[Descriptor] = Field(default_factory=list)


class OracleConfig(Strict):
    """The artifact's config blob: what the oracle is, as its build host published it."""

    config_schema: Literal[1]
    pin_id: SafeName
    pin_hash: Sha256
    pin_key: str
    target: SafeName
    pin_toml: str = Field(max_length=1 << 20)  # the pin file as committed
    lock_txt: str | None = Field(default=None, max_length=4 << 20)
    record: BuildRecord


class Signature(Strict):
    keyid: str = Field(min_length=1, max_length=200)
    sig: str = Field(min_length=1, max_length=200)


class Envelope(Strict):
    """A DSSE envelope (https://github.com/secure-systems-lab/dsse)."""

    # any type DSSE allows (the signature covers it); what pull accepts is in-toto only,
    # said by pull itself (a Literal here made `sign` unable to build any other envelope)
    payloadType: str = Field(min_length=1, max_length=200)
    payload: str = Field(max_length=MAX_DOCUMENT_BYTES)
    signatures: list[Signature] = Field(min_length=1, max_length=16)


class Subject(Strict):
    name: str
    digest: dict[str, str]


class Statement(BaseModel):
    """An in-toto Statement v1 with an SLSA provenance v1 predicate; the fields oracle-build
    writes and checks are typed, the predicate's other fields kept as written."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type_: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type")
    subject: list[Subject] = Field(min_length=1)
    predicateType: Literal["https://slsa.dev/provenance/v1"]
    predicate: dict[str, Any]

    @model_validator(mode="after")
    def _parameters(self) -> Statement:
        params = ((self.predicate.get("buildDefinition") or {})
                  .get("externalParameters") or {})
        for name in ("pin_id", "pin_hash", "target"):
            if not isinstance(params.get(name), str):
                raise ValueError(f"predicate.buildDefinition.externalParameters.{name} is "
                                 "missing")
        return self

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.predicate["buildDefinition"]["externalParameters"])

    @property
    def byproducts(self) -> dict[str, str]:
        out = {}
        for item in (self.predicate.get("runDetails") or {}).get("byproducts") or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out[item["name"]] = str((item.get("digest") or {}).get("sha256", ""))
        return out
