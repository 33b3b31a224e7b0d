"""What a build writes about its oracle: the build facts its steps gather, the build record
published with the venv (never edited after), the anchor outside the venv, and the later
facts written beside the record (deep identity, the numerics battery).

The record is read back by identity (the libraries the build's process mapped), by the
next build (its schema) and by the oracle cache (the config blob a push carries): each
read validates it, so a record edited by hand is named, never half-trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from oracle_build.contracts.base import Sha256, Strict
from oracle_build.contracts.probe import ResolvedPlan
from oracle_build.core.files import load_json, validate

# 2: the venv's file manifest (oracle-build/manifest.json); 3: bytecode in the manifest, the
# mapped libraries, the content fingerprint, and the anchor beside the venv
RECORD_SCHEMA = 3
ANCHOR_SCHEMA = 1


class SourceFacts(Strict):
    """The clone a from-source build made: where from, which commit, what git says of it."""

    origin: str
    commit: str
    describe: str
    shallow: bool


class DeclaredExternal(Strict):
    """A FetchContent dependency as the checkout's CMake declares it."""

    name: str
    repository: str | None
    tag: str | None
    src_dir_var: str | None
    source: str
    note: str = ""
    is_commit: bool


class CheckoutFacts(Strict):
    """What the source step read from the clone at the pinned commit."""

    externals_declared: list[DeclaredExternal]
    other_device_externals: dict[str, list[str]]
    precompiled_switches: list[str]
    rust: dict[str, Any] | None


class WheelFacts(Strict):
    """The vLLM wheel the oracle installs: built here, or taken from the wheelhouse."""

    file: str
    sha256: Sha256
    version: str
    rust_frontend: bool | None = None
    commit_id: str | None = None
    # what the wheel's own metadata requires (for this target) that the pin's lock does not
    # hold, or holds at a version outside the requirement: the lock is what installs (the
    # wheel goes in --no-deps), so this is said, not enforced
    requirements_outside_lock: list[str] | None = None


class CompilerFacts(Strict):
    role: str
    asked: str
    path: str | None
    real_path: str | None
    version: str | None
    identity: str | None


class ToolchainFacts(Strict):
    """The toolchain a from-source build ran: part of the recipe, so part of the record."""

    compilers: dict[str, CompilerFacts]
    # the linker the C++ compiler runs (`<cxx> -print-prog-name=ld`, its --version line)
    linker: str | None = None
    cmake: str | None = None
    ninja: str | None = None
    # what the compile's command lines take from the build: CMAKE_ARGS, CMAKE_BUILD_TYPE,
    # MAX_JOBS, SOURCE_DATE_EPOCH, the launcher, the flags variables
    flags: dict[str, str] = Field(default_factory=dict)
    # the floors the (patched) source's CMake sets, each with where it is
    floors: list[dict[str, Any]] = Field(default_factory=list)


class PatchFacts(Strict):
    file: str
    sha256: Sha256
    reason: str
    when: str | None
    applied: bool
    why: str  # why it applied or not (the compiler's version against `when`)


class ArchiveFacts(Strict):
    """The release archive a source build unpacked."""

    url: str
    filename: str
    sha256: Sha256
    origin: str  # "present" (already in the wheelhouse) or the URL it came from
    commit_id: str | None  # what its vllm/_version.py records


class ExternalFacts(Strict):
    """An external named by its git tree: where its files came from."""

    tree: str
    commit: str | None
    origin: str  # the mirror or the archive whose files hash to the tree
    kind: Literal["mirror", "archive"]


class CompiledFacts(Strict):
    """What a from-source build compiled (issue 44): every file a compiler made that the
    built distribution's wheel installs, the toolchain those bytes depend on beyond the pin,
    the levers the build set so that they depend on nothing else (not where it ran, not
    when), and what the pin says of its reproducibility."""

    files: dict[str, Sha256]  # path under site-packages -> sha256
    # recipe.toolchain.toolchain_key; None: installed from a wheel an earlier build made
    toolchain: str | None
    levers: list[str]
    reproducible: str
    # the version of the levers (RECIPE in contracts/compiled.py); None: a record written
    # before they were versioned, recipe 1
    recipe: int | None = Field(default=None, ge=1, le=1000)

    @property
    def fingerprint(self) -> str:
        """One sha256 over every compiled file's path and sha256: equal for two oracles
        exactly when their compiled bytes are."""
        import hashlib

        digest = hashlib.sha256()
        for rel, sha in sorted(self.files.items()):
            digest.update(f"{rel}\0{sha}\n".encode())
        return digest.hexdigest()


class CompilerCacheFacts(Strict):
    described: str
    folder: str | None
    cold: bool
    hits: int | None = None
    misses: int | None = None
    other: dict[str, int] = Field(default_factory=dict)


class BuildFacts(BaseModel):
    """What the steps of one build gather, step by step (assigned as they run)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    preflight: dict[str, Any] = Field(default_factory=dict)  # per device (devices/*.preflight)
    source: SourceFacts | None = None
    checkout: CheckoutFacts | None = None
    externals: dict[str, SourceFacts] | None = None
    build_requirements: list[str] | None = None
    build_requirement_options: list[str] | None = None
    build_requirement_sources: list[str] | None = None
    wheel: WheelFacts | None = None
    compiled_arches: dict[str, Any] | None = None  # per device (devices/*.check_wheel)
    archive: ArchiveFacts | None = None
    patches: list[PatchFacts] | None = None
    toolchain: ToolchainFacts | None = None
    externals_by_tree: dict[str, ExternalFacts] | None = None
    compiler_cache: CompilerCacheFacts | None = None
    # the wheel build's environment as it ran (names and values, the staging folder as
    # <staging>, a secret's value "<set>")
    wheel_environment: dict[str, str] | None = None


class BuildEnvironment(Strict):
    """What reached the build's processes (issue 54): built, not inherited."""

    # what every command started from (the allow-list, the made PATH, HOME, TMPDIR)
    base: dict[str, str]
    # the wheel build's whole environment (None: no wheel was built)
    wheel: dict[str, str] | None
    # "closed (<how>) ..." or "open (<why>)"
    network: str
    # the caller's variables a build reads that it did not pass, by name; and how many others
    dropped: list[str]
    dropped_others: int = Field(ge=0)
    stripped: bool  # build_oracle --check's second build: the caller's locale replaced


class ToolFacts(Strict):
    name: str
    version: str
    git_commit: str | None
    python: str


class Installer(Strict):
    uv: str
    pip_for_wheel_build: str | None


class InstalledDistribution(Strict):
    """One distribution in the oracle venv, with the wheel it came from when the wheelhouse
    holds it (else the lock's sha256)."""

    name: str
    version: str
    wheel: str | None
    sha256: Sha256 | None


class ManifestSummary(Strict):
    files: int = Field(ge=0)
    symlinks: int = Field(ge=0)
    bytecode: int = Field(ge=0)
    bytes: int = Field(ge=0)
    startup_outside: dict[str, Any]
    created_utc: str


class BuildRecord(Strict):
    """oracle-build/build-record.json in the oracle venv: how this oracle was made."""

    record_schema: Literal[3]
    created_utc: str
    tool: ToolFacts
    pin: dict[str, Any]  # Pin.summary(): the pin, its path, hash and key
    target: dict[str, Any]  # the target's name and its model as the pin states it
    resolved: ResolvedPlan  # Plan.resolved(): what the build resolved
    host: dict[str, Any]  # host.facts(): the machine it was built on
    installer: Installer
    origin: Literal["built", "wheelhouse", "fetched"]  # where its wheels came from
    source: SourceFacts | None
    externals: dict[str, SourceFacts] | None
    externals_declared: list[DeclaredExternal] | None
    build_requirements: list[str] | None
    wheel: WheelFacts | None
    compiled_arches: dict[str, Any] | None
    distributions: list[InstalledDistribution]
    preflight: dict[str, Any]
    timings: dict[str, float]
    log: str
    identity: dict[str, Any]  # Identity.summary() at the final path
    # every shared library the oracle's process mapped outside its venv, with its sha256
    # (those inside are the manifest's): identity compares the next process's with these
    libraries: dict[str, Sha256]
    content_fingerprint: Sha256
    # a from-source build's recipe as it ran (absent in records written before them)
    archive: ArchiveFacts | None = None
    patches: list[PatchFacts] | None = None
    toolchain: ToolchainFacts | None = None
    externals_by_tree: dict[str, ExternalFacts] | None = None
    compiler_cache: CompilerCacheFacts | None = None
    compiled: CompiledFacts | None = None
    manifest: ManifestSummary
    # absent in records written before issue 54
    environment: BuildEnvironment | None = None


class Anchor(Strict):
    """<home>/oracles/<key>.anchor.json, outside the venv: the manifest and the record as
    published, and the content fingerprint goldens record."""

    anchor_schema: Literal[1]
    venv: str
    manifest_sha256: Sha256
    build_record_sha256: Sha256
    content_fingerprint: Sha256
    created_utc: str


class DeepIdentity(Strict):
    """deep-identity.json beside the record: the last `identity --deep`."""

    utc: str
    ok: bool
    files_hashed: int = Field(ge=0)
    seconds: float = Field(ge=0)
    mismatches: int = Field(ge=0)


class NumericsRecord(Strict):
    """<pin key>.numerics.json beside the oracle: the last battery run on it, bound to the
    oracle's anchor as it was (a record of another build of this pin is not this one's)."""

    utc: str
    set: str
    verdict: str
    fingerprint: str | None
    whole_battery: bool
    captured: list[str]
    verified: list[str]
    anchor_sha256: Sha256 | None = None


def load_record(path: Path) -> BuildRecord:
    """A build record, validated (BadInput naming the file and field)."""
    return validate(BuildRecord, load_json(path), path)


def load_anchor(path: Path) -> Anchor:
    return validate(Anchor, load_json(path), path)


MANIFEST_SCHEMA = 2  # 2: bytecode is part of the identity; the manifest is anchored


class ManifestEntry(Strict):
    """One file of the oracle venv as published: its sha256, the stat it had, the
    distribution it belongs to and how (a wheel's file, bytecode compiled from one, a file
    the venv itself creates)."""

    size: int = Field(ge=0)
    mtime_ns: int
    sha256: Sha256
    dist: str | None
    kind: Literal["wheel", "bytecode", "venv"]
    relocated_from_sha256: Sha256 | None = None


class FileManifest(Strict):
    """oracle-build/manifest.json in the oracle venv: every file and symlink."""

    manifest_schema: Literal[2]
    created_utc: str
    files: dict[str, ManifestEntry]
    symlinks: dict[str, str]
    startup_outside: dict[str, Any]
