"""The gate host as it comes: nox on any Python >= 3.11, no session ever skipped for a
missing interpreter, the command's own exit code through nox, and the harness's
dependencies installable on aarch64 (checked against the registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.conftest import CPU_PIN, REPO

NOX = [sys.executable, "-m", "nox"]


def nox(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOX, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1"})


def test_no_session_pins_an_interpreter() -> None:
    listing = nox("-l")
    assert listing.returncode == 0, listing.stderr
    every = [line[2:].split(" -> ")[0] for line in listing.stdout.splitlines()
             if line[:2] in ("* ", "- ")]
    done = nox("-l", "--json", "-s", *every)
    assert done.returncode == 0, done.stderr
    sessions = json.loads(done.stdout)
    assert len(sessions) == len(every) >= 10
    names = {s["name"] for s in sessions}
    assert {"build_oracle", "capture", "verify", "tests", "lint"} <= names
    assert [s["name"] for s in sessions if s["python"] is not None] == []
    assert all(s["description"] for s in sessions), "every session has a docstring"


def test_a_missing_interpreter_fails_instead_of_skipping() -> None:
    # The interpreter hidden: nox's default would print "skipped" and exit 0.
    done = nox("--force-python", "3.99", "-s", "lint", timeout=120)
    assert done.returncode != 0, done.stderr
    assert "3.99" in done.stderr and "not found" in done.stderr
    assert "skipped" not in done.stderr.lower()


@pytest.mark.slow
def test_absent_pin_python_is_exit_6_through_nox(tmp_path: Path) -> None:
    pins = tmp_path / "pins"
    pins.mkdir()
    (pins / "cpu.lock.txt").write_text((CPU_PIN.parent / "cpu.lock.txt").read_text())
    odd = pins / "odd.toml"
    odd.write_text(CPU_PIN.read_text().replace('python = "3.11"', 'python = "3.99"'))
    done = nox("-s", "build_oracle", "--", "--pin", str(odd), "--home", str(tmp_path / "h"))
    said = done.stdout + done.stderr
    assert done.returncode == 6, said[-2000:]
    assert "no Python 3.99 on this host" in said
    assert "uv python install 3.99" in said
    assert not (tmp_path / "h" / "oracles").exists()


def _harness_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["test"]]


@pytest.mark.slow
@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_harness_dependencies_have_aarch64_wheels(tmp_path: Path, python: str) -> None:
    """Resolve the harness's dependencies (and the test extras, nox included) for an aarch64
    Linux host from the registry, wheels only: a dependency without an aarch64 wheel for
    this Python fails the resolution."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
         "--platform", "manylinux_2_39_aarch64", "--platform", "manylinux_2_28_aarch64",
         "--platform", "manylinux2014_aarch64", "--platform", "linux_aarch64",
         "--target", str(tmp_path / "target"), "--report", str(report),
         *_harness_requirements()],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    names = {canonicalize_name(item["metadata"]["name"]): item for item in items}
    for compiled in ("pydantic-core", "uv", "numpy"):
        url = names[compiled]["download_info"]["url"]
        assert "aarch64" in url, (compiled, url)
    for item in items:
        url = item["download_info"]["url"]
        assert url.endswith(".whl"), url
        assert "x86_64" not in url, url
