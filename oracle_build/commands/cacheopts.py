"""The oracle cache's options, shared by build, push and pull (not a command)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from oracle_build.core.env import tool_variable
from oracle_build.core.errors import BadInput

if TYPE_CHECKING:
    from oracle_build.cache import CacheOptions

CACHE_HELP = """the oracle cache:
  REF is oci://HOST[:PORT]/NAMESPACE/REPO (HTTPS), or oci+http://127.0.0.1:PORT/... for a
  registry on this host. One artifact per pin hash and target, tagged pin-<hash>.<target>.
  Credentials: ORACLE_BUILD_CACHE_USERNAME + ORACLE_BUILD_CACHE_PASSWORD, or
  ORACLE_BUILD_CACHE_TOKEN, or the Docker config file (`docker login`).
  Pulls verify every wheel against the pin's lock and the provenance against a trusted key
  (pins/trusted-keys beside the pin: one `name-N:base64` line per key)."""


def add_cache_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--cache", metavar="REF", required=False,
                   help=("the oracle cache (env ORACLE_BUILD_CACHE)" if not required else
                         "the oracle cache (env ORACLE_BUILD_CACHE; required)"))
    p.add_argument("--signing-key", metavar="FILE", help="sign what is pushed with this "
                   "Ed25519 key (`oracle-build keygen`; env ORACLE_BUILD_SIGNING_KEY)")
    p.add_argument("--trusted-keys", metavar="FILE", help="the public keys a pull trusts "
                   "(default: trusted-keys beside the pin; env ORACLE_BUILD_TRUSTED_KEYS)")
    p.add_argument("--allow-unsigned", action="store_true",
                   help="take an artifact that carries no provenance (warned)")
    p.add_argument("--allow-untrusted", action="store_true",
                   help="take an artifact signed by a key the trusted-keys file lacks (warned)")
    p.add_argument("--allow-insecure-registry", action="store_true",
                   help="allow oci+http:// to a host that is not loopback (credentials are "
                   "still never sent there)")


def cache_options(args: argparse.Namespace, *, required: bool) -> CacheOptions | None:
    """The options given (flags, then environment), or None when no cache is named."""
    from oracle_build.cache import CacheOptions
    from oracle_build.cache.ref import ENV, parse
    from oracle_build.cache.signing import load_signing_key

    text = args.cache or tool_variable(ENV)
    if not text:
        if required:
            raise BadInput("--cache", [("cache", "no cache named (--cache REF or "
                                        f"{ENV})")])
        return None
    ref = parse(text, allow_insecure=args.allow_insecure_registry,
                where="--cache" if args.cache else ENV)
    key_file = args.signing_key or tool_variable("ORACLE_BUILD_SIGNING_KEY")
    key = load_signing_key(Path(key_file)) if key_file else None
    trusted = args.trusted_keys or tool_variable("ORACLE_BUILD_TRUSTED_KEYS")
    return CacheOptions(ref=ref, signing_key=key,
                        trusted_keys=Path(trusted).resolve() if trusted else None,
                        allow_unsigned=args.allow_unsigned,
                        allow_untrusted=args.allow_untrusted,
                        replace=bool(getattr(args, "replace", False)))
