"""What every device answers (``Device``, with the defaults of a device that needs nothing),
and what the device modules share."""

from __future__ import annotations

import re
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from oracle_build.core.errors import PreflightFailed

if TYPE_CHECKING:
    from oracle_build.contracts.targets import Target

Mismatch = tuple[str, str, str]


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # NVIDIA's "12.1"; "" for an AMD GPU
    driver: str
    arch: str | None = None  # AMD's gfx name ("gfx1100"); None for NVIDIA
    vendor: str = "nvidia"


@dataclass(frozen=True)
class Host:
    """A host as the devices see it (host.py detects this one, once: it asks each device
    for its GPUs)."""

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


class Build(Protocol):
    """What a device reads of a build it checks (the recipe's plan is one): a device
    describes, the recipe plans with it, so a device never imports the recipe."""

    @property
    def target(self) -> Target: ...

    @property
    def target_name(self) -> str: ...

    @property
    def build_env(self) -> Mapping[str, str]: ...

    @property
    def log(self) -> Path: ...

    @property
    def from_source(self) -> bool: ...

    @property
    def no_gpu(self) -> bool: ...


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
    # the -march the engine's run-time compiler is given (torch inductor's
    # TORCHINDUCTOR_CPP_MARCH) under this variant: its instruction set, not the host's
    # (``-march=native``); None: inductor's own default
    march: str | None = None


NO_HOLD = Hold(requested=None, variant=None)


class Device:
    """What every device answers, with the defaults of a device that needs nothing (no
    toolchain to check, no compiled-arch set, no kernel variant to hold, no GPU to find).
    Each device module subclasses it, overrides what is its own, and exposes one instance
    as ``DEVICE``; ``devices.MODULES`` lists them. Nothing outside the devices package
    branches on a device: it asks the target's ``Device``."""

    NAME: ClassVar[str]
    # the torch device the identity probe runs its kernel on (ROCm's torch runs HIP through
    # the torch.cuda API: its probe device is "cuda" too)
    PROBE_DEVICE: ClassVar[str]
    GPU: ClassVar[bool] = False
    BUILD_MEMORY_FLOOR_GIB: ClassVar[float] = 2.0
    BUILD_DISK_GIB: ClassVar[float] = 8.0
    # whether the oracle's numbers depend on the host CPU's kernel variant (vLLM's CPU build
    # loads AVX2 or AVX-512 kernels by the CPU): goldens and battery sets are keyed by it
    BY_CPU_VARIANT: ClassVar[bool] = False
    # the CMake "found" variables vLLM's configure sets TRUE for this device (every other
    # device's are FALSE): the checkout's externals scan evaluates its if() branches by them
    CMAKE_FOUND: ClassVar[tuple[str, ...]] = ()
    # what a built version's local segment says about this device's build (setup.py's
    # suffixes), beside the hints every build shares (recipe/steps.py)
    VERSION_HINTS: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = ()
    # the toolchain and driver the plan's preflight step checks, as the plan says it
    PREFLIGHT_ABOUT: ClassVar[str] = ""
    # the CMake languages whose compiler a source build runs through the compiler cache
    # (CMAKE_<LANG>_COMPILER_LAUNCHER): nvcc and hipcc too, on their devices
    LAUNCHER_LANGS: ClassVar[tuple[str, ...]] = ("C", "CXX")
    # the flag variables (beside CFLAGS and CXXFLAGS) through which a source build gives this
    # device's compiler the staging folder's path map, and the form it takes ({flag})
    PATH_MAP_VARS: ClassVar[tuple[tuple[str, str], ...]] = ()
    # whether a source build of this device compiles with a toolkit the recipe prepares
    # (recipe/cuda/toolkit.py: a lock's wheels or the host's, and the compiler's launcher)
    BUILD_TOOLKIT: ClassVar[bool] = False
    # the checks only the device itself can answer, in words: what --no-gpu does not run
    DEVICE_CHECKS: ClassVar[tuple[str, ...]] = ()
    # the build variables of this device the compile's command lines depend on (recorded
    # with the toolchain)
    BUILD_FLAG_VARS: ClassVar[tuple[str, ...]] = ("VLLM_TARGET_DEVICE",)

    def build_env(self, target: Target, env: dict[str, str]) -> None:
        """Add to the wheel build's environment (the pin's and the target's build_env
        already in it) what the target's own fields imply."""

    def toolkit_home(self, build_env: Mapping[str, str]) -> str | None:
        """Where the host's toolkit is, by the build's environment (BUILD_TOOLKIT devices)."""
        return None

    def preflight(self, plan: Build, facts: dict[str, Any], h: Host) -> None:
        """Refuse a build this host cannot do (PreflightFailed); record what was checked."""

    def wheel_check_about(self, target: Target) -> str:
        """What check-wheel checks beyond the version ('' when nothing)."""
        return ""

    def toolchain_parts(self, preflight: dict[str, Any]) -> list[str]:
        """The device compiler a source build's compiled bytes depend on, as the toolchain
        key names it ("nvcc: 13.0.88"), from what this device's preflight recorded."""
        return []

    def check_wheel(self, plan: Build, libraries: list[Path],
                    root: Path) -> dict[str, Any] | None:
        """The built wheel's compiled code against the target (BuildFailed); its facts."""
        return None

    def compiled(self, target: Target, libraries: list[str], *,
                 toolkit: str | None = None) -> tuple[list[str] | None, list[Mismatch]]:
        """The compiled arch set of the loaded extensions (None: a device without one), and
        what is not the target's. ``toolkit``: the folder of the toolkit the build prepared
        (its bin/ holds the tools the check runs), when it prepared one."""
        return None, []

    def device_mismatches(self, target: Target, facts: dict[str, Any],
                          held: Hold) -> list[Mismatch]:
        """The probe's device facts (machine, GPU, kernel variant) against the target and
        the kernel variant the run is held to."""
        if facts.get("machine") != target.machine:
            return [("machine", target.machine, str(facts.get("machine")))]
        return []

    def hold(self, target: Target, asked: str | None, flags: frozenset[str],
             host_variant: str | None) -> Hold:
        """The kernel variant this run's processes are held to (NO_HOLD: a device whose
        numbers do not depend on the host CPU); PreflightFailed when the host cannot."""
        if asked not in (None, "native"):
            raise PreflightFailed(f"CPU kernel variant {asked}: a {target.device} target runs "
                                  "no CPU kernel variant",
                                  hint="--kernel-variant is for CPU targets")
        return NO_HOLD

    def held_name(self, target: Target, asked: str | None) -> str | None:
        """The name of the variant ``hold`` would hold, without asking the host (None: a
        device whose numbers do not depend on the host CPU)."""
        return None

    def known_variants(self, target: Target) -> list[str]:
        """The CPU kernel variants this target's engines may be held to."""
        return []

    def missing_instructions(self, target: Target, asked: str | None,
                             flags: frozenset[str]) -> list[str]:
        """The instructions the variant ``asked`` needs that a CPU with ``flags`` lacks."""
        return []

    def variant_mismatches(self, held: Hold, kernels: dict[str, Any]) -> list[Mismatch]:
        """An engine process's kernel facts against the variant it was held to."""
        return []

    def fits(self, target: Target, h: Host) -> tuple[bool, str]:
        """Whether the host's hardware is this target's (machine already checked)."""
        return True, self.NAME

    def engine_args(self, args: dict[str, Any]) -> None:
        """Refuse engine arguments this device cannot run safely (PreflightFailed)."""

    def detect(self) -> tuple[Gpu, ...]:
        """This host's GPUs of this device, asked of its own tools (``host.host()`` asks
        each device once per process)."""
        return ()

    def host_facts(self, build_env: dict[str, str] | None) -> dict[str, Any]:
        """The toolchain facts a record keeps for this device (``host.facts``)."""
        return {}

    def label(self, facts: dict[str, Any]) -> str:
        """How an identity names the probed device: its first GPU, or the machine."""
        gpu = first_gpu(facts)
        return self.gpu_label(gpu) if gpu is not None else \
            f"{self.NAME} {facts.get('machine', '')}".strip()

    def gpu_label(self, gpu: dict[str, Any]) -> str:
        """A GPU the probe saw, as an identity names it."""
        return str(gpu.get("name"))


def torch_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """What the identity probe found of torch (its version, devices, HIP, CUDA error)."""
    torch: dict[str, Any] = (facts.get("modules") or {}).get("torch") or {}
    return torch


def first_gpu(facts: dict[str, Any]) -> dict[str, Any] | None:
    """The first device torch saw in the probe, or None."""
    devices = torch_facts(facts).get("devices") or []
    return devices[0] if devices else None


@contextmanager
def wheel_libraries(wheel: Path) -> Iterator[tuple[Path, list[Path]]]:
    """The wheel's shared libraries extracted into a temporary folder: (folder, paths)."""
    with tempfile.TemporaryDirectory(prefix="wheel-so-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(".so")]
            for n in names:
                zf.extract(n, tmp)
        yield Path(tmp), [Path(tmp) / n for n in names]
