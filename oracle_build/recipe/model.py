"""The data of a build: a ``Step`` and the frozen ``Plan`` (what ``plan.py`` makes and
``--dry-run`` prints), the ``BuildState`` the steps fill as they run (``steps.py``), and the
names both share. Below both: the planner composes the steps' actions, the steps read the
plan, and neither imports the other's module for its types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from oracle_build import devices
from oracle_build.contracts.pins import ArchiveSource, FromSource, GitSource, Pin
from oracle_build.contracts.probe import ResolvedPlan
from oracle_build.contracts.record import BuildFacts
from oracle_build.contracts.targets import Target
from oracle_build.core import env as envmod
from oracle_build.core import layout, proc
from oracle_build.core.files import load_json
from oracle_build.core.log import Steps, fmt_seconds
from oracle_build.core.proc import Cmd
from oracle_build.oracle import identity, inventory
from oracle_build.recipe import checkout, toolchain
from oracle_build.recipe.checkout import CheckoutFacts
from oracle_build.recipe.cuda import toolkit as cudatoolkit
from oracle_build.recipe.wheelhouse import Wheelhouse

# wheels, archives and bytecode carry this time, not the build's (Debian's reproducible
# builds; the same value the installs use for bytecode)
SOURCE_DATE_EPOCH = envmod.BYTECODE["SOURCE_DATE_EPOCH"]
# what makes a CMake build's compiled bytes independent of where it ran
# (docs/reproducible-builds.md): without it the build tree's RPATH (an absolute path into
# the staging folder) is linked in and install blanks it in place, leaving .dynstr as long
# as that path was
REPRODUCIBLE_CMAKE_ARGS = ("-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",)
# CMake's last line of a configure that worked: where `--stop-after configure` ends the build
CONFIGURED = r"^\s*-- Build files have been written to: "
STOP_POINTS = ("configure",)
UV_VERSION = "0.13.9"
# the staging files the fetch step lists the wheels it downloads in
DOWNLOAD_LIST = "download.txt"
TORCH_DOWNLOAD_LIST = "download-torch.txt"


@dataclass(frozen=True)
class Step:
    name: str
    about: str
    action: Callable[[BuildState, Step], None]
    commands: list[Cmd] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)  # unestablished pin values it needs


def reproducible_text(pin: Pin) -> str:
    """What the pin says of its reproducibility, as the plan and the record print it."""
    r = pin.model.reproducible
    if r is None:
        return ("not measured: no two cold builds of this pin have been compared "
                "(`build_oracle -- --check` does)")
    return f"{r.status}: {r.note}"


# the staging folder's path as a record shows it (what the build passed, not where)
STAGING_SHOWN = "<staging>"


@dataclass(frozen=True)
class Plan:
    """What a build will do, step by step, and with what: built once (``plan()``), printed
    by --dry-run, then run as it stands; nothing patches it after."""

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
    checkout: Path | None = None  # a tree the plan read its facts from (--checkout)
    checkout_facts: CheckoutFacts | None = None
    # what the wheel build removes from its environment (every precompiled switch the
    # tree reads, as far as the plan knows it)
    wheel_unset: tuple[str, ...] = ()
    # a from-source build: the compilers found, the pin's patches decided, the compiler cache
    compilers: dict[str, toolchain.Compiler] = field(default_factory=dict)
    patches: list[toolchain.PatchDecision] = field(default_factory=list)
    compiler_cache: toolchain.CompilerCache | None = None
    stop_after: str | None = None  # a step's name, or "configure" (inside the wheel step)
    last_times: dict[str, float] = field(default_factory=dict)  # each step, last time here
    # a build made only to be compared (build_oracle --check): its wheel stays out of the
    # wheelhouse (later builds install the oracle's), and its compiled bytes are not held to
    # the pin's at publish (they are what is compared, file by file)
    compare_only: bool = False
    # a CUDA source build's toolkit and nvcc launcher (recipe/cudatoolkit.py)
    toolkit: cudatoolkit.Planned | None = None
    # built without a GPU (--no-gpu, never implied): the device checks do not run
    no_gpu: bool = False
    # what every process of the build starts from: the made PATH, its own HOME and TMPDIR,
    # the network closed or not (core.env.BuildBase; recipe.plan.build_base)
    base: envmod.BuildBase | None = None

    @property
    def from_source(self) -> bool:
        """Whether this plan compiles vLLM (rather than install a wheel)."""
        return isinstance(self.pin.model.vllm, FromSource) and not self.from_wheelhouse

    @property
    def staging_venv(self) -> Path:
        return self.staging / "venv"

    @property
    def log(self) -> Path:
        return self.staging / layout.BUILD_LOG

    def file(self, name: str) -> Path:
        """A file the build writes into its staging folder (requirement lists)."""
        return self.staging / name

    def resolved(self) -> dict[str, Any]:
        """Everything the build is about to use; printed first, recorded last (validated as
        the model the build record and resolved.json hold)."""
        src = self.pin.model.vllm
        return ResolvedPlan.model_validate({
            "pin": str(self.pin.path),
            "pin_id": self.pin.id,
            "pin_hash": self.pin.content_hash,
            "target": self.target_name,
            "device": self.target.device,
            "vllm": (f"git {src.repository} @ {src.commit}" if isinstance(src, GitSource)
                     else f"archive {src.url} sha256:{src.sha256} (commit {src.commit_id})"
                     if isinstance(src, ArchiveSource)
                     else f"wheel {src.distribution}=={src.version} sha256:{src.sha256}"),
            "expected_runtime_version": self.pin.expected_runtime_version(),
            "python": self.pin.model.python,
            "torch": (torch.version if (torch := self.pin.torch_for(self.target)) else None),
            "expected_distribution_version": self.pin.expected_distribution_version(
                self.target),
            "packages": dict(self.pin.model.packages),
            "venv": str(self.venv),
            "staging": str(self.staging),
            "wheelhouse": str(self.wheelhouse.root),
            "mirror": self.mirror,
            "externals_dir": str(self.externals_dir) if self.externals_dir else None,
            "build_env": dict(sorted(self.build_env.items())),
            "from_wheelhouse": self.from_wheelhouse,
            "rust_frontend": (self.pin.model.build.rust_frontend
                              if isinstance(self.pin.model.vllm, FromSource) else None),
            "checkout": str(self.checkout) if self.checkout else None,
        }).model_dump(mode="json")

    def network_text(self) -> str:
        """``closed (<how>)`` or ``open (<why>)``: the build record's and identity's words."""
        if self.base is not None and self.base.network is not None:
            return (f"closed ({proc.CLOSURES[self.base.network]}) for every command but "
                    "the downloads")
        return f"open ({proc.network_closure()[1]})"

    def environment_lines(self) -> list[str]:
        b = self.base
        if b is None:
            return []
        passed = ("stripped: " + ", ".join(f"{k}={v}" for k, v in envmod.STRIPPED.items())
                  if b.stripped else "the caller's " + ", ".join(envmod.BUILD_PASSED)
                  + " and LC_*")
        return [f"  environment: built, not inherited: {passed}; PATH={b.path}; "
                f"HOME={b.home}; TMPDIR={b.tmpdir}; SOURCE_DATE_EPOCH; the caller's MAX_JOBS "
                "(a count); plus what each command lists (a download also: proxies, CA "
                "bundles, PIP_*, the caller's HOME)",
                *([f"  programs on PATH ({b.bin}): " + ", ".join(
                    f"{name} -> {target}" for name, target in b.links)] if b.bin else []),
                f"  network: {self.network_text()}"]

    def render(self) -> str:
        lines = [f"build plan for pin {self.pin.id} ({self.pin.key}), target {self.target_name}"]
        for key, value in self.resolved().items():
            if key == "build_env":
                continue
            lines.append(f"  {key}: {value}")
        lines += self.environment_lines()
        for role, tool in self.compilers.items():
            lines.append(f"  {role}: {tool.label()}")
        for d in self.patches:
            lines.append(f"  patch {d.patch.file}: {'APPLIES' if d.applies else 'skipped'} "
                         f"({d.why}): {d.patch.reason}")
        if self.compiler_cache is not None:
            lines.append(f"  compiler cache: {self.compiler_cache.describe()}")
        if self.toolkit is not None:
            lines += cudatoolkit.plan_lines(self.toolkit, self.target.machine)
        if self.no_gpu:
            lines.append("  device checks: NOT RUN (--no-gpu): "
                         + ", ".join(devices.module(self.target).DEVICE_CHECKS)
                         + "; the compiled-arch check still holds the built libraries to "
                         "the target's")
        if self.from_source:
            lines.append(f"  reproducible: {reproducible_text(self.pin)}")
        if self.stop_after:
            lines.append(f"  stops after: {self.stop_after} (nothing is published)")
        for index, step in enumerate(self.steps, start=1):
            last = self.last_times.get(step.name)
            took = f" (last time on this host: {fmt_seconds(last)})" if last else ""
            lines.append(f"  [{index}/{len(self.steps)}] {step.name}: {step.about}{took}")
            for blocked in step.blocked_by:
                lines.append(f"      REFUSES TO RUN: {blocked}")
            for cmd in step.commands:
                lines += cmd.render()
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"resolved": self.resolved(),
                "steps": [{"name": s.name, "about": s.about, "blocked_by": s.blocked_by,
                           "commands": [c.as_dict() for c in s.commands]} for s in self.steps]}


@dataclass
class BuildState:
    plan: Plan
    steps: Steps
    facts: BuildFacts = field(default_factory=BuildFacts)
    wheel: Path | None = None
    origin: Literal["built", "wheelhouse", "fetched"] = "wheelhouse"
    identity: identity.Identity | None = None
    tree: checkout.CheckoutFacts | None = None  # what the source step read from the clone
    hashed: inventory.Hashed | None = None  # the venv's files, hashed during the identity step
    stopped: str | None = None  # where the build stopped as asked (--stop-after)


def last_times(home: Path, pin_key: str) -> dict[str, float]:
    """Each step's duration the last time it ran to its end on this host (nothing when the
    file is absent or not a plain table of numbers: it is only said, never trusted)."""
    path = layout.timings_path(home, pin_key)
    try:
        data = load_json(path) if path.is_file() else {}
    except Exception:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e7}


def archive_path(wh: Wheelhouse, src: ArchiveSource) -> Path:
    """Where a pin's source archive is kept: in its wheelhouse, checked by sha256 at each
    use, so a rebuild after a reimage needs no registry."""
    return wh.root / "sources" / src.filename


def run_logged(state: BuildState, cmd: Cmd, *, check: bool = True,
               hint: str | None = None) -> proc.Result:
    """One of a step's commands, its output appended to the build's log."""
    return proc.run_cmd(cmd, log=state.plan.log, check=check, hint=hint)
