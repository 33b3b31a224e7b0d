"""build_oracle: pin + target -> plan (``plan.py``) -> steps run in a staging folder
(``steps.py``) -> identity -> build record and the publishing rename (``record.py``).
``source.py`` is the git checkout, ``wheelhouse.py`` the hash-checked wheel store,
``lock.py`` the lock regeneration."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build.contracts.pins import Pin
from oracle_build.contracts.record import RECORD_SCHEMA
from oracle_build.core import layout, proc
from oracle_build.core.errors import IdentityMismatch
from oracle_build.core.filelock import held
from oracle_build.core.files import json_value
from oracle_build.core.log import fmt_seconds, say
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import OracleVenv
from oracle_build.recipe.plan import Plan, plan
from oracle_build.recipe.steps import run

__all__ = ["BuildOutcome", "CheckOutcome", "Plan", "PlanOptions", "build_oracle", "build_until",
           "check_rebuild", "plan", "run"]


def record_schema(oracle: OracleVenv) -> int:
    """The schema of an oracle's build record (0: none, or unreadable)."""
    try:
        value = json_value(oracle.record_path.read_text()).get("record_schema", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


def clear_dead_staging(home: Path, pin_key: str) -> list[Path]:
    """What builds of this pin that did not finish left in <home>/staging (a killed or
    failed build keeps its folder for inspection: 3.4 GB for an oracle). Called under the
    pin's build lock, so none of them is running: processes of theirs still working there
    (a `uv` whose harness was killed outright) are ended, each one's log is kept under
    <home>/logs/, and the folder goes."""
    pattern = re.compile(re.escape(pin_key) + r"\.\d{8}T\d{6}Z-\d+")
    root = home / "staging"
    cleared = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not pattern.fullmatch(folder.name) or folder.is_symlink() or not folder.is_dir():
            continue
        ended = proc.end_leftovers(folder)
        log = folder / layout.BUILD_LOG
        kept = layout.log_path(home, "build-unfinished", folder.name)
        if log.is_file() and not log.is_symlink():
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(log), kept)
        shutil.rmtree(folder, ignore_errors=True)
        say(f"cleared what an unfinished build of {pin_key} left: {folder}"
            + (f" ({ended} of its processes still running there, ended)" if ended else "")
            + (f"; its log: {kept}" if kept.exists() else ""))
        cleared.append(folder)
    return cleared


@dataclass
class BuildOutcome:
    identity: identity.Identity
    built: bool
    seconds: float


def build_oracle(pin: Pin, target_name: str, *, home: Path, wheelhouse_root: Path,
                 mirror: str | None = None, externals_dir: Path | None = None,
                 checkout: Path | None = None, rebuild: bool = False,
                 wait: bool = True,
                 fill_wheelhouse: Callable[[], None] | None = None,
                 compiler_cache: bool = True, reuse_built: bool = True,
                 compare_only: bool = False, no_gpu: bool = False) -> BuildOutcome:
    """The pin's oracle for this target: re-checked if in place, else built and published.
    ``fill_wheelhouse``: called under the build lock before a build is planned (the oracle
    cache's pull), so the plan takes what it put there. ``compiler_cache``: False compiles
    every object anew."""
    start = time.monotonic()
    oracle = OracleVenv(layout.oracle_path(home, pin.key))
    target = pin.target(target_name)
    with held(layout.build_lock(home, pin.key), what=f"build_oracle {pin.key}", wait=wait):
        clear_dead_staging(home, pin.key)
        if oracle.is_real_dir() and (not oracle.has_record() or (
                record_schema(oracle) >= RECORD_SCHEMA
                and not inventory.anchor_path(oracle.path).is_file())):
            aside = layout.set_aside(home, "incomplete", pin.key)
            os.rename(oracle.path, aside)
            say(f"{oracle.path} has no build record or no anchor (an interrupted publish?): "
                f"it is not the oracle; moved to {aside} and building again")
        if oracle.exists() and not rebuild and record_schema(oracle) < RECORD_SCHEMA:
            aside = layout.set_aside(home, "replaced", pin.key)
            os.rename(oracle.path, aside)
            say(f"{oracle.path} was built by an earlier oracle-build (build record schema "
                f"{record_schema(oracle)}: its identity covers less than this one checks): "
                f"moved to {aside}; building it again, from the wheelhouse where it can")
        if oracle.exists() and not rebuild:
            say(f"oracle already at {oracle.path}; re-checking its identity (every file "
                "hashed)")
            ident = identity.check(pin, target, oracle.path, deep=True, no_gpu=no_gpu)
            if not ident.ok:
                raise IdentityMismatch(
                    ident.mismatches, where=str(oracle.path),
                    hint="the oracle drifted; it is not replaced silently: "
                    "`build_oracle -- --rebuild` rebuilds it")
            return BuildOutcome(ident, False, time.monotonic() - start)
        if fill_wheelhouse is not None:
            fill_wheelhouse()
        p = plan(pin, target_name, home=home, wheelhouse_root=wheelhouse_root, mirror=mirror,
                 externals_dir=externals_dir, checkout=checkout,
                 compiler_cache=compiler_cache, reuse_built=reuse_built, compare_only=compare_only,
                 no_gpu=no_gpu)
        say(p.render())
        made = run(p)
        assert made is not None  # a plan without stop_after runs to its publish
        say(f"built in {fmt_seconds(time.monotonic() - start)}; record: {oracle.record_path}")
        return BuildOutcome(made, True, time.monotonic() - start)


@dataclass(frozen=True)
class PlanOptions:
    """What the build command's flags make of a plan, resolved once: the dry run, a build
    stopped after a step and a whole build are planned with the same."""

    mirror: str | None = None
    externals_dir: Path | None = None
    checkout: Path | None = None
    compiler_cache: bool = True
    no_gpu: bool = False

    def kwargs(self) -> dict[str, Any]:
        return {"mirror": self.mirror, "externals_dir": self.externals_dir,
                "checkout": self.checkout, "compiler_cache": self.compiler_cache,
                "no_gpu": self.no_gpu}


def build_until(pin: Pin, target_name: str, stop_after: str, *, home: Path,
                wheelhouse_root: Path, mirror: str | None = None,
                externals_dir: Path | None = None, checkout: Path | None = None,
                compiler_cache: bool = True, wait: bool = True,
                no_gpu: bool = False) -> float:
    """The build of the pin's oracle up to ``stop_after`` (a step's name, or "configure"),
    whatever is in place, under the same lock; nothing is published. Its seconds. A source
    pin's build compiles even when the wheelhouse holds a wheel built earlier: the build
    being looked at is this one."""
    start = time.monotonic()
    with held(layout.build_lock(home, pin.key), what=f"build_oracle {pin.key}", wait=wait):
        clear_dead_staging(home, pin.key)
        p = plan(pin, target_name, home=home, wheelhouse_root=wheelhouse_root, mirror=mirror,
                 externals_dir=externals_dir, checkout=checkout,
                 compiler_cache=compiler_cache, stop_after=stop_after, reuse_built=False,
                 no_gpu=no_gpu)
        say(p.render())
        run(p)
    return time.monotonic() - start


@dataclass
class CheckOutcome:
    """build_oracle --check: each compiled file of the installed oracle against a cold
    rebuild's, and for those that differ, the ELF parts that do."""

    compared: dict[str, tuple[str | None, str | None]]  # file -> (installed, rebuilt) sha256
    where: dict[str, list[str]]  # file -> the parts that differ
    seconds: float

    @property
    def same(self) -> bool:
        return bool(self.compared) and not self.where


def check_rebuild(pin: Pin, target_name: str, *, home: Path, wheelhouse_root: Path,
                  mirror: str | None = None, externals_dir: Path | None = None,
                  scratch_root: Path | None = None, no_gpu: bool = False) -> CheckOutcome:
    """Nix's ``--check`` for a source oracle: build the pin again, cold (ccache into a
    throwaway folder: every object compiled, with the command lines the first build ran),
    in a scratch home at another path (``scratch_root``, default ``<home>/check``), from
    the same wheelhouse without taking or leaving a built wheel there; then compare every
    compiled file with the installed oracle's, byte for byte, and name the ELF parts of
    those that differ. The scratch home is removed, whatever happens."""
    import shutil
    import tempfile

    from oracle_build.contracts.pins import FromSource
    from oracle_build.core.errors import OracleMissing, Refused
    from oracle_build.oracle import elf

    src = pin.model.vllm
    if not isinstance(src, FromSource):
        raise Refused(f"{pin.path}: a wheel pin installs its wheel by sha256: there is "
                      "nothing to rebuild (--check is for a pin built from source)")
    installed = layout.oracle_path(home, pin.key)
    if not OracleVenv(installed).exists():
        raise OracleMissing(f"no oracle for pin {pin.key} in {home}: --check compares a "
                            "rebuild with the oracle in place",
                            hint="`build_oracle` builds it first")
    start = time.monotonic()
    root = scratch_root or home / "check"
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{pin.key}-", dir=root))
    try:
        say(f"--check: a cold rebuild of {pin.key} in {scratch} (removed afterwards), "
            f"compared with {installed}")
        build_oracle(pin, target_name, home=scratch, wheelhouse_root=wheelhouse_root,
                     mirror=mirror, externals_dir=externals_dir, compiler_cache=False,
                     reuse_built=False, compare_only=True, no_gpu=no_gpu)
        rebuilt_venv = layout.oracle_path(scratch, pin.key)
        first = inventory.compiled_files(installed, src.distribution)
        second = inventory.compiled_files(rebuilt_venv, src.distribution)
        compared = {n: (first.get(n), second.get(n)) for n in sorted(set(first) | set(second))}
        where: dict[str, list[str]] = {}
        site = f"lib/python{pin.model.python}/site-packages"
        for name, (a, b) in compared.items():
            if a == b:
                continue
            if a is None or b is None:
                where[name] = [f"only in the {'rebuild' if a is None else 'installed oracle'}"]
            else:
                where[name] = elf.differences(installed / site / name,
                                              rebuilt_venv / site / name) or ["bytes"]
        return CheckOutcome(compared, where, time.monotonic() - start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
