"""The real CPU pin's build killed in each step where its size matters, then the build that
recovers. A file of its own (its helpers are test_faults.py's) so that the suite's two
workers (`--dist loadfile`) can run it beside the rest of test_faults.py: alone it takes
as long as either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle_build import recipe
from tests.conftest import CPU_PIN, BuiltOracle
from tests.test_faults import BUILD_STEPS, kill_every_step

pytestmark = pytest.mark.slow


# The CPU pin's steps where its size (1.3 GB of wheels, a 3.4 GB venv) changes what a kill
# meets: the wheelhouse's hashing, the install's 3.4 GB of writes, identity's hashing of
# every file beside the probe. Every step of a build, publish and the source steps included,
# is killed on the small source package (test_source_build_killed_at_every_step_...).
REAL_PIN_STEPS = ["preflight", "venv", "fetch", "install", "identity"]


@pytest.mark.timeout(2400)
def test_build_killed_at_every_step_then_recovers(cpu_oracle: BuiltOracle,
                                                  tmp_path: Path) -> None:
    """The real CPU pin killed in each step where its size matters. Slow: a kill inside
    identity first needs a whole install (about a minute) before it."""
    home = tmp_path / "home"
    args = ["build", "--pin", str(CPU_PIN), "--home", str(home), "--wheelhouse",
            str(cpu_oracle.wheelhouse)]
    assert [s.name for s in recipe.plan(cpu_oracle.pin, "cpu", home=home,
                                        wheelhouse_root=cpu_oracle.wheelhouse).steps] \
        == BUILD_STEPS
    record = json.loads((cpu_oracle.venv / "oracle-build" / "build-record.json").read_text())
    kill_every_step(args, cpu_oracle.pin, home, BUILD_STEPS, record["timings"],
                    seed=20261130, label="build_oracle", steps=REAL_PIN_STEPS)
