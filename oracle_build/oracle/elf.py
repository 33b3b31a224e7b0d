"""Where two builds of one ELF file differ, by section (what ``readelf -S`` lists), read with
the standard library: a file's header, its program headers and each section's bytes, hashed
and compared by name. Enough to tell a path in ``.rodata`` or ``.debug_str`` from a changed
``.text``; ``diffoscope`` (Debian's package) then shows the bytes, by hand.

The files come from builds of ours, but are read as hostile all the same: every offset and
count is checked against the file's size, and a file that is not a well-formed ELF is said to
be one, never a traceback.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Sections", "differences", "sections"]

MAX_SECTIONS = 65535
SHT_NOBITS = 8


@dataclass(frozen=True)
class Sections:
    """A file's parts: name -> (size, sha256); ``problem`` when it could not be read."""

    parts: dict[str, tuple[int, str]]
    problem: str | None = None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sections(path: Path) -> Sections:
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 52:
        return Sections({}, "not an ELF file")
    klass, order = data[4], data[5]
    if klass not in (1, 2) or order not in (1, 2):
        return Sections({}, "an ELF header of an unknown class or byte order")
    end = "<" if order == 1 else ">"
    wide = klass == 2
    try:
        if wide:
            (phoff, shoff) = struct.unpack_from(end + "QQ", data, 0x20)
            (ehsize, phentsize, phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                end + "HHHHHH", data, 0x34)
        else:
            (phoff, shoff) = struct.unpack_from(end + "II", data, 0x1C)
            (ehsize, phentsize, phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
                end + "HHHHHH", data, 0x28)
        parts: dict[str, tuple[int, str]] = {"ELF header": (ehsize, _digest(data[:ehsize]))}
        ph_end = phoff + phentsize * phnum
        if ph_end > len(data):
            return Sections(parts, "program headers past the end of the file")
        parts["program headers"] = (ph_end - phoff, _digest(data[phoff:ph_end]))
        if shnum > MAX_SECTIONS or shoff + shentsize * shnum > len(data) or (
                shnum and shstrndx >= shnum):
            return Sections(parts, "section headers past the end of the file")
        fmt = end + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        if shnum and shentsize < struct.calcsize(fmt):
            return Sections(parts, "section headers too short")
        headers = [struct.unpack_from(fmt, data, shoff + i * shentsize) for i in range(shnum)]
        parts["section headers"] = (shentsize * shnum,
                                    _digest(data[shoff:shoff + shentsize * shnum]))
        if not headers:
            return Sections(parts)
        str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
        if str_off + str_size > len(data):
            return Sections(parts, "the section name table is past the end of the file")
        names = data[str_off:str_off + str_size]
        seen: dict[str, int] = {}
        for index, (name_off, kind, _f, _a, off, size, *_rest) in enumerate(headers):
            if index == 0:
                continue
            stop = names.find(b"\0", name_off)
            name = names[name_off:stop if stop >= 0 else None].decode("ascii", "replace")
            name = "".join(c if c.isprintable() else "?" for c in name)[:100] or f"#{index}"
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name} #{seen[name]}"
            if kind == SHT_NOBITS:
                parts[name] = (size, "nobits")
                continue
            if off + size > len(data):
                return Sections(parts, f"section {name} past the end of the file")
            parts[name] = (size, _digest(data[off:off + size]))
        return Sections(parts)
    except struct.error:
        return Sections({}, "a truncated ELF header")


def differences(a: Path, b: Path) -> list[str]:
    """The parts of two ELF files that differ, each named with its two sizes where they
    differ: ``.rodata (1204 bytes, then 1210)``; a part present in one only is said so."""
    left, right = sections(a), sections(b)
    out = [f"{which}: {s.problem}" for which, s in (("first", left), ("second", right))
           if s.problem]
    for name in list(left.parts) + [n for n in right.parts if n not in left.parts]:
        x, y = left.parts.get(name), right.parts.get(name)
        if x == y:
            continue
        if x is None or y is None:
            out.append(f"{name} (only in the {'second' if x is None else 'first'})")
        elif x[0] != y[0]:
            out.append(f"{name} ({x[0]} bytes, then {y[0]})")
        else:
            out.append(name)
    return out
