"""Where everything lives: the oracle home and what is under it, and the two timestamp
formats. Every path the tool writes is spelled here, once.

    <home>/oracles/<pin key>/                 a built oracle venv (the commit point: a rename)
    <home>/oracles/<pin key>/oracle-build/    its build record, identity facts, build log;
                                              later facts beside it (numerics, deep-identity)
    <home>/oracles/<pin key>.anchor.json      the manifest's and record's sha256, fingerprint
    <home>/staging/<pin key>.<stamp>-<pid>/   a build in progress (kept on failure)
    <home>/replaced/, <home>/incomplete/      oracles set aside, never deleted silently
    <home>/wheelhouse/<pin key>/              wheels (default; ORACLE_BUILD_WHEELHOUSE)
    <home>/models/<name>/                     generated models
    <home>/logs/<what>-<name>-<stamp>.log     engine logs
    <home>/locks/                             advisory locks (the engine lock: see engine_lock)
    <home>/compile-cache/<pin key>/           the engine's compile caches (torch inductor,
                                              vLLM, Triton; ORACLE_BUILD_COMPILE_CACHE)
    <home>/ccache/                            the compiler cache of source builds (ccache;
                                              ORACLE_BUILD_COMPILER_CACHE names another)
    <home>/timings/<pin key>.json             how long each build step took here last time
    <home>/captures/<stamp>/, <home>/explain/ default outputs
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from oracle_build.core.env import tool_variable
from oracle_build.core.files import sha256_bytes

RECORD_DIR = "oracle-build"  # inside an oracle venv
BUILD_RECORD = "build-record.json"
IDENTITY_FACTS = "identity.json"
BUILD_LOG = "build.log"


def utc_now() -> str:
    """A timestamp for records: ISO 8601, UTC, seconds."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp() -> str:
    """A timestamp for file and folder names: UTC, sortable, no separators."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def default_home() -> Path:
    env = tool_variable("ORACLE_BUILD_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(xdg) / "oracle-build").resolve()


def default_wheelhouse(home: Path) -> Path:
    env = tool_variable("ORACLE_BUILD_WHEELHOUSE")
    return Path(env).expanduser().resolve() if env else home / "wheelhouse"


def oracle_path(home: Path, pin_key: str) -> Path:
    return home / "oracles" / pin_key


def record_dir(venv: Path) -> Path:
    return venv / RECORD_DIR


def build_record_path(venv: Path) -> Path:
    return venv / RECORD_DIR / BUILD_RECORD


def beside_record(venv: Path, name: str) -> Path:
    """Facts learned after publish (the last deep identity check, the numerics battery's
    verdict): beside the venv and its anchor, ``<home>/oracles/<pin key>.<name>.json``,
    never inside it (no check writes into the oracle; its build record's sha256 is what
    goldens record)."""
    return venv.parent / f"{venv.name}.{name}.json"


def staging_dir(home: Path, pin_key: str) -> Path:
    return home / "staging" / f"{pin_key}.{stamp()}-{os.getpid()}"


def timings_path(home: Path, pin_key: str) -> Path:
    """Each build step's duration the last time it ran to its end on this host (the plan
    says it beside the step)."""
    return home / "timings" / f"{pin_key}.json"


def uv_cache_dir(staging: Path) -> Path:
    """The build's own uv cache, inside its staging folder: removed after every step, so
    neither ~/.cache/uv nor a kept staging folder holds a second unpacked oracle."""
    return staging / "uv-cache"


def set_aside(home: Path, why: str, pin_key: str) -> Path:
    """A place to move an oracle that is not (or no longer) the one in use: replaced/ or
    incomplete/."""
    dest = home / why / f"{pin_key}.{stamp()}-{os.getpid()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def pins_dir(home: Path) -> Path:
    """Where pins carried inside goldens are unpacked (one folder per pin key)."""
    return home / "pins"


def model_dir(home: Path, name: str) -> Path:
    return home / "models" / name


def log_path(home: Path, what: str, name: str) -> Path:
    return home / "logs" / f"{what}-{name}-{stamp()}-{os.getpid()}.log"


def build_lock(home: Path, pin_key: str) -> Path:
    return home / "locks" / f"{pin_key}.lock"


def engine_lock(home: Path) -> Path:
    """One engine at a time per oracle home: two engines can exhaust a host's memory.
    ``ORACLE_BUILD_ENGINE_LOCK`` names one lock file for every home on the host instead (a
    gate host shared by several checkouts or CI jobs, each with a home of its own). Its
    folder is resolved, never its last component: a symlink there is the lock's own path, so
    that ``filelock.held`` refuses it (O_NOFOLLOW) instead of truncating what it points at."""
    env = tool_variable("ORACLE_BUILD_ENGINE_LOCK")
    if not env:
        return home / "locks" / "engine.lock"
    path = Path(os.path.abspath(Path(env).expanduser()))
    if not path.name:  # "/"
        from oracle_build.core.errors import BadInput

        raise BadInput("$ORACLE_BUILD_ENGINE_LOCK", [("<value>", "names a folder, not a lock "
                                                      "file")],
                       hint="set it to a file's path, say /var/lock/oracle-build-engine.lock")
    return path.parent.resolve() / path.name


def compile_cache(home: Path, pin_key: str) -> Path:
    """The compile caches of this oracle's engines (torch inductor's compiled kernels and
    precompiled headers, vLLM's compile cache, Triton's): the tool's own, never the host's
    shared ``/tmp/torchinductor_<user>``, where a killed compile poisons every later run.
    ``ORACLE_BUILD_COMPILE_CACHE`` names the folder that holds one per pin key instead (homes
    that share an engine lock can share compiled kernels too)."""
    env = tool_variable("ORACLE_BUILD_COMPILE_CACHE")
    root = Path(env).expanduser().resolve() if env else home / "compile-cache"
    return root / pin_key


def golden_lock(home: Path, golden: Path) -> Path:
    digest = sha256_bytes(str(golden.resolve()).encode())[:16]
    return home / "locks" / f"golden-{digest}.lock"


def captures_dir(home: Path) -> Path:
    return home / "captures" / stamp()


def explain_record(home: Path, golden_name: str) -> Path:
    return home / "explain" / f"{golden_name}-{stamp()}.json"
