"""The CUDA toolkit of a build, and its nvcc launcher.

Two kinds, one record. **Wheels**: a lock (contracts/cudatoolkit.py) of NVIDIA's toolkit wheels,
each taken by sha256 into a downloads folder and unpacked once per lock into the home as
``<home>/toolkits/<name>-<digest12>/cuda``, a ``CUDA_HOME`` laid out as NVIDIA's installer
lays one (``bin``, ``include``, ``lib64``, ``nvvm``). **Host**: a toolkit already on the host
(``/usr/local/cuda`` on DGX OS 7). Either way the toolkit is named by nvcc's own version line
and the sha256 of the six tools a compile runs (``TOOLS``); that digest is in the build
record, the toolchain key and the launcher, so that a reimaged host with another 13.0.x is
named as the difference.

The launcher (recipe/cuda/launcher.py, copied as ``<toolkit>/launcher/nvcc``) is the
``CMAKE_CUDA_COMPILER``; ccache runs it, it runs the real nvcc with what makes nvcc's output
independent of the folder and the process."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build.contracts.cudatoolkit import TOOLS, ToolkitLock
from oracle_build.core import filelock, proc
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.core.files import atomic_write_bytes, sha256_file
from oracle_build.core.log import say
from oracle_build.recipe import archive

LAUNCHER_SOURCE = Path(__file__).with_name("launcher.py")
PREFIX_MAP_VARIABLE = "ORACLE_BUILD_NVCC_PREFIX_MAP"
# what a toolkit wheel's files lie under (NVIDIA's CUDA 13 wheels)
WHEEL_ROOT = "nvidia/cu13/"
# an unpacked toolkit's bound (CUDA 13.0.3's wheels named by the shipped lock: 1.1 GB)
MAX_UNPACKED = 16 * 1024**3
SAFE_PART = re.compile(r"^[A-Za-z0-9_.+@-]{1,200}$")
VERSION_LINE = re.compile(r"Cuda compilation tools, release (\d+\.\d+), V(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class Toolkit:
    kind: str  # "wheels" or "host"
    cuda_home: Path
    release: str  # 13.0
    version: str  # 13.0.88, nvcc's V line
    tools: dict[str, str]  # TOOLS path -> sha256
    lock_name: str | None = None
    lock_digest: str | None = None

    @property
    def digest(self) -> str:
        body = json.dumps({"version": self.version, "tools": self.tools}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def nvcc(self) -> Path:
        return self.cuda_home / "bin" / "nvcc"

    @property
    def cuobjdump(self) -> Path:
        return self.cuda_home / "bin" / "cuobjdump"

    def label(self) -> str:
        what = f"lock {self.lock_name} ({self.lock_digest[:12]})" if self.lock_digest else \
            f"host {self.cuda_home}"
        return f"CUDA {self.version}, {what}, tools {self.digest[:12]}"

    def key_part(self) -> str:
        """The toolchain key's part (recipe/toolchain.toolchain_key): nvcc by its version
        and every tool by its bytes."""
        return f"nvcc: V{self.version} (tools sha256 {self.digest[:16]})"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cuda_home": str(self.cuda_home), "release": self.release,
                "version": self.version, "tools": dict(self.tools), "digest": self.digest,
                "lock": self.lock_name, "lock_digest": self.lock_digest}


@dataclass(frozen=True)
class Planned:
    """Where a build's toolkit and launcher will be, known when the plan is made."""

    folder: Path  # <home>/toolkits/<name>-<digest12> (a lock) or <home>/toolkits/host
    cuda_home: Path
    launcher: Path
    lock: ToolkitLock | None  # None: the host's toolkit under cuda_home


def planned(home: Path, lock: ToolkitLock | None, host_cuda_home: str | None) -> Planned:
    if lock is not None:
        folder = home / "toolkits" / lock.folder_name
        return Planned(folder, folder / "cuda", folder / "launcher" / "nvcc", lock)
    folder = home / "toolkits" / "host"
    return Planned(folder, Path(host_cuda_home or "/usr/local/cuda"),
                   folder / "launcher" / "nvcc", None)


def prepare(plan: Planned, downloads: Path, machine: str) -> Toolkit:
    """The build's toolkit step: the lock's wheels unpacked (once per lock in the home), or
    the host's toolkit described; either way its launcher written."""
    if plan.lock is not None:
        toolkit = install(plan.lock, plan.folder.parent.parent, downloads, machine)
    else:
        toolkit = describe(plan.cuda_home, kind="host")
        write_launcher(toolkit, plan.launcher.parent)
    say(f"    CUDA toolkit: {toolkit.label()}")
    say(f"    nvcc launcher: {plan.launcher}")
    return toolkit


def step_about(plan: Planned, machine: str, downloads: Path) -> str:
    """The plan's words for the toolkit step."""
    if plan.lock is not None:
        what = (f"the CUDA toolkit {plan.lock.name}: NVIDIA's wheels for {machine} from "
                f"{downloads} or PyPI, each checked against the lock's sha256, unpacked once "
                f"into {plan.folder}")
    else:
        what = (f"the host's CUDA toolkit under {plan.cuda_home}, named by the sha256 of "
                f"{', '.join(TOOLS)}")
    return f"{what}; the nvcc launcher written to {plan.launcher}"


def plan_lines(plan: Planned, machine: str) -> list[str]:
    """The plan header's lines for the toolkit and the compiler chain."""
    if plan.lock is not None:
        what = (f"{plan.lock.name} (nvcc {plan.lock.nvcc}; {len(plan.lock.wheels)} NVIDIA "
                f"wheels for {machine}, each by sha256) unpacked into {plan.cuda_home}")
    else:
        what = f"the host's under {plan.cuda_home} (named by its tools' sha256)"
    return [f"  CUDA toolkit: {what}",
            f"  CUDA compiler: ccache -> {plan.launcher} (oracle-build's nvcc launcher: prefix "
            f"maps, a fresh --keep-dir, the source's mapped name) -> "
            f"{plan.cuda_home / 'bin' / 'nvcc'}"]


def wheel_env(plan: Planned, staging: Path, path: str) -> dict[str, str]:
    """What the wheel build's environment gets: the toolkit as CUDA_HOME and first on PATH,
    and the folders the launcher maps to '.' (the staging folder, the toolkit's)."""
    return {"CUDA_HOME": str(plan.cuda_home),
            "PATH": f"{plan.cuda_home / 'bin'}{os.pathsep}{path}",
            **launcher_env([staging, plan.folder])}


def cmake_args(plan: Planned) -> list[str]:
    """The launcher as CMake's CUDA compiler: setup.py passes its own
    -DCMAKE_CUDA_COMPILER=$CUDA_HOME/bin/nvcc before CMAKE_ARGS, and the later one wins."""
    return [f"-DCMAKE_CUDA_COMPILER={plan.launcher}"]


# ----------------------------------------------------------------------------- wheels


def install(lock: ToolkitLock, home: Path, downloads: Path, machine: str) -> Toolkit:
    """The lock's toolkit in ``home`` for ``machine``: unpacked once (under a lock, into a
    temporary folder moved in whole), then found again; its wheels taken by sha256 from
    ``downloads`` (fetched there when absent)."""
    folder = home / "toolkits" / lock.folder_name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with filelock.held(folder.parent / f".{lock.folder_name}.lock", what="the toolkit"):
        if not (folder / "cuda" / "bin" / "nvcc").is_file():
            _unpack(lock, folder, downloads, machine)
        else:
            say(f"  toolkit {lock.name}: {folder} (unpacked before)")
        toolkit = describe(folder / "cuda", kind="wheels", lock=lock)
        write_launcher(toolkit, folder / "launcher")
    return toolkit


def _unpack(lock: ToolkitLock, folder: Path, downloads: Path, machine: str) -> None:
    part = folder.with_name(f".{folder.name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    cuda = part / "cuda"
    cuda.mkdir(parents=True)
    started = time.monotonic()
    total = 0
    try:
        for wheel, f in lock.files_for(machine):
            got = archive.fetch(f.url, f.sha256, downloads / f.filename, size=f.size)
            where = "present" if got.origin == "present" else "downloaded"
            say(f"  toolkit {lock.name}: {wheel.name} {wheel.version} ({f.size / 1e6:.0f} MB,"
                f" {where}, sha256 {f.sha256[:12]})")
            total += _extract(got.path, cuda, total)
        _layout(cuda)
        os.replace(part, folder)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    say(f"  toolkit {lock.name}: unpacked {total / 1e9:.2f} GB into {folder} in "
        f"{time.monotonic() - started:.0f} s")


def _extract(wheel: Path, dest: Path, so_far: int) -> int:
    """The files of a toolkit wheel under ``WHEEL_ROOT``, into ``dest``: plain files only
    (a symlink, a path with '..' or a name of odd characters is refused), their mode's
    execute bits kept, the total bounded; a file two wheels both ship must be the same
    bytes."""
    written = 0
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = info.filename
                if not name.startswith(WHEEL_ROOT) or name.endswith("/"):
                    continue
                parts = name[len(WHEEL_ROOT):].split("/")
                mode = info.external_attr >> 16
                if not all(SAFE_PART.fullmatch(p) and p not in (".", "..") for p in parts):
                    raise BuildFailed(f"{wheel.name}: member {name[:200]!r} is not a plain "
                                      "relative path: refused")
                if stat.S_ISLNK(mode) or (mode and not stat.S_ISREG(mode)):
                    raise BuildFailed(f"{wheel.name}: member {name[:200]!r} is not a plain "
                                      "file: refused")
                written += info.file_size
                if so_far + written > MAX_UNPACKED:
                    raise BuildFailed(f"{wheel.name}: the toolkit unpacks past "
                                      f"{MAX_UNPACKED / 1e9:.0f} GB: refused")
                target = dest.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists():
                    if _digest_member(z, info) != sha256_file(target):
                        raise BuildFailed(f"{wheel.name}: {'/'.join(parts)} differs from "
                                          "the same file in another wheel of the lock")
                    continue
                with z.open(info) as src, open(target, "xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(target, 0o755 if mode & 0o111 else 0o644)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as exc:
        raise BuildFailed(f"could not unpack {wheel}: {exc}") from None
    return written


def _digest_member(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    h = hashlib.sha256()
    with z.open(info) as src:
        while chunk := src.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _layout(cuda: Path) -> None:
    """NVIDIA's installer layout from the wheels' (``lib``): ``lib64`` (nvcc looks there,
    as ``bin/../lib64``), and each versioned shared library's unversioned name (CMake's
    FindCUDAToolkit looks for ``libcudart.so``)."""
    lib = cuda / "lib"
    try:
        if lib.is_symlink() or (lib.exists() and not lib.is_dir()):
            raise BuildFailed("the toolkit's wheels hold `lib` as something else than a "
                              "folder: not the layout of NVIDIA's wheels (their bytes match the "
                              "lock; the lock names the wrong files?)")
        if (cuda / "lib64").exists() or (cuda / "lib64").is_symlink():
            raise BuildFailed("the toolkit's wheels hold `lib64` already: not the layout of "
                              "NVIDIA's wheels (they ship `lib`; the tool links `lib64` to it)")
        lib.mkdir(exist_ok=True)
        for path in sorted(lib.iterdir()):
            m = re.fullmatch(r"(lib[A-Za-z0-9_.+-]+?\.so)\.\d+(\.\d+)*", path.name)
            if m and not ((lib / m.group(1)).exists() or (lib / m.group(1)).is_symlink()):
                (lib / m.group(1)).symlink_to(path.name)
        (cuda / "lib64").symlink_to("lib")
    except OSError as exc:  # an input whose bytes match, whose layout does not: named
        raise BuildFailed(f"the toolkit's files could not be laid out under {cuda}: "
                          f"{exc.strerror or exc} ({exc.filename or ''})") from None


# ----------------------------------------------------------------------------- both kinds


def describe(cuda_home: Path, *, kind: str, lock: ToolkitLock | None = None) -> Toolkit:
    """The toolkit under ``cuda_home`` by nvcc's version line and its tools' sha256."""
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.is_file():
        raise PreflightFailed(f"no nvcc under {cuda_home}",
                              hint="install the CUDA 13 toolkit there, or name a lock: "
                              "the target's toolkit")
    answer = proc.query([str(nvcc), "--version"], timeout=60)
    m = VERSION_LINE.search(answer.output)
    if not answer.ok or not m:
        raise PreflightFailed(f"{nvcc} --version gave no 'release X.Y, VX.Y.Z' line")
    tools = {}
    for rel in TOOLS:
        path = cuda_home / rel
        if not path.is_file():
            raise PreflightFailed(f"the toolkit under {cuda_home} has no {rel}")
        tools[rel] = sha256_file(path)
    if lock is not None and m.group(2) != lock.nvcc:
        raise BuildFailed(f"the toolkit under {cuda_home} is nvcc V{m.group(2)}; the lock "
                          f"{lock.name} says {lock.nvcc}")
    return Toolkit(kind, cuda_home, m.group(1), m.group(2), tools,
                   lock.name if lock else None, lock.digest if lock else None)


def launcher_text(toolkit: Toolkit) -> bytes:
    """The launcher's bytes for ``toolkit``: recipe/cuda/launcher.py with its digest; the
    same bytes in every home (ccache keys the objects by them)."""
    text = LAUNCHER_SOURCE.read_text()
    assert text.count('"@TOOLKIT@"') == 1
    return text.replace('"@TOOLKIT@"', f'"{toolkit.digest}"').encode()


def write_launcher(toolkit: Toolkit, folder: Path) -> Path:
    """``folder/nvcc`` (the launcher) and ``folder/toolkit.json`` (what it checks on each
    call: the real nvcc, the size and mtime of each tool the digest covers)."""
    folder.mkdir(parents=True, exist_ok=True)
    seen = {}
    for rel in TOOLS:
        st = (toolkit.cuda_home / rel).stat()
        seen[str(toolkit.cuda_home / rel)] = [st.st_size, st.st_mtime_ns]
    facts = {"digest": toolkit.digest, "nvcc": str(toolkit.nvcc), "tools": seen}
    atomic_write_bytes(folder / "toolkit.json", (json.dumps(facts, indent=1) + "\n").encode())
    exe = folder / "nvcc"
    data = launcher_text(toolkit)
    if not exe.is_file() or exe.read_bytes() != data:
        atomic_write_bytes(exe, data)
    exe.chmod(0o755)
    return exe


def launcher_env(prefix_maps: list[Path]) -> dict[str, str]:
    """The launcher's one setting: the folders it maps to '.' (not in ccache's key),
    separated by ';' (no path a compiler flag can carry holds one)."""
    return {PREFIX_MAP_VARIABLE: ";".join(str(p) for p in prefix_maps)}
