"""An NVIDIA GPU target (GB10 = sm_121, Thor = sm_110; CUDA 13): nvcc under CUDA_HOME and a
driver that answers before a build; TORCH_CUDA_ARCH_LIST from the target; the sm_XX set of
the built libraries (cuobjdump) exactly within the target's expected_sm, at build and at
every identity check; the first visible GPU by name and compute capability; this host's
NVIDIA GPUs (nvidia-smi)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from os import environ
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from oracle_build.contracts.targets import CudaTarget
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.devices.base import (
    Build,
    Device,
    Gpu,
    Hold,
    Host,
    Mismatch,
    first_gpu,
    torch_facts,
)

if TYPE_CHECKING:
    from oracle_build.contracts.targets import Target


def _cuda(target: Target) -> CudaTarget:
    assert isinstance(target, CudaTarget), target
    return target


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append(Gpu(parts[0], parts[1], parts[2]))
    return tuple(gpus)


def nvcc_version(cuda_home: str | None) -> str | None:
    """The CUDA release of nvcc (under ``cuda_home`` when it has one, else on PATH)."""
    exe = shutil.which("nvcc")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        exe = str(Path(cuda_home) / "bin" / "nvcc")
    if not exe:
        return None
    m = re.search(r"release (\d+\.\d+)", proc.query([exe, "--version"]).output)
    return m.group(1) if m else None


def cuobjdump_sm(paths: list[str], cuobjdump: str | None = None) -> list[str]:
    """The sm_XX ELF code inside the given libraries, via ``cuobjdump --list-elf``."""
    exe = cuobjdump or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    found: set[str] = set()
    for path in paths:
        listing = proc.query([exe, "--list-elf", path], timeout=300)
        if not listing.ok and "does not contain device code" not in listing.output:
            raise BuildFailed(f"{exe} --list-elf {path} failed (exit {listing.returncode})",
                              details=listing.output.strip().splitlines()[-3:])
        found.update(re.findall(r"\.(sm_\d+[af]?)\.", listing.output))
    return sorted(found)


def configure_arches(log_text: str) -> dict[str, str]:
    """The architecture lines vLLM's CMake configure printed."""
    out = {}
    for line in log_text.splitlines():
        for key in ("CUDA supported target architectures", "CUDA target architectures"):
            if key + ":" in line:
                out[key] = line.split(key + ":", 1)[1].strip()
    return out


class Cuda(Device):
    NAME = "cuda"
    PROBE_DEVICE = "cuda"
    GPU = True
    BUILD_MEMORY_FLOOR_GIB = 16.0
    BUILD_DISK_GIB = 60.0
    CMAKE_FOUND = ("CUDA_FOUND",)
    VERSION_HINTS: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = (
        (re.compile(r"\+.*\.cu\d+"), "nvcc's CUDA differs from VLLM_MAIN_CUDA_VERSION at this "
         "commit; if this is the intended toolkit, set the pin's distribution_version to it "
         "after review"),
    )
    PREFLIGHT_ABOUT = "nvcc and driver"
    LAUNCHER_LANGS = ("C", "CXX", "CUDA")
    # no PATH_MAP_VARS: nvcc's map (and what else keeps its objects free of folders and
    # process ids) is added by oracle-build's nvcc launcher, the CMAKE_CUDA_COMPILER
    # (recipe/cuda/launcher.py), out of ccache's sight
    BUILD_FLAG_VARS = ("VLLM_TARGET_DEVICE", "TORCH_CUDA_ARCH_LIST", "NVCC_THREADS", "CUDA_HOME")
    BUILD_TOOLKIT = True
    DEVICE_CHECKS = ("nvidia-smi (the driver)", "the GPU's name and compute capability",
                     "the kernel check on the GPU (rms_norm)")

    def toolkit_home(self, build_env: Mapping[str, str]) -> str | None:
        return build_env.get("CUDA_HOME")

    def build_env(self, target: Target, env: dict[str, str]) -> None:
        env["TORCH_CUDA_ARCH_LIST"] = _cuda(target).torch_cuda_arch_list

    def toolchain_parts(self, preflight: dict[str, Any]) -> list[str]:
        toolkit = preflight.get("toolkit")
        if isinstance(toolkit, dict) and isinstance(toolkit.get("key"), str):
            return [toolkit["key"]]  # nvcc by its version and every tool by its sha256
        value = preflight.get("nvcc")
        return [f"nvcc: {value}"] if isinstance(value, str) and value else []

    def preflight(self, plan: Build, facts: dict[str, Any], h: Host) -> None:
        """A toolkit from a lock is unpacked by the build's toolkit step (nothing to find
        yet); the host's must be under CUDA_HOME. The driver must answer, unless the build
        was asked for without a GPU (``--no-gpu``: never implied)."""
        if not _cuda(plan.target).toolkit:
            cuda_home = plan.build_env.get("CUDA_HOME") or environ.get("CUDA_HOME")
            if not cuda_home or not (Path(cuda_home) / "bin" / "nvcc").exists():
                raise PreflightFailed(f"no nvcc under CUDA_HOME={cuda_home}",
                                      hint="install the CUDA 13 toolkit, fix "
                                      "[build.env].CUDA_HOME, or name a toolkit lock in the "
                                      "target (toolkit = \"toolkits/cuda-13.0.3.toml\")")
            facts["nvcc"] = nvcc_version(cuda_home)
        facts["driver"] = h.driver
        if plan.no_gpu:
            facts["device_checks"] = "skipped (--no-gpu)"
            return
        if not h.gpus:
            raise PreflightFailed("no NVIDIA driver answers (nvidia-smi)",
                                  hint="on a host without the GPU, compile only: "
                                  "build_oracle -- --target <name> --no-gpu (the device checks "
                                  "then run at the first identity check on the gate host)")

    def wheel_check_about(self, target: Target) -> str:
        return ("; the sm_XX set in the configure log and in the built libraries "
                "(cuobjdump --list-elf) is the target's")

    def check_wheel(self, plan: Build, libraries: list[Path],
                    root: Path) -> dict[str, Any] | None:
        target = _cuda(plan.target)
        cfg = configure_arches(plan.log.read_text(errors="replace"))
        sms, mismatches = self.compiled(target, [str(p) for p in libraries],
                                        toolkit=plan.build_env.get("CUDA_HOME"))
        allowed = set(target.expected_sm)
        if mismatches:
            raise BuildFailed(
                f"the wheel's libraries hold {', '.join(sms or []) or 'no sm_XX code'}; target "
                f"{plan.target_name} expects only {', '.join(sorted(allowed))} "
                f"(configure log: {cfg or 'no architecture lines'})",
                hint="check TORCH_CUDA_ARCH_LIST; some vLLM versions skip sm_12x kernels for "
                "'12.1a'")
        return {"configure_log": cfg, "cuobjdump": sms}

    def compiled(self, target: Target, libraries: list[str], *, toolkit: str | None = None,
                 cuobjdump: str | None = None) -> tuple[list[str] | None, list[Mismatch]]:
        """The sm_XX set of ``libraries`` (a built wheel's, an oracle's, or objects: one
        check for all), and a mismatch when it is empty or holds what the target does not
        expect. cuobjdump: the one named, else the build's toolkit's, else PATH's."""
        if cuobjdump is None and toolkit is not None:
            cuobjdump = str(Path(toolkit) / "bin" / "cuobjdump")
        sms = cuobjdump_sm(libraries, cuobjdump)
        allowed = set(_cuda(target).expected_sm)
        if not sms or not set(sms) <= allowed:
            return sms, [("compiled sm", ", ".join(sorted(allowed)), ", ".join(sms) or "none")]
        return sms, []

    def device_mismatches(self, target: Target, facts: dict[str, Any],
                          held: Hold) -> list[Mismatch]:
        t = _cuda(target)
        want = f"{t.device_name} sm_{t.compute_capability.replace('.', '')}"
        first = first_gpu(facts)
        if first is None:
            return [("device", want, torch_facts(facts).get("cuda_error")
                     or "no CUDA device visible")]
        if first.get("capability") != t.compute_capability or \
                t.device_name.lower() not in str(first.get("name", "")).lower():
            return [("device", want, f"{first.get('name')} ({first.get('capability')})")]
        return []

    def fits(self, target: Target, h: Host) -> tuple[bool, str]:
        t = _cuda(target)
        nvidia = [g for g in h.gpus if g.vendor == "nvidia"]
        for gpu in nvidia:
            if gpu.compute_capability == t.compute_capability and \
                    t.device_name.lower() in gpu.name.lower():
                return True, f"{gpu.name} sm_{gpu.compute_capability.replace('.', '')}"
        found = ", ".join(f"{g.name} ({g.compute_capability})" for g in nvidia) or \
            "no NVIDIA GPU"
        return False, (f"needs {t.device_name} with compute capability "
                       f"{t.compute_capability}; this host has {found}")

    def detect(self) -> tuple[Gpu, ...]:
        exe = shutil.which("nvidia-smi")
        if not exe:
            return ()
        out = proc.query([exe, "--query-gpu=name,compute_cap,driver_version",
                          "--format=csv,noheader"], timeout=30)
        return parse_nvidia_smi(out.output) if out.ok else ()

    def host_facts(self, build_env: dict[str, str] | None) -> dict[str, Any]:
        return {"nvcc": nvcc_version((build_env or {}).get("CUDA_HOME"))}

    def gpu_label(self, gpu: dict[str, Any]) -> str:
        return f"{gpu.get('name')} sm_{str(gpu.get('capability', '')).replace('.', '')}"


DEVICE = Cuda()
