"""The registry transport in the field (issue 32, items 2, 3 and 5): TLS from a company CA,
a forward proxy, retries that respect the registry, and a blob download that resumes with a
Range request where it broke. Real servers on 127.0.0.1 (Debian's docker-registry with TLS
from a certificate made here, a CONNECT proxy, HTTP servers that break as told); fast."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import os
import random
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from oracle_build.cache import transport
from oracle_build.cache.ref import parse
from oracle_build.cache.registry import Registry
from oracle_build.core.errors import EXIT_REGISTRY, RegistryError
from tests import registry as regmod

# ------------------------------------------------------------------------- small servers


class Server:
    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *a: None  # type: ignore[method-assign]
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(handler: type[http.server.BaseHTTPRequestHandler]) -> Server:
        servers.append(Server(handler))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


BLOB = os.urandom(3 << 20)  # three chunks and more
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


class Breaking(http.server.BaseHTTPRequestHandler):
    """Serves BLOB; the first GET breaks after ``cut`` bytes (a reset); later ones honour a
    Range (206) unless ``ranges`` is False (200, the whole blob again)."""

    protocol_version = "HTTP/1.1"
    cut = 1 << 20
    ranges = True
    asked: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v2":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        rng = self.headers.get("Range")
        type(self).asked.append(rng)
        if len(type(self).asked) == 1:  # the first: cut mid-blob
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.wfile.write(BLOB[:type(self).cut])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        start = int(rng.removeprefix("bytes=").rstrip("-")) if rng and type(self).ranges else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}")
        self.send_header("Content-Length", str(len(BLOB) - start))
        self.end_headers()
        self.wfile.write(BLOB[start:])

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_a_broken_blob_download_resumes_from_the_last_verified_byte(serve: Any,
                                                                    ranges: bool) -> None:
    """A connection cut after 1 MiB of a 3 MiB blob: the download goes on with a Range
    request from the byte it reached, its hash continued (the bytes yielded are the blob's,
    once each); a registry that ignores ranges answers 200, and the bytes already verified
    are read past instead of yielded again (issue 32 item 5)."""
    handler = type("H", (Breaking,), {"asked": [], "ranges": ranges})
    server = serve(handler)
    ref = parse(f"oci+http://127.0.0.1:{server.port}/a/b")
    waits: list[float] = []
    with Registry(ref, sleep=waits.append) as reg:
        got = b"".join(reg.stream_blob(DIGEST, len(BLOB)))
        assert got == BLOB
        (digest, offset, status), = reg.resumed
    assert digest == DIGEST and offset >= 1 << 20 and offset < len(BLOB)
    assert handler.asked[0] is None and handler.asked[1] == f"bytes={offset}-"
    assert status == (206 if ranges else 200)
    assert len(waits) == 1


def test_a_blob_that_keeps_breaking_fails_clearly(serve: Any) -> None:
    class Always(Breaking):
        def do_GET(self) -> None:
            type(self).asked.append(self.headers.get("Range"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    handler = type("A", (Always,), {"asked": []})
    server = serve(handler)
    ref = parse(f"oci+http://127.0.0.1:{server.port}/a/b")
    with Registry(ref, sleep=lambda _s: None) as reg, \
            pytest.raises(RegistryError, match="after 0 of") as info:
        b"".join(reg.stream_blob(DIGEST, len(BLOB)))
    assert info.value.exit_code == EXIT_REGISTRY
    assert len(handler.asked) == 4  # RETRIES breaks without progress, then it gives up


class Busy(regmod.Quiet):
    """429 with a Retry-After (seconds or a date) for the first ``busy`` requests."""

    busy = 1
    after = "3"
    seen = 0

    def do_GET(self) -> None:
        type(self).seen += 1
        if type(self).seen <= type(self).busy:
            self.reply(429, Retry_After=type(self).after)
            return
        self.reply(200, b"{}")


def test_retry_after_is_honoured_and_bounded(serve: Any) -> None:
    for after, low, high in (("3", 3.0, 3.0), ("86400", 30.0, 30.0), ("soon", 0.25, 0.5)):
        handler = type("B", (Busy,), {"after": after, "seen": 0})
        server = serve(handler)
        waits: list[float] = []
        with Registry(parse(f"oci+http://127.0.0.1:{server.port}/a/b"),
                      sleep=waits.append) as reg:
            reg.ping()
        assert len(waits) == 1 and low <= waits[0] <= high, (after, waits)
    when = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=10))
    wait = transport.retry_after(when.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    assert wait is not None and 5 < wait <= 10


def test_backoff_is_jittered() -> None:
    """Many hosts retrying one registry spread out: full jitter over a doubling ceiling."""
    rng = random.Random(1)
    first = [transport.backoff(1, rng=rng) for _ in range(50)]
    assert all(0.25 <= w <= 0.5 for w in first) and len(set(first)) == 50
    assert all(4.0 <= transport.backoff(9, rng=rng) <= 8.0 for _ in range(20))


class TokenFlaky(regmod.Quiet):
    """A registry asking for a bearer token, whose token service answers 503 once."""

    seen_token = 0

    def do_GET(self) -> None:
        if self.path.startswith("/token"):
            type(self).seen_token += 1
            if type(self).seen_token == 1:
                self.reply(503)
                return
            self.reply(200, b'{"token": "t0k"}')  # to anyone: an anonymous pull's token
            return
        if self.headers.get("Authorization") != "Bearer t0k":
            port = self.server.server_address[1]
            self.reply(401, WWW_Authenticate=f'Bearer realm="http://127.0.0.1:{port}/token",'
                       'service="r"')
            return
        self.reply(200, b"{}")


def test_the_token_request_is_retried_like_the_rest(serve: Any) -> None:
    handler = type("T", (TokenFlaky,), {"seen_token": 0})
    server = serve(handler)
    waits: list[float] = []
    with Registry(parse(f"oci+http://127.0.0.1:{server.port}/a/b"), sleep=waits.append) as reg:
        reg.ping()
    assert handler.seen_token == 2 and len(waits) == 1


# ------------------------------------------------------------------------------- TLS


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A CA-signed certificate for 127.0.0.1 (the CA is the test's: a company's own)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oracle-build test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return folder / "ca.pem", folder


def test_tls_from_a_company_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's docker-registry over TLS with a certificate from the test's own CA: refused
    without that CA, at once and without a retry, naming the host, the verification error
    and how to trust the CA (exit 15); trusted through SSL_CERT_FILE (issue 32 item 2)."""
    ca, certs = make_certificate(tmp_path / "certs")
    server = regmod.start(tmp_path / "reg", tls=(certs / "server.pem", certs / "server.key"))
    try:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(var, raising=False)
        ref = parse(f"oci://127.0.0.1:{server.port}/team/oracles")
        waits: list[float] = []
        start = time.monotonic()
        with Registry(ref, sleep=waits.append) as reg, \
                pytest.raises(RegistryError) as refused:
            reg.ping()
        assert time.monotonic() - start < 5 and waits == []  # not retried
        text = refused.value.render()
        # OpenSSL's words: "unable to get local issuer certificate"
        assert f"TLS to 127.0.0.1:{server.port} failed: " in text and "certificate" in text
        assert "SSL_CERT_FILE" in text and refused.value.exit_code == EXIT_REGISTRY
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        with Registry(ref) as reg:
            reg.ping()
            assert not reg.has_blob("sha256:" + "0" * 64)
    finally:
        server.stop()


# ----------------------------------------------------------------------------- proxies


class ConnectProxy:
    """A forward proxy on 127.0.0.1 that speaks CONNECT and records what it was sent.
    ``cut_after``: the first tunnel to carry more than this many bytes towards the client
    is cut there (once), as a proxy dropping a long download does."""

    def __init__(self, cut_after: int | None = None) -> None:
        self.cut_after = cut_after
        self.cuts = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []  # each CONNECT's head, as the proxy saw it
        self.tunnelled = 0  # bytes it carried
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        self.requests.append(head)
        if not head.startswith(b"CONNECT "):  # this proxy tunnels only (the test's point)
            client.sendall(b"HTTP/1.1 405 CONNECT only\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        target = head.split(b" ", 2)[1].decode()
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pair = {client: upstream, upstream: client}
        down = 0
        try:
            while True:
                ready, _, _ = select.select(list(pair), [], [], 30)
                if not ready:
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        raise OSError
                    self.tunnelled += len(data)
                    if s is upstream:
                        down += len(data)
                        if self.cut_after is not None and not self.cuts and \
                                down > self.cut_after:
                            self.cuts += 1
                            client.sendall(data[:len(data) - (down - self.cut_after)])
                            raise OSError  # the tunnel cut mid-answer
                    pair[s].sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.sock.close()


class Authed(regmod.Quiet):
    saw: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).saw.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") is None:
            self.reply(401, WWW_Authenticate='Basic realm="r"')
            return
        self.reply(200, b"{}")


def test_a_pull_goes_through_the_proxy_and_its_credentials_do_not(
        serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY (and HTTPS_PROXY, lower-case forms first) send every connection through
    the proxy as a CONNECT tunnel: the proxy sees the registry's host and port and its own
    Proxy-Authorization, never the registry's Authorization; NO_PROXY bypasses it (issue 32
    item 3)."""
    from oracle_build.cache.credentials import Credentials

    proxy = ConnectProxy()
    handler = type("A", (Authed,), {"saw": []})
    server = serve(handler)
    try:
        for var in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://pu:pp@127.0.0.1:{proxy.port}")
        ref = parse(f"oci+http://127.0.0.1:{server.port}/a/b")
        creds = Credentials("ci", "S3cretPW", source="test")
        with Registry(ref, creds) as reg:
            reg.ping()
            assert str(reg.proxy) == f"127.0.0.1:{proxy.port}"
        assert handler.saw[-1] is not None and handler.saw[-1].startswith("Basic ")
        assert proxy.requests  # a connection for the challenge, one for the answer
        for head in proxy.requests:
            assert head.startswith(f"CONNECT 127.0.0.1:{server.port} ".encode())
            assert b"Proxy-Authorization: Basic cHU6cHA=" in head  # pu:pp, to the proxy alone
            assert b"S3cretPW" not in head and b"Authorization: Basic Y2k6" not in head
        assert proxy.tunnelled > 0
        through = len(proxy.requests)
        monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
        with Registry(ref, creds) as reg:
            reg.ping()
            assert reg.proxy is None
        assert len(proxy.requests) == through
    finally:
        proxy.close()


def test_a_download_the_proxy_cuts_resumes_from_the_registry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's docker-registry behind the test's proxy, which cuts the tunnel after 1.5 MiB
    of a 3 MiB blob: the download resumes with a Range request through the proxy, and the
    registry answers 206 from that byte (issue 32 item 5)."""
    server = regmod.start(tmp_path / "reg")
    proxy = ConnectProxy(cut_after=3 << 19)
    try:
        for var in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(var, raising=False)
        ref = parse(server.ref("t/cut"))
        with Registry(ref) as reg:
            digest, size = reg.push_blob_bytes(BLOB)
        monkeypatch.setenv("http_proxy", f"127.0.0.1:{proxy.port}")
        waits: list[float] = []
        with Registry(ref, sleep=waits.append) as reg:
            assert b"".join(reg.stream_blob(digest, size)) == BLOB
            assert reg.proxy is not None
            (_d, offset, status), = reg.resumed
        assert proxy.cuts == 1 and status == 206
        assert 1 << 20 <= offset <= 3 << 19, offset
        assert len(proxy.requests) >= 2
    finally:
        proxy.close()
        server.stop()


def test_proxy_variables_as_pip_and_curl_read_them() -> None:
    env = {"https_proxy": "http://p:3128", "HTTPS_PROXY": "http://other:1",
           "NO_PROXY": ".corp.example, registry.local:5000"}
    found = transport.proxy_for("https", "ghcr.io", env)
    assert found is not None and (found.host, found.port) == ("p", 3128)
    assert transport.proxy_for("https", "a.corp.example", env) is None
    assert transport.proxy_for("https", "corp.example", env) is None
    assert transport.proxy_for("https", "registry.local", env) is None
    assert transport.proxy_for("http", "ghcr.io", env) is None  # no http_proxy set
    assert transport.proxy_for("https", "x", {"HTTPS_PROXY": "p:8080", "no_proxy": "*"}) is None
    bare = transport.proxy_for("https", "x", {"HTTPS_PROXY": "p:8080"})
    assert bare is not None and (bare.port, bare.authorization) == (8080, None)


# ------------------------------------------------------------------- credential helpers


def helper_script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"docker-credential-{name}"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_credentials_from_a_docker_credential_helper(tmp_path: Path) -> None:
    """`docker login` on a desktop leaves `credHelpers` (per host) or `credsStore`: the
    helper is run as the protocol says (`get`, the host on stdin, JSON on stdout), against
    Debian's docker-registry with htpasswd; a helper that is missing or fails is named,
    exit 16; one that holds nothing for the host leaves the pull anonymous (issue 32
    item 4)."""
    import json

    from oracle_build.cache.credentials import credentials_for
    from oracle_build.core.errors import EXIT_REGISTRY_AUTH, RegistryAuth

    server = regmod.start(tmp_path / "reg", auth=("ci", "S3cretPW"))
    try:
        bin_dir = tmp_path / "bin"
        asked = tmp_path / "asked"
        helper_script(bin_dir, "teststore", f'[ "$1" = get ] || exit 3\ncat > {asked}\n'
                      'printf \'{"ServerURL":"x","Username":"ci","Secret":"S3cretPW"}\'\n')
        helper_script(bin_dir, "broken", 'echo "keyring locked" >&2\nexit 1\n')
        helper_script(bin_dir, "empty", 'echo "credentials not found in native keychain"\n'
                      'exit 1\n')
        docker = tmp_path / "docker"
        docker.mkdir()
        env = {"DOCKER_CONFIG": str(docker), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        ref = parse(f"oci+http://127.0.0.1:{server.port}/team/oracles")
        netloc = f"127.0.0.1:{server.port}"
        for config in ({"credHelpers": {netloc: "teststore"}, "credsStore": "broken"},
                       {"credsStore": "teststore"}):
            (docker / "config.json").write_text(json.dumps(config))
            creds = credentials_for(ref, env)
            assert (creds.username, creds.password) == ("ci", "S3cretPW")
            assert "docker-credential-teststore" in creds.source
            assert asked.read_text() == netloc
            with Registry(ref, creds) as reg:
                reg.ping()
                assert not reg.has_blob("sha256:" + "0" * 64)
        for name, words in (("broken", "failed, exit 1: keyring locked"),
                            ("nothere", "which is not on PATH")):
            (docker / "config.json").write_text(json.dumps({"credsStore": name}))
            with pytest.raises(RegistryAuth) as refused:
                credentials_for(ref, env)
            assert f"docker-credential-{name}" in refused.value.message
            assert words in refused.value.message and \
                refused.value.exit_code == EXIT_REGISTRY_AUTH
        (docker / "config.json").write_text(json.dumps({"credsStore": "empty"}))
        creds = credentials_for(ref, env)
        assert creds.basic is None and creds.token is None
        with Registry(ref, creds) as reg, pytest.raises(RegistryAuth, match="none were found"):
            reg.ping()  # anonymous, and this registry wants a user
    finally:
        server.stop()


def test_a_credential_helper_is_held_to_its_own_exit_and_its_children_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 item 8: a helper that answered but left a child holding its output held the
    pull until the helper timeout (exit 16 after 31 s), and a hung helper's child kept
    running. Its answer is what it wrote by its exit, and everything it started ends with
    it, answered or hung."""
    import json
    import time

    from oracle_build.cache import credentials as regmodule
    from oracle_build.cache.credentials import credentials_for
    from oracle_build.core.errors import RegistryAuth

    bin_dir, docker = tmp_path / "bin", tmp_path / "docker"
    docker.mkdir()
    pids = tmp_path / "pids"
    helper_script(bin_dir, "lingering", f'cat >/dev/null\nsleep 300 & echo $! >> {pids}\n'
                  'printf \'{"Username":"ci","Secret":"S3cretPW"}\'\n')
    helper_script(bin_dir, "hung", f'sleep 300 & echo $! >> {pids}\nwait\n')
    env = {"DOCKER_CONFIG": str(docker), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ref = parse("oci+http://127.0.0.1:5999/team/oracles")
    (docker / "config.json").write_text(json.dumps({"credsStore": "lingering"}))
    start = time.monotonic()
    creds = credentials_for(ref, env)
    assert (creds.username, creds.password) == ("ci", "S3cretPW")
    assert time.monotonic() - start < 10
    monkeypatch.setattr(regmodule, "HELPER_TIMEOUT", 1.0)
    (docker / "config.json").write_text(json.dumps({"credsStore": "hung"}))
    with pytest.raises(RegistryAuth,
                       match="did not run: TimeoutError: docker-credential-hung did not answer"):
        credentials_for(ref, env)
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and \
                Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX":
            assert time.monotonic() < deadline, f"the helper's child {pid} outlived it"
            time.sleep(0.05)
