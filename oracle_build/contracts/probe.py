"""What the identity probe (``inside/probe.py``, run by the oracle's own python, alone or in
the engine host) answers, and what a build plan resolves before it runs.

The probe's answer comes from a process inside the oracle venv: a venv edited by hand, or a
python that is not ours, can answer anything. It is validated here before identity compares
a single field, and written as ``oracle-build/identity.json`` beside the build record. The
plan's resolution is printed first and written as ``resolved.json`` in the build's staging
folder, then recorded in the build record (``resolved``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from oracle_build.contracts.base import Strict


class ProbePython(Strict):
    """The interpreter that answered: the venv's own, isolated (``-I``), in a neutral cwd."""

    executable: str
    version: str
    prefix: str
    base_prefix: str
    real_prefix: str
    purelib: str
    platlib: str
    sys_path: list[str]
    isolated: bool
    user_site_enabled: bool
    cwd: str


class ProbeDistribution(Strict):
    """One installed distribution as importlib.metadata finds it."""

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    location: str


class ProbeExtension(Strict):
    """A compiled extension in the vLLM package."""

    path: str
    size: int = Field(ge=0)


class ProbeKernel(Strict):
    """The kernel check: a compiled op run against a reference, or the extension imported.
    Which keys beside ``ok`` appear depends on the check and how it ended."""

    model_config = ConfigDict(extra="allow", frozen=True)

    ok: bool
    op: str | None = None
    error: str | None = None


class ProbeFacts(Strict):
    """``oracle-build/identity.json``: the facts identity compares with the pin."""

    probe_schema: Literal[1]
    python: ProbePython
    env: dict[str, str]  # the recorded prefixes' variables, as the probe saw them
    startup_files: dict[str, str]  # .pth files and sitecustomize: path -> sha256
    distributions: dict[str, ProbeDistribution]  # canonical name -> the one installed
    duplicate_distributions: dict[str, list[ProbeDistribution]]
    # per module: version, file and import seconds, or its error (torch: cuda, hip, devices)
    modules: dict[str, dict[str, Any]]
    kernel: ProbeKernel
    libraries: dict[str, Any]  # the shared libraries mapped: prefix, files (path -> sha256)
    # present once vLLM imported
    extensions: list[ProbeExtension] | None = None
    vllm_package: dict[str, Any] | None = None  # commit_id, rust_frontend
    cpu_kernels: dict[str, Any] | None = None  # the CPU kernel library loaded, the variant
    hold_error: str | None = None  # the kernel variant's hold failed in the probe's process
    # added by the harness: the machine it ran on, and the staging path of a moved venv
    machine: str | None = None
    relocated_from: str | None = None


class ResolvedPlan(Strict):
    """Everything a build is about to use (``Plan.resolved()``): printed first, written as
    ``resolved.json`` in the staging folder, recorded in the build record."""

    pin: str
    pin_id: str
    pin_hash: str
    target: str
    device: str
    vllm: str  # "git REPO @ COMMIT" or "wheel DIST==VERSION sha256:HEX"
    expected_runtime_version: str
    python: str
    torch: str | None
    expected_distribution_version: str | None
    packages: dict[str, str]
    venv: str
    staging: str
    wheelhouse: str
    mirror: str | None
    externals_dir: str | None
    build_env: dict[str, str]
    from_wheelhouse: bool
    rust_frontend: str | None
    checkout: str | None
