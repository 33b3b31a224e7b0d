"""A real OCI registry for the tests: Debian's docker-registry (distribution 2.8), started on
127.0.0.1 with a free port and a config in a temporary folder (never the packaged config,
which listens on every interface), optionally with htpasswd auth, stopped by its pid."""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
HTPASSWD = shutil.which("htpasswd") or "/usr/bin/htpasswd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    port: int
    root: Path  # the registry's storage
    proc: subprocess.Popen[bytes]
    user: str | None = None
    password: str | None = None

    def ref(self, repository: str = "team/oracles") -> str:
        return f"oci+http://127.0.0.1:{self.port}/{repository}"

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.removeprefix("sha256:")
        return (self.root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexdigest[:2]
                / hexdigest / "data")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start(folder: Path, *, auth: tuple[str, str] | None = None,
          token: dict[str, str] | None = None, tls: tuple[Path, Path] | None = None) -> Server:
    """``auth``: htpasswd with this user; ``token``: the registry token flow, trusting
    ``token["bundle"]`` (a PEM certificate) for tokens of ``token["issuer"]`` issued at
    ``token["realm"]`` for ``token["service"]``; ``tls``: (certificate, key) PEM files, the
    registry then speaks HTTPS only."""
    if not Path(REGISTRY).is_file():
        raise RuntimeError("docker-registry is not installed (apt-get install docker-registry "
                           "apache2-utils; .ci/run does)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    root = folder / "storage"
    lines = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true",
             "storage:", "  filesystem:", f"    rootdirectory: {root}", "  delete:",
             "    enabled: true", "http:", f"  addr: 127.0.0.1:{port}"]
    if tls is not None:
        lines += ["  tls:", f"    certificate: {tls[0]}", f"    key: {tls[1]}"]
    if auth is not None:
        htpasswd = folder / "htpasswd"
        subprocess.run([HTPASSWD, "-Bbc", str(htpasswd), auth[0], auth[1]], check=True,
                       capture_output=True)
        lines += ["auth:", "  htpasswd:", "    realm: oracle-build-tests",
                  f"    path: {htpasswd}"]
    if token is not None:
        lines += ["auth:", "  token:", f"    realm: {token['realm']}",
                  f"    service: {token['service']}", f"    issuer: {token['issuer']}",
                  f"    rootcertbundle: {token['bundle']}"]
    config = folder / "config.yml"
    config.write_text("\n".join(lines) + "\n")
    with open(folder / "registry.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {(folder / 'registry.log').read_text()}")
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=1, context=ssl._create_unverified_context()) \
            if tls is not None else http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/v2/")
            status = conn.getresponse().status
        except OSError:
            time.sleep(0.1)
            continue
        finally:
            conn.close()
        if status in (200, 401):
            return Server(port, root, proc, *(auth or (None, None)))
    proc.kill()
    raise RuntimeError("docker-registry did not answer within 20 s")


class Quiet(http.server.BaseHTTPRequestHandler):
    """A test server's handler: no access log, and one call for a whole answer."""

    def reply(self, status: int, body: bytes = b"", **headers: str) -> None:
        """``status``, the headers (``Retry_After="3"`` is sent as Retry-After), the body."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass
