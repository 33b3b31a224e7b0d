"""Real CUDA units of a vLLM source tree, compiled here without a GPU (``oracle-build cuda-
kernels``, ``nox -s cuda_kernels``): the units a spec names (pins/kernels/cuda-source.toml),
for each CUDA target of its pin, with the flags vLLM's own CMake gives them, through the
chain ``ccache -> launcher -> nvcc`` of a real build, in two fresh homes sharing one
compiler cache. What it shows: the toolkit from its lock, objects whose bytes depend on
neither the home nor the process, a second home that compiles nothing the first compiled,
and each object's sm_XX code as cuobjdump lists it, checked by the code that checks a built
wheel.

How the flags are vLLM's: a CMake project of ours (recipe/cuda/units/CMakeLists.txt)
includes the tree's ``cmake/utils.cmake`` and calls its functions in the order vLLM's
CMakeLists.txt does for the units' extension; the two values that CMakeLists.txt sets inline
(the supported architectures for this nvcc's release, and the extension's compile
definitions) are read from it here (``tree_facts``), with the line each came from. Nothing
else of vLLM's build runs: its externals (CUTLASS first) cannot be had here."""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oracle_build.contracts.cudatoolkit import ToolkitWheel
from oracle_build.contracts.pins import ArchiveSource, Pin
from oracle_build.contracts.targets import CudaTarget
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, PreflightFailed
from oracle_build.core.files import sha256_file
from oracle_build.core.log import say
from oracle_build.recipe import archive, toolchain
from oracle_build.recipe.cuda import toolkit as cudatoolkit

PROJECT = Path(__file__).with_name("units") / "CMakeLists.txt"
CMAKE_FLOOR = (3, 26)
# what of the CUDA torch wheel the units compile against: its headers, its CMake package
# (which finds its libraries), and the file whose flags vLLM's CMake asks python for
TORCH_MEMBERS = ("torch/include/", "torch/share/cmake/", "torch/lib/",
                 "torch/utils/cpp_extension.py")
MAX_TORCH_UNPACKED = 8 * 1024**3


# ----------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class TreeFacts:
    supported_archs: str  # CUDA_SUPPORTED_ARCHS for this nvcc's release
    archs_line: int
    definitions: tuple[str, ...]
    definitions_lines: tuple[int, ...]
    skipped: tuple[str, ...]  # definitions under a condition of their own (not taken)


def statements(text: str) -> list[tuple[int, str]]:
    """The CMake commands of a file, one each (a command over several lines joined), with
    the line it starts on; comments dropped."""
    out: list[tuple[int, str]] = []
    current, start, depth = "", 0, 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0] if '"' not in raw.split("#", 1)[0] or "#" not in raw \
            else raw[:_comment_at(raw)]
        if not current.strip():
            current, start = "", n
        current += " " + line.strip()
        depth += line.count("(") - line.count(")")
        if depth <= 0:
            if current.strip():
                out.append((start, " ".join(current.split())))
            current, depth = "", 0
    return out


def _comment_at(raw: str) -> int:
    quoted = False
    for i, c in enumerate(raw):
        if c == '"':
            quoted = not quoted
        elif c == "#" and not quoted:
            return i
    return len(raw)


def tree_facts(tree: Path, release: str, extension: str) -> TreeFacts:
    """CUDA_SUPPORTED_ARCHS as the tree's CMakeLists.txt sets it for nvcc ``release`` (its
    ``CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL`` chain), and ``extension``'s
    ``target_compile_definitions``: those at the extension's own level or under the CUDA
    branch of ``VLLM_GPU_LANG``; one under another condition (a kernel family's arch list)
    is skipped and said."""
    path = tree / "CMakeLists.txt"
    stmts = statements(path.read_text(errors="replace"))
    archs = _supported_archs(stmts, release, path)
    defs: list[str] = []
    at: list[int] = []
    skipped: list[str] = []
    stack: list[str] = []
    call = re.compile(rf"^target_compile_definitions\(\s*{re.escape(extension)}\s+(.*)\)$")
    for n, stmt in stmts:
        m = re.match(r"^(if|elseif|else|endif)\s*\((.*)\)$", stmt, re.IGNORECASE)
        if m:
            word, cond = m.group(1).lower(), m.group(2)
            if word == "if":
                stack.append(cond)
            elif word == "endif" and stack:
                stack.pop()
            elif stack:
                stack[-1] = f"{word} {cond}"
            continue
        c = call.match(stmt)
        if not c:
            continue
        values = [v for v in c.group(1).split() if v.upper() not in ("PRIVATE", "PUBLIC",
                                                                     "INTERFACE")]
        inner = stack[-1] if stack else ""
        if not stack or _cuda_branch(inner) or _extension_level(inner):
            defs += values
            at.append(n)
        else:
            skipped += [f"{v} (line {n}, under if({inner[:80]}))" for v in values]
    if not defs:
        raise BuildFailed(f"{path}: no target_compile_definitions({extension} ...) found",
                          hint="the spec's extension must be one the tree's CMakeLists.txt "
                          "defines")
    return TreeFacts(archs[0], archs[1], tuple(defs), tuple(at), tuple(skipped))


def _cuda_branch(cond: str) -> bool:
    return bool(re.fullmatch(r'VLLM_GPU_LANG STREQUAL "CUDA"', cond))


def _extension_level(cond: str) -> bool:
    # the branch that holds the whole GPU build (CUDA or HIP)
    return bool(re.fullmatch(r'VLLM_GPU_LANG STREQUAL "CUDA" OR VLLM_GPU_LANG STREQUAL "HIP"',
                             cond))


def _supported_archs(stmts: list[tuple[int, str]], release: str,
                     path: Path) -> tuple[str, int]:
    """The first branch of the chain whose ``VERSION_GREATER_EQUAL`` floor ``release`` meets
    (an ``else`` meets any), and the value its ``set(CUDA_SUPPORTED_ARCHS ...)`` gives."""
    want = tuple(int(x) for x in release.split("."))
    branch: tuple[int, ...] | None = None
    chain = False
    for n, stmt in stmts:
        m = re.match(r"^(if|elseif)\s*\(.*CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL "
                     r"(\d+(?:\.\d+)*)\s*\)$", stmt)
        if m:
            chain = True
            branch = tuple(int(x) for x in m.group(2).split("."))
            continue
        if chain and re.match(r"^else\s*\(", stmt):
            branch = (0,)
            continue
        if chain and re.match(r"^endif\s*\(", stmt):
            break
        s = re.match(r'^set\(\s*CUDA_SUPPORTED_ARCHS\s+"([0-9.;+afPTX]+)"\s*\)$', stmt)
        if s and chain and branch is not None:
            if want >= branch:
                return s.group(1), n
            branch = None
    raise BuildFailed(f"{path}: no set(CUDA_SUPPORTED_ARCHS ...) for nvcc {release} found",
                      hint="this tree sets its CUDA architectures in another way than "
                      "vLLM 0.32.0: the units project needs reading it anew")


# ----------------------------------------------------------------------------- torch


def unpack_torch(wheel: Path, dest: Path) -> Path:
    """The parts of the CUDA torch wheel the units compile against, into ``dest`` (which
    gets ``torch/``); plain relative files only, bounded."""
    if (dest / "torch" / "share" / "cmake" / "Torch").is_dir():
        return dest / "torch"
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    shutil.rmtree(part, ignore_errors=True)
    total = 0
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = info.filename
                if name.endswith("/") or not name.startswith(TORCH_MEMBERS):
                    continue
                parts = name.split("/")
                mode = info.external_attr >> 16
                if not all(cudatoolkit.SAFE_PART.fullmatch(p) and p not in (".", "..")
                           for p in parts) or (mode and mode & 0o170000 not in (0, 0o100000)):
                    raise BuildFailed(f"{wheel.name}: member {name[:200]!r} is not a plain "
                                      "relative file: refused")
                total += info.file_size
                if total > MAX_TORCH_UNPACKED:
                    raise BuildFailed(f"{wheel.name}: unpacks past "
                                      f"{MAX_TORCH_UNPACKED / 1e9:.0f} GB: refused")
                target = part.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(target, "xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
        os.replace(part, dest)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildFailed(f"could not unpack {wheel}: {exc}") from None
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return dest / "torch"


def python_flags_check(python: str, torch_root: Path) -> str:
    """vLLM's CMake asks ``python`` for torch's nvcc flags (``get_torch_gpu_compiler_flags``
    imports torch.utils.cpp_extension). A CUDA torch does not import on a host without its
    CUDA libraries; the flags come from one file, so any torch whose copy of that file has
    the same bytes as the CUDA wheel's gives the same flags: checked, or refused."""
    answer = proc.query([python, "-c", "import torch.utils.cpp_extension as m; print(m.__file__)"],
                        timeout=300)
    if not answer.ok:
        raise PreflightFailed(f"{python} cannot import torch.utils.cpp_extension",
                              hint="run through `nox -s cuda_kernels`, whose venv has torch")
    theirs = Path(answer.output.strip().splitlines()[-1])
    ours = torch_root / "utils" / "cpp_extension.py"
    if sha256_file(theirs) != sha256_file(ours):
        raise PreflightFailed(f"{theirs} differs from the CUDA wheel's {ours.name}: torch's "
                              "nvcc flags would not be the CUDA wheel's",
                              hint="use the same torch release in the tool's venv")
    return sha256_file(ours)


# ----------------------------------------------------------------------------- compiling


@dataclass
class Entry:
    unit: str
    arch: str  # the pin's target name (sm_121)
    home: str
    leg: str  # LEGS: which compile of the run
    sha256: str
    seconds: float
    cache: str  # "hit" or "miss"
    sm: list[str]
    path: str  # where the object was left, relative to --out (or the work folder)
    nvcc_arch: str  # what vLLM's CMake resolved the target's arch list to (12.0)


@dataclass
class Report:
    schema: int
    pin: str
    spec: str
    toolkit: dict[str, Any]
    torch: dict[str, str]
    tree: dict[str, Any]
    launcher_sha256: str
    plain_nvcc: bool = False
    entries: list[Entry] = field(default_factory=list)
    configure_seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries"] = [asdict(e) for e in self.entries]
        return d


def tools_on_path(python: str) -> dict[str, str]:
    """cmake (>= 3.26, vLLM's floor), ninja and ccache, from the tool's own venv first."""
    venv_bin = str(Path(python).parent)
    found = {}
    for name in ("cmake", "ninja", "ccache"):
        exe = shutil.which(name, path=f"{venv_bin}:/usr/local/bin:/usr/bin:/bin")
        if not exe:
            raise PreflightFailed(f"no {name} on PATH",
                                  hint="`nox -s cuda_kernels` installs cmake and ninja into "
                                  "its venv; ccache: apt-get install ccache")
        found[name] = exe
    out = proc.query([found["cmake"], "--version"], timeout=30).output
    m = re.search(r"version (\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < CMAKE_FLOOR:
        raise PreflightFailed(f"{found['cmake']} is not CMake >= 3.26 ({out.strip()[:80]})")
    return found


def build_env(python: str, toolkit: cudatoolkit.Toolkit, home: Path, staging: Path,
              arch_list: str, cache: toolchain.CompilerCache) -> dict[str, str]:
    """The environment of the configure and the compiles, made from nothing: what a process
    needs, the toolkit, the target's arch list, the cache's settings and the launcher's one
    variable. Nothing of the caller's reaches it."""
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{Path(python).parent}:{toolkit.cuda_home / 'bin'}:/usr/bin:/bin",
           "HOME": str(home), "TMPDIR": str(tmp), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
           "SOURCE_DATE_EPOCH": "0", "CUDA_HOME": str(toolkit.cuda_home),
           "TORCH_CUDA_ARCH_LIST": arch_list}
    # the home holds the tree, the toolkit and torch's headers (whose __FILE__ its
    # STD_TORCH_CHECKs print): one folder the compilers map to '.' and ccache makes relative
    env.update(cache.env(home, toolchain.path_map(home)))
    env.update(cudatoolkit.launcher_env([home]))
    return env


def configure(tools: dict[str, str], env: dict[str, str], project: Path, build: Path, *,
              tree: Path, python: str, torch_root: Path, facts: TreeFacts, units: list[str],
              extension: str, launcher: Path, toolkit: cudatoolkit.Toolkit,
              build_type: str, log: Path) -> tuple[float, str]:
    started = time.monotonic()
    argv = [tools["cmake"], "-G", "Ninja", "-S", str(project), "-B", str(build),
            f"-DCMAKE_BUILD_TYPE={build_type}", f"-DVLLM_SOURCE_DIR={tree}",
            f"-DVLLM_PYTHON_EXECUTABLE={python}",
            f"-DTORCH_CMAKE_PREFIX={torch_root / 'share' / 'cmake'}",
            f"-DUNITS={';'.join(units)}", f"-DEXTENSION={extension}",
            f"-DCUDA_SUPPORTED_ARCHS={facts.supported_archs}",
            f"-DUNIT_DEFINITIONS={';'.join(facts.definitions)}",
            # setup.py's default (NVCC_THREADS unset: 1)
            "-DNVCC_THREADS=1",
            f"-DCMAKE_CUDA_COMPILER={launcher}",
            f"-DCMAKE_CUDA_COMPILER_LAUNCHER={tools['ccache']}",
            f"-DCMAKE_CXX_COMPILER_LAUNCHER={tools['ccache']}",
            f"-DCUDAToolkit_ROOT={toolkit.cuda_home}", f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}"]
    proc.run(argv, env=env, log=log, echo=False, what="cmake (the units' configure)",
             timeout=1800, hint=f"the configure's log: {log}")
    out = log.read_text(errors="replace")
    m = re.search(r"CUDA supported target architectures: (\S+)", out)
    if not m:
        raise BuildFailed(f"the units' configure printed no supported architectures ({log})")
    return time.monotonic() - started, m.group(1)


def object_targets(ninja: str, build: Path, units: list[str]) -> dict[str, str]:
    """unit -> its object's ninja target (CMake names it after the source's full path)."""
    answer = proc.query([ninja, "-C", str(build), "-t", "targets", "all"], timeout=60)
    if not answer.ok:
        raise BuildFailed(f"ninja -t targets failed in {build}: {answer.output[-400:]}")
    found = {}
    names = [line.split(":", 1)[0] for line in answer.output.splitlines() if ":" in line]
    for unit in units:
        hits = [n for n in names if n.endswith("/" + unit + ".o")]
        if len(hits) != 1:
            raise BuildFailed(f"the units' build has {len(hits)} objects for {unit}")
        found[unit] = hits[0]
    return found


def ninja_seconds(build: Path) -> dict[str, float]:
    """Each output's compile time, from ninja's own log (start and end in ms)."""
    out: dict[str, float] = {}
    log = build / ".ninja_log"
    if not log.is_file():
        return out
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            out[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000.0
    return out


def cache_results(stats_log: Path) -> dict[str, str]:
    """source path -> "hit" / "miss" / "uncached: <why>", from ccache's stats log."""
    out: dict[str, str] = {}
    if not stats_log.is_file():
        return out
    current: str | None = None
    names: list[str] = []

    def close() -> None:
        if current is None:
            return
        if toolchain.HIT & set(names):
            out[current] = "hit"
        elif toolchain.MISS & set(names):
            out[current] = "miss"
        else:
            out[current] = "uncached: " + ", ".join(names[:3])

    for line in stats_log.read_text(errors="replace").splitlines():
        if line.startswith("# "):
            close()
            current, names = line[2:].strip(), []
        elif line.strip():
            names.append(line.strip())
    close()
    return out


def _cache_of(hits: dict[str, str], unit: str) -> str:
    """The cache's answer for ``unit`` (ccache names a source relative to its base_dir)."""
    found = [v for k, v in hits.items() if os.path.normpath(k).endswith("/" + unit)]
    return found[-1] if found else "not seen by ccache"


def compile_target(*, tools: dict[str, str], python: str, home: Path, home_name: str,
                   leg: str, recompile: bool,
                   tree: Path, torch_root: Path, toolkit: cudatoolkit.Toolkit, launcher: Path,
                   facts: TreeFacts, units: list[str], extension: str, target_name: str,
                   target: CudaTarget, build_type: str, cache_folder: Path, out: Path,
                   check_sm: Any) -> tuple[list[Entry], float]:
    staging = home / "stage"
    project = staging / "units"
    project.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROJECT, project / "CMakeLists.txt")
    link = project / "csrc"
    if not link.is_symlink():
        link.symlink_to(tree / "csrc")  # define_extension_target includes <project>/csrc
    build = staging / f"build-{target_name}-{leg}"
    shutil.rmtree(build, ignore_errors=True)
    stats_log = build / "ccache-stats.log"
    cache = toolchain.CompilerCache(tools["ccache"], cache_folder, toolchain.CCACHE_MAXSIZE,
                                    False, stats_log)
    env = build_env(python, toolkit, home, staging, target.torch_cuda_arch_list, cache)
    if recompile:  # compiled anew: the cache's answer is not read (its entry is rewritten)
        env["CCACHE_RECACHE"] = "true"
    seconds, resolved = configure(tools, env, project, build, tree=tree, python=python,
                                  torch_root=torch_root, facts=facts, units=units,
                                  extension=extension, launcher=launcher, toolkit=toolkit,
                                  build_type=build_type, log=build / "configure.log")
    objects = object_targets(tools["ninja"], build, units)
    say(f"  {leg} {target_name}: TORCH_CUDA_ARCH_LIST={target.torch_cuda_arch_list} -> "
        f"vLLM's CMake compiles for {resolved}; {len(units)} units (configure "
        f"{seconds:.1f} s)")
    proc.run([tools["ninja"], "-C", str(build), "-j", str(min(2, os.cpu_count() or 1)),
              *objects.values()], env=env, log=build / "compile.log", echo=False,
             what=f"ninja ({target_name}, {leg})", timeout=7200,
             hint=f"the compile's log: {build / 'compile.log'}")
    times = ninja_seconds(build)
    hits = cache_results(stats_log)
    want = sorted(f"sm_{a.replace('.', '')}" for a in resolved.split(";"))
    entries = []
    for unit in units:
        obj = build / objects[unit]
        stem = unit.rsplit("/", 1)[-1][:-3]
        dest = out / leg / target_name / f"{stem}.o"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(obj, dest)
        sms = check_sm(target, dest, want)
        entries.append(Entry(unit=unit, arch=target_name, home=home_name, leg=leg,
                             sha256=sha256_file(dest), seconds=round(times.get(objects[unit],
                                                                               0.0), 2),
                             cache="recompiled" if recompile else _cache_of(hits, unit),
                             sm=sms,
                             path=str(dest.relative_to(out)), nvcc_arch=resolved))
    return entries, seconds


def check_sm(target_name: str, cuobjdump: str, target: CudaTarget, obj: Path,
             want: list[str]) -> list[str]:
    """The object's sm_XX set (cuobjdump --list-elf) through the check a built wheel gets
    (devices/cuda.py ``compiled``: within the target's expected_sm), and exactly what
    vLLM's CMake resolved the target's arch list to."""
    from oracle_build.devices import cuda as cuda_device

    sms, mismatches = cuda_device.DEVICE.compiled(target, [str(obj)], cuobjdump=cuobjdump)
    if mismatches or sms != want:
        raise BuildFailed(f"{obj}: cuobjdump lists {', '.join(sms or []) or 'no sm_XX code'};"
                          f" vLLM's CMake compiled for {', '.join(want)} and target "
                          f"{target_name} expects only {', '.join(target.expected_sm)}")
    return sms or []


def unpack_tree(sdist: Path, dest: Path) -> Path:
    if not (dest / "CMakeLists.txt").is_file():
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        archive.unpack(sdist, dest)
    return dest


def machine() -> str:
    m = os.uname().machine
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(m, m)


def python_exe() -> str:
    return sys.executable


def fetch_wheel(wheel: ToolkitWheel, downloads: Path, host: str) -> Path:
    f = wheel.files[host]  # type: ignore[index]
    got = archive.fetch(f.url, f.sha256, downloads / f.filename, size=f.size)
    say(f"  {wheel.name} {wheel.version}: {f.filename} ({f.size / 1e6:.0f} MB, "
        f"{'present' if got.origin == 'present' else 'downloaded'}, sha256 {f.sha256[:12]})")
    return got.path


def source_archive(pin: Pin, downloads: Path) -> Path:
    src = pin.model.vllm
    if not isinstance(src, ArchiveSource):
        raise PreflightFailed(f"pin {pin.id} builds no source archive: the units come from "
                              "a release sdist")
    return archive.fetch(src.url, src.sha256, downloads / src.filename, size=src.size).path


# ----------------------------------------------------------------------------- the run

HOMES = ("home-1", "home-2")
# (leg, home, compiled anew without reading the cache): the first home into an empty cache;
# the second home from that cache (the claim: a new home compiles nothing the first did);
# the second home and the first again, each compiling anew (the claim: the same bytes from
# another folder, and from another process in the same folder)
LEGS: tuple[tuple[str, str, bool], ...] = (
    ("home-1", HOMES[0], False), ("home-2", HOMES[1], False),
    ("home-2-anew", HOMES[1], True), ("home-1-again", HOMES[0], True))
SECOND_HOME_HITS = 0.9


@dataclass(frozen=True)
class Outcome:
    report: Report
    same_bytes: bool  # every unit and arch: one sha256 in both homes
    second_home_hits: float  # the share of the second home's compiles the cache answered
    cold_misses: int  # the first home's compiles the cache had to run


def homes_in(work: Path) -> dict[str, Path]:
    """Two homes whose paths differ in name and in length (a folder's length moves offsets
    in an object that holds it)."""
    return {HOMES[0]: work / HOMES[0], HOMES[1]: work / "elsewhere" / "a-longer-folder" /
            HOMES[1]}


def run(spec_path: Path, *, work: Path, out: Path, downloads: Path,
        cache_folder: Path, plain_nvcc: bool = False) -> Outcome:
    """Every leg of LEGS for every target of the spec. ``plain_nvcc``: the control run,
    ccache -> nvcc with no launcher between (what a build without it does)."""
    from oracle_build.contracts.cudatoolkit import load_kernels_spec, load_toolkit
    from oracle_build.contracts.pins import load_pin
    spec = load_kernels_spec(spec_path)
    pin = load_pin(spec_path.parent / spec.pin, check_lock=False)
    host = machine()
    targets: dict[str, CudaTarget] = {}
    for name in spec.targets:
        t = pin.model.targets.get(name)
        if not isinstance(t, CudaTarget) or not t.toolkit:
            raise PreflightFailed(f"{spec_path}: target {name} is not a CUDA target of "
                                  f"{spec.pin} with a toolkit lock")
        targets[name] = t
    lock_names = {t.toolkit for t in targets.values()}
    if len(lock_names) != 1:
        raise PreflightFailed(f"{spec_path}: the targets name {len(lock_names)} toolkits; "
                              "one run compiles with one")
    lock = load_toolkit(pin.path.parent / str(lock_names.pop()))
    python = python_exe()
    tools = tools_on_path(python)
    build_type = pin.model.build.env.get("CMAKE_BUILD_TYPE", "Release")
    say(f"cuda-kernels: {len(spec.units)} units of {pin.model.vllm.runtime_version if isinstance(pin.model.vllm, ArchiveSource) else pin.id} "  # noqa: E501
        f"x {len(targets)} targets, {len(LEGS)} legs in {len(HOMES)} homes; compiler cache "
        f"{cache_folder}")
    sdist = source_archive(pin, downloads)
    torch_wheel = fetch_wheel(spec.torch, downloads, host)
    report: Report | None = None
    entries: list[Entry] = []
    homes = homes_in(work)
    prepared: dict[str, tuple[cudatoolkit.Toolkit, Path, Path, TreeFacts]] = {}
    for leg, home_name, recompile in LEGS:
        home = homes[home_name]
        if home_name not in prepared:
            say(f"{home_name}: {home}")
            home.mkdir(parents=True, exist_ok=True)
            toolkit = cudatoolkit.install(lock, home, downloads, host)
            torch_root = unpack_torch(torch_wheel, home / f"torch-{spec.torch.version}")
            flags_file = python_flags_check(python, torch_root)
            tree = unpack_tree(sdist, home / "stage" / "src")
            prepared[home_name] = (toolkit, torch_root, tree,
                                   tree_facts(tree, toolkit.release, spec.extension))
        toolkit, torch_root, tree, facts = prepared[home_name]
        launcher = toolkit.nvcc if plain_nvcc else \
            home / "toolkits" / lock.folder_name / "launcher" / "nvcc"
        if report is None:
            report = Report(
                schema=1, pin=pin.id, spec=str(spec_path), toolkit=toolkit.as_dict(),
                torch={"wheel": spec.torch.files[host].filename,  # type: ignore[index]
                       "sha256": spec.torch.files[host].sha256,  # type: ignore[index]
                       "cpp_extension_sha256": flags_file},
                tree={"sdist_sha256": pin.model.vllm.sha256 if isinstance(
                          pin.model.vllm, ArchiveSource) else None,
                      "cuda_supported_archs": facts.supported_archs,
                      "cuda_supported_archs_line": f"CMakeLists.txt:{facts.archs_line}",
                      "definitions": list(facts.definitions),
                      "definitions_lines": [f"CMakeLists.txt:{n}" for n in
                                            facts.definitions_lines],
                      "definitions_skipped": list(facts.skipped)},
                launcher_sha256=sha256_file(launcher), plain_nvcc=plain_nvcc)
        elif report.toolkit["digest"] != toolkit.digest or \
                (not plain_nvcc and report.launcher_sha256 != sha256_file(launcher)):
            raise BuildFailed(f"{home_name}'s toolkit or launcher differs from {HOMES[0]}'s: "
                              "one lock must unpack to the same tools")
        for name, target in targets.items():
            got, seconds = compile_target(
                tools=tools, python=python, home=home, home_name=home_name, leg=leg,
                recompile=recompile, tree=tree, torch_root=torch_root, toolkit=toolkit,
                launcher=launcher, facts=facts, units=list(spec.units),
                extension=spec.extension, target_name=name, target=target,
                build_type=build_type, cache_folder=cache_folder, out=out,
                check_sm=functools.partial(check_sm, name, str(toolkit.cuobjdump)))
            report.configure_seconds[f"{leg}/{name}"] = round(seconds, 1)
            entries += got
    assert report is not None
    report.entries = entries
    by_key: dict[tuple[str, str], set[str]] = {}
    for e in entries:
        by_key.setdefault((e.unit, e.arch), set()).add(e.sha256)
    second = [e for e in entries if e.leg == LEGS[1][0]]
    hits = sum(1 for e in second if e.cache == "hit") / max(1, len(second))
    cold = sum(1 for e in entries if e.leg == LEGS[0][0] and e.cache != "hit")
    return Outcome(report, all(len(v) == 1 for v in by_key.values()), hits, cold)
