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

from pathlib import Path

from oracle_build.cache.options import CacheOptions, PullResult, PushResult
from oracle_build.cache.pull import pull
from oracle_build.cache.push import attest, push, statement
from oracle_build.contracts.pins import Pin
from oracle_build.core.errors import (
    CacheRefused,
    NotCached,
    OracleBuildError,
    RegistryAuth,
    RegistryError,
)
from oracle_build.core.log import say

__all__ = ["CacheOptions", "PullResult", "PushResult", "attest", "pull", "pull_or_say", "push",
           "push_or_say", "statement"]


# build_oracle --cache: the cache helps a build and never stops one


def pull_or_say(opts: CacheOptions, pin: Pin, target: str, wheelhouse: Path) -> None:
    """Pull into the wheelhouse; a cache that lacks it, refuses it or cannot be reached is
    said (why, and that the build goes on as without a cache), never fatal here."""
    try:
        pull(opts, pin, target, wheelhouse_root=wheelhouse)
    except NotCached:
        say(f"cache: {opts.ref} holds no oracle for {pin.key} ({target}): building it")
    except CacheRefused as exc:
        say(f"cache: REFUSED: {exc.message}\ncache: nothing of it was kept; building from the "
            "pin instead")
    except (RegistryError, RegistryAuth) as exc:
        say(f"cache: {exc.label}: {exc.message}\ncache: building without it")


def push_or_say(opts: CacheOptions, pin: Pin, target: str, home: Path,
                wheelhouse: Path) -> None:
    """After identity passed: push when a signing key is given and the cache lacks it."""
    if opts.signing_key is None:
        say("cache: no signing key (--signing-key / ORACLE_BUILD_SIGNING_KEY): not pushing")
        return
    try:
        push(opts, pin, target, home=home, wheelhouse_root=wheelhouse)
    except OracleBuildError as exc:  # the oracle is built and proven; the push is extra
        say(f"cache: push failed ({exc.label}): {exc.message}; the oracle itself is fine "
            "(`oracle-build push` retries)")

