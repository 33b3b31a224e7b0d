"""Which GPU architectures a built library carries code for: the compiled-kernel half of
identity (the build's wheel check and the oracle's identity both ask).

- CUDA: ``cuobjdump --list-elf`` names each sm_XX ELF.
- ROCm: HIP code sits in clang offload bundles inside the library (``.hip_fatbin``). An
  uncompressed bundle is ``__CLANG_OFFLOAD_BUNDLE__``, a u64 entry count, then per entry
  u64 offset, u64 size, u64 id length and the id (``hipv4-amdgcn-amd-amdhsa--gfx1100``, or
  ``host-x86_64-unknown-linux-gnu-``); read here without any tool. A compressed bundle
  (``CCOB``: clang's --offload-compress, which PyTorch's ROCm builds use) hides its ids in
  the compressed payload: ROCm's ``roc-obj-ls`` lists it, and its listing is parsed the same
  way. A library whose bundles cannot be listed is reported as such, never as passing.
"""

from __future__ import annotations

import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

from oracle_build.core import proc

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
MAX_ENTRIES = 4096
GFX_IN_ID = re.compile(r"amdgcn-amd-amdhsa-[a-z0-9]*-(gfx[0-9a-f]+)")


def cuobjdump_sm(paths: list[str], cuobjdump: str | None = None) -> list[str]:
    """The sm_XX ELF code inside the given libraries, via ``cuobjdump --list-elf``."""
    exe = cuobjdump or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    found: set[str] = set()
    for path in paths:
        listing = proc.query([exe, "--list-elf", path], timeout=300)
        found.update(re.findall(r"\.(sm_\d+[af]?)\.", listing.output))
    return sorted(found)


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
