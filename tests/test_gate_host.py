"""The gate host as it comes: nox on any Python >= 3.11, no session ever skipped for a
missing interpreter, the command's own exit code through nox, and the harness's
dependencies installable on aarch64 (checked against the registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from packaging.utils import canonicalize_name

from tests.conftest import CPU_PIN, REPO, BuiltOracle, copy_tree_for_golden, golden_says

NOX = [sys.executable, "-m", "nox"]


def nox(*args: str, timeout: float = 900, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOX, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1", **env})


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
    """Slow: a real nox run (its session venv and the project installed in it); the build stops
    at preflight."""
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


@pytest.mark.slow
def test_verify_exit_codes_through_nox(cpu_oracle: BuiltOracle, host_golden: Path,
        tmp_path: Path, junit_xsd: Path) -> None:
    """0 pass, 1 drift, 2 bad input, 3 identity, 4 configuration: what `nox -s verify`
    itself exits with, as a CI job sees it (real engine for 0, 1 and 4)."""
    folder = copy_tree_for_golden(tmp_path, source=host_golden)
    original = json.loads((folder / "golden.json").read_text())

    junit, summary, step = tmp_path / "junit.xml", tmp_path / "summary.md", tmp_path / "step.md"
    step.write_text("# earlier steps\n")

    def run_with(edit: Callable[[dict[str, Any]], None] | None, raw: str | None = None
                 ) -> subprocess.CompletedProcess[str]:
        data = json.loads(json.dumps(original))
        if edit is not None:
            edit(data)
        (folder / "golden.json").write_text(raw if raw is not None else json.dumps(data))
        return nox("-s", "verify", "--", str(folder), "--home", str(cpu_oracle.home),
                   "--junit-xml", str(junit), "--summary-md", str(summary),
                   GITHUB_STEP_SUMMARY=str(step))

    def drift(d: dict[str, Any]) -> None:  # the golden says another token at position 5
        golden_says(d, 0, 5, (d["prompts"][0]["token_ids"][5] + 1) % 300,
                    keep_original=False)

    def identity(d: dict[str, Any]) -> None:
        d["oracle"]["identity"]["vllm"] = "0.31.0"

    def configuration(d: dict[str, Any]) -> None:
        d["engine"]["requested"]["max_num_seqs"] = 8  # re-run as recorded: resolves 8, not 4

    cases = [(None, None, 0, "=> PASS"), (drift, None, 1, "=> DRIFT"),
             (None, "{not json", 2, "bad input"), (identity, None, 3, "ORACLE MISMATCH"),
             (configuration, None, 4, "CONFIGURATION DIFFERENCE")]
    for edit, raw, code, text in cases:
        junit.unlink(missing_ok=True)
        done = run_with(edit, raw)
        assert done.returncode == code, (code, done.stdout[-2000:], done.stderr[-2000:])
        assert text in done.stdout + done.stderr, (code, done.stdout[-2000:])
        if code == 2:
            assert not junit.exists()  # bad input: no report at all, not a half one
            continue
        xmlschema.XMLSchema(str(junit_xsd)).validate(junit.read_text())  # CI's schema
        suites = ET.parse(junit).getroot()
        assert suites.tag == "testsuites" and suites.get("tests") == "3"
        cases_ = suites.findall("testsuite/testcase")
        assert [c.get("name") for c in cases_] == ["capital", "fibonacci", "ids"]
        assert {c.get("classname") for c in cases_} == {"tiny-llama-greedy"}
        failures = suites.findall("testsuite/testcase/failure")
        errors = suites.findall("testsuite/testcase/error")
        assert suites.get("failures") == str(len(failures))
        assert suites.get("errors") == str(len(errors))
        if code == 0:
            assert not failures and not errors
            assert "**gate:** strict (strict token-exact): PASS" in summary.read_text()
        elif code == 1:
            (failure,) = failures
            assert failure.get("message", "").startswith("first divergence at position 5: ")
            assert "golden margin" in failure.get("message", "")
            assert "| capital | = | 5/24 | 5 |" in summary.read_text()
            assert "FAIL" in summary.read_text()
        else:  # identity or configuration: every prompt an error, not a failure
            assert len(errors) == 3 and not failures
            kind = "oracle_mismatch" if code == 3 else "config_difference"
            assert {e.get("type") for e in errors} == {kind}
    # each run appended its summary to the step summary, after what was there
    text = step.read_text()
    assert text.startswith("# earlier steps\n") and text.count("## oracle-build verify") == 4


@pytest.mark.slow
def test_pythoninspect_cannot_change_an_exit_code(tmp_path: Path) -> None:
    """Slow: a nox session of its own (the harness venv is reused). PYTHONINSPECT=1 in the
    caller's environment turned every exit code into 1 with a SystemExit traceback: the CLI
    and a nox session now end with the tool's own code (2 bad input, 7 no oracle)."""
    env = {**os.environ, "PYTHONINSPECT": "1"}
    cli = subprocess.run([sys.executable, "-m", "oracle_build", "verify",
                          str(tmp_path / "none")], cwd=REPO, env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert cli.returncode == 2, cli.stderr[-2000:]
    assert "Traceback" not in cli.stderr
    done = subprocess.run([*NOX, "-s", "identity", "--", "--home", str(tmp_path / "home")],
                          cwd=REPO, env={**env, "NO_COLOR": "1"}, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert done.returncode == 7, done.stderr[-2000:]
    assert "running nox again without it" in done.stderr
