"""An oracle venv as one object (as pypa/build keeps its isolated environment): where it
is, its python, its build record, and running the scripts of ``inside/`` with that python.

Scripts run in isolated mode (-I: no PYTHONPATH, no user site, no script folder on the
path), from a fresh empty folder, with the scrubbed environment, through the one
subprocess wrapper. They answer through a file, because vLLM logs to stdout.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from packaging.utils import canonicalize_name
from uv import find_uv_bin

from oracle_build.core import env as envmod
from oracle_build.core import layout, proc
from oracle_build.core.errors import BadInput, OracleMissing
from oracle_build.core.files import json_value

INSIDE = Path(__file__).parent.parent / "inside"
# How the oracle's python runs every script of ours: isolated (-I: no PYTHON* variables, no
# user site, no script folder on sys.path) and never writing bytecode (-B; -I makes it ignore
# PYTHONDONTWRITEBYTECODE): a probe or an engine never writes into the oracle (a patched
# module's .pyc written by a probe stayed after the module was restored, and the oracle
# mismatched for good).
RUN_FLAGS = ("-I", "-B")


def uv() -> str:
    return find_uv_bin()


@dataclass(frozen=True)
class Answer:
    """What an inside script wrote (``data``) and how its process ended."""

    data: dict[str, Any] | None
    result: proc.Result
    # arrays the script saved beside its answer (``arrays_file``: a plain .npz name)
    arrays: dict[str, Any] | None = None


@dataclass(frozen=True)
class OracleVenv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def record_path(self) -> Path:
        return layout.build_record_path(self.path)

    @property
    def record_dir(self) -> Path:
        return layout.record_dir(self.path)

    def exists(self) -> bool:
        return self.path.exists() or self.path.is_symlink()

    def has_record(self) -> bool:
        return self.record_path.exists()

    def require(self) -> None:
        if not self.python.exists():
            raise OracleMissing(f"no python at {self.python}", hint="run build_oracle first")

    def run_inside(self, script: str, args: Sequence[str], *, request: Any | None = None,
                   env: Mapping[str, str] | None = None, log: Path | None = None,
                   what: str | None = None, timeout: float | None = None,
                   echo: bool = True) -> Answer:
        """Run ``inside/<script>`` with this venv's python: ``script [REQUEST] OUT args``.
        The answer is the JSON the script wrote to OUT (None if it wrote none)."""
        self.require()
        with tempfile.TemporaryDirectory(prefix=f"oracle-{Path(script).stem}-") as neutral:
            out = Path(neutral) / "answer.json"
            argv = [str(self.python), *RUN_FLAGS, str(INSIDE / script)]
            if request is not None:
                req = Path(neutral) / "request.json"
                req.write_text(json.dumps(request))
                argv.append(str(req))
            argv += [str(out), *args]
            result = proc.run(argv, env=envmod.oracle_env(env), cwd=Path(neutral), log=log,
                              capture=log is None, check=False, echo=echo, what=what,
                              timeout=timeout, closed=proc.oracle_network()[0])
            data = json_value(out.read_text()) if out.exists() else None
            arrays = arrays_beside(Path(neutral), data)
        return Answer(data, result, arrays)

    def locate(self) -> tuple[str | None, str | None]:
        """Where this python says its prefix is and where vllm resolves, without importing
        vllm (milliseconds)."""
        code = ("import importlib.util, json, os, sys; s = importlib.util.find_spec('vllm'); "
                "print(json.dumps([os.path.realpath(sys.prefix), "
                "s and os.path.realpath(s.origin)]))")
        out = proc.query([str(self.python), *RUN_FLAGS, "-c", code], env=envmod.oracle_env(),
                         cwd=Path(tempfile.gettempdir()), timeout=120,
                         closed=proc.oracle_network()[0])
        try:
            prefix, origin = json_value(out.output)
        except (ValueError, TypeError):
            return None, None
        return prefix, origin

    def distributions(self) -> dict[str, str]:
        """Installed distributions (canonical name -> version), as uv sees them."""
        out = proc.run([uv(), "pip", "freeze", "--python", str(self.python)],
                       env={**envmod.build_env(), **envmod.UV}, capture=True, echo=False)
        dists: dict[str, str] = {}
        for line in out.output.splitlines():
            if "==" in line:
                name, version = line.split("==", 1)
                dists[str(canonicalize_name(name))] = version.strip()
        return dists

    def retarget_scripts(self, final: Path) -> dict[str, str]:
        """Before this venv is renamed to ``final``: console scripts' shebangs name the
        python there. Returns the rewritten files (relative) with their sha256 before."""
        import hashlib

        old_prefix = f"#!{self.path}/bin/".encode()
        changed = {}
        for script in sorted((self.path / "bin").iterdir()):
            if script.is_symlink() or not script.is_file():
                continue
            data = script.read_bytes()
            if data.startswith(old_prefix):
                changed[f"bin/{script.name}"] = hashlib.sha256(data).hexdigest()
                script.write_bytes(f"#!{final}/bin/".encode() + data[len(old_prefix):])
        return changed

    def is_real_dir(self) -> bool:
        return self.path.is_dir() and not self.path.is_symlink()


def real(path: Path) -> str:
    return os.path.realpath(path)


def arrays_beside(folder: Path, data: Any) -> dict[str, Any] | None:
    name = data.get("arrays_file") if isinstance(data, dict) else None
    if name is None:
        return None
    path = folder / str(name)
    if "/" in str(name) or str(name).startswith(".") or not path.is_file():
        raise BadInput(path, [("arrays_file", "not a plain file name the script wrote")])
    try:
        with np.load(path, allow_pickle=False) as z:
            return {key: z[key] for key in z.files}
    except (OSError, ValueError) as exc:
        raise BadInput(path, [("<file>", f"not a readable .npz: {exc}")]) from None
