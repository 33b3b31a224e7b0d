"""Every file of an oracle venv, as built: identity means "these are the files the pin's
wheels install, and nothing else Python will execute".

At build (before the publishing rename) every file is hashed and checked against its
wheel's RECORD (a file whose bytes disagree with its RECORD fails the build); files the venv
itself creates (pyvenv.cfg, activate scripts, ...) are listed as such; the base interpreter's
start-up files on the oracle's ``sys.path`` (sitecustomize, usercustomize, .pth) are hashed
too. At identity every file is stat'ed and hashed only when its size or mtime changed
(``deep``: every file hashed); modified, missing and added files are reported by path with
their distribution. Bytecode caches (``__pycache__``, ``*.pyc``) are not part of the identity.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from oracle_build.core import layout
from oracle_build.core.errors import BuildFailed
from oracle_build.core.files import sha256_file

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = 1
# What a venv creates for itself (uv venv): no wheel's RECORD lists these.
VENV_FILES = {"pyvenv.cfg", ".gitignore", ".lock", "CACHEDIR.TAG"}
VENV_BIN = ("activate", "deactivate", "pydoc")
SHOWN = 25  # mismatches named one by one; the rest are counted


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return "__pycache__" in parts or rel.endswith(".pyc") or parts[0] == layout.RECORD_DIR


def walk(venv: Path) -> Iterator[tuple[str, os.stat_result, bool]]:
    """(relative path, lstat, is a symlink) for every file and symlink that is part of the
    identity, without following symlinked folders."""
    for root, dirs, files in os.walk(venv):
        rel_root = os.path.relpath(root, venv)
        keep = []
        for d in dirs:
            rel = d if rel_root == "." else f"{rel_root}/{d}"
            full = os.path.join(root, d)
            if os.path.islink(full):
                yield rel, os.lstat(full), True
            elif not _skipped(rel):
                keep.append(d)
        dirs[:] = keep
        for f in files:
            rel = f if rel_root == "." else f"{rel_root}/{f}"
            if _skipped(rel):
                continue
            st = os.lstat(os.path.join(root, f))
            yield rel, st, os.path.islink(os.path.join(root, f))


def _record_hash(value: str) -> str | None:
    """A RECORD hash ("sha256=<urlsafe base64, no padding>") as hex."""
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def records(venv: Path) -> dict[str, tuple[str, str | None]]:
    """relative path -> (distribution, sha256 or None) from every installed RECORD."""
    out: dict[str, tuple[str, str | None]] = {}
    for record in sorted(venv.glob("lib/python3.*/site-packages/*.dist-info/RECORD")):
        site = record.parent.parent
        dist = str(canonicalize_name(record.parent.name.removesuffix(".dist-info")
                                     .split("-", 1)[0]))
        text = record.read_text(errors="replace")
        for row in csv.reader(io.StringIO(text)):
            if not row or not row[0]:
                continue
            path = os.path.normpath(site / row[0])
            rel = os.path.relpath(path, venv)
            out[rel] = (dist, _record_hash(row[1]) if len(row) > 1 and row[1] else None)
    return out


def _venv_file(rel: str) -> bool:
    if rel in VENV_FILES:
        return True
    parts = rel.split("/")
    return len(parts) == 2 and parts[0] == "bin" and parts[1].startswith(VENV_BIN)


@dataclass
class Hashed:
    """What ``build`` needs that can be read early: each file's sha256 with the size and
    mtime it had when hashed, and the installed RECORDs."""

    digests: dict[str, tuple[int, int, str]]  # relative path -> (size, mtime_ns, sha256)
    records: dict[str, tuple[str, str | None]]


def hash_files(venv: Path, stop: threading.Event | None = None) -> Hashed:
    """Every identity file's sha256, and the RECORDs: the build reads them while its
    identity probe imports vLLM (two cores, two jobs); ``build`` takes a digest from here
    only for a file whose size and mtime are unchanged since."""
    out: dict[str, tuple[int, int, str]] = {}
    for rel, st, is_link in walk(venv):
        if stop is not None and stop.is_set():  # the step failed or was interrupted
            break
        if not is_link:
            out[rel] = (st.st_size, st.st_mtime_ns, sha256_file(venv / rel))
    return Hashed(out, records(venv))


def build(venv: Path, *, relocated: dict[str, str] | None = None,
          startup: dict[str, str] | None = None, hashed: Hashed | None = None
          ) -> dict[str, Any]:
    """Hash every file of ``venv`` and check each against its wheel's RECORD.
    ``relocated``: files whose shebang was rewritten for the final path, with the hash they
    had when installed (what RECORD holds). ``hashed``: digests taken earlier (hash_files)."""
    relocated = relocated or {}
    digests = hashed.digests if hashed is not None else {}
    listed = hashed.records if hashed is not None else records(venv)
    files: dict[str, dict[str, Any]] = {}
    links: dict[str, str] = {}
    bad = []
    for rel, st, is_link in walk(venv):
        if is_link:
            links[rel] = os.readlink(venv / rel)
            continue
        earlier = digests.get(rel)
        digest = earlier[2] if earlier is not None and earlier[:2] == (
            st.st_size, st.st_mtime_ns) else sha256_file(venv / rel)
        dist, recorded = listed.get(rel, (None, None))
        installed = relocated.get(rel, digest)
        if recorded is not None and recorded != installed:
            bad.append(f"{rel} ({dist}): sha256 {installed} but its RECORD says {recorded}")
        kind = "wheel" if dist is not None else ("venv" if _venv_file(rel) else "unlisted")
        if kind == "unlisted":
            bad.append(f"{rel}: in no wheel's RECORD and not a file a venv creates")
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest,
                      "dist": dist, "kind": kind,
                      **({"relocated_from_sha256": relocated[rel]} if rel in relocated else {})}
    if bad:
        raise BuildFailed("the venv's files disagree with what its wheels install:\n  "
                          + "\n  ".join(bad[:SHOWN])
                          + (f"\n  ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""))
    return {"manifest_schema": MANIFEST_SCHEMA, "created_utc": layout.utc_now(),
            "files": files, "symlinks": links, "startup_outside": startup or {}}


@dataclass(frozen=True)
class Check:
    mismatches: list[tuple[str, str, str]]
    files: int
    hashed: int
    seconds: float


def check(venv: Path, manifest: dict[str, Any], *, deep: bool = False,
          startup: dict[str, str] | None = None) -> Check:
    """Compare ``venv`` with its manifest: stat every file, hash those whose size or mtime
    changed (all with ``deep``). Returns (field, expected, found) mismatches."""
    start = time.monotonic()
    files: dict[str, dict[str, Any]] = manifest["files"]
    links: dict[str, str] = manifest["symlinks"]
    seen: set[str] = set()
    bad: list[tuple[str, str, str]] = []
    hashed = 0
    for rel, st, is_link in walk(venv):
        seen.add(rel)
        if is_link:
            target = os.readlink(venv / rel)
            if links.get(rel) != target:
                bad.append((f"file {rel}", f"symlink to {links[rel]}" if rel in links
                            else "absent", f"symlink to {target}"))
            continue
        entry = files.get(rel)
        if entry is None:
            bad.append((f"file {rel}", "absent (installed by no wheel)",
                        f"added ({st.st_size} bytes)" + _startup_note(rel)))
            continue
        if deep or st.st_size != entry["size"] or st.st_mtime_ns != entry["mtime_ns"]:
            hashed += 1
            digest = sha256_file(venv / rel)
            if digest != entry["sha256"]:
                owner = entry["dist"] or "the venv"
                bad.append((f"file {rel} ({owner})", f"sha256 {entry['sha256'][:16]}...",
                            f"modified: sha256 {digest[:16]}..., {st.st_size} bytes"))
    for rel in sorted((set(files) | set(links)) - seen):
        owner = files[rel]["dist"] if rel in files else "symlink"
        bad.append((f"file {rel} ({owner or 'the venv'})", "present", "missing"))
    for path, digest in sorted((manifest.get("startup_outside") or {}).items()):
        now = (startup or {}).get(path)
        if now != digest:
            bad.append((f"start-up file {path}", f"sha256 {digest[:16]}...",
                        "missing" if now is None else f"sha256 {now[:16]}..."))
    for path in sorted(set(startup or {}) - set(manifest.get("startup_outside") or {})):
        bad.append((f"start-up file {path}", "absent", "added: Python runs it at start-up"))
    if len(bad) > SHOWN:
        bad = [*bad[:SHOWN], ("files", "no more differences",
                              f"{len(bad) - SHOWN} more not shown")]
    return Check(bad, len(seen), hashed, time.monotonic() - start)


def _startup_note(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    if name in ("sitecustomize.py", "usercustomize.py") or name.endswith(".pth"):
        return ": Python runs it at every start-up"
    return ""


def path(venv: Path) -> Path:
    return layout.record_dir(venv) / MANIFEST


def outside_startup(facts: dict[str, Any], venv: Path) -> dict[str, str]:
    """The probe's start-up files that live outside the venv (the base interpreter's)."""
    real = os.path.realpath(venv)
    return {p: d for p, d in (facts.get("startup_files") or {}).items()
            if not (p == real or p.startswith(real + os.sep))}
