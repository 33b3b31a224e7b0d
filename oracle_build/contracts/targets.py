"""A pin's targets: what every target has (TargetBase) and each device's own fields (CPU,
CUDA, ROCm), the device names a pin may give, and the torch a target may name. What each
device does with them is oracle_build/devices/; the pin that holds them is pins.py."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from oracle_build.contracts.base import ExactVersion, Strict, check_env, relative_file
from oracle_build.contracts.engine_keys import engine_problems


class Torch(Strict):
    version: ExactVersion
    index: str
    note: str | None = None


GFX = re.compile(r"^gfx[0-9a-f]{3,4}$")
# What a schema-1 target held when it was one flat model: the content hash is taken over this
# form (hashed_form), so a pin keeps its hash, its oracle's key and its goldens' pin_hash
# whatever device model its target is read into now
FLAT_TARGET_DEFAULTS: dict[str, Any] = {
    "description": None, "compute_capability": None, "device_name": None,
    "torch_cuda_arch_list": None, "expected_sm": [], "kernel_check": "rms_norm",
    "memory_floor_gib": 2.0, "env": {}, "build_env": {}, "engine_defaults": {}}


class TargetBase(Strict):
    """What every target has; each device adds its own fields (CpuTarget, CudaTarget,
    RocmTarget), and oracle_build/devices/ holds what each device does with them."""

    machine: Literal["x86_64", "aarch64"]
    description: str | None = None
    device_name: str | None = None
    kernel_check: Literal["rms_norm", "extension"] = "rms_norm"
    memory_floor_gib: float = Field(default=2.0, ge=0, le=4096)
    env: dict[str, str] = Field(default_factory=dict)
    build_env: dict[str, str] = Field(default_factory=dict)
    engine_defaults: dict[str, Any] = Field(default_factory=dict)
    # The suffix setup.py appends to this target's wheel version (".rocm723": ROCm 7.2.3 as
    # librocm-core reports it); the wheel check accepts exactly that.
    dist_version_suffix: str | None = Field(default=None, pattern=r"^[a-z]+[0-9]+$")
    # This target's torch when it is not the pin's (a ROCm build of the same version)
    torch: Torch | None = None

    _env = field_validator("env", "build_env")(lambda v: check_env(v))

    @field_validator("engine_defaults")
    @classmethod
    def _engine_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for field, problem in engine_problems(value, "engine_defaults")[:1]:
            raise ValueError(f"{field}: {problem}")
        return value


# The CPU kernel variants a CPU target may hold its engines to (oracle_build/devices/cpu.py
# says what each is; a test keeps the two lists equal). "native": the host's own.
KernelVariant = Literal["native", "x86_64-avx2", "x86_64-avx512", "x86_64-avx512_bf16",
                        "x86_64-avx512_bf16-amx", "aarch64"]


class CpuTarget(TargetBase):
    device: Literal["cpu"]
    # The kernel variant every engine of this target runs under, on any host whose CPU has
    # its instructions, so one golden holds on every CPU model. How the oracle runs, not what
    # is built: outside the pin's hash (goldens record it as configuration).
    kernel_variant: KernelVariant = "native"

    @model_validator(mode="after")
    def _variant_machine(self) -> CpuTarget:
        v = self.kernel_variant
        if v != "native" and not (v == self.machine or v.startswith(self.machine + "-")):
            raise ValueError(f"kernel_variant {v!r} is not a variant of an {self.machine} "
                             "CPU")
        return self


def _shaped(pattern: str, example: str) -> AfterValidator:
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} must look like {example!r}")
        return value
    return AfterValidator(check)


def _gfx(value: str) -> str:
    if not GFX.match(value):
        raise ValueError(f"{value!r} is not an AMD GPU arch like 'gfx1100'")
    return value


GfxArch = Annotated[str, AfterValidator(_gfx)]
SmCode = Annotated[str, _shaped(r"sm_\d+[af]?", "sm_121")]


class CudaTarget(TargetBase):
    """An NVIDIA GPU: its name and compute capability as torch reports them, the arch list
    the build compiles, and the sm_XX set the built libraries must hold (nothing else)."""

    device: Literal["cuda"]
    compute_capability: Annotated[str, _shaped(r"\d+\.\d+", "12.1")]
    device_name: str
    torch_cuda_arch_list: str
    # the sm_XX code the built libraries must contain, and nothing else
    expected_sm: Annotated[list[SmCode], Field(min_length=1)]
    # the CUDA toolkit: a lock of NVIDIA's toolkit wheels beside the pin
    # (pins/toolkits/<name>.toml, contracts/cudatoolkit.py), installed into the home; unset: the
    # host's, under build_env's CUDA_HOME, named in the record by its tools' sha256
    toolkit: Annotated[str, AfterValidator(lambda v: relative_file(v))] | None = None


class RocmTarget(TargetBase):
    """An AMD GPU: its arch as rocminfo and torch's gcnArchName name it, PYTORCH_ROCM_ARCH
    for the build, the arch set vLLM's offload bundles must hold exactly, the HIP version
    torch.version.hip must start with, and where ROCm lives."""

    device: Literal["rocm"]
    gfx_arch: GfxArch
    pytorch_rocm_arch: str
    expected_gfx: Annotated[list[GfxArch], Field(min_length=1)]
    hip_version: Annotated[str, _shaped(r"\d+\.\d+(\.\d+)?", "7.2")]
    rocm_home: str | None = None

    @model_validator(mode="after")
    def _arch_sets(self) -> RocmTarget:
        archs = [_gfx(a) for a in self.pytorch_rocm_arch.split(";")]
        if set(archs) != set(self.expected_gfx):
            raise ValueError(f"pytorch_rocm_arch {self.pytorch_rocm_arch!r} builds another "
                             f"arch set than expected_gfx {self.expected_gfx}")
        return self


Target = Annotated[CpuTarget | CudaTarget | RocmTarget, Field(discriminator="device")]
# Each target model's discriminator is its device's name: the devices package has one module
# per name (devices.MODULES; a test keeps the two equal), and a pin names no other.
TARGET_MODELS = (CpuTarget, CudaTarget, RocmTarget)
DEVICES: tuple[str, ...] = tuple(get_args(m.model_fields["device"].annotation)[0]
                                 for m in TARGET_MODELS)
if TYPE_CHECKING:
    DeviceName = str
else:
    DeviceName = Literal[DEVICES]
