"""The engine's run-time compiler: an input, held like the CPU kernel variant.

vLLM's CPU engine has torch inductor compile C++ kernels when it starts (with
``enforce_eager = false``: the model's own RMSNorm, rotary and SiLU-mul kernels), with the
compiler inductor finds: ``CXX``, else ``g++`` on the PATH it is given, and ``-march=native``.
Measured (docs/build-and-identity.md#what-reaches-the-engine): clang 14 in place of GCC 12.2
moved 1,277 of 1,440 top-k logprobs while identity said OK. So the tool decides the compiler
and gives it to the engine explicitly: ``$ORACLE_BUILD_RUNTIME_CXX`` when the caller names one
(then it is configuration: recorded, and another one on verify is a numerics difference),
else the pin target's ``runtime_cxx``, else the system's ``g++`` (looked up in the system's
folders only, never the caller's PATH); with ``-march`` following the held kernel variant.
Its identity (version line; sha256 of the driver, ``cc1plus``, ``as`` and ``ld``) keys the
engine's compile cache, so another compiler never reuses a kernel it did not compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from oracle_build.contracts.golden import RuntimeCompilerRecord
from oracle_build.contracts.targets import Target
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import PreflightFailed, as_data
from oracle_build.core.files import sha256_file
from oracle_build.devices import Hold

VARIABLE = "ORACLE_BUILD_RUNTIME_CXX"
DEFAULT = "g++"
# inductor picks a compiler's flags by its name (gcc, g++, clang): a name that says neither
# (c++, cc) is given by the file it resolves to
GENERIC_NAMES = ("c++", "cc", "CC", "cpp")
# what a C++ compile and link runs besides the driver, asked of the driver itself
PARTS = ("cc1plus", "as", "ld")
# the variables the engine is given for it (its record holds them, not the environment's)
SET = ("CXX", "TORCHINDUCTOR_CPP_MARCH")


@dataclass(frozen=True)
class RuntimeCompiler:
    chosen_by: str
    path: str  # what the engine is given as CXX
    real_path: str
    version: str | None
    tools: dict[str, str | None]  # driver and PARTS -> sha256; None: not one it runs
    march: str | None

    def env(self) -> dict[str, str]:
        """The variables the engine's process is given (inductor reads both at import)."""
        out = {"CXX": self.path}
        if self.march is not None:
            out["TORCHINDUCTOR_CPP_MARCH"] = self.march
        return out

    @property
    def fingerprint(self) -> str:
        """What the compiled kernels' bytes depend on of the compiler: its version line, the
        bytes of every program it runs, the -march it is given."""
        data = json.dumps([self.version, self.tools, self.march], sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()

    def record(self, kernels: dict[str, str] | None = None) -> RuntimeCompilerRecord:
        return RuntimeCompilerRecord(chosen_by=self.chosen_by, path=self.path,
                                     real_path=self.real_path, version=self.version,
                                     tools=dict(self.tools), march=self.march,
                                     kernels=kernels)

    def line(self) -> str:
        """Identity's line, as it names the build's toolchain."""
        tools = ", ".join(f"{k} {v[:12] if v else '-'}" for k, v in self.tools.items())
        march = f"-march={self.march}" if self.march else "-march=native (inductor's default)"
        return (f"run-time compiler {as_data(self.path)} ({as_data(self.version or '?')}; "
                f"{march}; sha256 {tools}; {as_data(self.chosen_by)})")


def _query_env() -> dict[str, str]:
    return {"PATH": os.pathsep.join(envmod.SYSTEM_PATH), "LANG": "C", "LC_ALL": "C"}


def _found(name: str, why: str) -> str:
    if os.path.isabs(name):
        path: str | None = name
    else:
        path = shutil.which(name, path=os.pathsep.join(envmod.SYSTEM_PATH))
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise PreflightFailed(
            f"the engine's run-time compiler {as_data(name)} ({why}) is not on this host "
            f"(looked up in {os.pathsep.join(envmod.SYSTEM_PATH)}, never the caller's PATH)",
            hint=f"install it (Debian: apt-get install g++), or set ${VARIABLE} to a C++ "
            "compiler's absolute path")
    return path


def prog_path(driver: str, part: str, env: dict[str, str]) -> str | None:
    """The program a compiler driver runs as ``part`` (``-print-prog-name``: cc1plus, as,
    ld), found on ``env``'s PATH when the driver names it bare; None when it answers
    nothing or names none that is there. The run-time compiler's parts and a source
    build's linker (recipe/toolchain.py) are both asked this way."""
    asked = proc.query([driver, f"-print-prog-name={part}"], env=env, timeout=30)
    name = asked.output.strip().splitlines()[0] if asked.ok and asked.output.strip() else ""
    if not name:
        return None
    path = name if os.path.isabs(name) else shutil.which(name, path=env.get("PATH"))
    return path if path and os.path.isfile(path) else None


def _part(driver: str, part: str) -> str | None:
    """The file the driver runs as ``part``, symlinks resolved; None when it runs none of
    its own (clang's integrated cc1)."""
    path = prog_path(driver, part, _query_env())
    return os.path.realpath(path) if path else None


@cache
def _describe(path: str, march: str | None, chosen_by: str) -> RuntimeCompiler:
    given = path
    if os.path.basename(path) in GENERIC_NAMES:
        given = os.path.realpath(path)
    real = os.path.realpath(path)
    answer = proc.query([given, "--version"], env=_query_env(), timeout=30)
    if not answer.ok:
        raise PreflightFailed(f"the engine's run-time compiler {as_data(given)} did not answer "
                              f"--version (exit {answer.returncode})",
                              hint=f"set ${VARIABLE} to a working C++ compiler")
    version = answer.output.strip().splitlines()[0] if answer.output.strip() else None
    if version is not None and version.split(" ", 1)[0] == os.path.basename(given):
        # GCC starts its line with the name it was called by (g++, c++): the file's own name
        # instead, so that one compiler named two ways is one compiler
        version = f"{os.path.basename(real)} {version.split(' ', 1)[1] if ' ' in version else ''}"
    tools: dict[str, str | None] = {"driver": sha256_file(Path(real))}
    for part in PARTS:
        found = _part(given, part)
        tools[part] = sha256_file(Path(found)) if found else None
    return RuntimeCompiler(chosen_by, given, real, version, tools, march)


def choose(target: Target, hold: Hold) -> RuntimeCompiler:
    """The compiler this target's engines are given, and its identity."""
    named = envmod.tool_variable(VARIABLE)
    asked = getattr(target, "runtime_cxx", None)
    if named:
        name, why = named, f"${VARIABLE}"
    elif asked:
        name, why = asked, "the pin target's runtime_cxx"
    else:
        name, why = DEFAULT, f"the default: {DEFAULT} in the system's folders"
    return _describe(_found(name, why), hold.march, why)
