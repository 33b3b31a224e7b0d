"""A CUDA toolkit as an input of a pin (pins/toolkits/<name>.toml): NVIDIA's toolkit wheels
from PyPI, each by name, version and the sha256 of its x86_64 and aarch64 files, as
conda-forge's ``cuda-nvcc`` packages are a versioned, hashed dependency. The tool installs
the wheels of the host's machine once per lock into the home and assembles a ``CUDA_HOME``
from them (recipe/cuda/toolkit.py); the lock's digest names that folder and the nvcc launcher
(so the compiler cache keys objects by it). Written by one renderer (``render``), read back
by ``load_toolkit``; ``oracle-build toolkit --lock`` makes it from the index."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from oracle_build.contracts.base import (
    DistName,
    ExactVersion,
    SafeName,
    Sha256,
    Strict,
    unsafe_values,
)
from oracle_build.core.errors import BadInput
from oracle_build.core.files import load_toml, validate

TOOLKIT_SCHEMA = 1
MACHINES: tuple[str, ...] = ("x86_64", "aarch64")
Machine = Literal["x86_64", "aarch64"]
# the tools whose sha256 names a toolkit (the ones a compile runs), under CUDA_HOME
TOOLS: tuple[str, ...] = ("bin/nvcc", "nvvm/bin/cicc", "bin/ptxas", "bin/fatbinary",
                          "bin/nvlink", "bin/cudafe++")
WHEEL_FILE = re.compile(r"^[A-Za-z0-9_.+-]{1,200}\.whl$")
URL = re.compile(r"^https://[A-Za-z0-9.-]{1,100}/[A-Za-z0-9._/%+-]{1,400}$")
MAX_WHEEL_BYTES = 4 * 1024**3

__all__ = ["MACHINES", "TOOLKIT_SCHEMA", "TOOLS", "KernelsSpec", "ToolkitFile", "ToolkitLock",
           "ToolkitWheel", "load_kernels_spec",
           "load_toolkit", "render"]


class ToolkitFile(Strict):
    filename: str = Field(max_length=200)
    url: str = Field(max_length=600)
    sha256: Sha256
    size: int = Field(ge=1, le=MAX_WHEEL_BYTES, strict=True)

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        if not WHEEL_FILE.fullmatch(value):
            raise ValueError(f"{value!r} is not a wheel's file name")
        return value

    @model_validator(mode="after")
    def _url(self) -> ToolkitFile:
        if not URL.fullmatch(self.url) or not self.url.endswith("/" + self.filename) or \
                ".." in self.url:
            raise ValueError(f"url {self.url!r} is not an https address of {self.filename}")
        return self


class ToolkitWheel(Strict):
    name: DistName
    version: ExactVersion
    provides: str = Field(max_length=300)  # what the toolkit takes from it, in words
    files: dict[Machine, ToolkitFile]

    @model_validator(mode="after")
    def _files(self) -> ToolkitWheel:
        stem = f"{self.name.replace('-', '_')}-{self.version}-"
        for machine in MACHINES:
            f = self.files.get(machine)  # type: ignore[call-overload]
            if f is None:
                raise ValueError(f"{self.name} has no {machine} file: a lock names both")
            if not f.filename.startswith(stem) or not f.filename.endswith(f"_{machine}.whl"):
                raise ValueError(f"{machine} file {f.filename!r} is not {self.name} "
                                 f"{self.version} for {machine}")
        return self


class ToolkitLock(Strict):
    schema_: int = Field(alias="schema")
    name: SafeName  # e.g. cuda-13.0.3: the toolkit release the wheels are the parts of
    cuda: str = Field(pattern=r"^\d{1,3}\.\d{1,3}$")  # nvcc's release (nvcc --version)
    nvcc: ExactVersion  # the nvcc wheel's version: the compiler a build names
    source: str = Field(max_length=600)  # where the versions come from, in words
    wheels: list[ToolkitWheel] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _names(self) -> ToolkitLock:
        names = [w.name for w in self.wheels]
        if len(set(names)) != len(names):
            raise ValueError("a wheel is named twice")
        if "nvidia-cuda-nvcc" not in names:
            raise ValueError("no nvidia-cuda-nvcc wheel: a toolkit without nvcc")
        return self

    @property
    def digest(self) -> str:
        """sha256 of what the lock says (not its comments): the toolkit's name in a home."""
        body = json.dumps(self.model_dump(by_alias=True, exclude={"source"}),
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.digest[:12]}"

    def files_for(self, machine: str) -> list[tuple[ToolkitWheel, ToolkitFile]]:
        if machine not in MACHINES:
            raise BadInput("<host>", [("machine", f"{machine!r}: the toolkit's wheels are for "
                                       f"{', '.join(MACHINES)}")])
        return [(w, w.files[machine]) for w in self.wheels]  # type: ignore[index]


def load_toolkit(path: Path) -> ToolkitLock:
    if path.is_symlink():
        raise BadInput(path, [("<file>", "is a symbolic link: refused (a toolkit lock lies "
                               "in pins/toolkits/, itself)")])
    data = load_toml(path)
    problems = unsafe_values(data)
    if problems:
        raise BadInput(path, problems)
    model = validate(ToolkitLock, data, path)
    if model.schema_ != TOOLKIT_SCHEMA:
        raise BadInput(path, [("schema", f"{model.schema_} is not one this oracle-build reads "
                                         f"(it reads {TOOLKIT_SCHEMA})")])
    return model


def _quote(value: str) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if ord(c) >= 32 else f"\\u{ord(c):04x}" for c in out) + '"'


def render(model: ToolkitLock) -> str:
    """The lock's text: one renderer, read back by load_toolkit."""
    lines = [f"# The CUDA toolkit {model.name} as NVIDIA's wheels from PyPI, by sha256 for "
             "x86_64 and aarch64.",
             "# Made by `oracle-build toolkit --lock`; review the diff, commit it. The build "
             "installs the",
             "# host machine's wheels once per lock into the home and assembles CUDA_HOME "
             "(docs/gate-hosts.md).",
             f"schema = {model.schema_}", f"name = {_quote(model.name)}",
             f"cuda = {_quote(model.cuda)}", f"nvcc = {_quote(model.nvcc)}",
             f"source = {_quote(model.source)}"]
    for w in model.wheels:
        lines += ["", "[[wheels]]", f"name = {_quote(w.name)}",
                  f"version = {_quote(w.version)}", f"provides = {_quote(w.provides)}"]
        for machine in MACHINES:
            f = w.files[machine]  # type: ignore[index]
            lines += [f"[wheels.files.{machine}]", f"filename = {_quote(f.filename)}",
                      f"url = {_quote(f.url)}", f"sha256 = {_quote(f.sha256)}",
                      f"size = {f.size}"]
    return "\n".join(lines) + "\n"


UNIT = re.compile(r"^csrc/[A-Za-z0-9_][A-Za-z0-9_/.-]{0,200}\.cu$")


class KernelsSpec(Strict):
    """pins/kernels/cuda-source.toml: which real CUDA units of a source pin's tree ``oracle-build
    cuda-kernels`` compiles without a GPU, for which of its CUDA targets, against which CUDA
    torch wheel's headers (recipe/cuda/units.py)."""

    schema_: int = Field(alias="schema")
    pin: str = Field(max_length=200)  # a source pin beside the spec
    extension: str = Field(pattern=r"^_?[A-Za-z][A-Za-z0-9_]{0,60}$")
    units: list[str] = Field(min_length=1, max_length=20)
    targets: list[SafeName] = Field(min_length=1, max_length=8)
    torch: ToolkitWheel  # the CUDA build of the pin's torch, by sha256 for both machines

    @field_validator("pin")
    @classmethod
    def _pin(cls, value: str) -> str:
        if not re.fullmatch(r"(\.\./)?[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.toml", value):
            raise ValueError(f"{value!r} is not a pin's file name beside the spec or in the "
                             "folder above it")
        return value

    @field_validator("units")
    @classmethod
    def _units(cls, value: list[str]) -> list[str]:
        for unit in value:
            if not UNIT.fullmatch(unit) or any(p in ("", ".", "..") for p in unit.split("/")):
                raise ValueError(f"{unit!r} is not a CUDA unit under csrc/ (csrc/<name>.cu)")
        if len(set(value)) != len(value):
            raise ValueError("a unit is named twice")
        stems = [u.rsplit("/", 1)[-1][:-3] for u in value]
        if len(set(stems)) != len(stems):
            raise ValueError("two units share a file name (their objects would collide)")
        return value


KERNELS_SCHEMA = 1


def load_kernels_spec(path: Path) -> KernelsSpec:
    if path.is_symlink():
        raise BadInput(path, [("<file>", "is a symbolic link: refused")])
    data = load_toml(path)
    problems = unsafe_values(data)
    if problems:
        raise BadInput(path, problems)
    model = validate(KernelsSpec, data, path)
    if model.schema_ != KERNELS_SCHEMA:
        raise BadInput(path, [("schema", f"{model.schema_} is not one this oracle-build reads "
                                         f"(it reads {KERNELS_SCHEMA})")])
    return model
