"""The CPU target: vLLM's CPU build on x86_64 or aarch64, no GPU. Its numbers depend on the
kernel library vLLM loads (AVX2, AVX-512, AVX-512 BF16) and on torch's, oneDNN's and MKL's
own dispatch by the CPU. So the kernel variant is a setting the oracle *holds*: every engine
runs under the variant its pin (or golden, or ``--kernel-variant``) names, on any host whose
CPU has that variant's instructions (``hold``), and identity proves from the running process
which variant was in force. Its KV cache is always bounded (left alone, the engine sizes it
from free host memory: 21 GiB of 24 seen)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle_build.core.env import CPU_NUMERICS
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.devices.base import Build, Device, Hold, Host, Mismatch

if TYPE_CHECKING:
    from oracle_build.contracts.targets import Target

# The pin's word for "whatever this host's CPU calls for" (today's behaviour before holding).
NATIVE = "native"
# The variable the inside scripts read the hold from (they import nothing from the harness).
HOLD_VARIABLE = "ORACLE_BUILD_CPU_HOLD"
# torch.cpu's predicates, as vLLM asks them (vllm/platforms/cpu.py import_kernels chooses its
# kernel library by the first two; attention, MoE, linear and GDN kernels by the others).
PREDICATES = ("_is_avx2_supported", "_is_avx512_supported", "_is_avx512_bf16_supported",
              "_is_vnni_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")


@dataclass(frozen=True)
class Variant:
    """One kernel variant of vLLM's x86_64 CPU build, and how a process is held to it."""

    name: str
    flags: tuple[str, ...]  # the /proc/cpuinfo flags a host needs to run it
    library: str  # the vllm extension it maps (the module is vllm._C either way)
    torch_capability: str  # torch.backends.cpu.get_cpu_capability() under it
    env: dict[str, str]
    predicates: dict[str, bool] = field(default_factory=dict)
    # the -march of the kernels torch inductor compiles at run time under it: the x86-64
    # micro-architecture level whose instructions the variant has (v3: AVX2, FMA, F16C;
    # v4: AVX-512 F/BW/CD/DQ/VL); inductor adds its own ISA flags for its vector code
    march: str = "x86-64-v3"


_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
_OFF = dict.fromkeys(PREDICATES, False)
# MKL's conditional numerical reproducibility in its COMPATIBLE mode: one code path on Intel
# and AMD CPUs alike. Measured (docs/numerics.md): with MKL_CBWR=AVX2 (or AVX512) or unset,
# the AMD-captured nemotron-h (AVX2) and gemma2 (AVX-512 BF16) goldens differed on an Intel
# Xeon by 1.9e-6 and 4.8e-7 nats; with COMPATIBLE, bit for bit.
_MKL = {"MKL_CBWR": "COMPATIBLE"}
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("x86_64-avx2", _AVX2, "_C_AVX2", "AVX2",
            {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             **_MKL},
            {**_OFF, "_is_avx2_supported": True}),
    Variant("x86_64-avx512", _AVX512, "_C_AVX512", "AVX512",
            {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
             **_MKL},
            {**_OFF, "_is_avx2_supported": True, "_is_avx512_supported": True}, "x86-64-v4"),
    Variant("x86_64-avx512_bf16", (*_AVX512, "avx512_bf16", "avx512_vnni"), "_C", "AVX512",
            {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
             **_MKL},
            {**_OFF, "_is_avx2_supported": True, "_is_avx512_supported": True,
             "_is_avx512_bf16_supported": True, "_is_vnni_supported": True}, "x86-64-v4"),
    Variant("x86_64-avx512_bf16-amx",
            (*_AVX512, "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"), "_C", "AVX512",
            {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
             **_MKL},
            {**_OFF, "_is_avx2_supported": True, "_is_avx512_supported": True,
             "_is_avx512_bf16_supported": True, "_is_vnni_supported": True,
             "_is_amx_tile_supported": True}, "x86-64-v4"),
)}
# aarch64's CPU build has one kernel library: its variant is the machine's name, and holding
# it changes nothing.
ONE_LIBRARY = ("aarch64",)


def known_variants(machine: str) -> list[str]:
    if machine == "x86_64":
        return [NATIVE, *VARIANTS]
    return [NATIVE, machine]


def missing_flags(variant: str, flags: frozenset[str]) -> list[str]:
    """The instructions ``variant`` needs that a CPU with ``flags`` lacks."""
    v = VARIANTS.get(variant)
    return [f for f in v.flags if f not in flags] if v else []


def held_variant(target: Target, asked: str | None) -> str:
    """The variant this run's engines are held to: ``asked`` (a golden's recorded variant,
    ``--kernel-variant``) or else the pin target's; ``native`` is the host's own."""
    name = asked or getattr(target, "kernel_variant", NATIVE)
    known = known_variants(target.machine)
    if name not in known:
        raise PreflightFailed(
            f"CPU kernel variant {name!r} is not one an {target.machine} oracle runs",
            hint=f"one of: {', '.join(known)}")
    return name


def hold(target: Target, asked: str | None, flags: frozenset[str],
         host_variant: str | None) -> Hold:
    """How this run's processes are held to their variant: the environment the tool sets
    and the torch.cpu answers vLLM reads. A host without the variant's instructions is
    refused, naming them (a golden's verify says NOT VERIFIABLE HERE before this)."""
    name = held_variant(target, asked)
    if name == NATIVE or name in ONE_LIBRARY:
        return Hold(requested=name, variant=host_variant, env={}, inside=None)
    v = VARIANTS[name]
    lacking = missing_flags(name, flags)
    if lacking:
        raise PreflightFailed(
            f"CPU kernel variant {name} needs instructions this host's CPU lacks: "
            f"{', '.join(lacking)} (this host runs {host_variant})",
            hint="run it on a host with them, or pass --kernel-variant for one this CPU has")
    inside = json.dumps({"variant": name, "library": v.library,
                         "torch_capability": v.torch_capability,
                         "predicates": v.predicates}, sort_keys=True)
    assert set(v.env) <= set(CPU_NUMERICS)
    return Hold(requested=name, variant=name, env={**v.env, HOLD_VARIABLE: inside},
                inside=inside,
                library=v.library, torch_capability=v.torch_capability, march=v.march)


def variant_mismatches(held: Hold, kernels: dict[str, Any]) -> list[Mismatch]:
    """The variant in force in a process (its mapped kernel library, torch's dispatch level,
    the hold it applied) against the one asked for: another variant is never a silent run."""
    bad: list[Mismatch] = []
    loaded = kernels.get("variant")
    libraries = ", ".join(kernels.get("loaded") or []) or "none"
    if loaded != held.variant:
        # vLLM fell back to another kernel library than asked for (a failed import is only
        # a warning in vLLM), or the hold did not take: its numerics are not the variant's
        bad.append(("cpu kernel variant", str(held.variant),
                    f"{loaded} (libraries loaded: {libraries})"))
    if held.inside is None:
        return bad
    if kernels.get("held") != held.variant:
        bad.append(("cpu kernel variant held", str(held.variant),
                    f"{kernels.get('held')} (the process did not apply the hold)"))
    if kernels.get("torch_capability") != held.torch_capability:
        bad.append(("torch cpu capability", str(held.torch_capability),
                    str(kernels.get("torch_capability"))))
    return bad


# where a Debian/Ubuntu host's numa.h is (libnuma-dev)
NUMA_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")
# The kernel libraries a from-source x86_64 CPU build of vLLM compiles, one per ISA
# (cmake/cpu_extension.cmake: AVX-512 BF16/AMX, AVX-512, AVX2): CpuPlatform.import_kernels
# maps one of them, so a wheel without all three runs on some hosts and not on others.
X86_KERNEL_LIBRARIES = ("_C", "_C_AVX512", "_C_AVX2")


def kernel_libraries(names: list[str]) -> list[str]:
    """The vllm/_C*.so libraries among a wheel's files, by module name."""
    out = []
    for name in names:
        m = re.fullmatch(r"vllm/(_C(?:_[A-Z0-9]+)?)\.(?:abi3|cpython-[^/]*)\.so", name)
        if m:
            out.append(m.group(1))
    return sorted(out)


class Cpu(Device):
    NAME = "cpu"
    PROBE_DEVICE = "cpu"
    BY_CPU_VARIANT = True

    def build_env(self, target: Target, env: dict[str, str]) -> None:
        env["VLLM_TARGET_DEVICE"] = "cpu"

    def preflight(self, plan: Build, facts: dict[str, Any], h: Host) -> None:
        """vLLM's CPU extension links libnuma (cmake/cpu_extension.cmake: ENABLE_NUMA on
        Linux): without its header the compile stops an hour in, so the build stops first."""
        if not plan.from_source or plan.target.kernel_check != "rms_norm":
            return
        headers = [Path(d) / "numa.h" for d in NUMA_INCLUDE_DIRS]
        found = next((str(p) for p in headers if p.is_file()), None)
        facts["numa_h"] = found
        if found is None:
            raise PreflightFailed("vLLM's CPU build links libnuma and numa.h is not on this "
                                  "host", hint="Debian/Ubuntu: apt-get install libnuma-dev")

    def wheel_check_about(self, target: Target) -> str:
        if target.kernel_check != "rms_norm" or target.machine != "x86_64":
            return ""
        return ("; it holds the three x86 kernel libraries (" + ", ".join(
            f"vllm/{n}" for n in X86_KERNEL_LIBRARIES) + ")")

    def check_wheel(self, plan: Build, libraries: list[Path],
                    root: Path) -> dict[str, Any] | None:
        names = kernel_libraries([str(p.relative_to(root)) for p in libraries])
        target = plan.target
        if target.kernel_check == "rms_norm" and target.machine == "x86_64":
            missing = [n for n in X86_KERNEL_LIBRARIES if n not in names]
            if missing:
                raise BuildFailed(f"the wheel lacks the kernel libraries {missing} (it has "
                                  f"{names}): CpuPlatform maps one per host ISA",
                                  hint="read the configure lines 'CPU extension (...) compile "
                                  "flags' in the build log")
        return {"kernel_libraries": names}

    def hold(self, target: Target, asked: str | None, flags: frozenset[str],
             host_variant: str | None) -> Hold:
        return hold(target, asked, flags, host_variant)

    def held_name(self, target: Target, asked: str | None) -> str | None:
        return held_variant(target, asked)

    def known_variants(self, target: Target) -> list[str]:
        return known_variants(target.machine)

    def missing_instructions(self, target: Target, asked: str | None,
                             flags: frozenset[str]) -> list[str]:
        return missing_flags(held_variant(target, asked), flags)

    def variant_mismatches(self, held: Hold, kernels: dict[str, Any]) -> list[Mismatch]:
        return variant_mismatches(held, kernels)

    def device_mismatches(self, target: Target, facts: dict[str, Any],
                          held: Hold) -> list[Mismatch]:
        bad: list[Mismatch] = []
        if facts.get("hold_error"):  # the probe could not apply the hold before vLLM loaded
            bad.append(("cpu kernel variant held", str(held.variant), facts["hold_error"]))
        bad += super().device_mismatches(target, facts, held)
        kernels = facts.get("cpu_kernels")
        if kernels is None:
            return bad
        bad += variant_mismatches(held, kernels)
        return bad

    def engine_args(self, args: dict[str, Any]) -> None:
        if not args.get("kv_cache_memory_bytes"):
            raise PreflightFailed(
                "a CPU engine needs kv_cache_memory_bytes (it would size its KV cache from free "
                "host memory: 21 GiB of 24 seen)", hint="set engine.kv_cache_memory_bytes")


DEVICE = Cpu()
