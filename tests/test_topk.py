"""Golden format 2: the top-k rows in a safetensors sidecar (its sha256 in golden.json),
published with golden.json as the commit point; format 1 still read; vllm.cpp batteries
carry the same rows; a damaged or inconsistent sidecar is bad input naming the file and
the field. Real files, no engine."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from oracle_build import goldens as golden_mod
from oracle_build import judge
from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.topk import TopKTable
from oracle_build.core.errors import EXIT_BAD_INPUT, BadInput, EngineFailed, OutputFailed
from oracle_build.core.files import sha256_file
from oracle_build.engine.session import attach_topk
from oracle_build.goldens import publish
from oracle_build.interop import vllmcpp
from tests.conftest import REPO, TINY_SPEC

# the bundled golden as an earlier capture wrote it (format 1: top-k rows inline, no pin
# copy), kept byte for byte: goldens of that format are still read
FORMAT1 = REPO / "tests" / "data" / "format1" / "tiny-llama-greedy" / "golden.json"


def format2(tmp_path: Path) -> Path:
    """A format-1 golden, published again: format 2."""
    dest = tmp_path / "g" / "golden.json"
    publish(load_golden(FORMAT1), dest, replace=False)
    return dest


def sidecar_of(path: Path) -> Path:
    (side,) = path.parent.glob("topk.*.safetensors")
    return side


def test_format1_read_and_format2_written_bit_for_bit(tmp_path: Path) -> None:
    old = load_golden(FORMAT1)
    assert old.golden_schema == 1 and old.topk is None  # format 1 still read
    path = format2(tmp_path)
    raw = json.loads(path.read_text())
    assert raw["golden_schema"] == 2
    assert all(p["topk"] is None for p in raw["prompts"])  # no inline rows
    side = sidecar_of(path)
    assert raw["topk"]["file"] == side.name and raw["topk"]["sha256"] == sha256_file(side)
    assert side.name == f"topk.{raw['topk']['sha256'][:16]}.safetensors"
    new = load_golden(path)
    for i, p in enumerate(old.prompts):
        assert p.topk is not None
        rows = new.prompt_topk(i)
        assert rows is not None and len(rows) == len(p.topk)
        for a, b in zip(p.topk, rows, strict=True):
            assert [list(e) for e in a] == b  # ids and logprobs, bit for bit
    assert new.topk_table().logprobs.dtype == np.float32  # vLLM's float32s: no loss
    ids = [p.id for p in old.prompts]
    assert judge.first_topk_difference(ids, old.topk_table(), new.topk_table(), 20) is None
    # offline compare reads the format-2 golden: the golden's own tokens pass
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps({"candidate_schema": 1, "engine": "x", "prompts": [
        {"id": p.id, "prompt_token_ids": p.prompt_token_ids, "token_ids": p.token_ids}
        for p in old.prompts]}))
    assert main(["compare", str(path), str(cand)]) == 0


def test_bundled_golden_is_current_and_travels_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled golden is written as capture writes goldens today (format 2, a top-k
    sidecar, its pin embedded, the CPU kernel variant recorded), re-captured from the format-1
    golden with the same tokens and the same top-k rows, bit for bit; copied alone into
    another folder (no pins/ beside it) it still finds its pin (not bad input)."""
    from oracle_build.contracts.golden import recorded
    from oracle_build.contracts.pins import load_pin
    from oracle_build.core.errors import EXIT_NO_ORACLE
    from oracle_build.goldens import golden_pin

    new, old = load_golden(TINY_SPEC), load_golden(FORMAT1)
    assert new.golden_schema == 2 and new.topk is not None and old.golden_schema == 1
    assert new.oracle.embedded_pin is not None  # type: ignore[union-attr]
    assert new.oracle.identity["cpu_variant"] == "x86_64-avx2"  # type: ignore[union-attr]
    # its history, each replaced golden kept under replaced/, back to the format-1 file
    # (the last step: capture --migrate, issue 55, which reproduced it bit for bit)
    kept = {sha256_file(p): p for p in (TINY_SPEC / "replaced").glob("golden.*.json")}
    step, seen = new, 0
    while step.replaces is not None and step.replaces.golden_sha256 != sha256_file(FORMAT1):
        step, seen = load_golden(kept[step.replaces.golden_sha256]), seen + 1
    assert step.replaces is not None and step.replaces.golden_sha256 == sha256_file(FORMAT1)
    assert new.replaces is not None and new.replaces.reproduced is not None and seen == 1
    assert [p.token_ids for p in new.prompts] == [p.token_ids for p in old.prompts]
    assert judge.first_topk_difference([p.id for p in old.prompts], old.topk_table(),
                                       new.topk_table(), 20) is None
    alone = tmp_path / "elsewhere" / "tiny-llama-greedy"
    alone.mkdir(parents=True)
    for name in ("golden.json", new.topk.file):
        shutil.copy2(TINY_SPEC / name, alone / name)
    rec = recorded(load_golden(alone), alone / "golden.json")
    pin = golden_pin(rec, alone / "golden.json", unpack_to=tmp_path / "pins")
    assert pin.content_hash == load_pin(REPO / "pins" / "cpu.toml").content_hash
    # through verify, in a home with no oracle: its records and pin pass, then it stops for
    # the missing oracle (7) on every host with AVX2 (its variant is held); never bad input
    code = main(["verify", str(alone), "--home", str(tmp_path / "home")])
    assert code == EXIT_NO_ORACLE, capsys.readouterr()


def test_one_logprob_bit_is_found(tmp_path: Path) -> None:
    g = load_golden(TINY_SPEC)
    table = g.topk_table()
    assert table is not None
    lps = table.logprobs.copy()
    row = int(table.offsets[1]) + 7
    lps[row, 3] = np.nextafter(lps[row, 3], np.float32(-np.inf))
    other = TopKTable(table.lengths, table.counts, table.ids, lps)
    ids = [p.id for p in g.prompts]
    diff = judge.first_topk_difference(ids, table, other, 20)
    assert diff is not None and diff["prompt"] == ids[1] and diff["position"] == 7
    assert diff["same_tokens"] and diff["max_abs_delta"] > 0
    # one side shorter: they differ where it ends
    short = TopKTable.from_rows([list(table.rows(0)), list(table.rows(1))[:5],
                                 list(table.rows(2))])
    diff = judge.first_topk_difference(ids, table, short, 20)
    assert diff is not None and (diff["prompt"], diff["position"]) == (ids[1], 5)
    assert diff["current"] == []


def test_replace_keeps_the_old_golden_and_its_sidecar(tmp_path: Path) -> None:
    path = format2(tmp_path)
    old_side = sidecar_of(path)
    old_bytes = old_side.read_bytes()
    g = load_golden(path)
    table = g.topk_table()
    assert table is not None
    lps = table.logprobs.copy()
    lps[0, 0] = np.float32(-0.5)
    lps[0, 1:] = np.minimum(lps[0, 1:], np.float32(-0.5))
    changed = g.model_copy()
    changed._table = TopKTable(table.lengths, table.counts, table.ids, lps)
    kept = publish(changed, path, replace=True)
    assert kept is not None and kept.parent.name == "replaced"
    assert (kept.parent / old_side.name).read_bytes() == old_bytes
    assert not old_side.exists()  # moved out of the golden's folder, kept under replaced/
    assert load_golden(kept).topk_table().logprobs[0, 0] == table.logprobs[0, 0]
    new = load_golden(path)
    assert new.topk_table().logprobs[0, 0] == np.float32(-0.5)
    assert len(list(path.parent.glob("topk.*.safetensors"))) == 1


def test_a_failed_publish_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    dest = tmp_path / "g" / "golden.json"
    real = golden_mod.atomic_write_bytes

    def failing(path: Path, data: bytes, *, overwrite: bool = True) -> None:
        if path.name == "golden.json":
            raise OSError(28, "No space left on device")
        real(path, data, overwrite=overwrite)

    monkeypatch.setattr(golden_mod, "atomic_write_bytes", failing)
    with pytest.raises(OutputFailed, match="nothing was written"):
        publish(load_golden(TINY_SPEC), dest, replace=False)
    assert list(dest.parent.iterdir()) == []  # the sidecar written first is taken back


@pytest.mark.parametrize("damage, field", [
    ("missing", "topk.file"),
    ("flip", "sha256"),
    ("lengths", "lengths"),
    ("unsorted", "logprobs"),
    ("header", "<header>"),
    ("padding", "ids"),
])
def test_damaged_sidecar_is_bad_input_naming_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, field: str) -> None:
    path = format2(tmp_path)
    side = sidecar_of(path)
    table = load_golden(path).topk_table()
    assert table is not None
    data = side.read_bytes()
    if damage == "missing":
        side.unlink()
    elif damage == "flip":
        side.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    else:
        ids, lps, lengths = table.ids.copy(), table.logprobs.copy(), table.lengths.copy()
        counts = table.counts.copy()
        if damage == "lengths":
            lengths[0] -= 1
            lengths[1] += 1
        elif damage == "unsorted":
            lps[2, [0, 1]] = lps[2, [1, 0]]
            assert lps[2, 0] != lps[2, 1]
        elif damage == "padding":
            counts[0] -= 1  # the row's last entry is now padding, and is not -1
        blob = TopKTable(lengths, counts, ids, lps).to_safetensors()
        if damage == "header":
            (n,) = struct.unpack("<Q", blob[:8])
            blob = blob[:8] + b"{" * n + blob[8 + n:]
        assert blob != data
        side.write_bytes(blob)
        raw = json.loads(path.read_text())  # the hash made to agree: the content is wrong
        raw["topk"]["sha256"] = sha256_file(side)
        path.write_text(json.dumps(raw))
    with pytest.raises(BadInput) as err:
        load_golden(path)
    assert f"{field}:" in str(err.value)
    assert str(side if damage != "missing" else path) in str(err.value)
    capsys.readouterr()
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps({"candidate_schema": 1, "engine": "x", "prompts": [
        {"id": p.id, "prompt_token_ids": p.prompt_token_ids, "token_ids": p.token_ids}
        for p in load_golden(TINY_SPEC).prompts]}))
    assert main(["compare", str(path), str(cand)]) == EXIT_BAD_INPUT
    assert "Traceback" not in capsys.readouterr().err


def test_vllmcpp_battery_round_trip_keeps_the_rows(tmp_path: Path) -> None:
    path = format2(tmp_path)
    g = load_golden(path)
    out = vllmcpp.export(g, path, tmp_path / "battery")
    ids = np.load(out / vllmcpp.TOPK_IDS)
    lps = np.load(out / vllmcpp.TOPK_LOGPROBS)
    assert lps.shape == ids.shape and np.isnan(lps[ids == -1]).all()
    assert ids.shape[:2] == np.load(out / "greedy_ids.npy").shape and ids.dtype == np.int32
    back = vllmcpp.import_to(out, tmp_path / "imported")
    imported = load_golden(back)
    assert imported.topk is not None and "topk" not in imported.unrecorded
    assert judge.first_topk_difference([p.id for p in g.prompts], g.topk_table(),
                                       imported.topk_table(), 20) is None
    # one file without the other is bad input
    shutil.copytree(out, tmp_path / "half")
    (tmp_path / "half" / vllmcpp.TOPK_LOGPROBS).unlink()
    with pytest.raises(BadInput, match=vllmcpp.TOPK_LOGPROBS):
        vllmcpp.import_path(tmp_path / "half")
    # rows past a prompt's last token are refused: prompt 0 cut one token short
    past = tmp_path / "past"
    shutil.copytree(out, past)
    (past / "oracle.json").unlink()
    greedy, dist = np.load(past / "greedy_ids.npy"), np.load(past / "greedy_dist.npy")
    assert (greedy[0] != -1).all() and (ids[0, -1] != -1).any()
    greedy[0, -1], dist[0, -1, :] = -1, -1
    np.save(past / "greedy_ids.npy", greedy)
    np.save(past / "greedy_dist.npy", dist)
    with pytest.raises(BadInput, match="past a prompt's last token"):
        vllmcpp.import_path(past)


def test_driver_arrays_are_checked(tmp_path: Path) -> None:
    table = load_golden(TINY_SPEC).topk_table()
    assert table is not None
    arrays = {"r0_l0_lengths": table.lengths, "r0_l0_counts": table.counts,
              "r0_l0_ids": table.ids, "r0_l0_logprobs": table.logprobs.astype(np.float64)}
    raw = {"ok": True, "runs": [{"legs": [[{"token_ids": []} for _ in range(3)]]}]}
    attach_topk(raw, arrays, tmp_path / "log")
    run = raw["runs"][0]
    assert run["leg_tables"][0].logprobs.dtype == np.float32
    assert run["legs"][0][1]["topk"][2] == list(table.rows(1))[2]
    bad_ids = table.ids.copy()
    bad_ids[4, 0] = -7
    raw = {"ok": True, "runs": [{"legs": [[{} for _ in range(3)]]}]}
    with pytest.raises(EngineFailed, match="r0_l0_ids"):
        attach_topk(raw, {**arrays, "r0_l0_ids": bad_ids}, tmp_path / "log")
    with pytest.raises(EngineFailed, match="saved no top-k arrays"):
        attach_topk({"ok": True, "runs": []}, None, tmp_path / "log")
