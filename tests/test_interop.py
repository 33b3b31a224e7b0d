"""vllm.cpp formats: the real files from their repository, read as they are."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden
from oracle_build.core.errors import BadInput
from oracle_build.interop.vllmcpp import attributed_problems, export, import_path
from tests.conftest import REPO, TINY_SPEC, Captured

DATA = REPO / "tests" / "data" / "vllm.cpp"
SHARED = REPO.parent / "shared" / "interop" / "vllm.cpp"
LEGACY = DATA / "nemotron_35_lightning_greedy_legacy"
SCHEMA2 = DATA / "nemotron_35_lightning_greedy"
BATTERY = DATA / "opt_greedy"


def test_vendored_files_are_vllmcpps_unchanged() -> None:
    """The vendored files hash to what SHA256SUMS recorded when they were copied from
    vllm.cpp (via ../shared/interop). Where ../shared is beside the checkout (CI), every
    file there is also byte-identical here."""
    sums = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.removeprefix("./")] = digest
    vendored = sorted(str(f.relative_to(DATA)) for f in DATA.rglob("*")
                      if f.is_file() and f.name != "SHA256SUMS")
    assert sorted(sums) == vendored
    for name, digest in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    shared = sorted(f for f in SHARED.rglob("*") if f.is_file()) if SHARED.is_dir() else []
    for f in shared:
        assert (DATA / f.relative_to(SHARED)).read_bytes() == f.read_bytes(), f
    assert not SHARED.is_dir() or {str(f.relative_to(SHARED)) for f in shared} == set(sums)


def test_legacy_imports() -> None:
    g = import_path(LEGACY)
    assert g.source is not None and g.source.format == "vllm.cpp-legacy"
    assert len(g.prompts) == 3 and [len(p.token_ids) for p in g.prompts] == [32, 32, 32]
    assert g.prompts[0].prompt_token_ids == [1784, 8961, 1307, 5498, 1395]
    assert g.prompts[0].text == "The capital of France is"
    assert g.prompts[2].token_ids[27:30] == [2505, 1261, 9943]  # 29: where the rebuild diverged
    assert g.oracle.stated == {"vllm": "0.23.1rc1.dev1511+g555967922",  # type: ignore[union-attr]
                               "transformers": "5.14.1", "flashinfer": "0.6.15.post1"}
    assert g.sampling == {"temperature": 0.0, "max_tokens": 32}
    assert g.engine is None and "no engine setting" in g.unrecorded["engine"]
    assert g.model is not None and g.model.revision == "29f2d1746d8f41e316523194b19018707749b1b1"
    digest = hashlib.sha256((LEGACY / "oracle.json").read_bytes()).hexdigest()
    assert g.source.files == {"oracle.json": digest}


def test_schema2_unattributed_carries_its_reasons() -> None:
    g = import_path(SCHEMA2 / "oracle.json")
    raw = json.loads((SCHEMA2 / "oracle.json").read_text())
    assert g.source is not None and g.source.format == "vllm.cpp-schema2"
    assert g.unrecorded["engine"] == raw["capture"]["unrecoverable_reason"]
    assert g.source.source_fields["capture"]["issue"] == raw["capture"]["issue"]
    assert g.source.source_fields["capture"]["evidence"] == raw["capture"]["evidence"]
    assert [p.token_ids for p in g.prompts] == [p["token_ids"] for p in raw["golden"]]
    assert g.legs is None and g.nondeterministic is None and g.engine is None


def test_battery_imports() -> None:
    g = import_path(BATTERY)
    ids = np.load(BATTERY / "greedy_ids.npy")
    dist = np.load(BATTERY / "greedy_dist.npy")
    assert ids.shape == (6, 16) and dist.shape == (6, 16, 5)
    assert (dist == -1).sum() == 0  # this battery has no padding
    assert len(g.prompts) == 6 and all(len(p.token_ids) == 16 for p in g.prompts)
    assert g.prompts[0].prompt_token_ids == [2, 133, 812, 9, 1470, 16]
    assert [p.token_ids for p in g.prompts] == ids.tolist()
    assert g.legs is not None and g.legs.count == 5 and g.legs.agree
    assert g.nondeterministic is False and g.gate.kind == "strict"  # licenses a strict gate
    assert set(g.source.files) == {"greedy_ids.npy", "greedy_dist.npy",  # type: ignore[union-attr]
                                   *(f"p{i}_prompt.i32" for i in range(6))}


def battery_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "battery"
    shutil.copytree(BATTERY, dest)
    for f in dest.iterdir():
        f.chmod(0o644)
    return dest


def test_battery_padding_and_nondeterminism(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = battery_copy(tmp_path)
    dist = np.load(folder / "greedy_dist.npy")
    dist[1, 12:, 4] = -1  # run 4 of prompt 1 stopped early: padding, not disagreement
    dist[2, 5, 3] = dist[2, 5, 0] + 1  # run 3 emitted another token at [2,5]
    np.save(folder / "greedy_dist.npy", dist)
    g = import_path(folder)
    assert g.legs is not None and len(g.legs.tokens[4][1]) == 12
    assert g.nondeterministic_cells == [
        {"prompt": "p2", "position": 5, "values": sorted({int(dist[2, 5, 0]),
                                                          int(dist[2, 5, 0]) + 1})}]
    assert g.nondeterministic is True and g.gate.kind == "distributional"
    out = tmp_path / "goldens"
    assert main(["import", str(folder), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["verify", str(out / "battery")]) == 4
    text = capsys.readouterr().out
    assert "CONFIGURATION UNRECORDED: NOT ADJUDICABLE" in text
    assert "MEASURED NON-DETERMINISM at 1 cells: prompt p2 position 5" in text
    assert text.index("CONFIGURATION UNRECORDED") < text.index("tokens:")


def test_battery_candidate_and_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = battery_copy(tmp_path)
    ids = np.load(folder / "greedy_ids.npy")
    ours = ids.copy()
    ours[1, 7] += 1
    ours[3, 2] += 1
    gap = np.zeros_like(ids)
    gap[1, 7] = 320
    gap[3, 2] = 99_999_000
    np.save(folder / "our_ids.npy", ours)
    np.save(folder / "neartie_gap_mnats.npy", gap)
    out = tmp_path / "goldens"
    assert main(["import", str(folder), "--out", str(out), "--name", "opt"]) == 0
    capsys.readouterr()
    assert main(["verify", str(out / "opt"), "--json"]) == 4
    report = json.loads(capsys.readouterr().out)
    (v,) = report["goldens"]
    assert v["status"] == "config_unrecorded" and not v["adjudicable"]
    t = {r["prompt"]: r for r in v["tokens"]}
    assert (t["p1"]["index"], t["p1"]["golden_margin"], t["p1"]["kind"]) == (7, 0.32,
                                                                             "near_tie")
    assert (t["p3"]["index"], t["p3"]["golden_margin"], t["p3"]["kind"]) == (2, None, "real")
    assert t["p0"]["kind"] == "match"


def test_every_real_file_verifies_offline_with_the_banner(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "goldens"
    for src in (LEGACY, SCHEMA2, BATTERY):
        assert main(["import", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    paths = sorted(str(p) for p in out.glob("*/golden.json"))
    assert len(paths) == 3
    assert main(["verify", *paths]) == 4
    text = capsys.readouterr().out
    assert text.count("CONFIGURATION UNRECORDED: NOT ADJUDICABLE") >= 3
    assert "a strict token-exact gate is licensed" in text
    assert "STRICT token-exact 6/6" in text


@pytest.mark.parametrize("case", ["unknown", "truncated", "types", "shapes", "missing_prompt",
                                  "middle_pad", "newer_golden"])
def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    out = tmp_path / "goldens"
    if case == "unknown":
        src = tmp_path / "manifest" / "oracle.json"
        src.parent.mkdir()
        src.write_text(json.dumps({"ops": [{"name": "rms_norm", "shape": [8, 128]}]}))
        want = "no known format"
    elif case == "truncated":
        src = battery_copy(tmp_path)
        data = (src / "greedy_dist.npy").read_bytes()
        (src / "greedy_dist.npy").write_bytes(data[: len(data) // 2])
        want = "greedy_dist.npy"
    elif case == "types":
        src = tmp_path / "t" / "oracle.json"
        src.parent.mkdir()
        raw = json.loads((LEGACY / "oracle.json").read_text())
        raw["golden"][0]["token_ids"][0] = "Paris"
        src.write_text(json.dumps(raw))
        want = "golden[0].token_ids[0]"
    elif case == "shapes":
        src = battery_copy(tmp_path)
        np.save(src / "greedy_dist.npy", np.load(src / "greedy_dist.npy")[:, :10, :])
        want = "does not match greedy_ids.npy"
    elif case == "missing_prompt":
        src = battery_copy(tmp_path)
        (src / "p4_prompt.i32").unlink()
        want = "p4_prompt.i32"
    elif case == "middle_pad":
        src = battery_copy(tmp_path)
        ids = np.load(src / "greedy_ids.npy")
        ids[0, 3] = -1
        np.save(src / "greedy_ids.npy", ids)
        want = "padding in the middle"
    else:
        src = tmp_path / "g" / "golden.json"
        src.parent.mkdir()
        raw = json.loads((TINY_SPEC / "golden.json").read_text())
        raw["golden_schema"] = 99
        src.write_text(json.dumps(raw))
        assert main(["verify", str(src)]) == 2
        assert "newer than this oracle-build reads" in capsys.readouterr().err
        return
    assert main(["import", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert want in err and "Traceback" not in err
    assert not out.exists() or not any(out.rglob("*.json"))


def test_export_satisfies_the_attributed_contract_and_round_trips(tmp_path: Path) -> None:
    golden = load_golden(TINY_SPEC)
    dest = export(golden, TINY_SPEC / "golden.json", tmp_path / "export")
    data = json.loads((dest / "oracle.json").read_text())
    assert attributed_problems(data) == []
    assert set(data) == {"vllm", "transformers", "flashinfer", "model", "revision", "sampling",
                         "capture", "golden"}
    assert data["capture"]["engine"]["resolved"]["attention_backend"] == "CPU_ATTN"
    assert data["capture"]["engine"]["resolved"]["quantization"] == "none"
    assert data["capture"]["legs"] == 2 and data["capture"]["legs_agree"] is True
    ids = np.load(dest / "greedy_ids.npy")
    dist = np.load(dest / "greedy_dist.npy")
    assert ids.dtype == np.int32 and dist.shape == (3, 24, 2)
    assert ids.tolist() == [p.token_ids for p in golden.prompts]
    assert np.fromfile(dest / "p2_prompt.i32", dtype="<i4").tolist() == [5, 60, 70, 80, 90,
                                                                         100, 110]
    back = import_path(dest)
    assert [p.prompt_token_ids for p in back.prompts] == [p.prompt_token_ids
                                                          for p in golden.prompts]
    assert [p.token_ids for p in back.prompts] == [p.token_ids for p in golden.prompts]
    assert golden.legs is not None and back.legs is not None
    assert back.legs.tokens == golden.legs.tokens
    assert back.engine is not None and back.engine.resolved["max_num_seqs"].value == 4  # type: ignore[union-attr]
    with pytest.raises(BadInput, match="unrecorded"):  # an import has no config to export
        export(back, dest / "oracle.json", tmp_path / "again")


def test_export_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    assert main(["export", "--format", "vllm.cpp", str(TINY_SPEC), str(tmp_path / "x")]) == 8


@pytest.mark.slow
def test_round_trip_of_a_fresh_capture(captured: Captured, tmp_path: Path) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    golden = load_golden(captured.golden_path)
    back = import_path(export(golden, captured.golden_path, tmp_path / "e"))
    assert [p.token_ids for p in back.prompts] == [p.token_ids for p in golden.prompts]
    assert back.legs is not None and golden.legs is not None
    assert back.legs.tokens == golden.legs.tokens
