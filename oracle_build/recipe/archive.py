"""Sources named by their content: a release archive taken by sha256 into the wheelhouse and
unpacked safely, and the git tree id of a folder of files, computed as git computes it, so
that an external is the same external whether it comes as a git mirror at its commit, the
archive `git archive` made, or GitHub's own tag archive (other bytes, the same files): the
way Nix names a source by the hash of its unpacked content, not of the tarball."""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from oracle_build.contracts.base import FULL_SHA
from oracle_build.contracts.pins import ARCHIVE_SUFFIXES
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, SourceError, as_data
from oracle_build.core.files import RateFloor, open_for_writing, sha256_file
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


# An archive unpacks to at most this many bytes (its members' sizes summed), or this many
# times its own size when that is more: vLLM 0.32.0's sdist (44.5 MB) unpacks to 120 MiB,
# oneDNN v3.13's (14 MB) to 74 MiB, QuTLASS's (0.3 MB) to 1.3 MiB; a 0.5 MB archive of
# 512 MiB of zeros is refused before a byte of it is written.
UNPACKED_FLOOR = 64 << 20
UNPACKED_RATIO = 16


def unpacked_limit(archive: Path) -> int:
    return max(UNPACKED_FLOOR, UNPACKED_RATIO * archive.stat().st_size)


def _members(tf: tarfile.TarFile, archive: Path, limit: int) -> list[tarfile.TarInfo]:
    """The archive's members, read (not written) up to ``limit`` bytes of content: a `.git`
    entry of any kind at any depth is refused, naming it (a tree never holds one, and a git
    run there later runs whatever its config says), and so is an archive past the limit."""
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in tf:
        parts = member.name.replace("\\", "/").split("/")
        if any(part.lower() == ".git" for part in parts):
            raise SourceError(f"{as_data(str(archive))} holds {as_data(member.name, 200)}: a "
                              "source archive never holds a .git entry (git would run what "
                              "its config says): refused")
        total += max(member.size, 0)
        if total > limit:
            raise SourceError(f"{as_data(str(archive))} unpacks to more than {limit >> 20} MiB "
                              f"(the bound for an archive of {archive.stat().st_size} bytes): "
                              "refused before writing it")
        members.append(member)
    return members


def unpack(archive: Path, dest: Path, *, limit: int | None = None) -> Path:
    """Unpack ``archive`` into ``dest`` (which must not exist): its one top folder becomes
    ``dest``. Members are taken through tarfile's "data" filter (no absolute paths, no
    links out of the tree, no devices, no set-id bits); anything else is refused, and so is
    a `.git` entry anywhere or content past ``limit`` bytes (``unpacked_limit``), both found
    before anything is written."""
    if dest.exists():
        raise BuildFailed(f"{dest} already exists; refusing to unpack over it")
    if not archive.is_file():
        raise SourceError(f"{as_data(str(archive))} is not a regular file")
    limit = unpacked_limit(archive) if limit is None else limit
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.unpack-", dir=dest.parent))
    try:
        try:
            with tarfile.open(archive) as tf:
                members = _members(tf, archive, limit)
                extract_data(tf, members, work, archive)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise SourceError(f"{as_data(str(archive))} could not be unpacked: "
                              f"{as_data(str(exc), 300)}") from None
        tops = list(work.iterdir())
        if len(tops) != 1 or not tops[0].is_dir() or tops[0].is_symlink():
            raise SourceError(f"{as_data(str(archive))} does not hold exactly one top folder "
                              f"(found {len(tops)} entries): not a source archive")
        os.rename(tops[0], dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def extract_data(tf: tarfile.TarFile, members: list[tarfile.TarInfo], work: Path,
                 archive: Path) -> None:
    """``members`` into ``work`` under tarfile's "data" filter (Python >= 3.11.4, 3.10.12,
    3.12). A Python the project admits that predates it (Debian 12's own 3.11.2) gets the
    same rules applied here, member by member against what is already on disk: no absolute
    name, nothing outside ``work`` (through a link extracted before included), no link
    leaving it, no device or FIFO, no set-id, sticky or group/other write bit."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(work, members=members, filter="data")
        return
    root = os.path.realpath(work)
    # the rules are applied here; a tarfile that takes a filter but lacks the data one is
    # told so (else Python 3.12+ warns that it extracts unfiltered)
    trusted: dict[str, Any] = ({"filter": "fully_trusted"} if "filter" in
                               inspect.signature(tf.extract).parameters else {})
    for member in members:
        target = _data_checked(member, root, archive)
        tf.extract(member, work, set_attrs=False, **trusted)
        if member.isreg() and not os.path.islink(target):
            mode = (member.mode & 0o755) | 0o600
            if not mode & 0o100:
                mode &= ~0o111
            os.chmod(target, mode)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _data_checked(member: tarfile.TarInfo, root: str, archive: Path) -> str:
    """Where ``member`` lands, when the data filter's rules let it (else SourceError)."""
    def refuse(why: str) -> SourceError:
        return SourceError(f"{as_data(str(archive))}: member {as_data(member.name, 200)} "
                           f"{why}: refused (tarfile's data filter rules)")

    name = member.name.replace("\\", "/")
    if name.startswith("/") or os.path.isabs(name):
        raise refuse("has an absolute name")
    target = os.path.realpath(os.path.join(root, name))
    if not _inside(target, root):
        raise refuse("would be written outside the tree")
    if member.ischr() or member.isblk() or member.isfifo() or not (
            member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise refuse("is a device, a FIFO or another special file")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise refuse("is a link to an absolute path")
        pointed = os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))
        if not _inside(pointed, root):
            raise refuse("is a link out of the tree")
    elif member.islnk():
        pointed = os.path.realpath(os.path.join(root, member.linkname))
        if not _inside(pointed, root):
            raise refuse("is a hard link out of the tree")
    return target


@dataclass(frozen=True)
class Fetched:
    path: Path
    origin: str  # "present" or the URL it came from


# A download that stalls or crawls is stopped (curl's --speed-limit/--speed-time): less than
# SPEED_LIMIT bytes a second over any SPEED_TIME seconds, or nothing at all for
# DOWNLOAD_TIMEOUT seconds (a read's own timeout); with no size in the pin, it stops at
# MAX_DOWNLOAD bytes (a release archive or a toolkit wheel is far below).
SPEED_LIMIT = 10_000
SPEED_TIME = 60.0
MAX_DOWNLOAD = 16 << 30


def _open_url(url: str) -> IO[bytes]:
    """The URL's bytes: a file:// URL only as a regular file (a FIFO there would block the
    build for ever, a device never end), opened without waiting; http(s) by urllib."""
    if url.startswith("file://"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SourceError(f"{as_data(url)}: not a regular file (a FIFO, a device or a "
                              "socket): only a file's bytes are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    # the pin allows https, http and file URLs only (contracts/pins.py _archive_url)
    return urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT)  # type: ignore[no-any-return]  # noqa: S310


def fetch(url: str, sha256: str, dest: Path, *, size: int | None = None) -> Fetched:
    """``dest`` holding the bytes whose sha256 is ``sha256``: kept when it already does, else
    downloaded (file:// copied) beside it and moved in only once its hash matches. A file
    with other bytes is never used: it is replaced, and said. A download past the pin's
    ``size`` (or MAX_DOWNLOAD), or slower than SPEED_LIMIT over SPEED_TIME, stops, named."""
    if dest.is_file() and not dest.is_symlink():
        if sha256_file(dest) == sha256:
            return Fetched(dest, "present")
        say(f"    {dest} does not have sha256 {sha256}: fetching it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    got = 0
    bound = size if size is not None else MAX_DOWNLOAD
    shown = as_data(url, 300)
    try:
        try:
            answer = _open_url(url)
            floor = RateFloor(SPEED_LIMIT, SPEED_TIME)
            with answer, open_for_writing(part) as out:
                while chunk := answer.read(CHUNK):
                    got += len(chunk)
                    if got > bound:
                        raise SourceError(
                            f"{shown} sent more than the {bound} bytes "
                            + ("the pin records (vllm.size)" if size is not None else
                               "a download may be (no size in the pin)"))
                    h.update(chunk)
                    out.write(chunk)
                    if (slow := floor.slow(got)) is not None:
                        raise SourceError(
                            f"{shown}: {slow[0]:.0f} bytes a second over the last "
                            f"{slow[1]:.0f} s, below the {SPEED_LIMIT} a download must "
                            f"keep ({got} bytes in): stopped")
        except SourceError:
            raise
        except (OSError, ValueError) as exc:
            raise BuildFailed(f"could not fetch {shown}: {as_data(str(exc), 300)}",
                              hint="a host without this registry needs the archive copied "
                              f"into {dest.parent} (or a wheelhouse that holds it)") from None
        if h.hexdigest() != sha256:
            raise SourceError(f"{shown} has sha256 {h.hexdigest()}, the pin says {sha256}: "
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
