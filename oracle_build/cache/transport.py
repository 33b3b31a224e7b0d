"""How a connection to a registry is made and when a failed request is tried again.

The HTTP itself is urllib3's (chosen by measurement over the standard library's
http.client, docs/cache.md): connection pools, TLS, proxy tunnels. Retrying, redirects and
every check of what arrives stay the registry client's (registry.py): urllib3 is told
never to retry or follow on its own.

- **TLS**: the system trust store (OpenSSL's default paths: a company CA installed on the
  host is trusted without configuration), ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured.
  A certificate failure is not a broken connection: it is never retried, and says the
  host, what failed and how to trust the CA (``tls_failure``).
- **Proxies**: ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` and their lower-case forms,
  read as pip, uv and docker read them (a proxy by the registry's scheme, ``NO_PROXY`` a
  list of hosts, domains and ``*``). The connection is a tunnel through the proxy (HTTP
  CONNECT), so the registry's credentials, like every byte, pass inside it: the proxy sees
  the host and port, never an Authorization header. A proxy's own user and password (in
  its URL) go to the proxy alone, as Proxy-Authorization on the CONNECT.
- **Retries**: jittered exponential backoff, a registry's ``Retry-After`` (seconds or an
  HTTP date) honoured up to ``MAX_RETRY_AFTER``.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
import urllib3.connection

TIMEOUT = 60.0  # per read: a registry that sends nothing for this long is gone
CHUNK = 1 << 20  # bodies stream in chunks of this size, both ways
MAX_RETRY_AFTER = 30.0  # a registry asking for longer is waited for this long, then asked
# A registry's answer has its status line and headers within this, however it drips them
# (the read timeout is per read: a byte every few seconds would never meet it)
HEADERS_DEADLINE = 60.0


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # Proxy-Authorization for the CONNECT, from the proxy's URL

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"  # never its user and password


def proxy_for(scheme: str, host: str, environ: Mapping[str, str] | None = None
              ) -> Proxy | None:
    """The proxy a connection to ``host`` over ``scheme`` goes through, or None."""
    env = os.environ if environ is None else environ

    def variable(name: str) -> str:  # the lower-case form first, as curl and urllib
        return env.get(name) or env.get(name.upper()) or ""

    url = variable(f"{scheme}_proxy")
    if not url:
        return None
    no_proxy = variable("no_proxy")
    if no_proxy and bypassed(host, no_proxy):
        return None
    if "://" not in url:
        url = "http://" + url
    split = urllib.parse.urlsplit(url)
    if not split.hostname:
        return None
    try:
        port = split.port or (443 if split.scheme == "https" else 80)
    except ValueError:
        return None
    auth = None
    if split.username is not None:
        user = urllib.parse.unquote(split.username)
        password = urllib.parse.unquote(split.password or "")
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return Proxy(split.hostname, port, auth)


def bypassed(host: str, no_proxy: str) -> bool:
    """NO_PROXY as curl reads it: ``*``; a host; a domain (``.example.com`` or
    ``example.com``, its subdomains included); a host:port entry matches the host."""
    host = host.strip("[]").lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name = entry.strip("[]")
        if ":" in name and name.count(":") == 1:
            name = name.split(":", 1)[0]
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def tls_context() -> ssl.SSLContext:
    """The system trust store, and SSL_CERT_FILE / SSL_CERT_DIR when set (OpenSSL's own
    variables: read again for every connection)."""
    context = ssl.create_default_context()
    cafile = os.environ.get("SSL_CERT_FILE")
    capath = os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        context.load_verify_locations(cafile=cafile or None, capath=capath or None)
    return context


class _TunnelConnection(urllib3.connection.HTTPConnection):
    """Connects to the proxy, then CONNECTs to ``target`` (again after every reconnect:
    urllib3 clears a tunnel when it closes a connection)."""

    target: tuple[str, int] = ("", 0)
    proxy_auth: str | None = None

    def connect(self) -> None:
        if self._tunnel_host is None:
            self.set_tunnel(self.target[0], self.target[1], headers={
                "Proxy-Authorization": self.proxy_auth} if self.proxy_auth else None)
        super().connect()


class _TunnelPool(urllib3.HTTPConnectionPool):
    """A plain-HTTP registry through a proxy, tunnelled (CONNECT) as HTTPS is: urllib3
    forwards plain HTTP to a proxy instead, Authorization header and all."""

    def __init__(self, proxy: Proxy, host: str, port: int, **kw: Any) -> None:
        super().__init__(proxy.host, proxy.port, **kw)
        self.ConnectionCls = type("TunnelConnection", (_TunnelConnection,), {
            "target": (host, port), "proxy_auth": proxy.authorization})


class Deadline:
    """A watchdog over one pool's connections: past ``seconds`` it shuts their sockets, so a
    read blocked on a registry that drips (or sends nothing) returns at once, broken;
    ``expired`` then says why. Ended (``end``) before it fires, it does nothing: the answer
    the caller goes on reading is untouched."""

    def __init__(self, pool: urllib3.HTTPConnectionPool, seconds: float) -> None:
        self.pool = pool
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._ended = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._ended:
                return
            self.expired = True
        for conn in list(getattr(self.pool, "live_connections", ())):
            sock = getattr(conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def end(self) -> None:
        with self._lock:
            self._ended = True
        self._timer.cancel()


@contextlib.contextmanager
def within(pool: urllib3.HTTPConnectionPool, seconds: float) -> Iterator[Deadline]:
    deadline = Deadline(pool, seconds)
    try:
        yield deadline
    finally:
        deadline.end()


def _tracked(pool: urllib3.HTTPConnectionPool) -> urllib3.HTTPConnectionPool:
    """Every connection the pool makes is known to it (``live_connections``), for a
    Deadline to cut."""
    live: weakref.WeakSet[Any] = weakref.WeakSet()
    base = pool.ConnectionCls

    def init(self: Any, *a: Any, **kw: Any) -> None:
        base.__init__(self, *a, **kw)
        live.add(self)

    pool.ConnectionCls = type(f"Tracked{base.__name__}", (base,), {"__init__": init})
    pool.live_connections = live  # type: ignore[attr-defined]
    return pool


def open_pool(scheme: str, host: str, port: int, *, timeout: float = TIMEOUT,
              blocksize: int = CHUNK) -> tuple[urllib3.HTTPConnectionPool, Proxy | None]:
    """A connection pool to ``host:port`` (urllib3), through the environment's proxy for
    ``scheme`` when there is one; urllib3 itself never retries or redirects here (the
    registry client decides both)."""
    host = host.strip("[]")
    proxy = proxy_for(scheme, host)
    kw: dict[str, Any] = {"timeout": urllib3.Timeout(connect=timeout, read=timeout),
                          "retries": False, "maxsize": 1, "blocksize": blocksize}
    if scheme == "https":
        kw["ssl_context"] = tls_context()
    if proxy is None:
        cls = urllib3.HTTPSConnectionPool if scheme == "https" else urllib3.HTTPConnectionPool
        return _tracked(cls(host, port, **kw)), None
    if scheme == "http":
        return _tracked(_TunnelPool(proxy, host, port, **kw)), proxy
    manager = urllib3.ProxyManager(
        f"http://{proxy.host}:{proxy.port}", proxy_headers={
            "Proxy-Authorization": proxy.authorization} if proxy.authorization else None,
        **kw)
    return _tracked(manager.connection_from_host(host, port, scheme="https")), proxy


def _tls_cause(exc: BaseException | None) -> BaseException | None:
    """The ssl error under ``exc`` (urllib3 wraps it, a proxy error wraps that), or None."""
    seen = 0
    while exc is not None and seen < 6:
        if isinstance(exc, ssl.SSLError | ssl.CertificateError):
            return exc
        if isinstance(exc, urllib3.exceptions.SSLError) and not exc.args:
            return exc
        inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
        exc = inner or exc.__cause__ or exc.__context__
        seen += 1
    return None


def tls_failure(exc: BaseException) -> bool:
    """A TLS failure (a certificate that does not verify, a handshake refused): retrying
    cannot help."""
    return isinstance(exc, urllib3.exceptions.SSLError) or _tls_cause(exc) is not None


def tls_message(exc: BaseException, host: str) -> str:
    cause = _tls_cause(exc) or exc
    reason = getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or \
        str(cause)
    return f"TLS to {host} failed: {reason}"


TLS_HINT = ("if the registry's certificate comes from your own CA, install the CA in the "
            "system trust store (update-ca-certificates) or set SSL_CERT_FILE to a PEM "
            "bundle holding it")


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's wait in seconds (a number, or an HTTP date), bounded; None
    when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    wait = when.timestamp() - (time.time() if now is None else now)
    return min(max(wait, 0.0), MAX_RETRY_AFTER)


def backoff(attempt: int, *, base: float = 0.5, cap: float = 8.0,
            asked: float | None = None, rng: random.Random | None = None) -> float:
    """The wait before attempt ``attempt + 1``: what the registry asked (Retry-After), else
    full jitter over base * 2^(attempt-1), capped (many hosts retrying one registry at once
    then spread out instead of arriving together)."""
    if asked is not None:
        return asked
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(ceiling / 2, ceiling)

