"""build_oracle: plan(pin, target) -> ordered steps (commands and environment);
run(plan) executes them in a staging folder and moves the venv into place only
after its identity passes.

The plan is data: ``--dry-run`` prints it for any pin and target on any host,
and tests assert on the sm_121 / sm_110 plans that only a GPU host can run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename
from uv import find_uv_bin

from oracle_build import identity, proc, source
from oracle_build.errors import (
    BuildFailed,
    IdentityMismatch,
    PreflightFailed,
    Unestablished,
)
from oracle_build.files import atomic_write_json, dumps_json, sha256_file
from oracle_build.locks import held
from oracle_build.log import Steps, fmt_seconds, say
from oracle_build.meta import host_facts, tool_facts, utc_now
from oracle_build.pins import GitSource, LockEntry, Pin, Target, WheelSource
from oracle_build.targets import detect_host, meminfo
from oracle_build.wheelhouse import Wheelhouse

RECORD_SCHEMA = 1
RECORD_DIR = "oracle-build"  # inside the venv
DISK_NEED_GIB = {"cpu": 8.0, "cuda": 60.0}
BUILD_MEMORY_FLOOR_GIB = {"cpu": 2.0, "cuda": 16.0}
UV_VERSION = "0.13.9"


def default_home() -> Path:
    env = os.environ.get("ORACLE_BUILD_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(xdg) / "oracle-build").resolve()


def default_wheelhouse(home: Path) -> Path:
    env = os.environ.get("ORACLE_BUILD_WHEELHOUSE")
    return Path(env).expanduser().resolve() if env else home / "wheelhouse"


def oracle_path(home: Path, pin: Pin) -> Path:
    return home / "oracles" / pin.key


@dataclass(frozen=True)
class Cmd:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # overlay on the scrubbed environment
    unset: tuple[str, ...] = ()
    cwd: str | None = None
    what: str = ""

    def render(self) -> list[str]:
        lines = [f"      {k}={v}" for k, v in sorted(self.env.items())]
        lines += [f"      unset {k}" for k in self.unset]
        if self.cwd:
            lines.append(f"      (cd {self.cwd})")
        import shlex

        lines.append("      $ " + shlex.join(self.argv))
        return lines


@dataclass
class Step:
    name: str
    action: str  # what run() does: "commands" or an internal action name
    about: str
    commands: list[Cmd] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)  # unestablished pin values it needs


@dataclass
class Plan:
    pin: Pin
    target_name: str
    target: Target
    home: Path
    venv: Path  # final location
    staging: Path
    wheelhouse: Wheelhouse
    mirror: str | None
    externals_dir: Path | None
    steps: list[Step]
    build_env: dict[str, str]
    from_wheelhouse: bool

    @property
    def staging_venv(self) -> Path:
        return self.staging / "venv"

    @property
    def log(self) -> Path:
        return self.staging / "build.log"

    def resolved(self) -> dict[str, Any]:
        """Everything the build is about to use; printed first, recorded last."""
        src = self.pin.model.vllm
        return {
            "pin": str(self.pin.path),
            "pin_id": self.pin.id,
            "pin_hash": self.pin.content_hash,
            "target": self.target_name,
            "device": self.target.device,
            "vllm": (f"git {src.repository} @ {src.commit}" if isinstance(src, GitSource)
                     else f"wheel {src.distribution}=={src.version} sha256:{src.sha256}"),
            "expected_runtime_version": self.pin.expected_runtime_version(),
            "python": self.pin.model.python,
            "torch": self.pin.model.torch.version if self.pin.model.torch else None,
            "packages": dict(self.pin.model.packages),
            "venv": str(self.venv),
            "staging": str(self.staging),
            "wheelhouse": str(self.wheelhouse.root),
            "mirror": self.mirror,
            "externals_dir": str(self.externals_dir) if self.externals_dir else None,
            "build_env": dict(sorted(self.build_env.items())),
            "from_wheelhouse": self.from_wheelhouse,
        }

    def render(self) -> str:
        lines = [f"build plan for pin {self.pin.id} ({self.pin.key}), target {self.target_name}"]
        for key, value in self.resolved().items():
            if key == "build_env":
                continue
            lines.append(f"  {key}: {value}")
        for index, step in enumerate(self.steps, start=1):
            lines.append(f"  [{index}/{len(self.steps)}] {step.name}: {step.about}")
            for blocked in step.blocked_by:
                lines.append(f"      REFUSES TO RUN: {blocked}")
            for cmd in step.commands:
                lines += cmd.render()
        return "\n".join(lines)


def uv() -> str:
    return find_uv_bin()


def uv_env() -> dict[str, str]:
    """uv reads no user config; the pin and the lock say where everything comes from."""
    return {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}


def scrubbed_env() -> dict[str, str]:
    drop = set(identity.SCRUBBED_ENV)
    env = {k: v for k, v in os.environ.items() if k not in drop
           and not k.startswith(("UV_", "SETUPTOOLS_SCM_PRETEND", "VLLM_USE_PRECOMPILED"))}
    return env


def wheel_build_env(pin: Pin, target: Target, plan_externals: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    env.update(pin.model.build.env)
    env.update(target.build_env)
    if target.device == "cuda" and target.torch_cuda_arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = target.torch_cuda_arch_list
    if pin.model.build.cmake_args:
        env["CMAKE_ARGS"] = " ".join(pin.model.build.cmake_args)
    env.update(plan_externals)
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, no find-links, no cache: build what is here
    env["PIP_NO_CACHE_DIR"] = "1"
    return env


def plan(
    pin: Pin,
    target_name: str,
    *,
    home: Path,
    wheelhouse_root: Path,
    mirror: str | None = None,
    externals_dir: Path | None = None,
) -> Plan:
    target = pin.target(target_name)
    venv = oracle_path(home, pin)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    staging = home / "staging" / f"{pin.key}.{stamp}"
    wh = Wheelhouse.for_pin(wheelhouse_root, pin)
    svenv = staging / "venv"
    py = str(svenv / "bin" / "python")
    src = pin.model.vllm
    steps: list[Step] = []
    uvx = uv()
    ext_env: dict[str, str] = {}
    build_env: dict[str, str] = {}
    from_wheelhouse = False

    steps.append(Step("preflight", "preflight",
                      "disk space, Python, host memory; for CUDA the toolkit, nvcc and driver"))
    steps.append(Step("venv", "commands", f"create the staging venv (python {pin.model.python})",
                      [Cmd([uvx, "venv", "--python", pin.model.python, "--no-project",
                            str(svenv)], env=uv_env())]))
    req_file = staging / "requirements.lock.txt"

    if isinstance(src, WheelSource):
        steps.append(Step(
            "fetch", "fetch",
            f"put every locked wheel in the wheelhouse {wh.root}, each checked against its "
            "sha256 (download only what is missing or bad)",
            [Cmd([sys.executable, "-m", "pip", "download", "--no-deps",
                  "--require-hashes", "-r", str(staging / "missing.txt"), "-d",
                  str(wh.root / "incoming")])]))
        steps.append(Step(
            "install", "commands", "install the locked set offline from the wheelhouse",
            [Cmd([uvx, "pip", "install", "--python", py, "--offline", "--no-index",
                  "--find-links", str(wh.root), "--no-deps", "--require-hashes",
                  "-r", str(req_file)], env=uv_env())]))
    else:
        assert isinstance(src, GitSource)
        built = wh.find_built(src.distribution, src.expected_distribution_version) \
            if wh.manifest_path.exists() else None
        from_wheelhouse = built is not None
        origin = mirror or src.repository
        if not from_wheelhouse:
            steps.append(Step(
                "source", "source",
                f"clone {origin} (full history, tags), check out {src.commit}, assert HEAD, "
                "full history and a clean tree",
                [Cmd(["git", "clone", "--no-checkout", "--", origin, str(staging / "src")]),
                 Cmd(["git", "fetch", "--tags", "origin"], cwd=str(staging / "src")),
                 Cmd(["git", "checkout", "--detach", src.commit], cwd=str(staging / "src"))]))
            blocked = []
            ext_cmds = []
            for ext in pin.model.externals:
                local = str(staging / "externals" / ext.name)
                ext_env[ext.src_dir_var] = local
                if not ext.established:
                    blocked.append(f"externals.{ext.name}.commit is unestablished: "
                                   f"{ext.commit.reason}")  # type: ignore[union-attr]
                    continue
                mirror_path = (externals_dir / ext.name) if externals_dir else ext.repository
                ext_cmds.append(Cmd(["git", "clone", "--no-checkout", "--", str(mirror_path),
                                     local]))
                ext_cmds.append(Cmd(["git", "checkout", "--detach", str(ext.commit)],
                                    cwd=local))
            if pin.model.externals:
                if externals_dir is None:
                    blocked.append("no --externals DIR of local mirrors given; with "
                                   "FETCHCONTENT_FULLY_DISCONNECTED=ON CMake cannot fetch them")
                steps.append(Step(
                    "externals", "externals",
                    "local copies of the CMake FetchContent externals at their pinned commits",
                    ext_cmds, blocked))
            build_env = wheel_build_env(pin, target, ext_env)
            if pin.model.torch is not None:
                steps.append(Step(
                    "torch", "commands", f"install the pinned torch from {pin.model.torch.index}",
                    [Cmd([uvx, "pip", "install", "--python", py,
                          f"torch=={pin.model.torch.version}", "--index-url",
                          pin.model.torch.index], env=uv_env())]))
            steps.append(Step(
                "build-requirements", "build_requirements",
                f"install pip=={pin.model.build.pip} and the checkout's "
                f"{pin.model.build.build_requirements} (minus torch), read without modifying "
                "the tree",
                [Cmd([uvx, "pip", "install", "--python", py, f"pip=={pin.model.build.pip}",
                      "-r", str(staging / "build-requirements.txt")], env=uv_env())]))
            steps.append(Step(
                "wheel", "commands",
                "build the vLLM wheel from the checkout: no build isolation, no cached wheel, "
                "VLLM_USE_PRECOMPILED removed from the environment",
                [Cmd([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                      "--no-cache-dir", "--verbose", "-w", str(staging / "dist"),
                      str(staging / "src")], env=build_env,
                     unset=("VLLM_USE_PRECOMPILED", "SETUPTOOLS_SCM_PRETEND_VERSION"),
                     what="pip wheel (vLLM build)")]))
            steps.append(Step(
                "check-wheel", "check_wheel",
                "the wheel's version is the pin's distribution version; its sha256 is recorded"
                + ("; the sm_XX set in the configure log and in the built libraries "
                   "(cuobjdump --list-elf) is the target's" if target.device == "cuda" else "")))
        else:
            steps.append(Step("wheelhouse", "noop",
                              f"use the vLLM wheel built earlier for this pin: {built}"))
        install_cmds = [Cmd([uvx, "pip", "install", "--python", py, "--no-deps",
                             str(staging / "dist" / "<vllm wheel>")], env=uv_env())]
        if pin.lock_entries is not None:
            install_cmds.append(Cmd([uvx, "pip", "install", "--python", py, "--offline",
                                     "--no-index", "--find-links", str(wh.root), "--no-deps",
                                     "--require-hashes", "-r", str(req_file)], env=uv_env()))
        else:
            pinned = [f"{n}=={v}" for n, v in pin.model.packages.items()]
            torch_args = (["--extra-index-url", pin.model.torch.index,
                           "--index-strategy", "unsafe-best-match"]
                          if pin.model.torch else [])
            install_cmds[0] = Cmd([uvx, "pip", "install", "--python", py,
                                   str(staging / "dist" / "<vllm wheel>"), *pinned,
                                   *([f"torch=={pin.model.torch.version}"]
                                     if pin.model.torch else []), *torch_args], env=uv_env())
        steps.append(Step("install", "install_built",
                          "install the wheel (not editable) and the runtime dependencies "
                          + ("from the lock, offline" if pin.lock_entries is not None else
                             "at the pin's exact versions (no lock: every installed "
                             "distribution is recorded)"), install_cmds))

    steps.append(Step("identity", "identity",
                      "probe the staging venv with its own python from a neutral directory"))
    steps.append(Step("publish", "publish",
                      f"write the build record, keep the wheels, move the venv to {venv}, "
                      "re-check identity there"))
    return Plan(pin, target_name, target, home, venv, staging, wh, mirror, externals_dir,
                steps, build_env, from_wheelhouse)


# ----------------------------------------------------------------------------- execution


@dataclass
class BuildState:
    plan: Plan
    steps: Steps
    facts: dict[str, Any] = field(default_factory=dict)
    wheel: Path | None = None
    origin: str = "wheelhouse"


def _run_cmd(state: BuildState, cmd: Cmd, *, hint: str | None = None) -> proc.Result:
    env = scrubbed_env()
    for key in cmd.unset:
        env.pop(key, None)
    env.update(cmd.env)
    return proc.run(cmd.argv, env=env, cwd=Path(cmd.cwd) if cmd.cwd else None,
                    log=state.plan.log, what=cmd.what or None, hint=hint)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def preflight(p: Plan) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    p.home.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(p.home).free
    min_free = os.environ.get("ORACLE_BUILD_MIN_FREE_GIB")
    need = (float(min_free) if min_free else DISK_NEED_GIB[p.target.device]) * 2**30
    facts["disk_free_bytes"] = free
    if free < need:
        raise PreflightFailed(
            f"{_gib(free)} free at {p.home}, the build needs {_gib(need)}",
            hint="free space or point ORACLE_BUILD_HOME (--home) at a larger disk")
    found = proc.run([uv(), "python", "find", p.pin.model.python], env={**scrubbed_env(),
                     **uv_env()}, capture=True, check=False, echo=False)
    if found.returncode != 0:
        raise PreflightFailed(
            f"no Python {p.pin.model.python} on this host: pin {p.pin.id} builds its oracle "
            f"venv with python{p.pin.model.python} (the harness itself may run on another)",
            hint=f"install python{p.pin.model.python}: `uv python install "
                 f"{p.pin.model.python}`, `pyenv install {p.pin.model.python}`, or the "
                 f"distribution's python{p.pin.model.python}-venv package")
    facts["python"] = found.output.strip()
    mem = meminfo().get("MemAvailable")
    facts["mem_available_bytes"] = mem
    floor = BUILD_MEMORY_FLOOR_GIB[p.target.device] * 2**30
    if mem is not None and mem < floor:
        raise PreflightFailed(f"{_gib(mem)} of host memory available, the build needs "
                              f"{_gib(floor)}", hint="stop other work or lower MAX_JOBS")
    if p.target.device == "cuda":
        cuda_home = p.build_env.get("CUDA_HOME") or os.environ.get("CUDA_HOME")
        if not cuda_home or not (Path(cuda_home) / "bin" / "nvcc").exists():
            raise PreflightFailed(f"no nvcc under CUDA_HOME={cuda_home}",
                                  hint="install the CUDA 13 toolkit or fix [build.env].CUDA_HOME")
        from oracle_build.meta import nvcc_version

        facts["nvcc"] = nvcc_version(cuda_home)
        host = detect_host()
        facts["driver"] = host.gpus[0].driver if host.gpus else None
        if not host.gpus:
            raise PreflightFailed("no NVIDIA driver answers (nvidia-smi)")
    return facts


def _missing_entries(state: BuildState, entries: list[LockEntry]) -> list[LockEntry]:
    wh = state.plan.wheelhouse
    return [e for e in entries if wh.find(e) is None]


def _download(state: BuildState, entries: list[LockEntry], *, index: str | None,
              check: bool) -> None:
    p = state.plan
    incoming = Path(tempfile.mkdtemp(prefix="incoming-", dir=p.wheelhouse.root))
    listing = p.staging / "download.txt"
    listing.write_text("".join(e.requirement_line() + "\n" for e in entries))
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "--progress-bar", "off", "-r", str(listing), "-d", str(incoming)]
    if index is not None:
        argv += ["--index-url", index, "--retries", "1", "--timeout", "30"]
    try:
        proc.run(argv, log=p.log, what="pip download", check=check,
                 hint="the wheels come from this host's pip indexes and the pin's torch index; "
                 "a host without them needs a wheelhouse copied from one that has "
                 "(--wheelhouse)")
        by_key = {(e.key, e.version): e for e in entries}
        for path in sorted(incoming.iterdir()):
            name, version, _b, _t = parse_wheel_filename(path.name)
            entry = by_key.get((canonicalize_name(name), str(version)))
            if entry is not None:
                p.wheelhouse.add(path, origin="downloaded", expected=entry.sha256)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def fetch(state: BuildState) -> None:
    p = state.plan
    entries = list(p.pin.require_lock())
    missing = _missing_entries(state, entries)
    if not missing:
        say(f"    all {len(entries)} wheels present in the wheelhouse, hashes verified")
        return
    state.origin = "fetched"
    say(f"    {len(entries) - len(missing)} of {len(entries)} wheels in the wheelhouse; "
        f"downloading {len(missing)}")
    p.wheelhouse.root.mkdir(parents=True, exist_ok=True)
    # Where a wheel comes from does not matter, only its hash: first this host's pip
    # configuration (PyPI, local mirrors, find-links); the pin's torch index only for torch,
    # and only if torch is still missing (an unreachable index would be retried per package).
    torch_entries = [e for e in missing if e.key == "torch"]
    rest = [e for e in missing if e.key != "torch"]
    if rest:
        _download(state, rest, index=None, check=True)
    if torch_entries:
        _download(state, torch_entries, index=None, check=False)
        if p.pin.model.torch is not None and _missing_entries(state, torch_entries):
            _download(state, torch_entries, index=p.pin.model.torch.index, check=True)
    still = _missing_entries(state, entries)
    if still:
        raise BuildFailed("after download the wheelhouse still lacks: "
                          + ", ".join(f"{e.name}=={e.version}" for e in still))


def write_requirements(state: BuildState, exclude: set[str] | None = None) -> Path:
    p = state.plan
    exclude = exclude or set()
    path = p.staging / "requirements.lock.txt"
    lines = [e.requirement_line() for e in p.pin.require_lock() if e.key not in exclude]
    path.write_text("\n".join(lines) + "\n")
    return path


def do_source(state: BuildState) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, GitSource)
    facts = source.clone_at(p.mirror or src.repository, p.staging / "src", src.commit,
                            log=p.log)
    state.facts["source"] = facts.as_dict()
    say(f"    HEAD {facts.commit}  ({facts.describe})")
    declared = source.scan_externals(p.staging / "src")
    state.facts["externals_declared"] = declared
    pinned = {e.name: e for e in p.pin.model.externals}
    for dec in declared:
        ext = pinned.get(dec["name"])
        if ext is not None and ext.established and ext.commit != dec["commit"]:
            raise BuildFailed(
                f"external {dec['name']}: the checkout declares {dec['commit']} "
                f"({dec['source']}), the pin says {ext.commit}",
                hint="the pin's externals must be read from this commit's cmake files "
                "(`oracle-build externals --checkout ...`)")


def do_externals(state: BuildState) -> None:
    p = state.plan
    for ext in p.pin.model.externals:
        assert isinstance(ext.commit, str)
        origin = str(p.externals_dir / ext.name) if p.externals_dir else ext.repository
        facts = source.clone_at(origin, p.staging / "externals" / ext.name, ext.commit,
                                log=p.log)
        state.facts.setdefault("externals", {})[ext.name] = facts.as_dict()


def do_build_requirements(state: BuildState, step: Step) -> None:
    p = state.plan
    req = p.staging / "src" / p.pin.model.build.build_requirements
    if not req.is_file():
        raise BuildFailed(f"the checkout has no {p.pin.model.build.build_requirements}")
    lines = source.read_requirements(req)
    (p.staging / "build-requirements.txt").write_text("\n".join(lines) + "\n")
    state.facts["build_requirements"] = lines
    for cmd in step.commands:
        _run_cmd(state, cmd)


VERSION_HINTS = [
    (re.compile(r"\+.*precompiled"), "VLLM_USE_PRECOMPILED was seen by the build: kernels "
     "came from a nightly wheel"),
    (re.compile(r"\+.*\.d\d{8}"), "the tree was dirty when setuptools-scm ran"),
    (re.compile(r"\+.*\.cu\d+"), "nvcc's CUDA differs from VLLM_MAIN_CUDA_VERSION at this "
     "commit; if this is the intended toolkit, set the pin's distribution_version to it "
     "after review"),
    (re.compile(r"^0\.1\.dev"), "the clone had no tags or was shallow"),
]


def version_hint(version: str) -> str:
    return "; ".join(why for pattern, why in VERSION_HINTS if pattern.search(version))


def check_wheel(state: BuildState) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, GitSource)
    wheels = sorted((p.staging / "dist").glob("*.whl"))
    if len(wheels) != 1:
        raise BuildFailed(f"expected one wheel in {p.staging / 'dist'}, found {len(wheels)}")
    wheel = wheels[0]
    name, version, _b, _t = parse_wheel_filename(wheel.name)
    want = src.expected_distribution_version
    if canonicalize_name(name) != canonicalize_name(src.distribution) or str(version) != want:
        why = version_hint(str(version))
        raise BuildFailed(f"built {name} {version}, the pin expects {src.distribution} {want}"
                          + (f": {why}" if why else ""))
    state.wheel = wheel
    state.origin = "built"
    state.facts["wheel"] = {"file": wheel.name, "sha256": sha256_file(wheel),
                            "version": str(version)}
    if p.target.device == "cuda":
        check_compiled_arches(state, wheel)


def configure_arches(log_text: str) -> dict[str, str]:
    out = {}
    for line in log_text.splitlines():
        for key in ("CUDA supported target architectures", "CUDA target architectures"):
            if key + ":" in line:
                out[key] = line.split(key + ":", 1)[1].strip()
    return out


def check_compiled_arches(state: BuildState, wheel: Path) -> None:
    p = state.plan
    cfg = configure_arches(p.log.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix="wheel-so-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            libs = [n for n in zf.namelist() if n.endswith(".so")]
            for n in libs:
                zf.extract(n, tmp)
        sms = identity.cuobjdump_sm([str(Path(tmp) / n) for n in libs])
    state.facts["compiled_arches"] = {"configure_log": cfg, "cuobjdump": sms}
    allowed = set(p.target.expected_sm)
    if not sms or not set(sms) <= allowed:
        raise BuildFailed(
            f"the wheel's libraries hold {', '.join(sms) or 'no sm_XX code'}; target "
            f"{p.target_name} expects only {', '.join(sorted(allowed))} "
            f"(configure log: {cfg or 'no architecture lines'})",
            hint="check TORCH_CUDA_ARCH_LIST; some vLLM versions skip sm_12x kernels for '12.1a'")


def install_built(state: BuildState, step: Step) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, GitSource)
    if state.wheel is None:
        state.wheel = p.wheelhouse.find_built(src.distribution, src.expected_distribution_version)
        if state.wheel is None:
            raise BuildFailed("the wheelhouse's built vLLM wheel disappeared or was rejected")
        state.facts["wheel"] = {"file": state.wheel.name, "sha256": sha256_file(state.wheel),
                                "version": src.expected_distribution_version}
    wheel = str(state.wheel)
    first = step.commands[0]
    argv = [wheel if a.endswith("<vllm wheel>") else a for a in first.argv]
    _run_cmd(state, Cmd(argv, env=first.env))
    if len(step.commands) > 1:
        fetch(state)
        write_requirements(state, exclude={canonicalize_name(src.distribution)})
        _run_cmd(state, step.commands[1])


def installed_distributions(venv: Path) -> dict[str, str]:
    out = proc.run([uv(), "pip", "freeze", "--python", str(venv / "bin" / "python")],
                   env={**scrubbed_env(), **uv_env()}, capture=True, echo=False)
    dists: dict[str, str] = {}
    for line in out.output.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            dists[str(canonicalize_name(name))] = version.strip()
    return dists


def _fix_shebangs(venv: Path, old: Path) -> None:
    old_prefix = f"#!{old}/bin/".encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(old_prefix):
            script.write_bytes(f"#!{venv}/bin/".encode() + data[len(old_prefix):])


def build_record(state: BuildState, ident: identity.Identity) -> dict[str, Any]:
    p = state.plan
    lock_hashes = {e.key: e.sha256[0] for e in (p.pin.lock_entries or ())}
    manifest = p.wheelhouse.files() if p.wheelhouse.manifest_path.exists() else {}
    wheel_by_key: dict[str, tuple[str | None, str | None]] = {}
    for filename, info in manifest.items():
        name, _version, _b, _t = parse_wheel_filename(filename)
        wheel_by_key[str(canonicalize_name(name))] = (filename, info["sha256"])
    dists = installed_distributions(p.staging_venv)
    cuda_home = p.build_env.get("CUDA_HOME")
    return {
        "record_schema": RECORD_SCHEMA,
        "created_utc": utc_now(),
        "tool": tool_facts(),
        "pin": p.pin.summary(),
        "target": {"name": p.target_name, **p.target.model_dump(mode="json")},
        "resolved": p.resolved(),
        "host": host_facts(cuda_home),
        "installer": {"uv": UV_VERSION, "pip_for_wheel_build": (
            p.pin.model.build.pip if isinstance(p.pin.model.vllm, GitSource) else None)},
        "origin": state.origin,
        "source": state.facts.get("source"),
        "externals": state.facts.get("externals"),
        "externals_declared": state.facts.get("externals_declared"),
        "build_requirements": state.facts.get("build_requirements"),
        "wheel": state.facts.get("wheel"),
        "compiled_arches": state.facts.get("compiled_arches"),
        "distributions": [
            {"name": k, "version": v,
             "wheel": wheel_by_key.get(k, (None, None))[0],
             "sha256": wheel_by_key.get(k, (None, lock_hashes.get(k)))[1]}
            for k, v in sorted(dists.items())
        ],
        "preflight": state.facts.get("preflight"),
        "timings": dict(state.steps.timings),
        "log": str(p.venv / RECORD_DIR / "build.log"),
        "identity": ident.summary(),
    }


def publish(state: BuildState, ident: identity.Identity) -> identity.Identity:
    """Write the record into the staging venv, then rename it into place: the rename is the
    commit point. A venv at the oracle path without a build record is never the oracle."""
    p = state.plan
    publish_start = time.monotonic()
    record = build_record(state, ident)
    rec_dir = p.staging_venv / RECORD_DIR
    rec_dir.mkdir(parents=True, exist_ok=True)
    moved = json.loads(json.dumps(record).replace(os.path.realpath(p.staging_venv),
                                                  os.path.realpath(p.venv)))
    shutil.copy2(p.log, rec_dir / "build.log")
    atomic_write_json(rec_dir / "identity.json", ident.facts)
    atomic_write_json(rec_dir / "build-record.json", moved)
    replaced: Path | None = None
    p.venv.parent.mkdir(parents=True, exist_ok=True)
    if p.venv.exists() or p.venv.is_symlink():
        replaced = p.home / "replaced" / f"{p.pin.key}.{int(time.time())}"
        replaced.parent.mkdir(parents=True, exist_ok=True)
        os.rename(p.venv, replaced)
    os.rename(p.staging_venv, p.venv)
    _fix_shebangs(p.venv, p.staging_venv)
    start = time.monotonic()
    final = identity.relocated(p.pin, p.target, ident, p.staging_venv, p.venv)
    if not final.ok:  # never leave a venv in place that fails identity
        os.rename(p.venv, p.staging_venv)
        if replaced is not None:
            os.rename(replaced, p.venv)
        raise IdentityMismatch(final.mismatches, where=f"{p.venv} (after the move)")
    moved["identity"] = final.summary()
    moved["timings"]["identity (final path)"] = round(time.monotonic() - start, 3)
    moved["timings"]["publish"] = round(time.monotonic() - publish_start, 3)
    moved["timings"]["total"] = round(sum(  # steps only; the final identity is in publish
        v for k, v in moved["timings"].items() if k not in ("total", "identity (final path)")),
        3)
    atomic_write_json(p.venv / RECORD_DIR / "identity.json", final.facts)
    atomic_write_json(p.venv / RECORD_DIR / "build-record.json", moved)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    shutil.rmtree(p.staging, ignore_errors=True)
    return final


def run(p: Plan) -> identity.Identity:
    """Execute ``p``. On failure the staging folder and its log stay for inspection."""
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
    if isinstance(p.pin.model.vllm, GitSource) and p.from_wheelhouse:
        state.origin = "wheelhouse"
    ident: identity.Identity | None = None
    try:
        for step in p.steps:
            with state.steps.step(step.name):
                if step.action == "preflight":
                    state.facts["preflight"] = preflight(p)
                elif step.action == "commands":
                    for cmd in step.commands:
                        _run_cmd(state, cmd)
                elif step.action == "fetch":
                    fetch(state)
                    write_requirements(state)
                elif step.action == "source":
                    do_source(state)
                elif step.action == "externals":
                    do_externals(state)
                elif step.action == "build_requirements":
                    do_build_requirements(state, step)
                elif step.action == "check_wheel":
                    check_wheel(state)
                    assert state.wheel is not None
                    p.wheelhouse.add(state.wheel, origin="built")
                elif step.action == "install_built":
                    install_built(state, step)
                elif step.action == "identity":
                    ident = identity.check(p.pin, p.target, p.staging_venv, log=p.log,
                                           staged=True)
                    if not ident.ok:
                        raise IdentityMismatch(ident.mismatches, where=str(p.staging_venv))
                elif step.action == "publish":
                    assert ident is not None
                    ident = publish(state, ident)
                elif step.action == "noop":
                    pass
                else:  # pragma: no cover - a plan only holds known actions
                    raise AssertionError(step.action)
    except BaseException as exc:
        if p.staging.exists():
            say(f"build stopped in step {state.steps._index}/{len(p.steps)}; the staging folder "
                f"and full log are kept for inspection:\n  {p.staging}\n  {p.log}")
            if isinstance(exc, BuildFailed) and "full log" not in exc.message:
                exc.message += f"\n  full log: {p.log}"
        raise
    assert ident is not None
    return ident


@dataclass
class BuildOutcome:
    identity: identity.Identity
    built: bool
    seconds: float


def build_oracle(pin: Pin, target_name: str, *, home: Path, wheelhouse_root: Path,
                 mirror: str | None = None, externals_dir: Path | None = None,
                 rebuild: bool = False, wait: bool = True) -> BuildOutcome:
    start = time.monotonic()
    venv = oracle_path(home, pin)
    target = pin.target(target_name)
    with held(home / "locks" / f"{pin.key}.lock", what=f"build_oracle {pin.key}", wait=wait):
        if venv.is_dir() and not venv.is_symlink() and not (
                venv / RECORD_DIR / "build-record.json").exists():
            aside = home / "incomplete" / f"{pin.key}.{int(time.time())}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.rename(venv, aside)
            say(f"{venv} has no build record (an interrupted publish?): it is not the oracle; "
                f"moved to {aside} and building again")
        if (venv.exists() or venv.is_symlink()) and not rebuild:
            say(f"oracle already at {venv}; re-checking its identity")
            ident = identity.check(pin, target, venv)
            if not ident.ok:
                raise IdentityMismatch(
                    ident.mismatches, where=str(venv),
                    hint="the oracle drifted; it is not replaced silently: "
                    "`build_oracle -- --rebuild` rebuilds it")
            return BuildOutcome(ident, False, time.monotonic() - start)
        p = plan(pin, target_name, home=home, wheelhouse_root=wheelhouse_root, mirror=mirror,
                 externals_dir=externals_dir)
        say(p.render())
        ident = run(p)
        say(f"built in {fmt_seconds(time.monotonic() - start)}; record: "
            f"{venv / RECORD_DIR / 'build-record.json'}")
        return BuildOutcome(ident, True, time.monotonic() - start)
