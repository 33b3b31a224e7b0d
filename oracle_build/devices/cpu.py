"""The CPU target: vLLM's CPU build on x86_64 or aarch64, no GPU. Its numbers depend on the
kernel library vLLM loads for this CPU (AVX2 or AVX-512), so the loaded variant is part of
its identity, and its KV cache is always bounded (left alone, the engine sizes it from free
host memory: 21 GiB of 24 seen)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build.core.errors import PreflightFailed
from oracle_build.devices.base import Mismatch

if TYPE_CHECKING:
    from oracle_build.build.plan import Plan
    from oracle_build.contracts.pins import Target
    from oracle_build.host import Host

NAME = "cpu"
PROBE_DEVICE = "cpu"
GPU = False
BUILD_MEMORY_FLOOR_GIB = 2.0
BUILD_DISK_GIB = 8.0
BY_CPU_VARIANT = True


def build_env(target: Target, env: dict[str, str]) -> None:
    return None


def preflight(plan: Plan, facts: dict[str, Any]) -> None:
    return None


def wheel_check_about(target: Target) -> str:
    return ""


def check_wheel(plan: Plan, libraries: list[Path], root: Path) -> dict[str, Any] | None:
    return None


def compiled(target: Target, libraries: list[str]) -> tuple[list[str] | None, list[Mismatch]]:
    return None, []


def device_mismatches(target: Target, facts: dict[str, Any],
                      host_variant: str | None) -> list[Mismatch]:
    bad: list[Mismatch] = []
    if facts.get("machine") != target.machine:
        bad.append(("machine", target.machine, str(facts.get("machine"))))
    kernels = facts.get("cpu_kernels") or {}
    loaded = kernels.get("variant")
    if loaded is not None and loaded != host_variant:
        # vLLM fell back to another kernel library than this CPU calls for (a failed
        # import is only a warning in vLLM): its numerics are not this host's
        bad.append(("cpu kernel variant", str(host_variant), f"{loaded} (libraries loaded: "
                    f"{', '.join(kernels.get('loaded') or [])})"))
    return bad


def fits(target: Target, h: Host) -> tuple[bool, str]:
    return True, "cpu"


def engine_args(args: dict[str, Any]) -> None:
    if not args.get("kv_cache_memory_bytes"):
        raise PreflightFailed(
            "a CPU engine needs kv_cache_memory_bytes (it would size its KV cache from free "
            "host memory: 21 GiB of 24 seen)", hint="set engine.kv_cache_memory_bytes")
