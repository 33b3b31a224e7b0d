"""The build requirements a vLLM checkout names: pyproject.toml's ``[build-system]
requires`` first (PEP 518), then the requirements file the tree has for the device, read
with its ``-r`` includes and index options; torch split from the rest and checked
against the pin's."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from oracle_build.core.errors import BadInput


@dataclass(frozen=True)
class BuildRequirements:
    pyproject: list[str]  # [build-system] requires
    file: list[str]  # the requirements file's lines, its -r includes followed
    sources: list[str]
    options: list[str]  # index options the file names

    @property
    def lines(self) -> list[str]:
        return [*self.pyproject, *self.file]


def build_requirements(checkout: Path, *, device: str,
                       preferred: str = "auto") -> BuildRequirements:
    """pyproject.toml's [build-system] requires first, then the ``preferred`` requirements
    file if the tree has it, else the one it has for the device, its ``-r`` includes
    followed and its index options kept."""
    sources = []
    pyproject_reqs: list[str] = []
    file_reqs: list[str] = []
    options: list[str] = []
    pyproject = checkout / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise BadInput(pyproject, [("<syntax>", f"not valid TOML: {exc}")]) from None
        requires = data.get("build-system", {}).get("requires")
        if isinstance(requires, list):
            pyproject_reqs = [str(r) for r in requires]
            sources.append("pyproject.toml [build-system] requires")
    layout = [f"requirements/build/{device}.txt", "requirements/build.txt"]
    for rel in ([preferred] if preferred != "auto" else []) + layout:
        if (checkout / rel).is_file():
            read = read_requirement_lines(checkout / rel)
            file_reqs, options = read.lines, read.options
            sources.append(rel)
            sources += [f"{inc.relative_to(checkout.resolve())} (-r from {rel})"
                        for inc in read.included]
            break
    if not sources:
        raise BadInput(checkout, [("pyproject.toml", "no [build-system] requires and no "
                                   "requirements/build file: cannot tell the build's needs")])
    return BuildRequirements(pyproject_reqs, file_reqs, sources, options)


# pip options a requirements file may carry that say where packages come from: kept (the
# build installs with them), never a reason to refuse the file
INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i", "--find-links", "-f")


@dataclass(frozen=True)
class ReadRequirements:
    lines: list[str]
    options: list[str]  # "--extra-index-url URL", in the order met
    included: list[Path]  # files reached through -r


def read_requirement_lines(path: Path, *, _stack: tuple[Path, ...] = ()) -> ReadRequirements:
    """A requirements file as pip reads it: comments dropped, ``-r FILE`` followed
    (relative to the file; a cycle is an error), index options kept; any other option
    line is refused, naming it."""
    path = path.resolve()
    if path in _stack:
        raise BadInput(path, [("-r", "includes itself (a cycle through "
                               + " -> ".join(p.name for p in _stack) + ")")])
    lines: list[str] = []
    options: list[str] = []
    included: list[Path] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            flag, _, value = line.replace("=", " ", 1).partition(" ")
            value = value.strip()
            if flag in ("-r", "--requirement") and value:
                target = (path.parent / value).resolve()
                if not target.is_file():
                    raise BadInput(path, [(line[:60], f"{target} not found")])
                inner = read_requirement_lines(target, _stack=(*_stack, path))
                lines += inner.lines
                options += [o for o in inner.options if o not in options]
                included += [target, *inner.included]
                continue
            if flag in INDEX_OPTIONS and value:
                long = {"-i": "--index-url", "-f": "--find-links"}.get(flag, flag)
                if f"{long} {value}" not in options:
                    options.append(f"{long} {value}")
                continue
            raise BadInput(path, [(line[:40], "option lines other than -r and index options "
                                   "are not followed")])
        lines.append(line)
    return ReadRequirements(lines, options, included)


@dataclass(frozen=True)
class Requirements:
    lines: list[str]  # torch dropped; one line per distinct requirement, first source wins
    torch: list[str]  # the tree's torch requirements, as written
    sources: list[str]
    options: list[str] = field(default_factory=list)  # index options the tree's files name


def split_torch(reqs: list[str], path: Path) -> Requirements:
    """Drop torch (the pin installs it) and keep each distribution's first requirement."""
    lines, torch, seen = [], [], set()
    for line in reqs:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise BadInput(path, [(line[:60], f"not a requirement: {exc}")]) from None
        key = canonicalize_name(req.name)
        if key == "torch":
            torch.append(line)
            continue
        if key in seen:
            continue
        seen.add(key)
        lines.append(line)
    return Requirements(lines, torch, [])


def torch_disagreement(torch_lines: list[str], pinned: str, *,
                       machine: str = "x86_64") -> str | None:
    """Why the tree's torch requirements refuse the pin's torch version (None: they agree)."""
    for line in torch_lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(
                {"platform_machine": machine, "platform_system": "Linux"}):
            continue
        if not req.specifier.contains(pinned, prereleases=True):
            return f"the tree requires {line!r}, the pin installs torch {pinned}"
    return None
