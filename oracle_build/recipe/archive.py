"""Sources named by their content: a release archive taken by sha256 into the wheelhouse and
unpacked safely, and the git tree id of a folder of files, computed as git computes it, so
that an external is the same external whether it comes as a git mirror at its commit, the
archive `git archive` made, or GitHub's own tag archive (other bytes, the same files): the
way Nix names a source by the hash of its unpacked content, not of the tarball."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from oracle_build.contracts.base import FULL_SHA
from oracle_build.contracts.pins import ARCHIVE_SUFFIXES
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, SourceError
from oracle_build.core.files import open_for_writing, sha256_file
from oracle_build.core.log import say
from oracle_build.recipe.source import GIT_SAFE

CHUNK = 1 << 20
DOWNLOAD_TIMEOUT = 60.0


# ----------------------------------------------------------------------------- git trees


def tree_id(folder: Path) -> str:
    """The git tree id of the files under ``folder``: what git itself gives them (``git add
    -A -f`` into a throwaway repository, then ``git write-tree``), .gitattributes' line-end
    rules included, so it equals ``git rev-parse <commit>^{tree}`` of the commit they came
    from. (oneDNN's `* text=auto` makes a hash of the raw bytes differ: git's own answer is
    the definition.)"""
    with tempfile.TemporaryDirectory(prefix="oracle-build-tree-") as tmp:
        env = {**envmod.build_env(), **envmod.GIT, "GIT_DIR": str(Path(tmp) / "repo"),
               "GIT_WORK_TREE": str(folder), "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        base = ["git", *GIT_SAFE, "-c", "core.autocrlf=false", "-c", "core.safecrlf=false",
                "-c", "core.fsmonitor=false"]
        plain = {k: v for k, v in env.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
        for argv, run_env in (([*base, "init", "-q", "--bare", env["GIT_DIR"]], plain),
                              ([*base, "add", "-A", "-f", "--", "."], env),
                              ([*base, "write-tree"], env)):
            done = proc.query(argv, env=run_env, cwd=folder, timeout=600)
            if not done.ok:
                raise SourceError(f"git could not hash the files of {folder}: "
                                  f"{done.output.strip()[-300:]}")
        found = done.output.strip().splitlines()[-1] if done.output.strip() else ""
        if not FULL_SHA.match(found):
            raise SourceError(f"git write-tree gave {found!r} for {folder}")
        return found


# ----------------------------------------------------------------------------- archives


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES)


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack ``archive`` into ``dest`` (which must not exist): its one top folder becomes
    ``dest``. Members are taken through tarfile's "data" filter (no absolute paths, no
    links out of the tree, no devices, no set-id bits); anything else is refused."""
    if dest.exists():
        raise BuildFailed(f"{dest} already exists; refusing to unpack over it")
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unpack-", dir=dest.parent))
    try:
        try:
            with tarfile.open(archive) as tf:
                tf.extractall(work, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise SourceError(f"{archive} could not be unpacked: {exc}") from None
        tops = list(work.iterdir())
        if len(tops) != 1 or not tops[0].is_dir() or tops[0].is_symlink():
            raise SourceError(f"{archive} does not hold exactly one top folder (found "
                              f"{len(tops)} entries): not a source archive")
        os.rename(tops[0], dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


@dataclass(frozen=True)
class Fetched:
    path: Path
    origin: str  # "present" or the URL it came from


def fetch(url: str, sha256: str, dest: Path, *, size: int | None = None) -> Fetched:
    """``dest`` holding the bytes whose sha256 is ``sha256``: kept when it already does, else
    downloaded (file:// copied) beside it and moved in only once its hash matches. A file
    with other bytes is never used: it is replaced, and said."""
    if dest.is_file() and not dest.is_symlink():
        if sha256_file(dest) == sha256:
            return Fetched(dest, "present")
        say(f"    {dest} does not have sha256 {sha256}: fetching it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    got = 0
    try:
        try:
            # the pin allows https, http and file URLs only (contracts/pins.py _archive_url)
            answer = urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT)  # noqa: S310
            with answer, open_for_writing(part) as out:
                while chunk := answer.read(CHUNK):
                    got += len(chunk)
                    if size is not None and got > size:
                        raise SourceError(f"{url} sent more than the {size} bytes the pin "
                                          "records")
                    h.update(chunk)
                    out.write(chunk)
        except (OSError, ValueError) as exc:
            raise BuildFailed(f"could not fetch {url}: {exc}",
                              hint="a host without this registry needs the archive copied "
                              f"into {dest.parent} (or a wheelhouse that holds it)") from None
        if h.hexdigest() != sha256:
            raise SourceError(f"{url} has sha256 {h.hexdigest()}, the pin says {sha256}: "
                              "not the pinned source")
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return Fetched(dest, url)


# ----------------------------------------------------------------------------- externals


@dataclass(frozen=True)
class Candidate:
    path: Path
    kind: str  # "mirror" or "archive"


def candidates(folder: Path, name: str) -> list[Candidate]:
    """What in ``folder`` may be the external ``name``: its git mirror ``folder/<name>``,
    then archives whose name starts with it (any case), then every other archive."""
    out: list[Candidate] = []
    for mirror in (folder / name, folder / name.lower()):
        if mirror.is_dir() and Candidate(mirror, "mirror") not in out:
            out.append(Candidate(mirror, "mirror"))
    try:
        archives = sorted(p for p in folder.iterdir() if is_archive(p))
    except OSError:
        archives = []
    first = [p for p in archives if p.name.lower().startswith(name.lower())]
    out += [Candidate(p, "archive") for p in first]
    out += [Candidate(p, "archive") for p in archives if p not in first]
    return out
