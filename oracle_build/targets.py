"""What this host is (cpu, or a GPU's compute capability and name) and which pin target fits it."""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oracle_build.errors import PreflightFailed
from oracle_build.pins import Pin, Target


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    driver: str


@dataclass(frozen=True)
class Host:
    machine: str
    system: str
    gpus: tuple[Gpu, ...]
    mem_available_bytes: int | None
    mem_total_bytes: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nvidia_smi() -> tuple[Gpu, ...]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append(Gpu(parts[0], parts[1], parts[2]))
    return tuple(gpus)


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


def detect_host() -> Host:
    info = meminfo()
    return Host(
        machine=platform.machine(),
        system=platform.system(),
        gpus=_nvidia_smi(),
        mem_available_bytes=info.get("MemAvailable"),
        mem_total_bytes=info.get("MemTotal"),
    )


def fits(target: Target, host: Host) -> tuple[bool, str]:
    """Whether ``target`` can run on ``host``, and why not."""
    if target.machine != host.machine:
        return False, f"needs an {target.machine} host, this one is {host.machine}"
    if target.device == "cpu":
        return True, "cpu"
    for gpu in host.gpus:
        if gpu.compute_capability == target.compute_capability and (
            (target.device_name or "").lower() in gpu.name.lower()
        ):
            return True, f"{gpu.name} sm_{gpu.compute_capability.replace('.', '')}"
    found = ", ".join(f"{g.name} ({g.compute_capability})" for g in host.gpus) or "no NVIDIA GPU"
    return False, (
        f"needs {target.device_name} with compute capability {target.compute_capability}; "
        f"this host has {found}"
    )


def choose_target(pin: Pin, host: Host, requested: str | None = None) -> str:
    """The pin's target for this host; refuses, naming the pin's targets, when none fits."""
    if requested is not None:
        ok, why = fits(pin.target(requested), host)
        if not ok:
            raise PreflightFailed(
                f"target {requested!r} of pin {pin.id} does not fit this host: {why}",
                hint="--dry-run plans any target on any host; building needs the hardware",
            )
        return requested
    reasons = []
    gpu_first = sorted(pin.model.targets.items(), key=lambda kv: kv[1].device == "cpu")
    for name, target in gpu_first:
        ok, why = fits(target, host)
        if ok:
            return name
        reasons.append(f"{name}: {why}")
    raise PreflightFailed(
        f"pin {pin.id} ({pin.path}) has no target for this host "
        f"({host.machine}, {', '.join(g.name for g in host.gpus) or 'no GPU'}); "
        f"its targets: " + "; ".join(reasons),
        hint="pick a pin with a target for this host (pins/cpu.toml runs on any x86_64 box)",
    )
