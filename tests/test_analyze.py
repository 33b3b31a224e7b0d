"""compare (offline), margin and determinism (real engine)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from oracle_build.cli import main
from oracle_build.contracts import schemas
from oracle_build.contracts.golden import load_golden
from tests.conftest import TINY_SPEC, BuiltOracle


def candidate_from_golden(tmp_path: Path, edit: dict[tuple[int, int], int] | None = None,
                          ids: bool = True, source: Path = TINY_SPEC) -> Path:
    golden = load_golden(source)
    prompts = []
    for n, p in enumerate(golden.prompts):
        toks = list(p.token_ids)
        for (pi, pos), tok in (edit or {}).items():
            if pi == n:
                toks[pos] = tok
        entry = {"prompt_token_ids": p.prompt_token_ids, "token_ids": toks}
        if ids:
            entry["id"] = p.id
        prompts.append(entry)
    path = tmp_path / "candidate.json"
    path.write_text(json.dumps({"candidate_schema": 1, "engine": "test", "prompts": prompts}))
    return path


def test_compare_offline_pass_and_drift(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(TINY_SPEC / "golden.json"),
                 str(candidate_from_golden(tmp_path, ids=False))]) == 0
    assert "STRICT token-exact 3/3" in capsys.readouterr().out
    golden = load_golden(TINY_SPEC)
    pos = golden.prompt_topk(2)[4]
    cand = candidate_from_golden(tmp_path, {(2, 4): pos[1][0]})
    assert main(["compare", str(TINY_SPEC), str(cand), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    r = out["results"][2]
    assert r["index"] == 4 and r["new_token"] == pos[1][0]
    assert r["golden_margin"] == pytest.approx(pos[0][1] - pos[1][1])
    assert r["kind"] == ("near_tie" if pos[0][1] - pos[1][1] <= 0.5 else "real")


@pytest.mark.parametrize(("payload", "field"), [
    ({"candidate_schema": 1, "prompts": [{"prompt_token_ids": [1], "token_ids": [-1]}]},
     "prompts[0].token_ids[0]"),
    ({"candidate_schema": 1, "prompts": [{"prompt_token_ids": [1], "token_ids": [1],
                                          "topk": []}]}, "prompts[0]"),
    ({"candidate_schema": 9, "prompts": []}, "candidate_schema"),
    ({"prompts": []}, "candidate_schema"),
    ({"candidate_schema": 1, "prompts": [{"id": "nope", "prompt_token_ids": [1],
                                          "token_ids": [1]}]}, "prompts[0].id"),
])
def test_bad_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       payload: dict[str, object], field: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(payload))
    assert main(["compare", str(TINY_SPEC), str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and f"{field}:" in err and "Traceback" not in err


@pytest.mark.slow
def test_margin_teacher_forced(cpu_oracle: BuiltOracle, host_golden: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    golden = load_golden(host_golden)
    p = golden.prompts[0]
    rows = golden.prompt_topk(0)
    assert rows is not None
    pos = 5
    cand = candidate_from_golden(tmp_path, {(0, pos): rows[pos][1][0]}, source=host_golden)
    assert main(["margin", str(host_golden), p.id, str(pos), "--json", "--candidate", str(cand),
                 "--home", str(cpu_oracle.home)]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, schemas.committed("margin.schema.json"))
    assert report["argmax"] == p.token_ids[pos] == report["golden_token"]
    recorded = rows[pos][0][1] - rows[pos][1][1]
    assert report["top2_margin_nats"] == pytest.approx(recorded, abs=1e-3)
    assert report["candidate_token"] == rows[pos][1][0]
    assert report["candidate_gap_mnats"] == pytest.approx(recorded * 1000, abs=1)
    assert len(report["topk"]) >= 20


@pytest.mark.slow
def test_determinism_probe(cpu_oracle: BuiltOracle, host_golden: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    assert main(["determinism", str(host_golden), "--legs", "3", "--json", "--home",
                 str(cpu_oracle.home)]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, schemas.committed("determinism.schema.json"))
    assert report["deterministic"] is True and report["legs"] == 3
    assert [leg["matches_golden"] for leg in report["per_leg"]] == [3, 3, 3]
