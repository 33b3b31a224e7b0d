"""The interface every device module provides, and what the modules share."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from oracle_build.build.plan import Plan
    from oracle_build.contracts.pins import Target
    from oracle_build.host import Host

Mismatch = tuple[str, str, str]


@dataclass(frozen=True)
class Hold:
    """The CPU kernel variant a run's processes are held to. ``requested``: as asked (a
    variant, or "native"); ``variant``: the one that must be in force (the host's own under
    native); ``env``: what the tool sets for it; ``inside``: the hold the inside scripts
    apply before vLLM imports its kernels (JSON; None: nothing to apply)."""

    requested: str | None
    variant: str | None
    env: dict[str, str] = field(default_factory=dict)
    inside: str | None = None
    library: str | None = None
    torch_capability: str | None = None


NO_HOLD = Hold(requested=None, variant=None)


def no_hold(target: Target, asked: str | None, flags: frozenset[str],
            host_variant: str | None) -> Hold:
    """``hold`` for a device whose numbers do not depend on the host CPU's kernel variant."""
    if asked not in (None, "native"):
        from oracle_build.core.errors import PreflightFailed

        raise PreflightFailed(f"CPU kernel variant {asked}: a {target.device} target runs no "
                              "CPU kernel variant", hint="--kernel-variant is for CPU targets")
    return NO_HOLD


class DeviceModule(Protocol):
    """What each device module provides (module-level names)."""

    NAME: str
    # the torch device the identity probe runs its kernel on (ROCm's torch runs HIP through
    # the torch.cuda API: its probe device is "cuda" too)
    PROBE_DEVICE: str
    GPU: bool
    BUILD_MEMORY_FLOOR_GIB: float
    BUILD_DISK_GIB: float
    # whether the oracle's numbers depend on the host CPU's kernel variant (vLLM's CPU build
    # loads AVX2 or AVX-512 kernels by the CPU): goldens and battery sets are keyed by it
    BY_CPU_VARIANT: bool

    def build_env(self, target: Target, env: dict[str, str]) -> None:
        """Add to the wheel build's environment (the pin's and the target's build_env
        already in it) what the target's own fields imply."""

    def preflight(self, plan: Plan, facts: dict[str, Any]) -> None:
        """Refuse a build this host cannot do (PreflightFailed); record what was checked."""

    def wheel_check_about(self, target: Target) -> str:
        """What check-wheel checks beyond the version ('' when nothing)."""

    def check_wheel(self, plan: Plan, libraries: list[Path], root: Path) -> dict[str, Any] | None:
        """The built wheel's compiled code against the target (BuildFailed); its facts."""

    def compiled(self, target: Target,
                 libraries: list[str]) -> tuple[list[str] | None, list[Mismatch]]:
        """The compiled arch set of the loaded extensions (None: a device without one), and
        what is not the target's."""

    def device_mismatches(self, target: Target, facts: dict[str, Any],
                          held: Hold) -> list[Mismatch]:
        """The probe's device facts (machine, GPU, kernel variant) against the target and
        the kernel variant the run is held to."""

    def hold(self, target: Target, asked: str | None, flags: frozenset[str],
             host_variant: str | None) -> Hold:
        """The kernel variant this run's processes are held to (NO_HOLD: a device whose
        numbers do not depend on the host CPU); PreflightFailed when the host cannot."""

    def fits(self, target: Target, h: Host) -> tuple[bool, str]:
        """Whether the host's hardware is this target's (machine already checked)."""

    def engine_args(self, args: dict[str, Any]) -> None:
        """Refuse engine arguments this device cannot run safely (PreflightFailed)."""



def cmake_known(device: str, machine: str) -> dict[str, str | None]:
    """The CMake variables a configure of vLLM for ``device`` on ``machine`` sets, as the
    checkout's externals scan reads its if() branches."""
    return {
        "VLLM_TARGET_DEVICE": device,
        "CMAKE_SYSTEM_PROCESSOR": machine,
        "CUDA_FOUND": "TRUE" if device == "cuda" else "FALSE",
        "HIP_FOUND": "TRUE" if device == "rocm" else "FALSE",
        "PYTORCH_FOUND_HIP": "TRUE" if device == "rocm" else "FALSE",
        "ASIMD_FOUND": "TRUE" if machine == "aarch64" else "FALSE",
        "APPLE_SILICON_FOUND": "FALSE",
        "POWER9_FOUND": "FALSE", "POWER10_FOUND": "FALSE", "POWER11_FOUND": "FALSE",
        "S390_FOUND": "FALSE", "RVV_FP16_FOUND": "FALSE", "RVV_BF16_FOUND": "FALSE",
    }


@contextmanager
def wheel_libraries(wheel: Path) -> Iterator[tuple[Path, list[Path]]]:
    """The wheel's shared libraries extracted into a temporary folder: (folder, paths)."""
    with tempfile.TemporaryDirectory(prefix="wheel-so-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(".so")]
            for n in names:
                zf.extract(n, tmp)
        yield Path(tmp), [Path(tmp) / n for n in names]
