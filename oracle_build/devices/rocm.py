"""An AMD GPU target (gfx1100, ROCm 7.x, x86_64): hipcc of the pinned HIP version under
ROCM_HOME and an AMD GPU that answers before a build; VLLM_TARGET_DEVICE, PYTORCH_ROCM_ARCH
and ROCM_HOME for the build; the gfx set of the built libraries' HIP offload bundles exactly
the target's, at build and at every identity check; torch built for the pinned HIP and the
first visible GPU by name and gfx arch."""

from __future__ import annotations

from os import environ
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build import archsets, host
from oracle_build.contracts.pins import RocmTarget
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.devices.base import Hold, Mismatch, no_hold

if TYPE_CHECKING:
    from oracle_build.build.plan import Plan
    from oracle_build.contracts.pins import Target
    from oracle_build.host import Host

NAME = "rocm"
PROBE_DEVICE = "cuda"  # ROCm's torch runs HIP through the torch.cuda API
GPU = True
BUILD_MEMORY_FLOOR_GIB = 16.0
BUILD_DISK_GIB = 60.0
BY_CPU_VARIANT = False
hold = no_hold
DEFAULT_ROCM_HOME = "/opt/rocm"


def _rocm(target: Target) -> RocmTarget:
    assert isinstance(target, RocmTarget), target
    return target


def build_env(target: Target, env: dict[str, str]) -> None:
    t = _rocm(target)
    env["VLLM_TARGET_DEVICE"] = "rocm"
    env["PYTORCH_ROCM_ARCH"] = t.pytorch_rocm_arch
    env.setdefault("ROCM_HOME", t.rocm_home or DEFAULT_ROCM_HOME)


def preflight(plan: Plan, facts: dict[str, Any]) -> None:
    """hipcc under ROCM_HOME and its HIP version (the pin's), and an amdgpu driver that
    answers with an AMD GPU."""
    t = _rocm(plan.target)
    rocm_home = plan.build_env.get("ROCM_HOME") or environ.get("ROCM_HOME") or \
        t.rocm_home or DEFAULT_ROCM_HOME
    hipcc = Path(rocm_home) / "bin" / "hipcc"
    if not hipcc.exists():
        raise PreflightFailed(f"no hipcc under ROCM_HOME={rocm_home}",
                              hint="run inside the ROCm base container, or fix the target's "
                              "rocm_home / build_env ROCM_HOME")
    answer = proc.query([str(hipcc), "--version"], env=envmod.build_env())
    version = host.hip_version(answer.output)
    want = t.hip_version
    if not version or not (version == want or version.startswith(want + ".")):
        raise PreflightFailed(f"hipcc at {hipcc} reports HIP {version or '(none)'}; target "
                              f"{plan.target_name} pins HIP {want}",
                              hint="use the ROCm userland the pin names (the ROCm base "
                              "container's tag)")
    amd = [g for g in host.host().gpus if g.vendor == "amd"]
    if not amd:
        raise PreflightFailed("no AMD GPU answers (rocminfo, amd-smi): is the amdgpu driver "
                              "loaded and /dev/kfd passed into the container?")
    facts.update({"hipcc": str(hipcc), "hip_version": version, "driver": amd[0].driver,
                  "gpus": [f"{g.name} {g.arch}" for g in amd]})


def wheel_check_about(target: Target) -> str:
    return ("; the gfx set in the built libraries' offload bundles is exactly "
            f"{', '.join(_rocm(target).expected_gfx)}")


def check_wheel(plan: Plan, libraries: list[Path], root: Path) -> dict[str, Any] | None:
    """The wheel's HIP offload bundles hold code for exactly the target's gfx set."""
    t = _rocm(plan.target)
    found = archsets.offload_arches([str(p) for p in libraries],
                                    roc_obj_ls=host.rocm_tool("roc-obj-ls", t.rocm_home))
    problems = found.problems(t.expected_gfx)
    if problems:
        raise BuildFailed(
            "the wheel's HIP code is not the target's: " + "; ".join(
                f"{f}: expected {e}, found {g}" for f, e, g in problems),
            hint="check PYTORCH_ROCM_ARCH in the build environment (the target's "
            "pytorch_rocm_arch)")
    return {"offload_bundles": {str(Path(k).relative_to(root)): v
                                for k, v in found.by_library.items()}}


def compiled(target: Target, libraries: list[str]) -> tuple[list[str] | None, list[Mismatch]]:
    t = _rocm(target)
    found = archsets.offload_arches(libraries, roc_obj_ls=host.rocm_tool("roc-obj-ls",
                                                                         t.rocm_home))
    return found.gfx, found.problems(t.expected_gfx)


def device_mismatches(target: Target, facts: dict[str, Any],
                      held: Hold) -> list[Mismatch]:
    """torch built for the pinned HIP version, and the first visible GPU by name and gfx
    arch (``gcnArchName``, target-id features such as ``:sramecc+:xnack-`` aside)."""
    t = _rocm(target)
    bad: list[Mismatch] = []
    torch = (facts.get("modules") or {}).get("torch", {})
    hip = torch.get("hip")
    if not hip or not (hip == t.hip_version or str(hip).startswith(t.hip_version + ".")):
        bad.append(("torch.version.hip", f"{t.hip_version}.*", str(hip)))
    want = f"{t.device_name or 'AMD GPU'} {t.gfx_arch}"
    devices = torch.get("devices") or []
    if not devices:
        bad.append(("device", want, torch.get("cuda_error") or "no ROCm device visible"))
    else:
        first = devices[0]
        arch = str(first.get("gcn_arch") or "").split(":", 1)[0]
        if arch != t.gfx_arch or (t.device_name or "").lower() not in \
                str(first.get("name", "")).lower():
            bad.append(("device", want,
                        f"{first.get('name')} ({first.get('gcn_arch') or 'no arch'})"))
    if facts.get("machine") != t.machine:
        bad.append(("machine", t.machine, str(facts.get("machine"))))
    return bad


def fits(target: Target, h: Host) -> tuple[bool, str]:
    t = _rocm(target)
    amd = [g for g in h.gpus if g.vendor == "amd"]
    for gpu in amd:
        if gpu.arch == t.gfx_arch and (t.device_name or "").lower() in gpu.name.lower():
            return True, f"{gpu.name} {gpu.arch}"
    found = ", ".join(f"{g.name} ({g.arch})" for g in amd) or "no AMD GPU (rocminfo, amd-smi)"
    return False, (f"needs {t.device_name or 'an AMD GPU'} {t.gfx_arch}; this host has "
                   f"{found}")


def engine_args(args: dict[str, Any]) -> None:
    return None
