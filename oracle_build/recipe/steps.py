"""Executing a plan: each step's action runs the step's own commands (``Plan`` is what
``--dry-run`` prints), with checks between them. On failure the staging folder and its
full log stay for inspection; nothing is ever left at the oracle path that could pass for
the oracle."""

from __future__ import annotations

import re
import shutil
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from os import environ
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from oracle_build import devices, host
from oracle_build.contracts.lock import LockEntry
from oracle_build.contracts.pins import ArchiveSource, FromSource, GitSource
from oracle_build.contracts.record import (
    CompilerCacheFacts,
    CompilerFacts,
    ToolchainFacts,
    WheelFacts,
)
from oracle_build.core import env as envmod
from oracle_build.core import layout, proc
from oracle_build.core.env import tool_variable
from oracle_build.core.errors import (
    BuildFailed,
    IdentityMismatch,
    PreflightFailed,
    Unestablished,
    as_data,
)
from oracle_build.core.files import atomic_write_json, dumps_json, sha256_file
from oracle_build.core.layout import utc_now, uv_cache_dir
from oracle_build.core.log import Steps, say
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import uv
from oracle_build.recipe import checkout, record, toolchain
from oracle_build.recipe.model import (
    DOWNLOAD_LIST,
    STAGING_SHOWN,
    TORCH_DOWNLOAD_LIST,
    BuildState,
    Plan,
    Step,
    last_times,
    run_logged,
)
from oracle_build.recipe.wheelhouse import Wheelhouse


def commands(state: BuildState, step: Step) -> None:
    for cmd in step.commands:
        run_logged(state, cmd)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def preflight(state: BuildState, step: Step) -> None:
    p = state.plan
    facts: dict[str, Any] = {}
    p.home.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(p.home).free
    min_free = tool_variable("ORACLE_BUILD_MIN_FREE_GIB", environ)
    need = (float(min_free) if min_free else devices.module(p.target).BUILD_DISK_GIB) * 2**30
    facts["disk_free_bytes"] = free
    if free < need:
        raise PreflightFailed(
            f"{_gib(free)} free at {p.home}, the build needs {_gib(need)}",
            hint="free space or point ORACLE_BUILD_HOME (--home) at a larger disk")
    found = proc.query([uv(), "python", "find", p.pin.model.python],
                       env={**envmod.build_env(), **envmod.UV})
    if not found.ok:
        raise PreflightFailed(
            f"no Python {p.pin.model.python} on this host: pin {p.pin.id} builds its oracle "
            f"venv with python{p.pin.model.python} (the harness itself may run on another)",
            hint=f"install python{p.pin.model.python}: `uv python install "
                 f"{p.pin.model.python}`, `pyenv install {p.pin.model.python}`, or the "
                 f"distribution's python{p.pin.model.python}-venv package")
    facts["python"] = found.output.strip()
    mem = host.available_memory()
    facts["mem_available_bytes"] = mem
    min_mem = tool_variable("ORACLE_BUILD_MIN_MEMORY_GIB", environ)
    floor = (float(min_mem) if min_mem
             else devices.module(p.target).BUILD_MEMORY_FLOOR_GIB) * 2**30
    if mem is not None and mem < floor:
        raise PreflightFailed(f"{_gib(mem)} of host memory available, the build needs "
                              f"{_gib(floor)}", hint="stop other work or lower MAX_JOBS "
                              "(ORACLE_BUILD_MIN_MEMORY_GIB sets the floor)")
    if p.pin.model.build.rust_frontend == "build" and isinstance(p.pin.model.vllm, FromSource):
        for tool in ("cargo", "rustc"):
            answer = proc.query([tool, "--version"], env=envmod.build_env())
            if not answer.ok:
                raise PreflightFailed(f"the pin builds the Rust front end and {tool} does not "
                                      "answer on this host",
                                      hint="install the toolchain rust-toolchain.toml names "
                                      "(rustup), or set [build] rust_frontend = \"skip\"")
            facts[tool] = answer.output.strip()
    devices.module(p.target).preflight(p, facts, host.host())
    state.facts.preflight = facts


# ----------------------------------------------------------------------------- wheels


def _missing(state: BuildState, entries: list[LockEntry]) -> list[LockEntry]:
    wh = state.plan.wheelhouse
    return [e for e in entries if wh.find(e) is None and wh.borrow(e) is None]


def _download(state: BuildState, cmd: proc.Cmd, listing: Path, entries: list[LockEntry], *,
              check: bool) -> None:
    """Run one planned download: ``listing`` (the file its command reads) names
    ``entries``; what arrives is moved in only if its bytes match the lock."""
    p = state.plan
    listing.write_text("".join(e.requirement_line() + "\n" for e in entries))
    incoming = p.wheelhouse.incoming
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir(parents=True)
    try:
        run_logged(state, cmd, check=check,
             hint="the wheels come from this host's pip indexes and the pin's torch index; "
             "a host without them needs a wheelhouse copied from one that has (--wheelhouse)")
        by_key = {(e.key, e.version): e for e in entries}
        for path in sorted(incoming.iterdir()):
            name, version, _b, _t = parse_wheel_filename(path.name)
            entry = by_key.get((canonicalize_name(name), str(version)))
            if entry is not None:
                p.wheelhouse.add(path, origin="downloaded", expected=entry.sha256)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _shared_count(wh: Wheelhouse) -> int:
    return sum(1 for info in wh.files().values() if str(info.get("origin", "")).startswith(
        "shared:")) if wh.manifest_path.exists() else 0


def fetch(state: BuildState, step: Step) -> None:
    p = state.plan
    entries = list(p.pin.require_lock())
    shared = _shared_count(p.wheelhouse)
    missing = _missing(state, entries)
    if _shared_count(p.wheelhouse) > shared:
        say(f"    {_shared_count(p.wheelhouse) - shared} wheels linked from other pins' "
            "wheelhouses (same sha256): not downloaded again")
    if not missing:
        say(f"    all {len(entries)} wheels present in the wheelhouse, hashes verified")
        return
    if state.origin == "wheelhouse":  # a vLLM built from source stays "built"
        state.origin = "fetched"
    say(f"    {len(entries) - len(missing)} of {len(entries)} wheels in the wheelhouse; "
        f"downloading {len(missing)}")
    p.wheelhouse.root.mkdir(parents=True, exist_ok=True)
    rest_cmd, torch_cmd, *torch_index_cmd = step.commands
    torch_entries = [e for e in missing if e.key == "torch"]
    rest = [e for e in missing if e.key != "torch"]
    if rest:
        _download(state, rest_cmd, p.file(DOWNLOAD_LIST), rest, check=True)
    if torch_entries:
        torch_list = p.file(TORCH_DOWNLOAD_LIST)
        _download(state, torch_cmd, torch_list, torch_entries, check=False)
        if torch_index_cmd and _missing(state, torch_entries):
            _download(state, torch_index_cmd[0], torch_list, torch_entries, check=True)
    still = _missing(state, entries)
    if still:
        raise BuildFailed("after download the wheelhouse still lacks: "
                          + ", ".join(f"{e.name}=={e.version}" for e in still))


def write_lock_requirements(state: BuildState, *, exclude: set[str] | None = None) -> None:
    p = state.plan
    exclude = exclude or set()
    lines = [e.requirement_line() for e in p.pin.require_lock() if e.key not in exclude]
    p.file("requirements.lock.txt").write_text("\n".join(lines) + "\n")


def install_locked(state: BuildState, step: Step) -> None:
    write_lock_requirements(state)
    commands(state, step)


def build_requirements(state: BuildState, step: Step) -> None:
    """The requirements the source step read from the clone (pyproject first, torch left to
    the pin and already checked against it there), written outside the tree, installed."""
    p = state.plan
    assert state.tree is not None and state.tree.requirements is not None
    reqs = state.tree.requirements
    # the tree's index options first (a ROCm tree names AMD's wheel index), as pip reads them
    p.file("build-requirements.txt").write_text("\n".join([*reqs.options, *reqs.lines]) + "\n")
    state.facts.build_requirements = reqs.lines
    state.facts.build_requirement_options = reqs.options
    state.facts.build_requirement_sources = reqs.sources
    commands(state, step)


# what a source build's compile command lines take from its environment, every device's
# (recorded with the staging folder's path as <staging>: what the build passed, not where)
FLAG_VARS = ("CMAKE_ARGS", "CMAKE_BUILD_TYPE", "MAX_JOBS", "SOURCE_DATE_EPOCH", "CC", "CXX",
             "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CUDAFLAGS", "HIPFLAGS",
             "CCACHE_BASEDIR", "CCACHE_COMPILERCHECK", "CCACHE_NOHASHDIR", "CCACHE_DEPEND",
             "CCACHE_IGNOREOPTIONS")


def wheel(state: BuildState, step: Step) -> None:
    """The wheel build (its command as planned); around it, what the record needs: the
    versions of the build's cmake and ninja, the flags its command lines take, and what the
    compiler cache gave."""
    p = state.plan
    (cmd,) = step.commands
    env = cmd.environment()
    tools = state.facts.toolchain or ToolchainFacts(compilers={
        r: CompilerFacts.model_validate(c.as_dict()) for r, c in p.compilers.items()})
    bin_dir = p.staging_venv / "bin"
    tools = tools.model_copy(update={
        "cmake": toolchain.tool_version([str(bin_dir / "cmake"), "--version"], env)
        or toolchain.tool_version(["cmake", "--version"], env),
        "ninja": toolchain.tool_version([str(bin_dir / "ninja"), "--version"], env)
        or toolchain.tool_version(["ninja", "--version"], env),
        "flags": {k: env[k].replace(str(p.staging), STAGING_SHOWN) for k in sorted(env)
                  if k in (*FLAG_VARS, *devices.module(p.target).BUILD_FLAG_VARS)}})
    state.facts.toolchain = tools
    state.facts.wheel_environment = envmod.masked(
        {k: v.replace(str(p.staging), STAGING_SHOWN) for k, v in env.items()})
    cc = p.compiler_cache
    if cc is not None and cc.active:
        cc.folder.mkdir(parents=True, exist_ok=True)
        cc.stats_log.unlink(missing_ok=True)
    result = run_logged(state, cmd)
    if cc is not None:
        stats = toolchain.read_stats(cc.stats_log) if cc.active else None
        state.facts.compiler_cache = CompilerCacheFacts(
            described=cc.describe(), folder=str(cc.folder) if cc.active else None,
            cold=cc.cold, hits=stats.hits if stats else None,
            misses=stats.misses if stats else None, other=stats.other if stats else {})
        if stats is not None:
            say(f"    compiler cache: {stats.hits} hits, {stats.misses} misses")
        if cc.cold:
            shutil.rmtree(cc.folder, ignore_errors=True)
    if result.stopped:
        state.stopped = "configure"
        say("    stopped once CMake had configured, as asked (--stop-after configure)")


# what a built version's local segment says, for every device's build
VERSION_HINTS = [
    (re.compile(r"\+.*precompiled"), "VLLM_USE_PRECOMPILED was seen by the build: kernels "
     "came from a nightly wheel"),
    (re.compile(r"\+.*\.d\d{8}"), "the tree was dirty when setuptools-scm ran"),
    (re.compile(r"^0\.1\.dev"), "the clone had no tags or was shallow"),
]


def version_hint(version: str) -> str:
    """What a built version's local segment says: the hints every build shares, then each
    device's (devices.version_hints)."""
    hints = [*VERSION_HINTS, *devices.version_hints()]
    return "; ".join(why for pattern, why in hints if pattern.search(version))


def check_wheel(state: BuildState, step: Step) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, FromSource)
    dist = p.staging / "dist"
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildFailed(f"expected one wheel in {dist}, found {len(wheels)}")
    wheel = wheels[0]
    name, version, _b, _t = parse_wheel_filename(wheel.name)
    want = p.pin.expected_distribution_version(p.target)
    if canonicalize_name(name) != canonicalize_name(src.distribution) or str(version) != want:
        why = version_hint(str(version))
        raise BuildFailed(f"built {name} {version}, the pin expects {src.distribution} {want}"
                          + (f": {why}" if why else ""))
    with zipfile.ZipFile(wheel) as zf:
        members = set(zf.namelist())
        version_py = zf.read("vllm/_version.py").decode(errors="replace") \
            if "vllm/_version.py" in members else ""
    rust = "vllm/vllm-rs" in members
    decision = p.pin.model.build.rust_frontend
    if decision is not None and rust != (decision == "build"):
        raise BuildFailed(f"the pin says rust_frontend = {decision!r}; the wheel "
                          + ("holds" if rust else "lacks") + " vllm/vllm-rs",
                          hint="check cargo on this host and the build log's build_rust lines")
    commit_id = checkout.commit_id_in(version_py)
    pinned = (src.commit if isinstance(src, GitSource)
              else src.commit_id if isinstance(src, ArchiveSource) else "")
    found = commit_id.removeprefix("g") if commit_id else None
    if found and not (pinned.startswith(found) or found.startswith(pinned)):
        raise BuildFailed(f"the wheel's vllm/_version.py names commit {commit_id}, the pin "
                          f"says {pinned}")
    state.wheel = wheel
    state.origin = "built"
    outside = requirements_outside_lock(p, wheel)
    state.facts.wheel = WheelFacts(file=wheel.name, sha256=sha256_file(wheel),
                                   version=str(version), rust_frontend=rust,
                                   commit_id=(f"g{commit_id.removeprefix('g')}" if commit_id
                                              else None),
                                   requirements_outside_lock=outside)
    if outside:
        say(f"    the wheel's metadata requires {len(outside)} distributions the lock does "
            "not hold as asked (the lock is what installs; recorded): "
            + "; ".join(as_data(r) for r in outside[:8]) + (" ..." if len(outside) > 8
                                                            else ""))
    with devices.wheel_libraries(wheel) as (root, libraries):
        compiled = devices.module(p.target).check_wheel(p, libraries, root)
    if compiled is not None:
        state.facts.compiled_arches = compiled
    if not p.compare_only:
        p.wheelhouse.add(wheel, origin="built")


def requirements_outside_lock(p: Plan, wheel: Path) -> list[str] | None:
    """The wheel's Requires-Dist for this target (markers evaluated for its machine and the
    pin's Python, extras left out) that the lock does not satisfy: absent from it (and not
    excluded by the pin), or locked at a version the requirement refuses. None without a
    lock."""
    from packaging.requirements import InvalidRequirement, Requirement

    entries = p.pin.lock_entries
    if entries is None:
        return None
    locked = {e.key: e.version for e in entries}
    excluded = {str(canonicalize_name(n)) for n in p.pin.model.lock_exclude}
    env = {"platform_machine": p.target.machine, "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix",
           "python_version": p.pin.model.python, "python_full_version": p.pin.model.python + ".0",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode(errors="replace") if meta else ""
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            out.append(f"{line.split(':', 1)[1].strip()} (not a requirement packaging reads)")
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        key = str(canonicalize_name(req.name))
        if key in excluded:
            continue
        if req.url:
            out.append(f"{req.name} @ {req.url} (a URL: the lock holds "
                       + (f"{key}=={locked[key]})" if key in locked else "none)"))
        elif key not in locked:
            out.append(f"{req} (not in the lock)")
        elif not req.specifier.contains(locked[key], prereleases=True):
            out.append(f"{req} (the lock holds {locked[key]})")
    return out


def use_built(state: BuildState, step: Step) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, FromSource)
    version = p.pin.expected_distribution_version(p.target)
    wheel = p.wheelhouse.find_built(src.distribution, version)
    if wheel is None:
        raise BuildFailed("the wheelhouse's built vLLM wheel disappeared or was rejected",
                          hint="run the build again: it plans a build from source")
    state.wheel = wheel
    state.origin = "wheelhouse"
    state.facts.wheel = WheelFacts(file=wheel.name, sha256=sha256_file(wheel), version=version)


def install_built(state: BuildState, step: Step) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, FromSource)
    if p.pin.lock_entries is not None:
        write_lock_requirements(state, exclude={str(canonicalize_name(src.distribution))})
    commands(state, step)


# ----------------------------------------------------------------------------- identity


def identity_(state: BuildState, step: Step) -> None:
    """The staged venv's identity; meanwhile (a second core) every file is hashed for the
    manifest the publish step writes."""
    p = state.plan
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="hash") as pool:
        hashing = pool.submit(inventory.hash_files, p.staging_venv, stop)
        try:
            ident = identity.check(
                p.pin, p.target, p.staging_venv, log=p.log, staged=True, no_gpu=p.no_gpu,
                toolkit=str(p.toolkit.cuda_home) if p.toolkit is not None else None)
        except BaseException:
            stop.set()  # a failed or interrupted step does not wait for 3 GB of hashing
            raise
        state.hashed = hashing.result()
    ident.patches = [f.file for f in state.facts.patches or [] if f.applied]
    if not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(p.staging_venv))
    state.identity = ident


def publish(state: BuildState, step: Step) -> None:
    assert state.identity is not None
    state.identity = record.publish(state)


def _remember(p: Plan, name: str, seconds: float) -> None:
    """This step's duration, for the next plan of this pin on this host to say."""
    path = layout.timings_path(p.home, p.pin.key)
    try:
        times = last_times(p.home, p.pin.key)
        times[name] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, times)
    except OSError:
        pass  # a note for the next plan, never a reason to fail this build


def run(p: Plan) -> identity.Identity | None:
    """Execute ``p``. On failure the staging folder and its log stay for inspection. A plan
    with ``stop_after`` ends there (None), its staging folder removed, its log kept under
    the home's logs/."""
    blocked = [b for step in p.steps for b in step.blocked_by]
    if blocked:  # refuse before any work, naming every value the build would need
        raise Unestablished("the build needs values this pin does not establish:\n  "
                            + "\n  ".join(blocked),
                            hint="fill the pin's [[externals]] from a checkout at the pinned "
                            "commit (`oracle-build externals --checkout DIR`) and pass "
                            "--externals DIR (local mirrors)")
    p.staging.mkdir(parents=True, exist_ok=False)
    p.log.write_text(f"# oracle-build {utc_now()}\n# plan\n{p.render()}\n")
    (p.staging / "resolved.json").write_text(dumps_json(p.resolved()))
    state = BuildState(p, Steps(len(p.steps)))
    base = p.base or envmod.BuildBase(environ.get("PATH", ""), str(p.staging / "home"),
                                      str(p.staging / "tmp"))
    envmod.say_dropped_from_build()
    try:
        with envmod.building(base):
            for step in p.steps:
                with state.steps.step(step.name):
                    try:
                        step.action(state, step)
                    finally:  # an install's unpacked wheels: the wheelhouse keeps them
                        shutil.rmtree(uv_cache_dir(p.staging), ignore_errors=True)
                if state.stopped is None and step.name in state.steps.timings:
                    _remember(p, step.name, state.steps.timings[step.name])
                if state.stopped is not None or step.name == p.stop_after:
                    state.stopped = state.stopped or step.name
                    kept = layout.log_path(p.home, "build", p.pin.key)
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(p.log, kept)
                    shutil.rmtree(p.staging, ignore_errors=True)
                    say(f"build stopped after {state.stopped}, as asked: nothing published, "
                        f"the staging folder removed; its log: {kept}")
                    return None
    except BaseException as exc:
        if p.staging.exists():
            say(f"build stopped in step {state.steps.current}/{len(p.steps)}; the staging "
                f"folder and full log are kept for inspection:\n  {p.staging}\n  {p.log}")
            if isinstance(exc, BuildFailed) and exc.log is None:
                exc.message += f"\n  full log: {p.log}"
                exc.log = str(p.log)
        raise
    assert state.identity is not None
    return state.identity
