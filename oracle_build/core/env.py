"""Environment: what a build or an oracle run never inherits, what each adds, and which
variables records keep. The one place these lists live; inside/ scripts receive the recorded
prefixes in their request (they import nothing from the harness)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from oracle_build.core.log import say

# Never reaches the oracle's python: each would change what gets imported or built.
SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP",
            "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "VIRTUAL_ENV", "VLLM_USE_PRECOMPILED")
# A build also drops these: uv's own configuration (the pin says where wheels come from), a
# pretend version (setuptools-scm would stamp any version asked), every precompiled-kernel
# switch (every VLLM_*PRECOMPILED* variable), and git's environment (GIT_DIR would point
# setuptools-scm at another repository).
BUILD_DROPPED_PREFIXES = ("UV_", "SETUPTOOLS_SCM_PRETEND", "VLLM_USE_PRECOMPILED", "GIT_")
# Recorded in goldens and logs: every variable that can change what vLLM computes.
RECORDED_PREFIXES = ("VLLM_", "CUDA", "TORCH", "TRITON_", "FLASHINFER_", "NCCL", "CUBLAS",
                     "OMP_", "KMP_", "MKL_", "PYTORCH_", "LD_", "HIP_", "ROCM_", "ATEN_",
                     "ONEDNN_", "DNNL_")
# Move CPU numerics below vLLM: torch's dispatch level, oneDNN's maximum ISA (both spellings),
# MKL's conditional numerical reproducibility and instruction cap. A caller's values never
# reach the oracle (scrubbed, and said); under a held kernel variant the tool sets them from
# the variant (oracle_build/devices/cpu.py), and the golden records them with the variant.
CPU_NUMERICS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR",
                "MKL_ENABLE_INSTRUCTIONS")
# Shown in a command's log when the environment it ran under differs from ours.
SHOWN_PREFIXES = ("VLLM_", "PYTHON", "CUDA", "TORCH", "CMAKE", "PIP_", "UV_", "GIT_")

# uv's default is to hard-link installed files to its cache: an edit to one venv's file
# would then change the cache and every venv installed from it (seen here: a patched
# sampler.py in one oracle appeared in the next build). An oracle owns copies.
UV = {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1",
      "UV_LINK_MODE": "copy"}
# Bytecode compiled at install is part of the oracle's identity: hash-based pycs (py_compile
# writes checked-hash pycs when SOURCE_DATE_EPOCH is set), whose bytes do not depend on when
# the files were unpacked, and which Python never rewrites while the source is unchanged.
BYTECODE = {"SOURCE_DATE_EPOCH": "315532800"}
# The oracle's processes never write bytecode into it: the venv stays as its manifest says.
ORACLE_RUN = {"PYTHONDONTWRITEBYTECODE": "1"}
# The dynamic loader's variables choose which shared libraries run (LD_LIBRARY_PATH put the
# system's libgomp in place of torch's own): never inherited; a pin's target env may set them.
LOADER_PREFIX = "LD_"
# git may only use transports that move data; never ext:: or fd:: (they run commands).
GIT = {"GIT_ALLOW_PROTOCOL": "file:https:http:ssh:git", "GIT_TERMINAL_PROMPT": "0",
       "GIT_CONFIG_NOSYSTEM": "1", "GIT_ADVICE": "0"}


_told: set[str] = set()


def oracle_env(overlay: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process run by the oracle's python: the caller's, less what is
    scrubbed and the loader's variables, plus ``overlay`` (the pin's target env)."""
    loader = sorted(k for k in os.environ if k.startswith(LOADER_PREFIX))
    untold = [k for k in loader if k not in _told and k not in (overlay or {})]
    if untold:
        say(f"note: {', '.join(untold)} not passed to the oracle (the shared libraries it "
            "maps are part of its identity; a pin's target env may set them)")
        _told.update(untold)
    numerics = sorted(k for k in os.environ if k in CPU_NUMERICS)
    untold = [k for k in numerics if k not in _told]
    if untold:
        shown = ", ".join(f"{k}={os.environ[k]!r}" for k in untold)
        say(f"note: {shown} not passed to the oracle (they move CPU numerics: the kernel "
            "variant the run holds sets them; a pin's kernel_variant or --kernel-variant "
            "chooses it)")
        _told.update(untold)
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUBBED and k not in CPU_NUMERICS and not k.startswith(LOADER_PREFIX)}
    env.update(ORACLE_RUN)
    env.update(overlay or {})
    return env


def build_dropped(key: str) -> bool:
    return (key in SCRUBBED or key.startswith(BUILD_DROPPED_PREFIXES)
            or (key.startswith("VLLM_") and "PRECOMPILED" in key))


def build_env() -> dict[str, str]:
    """The base environment of every build command; each command overlays its own."""
    return {k: v for k, v in os.environ.items() if not build_dropped(k)}


def recorded(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_PREFIXES)}


def tool_variable(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """One of the tool's own variables (``ORACLE_BUILD_*``), or None when unset or empty.
    It comes from whoever set up the caller's environment: a value with a control character
    (a newline could print a line of its own, an escape rewrite the terminal) is refused,
    exit 2, named, and shown escaped."""
    from oracle_build.core.errors import BadInput, as_data

    value = (os.environ if environ is None else environ).get(name)
    if not value:
        return None
    if as_data(value, limit=len(value) * 10 + 1) != value:
        raise BadInput(f"${name}", [("<value>", f"{as_data(value, 200)}: holds a control "
                                     "character (a newline, an escape): refused")],
                       hint=f"unset {name} or set it to a plain value")
    return value
