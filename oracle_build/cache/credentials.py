"""Who the tool is to a registry: credentials from the environment
(ORACLE_BUILD_CACHE_USERNAME/_PASSWORD/_TOKEN), else the Docker config file's entry for the
host (an ``auths`` entry, an identity token, or a credential helper run by the Docker
credential helper protocol through core/proc.py). The registry client is registry.py."""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path

from oracle_build.cache.ref import CacheRef
from oracle_build.core import proc
from oracle_build.core.env import tool_variable
from oracle_build.core.errors import (
    RegistryAuth,
    as_data,
)
from oracle_build.core.files import json_value


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None
    token: str | None = None  # a bearer token given directly
    source: str = "none"

    @property
    def basic(self) -> str | None:
        if self.username is None or self.password is None:
            return None
        return "Basic " + _b64(f"{self.username}:{self.password}")


def credentials_for(ref: CacheRef, env: dict[str, str] | None = None) -> Credentials:
    """The environment's credentials first, then the Docker config file's for this host."""
    env = dict(os.environ) if env is None else env
    token = tool_variable("ORACLE_BUILD_CACHE_TOKEN", env)
    if token:
        return Credentials(token=token,
                           source="ORACLE_BUILD_CACHE_TOKEN")
    user = tool_variable("ORACLE_BUILD_CACHE_USERNAME", env)
    password = tool_variable("ORACLE_BUILD_CACHE_PASSWORD", env)
    if user and password is not None:
        return Credentials(user, password, source="ORACLE_BUILD_CACHE_USERNAME/_PASSWORD")
    config = Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG") else \
        Path(env.get("HOME", str(Path.home()))) / ".docker" / "config.json"
    try:
        data = json_value(config.read_text()) if config.is_file() else {}
    except (OSError, ValueError):
        return Credentials(source=f"{config} (unreadable: ignored)")
    if not isinstance(data, dict):
        return Credentials()
    keys = (ref.netloc, f"https://{ref.netloc}", f"http://{ref.netloc}", f"{ref.host}:{ref.port}")
    # as docker reads it: the host's credential helper, else the store, else `auths`
    helpers = data.get("credHelpers")
    helper = next((helpers[k] for k in keys if isinstance(helpers.get(k), str)), None) \
        if isinstance(helpers, dict) else None
    store = data.get("credsStore") if isinstance(data.get("credsStore"), str) else None
    for name, why in ((helper, "credHelpers"), (store, "credsStore")):
        if name:
            found = from_helper(name, ref.netloc, config, why, env)
            if found is not None:
                return found
    auths = data.get("auths")
    if not isinstance(auths, dict):
        return Credentials()
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            if entry.get("identitytoken"):
                return Credentials(token=str(entry["identitytoken"]), source=str(config))
            return Credentials(user, password, source=f"{config} ({key})")
    return Credentials()


HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HELPER_TIMEOUT = 30.0


def from_helper(name: str, server: str, config: Path, why: str,
                env: dict[str, str]) -> Credentials | None:
    """The Docker credential helper protocol: ``docker-credential-NAME get``, the server on
    stdin, ``{"Username", "Secret"}`` on stdout (Username ``<token>``: an identity token).
    None when the helper holds nothing for this server (docker then goes on anonymously);
    a helper that is missing, fails, or answers otherwise is RegistryAuth, naming it."""
    import shutil

    if not HELPER_NAME.fullmatch(name):
        raise RegistryAuth(f"{config}: {why} names {name!r}, not a credential helper name")
    program = f"docker-credential-{name}"
    path = shutil.which(program, path=env.get("PATH", os.environ.get("PATH", "")))
    if path is None:
        raise RegistryAuth(f"{config}: {why} names the credential helper {program}, which is "
                           "not on PATH", hint=f"install {program}, or remove {why} from "
                           f"{config} (or set ORACLE_BUILD_CACHE_USERNAME/_PASSWORD)")
    try:
        done = proc.exchange([path, "get"], server, env={**os.environ, **env},
                             timeout=HELPER_TIMEOUT)
    except OSError as exc:  # TimeoutError too
        raise RegistryAuth(f"{program} get (for {server}, from {why} in {config}) did not "
                           f"run: {type(exc).__name__}: {as_data(str(exc), 200)}") from None
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        if "credentials not found" in said.lower():
            return None
        raise RegistryAuth(f"{program} get (for {server}, from {why} in {config}) failed, exit "
                           f"{done.returncode}: {as_data(done.stderr.strip(), 300)}",
                           hint=f"`echo {server} | {program} get` shows what it says; "
                           "`docker login` the registry again")
    try:
        answer = json_value(done.stdout)
        user, secret = answer["Username"], answer["Secret"]
        if not isinstance(user, str) or not isinstance(secret, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise RegistryAuth(f"{program} get (for {server}) answered something other than the "
                           "helper protocol's JSON (Username, Secret)") from None
    source = f"{program} ({why} in {config})"
    if user == "<token>":
        return Credentials(token=secret, source=source)
    return Credentials(user, secret, source=source)
