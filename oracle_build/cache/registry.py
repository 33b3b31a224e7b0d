"""A small OCI distribution client (the part of the spec an oracle cache needs): blobs by
digest (exists, upload, streamed download verified while it streams), manifests by tag or
digest, the referrers API where the registry has one. The HTTP is urllib3's, through
``transport.py``; every check of what arrives is here.

Memory stays bounded whatever the blob size: bodies are streamed in 1 MiB chunks, both
ways; documents (manifests, configs, envelopes) are refused above MAX_DOCUMENT_BYTES.

Auth: anonymous first; on 401 the registry's challenge decides: HTTP basic (htpasswd
registries) or a bearer token from its token service (the registry token flow, with basic
credentials to the token service when there are any). Credentials come from the
environment (ORACLE_BUILD_CACHE_USERNAME / _PASSWORD, or ORACLE_BUILD_CACHE_TOKEN) or the
Docker config file (``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``: the
host's ``credHelpers``, else ``credsStore``, run as Docker credential helpers, else
``auths``); they are never sent over plain HTTP to a host that is not loopback.

Errors: 401/403 -> RegistryAuth, a missing manifest -> NotCached (the caller decides), 5xx,
429 and broken connections are retried (every request here is safe to repeat: uploads are
content-addressed; Retry-After honoured, the backoff jittered) and then RegistryError, which
carries the HTTP status and the OCI error codes. A TLS failure is never retried. A blob
download that breaks resumes with a Range request from its last verified byte. How a
connection is made (the trust store, proxies) is ``transport.py``'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import urllib3

from oracle_build.cache import transport
from oracle_build.cache.credentials import Credentials
from oracle_build.cache.ref import CacheRef
from oracle_build.cache.transport import CHUNK, TIMEOUT
from oracle_build.cache.wire import (
    BLOB_MIN_RATE,
    BLOB_WINDOW,
    BROKEN,
    DRAIN_BYTES,
    DRAIN_DEADLINE,
    OCI_TAG,
    RETRIES,
    RETRY_STATUS,
    _as_registry_error,
    error_codes,
    next_page,
    read_document,
    stalled,
    url_port,
)
from oracle_build.contracts.cache import DIGEST, MAX_DOCUMENT_BYTES, OCI_INDEX, OCI_MANIFEST
from oracle_build.core.errors import (
    CacheRefused,
    NotCached,
    RegistryAuth,
    RegistryError,
    as_data,
)
from oracle_build.core.files import RateFloor, json_value
from oracle_build.core.log import say

CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: urllib3.BaseHTTPResponse | None  # open for streaming; None once read

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Registry:
    """One repository of one registry, with the auth it has negotiated so far."""

    ref: CacheRef
    credentials: Credentials = field(default_factory=Credentials)
    push: bool = False  # ask the token service for push as well as pull
    sleep: Callable[[float], None] = time.sleep
    _auth: str | None = None
    _pool: urllib3.HTTPConnectionPool | None = None
    proxy: transport.Proxy | None = None  # the proxy of the last connection, if any
    # (digest, from byte, status) of every resumed blob download: 206, or 200 where the
    # registry ignored the Range and its first bytes were read past
    resumed: list[tuple[str, int, int]] = field(default_factory=list)

    # ------------------------------------------------------------------ transport

    def _may_send_credentials(self) -> bool:
        return self.ref.scheme == "https" or self.ref.loopback

    def _connection(self) -> urllib3.HTTPConnectionPool:
        if self._pool is None:
            self._pool, self.proxy = transport.open_pool(self.ref.scheme, self.ref.host,
                                                         self.ref.port, timeout=TIMEOUT)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a registry dropped without close() closes its socket
        self.close()

    def _send(self, method: str, path: str, headers: dict[str, str],
              body: bytes | IO[bytes] | None) -> Response:
        pool = self._connection()
        deadline: transport.Deadline | None = None
        # the answer's status line and headers within the deadline; an upload's body is sent
        # inside urlopen too, as fast as the link allows, so a stream is not held to it
        small = body is None or (isinstance(body, bytes) and len(body) <= MAX_DOCUMENT_BYTES)
        guard: contextlib.AbstractContextManager[transport.Deadline | None] = \
            transport.within(pool, transport.HEADERS_DEADLINE) if small else \
            contextlib.nullcontext(None)
        try:
            with guard as deadline:
                raw = pool.urlopen(method, path, body=body, headers=headers, retries=False,
                                   redirect=False, preload_content=False,
                                   decode_content=False, assert_same_host=False,
                                   release_conn=True)
        except BaseException:
            self.close()
            if deadline is not None and deadline.expired:
                raise stalled(f"{self.ref}: {method} {path}", deadline.seconds) from None
            raise
        return Response(raw.status, {k.lower(): v for k, v in raw.headers.items()}, raw)

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                body: bytes | Callable[[], IO[bytes]] | None = None,
                ok: tuple[int, ...] = (200,), what: str = "") -> Response:
        """One request, retried on a broken connection or a retryable status, authenticated
        on a 401 challenge. ``body``: bytes, or a callable opening a fresh stream (a retry
        sends it again from the start). The response body is left open for streaming."""
        what = what or f"{method} {path}"
        authenticated = False
        attempt = 0
        while True:
            attempt += 1
            sent = dict(headers or {})
            if self._auth:
                sent["Authorization"] = self._auth
            stream = body() if callable(body) else body
            try:
                resp = self._send(method, path, sent, stream)
            except BROKEN as exc:
                if transport.tls_failure(exc):  # a certificate does not get better retried
                    raise RegistryError(f"{self.ref}: {what}: "
                                        f"{transport.tls_message(exc, self.ref.netloc)}",
                                        hint=transport.TLS_HINT) from None
                if attempt >= RETRIES:
                    raise RegistryError(f"{self.ref}: {what}: {type(exc).__name__}: "
                                        f"{as_data(str(exc), 300)} "
                                        f"(after {attempt} attempts)"
                                        + (f" through proxy {self.proxy}" if self.proxy
                                           else ""),
                                        hint="is the registry up and reachable from here?"
                                        + (" (and the proxy: HTTPS_PROXY / NO_PROXY)"
                                           if self.proxy else "")) from None
                self.sleep(transport.backoff(attempt))
                continue
            finally:
                if callable(body) and stream is not None and hasattr(stream, "close"):
                    stream.close()
            if resp.status == 401 and not authenticated:
                self.drain(resp)
                self._authenticate(resp.header("www-authenticate") or "", what)
                authenticated = True
                continue
            if resp.status in ok:
                return resp
            text = self.drain(resp, keep=2000)
            if resp.status in (401, 403):
                source = self.credentials.source
                creds = "no credentials found" if source == "none" else \
                    f"credentials from {source}"
                raise RegistryAuth(
                    f"{self.ref}: {what}: HTTP {resp.status} ({creds}): {as_data(text, 200)}",
                    hint="set ORACLE_BUILD_CACHE_USERNAME and ORACLE_BUILD_CACHE_PASSWORD (or "
                    "ORACLE_BUILD_CACHE_TOKEN), or `docker login` the registry")
            if resp.status in RETRY_STATUS and attempt < RETRIES:
                self.sleep(transport.backoff(
                    attempt, asked=transport.retry_after(resp.header("retry-after"))))
                continue
            if resp.status == 404:
                raise NotCached(f"{self.ref}: {what}: not found (HTTP 404)")
            raise RegistryError(f"{self.ref}: {what}: HTTP {resp.status}: {as_data(text, 300)}"
                                + (f" (after {attempt} attempts)" if attempt > 1 else ""),
                                status=resp.status, codes=error_codes(text))

    def drain(self, resp: Response, keep: int = 0) -> str:
        """Read and close a body no one needs whole (an error's, a redirect's, a 401's);
        return up to ``keep`` bytes of it as text. At most DRAIN_BYTES within
        DRAIN_DEADLINE: an endless or dripping body is cut there and its connection closed
        (never reused), so that it holds nothing up."""
        if resp.body is None:
            return ""
        kept = b""
        seen = 0
        whole = False
        read = getattr(resp.body, "read1", None) or resp.body.read
        pool = self._pool
        try:
            with contextlib.ExitStack() as stack:
                if pool is not None:
                    stack.enter_context(transport.within(pool, DRAIN_DEADLINE))
                start = time.monotonic()
                while seen <= DRAIN_BYTES and time.monotonic() - start <= DRAIN_DEADLINE:
                    chunk = read(min(CHUNK, DRAIN_BYTES + 1 - seen))
                    if not chunk:
                        whole = True
                        break
                    seen += len(chunk)
                    if len(kept) < keep:
                        kept += chunk[: keep - len(kept)]
        except BROKEN:
            pass
        if whole:
            with contextlib.suppress(*BROKEN):
                resp.body.read()  # at its end: read() releases the connection
        else:
            with contextlib.suppress(*BROKEN):
                resp.body.close()
            self.close()
        resp.body = None
        return kept.decode(errors="replace")

    def _authenticate(self, challenge: str, what: str) -> None:
        scheme, _, params_text = challenge.partition(" ")
        params = dict(CHALLENGE.findall(params_text))
        creds = self.credentials
        if not self._may_send_credentials() and (creds.basic or creds.token):
            raise RegistryAuth(f"{self.ref}: {what}: the registry asks for credentials over "
                               f"plain HTTP to {self.ref.host}, which is not loopback: not "
                               "sent", hint="use oci:// (HTTPS) for a remote registry")
        if scheme.lower() == "basic":
            if creds.basic is None:
                raise RegistryAuth(f"{self.ref}: {what}: the registry asks for a user and "
                                   "password (HTTP basic) and none were found",
                                   hint="set ORACLE_BUILD_CACHE_USERNAME and "
                                   "ORACLE_BUILD_CACHE_PASSWORD, or `docker login` it")
            self._auth = creds.basic
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise RegistryAuth(f"{self.ref}: {what}: an auth challenge this client does not "
                               f"speak: {challenge[:200]!r}")
        if creds.token and not creds.username:
            self._auth = f"Bearer {creds.token}"
            return
        self._auth = "Bearer " + self._token(params, what)

    def _token(self, params: dict[str, str], what: str) -> str:
        realm = urllib.parse.urlsplit(params["realm"])
        if realm.scheme not in ("https", "http"):
            raise RegistryAuth(f"{self.ref}: token service {params['realm']!r} is not HTTP(S)")
        scope = params.get("scope") or (f"repository:{self.ref.repository}:"
                                        + ("pull,push" if self.push else "pull"))
        query = urllib.parse.urlencode({k: v for k, v in (("service", params.get("service")),
                                                          ("scope", scope)) if v})
        host = realm.hostname or ""
        port = url_port(realm, f"{self.ref}: token service {params['realm']!r}")
        headers = {}
        loopback = CacheRef(realm.scheme, host, port, "x").loopback
        if self.credentials.basic and (realm.scheme == "https" or loopback):
            headers["Authorization"] = self.credentials.basic
        where = f"token service {as_data(params['realm'], 200)}"
        resp, conn = self._side_get(realm.scheme, host, port,
                                    f"{realm.path or '/'}?{query}", headers, where)
        try:
            data = read_document(resp, where)
        except BROKEN as exc:
            raise RegistryError(f"{where}: {as_data(str(exc), 300)}") from None
        finally:
            conn.close()
        if resp.status in (401, 403):
            raise RegistryAuth(f"{self.ref}: {what}: the token service refused "
                               f"({resp.status}; credentials from {self.credentials.source})")
        if resp.status != 200:
            raise RegistryError(f"token service {as_data(params['realm'], 200)}: HTTP "
                                f"{resp.status}")
        try:
            answer = json_value(data)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryAuth(f"token service {params['realm']} answered without a token")
        return token

    # ------------------------------------------------------------------ API

    def _path(self, kind: str, ref: str) -> str:
        return f"/v2/{self.ref.repository}/{kind}/{ref}"

    @_as_registry_error
    def ping(self) -> None:
        """GET /v2/: the registry answers (authenticating if it asks)."""
        self.drain(self.request("GET", "/v2/", what="GET /v2/"))

    @_as_registry_error
    def has_blob(self, digest: str) -> bool:
        try:
            resp = self.request("HEAD", self._path("blobs", digest), what=f"HEAD blob {digest}")
        except NotCached:
            return False
        self.drain(resp)
        return True

    @_as_registry_error
    def upload_blob(self, digest: str, size: int, opener: Callable[[], IO[bytes]]) -> None:
        """A monolithic upload (POST, then PUT with the digest), the body streamed."""
        resp = self.request("POST", f"/v2/{self.ref.repository}/blobs/uploads/", ok=(202,),
                            headers={"Content-Length": "0"}, what=f"start upload {digest}")
        self.drain(resp)
        location = resp.header("location")
        if not location:
            raise RegistryError(f"{self.ref}: the upload of {digest} got no Location")
        split = urllib.parse.urlsplit(location)
        if split.netloc and split.netloc != self.ref.netloc:
            raise RegistryError(f"{self.ref}: the upload of {digest} is redirected to another "
                                f"host ({split.netloc}): not followed")
        query = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        query.append(("digest", digest))
        path = f"{split.path}?{urllib.parse.urlencode(query)}"
        self.drain(self.request("PUT", path, body=opener, ok=(201,), what=f"upload {digest}",
                                headers={"Content-Type": "application/octet-stream",
                                         "Content-Length": str(size)}))

    @_as_registry_error
    def push_blob_bytes(self, data: bytes) -> tuple[str, int]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest):
            self.upload_blob(digest, len(data), lambda: io.BytesIO(data))
        return digest, len(data)

    @_as_registry_error
    def stream_blob(self, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes, chunk by chunk, checked against ``digest`` and ``size`` as they
        stream: more bytes than ``size`` stop at once; a wrong digest raises after the last
        chunk, before the caller may keep anything (CacheRefused)."""
        if not DIGEST.match(digest):
            raise CacheRefused(f"{digest!r} is not a sha256 digest")
        resp = self._open_blob(digest, 0)
        hasher = hashlib.sha256()
        seen = 0
        breaks = 0  # consecutive breaks without a byte between them
        floor = RateFloor(BLOB_MIN_RATE, BLOB_WINDOW)
        while True:
            assert resp.body is not None
            # a resumed answer: 206 from the byte asked, or 200 from the start when the
            # registry ignores ranges (the bytes already verified are then read past)
            skip = seen if resp.status == 200 else 0
            # read1: what has arrived, so a slow registry is measured as it drips
            read = getattr(resp.body, "read1", None) or resp.body.read
            before = seen
            try:
                while chunk := read(CHUNK):
                    if skip:
                        dropped = min(skip, len(chunk))
                        skip -= dropped
                        chunk = chunk[dropped:]
                        if not chunk:
                            continue
                    seen += len(chunk)
                    if (slow := floor.slow(seen)) is not None:
                        raise RegistryError(
                            f"{self.ref}: GET blob {digest}: {slow[0] / 1024:.1f} KiB/s over "
                            f"the last {slow[1]:.0f} s, below the minimum of "
                            f"{BLOB_MIN_RATE // 1024} KiB/s ({seen} of {size} bytes)",
                            hint="is the registry (or a proxy before it) healthy?")
                    if seen > size:
                        raise CacheRefused(f"{self.ref}: blob {digest} is longer than the "
                                           f"{size} bytes its descriptor says")
                    hasher.update(chunk)
                    yield chunk
                if seen < size and getattr(resp.body, "length_remaining", None):
                    # short of its own Content-Length: the connection broke off (an answer
                    # whole by its length but short of the descriptor is refused below)
                    raise http.client.IncompleteRead(b"", resp.body.length_remaining)
                resp.body.read()  # at its end: read() closes the response (read1 never does)
                if skip:
                    raise RegistryError(f"{self.ref}: GET blob {digest}: the restarted "
                                        f"answer ended before the {seen} bytes already had")
                break
            except BROKEN as exc:
                self._drop(resp)
                self.close()  # that connection is gone: the resume opens a new one
                breaks = breaks + 1 if seen == before else 1
                if seen >= size or breaks >= RETRIES:
                    raise RegistryError(f"{self.ref}: GET blob {digest}: {type(exc).__name__}: "
                                        f"{as_data(str(exc), 300)} "
                                        f"after {seen} of {size} bytes") from None
                say(f"    blob {digest[:19]}: the connection broke after {seen} of {size} "
                    f"bytes ({type(exc).__name__}); resuming from byte {seen}")
                self.sleep(transport.backoff(breaks))
                resp = self._open_blob(digest, seen)
                self.resumed.append((digest, seen, resp.status))
            except BaseException:
                resp.body = None
                raise
        resp.body = None
        if seen != size:
            raise CacheRefused(f"{self.ref}: blob {digest}: {seen} bytes, its descriptor says "
                               f"{size}")
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise CacheRefused(f"{self.ref}: blob {digest} arrived with sha256 {got}: the "
                               "registry served other bytes under that digest",
                               hint="the registry's storage is damaged or tampered with; "
                               "nothing from it was kept")

    def _open_blob(self, digest: str, offset: int) -> Response:
        """GET a blob, from byte ``offset`` on (a Range request) when it is not 0; an
        answer of 206 must start at that byte."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            first = self.request("GET", self._path("blobs", digest), headers=headers,
                                 ok=(200, 206, 307, 302, 301, 303, 308),
                                 what=f"GET blob {digest}")
        except NotCached:
            raise CacheRefused(f"{self.ref}: blob {digest} is listed but the registry does "
                               "not have it: an incomplete artifact") from None
        resp = self._follow(first, digest, headers)
        if resp.status == 206:
            span = resp.header("content-range") or ""
            if not offset or not re.fullmatch(rf"bytes {offset}-[0-9]+/([0-9]+|\*)", span):
                self._drop(resp)
                raise RegistryError(f"{self.ref}: GET blob {digest}: a partial answer "
                                    f"({as_data(span, 100) or 'no Content-Range'}) to a "
                                    f"request from byte {offset}")
        return resp

    @staticmethod
    def _drop(resp: Response) -> None:
        if resp.body is not None:
            with contextlib.suppress(*BROKEN):
                resp.body.close()
            resp.body = None

    def _follow(self, resp: Response, digest: str,
                extra: dict[str, str] | None = None) -> Response:
        """A blob served from elsewhere (a storage backend): followed once, without our
        Authorization header when the host differs (``extra``: a Range, sent there too)."""
        if resp.status in (200, 206):
            return resp
        location = resp.header("location") or ""
        self.drain(resp)
        split = urllib.parse.urlsplit(location)
        if split.scheme not in ("http", "https"):
            raise RegistryError(f"{self.ref}: blob {digest} redirected to {location!r}")
        if split.scheme == "http" and self.ref.scheme == "https":
            raise RegistryError(f"{self.ref}: blob {digest} redirected from HTTPS to plain "
                                f"HTTP ({split.netloc}): not followed")
        port = url_port(split, f"{self.ref}: blob {digest} redirected to {location!r}")
        headers = dict(extra or {})
        if split.netloc == self.ref.netloc and self._auth:
            headers["Authorization"] = self._auth
        raw, conn = self._side_get(split.scheme, split.hostname or "", port,
                                   split.path + (f"?{split.query}" if split.query else ""),
                                   headers, f"{self.ref}: blob {digest} at "
                                   f"{as_data(split.netloc, 200)}")
        if raw.status not in (200, 206):
            conn.close()
            raise RegistryError(f"{self.ref}: blob {digest} at {as_data(split.netloc, 200)}: "
                                f"HTTP {raw.status}", status=raw.status)
        return Response(raw.status, {k.lower(): v for k, v in raw.headers.items()}, raw)

    def _side_get(self, scheme: str, host: str, port: int, path: str,
                  headers: dict[str, str], where: str
                  ) -> tuple[urllib3.BaseHTTPResponse, urllib3.HTTPConnectionPool]:
        """A GET on a connection of its own (a token service, a blob's storage), retried
        as the registry's own requests are: a broken connection, 429 and 5xx (Retry-After
        honoured), never a TLS failure. The response is open; the caller closes ``conn``."""
        attempt = 0
        while True:
            attempt += 1
            conn, proxy = transport.open_pool(scheme, host, port, timeout=TIMEOUT)
            deadline: transport.Deadline | None = None
            try:
                with transport.within(conn, transport.HEADERS_DEADLINE) as deadline:
                    raw = conn.urlopen("GET", path, headers=headers, retries=False,
                                       redirect=False, preload_content=False,
                                       decode_content=False, assert_same_host=False,
                                       release_conn=True)
            except BROKEN as exc:
                conn.close()
                if deadline is not None and deadline.expired:
                    raise stalled(where, deadline.seconds) from None
                if transport.tls_failure(exc):
                    raise RegistryError(f"{where}: {transport.tls_message(exc, host)}",
                                        hint=transport.TLS_HINT) from None
                if attempt >= RETRIES:
                    raise RegistryError(f"{where}: {type(exc).__name__}: "
                                        f"{as_data(str(exc), 300)} (after {attempt} attempts)"
                                        + (f" through proxy {proxy}" if proxy else "")
                                        ) from None
                self.sleep(transport.backoff(attempt))
                continue
            if raw.status in RETRY_STATUS and attempt < RETRIES:
                asked = transport.retry_after(raw.headers.get("retry-after"))
                conn.close()
                self.sleep(transport.backoff(attempt, asked=asked))
                continue
            return raw, conn

    @_as_registry_error
    def blob_bytes(self, digest: str, size: int) -> bytes:
        """A small blob (a config, an envelope) in memory, verified."""
        if size > MAX_DOCUMENT_BYTES:
            raise CacheRefused(f"{self.ref}: blob {digest} is {size} bytes; a document is at "
                               f"most {MAX_DOCUMENT_BYTES}")
        return b"".join(self.stream_blob(digest, size))

    @_as_registry_error
    def get_manifest(self, reference: str, *, accept: str = OCI_MANIFEST) -> tuple[bytes, str]:
        """A manifest's bytes and digest (computed here: the header is only checked)."""
        resp = self.request("GET", self._path("manifests", reference),
                            headers={"Accept": accept}, what=f"GET manifest {reference}")
        assert resp.body is not None
        data = read_document(resp.body, f"{self.ref}: GET manifest {reference}")
        self.drain(resp)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise CacheRefused(f"{self.ref}: manifest {reference} is larger than "
                               f"{MAX_DOCUMENT_BYTES} bytes")
        stated_length = resp.header("content-length")
        if stated_length and stated_length.isdigit() and int(stated_length) != len(data):
            raise RegistryError(f"{self.ref}: GET manifest {reference}: the answer broke off "
                                f"after {len(data)} of its {int(stated_length)} bytes",
                                hint="is the registry (or a proxy before it) healthy?")
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if reference.startswith("sha256:") and reference != digest:
            raise CacheRefused(f"{self.ref}: manifest {reference} arrived with digest {digest}")
        stated = resp.header("docker-content-digest")
        if stated and reference.startswith("sha256:") and stated != digest:
            raise CacheRefused(f"{self.ref}: manifest {reference}: the registry says {stated}")
        return data, digest

    @_as_registry_error
    def has_manifest(self, reference: str) -> str | None:
        """The digest the registry gives for a tag, or None when it has no such tag."""
        try:
            resp = self.request("HEAD", self._path("manifests", reference),
                                headers={"Accept": OCI_MANIFEST},
                                what=f"HEAD manifest {reference}")
        except NotCached:
            return None
        self.drain(resp)
        return resp.header("docker-content-digest") or ""

    @_as_registry_error
    def put_manifest(self, reference: str, data: bytes) -> str:
        resp = self.request("PUT", self._path("manifests", reference), body=data, ok=(201,),
                            headers={"Content-Type": OCI_MANIFEST,
                                     "Content-Length": str(len(data))},
                            what=f"PUT manifest {reference}")
        self.drain(resp)
        return "sha256:" + hashlib.sha256(data).hexdigest()

    @_as_registry_error
    def list_tags(self, *, pages: int = 50, page_size: int = 1000) -> list[str]:
        """Every tag of the repository (the tags API, its Link pages followed on this
        registry only, at most ``pages`` of them); [] for a repository it does not know."""
        tags: list[str] = []
        path: str | None = f"/v2/{self.ref.repository}/tags/list?n={page_size}"
        for _ in range(pages):
            if path is None:
                break
            try:
                resp = self.request("GET", path, what="GET tags")
            except NotCached:
                return tags
            assert resp.body is not None
            data = read_document(resp.body, f"{self.ref}: GET tags")
            self.drain(resp)
            try:
                listed = json_value(data).get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(f"{self.ref}: GET tags: not a tag list") from None
            if not isinstance(listed, list):
                raise RegistryError(f"{self.ref}: GET tags: not a tag list")
            tags += [t for t in listed if isinstance(t, str) and OCI_TAG.fullmatch(t)]
            path = next_page(resp.header("link"), self.ref.repository)
        return tags

    @_as_registry_error
    def referrers(self, digest: str) -> list[dict[str, Any]] | None:
        """The referrers API's manifests for ``digest``; None when the registry lacks it."""
        try:
            resp = self.request("GET", f"/v2/{self.ref.repository}/referrers/{digest}",
                                headers={"Accept": OCI_INDEX}, what=f"GET referrers {digest}")
        except NotCached:
            return None
        assert resp.body is not None
        data = read_document(resp.body, f"{self.ref}: GET referrers {digest}")
        self.drain(resp)
        if (resp.header("content-type") or "").split(";")[0] != OCI_INDEX:
            return None
        try:
            index = json_value(data)
        except ValueError:
            return None
        manifests = index.get("manifests") if isinstance(index, dict) else None
        return manifests if isinstance(manifests, list) else None
