"""The toolchain is part of the recipe: the C and C++ compilers a source build uses (the pin's,
or the host's ``cc`` and ``c++`` as CMake finds them), their versions, the floors the source's
own CMake sets (read from the tree, as its externals are), which of the pin's patches apply
(a patch's ``when``, as Spack's ``patch(..., when=...)``), and the compiler cache (ccache)
with its settings. Everything here is asked of the host once, when the plan is made, and
recorded."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from oracle_build.contracts.pins import Patch, Pin
from oracle_build.contracts.record import ToolchainFacts
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.env import tool_variable
from oracle_build.core.errors import BadInput, as_data
from oracle_build.core.log import say
from oracle_build.engine.compiler import prog_path
from oracle_build.recipe.cmake import Floor

DEFAULTS = {"cc": "cc", "cxx": "c++"}
# ccache's size bound when the tool's variable does not set one: a vLLM CPU build's objects
# are about 0.5 GB; a few pins' builds fit
CCACHE_MAXSIZE = "8G"


@dataclass(frozen=True)
class Compiler:
    role: str  # "cc" or "cxx"
    asked: str  # as the pin (or the default) names it
    path: str | None  # found on PATH (absolute), None when absent
    real_path: str | None  # symlinks resolved (c++ -> g++-12)
    version: str | None  # -dumpfullversion
    identity: str | None  # --version's first line

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        if self.path is None:
            return f"{self.asked} (not found)"
        return f"{self.asked} = {self.real_path} {self.version or '?'}"


def find_compiler(role: str, asked: str | None) -> Compiler:
    name = asked or DEFAULTS[role]
    env = envmod.build_env()
    path = name if os.path.isabs(name) else shutil.which(name, path=env.get("PATH"))
    if path is None or not os.path.isfile(path):
        return Compiler(role, name, None, None, None, None)
    version = proc.query([path, "-dumpfullversion"], env=env, timeout=30)
    ident = proc.query([path, "--version"], env=env, timeout=30)
    found = version.output.strip().splitlines()[0] if version.ok and version.output.strip() \
        else None
    return Compiler(role, name, path, os.path.realpath(path),
                    found if found and re.fullmatch(r"\d+(\.\d+)*", found) else None,
                    ident.output.strip().splitlines()[0] if ident.ok and ident.output.strip()
                    else None)


def compilers(pin: Pin) -> dict[str, Compiler]:
    build = pin.model.build
    return {"cc": find_compiler("cc", build.cc), "cxx": find_compiler("cxx", build.cxx)}


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


_OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def compare(found: Version, op: str, version: Version) -> bool:
    """``found`` against a condition's version, compared at the condition's precision: the
    compiler 12.2.0 against "== 12.2" is equal, against "< 12.3" is below."""
    width = len(version.release)
    return bool(_OPS[op](Version(".".join(map(str, found.release[:width]))), version))


@dataclass(frozen=True)
class PatchDecision:
    patch: Patch
    path: Path
    applies: bool
    why: str


def decide_patches(pin: Pin, target_name: str,
                   tools: dict[str, Compiler]) -> list[PatchDecision]:
    """Each patch the target considers, whether it applies here, and why."""
    out = []
    for patch in pin.patches_for(target_name):
        cond = patch.condition()
        if cond is None:
            out.append(PatchDecision(patch, pin.patch_path(patch), True, "always"))
            continue
        role, op, version = cond
        found = _version(tools[role].version)
        if found is None:
            out.append(PatchDecision(patch, pin.patch_path(patch), False,
                                     f"{patch.when}: {tools[role].label()}, version unknown"))
            continue
        applies = compare(found, op, Version(version))
        out.append(PatchDecision(patch, pin.patch_path(patch), applies,
                                 f"{patch.when}: {role} is {found}"))
    return out


def patched_files(patch_text: str) -> list[str]:
    """The files a unified diff changes (its ``+++ b/<file>`` lines)."""
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch_text, re.MULTILINE)]


@dataclass(frozen=True)
class FloorProblem:
    floor: Floor
    compiler: Compiler
    lifting: list[str]  # the pin's patches that change the floor's file

    def message(self) -> str:
        return (f"{self.compiler.label()} is below this source's floor: {self.floor.source} "
                f"stops configure below {self.floor.lang} {self.floor.version} "
                f"({self.floor.message})")


def floor_problems(floors: list[Floor], tools: dict[str, Compiler],
                   decisions: list[PatchDecision]) -> list[FloorProblem]:
    """The floors of the (patched) tree this toolchain is below."""
    out = []
    for floor in floors:
        tool = tools[floor.lang]
        found = _version(tool.version)
        if found is None or (floor.compiler_id == "GNU" and tool.identity is not None
                             and "clang" in tool.identity.lower()):
            continue  # another compiler family: the floor's condition is not about it
        if compare(found, "<", Version(floor.version)):
            file = floor.source.rsplit(":", 1)[0]
            lifting = [str(d.patch.file) for d in decisions
                       if file in patched_files(d.path.read_text(errors="replace"))]
            out.append(FloorProblem(floor, tool, lifting))
    return out


# ----------------------------------------------------------------------------- paths


# where every compiled object says it was built: the staging folder, whatever the home
MAPPED_TO = "."
# a staging path the map can carry as one flag (CMake splits <LANG>FLAGS at whitespace, GCC
# splits the map at '=', ccache splits ignore_options at spaces)
MAPPABLE = re.compile(r"/[A-Za-z0-9._/+@:,~-]*")
# the host compilers' flag variables (CMake reads them at configure), every device's
HOST_FLAG_VARS = (("CFLAGS", "{flag}"), ("CXXFLAGS", "{flag}"))


@dataclass(frozen=True)
class PathMap:
    """``-ffile-prefix-map=<staging>=.`` for every compiler of a source build: ``__FILE__``
    (torch's headers use it in every TORCH_CHECK), debug info and the like name ``./src/...``
    and ``./venv/...``, never the home, with or without the compiler cache (Debian's
    reproducible builds, BUILD_PATH_PREFIX_MAP). A device compiler that takes host flags
    through a switch of its own (nvcc's ``-Xcompiler``) has its own variable
    (devices: ``PATH_MAP_VARS``)."""

    staging: Path
    # environment variable -> how that language's compiler is given the flag ({flag})
    variables: tuple[tuple[str, str], ...]

    @property
    def flag(self) -> str:
        return f"-ffile-prefix-map={self.staging}={MAPPED_TO}"

    def env(self) -> dict[str, str]:
        return {var: form.format(flag=self.flag) for var, form in self.variables}

    def flags(self) -> list[str]:
        return sorted(set(self.env().values()))


def path_map(staging: Path, variables: tuple[tuple[str, str], ...] = ()) -> PathMap:
    """The map of a build staged in ``staging`` (absolute), refused (naming the folder) when
    its path cannot be one compiler flag."""
    if not MAPPABLE.fullmatch(str(staging)):
        raise BadInput("--home", [("<value>", f"the staging folder {str(staging)!r} holds a "
                                   "character a compiler flag cannot carry (a space, '=', a "
                                   "quote, ...): source builds need a home whose path is "
                                   "letters, digits and ._/+@:,~-")])
    return PathMap(staging, (*HOST_FLAG_VARS, *variables))


# ----------------------------------------------------------------------------- ccache


@dataclass(frozen=True)
class CompilerCache:
    """ccache as the compiler launcher: its folder (shared by every build of every home that
    names it: paths under the build's staging folder are rewritten relative, so the cache's
    keys do not depend on where a build runs), its bound, and whether it is cold (a
    throwaway folder: every object compiled anew, through the same launcher, so a cold and a
    warm build run the same compiler command lines)."""

    ccache: str | None  # the ccache binary; None: not on this host
    folder: Path
    maxsize: str
    cold: bool
    stats_log: Path

    @property
    def active(self) -> bool:
        return self.ccache is not None

    def env(self, staging: Path, path_map: PathMap) -> dict[str, str]:
        """ccache's settings for a build in ``staging`` whose compilers are given
        ``path_map``'s flags. Depend mode: a miss runs the compiler once and keys the next
        lookup by its own -MD dependency file (CMake's Ninja generator asks for one), with no
        preprocessor pass over each translation unit first (about 8% of a cold vLLM build,
        docs/performance.md). The compiler then sees CMake's absolute paths; the path map
        makes the objects independent of them, and the map's own flags (which name the
        staging folder) are left out of the keys, so that another home still hits."""
        if not self.active:
            return {}
        # ccache reads the file CCACHE_CONFIGPATH names instead of the cache folder's own
        # ccache.conf and /etc's (a `prefix_command` there would run a wrapper around every
        # compile, unrecorded): a path in the staging folder that nothing writes, so it reads
        # no file at all, only the CCACHE_* settings below
        return {"CCACHE_CONFIGPATH": str(staging / "ccache.conf.none"),
                "CCACHE_DIR": str(self.folder), "CCACHE_BASEDIR": str(staging),
                "CCACHE_NOHASHDIR": "true", "CCACHE_COMPILERCHECK": "content",
                "CCACHE_DEPEND": "true", "CCACHE_IGNOREOPTIONS": " ".join(path_map.flags()),
                "CCACHE_MAXSIZE": self.maxsize, "CCACHE_STATSLOG": str(self.stats_log)}

    def cmake_args(self, langs: tuple[str, ...] = ("C", "CXX")) -> list[str]:
        """The launcher of each language's compiler (vLLM's setup.py adds `ccache`, or
        sccache, itself when it finds one on PATH: a build without the cache says so
        explicitly, with an empty launcher)."""
        launcher = self.ccache if self.active else ""
        return [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in langs]

    def describe(self) -> str:
        if not self.active:
            return ("none: ccache is not on this host (Debian: apt-get install ccache); every "
                    "object is compiled anew")
        if self.cold:
            return (f"cold: {self.ccache} into a throwaway folder {self.folder} (removed after "
                    "the build): every object compiled anew")
        return f"{self.ccache}, folder {self.folder} (at most {self.maxsize})"


def compiler_cache(home: Path, staging: Path, *, cold: bool = False) -> CompilerCache:
    ccache = shutil.which("ccache", path=envmod.build_env().get("PATH"))
    named = tool_variable("ORACLE_BUILD_COMPILER_CACHE")
    folder = (staging / "ccache-cold" if cold else
              Path(named).expanduser().resolve() if named else home / "ccache")
    maxsize = tool_variable("ORACLE_BUILD_COMPILER_CACHE_SIZE") or CCACHE_MAXSIZE
    if not re.fullmatch(r"\d+(\.\d+)?[kKMGT]?i?", maxsize):
        raise BadInput("$ORACLE_BUILD_COMPILER_CACHE_SIZE",
                       [("<value>", f"{maxsize!r} is not a size like 8G or 500M")])
    conf = folder / "ccache.conf"
    if ccache is not None and (conf.exists() or conf.is_symlink()) and str(conf) not in _TOLD:
        _TOLD.add(str(conf))
        say(f"note: {as_data(str(conf))} is not read: the build's compiler cache takes only "
            "the settings the tool gives it (CCACHE_CONFIGPATH)")
    return CompilerCache(ccache, folder, maxsize, cold, staging / "ccache-stats.log")


_TOLD: set[str] = set()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    other: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "other": dict(self.other)}


HIT = {"direct_cache_hit", "preprocessed_cache_hit", "local_storage_hit",
       "remote_storage_hit"}
MISS = {"cache_miss", "local_storage_miss"}


def read_stats(log: Path) -> CacheStats | None:
    """What the build's compiler calls found in the cache, from ccache's stats log (one
    result name a line, a ``#`` line naming each call)."""
    if not log.is_file():
        return None
    stats = CacheStats()
    calls = 0
    hit = miss = False
    for line in [*log.read_text(errors="replace").splitlines(), "#"]:
        if line.startswith("#"):
            if calls:
                if hit:
                    stats.hits += 1
                elif miss:
                    stats.misses += 1
            calls += 1
            hit = miss = False
            continue
        name = line.strip()
        if name in HIT:
            hit = True
        elif name in MISS:
            miss = True
        elif name:
            stats.other[name] = stats.other.get(name, 0) + 1
    return stats


def linker(cxx: Compiler, env: dict[str, str]) -> str | None:
    """The --version line of the linker the C++ compiler runs (`-print-prog-name=ld`)."""
    if cxx.path is None:
        return None
    path = prog_path(cxx.path, "ld", env) or shutil.which("ld", path=env.get("PATH"))
    return tool_version([path, "--version"], env) if path else None


def toolchain_key(tools: ToolchainFacts, device_parts: list[str]) -> str:
    """One line naming what a source build's compiled bytes depend on beyond the pin: each
    compiler and the linker by their own --version lines, and the device's compiler where
    the target has one (``device_parts``: devices' toolchain_parts). The same pin built with
    the same key on two hosts must give the same bytes; another key is another entry of the
    pin's compiled bytes."""
    parts = [f"{role}: {c.identity or c.version or c.asked + ' (not found)'}"
             for role, c in sorted(tools.compilers.items())]
    if tools.linker:
        parts.append(f"ld: {tools.linker}")
    return "; ".join([*parts, *device_parts])


def tool_version(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    answer = proc.query(argv, env=env, timeout=30)
    if not answer.ok or not answer.output.strip():
        return None
    return answer.output.strip().splitlines()[0]
