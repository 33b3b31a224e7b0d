"""A pin's lock file (pins/<id>.lock.txt): every other dependency, resolved once and
hash-locked, one ``name==version --hash=sha256:<hex>`` per line (pip's hash-checking
mode). The lock's sha256 is the root of trust for every wheel an oracle installs,
whether it comes from an index, the wheelhouse or the oracle cache."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from oracle_build.contracts.base import exact_version
from oracle_build.core.errors import BadInput
from oracle_build.core.files import read_text

__all__ = ["LOCK_LINE", "LockEntry", "parse_lock"]


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    sha256: tuple[str, ...]

    @property
    def key(self) -> str:
        return str(canonicalize_name(self.name))

    def requirement_line(self) -> str:
        hashes = " ".join(f"--hash=sha256:{h}" for h in self.sha256)
        return f"{self.name}=={self.version} {hashes}"


LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)$")


def _first_bad_column(line: str) -> int:
    """Where a lock line stops matching (0-based): after the longest prefix that could."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    at = name.end() if name else 0
    if not line.startswith("==", at):
        return at
    version = re.match(r"\S+", line[at + 2:])
    at += 2 + (version.end() if version else 0)
    while (m := re.match(r"\s+--hash=sha256:[0-9a-f]{64}(?=\s|$)", line[at:])) is not None:
        at += m.end()
    return at


def parse_lock(path: Path) -> list[LockEntry]:
    entries: list[LockEntry] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(read_text(path).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = LOCK_LINE.match(line)
        # what is wrong is said by line and column, never by quoting the line: a lock named by
        # someone else's pin could be any file (its content is not ours to print)
        if not m:
            raise BadInput(
                path,
                [(f"line {number}", "is not 'name==version --hash=sha256:<64 hex>' (from "
                  f"column {_first_bad_column(line) + len(raw) - len(raw.lstrip()) + 1})")],
            )
        name, version, hashes = m.group(1), m.group(2), m.group(3)
        try:
            exact_version(version)
        except ValueError:
            raise BadInput(path, [(f"line {number}", "the version is not an exact release "
                                   "version (==X.Y.Z)")]) from None
        key = canonicalize_name(name)
        if key in seen:
            raise BadInput(path, [(f"line {number}", f"lists a package again (first on line "
                                   f"{seen[key]})")])
        seen[key] = number
        digests = tuple(h.split(":", 1)[1] for h in hashes.split())
        entries.append(LockEntry(name, version, digests))
    if not entries:
        raise BadInput(path, "lock file lists no packages")
    return entries
