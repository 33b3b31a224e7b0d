"""One module per device (cpu, cuda, rocm) behind one small interface (base.DeviceModule),
as cibuildwheel keeps one module per platform: the build environment, the preflight, the
wheel check, the identity rules and whether a host fits. Adding a device is one module
here, its target model in contracts/pins.py, and one pin section.

Nothing outside this package branches on a target's device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from oracle_build.core.errors import PreflightFailed
from oracle_build.devices import cpu, cuda, rocm
from oracle_build.devices.base import DeviceModule, Mismatch, cmake_known, wheel_libraries

if TYPE_CHECKING:
    from oracle_build.contracts.pins import Pin, Target
    from oracle_build.host import Host

__all__ = ["DeviceModule", "Mismatch", "choose_target", "cmake_known", "fits", "module",
           "wheel_libraries"]

MODULES: dict[str, DeviceModule] = {"cpu": cpu, "cuda": cuda, "rocm": rocm}


def module(target: Target | str) -> DeviceModule:
    """The device module of a target (or of a device name)."""
    return MODULES[target if isinstance(target, str) else target.device]


def fits(target: Target, h: Host) -> tuple[bool, str]:
    """Whether ``target`` can run on host ``h``, and why not."""
    if target.machine != h.machine:
        return False, f"needs an {target.machine} host, this one is {h.machine}"
    return module(target).fits(target, h)


def choose_target(pin: Pin, h: Host, requested: str | None = None) -> str:
    """The pin's target for this host; refuses, naming the pin's targets, when none fits.
    A GPU target that fits comes before a CPU one."""
    if requested is not None:
        ok, why = fits(pin.target(requested), h)
        if not ok:
            raise PreflightFailed(
                f"target {requested!r} of pin {pin.id} does not fit this host: {why}",
                hint="--dry-run plans any target on any host; building needs the hardware",
            )
        return requested
    reasons = []
    gpu_first = sorted(pin.model.targets.items(), key=lambda kv: not module(kv[1]).GPU)
    for name, target in gpu_first:
        ok, why = fits(target, h)
        if ok:
            return name
        reasons.append(f"{name}: {why}")
    raise PreflightFailed(
        f"pin {pin.id} ({pin.path}) has no target for this host "
        f"({h.machine}, {', '.join(g.name for g in h.gpus) or 'no GPU'}); "
        f"its targets: " + "; ".join(reasons),
        hint="pick a pin with a target for this host (pins/cpu.toml runs on any x86_64 box)",
    )
