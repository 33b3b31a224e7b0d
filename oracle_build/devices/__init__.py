"""One module per device (cpu, cuda, rocm) behind one small interface (base.DeviceModule),
as cibuildwheel keeps one module per platform: the build environment, the preflight, the
wheel check, the identity rules and whether a host fits. Adding a device is one module
here, its target model in contracts/pins.py, and one pin section.

Nothing outside this package branches on a target's device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oracle_build.core.errors import PreflightFailed
from oracle_build.devices import cpu, cuda, rocm
from oracle_build.devices.base import (
    NO_HOLD,
    DeviceModule,
    Hold,
    Mismatch,
    cmake_known,
    wheel_libraries,
)

if TYPE_CHECKING:
    from oracle_build.contracts.pins import Pin, Target
    from oracle_build.host import Host

__all__ = ["NO_HOLD", "DeviceModule", "Hold", "Mismatch", "choose_target", "cmake_known",
           "fits", "held_name", "hold", "known_variants", "missing_instructions", "module",
           "variant_mismatches", "wheel_libraries"]

MODULES: dict[str, DeviceModule] = {"cpu": cpu, "cuda": cuda, "rocm": rocm}


def module(target: Target | str) -> DeviceModule:
    """The device module of a target (or of a device name)."""
    return MODULES[target if isinstance(target, str) else target.device]


def hold(target: Target, asked: str | None = None) -> Hold:
    """The CPU kernel variant this host's runs of ``target`` are held to: ``asked`` (a
    golden's recorded variant, ``--kernel-variant``) or the pin target's (PreflightFailed
    when this host's CPU lacks its instructions)."""
    from oracle_build import host

    h = host.host()
    return module(target).hold(target, asked, h.cpu_flags, h.cpu_variant)


def held_name(target: Target, asked: str | None = None) -> str | None:
    """The name of the variant ``hold`` would hold (no host check): a key for opened oracles."""
    if not module(target).BY_CPU_VARIANT:
        return None
    return cpu.held_variant(target, asked)


def known_variants(target: Target) -> list[str]:
    """The CPU kernel variants ``target``'s engines may be held to ([] on a GPU target)."""
    return cpu.known_variants(target.machine) if module(target).BY_CPU_VARIANT else []


def missing_instructions(target: Target, asked: str | None = None) -> list[str]:
    """The instructions the variant ``asked`` (default: the pin target's) needs that this
    host's CPU lacks; [] when it can run it, or the target holds no CPU variant."""
    from oracle_build import host

    if not module(target).BY_CPU_VARIANT:
        return []
    return cpu.missing_flags(cpu.held_variant(target, asked), host.host().cpu_flags)


def variant_mismatches(target: Target, kernels: dict[str, Any], held: Hold) -> list[Mismatch]:
    """An engine process's kernel facts against the variant it was held to ([] for a device
    whose numbers do not depend on the host CPU)."""
    if not module(target).BY_CPU_VARIANT:
        return []
    return cpu.variant_mismatches(held, kernels)


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
