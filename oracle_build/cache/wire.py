"""The wire rules of the OCI client (cache/registry.py): how long a registry may take, how
much it may send, what counts as a broken answer and which are retried, and the small
readers of what it sends (error codes, the next page of a tag list, a URL's port, a whole
document). Every limit a hostile or broken registry meets is here."""

from __future__ import annotations

import http.client
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import urllib3

from oracle_build.cache.transport import CHUNK
from oracle_build.contracts.cache import MAX_DOCUMENT_BYTES
from oracle_build.core.errors import RegistryError, as_data
from oracle_build.core.files import json_value

RETRIES = 4
# A document (manifest, index, token) arrives whole within this, and a blob at no less than
# this rate over any window of BLOB_WINDOW seconds: a registry dripping a byte at a time
# would otherwise hold a pull for as long as it likes (each read is within TIMEOUT).
DOCUMENT_DEADLINE = 60.0
BLOB_MIN_RATE = 32 * 1024
BLOB_WINDOW = 60.0
RETRY_STATUS = {429, 500, 502, 503, 504}
# A body read only to be dropped (an error's, a redirect's, a 401's) is read this far and
# for this long at most; past either the connection is closed, never reused
DRAIN_BYTES = 64 * 1024
DRAIN_DEADLINE = 10.0
BROKEN = (ConnectionError, http.client.HTTPException, socket.timeout, TimeoutError, OSError,
          urllib3.exceptions.HTTPError)


# What a broken or hostile registry can make the transport raise outside the retried send: a
# body cut or mis-chunked (IncompleteRead), a connection reset mid-read, a redirect or token
# realm with an invalid port (ValueError: Port out of range), an unparsable header.
TRANSPORT = (*BROKEN, ValueError, UnicodeError)


F = TypeVar("F", bound=Callable[..., Any])


def error_codes(body: str) -> tuple[str, ...]:
    """The OCI distribution error codes of an error body (``{"errors": [{"code": ...}]}``),
    for the code to decide on (``MANIFEST_BLOB_UNKNOWN``); () for any other body."""
    try:
        data = json_value(body)
    except ValueError:
        return ()
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list):
        return ()
    return tuple(e["code"] for e in errors[:20] if isinstance(e, dict)
                 and isinstance(e.get("code"), str) and re.fullmatch(r"[A-Z_]{1,64}", e["code"]))


OCI_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def next_page(link: str | None, repository: str) -> str | None:
    """The next page of a tag list (``Link: </v2/<repo>/tags/list?...>; rel="next"``): a
    path on this registry, under this repository's tags, or None."""
    if not link:
        return None
    found = re.match(r'\s*<([^>]*)>\s*;\s*rel="?next"?', link)
    if not found:
        return None
    split = urllib.parse.urlsplit(found.group(1))
    if split.scheme or split.netloc or split.path != f"/v2/{repository}/tags/list":
        return None
    return split.path + (f"?{split.query}" if split.query else "")


def url_port(url: urllib.parse.SplitResult, what: str) -> int:
    """The port of a URL the registry sent (a token realm, a redirect), or its scheme's
    default: one out of range or not a number is the registry's fault (exit 15), named."""
    try:
        port = url.port
    except ValueError as exc:
        raise RegistryError(f"{what}: {exc}", hint="is the registry (or a proxy before it) "
                            "healthy?") from None
    return port or (443 if url.scheme == "https" else 80)


def _as_registry_error(method: F) -> F:
    """A public Registry call whose transport failure, however the answer was malformed, is
    a RegistryError (exit 15; `build --cache` then builds without the cache), never exit 70."""
    import functools
    import inspect

    def convert(self: Any, exc: BaseException) -> RegistryError:
        return RegistryError(f"{self.ref}: {method.__name__.replace('_', ' ')}: the registry's "
                             f"answer broke off or is malformed: {type(exc).__name__}: "
                             f"{as_data(str(exc), 300)}",
                             hint="is the registry (or a proxy before it) healthy?")

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from method(self, *args, **kwargs)
            except TRANSPORT as exc:
                raise convert(self, exc) from None
        return cast(F, generator)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except TRANSPORT as exc:
            raise convert(self, exc) from None
    return cast(F, call)


def read_document(body: Any, what: str, *, clock: Callable[[], float] = time.monotonic,
                  deadline: float | None = None) -> bytes:
    """Up to MAX_DOCUMENT_BYTES + 1 bytes of a document's body, within DOCUMENT_DEADLINE
    (RegistryError, said, when the registry is slower than that)."""
    limit = deadline if deadline is not None else DOCUMENT_DEADLINE
    start = clock()
    data = bytearray()
    read = getattr(body, "read1", None) or body.read
    while len(data) <= MAX_DOCUMENT_BYTES:
        chunk = read(min(CHUNK, MAX_DOCUMENT_BYTES + 1 - len(data)))
        if not chunk:
            break
        data += chunk
        if clock() - start > limit:
            raise RegistryError(f"{what}: the document is not whole after {limit:.0f} s "
                                f"({len(data)} bytes so far): the registry is too slow or "
                                "stalling", hint="is the registry (or a proxy before it) "
                                "healthy?")
    if len(data) <= MAX_DOCUMENT_BYTES:
        body.read()  # at its end: read() closes the response (read1 never does)
    return bytes(data)


def stalled(what: str, seconds: float) -> RegistryError:
    return RegistryError(f"{what}: no whole answer (status line and headers) within "
                         f"{seconds:.0f} s: the registry is too slow or stalling",
                         hint="is the registry (or a proxy before it) healthy?")
