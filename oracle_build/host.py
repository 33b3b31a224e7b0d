"""What this host is, detected once and frozen: machine, memory, GPUs and their compute
capability, driver, toolchain; which pin target fits it; and this tool's own facts.

Every fact comes from one ``Host`` object built on first use (``host()``); nothing below
asks nvidia-smi or reads /proc/meminfo again, except ``available_memory()``, which is a
reading taken when an engine is about to start.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from oracle_build import __version__
from oracle_build.core import proc

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # NVIDIA's "12.1"; "" for an AMD GPU
    driver: str
    arch: str | None = None  # AMD's gfx name ("gfx1100"); None for NVIDIA
    vendor: str = "nvidia"


@dataclass(frozen=True)
class Host:
    machine: str
    system: str
    gpus: tuple[Gpu, ...]
    mem_available_bytes: int | None
    mem_total_bytes: int | None
    cpu_variant: str | None = None
    cpu_flags: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu_flags"] = sorted(self.cpu_flags)
        return out

    @property
    def driver(self) -> str | None:
        return self.gpus[0].driver if self.gpus else None


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append(Gpu(parts[0], parts[1], parts[2]))
    return tuple(gpus)


def parse_rocminfo(text: str, driver: str = "") -> tuple[Gpu, ...]:
    """`rocminfo`: each ``Agent N`` block whose ``Device Type`` is GPU gives its first
    ``Name`` (the gfx arch) and ``Marketing Name``; the ISA block's names are not the
    agent's. The ROCk module line names the driver when ``driver`` is not known."""
    m = re.search(r"ROCk module(?: version (\S+))? is loaded", text)
    driver = driver or (f"amdgpu {m.group(1)}" if m and m.group(1) else "")
    gpus = []
    for block in re.split(r"^\*+\s*\n\s*Agent \d+\s*\n\*+\s*$", text, flags=re.M)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.strip().partition(":")
            if sep and key in ("Name", "Marketing Name", "Device Type") and key not in fields:
                fields[key] = value.strip()
        arch = fields.get("Name", "")
        if fields.get("Device Type") == "GPU" and re.fullmatch(r"gfx[0-9a-f]+", arch):
            gpus.append(Gpu(fields.get("Marketing Name") or arch, "", driver, arch, "amd"))
    return tuple(gpus)


def parse_amd_smi(text: str) -> tuple[Gpu, ...]:
    """`amd-smi static --asic --driver` (text): per ``GPU: N`` block, MARKET_NAME,
    TARGET_GRAPHICS_VERSION and the DRIVER block's VERSION."""
    gpus = []
    for block in re.split(r"^GPU: \d+\s*$", text, flags=re.M)[1:]:
        fields: dict[str, str] = {}
        section = ""
        for line in block.splitlines():
            key, sep, value = line.strip().partition(":")
            if sep and not value.strip():
                section = key
            elif sep:
                fields.setdefault(f"{section}.{key}", value.strip())
        arch = fields.get("ASIC.TARGET_GRAPHICS_VERSION", "")
        if re.fullmatch(r"gfx[0-9a-f]+", arch):
            driver = fields.get("DRIVER.VERSION", "")
            gpus.append(Gpu(fields.get("ASIC.MARKET_NAME") or arch, "",
                            f"amdgpu {driver}".strip(), arch, "amd"))
    return tuple(gpus)


def rocm_tool(name: str, rocm_home: str | None = None) -> str | None:
    """A ROCm tool: on PATH, else under ROCM_HOME / ROCM_PATH / /opt/rocm."""
    found = shutil.which(name)
    if found:
        return found
    for root in (rocm_home, os.environ.get("ROCM_HOME"), os.environ.get("ROCM_PATH"),
                 "/opt/rocm"):
        if root and (Path(root) / "bin" / name).is_file():
            return str(Path(root) / "bin" / name)
    return None


def _amd_gpus() -> tuple[Gpu, ...]:
    """AMD GPUs, from rocminfo (the HSA runtime's view) else amd-smi."""
    exe = rocm_tool("rocminfo")
    if exe:
        out = proc.query([exe], timeout=60)
        if out.ok:
            gpus = parse_rocminfo(out.output, _amdgpu_driver())
            if gpus:
                return gpus
    exe = rocm_tool("amd-smi")
    if exe:
        out = proc.query([exe, "static", "--asic", "--driver"], timeout=60)
        if out.ok:
            return parse_amd_smi(out.output)
    return ()


def _amdgpu_driver(path: Path = Path("/sys/module/amdgpu/version")) -> str:
    try:
        return f"amdgpu {path.read_text().strip()}"
    except OSError:
        return ""


def _nvidia_gpus() -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ()
    out = proc.query([exe, "--query-gpu=name,compute_cap,driver_version",
                      "--format=csv,noheader"], timeout=30)
    return parse_nvidia_smi(out.output) if out.ok else ()


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
    return Host(machine=machine, system=platform.system(), gpus=_nvidia_gpus() + _amd_gpus(),
                mem_available_bytes=info.get("MemAvailable"),
                mem_total_bytes=info.get("MemTotal"),
                cpu_variant=cpu_variant(machine, flags), cpu_flags=flags)


def hip_version(hipcc_output: str) -> str | None:
    """``hipcc --version``'s "HIP version: 7.2.53211-e9d2e3ca67" as "7.2.53211"."""
    m = re.search(r"HIP version:\s*(\d+\.\d+(?:\.\d+)?)", hipcc_output)
    return m.group(1) if m else None


def nvcc_version(cuda_home: str | None) -> str | None:
    exe = shutil.which("nvcc")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        exe = str(Path(cuda_home) / "bin" / "nvcc")
    if not exe:
        return None
    m = re.search(r"release (\d+\.\d+)", proc.query([exe, "--version"]).output)
    return m.group(1) if m else None


def _first_line(argv: list[str]) -> str | None:
    text = proc.query(argv, timeout=30).output.strip()
    return text.splitlines()[0] if text else None


@cache
def facts(cuda_home: str | None = None) -> dict[str, Any]:
    """Host facts for records (build records, goldens)."""
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
        "nvcc": nvcc_version(cuda_home),
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
