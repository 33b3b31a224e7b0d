"""Wheels keyed by the pin's content hash, each checked against its sha256 before use.

``<root>/<pin key>/`` holds the wheels and ``manifest.json``. A wheel whose bytes do
not match its recorded or locked hash is moved to ``rejected/`` and never installed.
Put the root on storage that survives a reimage (``--wheelhouse`` or
``ORACLE_BUILD_WHEELHOUSE``) and a rebuild installs offline from it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from oracle_build.contracts.lock import LockEntry
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.wheelhouse import WHEELHOUSE_SCHEMA, WheelhouseManifest
from oracle_build.core.errors import BadInput
from oracle_build.core.files import atomic_write_json, load_json, sha256_file, validate
from oracle_build.core.layout import stamp
from oracle_build.core.log import say

MANIFEST_SCHEMA = WHEELHOUSE_SCHEMA


def wheel_key(filename: str) -> tuple[str, str]:
    name, version, _build, _tags = parse_wheel_filename(filename)
    return canonicalize_name(name), str(version)


@dataclass
class Wheelhouse:
    root: Path
    pin_key: str
    pin_hash: str

    @classmethod
    def for_pin(cls, base: Path, pin: Pin) -> Wheelhouse:
        return cls(base / pin.key, pin.key, pin.content_hash)

    @property
    def incoming(self) -> Path:
        """Where downloads land before their hash is checked (emptied before each use)."""
        return self.root / "incoming"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"schema": MANIFEST_SCHEMA, "pin_key": self.pin_key,
                    "pin_hash": self.pin_hash, "wheels": {}}
        data = load_json(self.manifest_path)
        validate(WheelhouseManifest, data, self.manifest_path)
        if data.get("pin_hash") != self.pin_hash:
            raise BadInput(self.manifest_path, [(
                "pin_hash", f"this wheelhouse belongs to pin {data.get('pin_key')} "
                f"({str(data.get('pin_hash'))[:12]}), not {self.pin_key}")])
        return dict(data)

    def _save(self, data: dict[str, Any]) -> None:
        WheelhouseManifest.model_validate(data)  # what is written is what its schema says
        atomic_write_json(self.manifest_path, data)

    def reject(self, path: Path, why: str) -> None:
        dest = self.root / "rejected" / f"{path.name}.{stamp()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), dest)
        say(f"    rejected {path.name}: {why} (kept at {dest})")

    def find(self, entry: LockEntry) -> Path | None:
        """The wheel for ``entry`` if present and its bytes match the lock; else None."""
        data = self.manifest()
        for filename, info in list(data["wheels"].items()):
            if wheel_key(filename) != (entry.key, entry.version):
                continue
            path: Path = self.root / filename
            if not path.exists():
                continue
            actual = sha256_file(path)
            if actual not in entry.sha256 or actual != info.get("sha256"):
                self.reject(path, f"sha256 {actual[:16]}... is not the locked hash")
                del data["wheels"][filename]
                self._save(data)
                continue
            return path
        return None

    def borrow(self, entry: LockEntry) -> Path | None:
        """The locked wheel from another pin's wheelhouse beside this one (pins that share
        most of their dependencies, e.g. two vLLM versions on one torch): hard-linked in (a
        copy where links are not possible), its bytes checked against the lock first. A
        second pin then downloads and stores only what differs."""
        for manifest in sorted(self.root.parent.glob("*/manifest.json")):
            if manifest.parent == self.root:
                continue
            try:
                data = load_json(manifest)
            except BadInput:
                continue  # another pin's damaged manifest is its own build's problem
            wheels = data.get("wheels") if isinstance(data, dict) else None
            for filename, info in (wheels or {}).items():
                if not isinstance(info, dict) or info.get("sha256") not in entry.sha256:
                    continue
                if wheel_key(filename) != (entry.key, entry.version):
                    continue
                src = manifest.parent / filename
                if not src.is_file() or sha256_file(src) != info["sha256"]:
                    continue
                self.root.mkdir(parents=True, exist_ok=True)
                dest: Path = self.root / str(filename)
                dest.unlink(missing_ok=True)
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copy2(src, dest)
                mine = self.manifest()
                mine["wheels"][filename] = {"sha256": info["sha256"],
                                            "size": dest.stat().st_size,
                                            "origin": f"shared:{manifest.parent.name}"}
                self._save(mine)
                return dest
        return None

    def find_built(self, distribution: str, version: str) -> Path | None:
        """A wheel this pin's build produced earlier, verified against the manifest."""
        data = self.manifest()
        for filename, info in list(data["wheels"].items()):
            if info.get("origin") != "built":
                continue
            if wheel_key(filename) != (canonicalize_name(distribution), version):
                continue
            built: Path = self.root / filename
            if built.exists():
                if sha256_file(built) == info.get("sha256"):
                    return built
                self.reject(built, "sha256 differs from the one recorded when it was built")
                del data["wheels"][filename]
                self._save(data)
        return None

    def add(self, path: Path, *, origin: str, expected: tuple[str, ...] | None = None) -> Path:
        """Move (or copy, for ``built``) a wheel in; refuse bytes that do not match."""
        digest = sha256_file(path)
        if expected is not None and digest not in expected:
            raise BadInput(path, [("sha256", f"{digest} is not the locked hash "
                                   f"({', '.join(h[:16] + '...' for h in expected)})")])
        self.root.mkdir(parents=True, exist_ok=True)
        dest = self.root / path.name
        if origin == "built":
            shutil.copy2(path, dest)
        else:
            shutil.move(str(path), dest)
        data = self.manifest()
        data["wheels"][path.name] = {"sha256": digest, "size": dest.stat().st_size,
                                     "origin": origin}
        self._save(data)
        return dest

    def files(self) -> dict[str, Any]:
        return dict(self.manifest()["wheels"])
