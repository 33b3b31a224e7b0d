"""The build plan: pin + target + host paths -> an ordered list of steps, each with the
exact commands and environment it runs. ``--dry-run`` prints this object; ``steps.run``
executes the same object, command for command, so the printed plan cannot lie.

A step's action is a function of ``steps`` (no dispatch on names). Commands that run only
under a condition (a wheel missing from the wheelhouse) say so in ``Cmd.when``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from oracle_build import devices
from oracle_build.contracts.cudatoolkit import load_toolkit
from oracle_build.contracts.pins import (
    ArchiveSource,
    FromSource,
    GitSource,
    Pin,
    WheelSource,
    toolkit_path,
)
from oracle_build.contracts.targets import Target
from oracle_build.core import env as envmod
from oracle_build.core import layout, proc
from oracle_build.core.proc import Cmd
from oracle_build.oracle.venv import uv
from oracle_build.recipe import prepare as prep
from oracle_build.recipe import source, toolchain
from oracle_build.recipe import steps as act
from oracle_build.recipe.checkout import KNOWN_SWITCHES, CheckoutFacts, pin_problems, read_checkout
from oracle_build.recipe.cuda import toolkit as cudatoolkit
from oracle_build.recipe.model import (
    CONFIGURED,
    DOWNLOAD_LIST,
    REPRODUCIBLE_CMAKE_ARGS,
    SOURCE_DATE_EPOCH,
    STOP_POINTS,
    TORCH_DOWNLOAD_LIST,
    UV_VERSION,
    Plan,
    Step,
    archive_path,
    last_times,
)
from oracle_build.recipe.wheelhouse import Wheelhouse

__all__ = ["UV_VERSION", "Plan", "Step", "fetch_commands", "plan"]


# Removed from the wheel build's environment whatever the caller set: each makes the
# build take kernels from elsewhere or stamp a version it did not compute.
WHEEL_UNSET = ("VLLM_USE_PRECOMPILED", "SETUPTOOLS_SCM_PRETEND_VERSION",
               "VLLM_VERSION_OVERRIDE", "VLLM_SKIP_VERSION_SUFFIX")
# what the compile's command lines take from the environment of a source build: each is the
# plan's or unset, never the caller's (a CFLAGS of the caller's would change every object)
FLAGS_UNSET = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CUDAFLAGS", "HIPFLAGS", "CC",
               "CXX", "CCACHE_DISABLE", "CCACHE_RECACHE", "CCACHE_PREFIX", "CCACHE_CONFIGPATH")
def wheel_build_env(pin: Pin, target: Target, externals: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    env.update(pin.model.build.env)
    env.update(target.build_env)
    devices.module(target).build_env(target, env)
    if pin.model.build.cmake_args:
        env["CMAKE_ARGS"] = " ".join(pin.model.build.cmake_args)
    env.update(externals)
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, no find-links, no cache: build what is here
    env["PIP_NO_CACHE_DIR"] = "1"
    return env


def rust_switches(decision: str | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """The wheel build's environment for the pin's Rust front-end decision: "build" makes
    setup.py's optional vllm-rs mandatory; "skip" names a cargo that always fails, so
    setuptools-rust skips the optional binary (the wheel check then holds the build to it)."""
    if decision == "build":
        return {"VLLM_REQUIRE_RUST_FRONTEND": "1"}, ()
    if decision == "skip":
        return {"CARGO": "/bin/false"}, ("VLLM_REQUIRE_RUST_FRONTEND",)
    return {}, ()


def _uv(*args: str, cache: Path | None = None, when: str | None = None,
        network: bool = False) -> Cmd:
    """A uv command. Every install into the oracle venv compiles its bytecode there and then
    (checked-hash pycs: SOURCE_DATE_EPOCH makes py_compile write them), so the manifest holds
    every .pyc Python will load and Python never writes one later.

    ``cache``: for an offline install from local wheel files (the wheelhouse, the built vLLM
    wheel), a uv cache of the install's own inside the staging folder, which the build
    removes after each step (``steps.run``). uv keys a local wheel by its path, so the shared
    cache (~/.cache/uv) would gain a whole unpacked oracle (3.4 GB) for every new home or
    wheelhouse path, while the wheelhouse already is the cache. On the staging venv's file
    system uv hard-links from it; once the step removes it, the venv's files are its own.
    Installs that download (torch from its index, build requirements) keep the shared cache,
    keyed by URL, so a second build does not download them again."""
    if args[:2] == ("pip", "install"):
        own = ["--cache-dir", str(cache), "--link-mode", "hardlink"] if cache else []
        return Cmd([uv(), *args[:2], "--compile-bytecode", *own, *args[2:]],
                   env={**envmod.UV, **envmod.BYTECODE}, when=when, network=network)
    return Cmd([uv(), *args], env=dict(envmod.UV), when=when, network=network)


def _download(listing: Path, dest: Path, *, index: str | None, when: str) -> Cmd:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "--progress-bar", "off", "-r", str(listing), "-d", str(dest)]
    if index is not None:
        argv += ["--index-url", index, "--retries", "1", "--timeout", "30"]
    return Cmd(argv, what="pip download", when=when, network=True)


def fetch_commands(plan_files: Callable[[str], Path], wh: Wheelhouse, pin: Pin,
                   target: Target) -> list[Cmd]:
    """Where a wheel comes from does not matter, only its hash: first this host's pip
    configuration (PyPI, local mirrors, find-links); the pin's torch index only for torch,
    and only if torch is still missing (an unreachable index is retried per package)."""
    cmds = [_download(plan_files(DOWNLOAD_LIST), wh.incoming, index=None,
                      when="if locked wheels other than torch are missing from the wheelhouse "
                      "(they are listed in that file)"),
            _download(plan_files(TORCH_DOWNLOAD_LIST), wh.incoming, index=None,
                      when="if torch is missing from the wheelhouse")]
    torch = pin.torch_for(target)
    if torch is not None:
        cmds.append(_download(plan_files(TORCH_DOWNLOAD_LIST), wh.incoming,
                              index=torch.index, when="if torch is still missing after that"))
    return cmds


def plan(pin: Pin, target_name: str, *, home: Path, wheelhouse_root: Path,
         mirror: str | None = None, externals_dir: Path | None = None,
         checkout: Path | None = None, compiler_cache: bool = True,
         stop_after: str | None = None, reuse_built: bool = True,
         compare_only: bool = False, no_gpu: bool = False) -> Plan:
    """``checkout``: a tree at the pinned commit to read the build's facts from now
    (externals, switches, requirements, Rust); without it the build reads them from its
    own clone before configure, and refuses there what it would refuse here.
    ``compiler_cache``: False builds cold (ccache into a throwaway folder).
    ``stop_after``: a step's name, or "configure": the build ends there (the wheel build is
    stopped at CMake's last configure line), its staging folder removed, nothing published.
    ``reuse_built``: False compiles even when the wheelhouse holds this pin's built wheel;
    ``compare_only``: a build made to be compared with the oracle in place (its wheel left
    out of the wheelhouse, its bytes not held to the pin's).
    ``no_gpu``: a GPU target built on a host without its GPU (its device checks skipped,
    said in the plan and the identity block; never implied)."""
    if no_gpu and not devices.module(pin.target(target_name)).DEVICE_CHECKS:
        from oracle_build.core.errors import BadInput

        raise BadInput("--no-gpu", [("<flag>", f"target {target_name} is a "
                                    f"{pin.target(target_name).device} target: --no-gpu is for "
                                    "GPU targets")])
    target = pin.target(target_name)
    venv = layout.oracle_path(home, pin.key)
    staging = layout.staging_dir(home, pin.key)
    wh = Wheelhouse.for_pin(wheelhouse_root, pin)
    svenv = staging / "venv"
    py = str(svenv / "bin" / "python")
    interpreter = find_interpreter(pin)
    base = build_base(pin, staging, svenv, stripped=compare_only, interpreter=interpreter)
    src = pin.model.vllm
    files: Callable[[str], Path] = lambda name: staging / name  # noqa: E731
    steps: list[Step] = []
    build_env: dict[str, str] = {}
    from_wheelhouse = False
    facts: CheckoutFacts | None = None
    wheel_unset: tuple[str, ...] = ()
    compilers: dict[str, toolchain.Compiler] = {}
    decisions: list[toolchain.PatchDecision] = []
    ccache: toolchain.CompilerCache | None = None
    kit: cudatoolkit.Planned | None = None
    cache = layout.uv_cache_dir(staging)
    lock_install = _uv("pip", "install", "--python", py, "--offline", "--no-index",
                       "--find-links", str(wh.root), "--no-deps", "--require-hashes",
                       "-r", str(files("requirements.lock.txt")), cache=cache)

    about = devices.module(target).PREFLIGHT_ABOUT
    steps.append(Step("preflight", "disk space, Python, host memory" + (f"; {about}" if about
                                                                        else ""),
                      act.preflight))
    steps.append(Step("venv", f"create the staging venv (python {pin.model.python})",
                      act.commands, [_uv("venv", "--python", interpreter or pin.model.python,
                                         "--no-project", str(svenv))]))
    fetch = Step("fetch", f"put every locked wheel in the wheelhouse {wh.root}, each checked "
                 "against its sha256 (download only what is missing or bad)", act.fetch,
                 fetch_commands(files, wh, pin, target))

    if isinstance(src, WheelSource):
        steps.append(fetch)
        steps.append(Step("install", "install the locked set offline from the wheelhouse",
                          act.install_locked, [lock_install]))
    else:
        assert isinstance(src, FromSource)
        dist_version = pin.expected_distribution_version(target)
        torch = pin.torch_for(target)
        built = (wh.find_built(src.distribution, dist_version)
                 if reuse_built and wh.manifest_path.exists() else None)
        from_wheelhouse = built is not None
        wheel_dir = wh.root if from_wheelhouse else staging / "dist"
        if from_wheelhouse:
            steps.append(Step("wheelhouse", f"use the vLLM wheel built earlier for this pin: "
                              f"{built}", act.use_built))
            # the wheel's compiled code is checked with the locked toolkit's cuobjdump
            kit = _toolkit_step(pin, target, home, wh, steps)
        else:
            compilers = toolchain.compilers(pin)
            base = build_base(pin, staging, svenv, stripped=compare_only, compilers=compilers,
                              interpreter=interpreter)
            decisions = toolchain.decide_patches(pin, target_name, compilers)
            ccache = toolchain.compiler_cache(home, staging, cold=not compiler_cache)
            switches: tuple[str, ...]
            if checkout is not None:
                facts = read_checkout(checkout, device=target.device, machine=target.machine,
                                      preferred_requirements=pin.model.build.build_requirements)
                switches = tuple(facts.switches)
                source_blocked = pin_problems(
                    facts, pin.externals_for(target), pin.model.build.rust_frontend,
                    torch.version if torch else None, target.machine)
            else:
                facts, switches, source_blocked = None, KNOWN_SWITCHES, []
            if isinstance(src, GitSource):
                origin = mirror or src.repository
                steps.append(Step(
                    "source", f"clone {origin} (full history, tags), check out {src.commit}; "
                    "between the commands: not shallow, the commit present; after: HEAD, "
                    "full history, a reachable tag, a clean tree, and the externals its cmake "
                    "files declare equal to the pin's", prep.source_,
                    source.clone_commands(origin, staging / "src", src.commit), source_blocked))
            else:
                assert isinstance(src, ArchiveSource)
                steps.append(Step(
                    "source", f"the archive {src.filename} (sha256 {src.sha256}) in "
                    f"{archive_path(wh, src)}, fetched from {src.url} when absent or other "
                    "bytes; unpacked into the staging folder; its vllm/_version.py must "
                    f"record commit {src.commit_id}; the externals its cmake files declare "
                    "equal to the pin's", prep.archive_source, [], source_blocked))
            applying = [d for d in decisions if d.applies]
            if decisions:
                steps.append(Step(
                    "patches", f"apply {len(applying)} of the pin's {len(decisions)} patches "
                    "to the staging copy, in order, each checked first (git apply --check: "
                    "no fuzz); one that does not apply stops the build (exit 5)",
                    prep.patches, [patch_cmd(d.path, staging / "src") for d in applying]))
            steps.append(Step(
                "toolchain", "the compilers against the floors the (patched) source's own "
                "CMake sets (a compiler below one stops here, exit 6, not deep in configure)",
                prep.toolchain_))
            kit = _toolkit_step(pin, target, home, wh, steps)
            blocked = []
            ext_cmds: list[Cmd] = []
            ext_env: dict[str, str] = {}
            for ext in pin.externals_for(target):
                local = staging / "externals" / (ext.folder if ext.tree else ext.name)
                ext_env[ext.src_dir_var] = str(local)
                if not ext.established:
                    blocked.append(f"externals.{ext.name}.commit is unestablished: "
                                   f"{ext.commit.reason}")  # type: ignore[union-attr]
                    continue
                if ext.tree is None:
                    origin_ext = str(externals_dir / ext.name) if externals_dir \
                        else ext.repository
                    if externals_dir is not None and not (externals_dir / ext.name).exists():
                        blocked.append(f"externals.{ext.name}: no git mirror {ext.name} in "
                                       f"{externals_dir}, and the pin names no git tree an "
                                       "archive could be taken by")
                    ext_cmds += source.clone_commands(origin_ext, local, str(ext.commit))
            if pin.externals_for(target):
                if externals_dir is None:
                    blocked.append("no --externals DIR of local sources given (git mirrors "
                                   "or archives); with FETCHCONTENT_FULLY_DISCONNECTED=ON "
                                   "CMake cannot fetch them")
                by_tree = [e for e in pin.externals_for(target) if e.tree]
                steps.append(Step(
                    "externals", "local copies of the CMake FetchContent externals at their "
                    "pinned commits, each verified"
                    + (": " + ", ".join(f"{e.name} = the git tree {e.tree}" for e in by_tree)
                       + f", from a git mirror or an archive in {externals_dir} whose files "
                       "hash to it (a wrong tree is refused, naming the external)"
                       if by_tree else ""),
                    prep.externals, ext_cmds, blocked))
            build_env = wheel_build_env(pin, target, ext_env)
            rust_env, rust_unset = rust_switches(pin.model.build.rust_frontend)
            wheel_unset = (*WHEEL_UNSET, *(s for s in switches if s not in WHEEL_UNSET),
                           *rust_unset, *FLAGS_UNSET)
            if pin.lock_entries is not None:
                steps.append(fetch)
            if torch is not None and pin.lock_entries is not None:
                steps.append(Step(
                    "torch", "install the locked torch (and what it needs) offline from the "
                    "wheelhouse, every wheel there checked against the lock",
                    act.commands, [_uv("pip", "install", "--python", py, "--offline",
                                       "--no-index", "--find-links", str(wh.root),
                                       f"torch=={torch.version}", cache=cache)]))
            elif torch is not None:
                steps.append(Step(
                    "torch", f"install the pinned torch from {torch.index}",
                    act.commands, [_uv("pip", "install", "--python", py,
                                       f"torch=={torch.version}", "--index-url",
                                       torch.index, network=True)]))
            reqs_about = ("pyproject.toml's [build-system] requires, then "
                          + (f"{pin.model.build.build_requirements} if the tree has it, else "
                             if pin.model.build.build_requirements != "auto" else "")
                          + f"requirements/build/{target.device}.txt or requirements/build.txt")
            if facts is not None and facts.requirements is not None:
                reqs_about = (" + ".join(facts.requirements.sources) + ": "
                              + ", ".join(facts.requirements.lines))
            steps.append(Step(
                "build-requirements",
                f"write the checkout's build requirements ({reqs_about}; torch is the pin's) "
                "to a file outside the tree, then install them with the pinned pip",
                act.build_requirements,
                [_uv("pip", "install", "--python", py, f"pip=={pin.model.build.pip}",
                     "-r", str(files("build-requirements.txt")), network=True)]))
            paths = toolchain.path_map(staging, devices.module(target).PATH_MAP_VARS)
            wheel_env = {**build_env, **rust_env, **source_build_env(
                pin, staging, svenv, compilers, ccache, paths, base_path=base.path,
                base=home if kit is not None else None)}
            kit_args: list[str] = []
            if kit is not None:
                wheel_env.update(cudatoolkit.wheel_env(kit, staging, wheel_env["PATH"]))
                kit_args = cudatoolkit.cmake_args(kit)
            wheel_env["CMAKE_ARGS"] = " ".join(
                [*(build_env.get("CMAKE_ARGS", "").split()), *REPRODUCIBLE_CMAKE_ARGS,
                 *ccache.cmake_args(devices.module(target).LAUNCHER_LANGS), *kit_args])
            build_env = {k: v for k, v in wheel_env.items() if k not in rust_env}
            stop = CONFIGURED if stop_after == "configure" else None
            steps.append(Step(
                "wheel", "build the vLLM wheel from the source: no build isolation, no "
                "cached wheel, every precompiled-kernel switch and the caller's compiler "
                "flags removed from the environment, the staging venv's cmake and ninja first "
                f"on PATH, the compiler cache: {ccache.describe()}, the Rust front end: "
                f"{pin.model.build.rust_frontend or 'not decided'}"
                + ("; STOPPED once CMake has configured (--stop-after configure)"
                   if stop else ""),
                act.wheel,
                [Cmd([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                      "--no-cache-dir", "--verbose", "-w", str(wheel_dir),
                      str(staging / "src")], env=wheel_env,
                     unset=tuple(k for k in wheel_unset if k not in wheel_env),
                     what="pip wheel (vLLM build)", stop_at=stop)]))
            steps.append(Step(
                "check-wheel", "the wheel's version is the pin's distribution version; its "
                "sha256 is recorded and the wheel kept in the wheelhouse"
                + devices.module(target).wheel_check_about(target),
                act.check_wheel))
        vllm_req = f"{src.distribution}=={dist_version}"
        if pin.lock_entries is not None:
            if fetch not in steps:
                steps.append(fetch)
            install_cmds = [_uv("pip", "install", "--python", py, "--offline", "--no-index",
                                "--find-links", str(wheel_dir), "--no-deps", vllm_req,
                                cache=cache),
                            lock_install]
            about = "from the lock, offline"
        else:
            pinned = [f"{n}=={v}" for n, v in pin.model.packages.items()]
            torch_args = ([f"torch=={torch.version}", "--extra-index-url", torch.index,
                           "--index-strategy", "unsafe-best-match"] if torch else [])
            install_cmds = [_uv("pip", "install", "--python", py, "--find-links",
                                str(wheel_dir), vllm_req, *pinned, *torch_args,
                                network=True)]
            about = ("at the pin's exact versions (no lock: every installed distribution "
                     "is recorded)")
        steps.append(Step("install", "install the vLLM wheel (not editable) and the runtime "
                          "dependencies " + about, act.install_built, install_cmds))

    steps.append(Step("identity", "probe the staging venv with its own python from a neutral "
                      "directory", act.identity_))
    steps.append(Step("publish", f"write the build record, keep the wheels, move the venv to "
                      f"{venv}, re-check identity there", act.publish))
    names = [s.name for s in steps]
    if stop_after is not None and stop_after not in names and not (
            stop_after in STOP_POINTS and "wheel" in names):
        from oracle_build.core.errors import BadInput

        raise BadInput("--stop-after", [("<value>", f"{stop_after!r} is not a step of this "
                                         f"plan ({', '.join(names)}) nor a point in one "
                                         f"({', '.join(STOP_POINTS)})")])
    read_now = isinstance(src, FromSource) and not from_wheelhouse and checkout is not None
    return Plan(pin, target_name, target, home, venv, staging, wh, mirror, externals_dir,
                steps, build_env, from_wheelhouse,
                checkout=checkout if read_now else None,
                checkout_facts=facts if read_now else None, wheel_unset=wheel_unset,
                compilers=compilers, patches=decisions, compiler_cache=ccache,
                stop_after=stop_after, last_times=last_times(home, pin.key),
                compare_only=compare_only, toolkit=kit, no_gpu=no_gpu, base=base)


def _toolkit_step(pin: Pin, target: Target, home: Path, wh: Wheelhouse,
                  steps: list[Step]) -> cudatoolkit.Planned | None:
    """The toolkit step of a target whose device builds with one (CUDA): the lock's wheels
    or the host's toolkit, appended to ``steps``; None for other devices."""
    device = devices.module(target)
    if not device.BUILD_TOOLKIT:
        return None
    lock_path = toolkit_path(pin.path, target)
    kit = cudatoolkit.planned(home, load_toolkit(lock_path) if lock_path else None,
                              device.toolkit_home({**pin.model.build.env, **target.build_env}))
    steps.append(Step("toolkit", cudatoolkit.step_about(
        kit, target.machine, wh.root.parent / "toolkits"), prep.toolkit))
    return kit


def find_interpreter(pin: Pin) -> str | None:
    """The interpreter the venv is made from, as the caller's PATH finds it (a pyenv's, a
    distribution's), by its real path: the venv step names it (the record with it), and the
    venv's python links to it, never to a link of the build's own (gone with the staging
    folder)."""
    found = proc.query([uv(), "python", "find", "--system", pin.model.python],
                       env={**envmod.build_env(), **envmod.UV}, timeout=60)
    return (os.path.realpath(found.output.strip().splitlines()[-1])
            if found.ok and found.output.strip() else None)


def build_base(pin: Pin, staging: Path, svenv: Path, *, stripped: bool,
               compilers: dict[str, toolchain.Compiler] | None = None,
               interpreter: str | None = None) -> envmod.BuildBase:
    """What every process of the build starts from (core.env.BuildBase): a PATH made of the
    staging venv's bin, a folder of links to the recorded tools (the pin's interpreter, the
    compilers, ccache, git, a cargo the pin builds with) and the system's; a HOME and TMPDIR
    in the staging folder; the network closed where the host allows it
    (core.proc.network_closure)."""
    path = envmod.build_env().get("PATH")
    # each program the recipe resolved, by its own path, as a link in the build's own bin
    # folder: never the folder it lies in as a whole (a caller's folder holding the
    # interpreter and a `cc`, `as` or `ld` of its own would otherwise be searched first)
    links: dict[str, str] = {}
    if interpreter:
        links[f"python{pin.model.python}"] = interpreter
    for compiler in (compilers or {}).values():
        if compiler.path:
            links[os.path.basename(compiler.path)] = compiler.path
    names = ["ccache", "git", *(["cargo"] if pin.model.build.rust_frontend == "build" else [])]
    for name in names:
        found_tool = shutil.which(name, path=path)
        if found_tool:
            links[name] = os.path.abspath(found_tool)
    own_bin = staging / "bin"
    return envmod.BuildBase(path=envmod.made_path([str(svenv / "bin"), str(own_bin)], []),
                            home=str(staging / "home"), tmpdir=str(staging / "tmp"),
                            stripped=stripped, network=proc.network_closure()[0],
                            links=tuple(sorted(links.items())), bin=str(own_bin))


def patch_cmd(patch: Path, tree: Path) -> Cmd:
    """`git apply` of one patch in ``tree`` (not a repository: GIT_CEILING_DIRECTORIES stops
    git from finding one around it): no fuzz, whitespace as written."""
    return Cmd(["git", *source.GIT_SAFE, "apply", "--verbose", str(patch)],
               env={**envmod.GIT, "GIT_CEILING_DIRECTORIES": str(tree.parent)},
               cwd=str(tree), what=f"git apply {patch.name}")


def source_build_env(pin: Pin, staging: Path, svenv: Path,
                     compilers: dict[str, toolchain.Compiler],
                     ccache: toolchain.CompilerCache,
                     paths: toolchain.PathMap, *, base_path: str,
                     base: Path | None = None) -> dict[str, str]:
    """What a source build's compile command lines depend on, set by the plan: the staging
    venv's tools first on PATH (cmake and ninja of the build requirements, not the host's),
    the pin's compilers when it names them, SOURCE_DATE_EPOCH, the staging folder's path map
    (the only compiler flags of the plan's: the caller's are unset), the compiler cache."""
    env = {"PATH": base_path, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    if pin.model.build.cc and compilers["cc"].path:
        env["CC"] = compilers["cc"].path
    if pin.model.build.cxx and compilers["cxx"].path:
        env["CXX"] = compilers["cxx"].path
    env.update(paths.env())
    # ``base``: the folder ccache makes paths relative under, when the build reads more of
    # the home than its staging folder (a CUDA toolkit unpacked into the home)
    env.update(ccache.env(base or staging, paths))
    return env
