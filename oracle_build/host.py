"""What this host is, detected once and frozen: machine, memory, GPUs and their compute
capability (each device module asks its own tools), driver, toolchain, the CPU's flags and
kernel variant; and this tool's own facts. No pin logic.

Every fact comes from one ``Host`` object built on first use (``host()``); nothing below
asks the GPU tools or reads /proc/meminfo again, except ``available_memory()``, which is a
reading taken when an engine is about to start.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build import __version__, devices
from oracle_build.core import proc
from oracle_build.devices import Hold
from oracle_build.devices.base import Gpu, Host

if TYPE_CHECKING:
    from oracle_build.contracts.targets import Target

REPO = Path(__file__).resolve().parent.parent


def meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return out


# The flags torch tests before vLLM's CPU platform picks its kernel library
# (vllm/platforms/cpu.py import_kernels): AVX-512 with BF16 -> vllm._C, AVX-512 ->
# vllm._C_AVX512, otherwise vllm._C_AVX2; AMX tiles change the GEMMs oneDNN runs.
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(rest.split())
    return frozenset()


def cpu_model(path: Path = Path("/proc/cpuinfo")) -> dict[str, str | None]:
    """The CPU's vendor and model name (``vendor_id``, ``model name``): a golden records
    them, so a bit difference under a held variant can be told apart by CPU model."""
    out: dict[str, str | None] = {"cpu_vendor": None, "cpu_model": None}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = {"vendor_id": "cpu_vendor", "model name": "cpu_model"}.get(key.strip())
        if name and out[name] is None:
            out[name] = rest.strip()[:200]
    return out


def cpu_variant(machine: str, flags: frozenset[str]) -> str:
    """The CPU kernel variant vLLM's CPU build runs on this host: ``x86_64-avx2``,
    ``x86_64-avx512``, ``x86_64-avx512_bf16``, each ``-amx`` when AMX tiles are there;
    another machine is its name (one kernel library there)."""
    if machine not in ("x86_64", "AMD64"):
        return machine
    level = "avx2"
    if all(f in flags for f in AVX512_FLAGS):
        level = "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    return f"x86_64-{level}" + ("-amx" if "amx_tile" in flags else "")


def available_memory() -> int | None:
    """Host memory available now (not cached: it is read just before an engine starts)."""
    return meminfo().get("MemAvailable")


@cache
def host() -> Host:
    """This host, detected once per process."""
    info = meminfo()
    machine = platform.machine()
    flags = cpu_flags()

    return Host(machine=machine, system=platform.system(), gpus=devices.detect_gpus(),
                mem_available_bytes=info.get("MemAvailable"),
                mem_total_bytes=info.get("MemTotal"),
                cpu_variant=cpu_variant(machine, flags), cpu_flags=flags)


def _first_line(argv: list[str]) -> str | None:
    text = proc.query(argv, timeout=30).output.strip()
    return text.splitlines()[0] if text else None


def facts(build_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Host facts for records (build records, goldens); ``build_env``: the build's
    environment, where a device's toolchain is (CUDA_HOME)."""
    return dict(_facts(tuple(sorted((build_env or {}).items()))))


@cache
def _facts(build_env: tuple[tuple[str, str], ...]) -> dict[str, Any]:

    h = host()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "machine": h.machine,
        "cpu_variant": h.cpu_variant,
        **cpu_model(),
        "kernel": platform.release(),
        "libc": "-".join(platform.libc_ver()),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": h.mem_total_bytes,
        "mem_available_bytes": h.mem_available_bytes,
        "gpus": [asdict(g) for g in h.gpus],
        "driver": h.driver,
        **devices.host_facts(dict(build_env)),
        "compiler": _first_line(["cc", "--version"]),
    }


@cache
def tool_facts() -> dict[str, Any]:
    """This tool: version, the git commit it runs from (``-dirty`` when its code differs)."""
    commit = None
    if (REPO / ".git").exists():
        head = proc.query(["git", "-C", str(REPO), "rev-parse", "HEAD"])
        if head.ok:
            dirty = proc.query(["git", "-C", str(REPO), "status", "--porcelain", "--",
                                "oracle_build"])
            commit = head.output.strip() + ("-dirty" if dirty.output.strip() else "")
    return {"name": "oracle-build", "version": __version__, "git_commit": commit,
            "python": sys.version.split()[0]}


__all__ = ["Gpu", "Host", "hold", "host", "missing_instructions"]


def hold(target: Target, asked: str | None = None) -> Hold:
    """The CPU kernel variant this host's runs of ``target`` are held to: ``asked`` (a
    golden's recorded variant, ``--kernel-variant``) or the pin target's (PreflightFailed
    when this host's CPU lacks its instructions)."""
    h = host()
    return devices.module(target).hold(target, asked, h.cpu_flags, h.cpu_variant)


def missing_instructions(target: Target, asked: str | None = None) -> list[str]:
    """The instructions the variant ``asked`` (default: the pin target's) needs that this
    host's CPU lacks; [] when it can run it, or the target holds no CPU variant."""
    return devices.module(target).missing_instructions(target, asked, host().cpu_flags)
