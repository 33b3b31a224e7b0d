"""build_oracle: pin + target -> plan (``plan.py``) -> steps run in a staging folder
(``steps.py``) -> identity -> build record and the publishing rename (``record.py``).
``source.py`` is the git checkout, ``wheelhouse.py`` the hash-checked wheel store,
``lock.py`` the lock regeneration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oracle_build.contracts.pins import Pin
from oracle_build.contracts.record import RECORD_SCHEMA
from oracle_build.core import layout
from oracle_build.core.errors import IdentityMismatch
from oracle_build.core.filelock import held
from oracle_build.core.files import json_value
from oracle_build.core.log import fmt_seconds, say
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import OracleVenv
from oracle_build.recipe.plan import Plan, plan
from oracle_build.recipe.steps import run

__all__ = ["BuildOutcome", "Plan", "build_oracle", "build_until", "plan", "run"]


def record_schema(oracle: OracleVenv) -> int:
    """The schema of an oracle's build record (0: none, or unreadable)."""
    try:
        value = json_value(oracle.record_path.read_text()).get("record_schema", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


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
                 compiler_cache: bool = True) -> BuildOutcome:
    """The pin's oracle for this target: re-checked if in place, else built and published.
    ``fill_wheelhouse``: called under the build lock before a build is planned (the oracle
    cache's pull), so the plan takes what it put there. ``compiler_cache``: False compiles
    every object anew."""
    start = time.monotonic()
    oracle = OracleVenv(layout.oracle_path(home, pin.key))
    target = pin.target(target_name)
    with held(layout.build_lock(home, pin.key), what=f"build_oracle {pin.key}", wait=wait):
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
            ident = identity.check(pin, target, oracle.path, deep=True)
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
                 compiler_cache=compiler_cache)
        say(p.render())
        made = run(p)
        assert made is not None  # a plan without stop_after runs to its publish
        say(f"built in {fmt_seconds(time.monotonic() - start)}; record: {oracle.record_path}")
        return BuildOutcome(made, True, time.monotonic() - start)


def build_until(pin: Pin, target_name: str, stop_after: str, *, home: Path,
                wheelhouse_root: Path, mirror: str | None = None,
                externals_dir: Path | None = None, checkout: Path | None = None,
                compiler_cache: bool = True, wait: bool = True) -> float:
    """The build of the pin's oracle up to ``stop_after`` (a step's name, or "configure"),
    whatever is in place, under the same lock; nothing is published. Its seconds. A source
    pin's build compiles even when the wheelhouse holds a wheel built earlier: the build
    being looked at is this one."""
    start = time.monotonic()
    with held(layout.build_lock(home, pin.key), what=f"build_oracle {pin.key}", wait=wait):
        p = plan(pin, target_name, home=home, wheelhouse_root=wheelhouse_root, mirror=mirror,
                 externals_dir=externals_dir, checkout=checkout,
                 compiler_cache=compiler_cache, stop_after=stop_after, reuse_built=False)
        say(p.render())
        run(p)
    return time.monotonic() - start
