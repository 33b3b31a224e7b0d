"""One module per device (cpu, cuda, rocm), each one ``base.Device`` subclass with the
base's defaults, as cibuildwheel keeps one module per platform: the build environment, the
preflight and its hints, the wheel check, the compiled-arch sets, CMake's view of the
device, the identity rules and labels, this host's GPUs and toolchain, and whether a host
fits. Adding a device is one module here, its entry in ``MODULES``, its target model in
contracts/pins.py, and one pin section.

The device names come from ``MODULES``; nothing outside this package branches on a
target's device or names one (tests/test_records.py's guard reads every module for it)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from oracle_build.core.errors import PreflightFailed
from oracle_build.devices import cpu, cuda, rocm
from oracle_build.devices.base import (
    NO_HOLD,
    Build,
    Device,
    Gpu,
    Hold,
    Host,
    Mismatch,
    wheel_libraries,
)

if TYPE_CHECKING:
    from oracle_build.contracts.pins import Pin
    from oracle_build.contracts.targets import Target

__all__ = ["MODULES", "NO_HOLD", "Build", "Device", "Gpu", "Hold", "Host", "Mismatch",
           "choose_target", "cmake_known", "default_gpu", "detect_gpus", "fits", "gpu_first",
           "held_name", "host_facts", "known_variants", "module", "names",
           "variant_mismatches", "version_hints", "wheel_libraries"]

MODULES: dict[str, Device] = {d.NAME: d for d in (cpu.DEVICE, cuda.DEVICE, rocm.DEVICE)}


def module(target: Target | str) -> Device:
    """The device of a target (or of a device name)."""
    return MODULES[target if isinstance(target, str) else target.device]


def names() -> list[str]:
    """Every device's name."""
    return list(MODULES)


def default_gpu() -> str:
    """The device a command that reads a GPU build's sources assumes when none is named
    (``externals --device``)."""
    return next(name for name, d in MODULES.items() if d.GPU)


def gpu_first(target: Target) -> int:
    """A target's rank where several fit a host: a GPU target (0) before a CPU one (1)."""
    return 0 if module(target).GPU else 1


def detect_gpus() -> tuple[Gpu, ...]:
    """This host's GPUs, each device asking its own tools (nvidia-smi, rocminfo...)."""
    return tuple(gpu for d in MODULES.values() for gpu in d.detect())


def host_facts(build_env: dict[str, str] | None) -> dict[str, Any]:
    """The toolchain facts every device records for a host (nvcc's release...)."""
    out: dict[str, Any] = {}
    for d in MODULES.values():
        out.update(d.host_facts(build_env))
    return out


def version_hints() -> list[tuple[re.Pattern[str], str]]:
    """What a built version's local segment says, per device (setup.py's suffixes)."""
    return [hint for d in MODULES.values() for hint in d.VERSION_HINTS]


def cmake_known(device: str, machine: str) -> dict[str, str | None]:
    """The CMake variables a configure of vLLM for ``device`` on ``machine`` sets, as the
    checkout's externals scan reads its if() branches: the device's own "found" variables
    TRUE, every other device's FALSE."""
    own = module(device).CMAKE_FOUND
    found = {v: "TRUE" if v in own else "FALSE" for d in MODULES.values() for v in d.CMAKE_FOUND}
    return {
        "VLLM_TARGET_DEVICE": device,
        "CMAKE_SYSTEM_PROCESSOR": machine,
        **found,
        "ASIMD_FOUND": "TRUE" if machine == "aarch64" else "FALSE",
        "APPLE_SILICON_FOUND": "FALSE",
        "POWER9_FOUND": "FALSE", "POWER10_FOUND": "FALSE", "POWER11_FOUND": "FALSE",
        "S390_FOUND": "FALSE", "RVV_FP16_FOUND": "FALSE", "RVV_BF16_FOUND": "FALSE",
    }


def held_name(target: Target, asked: str | None = None) -> str | None:
    """The name of the variant ``hold`` would hold (no host check): a key for opened oracles."""
    return module(target).held_name(target, asked)


def known_variants(target: Target) -> list[str]:
    """The CPU kernel variants ``target``'s engines may be held to ([] on a GPU target)."""
    return module(target).known_variants(target)


def variant_mismatches(target: Target, kernels: dict[str, Any], held: Hold) -> list[Mismatch]:
    """An engine process's kernel facts against the variant it was held to ([] for a device
    whose numbers do not depend on the host CPU)."""
    return module(target).variant_mismatches(held, kernels)


def fits(target: Target, h: Host, *, no_gpu: bool = False) -> tuple[bool, str]:
    """Whether ``target`` can run on host ``h``, and why not. ``no_gpu``: built here, run
    on its GPU elsewhere: only the machine must be the target's (no cross-compiling)."""
    if target.machine != h.machine:
        return False, f"needs an {target.machine} host, this one is {h.machine}"
    if no_gpu:
        return True, "built without its GPU (--no-gpu)"
    return module(target).fits(target, h)


def choose_target(pin: Pin, h: Host, requested: str | None = None, *,
                  no_gpu: bool = False) -> str:
    """The pin's target for this host; refuses, naming the pin's targets, when none fits.
    A GPU target that fits comes before a CPU one. ``no_gpu`` needs the target named."""
    if no_gpu and requested is None:
        raise PreflightFailed("--no-gpu builds the target it is given: name it (--target)")
    if requested is not None:
        ok, why = fits(pin.target(requested), h, no_gpu=no_gpu)
        if not ok:
            raise PreflightFailed(
                f"target {requested!r} of pin {pin.id} does not fit this host: {why}",
                hint="--dry-run plans any target on any host; building needs the hardware"
                + ("" if no_gpu or not module(pin.target(requested)).GPU else
                   "; a GPU target compiles without its GPU with --no-gpu"),
            )
        return requested
    reasons = []
    for name, target in sorted(pin.model.targets.items(), key=lambda kv: gpu_first(kv[1])):
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
