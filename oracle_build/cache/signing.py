"""Signed provenance: Ed25519 keys named Nix style (``name-N``, so keys rotate by number),
DSSE envelopes over in-toto Statements, and the trusted-keys file in the users' repository
(``pins/trusted-keys``: one ``name-N:base64-public-key`` per line, ``#`` comments).

A secret key file holds ``name-N:base64(32-byte seed)``, mode 0600; its public half is
``name-N:base64(32-byte public key)``. Verification checks the signature over DSSE's
pre-authentication encoding (PAE) of the payload, so a signed payload cannot be
reinterpreted as another type.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from oracle_build.contracts.cache import INTOTO_PAYLOAD, Envelope, Signature
from oracle_build.core.errors import BadInput, CacheRefused, OutputFailed, UntrustedSigner, as_data
from oracle_build.core.files import read_text

KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}-[0-9]{1,6}$")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _decode(text: str, where: Path | str, field: str, length: int) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(where, [(field, "not base64")]) from None
    if len(raw) != length:
        raise BadInput(where, [(field, f"{len(raw)} bytes; an Ed25519 key is {length}")])
    return raw


@dataclass(frozen=True)
class SigningKey:
    name: str
    key: Ed25519PrivateKey

    @property
    def public_line(self) -> str:
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return f"{self.name}:{base64.b64encode(raw).decode()}"

    def sign(self, payload: bytes, payload_type: str = INTOTO_PAYLOAD) -> Envelope:
        sig = self.key.sign(pae(payload_type, payload))
        return Envelope(payloadType=payload_type,
                        payload=base64.b64encode(payload).decode(),
                        signatures=[Signature(keyid=self.name,
                                              sig=base64.b64encode(sig).decode())])


def _split(line: str, where: Path | str, field: str) -> tuple[str, str]:
    name, sep, value = line.strip().partition(":")
    if not sep or not KEY_NAME.match(name):
        raise BadInput(where, [(field, "expected 'name-N:base64' (a key name ending in "
                                "-<number>, then the key)")])
    return name, value


def load_signing_key(path: Path) -> SigningKey:
    """A secret key file written by ``oracle-build keygen``."""
    text = read_text(path)
    if path.stat().st_mode & 0o077:
        raise BadInput(path, [("mode", f"{oct(path.stat().st_mode & 0o777)}: a secret key "
                               "must be readable by its owner only (chmod 600)")])
    name, value = _split(text, path, "key")
    return SigningKey(name, Ed25519PrivateKey.from_private_bytes(_decode(value, path, "key", 32)))


def generate(name: str, directory: Path) -> tuple[Path, Path, SigningKey]:
    """A new key pair: ``<name>.secret`` (0600) and ``<name>.public`` in ``directory``;
    never overwrites either."""
    if not KEY_NAME.match(name):
        raise BadInput("--name", [("name", f"{name!r}: a key name ends in -<number> (Nix "
                                   "style, e.g. gb10-builder-1), so keys can be rotated")])
    key = SigningKey(name, Ed25519PrivateKey.generate())
    secret, public = directory / f"{name}.secret", directory / f"{name}.public"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        seed = key.key.private_bytes_raw()
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{name}:{base64.b64encode(seed).decode()}\n")
        fd = os.open(public, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.public_line + "\n")
    except FileExistsError as exc:
        raise OutputFailed(f"{exc.filename} exists: a key is never overwritten",
                           hint="pick the next number (-2, -3, ...) to rotate") from None
    except OSError as exc:
        raise OutputFailed(f"cannot write the key pair in {directory}: {exc}") from None
    return secret, public, key


def load_trusted(path: Path) -> dict[str, Ed25519PublicKey]:
    """The trusted public keys, by name."""
    out: dict[str, Ed25519PublicKey] = {}
    for number, raw in enumerate(read_text(path).splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, value = _split(line, path, f"line {number}")
        if name in out:
            raise BadInput(path, [(f"line {number}", f"key {name} is listed twice")])
        out[name] = Ed25519PublicKey.from_public_bytes(
            _decode(value, path, f"line {number}", 32))
    return out


def verify(envelope: Envelope, trusted: dict[str, Ed25519PublicKey], *,
           trusted_file: Path | str) -> tuple[str, bytes]:
    """The name of the trusted key whose signature holds, and the payload; CacheRefused
    naming the keys that signed otherwise."""
    try:
        payload = base64.b64decode(envelope.payload, validate=True)
    except (binascii.Error, ValueError):
        raise CacheRefused("the provenance envelope's payload is not base64") from None
    names = []
    for signature in envelope.signatures:
        names.append(as_data(signature.keyid, 100))  # another's words: printed as data
        key = trusted.get(signature.keyid)
        if key is None:
            continue
        try:
            key.verify(base64.b64decode(signature.sig, validate=True),
                       pae(envelope.payloadType, payload))
        except (InvalidSignature, binascii.Error, ValueError):
            raise CacheRefused(f"the provenance signature by {as_data(signature.keyid, 100)} does "
                               "not verify: "
                               "the statement or the signature was altered") from None
        return signature.keyid, payload
    raise UntrustedSigner(f"the provenance is signed by {', '.join(names)}, which "
                       f"{trusted_file} does not trust",
                       hint="add the builder's public key line to that file if you trust it "
                       "(`oracle-build keygen` printed it), or --allow-untrusted")
