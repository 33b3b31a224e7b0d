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

from oracle_build.cache.options import CacheOptions, PullResult, PushResult
from oracle_build.cache.pull import pull
from oracle_build.cache.push import attest, push, statement

__all__ = ["CacheOptions", "PullResult", "PushResult", "attest", "pull", "push", "statement"]
