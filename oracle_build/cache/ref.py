"""A cache reference: ``oci://HOST[:PORT]/NAMESPACE/REPO`` (HTTPS), or ``oci+http://`` for a
registry served over plain HTTP, which is allowed for a loopback host only unless the user
insists (``--allow-insecure-registry``); credentials never cross plain HTTP to any host but
loopback, insisted or not."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from oracle_build.contracts.cache import REPOSITORY, TAG
from oracle_build.core.errors import BadInput, as_data

HOST = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?$")
ENV = "ORACLE_BUILD_CACHE"


@dataclass(frozen=True)
class CacheRef:
    scheme: str  # "https" or "http"
    host: str  # as written, without the port
    port: int
    repository: str

    @property
    def netloc(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        name = self.host.strip("[]")
        if name == "localhost":
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"oci{'+http' if self.scheme == 'http' else ''}://{self.netloc}/{self.repository}"


def redacted(text: str) -> str:
    """``text`` as it may be printed: any userinfo (``user:password@``) before the host shown
    as ``***@``, control characters escaped, the length bounded. Credentials come from the
    Docker config or a credential helper, never from the reference."""
    scheme, sep, rest = text.partition("://")
    if sep:
        netloc, slash, path = rest.partition("/")
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        text = scheme + sep + netloc + slash + path
    return as_data(text, 300)


def parse(text: str, *, allow_insecure: bool = False, where: str = "--cache") -> CacheRef:
    """``text`` as a cache reference, or BadInput naming ``where`` (and never the reference's
    userinfo: a password put in the reference is not echoed)."""
    def bad(why: str) -> BadInput:
        return BadInput(where, [("cache", f"{redacted(text)!r}: {why}")],
                        hint="oci://HOST[:PORT]/NAMESPACE/REPO, e.g. oci://ghcr.io/team/"
                        "oracles, or oci+http://127.0.0.1:5000/team/oracles for a local one")

    if text.startswith("oci://"):
        scheme, rest = "https", text[len("oci://"):]
    elif text.startswith("oci+http://"):
        scheme, rest = "http", text[len("oci+http://"):]
    else:
        raise bad("not an oci:// or oci+http:// reference")
    netloc, _, repository = rest.partition("/")
    if "@" in netloc:
        raise bad("credentials do not go in the reference (they would be printed and "
                  "logged): use `docker login` or the Docker config, which the cache reads")
    if not HOST.match(netloc):
        raise bad(f"{redacted(netloc)!r} is not a host[:port]")
    if netloc.startswith("["):
        host, _, port_text = netloc[1:].partition("]")
        host, port_text = f"[{host}]", port_text.lstrip(":")
    else:
        host, _, port_text = netloc.partition(":")
    port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    if not 0 < port < 65536:
        raise bad(f"port {port} is out of range")
    if not repository or not REPOSITORY.match(repository) or len(repository) > 255:
        raise bad(f"{repository!r} is not a registry repository name (lowercase "
                  "letters, digits, '.', '_', '-', separated by '/')")
    ref = CacheRef(scheme, host, port, repository)
    if scheme == "http" and not ref.loopback and not allow_insecure:
        raise BadInput(where, [("cache", f"{redacted(text)!r}: plain HTTP to {host}, which is "
                                "not a "
                                "loopback host: anyone on the path can change what is pulled "
                                "(signatures still checked) or read what is pushed")],
                       hint="use oci:// (HTTPS), or --allow-insecure-registry if you mean it")
    return ref


def tag_for(pin_hash: str, target: str) -> str:
    """The artifact's tag: a reader tells pins and targets apart without pulling."""
    tag = f"pin-{pin_hash[:16]}.{target}"
    if not TAG.match(tag):
        raise BadInput("pin", [("targets", f"target {target!r} does not make a valid OCI tag "
                                f"({tag!r})")])
    return tag


def attestation_tag(manifest_digest: str) -> str:
    """Where the signature of a manifest is stored on a registry without referrers API."""
    return manifest_digest.replace(":", "-") + ".att"
