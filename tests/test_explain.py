"""explain against the real CPU engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from oracle_build.cli import main
from oracle_build.contracts import schemas
from oracle_build.services.explain import parse_vary
from tests.conftest import BuiltOracle, copy_tree_for_golden, golden_says


def edit(folder: Path, change: Any) -> None:
    path = folder / "golden.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_parse_vary() -> None:
    assert parse_vary(["dtype=float32,bfloat16", "enforce_eager=true,false",
                       "max_num_seqs=1,256", "batch=all"]) == {
        "dtype": ["float32", "bfloat16"], "enforce_eager": [True, False],
        "max_num_seqs": [1, 256], "batch": ["all"]}
    assert main(["explain", "goldens/tiny-llama-greedy", "--vary", "dtype"]) == 2


@pytest.mark.slow
def test_explain_names_the_setting_and_reproduces(cpu_oracle: BuiltOracle, host_golden: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The golden was captured in float32; its record now claims bfloat16, so explain starts
    # from a configuration that differs in a setting that moves its tokens.
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    folder = copy_tree_for_golden(tmp_path, source=host_golden)
    edit(folder, lambda d: d["engine"]["requested"].update(dtype="bfloat16"))
    out = tmp_path / "explain.json"
    code = main(["explain", str(folder), "--vary", "dtype=float32",
                 "--vary", "max_model_len=512", "--vary", "batch=all", "--budget", "4",
                 "--out", str(out), "--home", str(cpu_oracle.home)])
    text = capsys.readouterr().out
    assert code == 0, text
    report = json.loads(out.read_text())
    jsonschema.validate(report, schemas.committed("explain.schema.json"))
    by = {c["name"]: c for c in report["candidates"]}
    assert by["base"]["status"] == "ok" and not by["base"]["reproduces_all"]
    assert by["dtype=float32"]["reproduces_all"] is True
    assert report["smallest_reproducing"] == {"dtype": "float32"}
    settings = {s["setting"]: s for s in report["settings"]}
    assert settings["dtype"]["matters"] is True
    assert settings["max_model_len"]["matters"] is False
    assert "dtype MATTERS" in text and "max_model_len does not matter" in text
    assert "REPRODUCED: every prompt token-exact with dtype=float32" in text
    # base and batch=all share one engine start; dtype and max_model_len one each
    assert report["engine_starts"] == 3
    # every candidate is recorded as capture records it
    res = by["dtype=float32"]["engine"]["resolved"]
    assert res["dtype"]["value"] == "torch.float32" and "num_gpu_blocks" in res
    assert by["base"]["engine"]["resolved"]["dtype"]["value"] == "torch.bfloat16"
    base_p = by["base"]["prompts"]
    assert any(not p["reproduces"] and p["index"] is not None for p in base_p)
    # the golden itself is untouched by explain
    assert json.loads((folder / "golden.json").read_text())["engine"]["requested"][
        "dtype"] == "bfloat16"


@pytest.mark.slow
def test_impossible_golden_and_budget(cpu_oracle: BuiltOracle, host_golden: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    folder = copy_tree_for_golden(tmp_path, source=host_golden)

    def scramble(d: dict[str, Any]) -> None:  # a token no configuration gives, at position 3
        for n, p in enumerate(d["prompts"]):
            golden_says(d, n, 3, (p["token_ids"][3] + 1) % 300, keep_original=False)

    edit(folder, scramble)
    out = tmp_path / "explain.json"
    code = main(["explain", str(folder), "--vary", "dtype=bfloat16",
                 "--vary", "max_num_seqs=1", "--vary", "enable_prefix_caching=true",
                 "--budget", "2", "--out", str(out), "--home", str(cpu_oracle.home)])
    text = capsys.readouterr().out
    assert code == 0
    report = json.loads(out.read_text())
    assert report["engine_starts"] == 2  # the budget is respected
    statuses = {c["name"]: c["status"] for c in report["candidates"]}
    assert list(statuses.values()).count("not_tried") == 2
    assert report["smallest_reproducing"] is None
    assert "NOT REPRODUCIBLE by any configuration tried" in text
    for c in report["candidates"]:
        if c["status"] == "ok":
            # no configuration gets past the hand-edited position 3
            assert all(p["index"] is not None and p["index"] <= 3 for p in c["prompts"])
