"""An NVIDIA GPU target (GB10 = sm_121, Thor = sm_110; CUDA 13): nvcc under CUDA_HOME and a
driver that answers before a build; TORCH_CUDA_ARCH_LIST from the target; the sm_XX set of
the built libraries (cuobjdump) exactly within the target's expected_sm, at build and at
every identity check; the first visible GPU by name and compute capability."""

from __future__ import annotations

from os import environ
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build import archsets, host
from oracle_build.contracts.pins import CudaTarget
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.devices.base import Hold, Mismatch, no_hold

if TYPE_CHECKING:
    from oracle_build.build.plan import Plan
    from oracle_build.contracts.pins import Target
    from oracle_build.host import Host

NAME = "cuda"
PROBE_DEVICE = "cuda"
GPU = True
BUILD_MEMORY_FLOOR_GIB = 16.0
BUILD_DISK_GIB = 60.0
BY_CPU_VARIANT = False
hold = no_hold


def _cuda(target: Target) -> CudaTarget:
    assert isinstance(target, CudaTarget), target
    return target


def build_env(target: Target, env: dict[str, str]) -> None:
    env["TORCH_CUDA_ARCH_LIST"] = _cuda(target).torch_cuda_arch_list


def preflight(plan: Plan, facts: dict[str, Any]) -> None:
    cuda_home = plan.build_env.get("CUDA_HOME") or environ.get("CUDA_HOME")
    if not cuda_home or not (Path(cuda_home) / "bin" / "nvcc").exists():
        raise PreflightFailed(f"no nvcc under CUDA_HOME={cuda_home}",
                              hint="install the CUDA 13 toolkit or fix [build.env].CUDA_HOME")
    facts["nvcc"] = host.nvcc_version(cuda_home)
    facts["driver"] = host.host().driver
    if not host.host().gpus:
        raise PreflightFailed("no NVIDIA driver answers (nvidia-smi)")


def wheel_check_about(target: Target) -> str:
    return ("; the sm_XX set in the configure log and in the built libraries "
            "(cuobjdump --list-elf) is the target's")


def configure_arches(log_text: str) -> dict[str, str]:
    """The architecture lines vLLM's CMake configure printed."""
    out = {}
    for line in log_text.splitlines():
        for key in ("CUDA supported target architectures", "CUDA target architectures"):
            if key + ":" in line:
                out[key] = line.split(key + ":", 1)[1].strip()
    return out


def check_wheel(plan: Plan, libraries: list[Path], root: Path) -> dict[str, Any] | None:
    target = _cuda(plan.target)
    cfg = configure_arches(plan.log.read_text(errors="replace"))
    sms = archsets.cuobjdump_sm([str(p) for p in libraries])
    allowed = set(target.expected_sm)
    if not sms or not set(sms) <= allowed:
        raise BuildFailed(
            f"the wheel's libraries hold {', '.join(sms) or 'no sm_XX code'}; target "
            f"{plan.target_name} expects only {', '.join(sorted(allowed))} "
            f"(configure log: {cfg or 'no architecture lines'})",
            hint="check TORCH_CUDA_ARCH_LIST; some vLLM versions skip sm_12x kernels for '12.1a'")
    return {"configure_log": cfg, "cuobjdump": sms}


def compiled(target: Target, libraries: list[str]) -> tuple[list[str] | None, list[Mismatch]]:
    sms = archsets.cuobjdump_sm(libraries)
    allowed = set(_cuda(target).expected_sm)
    if not sms or not set(sms) <= allowed:
        return sms, [("compiled sm", ", ".join(sorted(allowed)), ", ".join(sms) or "none")]
    return sms, []


def device_mismatches(target: Target, facts: dict[str, Any],
                      held: Hold) -> list[Mismatch]:
    t = _cuda(target)
    torch = (facts.get("modules") or {}).get("torch", {})
    want = f"{t.device_name} sm_{t.compute_capability.replace('.', '')}"
    devices = torch.get("devices") or []
    if not devices:
        return [("device", want, torch.get("cuda_error") or "no CUDA device visible")]
    first = devices[0]
    if first.get("capability") != t.compute_capability or \
            t.device_name.lower() not in str(first.get("name", "")).lower():
        return [("device", want, f"{first.get('name')} ({first.get('capability')})")]
    return []


def fits(target: Target, h: Host) -> tuple[bool, str]:
    t = _cuda(target)
    nvidia = [g for g in h.gpus if g.vendor == "nvidia"]
    for gpu in nvidia:
        if gpu.compute_capability == t.compute_capability and \
                t.device_name.lower() in gpu.name.lower():
            return True, f"{gpu.name} sm_{gpu.compute_capability.replace('.', '')}"
    found = ", ".join(f"{g.name} ({g.compute_capability})" for g in nvidia) or "no NVIDIA GPU"
    return False, (f"needs {t.device_name} with compute capability {t.compute_capability}; "
                   f"this host has {found}")


def engine_args(args: dict[str, Any]) -> None:
    return None
