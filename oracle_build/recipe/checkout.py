"""What a vLLM checkout says about building it, read from its own files (never guessed):
the CMake externals a build fetches (build/cmake.py), its build requirements
(build/requirements.py), the precompiled-kernel switches vllm/envs.py and setup.py read,
the Rust front end's toolchain (rust-toolchain.toml) and whether setup.py builds it, and
vllm/_version.py's commit id, where the tree has one (release sdists do); then what of it
disagrees with the pin (pin_problems).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle_build import devices
from oracle_build.recipe.cmake import Declared, scan_externals
from oracle_build.recipe.requirements import (
    Requirements,
    build_requirements,
    split_torch,
    torch_disagreement,
)

SWITCH = re.compile(r"\b(VLLM_[A-Z0-9_]*PRECOMPILED[A-Z0-9_]*)\b")


def precompiled_switches(checkout: Path) -> list[str]:
    """Every VLLM_*PRECOMPILED* variable vllm/envs.py and setup.py read."""
    names: set[str] = set()
    for rel in ("vllm/envs.py", "setup.py"):
        path = checkout / rel
        if path.is_file():
            names.update(SWITCH.findall(path.read_text(errors="replace")))
    return sorted(names)


@dataclass(frozen=True)
class RustFacts:
    toolchain: str | None  # rust-toolchain.toml's channel
    setup_builds_it: bool  # setup.py passes rust_extensions (optional unless required)
    require_switch: str | None  # the variable that makes it mandatory


def rust_facts(checkout: Path) -> RustFacts:
    channel = None
    tc = checkout / "rust-toolchain.toml"
    if tc.is_file():
        channel = tomllib.loads(tc.read_text()).get("toolchain", {}).get("channel")
    setup = (checkout / "setup.py").read_text(errors="replace") if (
        checkout / "setup.py").is_file() else ""
    switch = re.search(r"\b(VLLM_REQUIRE_RUST_FRONTEND)\b", setup)
    return RustFacts(str(channel) if channel else None, "rust_extensions=" in setup,
                     switch.group(1) if switch else None)


COMMIT_ID = re.compile(r"__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"](g?[0-9a-f]+)['\"]")


def commit_id_in(version_py: str) -> str | None:
    """``__commit_id__`` as vllm/_version.py's text records it (``g<hex>``), or None."""
    m = COMMIT_ID.search(version_py)
    return m.group(1) if m else None


def version_commit_id(checkout_or_package: Path) -> str | None:
    """``__commit_id__`` from vllm/_version.py (``g<hex>``), where the file has one."""
    for path in (checkout_or_package / "vllm" / "_version.py",
                 checkout_or_package / "_version.py"):
        if path.is_file():
            found = commit_id_in(path.read_text(errors="replace"))
            if found:
                return found
    return None


@dataclass
class CheckoutFacts:
    externals: list[Declared]
    other_device_externals: dict[str, list[Declared]] = field(default_factory=dict)
    switches: list[str] = field(default_factory=list)
    requirements: Requirements | None = None
    rust: RustFacts | None = None
    commit_id: str | None = None


def read_checkout(checkout: Path, *, device: str, machine: str,
                  preferred_requirements: str = "auto") -> CheckoutFacts:
    facts = CheckoutFacts(scan_externals(checkout, device=device, machine=machine))
    for other in devices.names():
        if other != device:
            names = {d.name for d in facts.externals}
            facts.other_device_externals[other] = [
                d for d in scan_externals(checkout, device=other, machine=machine)
                if d.name not in names]
    facts.switches = precompiled_switches(checkout)
    found = build_requirements(checkout, device=device, preferred=preferred_requirements)
    split = split_torch(found.lines, checkout / "pyproject.toml")
    # The build runs without isolation: the device file's torch is the one its build uses
    # (vLLM 0.32.0's pyproject says torch == 2.13.0, its ROCm file torch==2.12.0+rocm7.14.0);
    # pyproject's decides only when the file names none.
    file_torch = split_torch(found.file, checkout / "pyproject.toml").torch
    facts.requirements = Requirements(split.lines, file_torch or split.torch, found.sources,
                                      found.options)
    facts.rust = rust_facts(checkout)
    facts.commit_id = version_commit_id(checkout)
    return facts


# Read from vLLM 0.32.0's vllm/envs.py and setup.py: the switches a plan removes when it has
# no checkout to read them from (a plan with --checkout lists the tree's own).
KNOWN_SWITCHES = ("VLLM_PRECOMPILED_WHEEL_COMMIT", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                  "VLLM_PRECOMPILED_WHEEL_VARIANT", "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX",
                  "VLLM_USE_PRECOMPILED", "VLLM_USE_PRECOMPILED_RUST")


def pin_problems(facts: CheckoutFacts, externals: list[Any], rust_frontend: str | None,
                 torch_version: str | None, machine: str) -> list[str]:
    """Where a pin and a checkout disagree on what the build needs; each names both."""
    problems = []
    pinned = {e.name: e for e in externals}
    for dec in facts.externals:
        ext = pinned.get(dec.name)
        if ext is None:
            problems.append(
                f"the checkout's cmake declares external {dec.name} ({dec.repository} @ "
                f"{dec.tag}, {dec.source}, read from ${dec.src_dir_var or '?'}), which the "
                "pin does not list: CMake would fetch it, or with "
                "FETCHCONTENT_FULLY_DISCONNECTED fail deep in configure")
            continue
        if dec.is_commit and ext.established and ext.commit != dec.tag:
            problems.append(f"external {dec.name}: the checkout declares commit {dec.tag} "
                            f"({dec.source}), the pin says {ext.commit}")
        elif dec.tag and not dec.is_commit and ext.tag != dec.tag:
            problems.append(f"external {dec.name}: the checkout declares tag {dec.tag} "
                            f"({dec.source}), the pin says tag {ext.tag}")
        if dec.src_dir_var and ext.src_dir_var != dec.src_dir_var:
            problems.append(f"external {dec.name}: the checkout reads ${dec.src_dir_var}, "
                            f"the pin sets ${ext.src_dir_var}")
    declared = {d.name for d in facts.externals}
    for name in pinned:
        if name not in declared:
            problems.append(f"the pin lists external {name}, which this checkout's cmake "
                            "does not fetch for this target")
    if facts.rust is not None and facts.rust.setup_builds_it and rust_frontend is None:
        problems.append("setup.py builds an optional Rust front end (vllm/vllm-rs, toolchain "
                        f"{facts.rust.toolchain}) when cargo is present: the pin must say "
                        "[build] rust_frontend = \"build\" or \"skip\"")
    if facts.requirements is not None and torch_version is not None:
        why = torch_disagreement(facts.requirements.torch, torch_version, machine=machine)
        if why:
            problems.append(f"torch: {why}")
    return problems
