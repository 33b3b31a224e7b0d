"""Shared fixtures. Slow ones build real things once per session: the CPU oracle (a real
venv with the real vLLM), a capture with the real engine. The wheelhouse is shared
with the developer's default one (every wheel is sha256-checked before use), so a
second run does not download 1.3 GB again."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oracle_build import build
from oracle_build.pins import Pin, load_pin

REPO = Path(__file__).resolve().parent.parent
CPU_PIN = REPO / "pins" / "cpu.toml"
GPU_PIN = REPO / "pins" / "vllm-555967922.toml"
TINY_SPEC = REPO / "goldens" / "tiny-llama-greedy"


def shared_wheelhouse() -> Path:
    env = os.environ.get("ORACLE_BUILD_TEST_WHEELHOUSE")
    if env:
        return Path(env)
    return build.default_wheelhouse(build.default_home())


@pytest.fixture(autouse=True)
def _no_env_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ORACLE_BUILD_HOME", "ORACLE_BUILD_PIN", "ORACLE_BUILD_VLLM_MIRROR",
                "ORACLE_BUILD_EXTERNALS"):
        monkeypatch.delenv(key, raising=False)


@dataclass
class BuiltOracle:
    pin: Pin
    home: Path
    wheelhouse: Path
    venv: Path
    outcome: build.BuildOutcome


@pytest.fixture(scope="session")
def cpu_oracle(tmp_path_factory: pytest.TempPathFactory) -> BuiltOracle:
    """The real CPU oracle, built once per session through build_oracle itself."""
    home = tmp_path_factory.mktemp("oracle-home")
    pin = load_pin(CPU_PIN)
    wheelhouse = shared_wheelhouse()
    outcome = build.build_oracle(pin, "cpu", home=home, wheelhouse_root=wheelhouse)
    return BuiltOracle(pin, home, wheelhouse, build.oracle_path(home, pin), outcome)


@pytest.fixture
def scratch_venv(cpu_oracle: BuiltOracle, tmp_path: Path) -> Iterator[Path]:
    """A second real venv holding exactly the CPU oracle's locked set, installed offline
    from the wheelhouse, for tests that damage a venv."""
    venv = tmp_path / "venv"
    uv = build.uv()
    env = {**build.scrubbed_env(), **build.uv_env()}
    subprocess.run([uv, "venv", "--python", "3.11", "--no-project", str(venv)], check=True,
                   env=env, capture_output=True)
    req = tmp_path / "req.txt"
    req.write_text("".join(e.requirement_line() + "\n" for e in cpu_oracle.pin.require_lock()))
    subprocess.run([uv, "pip", "install", "--python", str(venv / "bin" / "python"),
                    "--offline", "--no-index", "--find-links",
                    str(cpu_oracle.wheelhouse / cpu_oracle.pin.key), "--no-deps",
                    "--require-hashes", "-r", str(req)], check=True, env=env,
                   capture_output=True)
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


@dataclass
class Captured:
    oracle: BuiltOracle
    golden_path: Path


@pytest.fixture(scope="session")
def captured(cpu_oracle: BuiltOracle, tmp_path_factory: pytest.TempPathFactory) -> Captured:
    """The embedded default spec captured once by the real CPU engine (one engine start)."""
    from oracle_build.capture import capture

    out = tmp_path_factory.mktemp("captured")
    (path,) = capture([TINY_SPEC], home=cpu_oracle.home, out=out)
    return Captured(cpu_oracle, path)


def copy_tree_for_golden(tmp_path: Path, name: str = "tiny-llama-greedy") -> Path:
    """A goldens/<name>/ folder beside a pins/ copy, so a golden's relative pin resolves."""
    shutil.copytree(REPO / "pins", tmp_path / "pins")
    dest = tmp_path / "goldens" / name
    dest.mkdir(parents=True)
    shutil.copy2(TINY_SPEC / "spec.toml", dest / "spec.toml")
    shutil.copy2(TINY_SPEC / "golden.json", dest / "golden.json")
    return dest


def reliability(section: str, case: str) -> None:
    """Count a fault case survived, for the README's Reliability figures
    (written only when ORACLE_BUILD_RELIABILITY_OUT names a file)."""
    import json

    dest = os.environ.get("ORACLE_BUILD_RELIABILITY_OUT")
    if not dest:
        return
    path = Path(dest)
    data = json.loads(path.read_text()) if path.exists() else {}
    bucket = data.setdefault(section, {})
    bucket[case] = bucket.get(case, 0) + 1
    path.write_text(json.dumps(data, indent=2))
