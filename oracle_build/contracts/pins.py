"""Pin files (pins/*.toml): the oracle as data.

A pin names the vLLM source (a git commit or a registry wheel by sha256),
the Python, torch and every other pinned package, the targets it can be built
for, the build settings and the CMake externals. Every model forbids unknown
keys, so a typo is an error rather than a silent default. A value that could
not be established is written as ``{status = "unestablished", reason = "..."}``
and the build refuses the step that needs it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import AfterValidator, Field, field_validator, model_validator

from oracle_build.contracts.base import (
    SAFE_NAME,
    DistName,
    ExactVersion,
    FullSha,
    SafeName,
    Sha256,
    Strict,
    check_env,
    dist_name,
    relative_file,
    safe_name,
    unsafe_values,
)
from oracle_build.contracts.cudatoolkit import load_toolkit
from oracle_build.contracts.lock import LockEntry, parse_lock
from oracle_build.contracts.targets import DEVICES, FLAT_TARGET_DEFAULTS, DeviceName, Target, Torch
from oracle_build.core.errors import BadInput, Unestablished
from oracle_build.core.files import load_toml, read_bytes, read_text, sha256_bytes, validate

PIN_SCHEMA = 1

SAFE_GIT_SCHEMES = {"https", "http", "ssh", "git", "file"}


def check_git_url(value: str) -> str:
    """Only transports that transfer data; never one that runs a command."""
    if value.startswith("-"):
        raise ValueError("a repository URL may not start with '-'")
    if "::" in value:
        raise ValueError(
            f"{value!r} uses a git remote-helper transport ('<transport>::'), which can run "
            "commands (ext::, fd::); use https://, ssh://, git://, file:// or a local path"
        )
    if any(ch in value for ch in "\n\r\0"):
        raise ValueError("control characters in repository URL")
    if value.startswith("/"):
        return value
    parsed = urlparse(value)
    if parsed.scheme in SAFE_GIT_SCHEMES:
        return value
    if re.fullmatch(r"[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+", value):  # scp-like ssh
        return value
    raise ValueError(
        f"{value!r}: unsupported transport; use one of {sorted(SAFE_GIT_SCHEMES)} or an "
        "absolute local path"
    )


GitUrl = Annotated[str, AfterValidator(check_git_url)]


class UnestablishedValue(Strict):
    """A value nobody could establish. The step that needs it refuses to run."""

    status: Literal["unestablished"]
    reason: str = Field(min_length=10)


class FromSource(Strict):
    """What every vLLM built here from its source has: the versions it must report."""

    runtime_version: ExactVersion
    distribution: DistName = "vllm"
    distribution_version: ExactVersion | None = None
    note: str | None = None

    @property
    def expected_distribution_version(self) -> str:
        return self.distribution_version or self.runtime_version


class GitSource(FromSource):
    kind: Literal["git"]
    repository: GitUrl
    commit: FullSha

    @model_validator(mode="after")
    def _version_names_commit(self) -> GitSource:
        local = Version(self.runtime_version).local
        m = re.match(r"^g([0-9a-f]{7,40})", local or "")
        if not m:
            raise ValueError(
                f"runtime_version {self.runtime_version!r} has no '+g<sha>' local segment; "
                "a from-source build's version names its commit"
            )
        if not self.commit.startswith(m.group(1)):
            raise ValueError(
                f"runtime_version names commit g{m.group(1)} but commit is {self.commit}"
            )
        return self


ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")
COMMIT_ID = re.compile(r"^[0-9a-f]{7,40}$")


def _archive_name(value: str) -> str:
    safe_name(value)
    if not value.endswith(ARCHIVE_SUFFIXES):
        raise ValueError(f"{value!r} is not a source archive this tool unpacks "
                         f"({', '.join(ARCHIVE_SUFFIXES)})")
    return value


def _archive_url(value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("https", "http", "file") or any(
            ch in value for ch in "\n\r\0 "):
        raise ValueError(f"{value!r}: a source archive is fetched by an https://, http:// or "
                         "file:// URL")
    return value


class ArchiveSource(FromSource):
    """A release archive (vLLM's sdist): taken by sha256 from a URL into the wheelhouse,
    unpacked into the build's staging folder. The commit it was made from is what its
    vllm/_version.py records (``commit_id``, abbreviated as setuptools-scm writes it); the
    full commit where vLLM's public record establishes it."""

    kind: Literal["archive"]
    url: Annotated[str, AfterValidator(_archive_url)]
    filename: Annotated[str, AfterValidator(_archive_name)]
    sha256: Sha256
    size: int | None = Field(default=None, ge=1, le=2**34)
    commit_id: Annotated[str, Field(pattern=COMMIT_ID.pattern)]
    commit: FullSha | UnestablishedValue

    @model_validator(mode="after")
    def _commit_names_id(self) -> ArchiveSource:
        if isinstance(self.commit, str) and not self.commit.startswith(self.commit_id):
            raise ValueError(f"commit {self.commit} does not start with commit_id "
                             f"{self.commit_id}")
        if Path(urlparse(self.url).path).name != self.filename:
            raise ValueError(f"url names {Path(urlparse(self.url).path).name!r}, filename "
                             f"says {self.filename!r}")
        return self


class WheelSource(Strict):
    kind: Literal["wheel"]
    distribution: DistName
    version: ExactVersion
    sha256: Sha256
    runtime_version: ExactVersion | None = None
    note: str | None = None

    @property
    def expected_distribution_version(self) -> str:
        return self.version

    @property
    def expected_runtime_version(self) -> str:
        return self.runtime_version or self.version


class Build(Strict):
    env: dict[str, str] = Field(default_factory=dict)
    # the C and C++ compilers (a name on PATH or an absolute path); unset: the host's `cc`
    # and `c++`, as CMake finds them. Either way the build record holds what ran.
    cc: Annotated[str, Field(pattern=r"^[A-Za-z0-9_./+-]+$")] | None = None
    cxx: Annotated[str, Field(pattern=r"^[A-Za-z0-9_./+-]+$")] | None = None
    cmake_args: list[str] = Field(default_factory=list)
    # Read after pyproject.toml's [build-system] requires (PEP 518, always first): this file
    # of the checkout, or with "auto" (or when the tree has no such file) the one the tree
    # has for the device: requirements/build/<device>.txt, else requirements/build.txt.
    build_requirements: str = "requirements/build.txt"
    pip: ExactVersion = "26.3"
    # vLLM >= 0.32 builds an optional Rust front end (vllm/vllm-rs) when cargo is present:
    # whether it is in the wheel changes the wheel, so the pin says which.
    rust_frontend: Literal["build", "skip"] | None = None

    _env = field_validator("env")(lambda v: check_env(v))


class External(Strict):
    """A CMake FetchContent dependency, built from a local copy named by src_dir_var."""

    name: SafeName  # becomes the folder its clone is put in: no separators, no ".."
    repository: GitUrl
    # the CMake variable naming the local copy; only a *_SRC_DIR name or CMake's own
    # FETCHCONTENT_SOURCE_DIR_<NAME>, so no pin reaches any other variable of the build's
    # environment through it (VLLM_USE_PRECOMPILED, PATH)
    src_dir_var: Annotated[str, Field(
        pattern=r"^([A-Z][A-Z0-9_]*_(SRC|ROOT)_DIR|FETCHCONTENT_SOURCE_DIR_[A-Z0-9_]+)$")]
    commit: FullSha | UnestablishedValue
    # the git tree of its files at that commit (what `git rev-parse <commit>^{tree}` says,
    # and what git would hash an unpacked archive of them to): any local source whose
    # files hash to it is this external, a mirror or an archive alike, as Nix names a
    # source by the hash of its unpacked content
    tree: FullSha | None = None
    # the GIT_TAG the checkout's cmake declares when it names a tag (v4.7.1), not a commit;
    # commit is then that tag resolved in a mirror, and the build checks both
    tag: str | None = None
    source: str | None = None  # where it was read (cmake file:line at the pin)
    # the devices whose build fetches it (vLLM's cmake declares triton_kernels at one tag
    # for CUDA and at another commit for ROCm); None: every device
    devices: list[DeviceName] | None = None
    # the machines whose build fetches it (vLLM's CPU build takes oneDNN at a tag on x86_64
    # and at a commit, with the Arm Compute Library, on aarch64); None: every machine
    machines: list[Literal["x86_64", "aarch64"]] | None = None

    @property
    def established(self) -> bool:
        return isinstance(self.commit, str)

    @property
    def folder(self) -> str:
        """Its folder under the build's externals/: the name in lower case, as CMake's
        FetchContent names its own folders."""
        return self.name.lower()

    def fetched_by(self, device: str, machine: str | None = None) -> bool:
        return (self.devices is None or device in self.devices) and (
            machine is None or self.machines is None or machine in self.machines)


WHEN = re.compile(r"^(cc|cxx) (<|<=|>|>=|==|!=) (\d+(?:\.\d+){0,2})$")


def _when(value: str) -> str:
    if not WHEN.match(value):
        raise ValueError(f"{value!r}: a patch's condition is on the compiler's version, like "
                         "'cxx < 12.3' (cc or cxx, then <, <=, >, >=, == or !=, then a "
                         "version)")
    return value


class Patch(Strict):
    """A change to the source before configure, recorded as a file of the pin's (Spack's
    ``patch()``, conda-forge's ``source.patches``): its sha256 is checked, it applies in the
    pin's order to the staging copy only, and where ``when`` says so (the compiler's
    version) or for the targets named."""

    file: Annotated[str, AfterValidator(relative_file)]
    sha256: Sha256
    reason: str = Field(min_length=10)
    targets: list[SafeName] | None = None
    when: Annotated[str, AfterValidator(_when)] | None = None

    def condition(self) -> tuple[str, str, str] | None:
        if self.when is None:
            return None
        m = WHEN.match(self.when)
        assert m is not None
        return m.group(1), m.group(2), m.group(3)


class Reproducible(Strict):
    """What is known of a source pin's reproducibility: two cold builds in two homes gave
    the same compiled bytes ("yes", the note says when and where it was measured), or did
    not ("no", the note says what differs and why)."""

    status: Literal["yes", "no"]
    note: str = Field(min_length=1, max_length=2000)


class PinModel(Strict):
    schema_: int = Field(alias="schema")
    id: SafeName
    description: str = ""
    python: Annotated[str, Field(pattern=r"^3\.[0-9]{1,3}$")]  # the venv's CPython, 3.X
    vllm: GitSource | ArchiveSource | WheelSource = Field(discriminator="kind")
    torch: Torch | None = None
    packages: dict[str, ExactVersion] = Field(default_factory=dict)
    # a plain file name beside the pin (a pin embedded in someone else's golden names it too)
    lock: str | UnestablishedValue
    lock_exclude: list[str] = Field(default_factory=list)
    lock_exclude_reason: str | None = None
    # a source pin's established compiled bytes: a file beside the pin (contracts/compiled.py),
    # written by `oracle-build lock --compiled`; the recipe's output, not in the content hash
    compiled: str | UnestablishedValue | None = None
    reproducible: Reproducible | None = None  # unset: not measured
    build: Build = Field(default_factory=Build)
    externals: list[External] = Field(default_factory=list)
    patches: list[Patch] = Field(default_factory=list)
    targets: dict[SafeName, Target]
    # false: never the pin a command picks without --pin (a second pin for the same hosts,
    # such as the source build of the default's vLLM); how it is chosen, not what it builds
    default: bool = True

    @model_validator(mode="after")
    def _checks(self) -> PinModel:
        if self.schema_ != PIN_SCHEMA:
            raise ValueError(
                f"schema {self.schema_} is not one this oracle-build reads (it reads {PIN_SCHEMA})"
            )
        if not re.fullmatch(r"3\.\d+", self.python):
            raise ValueError("python must be 'MAJOR.MINOR', e.g. '3.11'")
        for name in self.packages:
            dist_name(name)
        if not self.targets:
            raise ValueError("a pin needs at least one target")
        for name in ("lock", "compiled"):
            value = getattr(self, name)
            if isinstance(value, str) and (not SAFE_NAME.match(value) or value in (".", "..")):
                raise ValueError(f"@{name}: is not a plain file name beside the pin (letters, "
                                 "digits, '.', '_', '-'; no folder): refused before any read")
        if isinstance(self.compiled, str) and not self.compiled.endswith(".compiled.toml"):
            raise ValueError("@compiled: names a file ending in .compiled.toml (so that it is "
                             "never taken for a pin)")
        if self.patches and isinstance(self.vllm, WheelSource):
            raise ValueError("patches change a source before it is built; this pin installs "
                             "a wheel")
        if (self.compiled is not None or self.reproducible is not None) and isinstance(
                self.vllm, WheelSource):
            raise ValueError("compiled and reproducible are about the bytes a source build "
                             "gives; this pin installs a wheel (its bytes are the wheel's "
                             "sha256 in the lock)")
        for i, patch in enumerate(self.patches):
            unknown = sorted(set(patch.targets or []) - set(self.targets))
            if unknown:
                raise ValueError(f"patches[{i}].targets names {unknown}, which this pin does "
                                 "not have")
        for device in DEVICES:
            for machine in ("x86_64", "aarch64"):
                names = [e.name for e in self.externals if e.fetched_by(device, machine)]
                twice = sorted({n for n in names if names.count(n) > 1})
                if twice:
                    raise ValueError(f"externals {twice} are listed twice for a {device} "
                                     f"build on {machine} (give each its devices and "
                                     "machines)")
        return self


@dataclass(frozen=True)
class Pin:
    """A validated pin with where it came from and its content hash."""

    model: PinModel
    path: Path
    lock_entries: tuple[LockEntry, ...] | None
    content_hash: str

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def key(self) -> str:
        """Stable name for this pin's venv and wheelhouse: id plus content hash."""
        return f"{self.model.id}-{self.content_hash[:12]}"

    @property
    def lock_path(self) -> Path | None:
        if isinstance(self.model.lock, str):
            return (self.path.parent / self.model.lock).resolve()
        return None

    @property
    def compiled_path(self) -> Path | None:
        """The file of established compiled bytes beside the pin (a plain file name)."""
        if isinstance(self.model.compiled, str):
            return self.path.parent / self.model.compiled
        return None

    def patch_path(self, patch: Patch) -> Path:
        """A patch's file: inside the pin's folder (checked when the pin was loaded)."""
        return self.path.parent / patch.file

    def patches_for(self, target_name: str) -> list[Patch]:
        """The patches a build for this target considers, in the pin's order (each
        patch's ``when`` is decided against the compiler by the build)."""
        return [p for p in self.model.patches
                if p.targets is None or target_name in p.targets]

    def target(self, name: str) -> Target:
        try:
            return self.model.targets[name]
        except KeyError:
            raise BadInput(
                self.path,
                [(f"targets.{name}", f"no such target; this pin has {sorted(self.model.targets)}")],
            ) from None

    def externals_for(self, target: Target) -> list[External]:
        """The CMake externals a build for ``target`` fetches."""
        return [e for e in self.model.externals if e.fetched_by(target.device, target.machine)]

    def torch_for(self, target: Target) -> Torch | None:
        """The torch a target installs: its own (a ROCm build), else the pin's."""
        return target.torch or self.model.torch

    def expected_distribution_version(self, target: Target) -> str:
        """The vLLM wheel's version for this target: the pin's, plus the target's suffix
        as setup.py appends it ('+' when the version has no local part, else '.')."""
        base = self.model.vllm.expected_distribution_version
        suffix = target.dist_version_suffix
        if suffix is None:
            return base
        return f"{base}{'.' if '+' in base else '+'}{suffix}"

    def expected_versions(self, target: Target | None = None) -> dict[str, str]:
        """Every distribution whose version identity checks: vllm, torch, packages."""
        vllm = (self.expected_distribution_version(target) if target is not None
                else self.model.vllm.expected_distribution_version)
        out: dict[str, str] = {str(canonicalize_name(self.model.vllm.distribution)): vllm}
        torch = self.torch_for(target) if target is not None else self.model.torch
        if torch is not None:
            out["torch"] = torch.version
        for name, version in self.model.packages.items():
            out[str(canonicalize_name(name))] = version
        return out

    def expected_runtime_version(self) -> str:
        src = self.model.vllm
        return src.runtime_version if isinstance(src, FromSource) else src.expected_runtime_version

    def require_lock(self) -> tuple[LockEntry, ...]:
        if self.lock_entries is None:
            lock = self.model.lock
            reason = lock.reason if isinstance(lock, UnestablishedValue) else "no lock"
            raise Unestablished(
                f"{self.path}: lock is unestablished: {reason}",
                hint="regenerate it with `python -m oracle_build lock --pin ...` on a host that "
                "can resolve the pin",
            )
        return self.lock_entries

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": str(self.path),
            "content_hash": self.content_hash,
            "key": self.key,
            "pin": self.model.model_dump(mode="json", by_alias=True),
        }


def _check_lock_against_pin(model: PinModel, path: Path, lock: Path,
                            entries: list[LockEntry]) -> None:
    by_key: dict[str, LockEntry] = {e.key: e for e in entries}
    problems: list[tuple[str, str]] = []
    wanted: dict[str, str] = {str(canonicalize_name(k)): v for k, v in model.packages.items()}
    if model.torch is not None:
        wanted["torch"] = model.torch.version
    src = model.vllm
    if isinstance(src, WheelSource):
        wanted[canonicalize_name(src.distribution)] = src.version
        entry = by_key.get(canonicalize_name(src.distribution))
        if entry and src.sha256 not in entry.sha256:
            problems.append(("vllm.sha256", f"does not match the lock's hash for {entry.name}"))
    for key, version in wanted.items():
        entry = by_key.get(key)
        if entry is None:
            problems.append((f"lock ({lock.name})", f"does not list {key}=={version}"))
        elif entry.version != version:
            problems.append(
                (f"lock ({lock.name})", f"lists {entry.name}=={entry.version}, pin says {version}")
            )
    for name in model.lock_exclude:
        if canonicalize_name(name) in by_key:
            problems.append((f"lock ({lock.name})", f"lists {name}, which lock_exclude removes"))
    if problems:
        raise BadInput(path, problems)


def _check_patches(model: PinModel, path: Path) -> None:
    """Every patch file is a regular file inside the pin's folder (symlinks resolved) and
    has the sha256 the pin records: checked before anything reads it for a build."""
    folder = path.parent.resolve()
    problems: list[tuple[str, str]] = []
    for i, patch in enumerate(model.patches):
        where = folder / patch.file
        real = where.resolve()
        if not real.is_relative_to(folder):
            problems.append((f"patches[{i}].file", "resolves outside the pin's folder"))
            continue
        if not real.is_file():
            problems.append((f"patches[{i}].file", "is not a regular file next to the pin"))
            continue
        try:
            digest = sha256_bytes(read_bytes(real))
        except (OSError, BadInput):
            problems.append((f"patches[{i}].file", "cannot be read"))
            continue
        if digest != patch.sha256:
            problems.append((f"patches[{i}].sha256", f"the file's sha256 is {digest}"))
    if problems:
        raise BadInput(path, problems)


def hashed_form(model: PinModel) -> dict[str, Any]:
    """What the content hash covers: the whole pin, defaults included, except optional
    fields added after schema 1 while they are unset, so a pin that does not use them keeps
    its hash (its oracle's key, its wheelhouse, the pin_hash its goldens record)."""
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
    data.pop("default", None)  # how the pin is chosen, not what it builds
    data.pop("compiled", None)  # what its builds gave, not what they build from
    data.pop("reproducible", None)
    if data["build"].get("rust_frontend") is None:
        data["build"].pop("rust_frontend", None)
    for name in ("cc", "cxx"):
        if data["build"].get(name) is None:
            data["build"].pop(name, None)
    if not data.get("patches"):
        data.pop("patches", None)
    for ext in data["externals"]:
        for name in ("tag", "devices", "tree", "machines"):
            if ext.get(name) is None:
                ext.pop(name, None)
    flat_fields = set(FLAT_TARGET_DEFAULTS) | {"device", "machine"}
    for name, target in data["targets"].items():
        target.pop("kernel_variant", None)  # how engines run, not what is built
        flat = {**FLAT_TARGET_DEFAULTS, **target}
        # fields added after schema 1 count only when set
        data["targets"][name] = {k: v for k, v in flat.items()
                                 if k in flat_fields or v not in (None, [])}
    return data


def toolkit_path(pin_path: Path, target: Target) -> Path | None:
    """A CUDA target's toolkit lock, inside the pin's folder (checked when loaded)."""
    name = getattr(target, "toolkit", None)
    return pin_path.parent / name if isinstance(name, str) else None


def _toolkit_digests(model: PinModel, path: Path) -> list[tuple[str, str]]:
    out = []
    for name, target in sorted(model.targets.items()):
        lock = toolkit_path(path, target)
        if lock is None:
            continue
        if lock.resolve().parent.is_relative_to(path.parent.resolve()) is False or \
                not lock.is_file():
            raise BadInput(path, [(f"targets.{name}.toolkit", f"{lock} is not a file inside "
                                   "the pin's folder")])
        out.append((name, load_toolkit(lock).digest))
    return out


def load_pin(path: Path, *, check_lock: bool = True) -> Pin:
    path = Path(path)
    data = load_toml(path)
    problems = unsafe_values(data)
    if problems:  # a pin's values are printed (the plan): a newline could print any line
        raise BadInput(path, problems)
    model = validate(PinModel, data, path)
    entries: list[LockEntry] | None = None
    lock_digest = ""
    if isinstance(model.lock, str) and check_lock:
        lock_path = (path.parent / model.lock).resolve()
        if lock_path.parent != path.parent.resolve():
            raise BadInput(path, [("lock", "is a link to a file outside the pin's folder: "
                                   "refused (the lock lies beside its pin)")])
        if not lock_path.is_file():
            raise BadInput(path, [("lock", f"lock file {lock_path} not found")])
        entries = parse_lock(lock_path)
        _check_lock_against_pin(model, path, lock_path, entries)
        lock_digest = sha256_bytes(read_text(lock_path).encode())
    _check_patches(model, path)
    canonical = json.dumps(hashed_form(model), sort_keys=True)
    for name, digest in _toolkit_digests(model, path):  # a toolkit lock is part of the pin
        canonical += f"\ntoolkit {name} {digest}"
    content_hash = sha256_bytes((canonical + "\n" + lock_digest).encode())
    return Pin(model, path.resolve(), tuple(entries) if entries else None, content_hash)
