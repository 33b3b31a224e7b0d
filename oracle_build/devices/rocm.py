"""An AMD GPU target (gfx1100, ROCm 7.x, x86_64): hipcc of the pinned HIP version under
ROCM_HOME and an AMD GPU that answers before a build; VLLM_TARGET_DEVICE, PYTORCH_ROCM_ARCH
and ROCM_HOME for the build; the gfx set of the built libraries' HIP offload bundles exactly
the target's, at build and at every identity check; torch built for the pinned HIP and the
first visible GPU by name and gfx arch; this host's AMD GPUs (rocminfo, else amd-smi).

The gfx archs a library holds: HIP code sits in clang offload bundles inside the library
(``.hip_fatbin``). An uncompressed bundle is ``__CLANG_OFFLOAD_BUNDLE__``, a u64 entry
count, then per entry u64 offset, u64 size, u64 id length and the id
(``hipv4-amdgcn-amd-amdhsa--gfx1100``, or ``host-x86_64-unknown-linux-gnu-``); read here
without any tool. A compressed bundle (``CCOB``: clang's --offload-compress, which PyTorch's
ROCm builds use) hides its ids in the compressed payload: ROCm's ``roc-obj-ls`` lists it,
and its listing is parsed the same way. A library whose bundles cannot be listed is
reported as such, never as passing."""

from __future__ import annotations

import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from os import environ
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from oracle_build.contracts.targets import RocmTarget
from oracle_build.core import env as envmod
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

DEFAULT_ROCM_HOME = "/opt/rocm"


def _rocm(target: Target) -> RocmTarget:
    assert isinstance(target, RocmTarget), target
    return target


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


def amdgpu_driver(path: Path = Path("/sys/module/amdgpu/version")) -> str:
    try:
        return f"amdgpu {path.read_text().strip()}"
    except OSError:
        return ""


def hip_version(hipcc_output: str) -> str | None:
    """``hipcc --version``'s "HIP version: 7.2.53211-e9d2e3ca67" as "7.2.53211"."""
    m = re.search(r"HIP version:\s*(\d+\.\d+(?:\.\d+)?)", hipcc_output)
    return m.group(1) if m else None



BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
MAX_ENTRIES = 4096
GFX_IN_ID = re.compile(r"amdgcn-amd-amdhsa-[a-z0-9]*-(gfx[0-9a-f]+)")


def bundle_ids(data: bytes) -> tuple[list[str], int]:
    """Every uncompressed offload bundle's entry ids in ``data``, and how many compressed
    bundles it also holds (whose ids this cannot read)."""
    ids: list[str] = []
    start = data.find(BUNDLE_MAGIC)
    while start != -1:
        pos = start + len(BUNDLE_MAGIC)
        if pos + 8 <= len(data):
            (count,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            if 0 < count <= MAX_ENTRIES:
                for _ in range(count):
                    if pos + 24 > len(data):
                        break
                    _offset, _size, id_len = struct.unpack_from("<QQQ", data, pos)
                    pos += 24
                    if id_len > 1024 or pos + id_len > len(data):
                        break
                    ids.append(data[pos:pos + id_len].decode("ascii", "replace"))
                    pos += id_len
        start = data.find(BUNDLE_MAGIC, start + 1)
    return ids, data.count(COMPRESSED_MAGIC + b"\x02\x00") + data.count(
        COMPRESSED_MAGIC + b"\x03\x00") + data.count(COMPRESSED_MAGIC + b"\x01\x00")


def gfx_of(ids_or_listing: str) -> list[str]:
    """The gfx archs named by bundle ids or by a ``roc-obj-ls`` / ``clang-offload-bundler
    --list`` listing (target-id features such as ``:xnack-`` dropped)."""
    return sorted(set(GFX_IN_ID.findall(ids_or_listing)))


@dataclass
class OffloadArches:
    """What a set of libraries holds: gfx archs per library, and libraries whose bundles
    could not be listed (compressed, and no roc-obj-ls)."""

    by_library: dict[str, list[str]] = field(default_factory=dict)
    unlisted: list[str] = field(default_factory=list)

    @property
    def gfx(self) -> list[str]:
        return sorted({a for archs in self.by_library.values() for a in archs})

    def problems(self, expected: list[str]) -> list[tuple[str, str, str]]:
        """(field, expected, found) for each way the set differs from ``expected``."""
        want = ", ".join(sorted(expected))
        out = []
        if not self.gfx:
            out.append(("compiled gfx (offload bundles)", want,
                        "no gfx code found (no bundle, or host code only)"))
        elif set(self.gfx) != set(expected):
            out.append(("compiled gfx (offload bundles)", want, ", ".join(self.gfx)))
        for lib in self.unlisted:
            out.append((f"compiled gfx of {Path(lib).name}", want,
                        "compressed offload bundles, and no roc-obj-ls to list them"))
        return out


def offload_arches(paths: list[str], *, roc_obj_ls: str | None = None) -> OffloadArches:
    """The gfx archs each library's HIP offload bundles hold. Libraries without any bundle
    (host-only helpers) are left out."""
    out = OffloadArches()
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError:
            out.unlisted.append(path)
            continue
        ids, compressed = bundle_ids(data)
        archs = gfx_of("\n".join(ids))
        if compressed:
            if roc_obj_ls is None:
                out.unlisted.append(path)
                continue
            listing = proc.query([roc_obj_ls, "-v", path], timeout=300)
            if not listing.ok:
                out.unlisted.append(path)
                continue
            archs = sorted(set(archs) | set(gfx_of(listing.output)))
        if ids or compressed:
            out.by_library[path] = archs
    return out


class Rocm(Device):
    NAME = "rocm"
    PROBE_DEVICE = "cuda"  # ROCm's torch runs HIP through the torch.cuda API
    GPU = True
    BUILD_MEMORY_FLOOR_GIB = 16.0
    BUILD_DISK_GIB = 60.0
    CMAKE_FOUND = ("HIP_FOUND", "PYTORCH_FOUND_HIP")
    VERSION_HINTS: ClassVar[tuple[tuple[re.Pattern[str], str], ...]] = (
        (re.compile(r"[+.]rocm\d+"), "setup.py appends .rocm + the first three digits of "
         "ROCm's version (librocm-core under ROCM_HOME, else torch.version.hip): this host's "
         "ROCm is not the one the target's dist_version_suffix names"),
    )
    PREFLIGHT_ABOUT = "hipcc, its HIP version and the amdgpu driver"
    LAUNCHER_LANGS = ("C", "CXX", "HIP")
    # hipcc is clang: it takes the map as it is (CMake reads HIPFLAGS)
    PATH_MAP_VARS = (("HIPFLAGS", "{flag}"),)
    BUILD_FLAG_VARS = ("VLLM_TARGET_DEVICE", "PYTORCH_ROCM_ARCH", "ROCM_HOME")

    def build_env(self, target: Target, env: dict[str, str]) -> None:
        t = _rocm(target)
        env["VLLM_TARGET_DEVICE"] = self.NAME
        env["PYTORCH_ROCM_ARCH"] = t.pytorch_rocm_arch
        env.setdefault("ROCM_HOME", t.rocm_home or DEFAULT_ROCM_HOME)

    def toolchain_parts(self, preflight: dict[str, Any]) -> list[str]:
        value = preflight.get("hip_version")
        return [f"hip: {value}"] if isinstance(value, str) and value else []

    def preflight(self, plan: Build, facts: dict[str, Any], h: Host) -> None:
        """hipcc under ROCM_HOME and its HIP version (the pin's), and an amdgpu driver that
        answers with an AMD GPU."""
        t = _rocm(plan.target)
        rocm_home = plan.build_env.get("ROCM_HOME") or environ.get("ROCM_HOME") or \
            t.rocm_home or DEFAULT_ROCM_HOME
        hipcc = Path(rocm_home) / "bin" / "hipcc"
        if not hipcc.exists():
            raise PreflightFailed(f"no hipcc under ROCM_HOME={rocm_home}",
                                  hint="run inside the ROCm base container, or fix the "
                                  "target's rocm_home / build_env ROCM_HOME")
        answer = proc.query([str(hipcc), "--version"], env=envmod.build_env())
        version = hip_version(answer.output)
        want = t.hip_version
        if not version or not (version == want or version.startswith(want + ".")):
            raise PreflightFailed(f"hipcc at {hipcc} reports HIP {version or '(none)'}; "
                                  f"target {plan.target_name} pins HIP {want}",
                                  hint="use the ROCm userland the pin names (the ROCm base "
                                  "container's tag)")
        amd = [g for g in h.gpus if g.vendor == "amd"]
        if not amd:
            raise PreflightFailed("no AMD GPU answers (rocminfo, amd-smi): is the amdgpu "
                                  "driver loaded and /dev/kfd passed into the container?")
        facts.update({"hipcc": str(hipcc), "hip_version": version, "driver": amd[0].driver,
                      "gpus": [f"{g.name} {g.arch}" for g in amd]})

    def wheel_check_about(self, target: Target) -> str:
        return ("; the gfx set in the built libraries' offload bundles is exactly "
                f"{', '.join(_rocm(target).expected_gfx)}")

    def check_wheel(self, plan: Build, libraries: list[Path],
                    root: Path) -> dict[str, Any] | None:
        """The wheel's HIP offload bundles hold code for exactly the target's gfx set."""
        t = _rocm(plan.target)
        found = offload_arches([str(p) for p in libraries],
                               roc_obj_ls=rocm_tool("roc-obj-ls", t.rocm_home))
        problems = found.problems(t.expected_gfx)
        if problems:
            raise BuildFailed(
                "the wheel's HIP code is not the target's: " + "; ".join(
                    f"{f}: expected {e}, found {g}" for f, e, g in problems),
                hint="check PYTORCH_ROCM_ARCH in the build environment (the target's "
                "pytorch_rocm_arch)")
        return {"offload_bundles": {str(Path(k).relative_to(root)): v
                                    for k, v in found.by_library.items()}}

    def compiled(self, target: Target, libraries: list[str], *,
                 toolkit: str | None = None) -> tuple[list[str] | None, list[Mismatch]]:
        t = _rocm(target)
        found = offload_arches(libraries, roc_obj_ls=rocm_tool("roc-obj-ls", t.rocm_home))
        return found.gfx, found.problems(t.expected_gfx)

    def device_mismatches(self, target: Target, facts: dict[str, Any],
                          held: Hold) -> list[Mismatch]:
        """torch built for the pinned HIP version, and the first visible GPU by name and gfx
        arch (``gcnArchName``, target-id features such as ``:sramecc+:xnack-`` aside)."""
        t = _rocm(target)
        bad: list[Mismatch] = []
        torch = torch_facts(facts)
        hip = torch.get("hip")
        if not hip or not (hip == t.hip_version or str(hip).startswith(t.hip_version + ".")):
            bad.append(("torch.version.hip", f"{t.hip_version}.*", str(hip)))
        want = f"{t.device_name or 'AMD GPU'} {t.gfx_arch}"
        first = first_gpu(facts)
        if first is None:
            bad.append(("device", want, torch.get("cuda_error") or "no ROCm device visible"))
        else:
            arch = str(first.get("gcn_arch") or "").split(":", 1)[0]
            if arch != t.gfx_arch or (t.device_name or "").lower() not in \
                    str(first.get("name", "")).lower():
                bad.append(("device", want,
                            f"{first.get('name')} ({first.get('gcn_arch') or 'no arch'})"))
        return bad + super().device_mismatches(target, facts, held)

    def fits(self, target: Target, h: Host) -> tuple[bool, str]:
        t = _rocm(target)
        amd = [g for g in h.gpus if g.vendor == "amd"]
        for gpu in amd:
            if gpu.arch == t.gfx_arch and (t.device_name or "").lower() in gpu.name.lower():
                return True, f"{gpu.name} {gpu.arch}"
        found = ", ".join(f"{g.name} ({g.arch})" for g in amd) or \
            "no AMD GPU (rocminfo, amd-smi)"
        return False, (f"needs {t.device_name or 'an AMD GPU'} {t.gfx_arch}; this host has "
                       f"{found}")

    def detect(self) -> tuple[Gpu, ...]:
        """AMD GPUs, from rocminfo (the HSA runtime's view) else amd-smi."""
        exe = rocm_tool("rocminfo")
        if exe:
            out = proc.query([exe], timeout=60)
            if out.ok:
                gpus = parse_rocminfo(out.output, amdgpu_driver())
                if gpus:
                    return gpus
        exe = rocm_tool("amd-smi")
        if exe:
            out = proc.query([exe, "static", "--asic", "--driver"], timeout=60)
            if out.ok:
                return parse_amd_smi(out.output)
        return ()

    def gpu_label(self, gpu: dict[str, Any]) -> str:
        return f"{gpu.get('name')} {str(gpu.get('gcn_arch') or '').split(':', 1)[0]}"


DEVICE = Rocm()
