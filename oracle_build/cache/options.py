"""How a command uses the oracle cache, and what a push or a pull did."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oracle_build.cache.credentials import Credentials, credentials_for
from oracle_build.cache.ref import CacheRef
from oracle_build.cache.registry import Registry
from oracle_build.cache.signing import SigningKey
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.record import BuildRecord


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
