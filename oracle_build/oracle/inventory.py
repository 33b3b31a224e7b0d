"""Every file of an oracle venv, as built: identity means "these are the files the pin's
wheels install, their bytecode, and nothing else Python will execute".

At build (before the publishing rename) every file is hashed and checked against its
wheel's RECORD (a file whose bytes disagree with its RECORD fails the build); files the venv
itself creates (pyvenv.cfg, activate scripts, ...) are listed as such; the bytecode the
install compiled (``__pycache__/*.pyc`` of a wheel's source, checked-hash pycs) is listed
with its source's distribution; the base interpreter's start-up files on the oracle's
``sys.path`` (sitecustomize, usercustomize and .pth in every form) are hashed too. Any other
file (a sourceless ``.pyc``, a ``.pth``, a new pyc in ``__pycache__``) fails the build, and
at identity is reported as added. At identity every file is stat'ed and hashed only when its
size or mtime changed (``deep``: every file hashed, as every engine-running command does).

The manifest is anchored outside the venv it describes: ``<venv>.anchor.json`` beside the
venv holds the manifest's and the build record's sha256 and the oracle's content
fingerprint (one sha256 over every wheel file's path and sha256: the same for the same pin
on any host), which goldens record too.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from oracle_build.contracts.record import (
    ANCHOR_SCHEMA,
    MANIFEST_SCHEMA,
    Anchor,
    FileManifest,
    load_anchor,
)
from oracle_build.core import layout
from oracle_build.core.errors import BadInput, BuildFailed
from oracle_build.core.files import atomic_write_json, json_value, sha256_file

MANIFEST = "manifest.json"

# What a venv creates for itself (uv venv): no wheel's RECORD lists these.
VENV_FILES = {"pyvenv.cfg", ".gitignore", ".lock", "CACHEDIR.TAG"}
VENV_BIN = ("activate", "deactivate", "pydoc")
SHOWN = 25  # mismatches named one by one; the rest are counted
PYC = re.compile(r"^(?P<stem>[^.]+)\.cpython-\d+(?:\.opt-[12])?\.pyc$")


def _skipped(rel: str) -> bool:
    return rel.split("/")[0] == layout.RECORD_DIR


def bytecode_source(rel: str) -> str | None:
    """The source a ``__pycache__`` pyc is the bytecode of (``a/__pycache__/b.cpython-311.pyc``
    -> ``a/b.py``); None for any other file (a sourceless .pyc included)."""
    parts = rel.split("/")
    if len(parts) < 2 or parts[-2] != "__pycache__":
        return None
    m = PYC.match(parts[-1])
    if not m:
        return None
    return "/".join([*parts[:-2], m.group("stem") + ".py"])


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
        source = bytecode_source(rel)
        recompiled = source is not None and source in listed  # the install compiled it
        if recorded is not None and recorded != installed and not recompiled:
            bad.append(f"{rel} ({dist}): sha256 {installed} but its RECORD says {recorded}")
        kind = "wheel" if dist is not None and not recompiled else (
            "venv" if _venv_file(rel) else "bytecode" if recompiled else "unlisted")
        if kind == "bytecode" and source is not None:
            dist = listed[source][0]  # a wheel's own pyc too: the install compiles over it
        if kind == "unlisted":
            bad.append(f"{rel}: in no wheel's RECORD, not the bytecode of a wheel's source and "
                       "not a file a venv creates")
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest,
                      "dist": dist, "kind": kind,
                      **({"relocated_from_sha256": relocated[rel]} if rel in relocated else {})}
    if bad:
        raise BuildFailed("the venv's files disagree with what its wheels install:\n  "
                          + "\n  ".join(bad[:SHOWN])
                          + (f"\n  ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""))
    out = {"manifest_schema": MANIFEST_SCHEMA, "created_utc": layout.utc_now(),
           "files": files, "symlinks": links, "startup_outside": startup or {}}
    FileManifest.model_validate(out)  # what is written is what the committed schema says
    return out


ELF_MAGIC = b"\x7fELF"


def compiled_files(venv: Path, distribution: str) -> dict[str, str]:
    """The files a distribution's wheel installed that a compiler made (ELF: the extension
    modules and shared libraries), as path under site-packages -> sha256: what a source
    build must give byte for byte on every rebuild."""
    dist = str(canonicalize_name(distribution))
    out: dict[str, str] = {}
    for rel, (owner, _) in sorted(records(venv).items()):
        path = venv / rel
        if owner != dist or path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as f:
            if f.read(4) != ELF_MAGIC:
                continue
        out[rel.split("/site-packages/", 1)[-1]] = sha256_file(path)
    return out


# Written by the installer, not taken from a wheel: each names the venv's own path (the
# scripts' shebangs, and the RECORD listing their hashes) or the install itself.
INSTALLER_FILES = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json",
                   "uv_build.json")


def fingerprinted(rel: str, entry: dict[str, Any]) -> bool:
    """Part of the content fingerprint: a file a wheel installs under site-packages, as the
    wheel holds it (not bin/ scripts, bytecode, the venv's files or the installer's)."""
    parts = rel.split("/")
    if entry.get("kind") != "wheel" or parts[0] != "lib" or "site-packages" not in parts:
        return False
    return not (len(parts) >= 2 and parts[-2].endswith(".dist-info")
                and parts[-1] in INSTALLER_FILES)


def fingerprint(manifest: dict[str, Any]) -> str:
    """The oracle's content fingerprint: sha256 over the path and sha256 of every file the
    pin's wheels install under site-packages, sorted. What the venv or its installer writes
    with the venv's path in it (bytecode, scripts, RECORD, pyvenv.cfg) is left out, so the
    same pin installed on two hosts, or twice on one, has the same fingerprint."""
    digest = hashlib.sha256()
    for rel in sorted(manifest["files"]):
        entry = manifest["files"][rel]
        if fingerprinted(rel, entry):
            digest.update(f"{rel}\0{entry['sha256']}\n".encode())
    return digest.hexdigest()


def anchor_path(venv: Path) -> Path:
    """Beside the venv, outside it: ``<home>/oracles/<pin key>.anchor.json``."""
    return venv.parent / f"{venv.name}.anchor.json"


def write_anchor(venv: Path, *, manifest_sha256: str, record_sha256: str,
                 content_fingerprint: str) -> None:
    anchor = Anchor(anchor_schema=ANCHOR_SCHEMA, venv=venv.name, manifest_sha256=manifest_sha256,
                    build_record_sha256=record_sha256, content_fingerprint=content_fingerprint,
                    created_utc=layout.utc_now())
    atomic_write_json(anchor_path(venv), anchor.model_dump(mode="json"))


def read_anchor(venv: Path) -> dict[str, Any] | None:
    """The anchor as written (None: missing, or not an anchor this version writes)."""
    try:
        return load_anchor(anchor_path(venv)).model_dump(mode="json")
    except BadInput:
        return None


@dataclass(frozen=True)
class Check:
    mismatches: list[tuple[str, str, str]]
    files: int
    hashed: int
    seconds: float


def check(venv: Path, manifest: dict[str, Any], *, deep: bool = False,
          stop: threading.Event | None = None) -> Check:
    """Compare ``venv`` with its manifest: stat every file, hash those whose size or mtime
    changed (all with ``deep``). Returns (field, expected, found) mismatches. ``stop``: give
    up early (the caller failed meanwhile); the result then says it was not finished."""
    start = time.monotonic()
    files: dict[str, dict[str, Any]] = manifest["files"]
    links: dict[str, str] = manifest["symlinks"]
    seen: set[str] = set()
    bad: list[tuple[str, str, str]] = []
    hashed = 0
    for rel, st, is_link in walk(venv):
        if stop is not None and stop.is_set():
            return Check([("files", "every file checked", "check interrupted")], len(seen),
                         hashed, time.monotonic() - start)
        seen.add(rel)
        if is_link:
            target = os.readlink(venv / rel)
            if links.get(rel) != target:
                bad.append((f"file {rel}", f"symlink to {links[rel]}" if rel in links
                            else "absent", f"symlink to {target}"))
            continue
        entry = files.get(rel)
        if not stat.S_ISREG(st.st_mode):  # never opened: a FIFO would block the check
            bad.append((f"file {rel}", "a regular file" if entry else "absent",
                        "not a regular file (a FIFO, socket or device)"))
            continue
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
    if len(bad) > SHOWN:
        bad = [*bad[:SHOWN], ("files", "no more differences",
                              f"{len(bad) - SHOWN} more not shown")]
    return Check(bad, len(seen), hashed, time.monotonic() - start)


def check_startup(manifest: dict[str, Any], startup: dict[str, str]) -> list[
        tuple[str, str, str]]:
    """The base interpreter's start-up files now (the probe's) against the build's."""
    bad = []
    for path, digest in sorted((manifest.get("startup_outside") or {}).items()):
        now = startup.get(path)
        if now != digest:
            bad.append((f"start-up file {path}", f"sha256 {digest[:16]}...",
                        "missing" if now is None else f"sha256 {now[:16]}..."))
    for path in sorted(set(startup) - set(manifest.get("startup_outside") or {})):
        bad.append((f"start-up file {path}", "absent", "added: Python runs it at start-up"))
    return bad


def load(venv: Path) -> tuple[dict[str, Any] | None, list[tuple[str, str, str]]]:
    """The venv's manifest, checked against its anchor (outside the venv): an edit to a file
    and to its manifest entry together is still seen. Returns (manifest or None, problems)."""
    mpath = path(venv)
    if not mpath.is_file():
        return None, [("file manifest", str(mpath), "missing: built by an oracle-build "
                       "before file manifests; `build_oracle -- --rebuild`")]
    anchor = read_anchor(venv)
    if anchor is None:
        return None, [("anchor", str(anchor_path(venv)), "missing or unreadable: an "
                       "interrupted publish, or built before anchors; `build_oracle -- "
                       "--rebuild`")]
    raw = mpath.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != anchor.get("manifest_sha256"):
        return None, [("file manifest", f"sha256 {str(anchor.get('manifest_sha256'))[:16]}... "
                       f"(the anchor {anchor_path(venv).name})",
                       f"sha256 {digest[:16]}...: the manifest inside the venv was edited")]
    try:
        data = json_value(raw)
    except ValueError:
        return None, [("file manifest", "JSON", "unreadable")]
    problems = []
    if not isinstance(data, dict) or data.get("manifest_schema") != MANIFEST_SCHEMA:
        return None, [("file manifest", f"schema {MANIFEST_SCHEMA}",
                       str(data.get("manifest_schema") if isinstance(data, dict) else data))]
    if fingerprint(data) != anchor.get("content_fingerprint"):
        problems.append(("content fingerprint", str(anchor.get("content_fingerprint")),
                         fingerprint(data)))
    return data, problems


def _startup_note(rel: str) -> str:
    parts = rel.rsplit("/", 2)
    name = parts[-1]
    if name.endswith(".pyc") and len(parts) > 1 and parts[-2] == "__pycache__":
        # Python loads a __pycache__ file only for its source beside the folder, and never
        # runs one at start-up on its own
        return (": bytecode of the module beside __pycache__ (compiled when that module was "
                "imported; Python loads it only with its source, and never at start-up)")
    if name.split(".")[0] in ("sitecustomize", "usercustomize") or name.endswith(".pth"):
        return ": Python runs it at every start-up"
    if name.endswith(".pyc"):
        return ": bytecode Python may load instead of a source"
    return ""


def path(venv: Path) -> Path:
    return layout.record_dir(venv) / MANIFEST


def outside_startup(facts: dict[str, Any], venv: Path) -> dict[str, str]:
    """The probe's start-up files that live outside the venv (the base interpreter's)."""
    real = os.path.realpath(venv)
    return {p: d for p, d in (facts.get("startup_files") or {}).items()
            if not (p == real or p.startswith(real + os.sep))}
