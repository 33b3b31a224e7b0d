"""Verdicts that cannot lie (issue 22, sections 1-3): every case found by a careful and a
hostile reading of main, each a test. The gate compares every golden prompt exactly once and
applies one gate rule for compare and verify; no input reads as drift (exit 1) unless it is
drift: bad input is exit 2 naming the file and field, an output error 14, anything unforeseen
70 with one line and a log; no name in a golden or a pin becomes a path outside where it
belongs. Fast: nothing here builds or starts an engine."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.spec import load_spec
from oracle_build.core.errors import BadInput
from oracle_build.core.files import load_json, sha256_file
from oracle_build.core.proc import Cmd
from oracle_build.goldens import publish
from oracle_build.interop import vllmcpp
from tests.conftest import CPU_PIN, GPU_PIN, REPO, TINY_SPEC, inline_golden_doc

GOLDEN = TINY_SPEC / "golden.json"
IDS = ["capital", "fibonacci", "ids"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Traceback" not in out.out
    return code, out.out, out.err


def golden_doc() -> dict[str, Any]:
    return inline_golden_doc(GOLDEN)


def write_golden(tmp_path: Path, doc: dict[str, Any], name: str = "g") -> Path:
    """A golden beside a copy of its spec folder's pin reference (spec.pin is relative)."""
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "golden.json").write_text(json.dumps(doc))
    return folder / "golden.json"


def candidate(tmp_path: Path, prompts: list[dict[str, Any]], name: str = "cand.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"candidate_schema": 1, "engine": "test", "prompts": prompts}))
    return path


def own_prompts(*, ids: bool = True) -> list[dict[str, Any]]:
    out = []
    for p in load_golden(GOLDEN).prompts:
        entry: dict[str, Any] = {"prompt_token_ids": list(p.prompt_token_ids),
                                 "token_ids": list(p.token_ids)}
        if ids:
            entry["id"] = p.id
        out.append(entry)
    return out


# ----------------------------------------------------------------------- 1. the token gate


def test_candidate_missing_prompts_is_bad_input(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", str(GOLDEN),
                         str(candidate(tmp_path, own_prompts()[:1])))
    assert code == 2, out
    assert "fibonacci" in err and "ids" in err and "missing" in err
    assert "token-exact 1/1" not in out
    # without ids: a count that differs is bad input too
    code, _out, err = run(capsys, "compare", str(GOLDEN),
                          str(candidate(tmp_path, own_prompts(ids=False)[:1])))
    assert code == 2 and "prompts" in err


def test_candidate_duplicated_prompt_is_bad_input(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    first = own_prompts()[0]
    code, out, err = run(capsys, "compare", str(GOLDEN),
                         str(candidate(tmp_path, [first, first, first])))
    assert code == 2, out
    assert "capital" in err and "more than once" in err
    assert "3/3" not in out


def test_candidate_ids_all_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = own_prompts()
    # the first two swapped (each carries the other's tokens), the third without an id: the
    # ids must not be dropped in favour of order
    swapped = [{**prompts[1], "id": "capital"}, {**prompts[0], "id": "fibonacci"},
               {k: v for k, v in prompts[2].items() if k != "id"}]
    code, _out, err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, swapped)))
    assert code == 2
    assert "prompts[2].id" in err
    # with every id given, the swap is compared by id: drift, not a pass
    swapped[2] = prompts[2]
    code, out, _err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, swapped)))
    assert code == 1, out


def test_summary_counts_the_goldens_prompts(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "compare", str(GOLDEN),
                          str(candidate(tmp_path, list(reversed(own_prompts())))))
    assert code == 0 and "STRICT token-exact 3/3" in out
    code, out, _ = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, own_prompts())),
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert [r["prompt"] for r in report["results"]] == IDS  # the golden's order


def test_compare_applies_verifys_gate_rule(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A near-tie gate on a golden whose legs agree and that names no ratification is
    inadmissible for verify (exit 2): so it is for compare, even on a divergence that the
    band would pass."""
    doc = golden_doc()
    doc["gate"] = {"kind": "near_tie", "band_nats": 0.5, "ratification": None}
    path = write_golden(tmp_path, doc)
    golden = load_golden(GOLDEN)
    prompts = own_prompts()
    row = golden.prompt_topk(2)
    assert row is not None
    prompts[2]["token_ids"] = list(prompts[2]["token_ids"])
    prompts[2]["token_ids"][4] = row[4][1][0]  # the runner-up there
    code, out, err = run(capsys, "compare", str(path), str(candidate(tmp_path, prompts)))
    assert code == 2, out
    assert "gate.kind" in err and "inadmissible" in err


def test_golden_legs_agree_must_match_its_legs(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    doc = golden_doc()
    doc["legs"]["tokens"][1][0][3] = (doc["legs"]["tokens"][1][0][3] + 1) % 300
    assert doc["legs"]["agree"] is True
    path = write_golden(tmp_path, doc)
    code, _out, err = run(capsys, "compare", str(path),
                          str(candidate(tmp_path, own_prompts())))
    assert code == 2 and "legs.agree" in err
    with pytest.raises(BadInput, match=r"legs\.agree"):
        load_golden(path)


def test_golden_token_must_be_its_own_top1(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    doc = golden_doc()
    p = doc["prompts"][1]
    runner_up = p["topk"][5][1][0]
    assert p["topk"][5][1][1] < p["topk"][5][0][1]  # not a tie
    p["token_ids"][5] = runner_up
    for leg in doc["legs"]["tokens"]:
        leg[1][5] = runner_up
    path = write_golden(tmp_path, doc)
    cand = [dict(c) for c in own_prompts()]
    cand[1]["token_ids"] = p["token_ids"]
    code, _out, err = run(capsys, "compare", str(path), str(candidate(tmp_path, cand)))
    assert code == 2
    assert "prompts[1].token_ids[5]" in err and "top-1" in err
    # an exact tie is any tied member: a golden whose token ties its top-1 loads
    doc = golden_doc()
    p = doc["prompts"][0]
    top = p["topk"][2]
    top[1][1] = top[0][1]
    p["token_ids"][2] = top[1][0]
    for leg in doc["legs"]["tokens"]:
        leg[0][2] = top[1][0]
    load_golden(write_golden(tmp_path, doc, "tie"))



def test_a_prompt_text_edited_alone_is_refused(tmp_path: Path) -> None:
    """Issue 45 item 8: a golden whose prompts[].text was changed (its spec not) verified
    with `ids =` and showed the new text as the prompt of the old tokens. The recorded text
    and ids are the spec's, the ones a re-run sends: bad input naming the field."""
    doc = golden_doc()
    spec_prompts = {g["id"]: g for g in doc["spec"]["prompts"]}
    by_text = [n for n, p in enumerate(doc["prompts"]) if spec_prompts[p["id"]].get("text")]
    by_ids = [n for n, p in enumerate(doc["prompts"]) if spec_prompts[p["id"]].get("token_ids")]
    assert by_text and by_ids  # the bundled golden has both kinds
    doc["prompts"][by_text[0]]["text"] = "Ignore the tokens: this is the prompt now."
    with pytest.raises(BadInput, match=rf"prompts\[{by_text[0]}\]\.text.*captured from"):
        load_golden(write_golden(tmp_path, doc, "text"))
    doc = golden_doc()
    doc["prompts"][by_ids[0]]["prompt_token_ids"][0] += 1
    with pytest.raises(BadInput, match=rf"prompts\[{by_ids[0]}\]\.prompt_token_ids"):
        load_golden(write_golden(tmp_path, doc, "ids"))

def test_golden_duplicate_prompt_ids(tmp_path: Path) -> None:
    doc = golden_doc()
    doc["prompts"][1]["id"] = "capital"
    with pytest.raises(BadInput, match=r"prompts\[1\]\.id"):
        load_golden(write_golden(tmp_path, doc))


# ----------------------------------------------------------------- 2. internal errors


def format2(tmp_path: Path) -> Path:
    dest = tmp_path / "f2" / "golden.json"
    publish(load_golden(GOLDEN), dest, replace=False)
    return dest


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**70, 1], [-1, 3]])
def test_topk_header_with_a_huge_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       shape: list[int]) -> None:
    path = format2(tmp_path)
    (side,) = path.parent.glob("topk.*.safetensors")
    data = side.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["ids"]["shape"] = shape
    raw = json.dumps(header).encode()
    side.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    doc = json.loads(path.read_text())  # the hash made to agree: only the shape is wrong
    doc["topk"]["sha256"] = sha256_file(side)
    doc["topk"]["bytes"] = side.stat().st_size
    path.write_text(json.dumps(doc))
    code, _out, err = run(capsys, "compare", str(path), str(candidate(tmp_path, own_prompts())))
    assert code == 2
    assert str(side) in err and "ids:" in err


def test_topk_fifo_does_not_hang(tmp_path: Path) -> None:
    path = format2(tmp_path)
    (side,) = path.parent.glob("topk.*.safetensors")
    side.unlink()
    os.mkfifo(side)
    cand = candidate(tmp_path, own_prompts())
    proc = subprocess.run([sys.executable, "-m", "oracle_build", "compare", str(path),
                           str(cand)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr and "Traceback" not in proc.stderr
    # a FIFO as the candidate or the golden itself: the same
    fifo = tmp_path / "cand.fifo"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "oracle_build", "compare", str(GOLDEN),
                           str(fifo)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def battery(tmp_path: Path) -> Path:
    out = vllmcpp.export(load_golden(GOLDEN), GOLDEN, tmp_path / "battery")
    (out / "oracle.json").unlink()
    return out


@pytest.mark.parametrize(("value", "dtype"), [(2**40, np.int64), (2**64 - 1, np.uint64)])
def test_battery_token_id_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       value: int, dtype: Any) -> None:
    out = battery(tmp_path)
    ids = np.load(out / "greedy_ids.npy").astype(dtype)
    ids[0, 3] = value
    np.save(out / "greedy_ids.npy", ids)
    code, _o, err = run(capsys, "import", str(out), "--out", str(tmp_path / "imported"))
    assert code == 2
    assert "greedy_ids.npy" in err and "out of range" in err
    assert not (tmp_path / "imported").exists()


def attributed(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    out = vllmcpp.export(load_golden(GOLDEN), GOLDEN, tmp_path / "exported")
    for f in out.glob("*.npy"):
        f.unlink()
    for f in out.glob("*.i32"):
        f.unlink()
    return out / "oracle.json", json.loads((out / "oracle.json").read_text())


@pytest.mark.parametrize(("edit", "field"), [
    (lambda c: c["batch"].update(prompts=[[5]]), "capture.batch.prompts[0][0]"),
    (lambda c: c["batch"].update(prompts=[["a"]]), "capture.batch.prompts[0][0]"),
    (lambda c: c["batch"].update(prompts=[[-1], [0, 1]]), "capture.batch.prompts[0][0]"),
    (lambda c: c["batch"].update(prompts="012"), "capture.batch.prompts"),
    (lambda c: c["batch"].update(prompts=[[0, 1], [1, 2]]), "capture.batch.prompts"),
    (lambda c: c["batch"].update(prompts=[[True, 1, 2]]), "capture.batch.prompts[0][0]"),
    (lambda c: c["engine"].update(resolved=[1, 2]), "capture.engine.resolved"),
    (lambda c: c.update(schema=3), "capture.schema"),
])
def test_schema2_capture_block_is_validated(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            edit: Any, field: str) -> None:
    path, doc = attributed(tmp_path)
    before = json.dumps(doc)
    edit(doc["capture"])
    assert json.dumps(doc) != before
    path.write_text(json.dumps(doc))
    code, _o, err = run(capsys, "import", str(path), "--out", str(tmp_path / "imported"))
    assert code == 2
    assert f"{field}:" in err


def test_deep_and_huge_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    huge = tmp_path / "huge.toml"
    huge.write_text(CPU_PIN.read_text() + "\n[extra]\nn = " + "9" * 5000 + "\n")
    for path in (deep, huge):
        with pytest.raises(BadInput) as err:
            load_pin(path)
        assert str(path) in str(err.value)
        with pytest.raises(BadInput):
            load_spec(path)
        code, _o, err2 = run(capsys, "build", "--pin", str(path), "--dry-run")
        assert code == 2 and str(path) in err2


def test_cmake_include_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cmake").mkdir()
    (tmp_path / "CMakeLists.txt").write_text("include(cmake/a.cmake)\n")
    (tmp_path / "cmake" / "a.cmake").write_text("include(cmake/b.cmake)\n")
    (tmp_path / "cmake" / "b.cmake").write_text("include(cmake/a.cmake)\n")
    code, _o, err = run(capsys, "externals", "--checkout", str(tmp_path), "--device", "cpu")
    assert code == 2
    assert "a.cmake" in err and "cycle" in err


def test_export_under_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _o, err = run(capsys, "export", "--format", "vllm.cpp", str(GOLDEN),
                        str(blocker / "out"))
    assert code == 14
    assert str(blocker) in err
    assert blocker.read_text() == "x"


def test_unforeseen_error_is_70_with_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle_build.commands import compare

    def broken(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(compare, "compare", broken)
    monkeypatch.setenv("ORACLE_BUILD_HOME", str(tmp_path / "home"))
    code, _o, err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, own_prompts())))
    assert code == 70
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "internal error" in lines[0] and "ZeroDivisionError: a bug of ours" in lines[0]
    (log,) = (tmp_path / "home" / "logs").glob("internal-error-*.log")
    assert str(log) in lines[0]
    assert "Traceback" in log.read_text() and "broken" in log.read_text()



def test_an_interrupt_that_became_another_error_is_130(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in CI's kill test: SIGINT landed inside shutil.rmtree's own cleanup (a
    TemporaryDirectory leaving), whose second os.close raised EBADF over the
    KeyboardInterrupt: exit 70, "a bug in oracle-build". An error raised while an interrupt
    unwound is the interrupt: 130, no internal-error log."""
    from oracle_build.commands import compare

    def interrupted_cleanup(*_a: object, **_k: object) -> None:
        try:
            raise KeyboardInterrupt
        finally:
            raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(compare, "compare", interrupted_cleanup)
    monkeypatch.setenv("ORACLE_BUILD_HOME", str(tmp_path / "home"))
    code, _o, err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, own_prompts())))
    assert code == 130, err
    assert "interrupted" in err and "internal error" not in err
    assert not (tmp_path / "home" / "logs").exists() or \
        not list((tmp_path / "home" / "logs").glob("internal-error-*.log"))

@pytest.mark.parametrize(("token", "why"), [("87", "string"), (87.0, "float"), (True, "bool")])
def test_token_ids_must_be_integers(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    token: Any, why: str) -> None:
    prompts = own_prompts()
    prompts[0]["token_ids"] = [token, *prompts[0]["token_ids"][1:]]
    code, _o, err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, prompts)))
    assert code == 2, why
    assert "prompts[0].token_ids[0]" in err
    doc = golden_doc()
    doc["prompts"][0]["prompt_token_ids"][0] = token
    with pytest.raises(BadInput, match=r"prompts\[0\]\.prompt_token_ids\[0\]"):
        load_golden(write_golden(tmp_path, doc))


def test_duplicate_json_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cand.json"
    good = json.dumps({"candidate_schema": 1, "prompts": own_prompts()})
    path.write_text(good[:-1] + ', "prompts": []}')
    code, _o, err = run(capsys, "compare", str(GOLDEN), str(path))
    assert code == 2 and "prompts" in err and "twice" in err
    with pytest.raises(BadInput, match="twice"):
        load_json(path)


def test_candidate_topk_rows_best_first(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    golden = load_golden(GOLDEN)
    prompts = own_prompts()
    for i, p in enumerate(prompts):
        p["topk"] = [list(map(list, row)) for row in (golden.prompt_topk(i) or [])]
    prompts[1]["topk"][3] = list(reversed(prompts[1]["topk"][3]))
    code, _o, err = run(capsys, "compare", str(GOLDEN), str(candidate(tmp_path, prompts)))
    assert code == 2
    assert "prompts[1]" in err and "best first" in err


# ------------------------------------------------------- 3. files a golden or pin may write


def with_embedded_pin(doc: dict[str, Any], *, pin_key: str, pin_name: str = "cpu.toml",
                      pin_toml: str | None = None) -> dict[str, Any]:
    doc["oracle"]["pin_key"] = pin_key
    doc["oracle"]["embedded_pin"] = {
        "pin_name": pin_name, "pin_toml": pin_toml or CPU_PIN.read_text(),
        "lock_name": "cpu.lock.txt", "lock_text": (CPU_PIN.parent / "cpu.lock.txt").read_text()}
    doc["spec"]["pin"] = "no/such/pin.toml"  # a golden copied into another tree
    return doc


@pytest.mark.parametrize("key", ["victim", "../victim", "a/b", ".hidden", "..", ""])
def test_golden_pin_key_cannot_name_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           key: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "authorized_keys").write_text("ORIGINAL\n")
    pin_key = str(victim) if key == "victim" else key
    doc = with_embedded_pin(golden_doc(), pin_key=pin_key, pin_name="authorized_keys")
    path = write_golden(tmp_path, doc)
    home = tmp_path / "home"
    for cmd in (["verify", str(path)], ["margin", str(path), "capital", "1"],
                ["explain", str(path)]):
        code, _o, err = run(capsys, *cmd, "--home", str(home))
        assert code == 2, (cmd, err)
        assert "oracle.pin_key" in err or "oracle.embedded_pin" in err
        assert (victim / "authorized_keys").read_text() == "ORIGINAL\n"
        assert sorted(os.listdir(victim)) == ["authorized_keys"]
    assert not (home / "pins").exists() or not any((home / "pins").rglob("*"))


@pytest.mark.parametrize("name", ["../authorized_keys", "a/b.toml", ".bashrc"])
def test_golden_pin_file_names_are_plain(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         name: str) -> None:
    doc = with_embedded_pin(golden_doc(), pin_key=golden_doc()["oracle"]["pin_key"],
                            pin_name=name)
    path = write_golden(tmp_path, doc)
    code, _o, err = run(capsys, "verify", str(path), "--home", str(tmp_path / "home"))
    assert code == 2 and "oracle.embedded_pin.pin_name" in err
    assert not (tmp_path / "authorized_keys").exists() and not (tmp_path / "home").exists()


def test_embedded_pin_hash_checked_before_writing(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tampered = CPU_PIN.read_text().replace('python = "3.11"', 'python = "3.12"')
    assert tampered != CPU_PIN.read_text()
    doc = with_embedded_pin(golden_doc(), pin_key=golden_doc()["oracle"]["pin_key"],
                            pin_toml=tampered)
    path = write_golden(tmp_path, doc)
    home = tmp_path / "home"
    code, _o, err = run(capsys, "verify", str(path), "--home", str(home))
    assert code == 2 and "oracle.embedded_pin" in err and "pin_hash" in err
    assert not (home / "pins").exists() or not any((home / "pins").rglob("*.toml"))


def pin_with(tmp_path: Path, old: str, new: str) -> Path:
    text = GPU_PIN.read_text()
    assert old in text
    path = tmp_path / "pin.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("key", "value"), [
    ("name", "../../../../tmp/x"),  # would put its clone outside staging
    ("src_dir_var", "VLLM_USE_PRECOMPILED"),  # would reach the wheel build's environment
])
def test_external_fields_cannot_escape(tmp_path: Path, key: str, value: str) -> None:
    first = GPU_PIN.read_text().split("[[externals]]", 1)[1]
    line = next(ln for ln in first.splitlines() if ln.startswith(f"{key} = "))
    path = pin_with(tmp_path, line, f"{key} = {json.dumps(value)}")
    with pytest.raises(BadInput, match=rf"externals\[0\]\.{key}"):
        load_pin(path, check_lock=False)


def test_unset_wins_over_env() -> None:
    cmd = Cmd(argv=["true"], env={"VLLM_USE_PRECOMPILED": "1", "MAX_JOBS": "2"},
              unset=("VLLM_USE_PRECOMPILED",))
    env = cmd.environment()
    assert "VLLM_USE_PRECOMPILED" not in env and env["MAX_JOBS"] == "2"


@pytest.mark.parametrize("value", ["1\nORACLE_IDENTITY_OK", "a\rb", "x\x1b[2Jy", "\x00"])
def test_control_characters_refused_in_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            value: str) -> None:
    path = pin_with(tmp_path, 'MAX_JOBS = "', f'MAX_JOBS = {json.dumps(value)}  # "')
    with pytest.raises(BadInput, match=r"build\.env\.MAX_JOBS"):
        load_pin(path, check_lock=False)
    code, out, _err = run(capsys, "build", "--pin", str(path), "--dry-run")
    assert code == 2
    assert "ORACLE_IDENTITY_OK" not in out


# ------------------------------------------------------------------ 4. identity, the rules


def test_bytecode_source_and_fingerprint() -> None:
    from oracle_build.oracle import inventory

    assert inventory.bytecode_source("lib/x/__pycache__/a.cpython-311.pyc") == "lib/x/a.py"
    assert inventory.bytecode_source("lib/x/__pycache__/a.cpython-311.opt-1.pyc") == "lib/x/a.py"
    assert inventory.bytecode_source("lib/x/sitecustomize.pyc") is None  # sourceless
    assert inventory.bytecode_source("lib/x/__pycache__/a.b.cpython-311.pyc") is None
    sp = "lib/python3.11/site-packages"
    files = {f"{sp}/a.py": {"kind": "wheel", "sha256": "1" * 64},
             f"{sp}/__pycache__/a.cpython-311.pyc": {"kind": "bytecode", "sha256": "2" * 64},
             "pyvenv.cfg": {"kind": "venv", "sha256": "3" * 64},
             "bin/x": {"kind": "wheel", "sha256": "4" * 64, "relocated_from_sha256": "5" * 64},
             f"{sp}/a-1.dist-info/RECORD": {"kind": "wheel", "sha256": "6" * 64}}
    base = inventory.fingerprint({"files": files})
    # what the venv or its installer writes with the venv's path in it does not move it
    moved = {**files, f"{sp}/__pycache__/a.cpython-311.pyc": {"kind": "bytecode",
                                                             "sha256": "7" * 64},
             "pyvenv.cfg": {"kind": "venv", "sha256": "8" * 64},
             "bin/x": {"kind": "wheel", "sha256": "9" * 64, "relocated_from_sha256": "a" * 64},
             f"{sp}/a-1.dist-info/RECORD": {"kind": "wheel", "sha256": "b" * 64}}
    assert inventory.fingerprint({"files": moved}) == base
    # a file a wheel installs does
    changed = {**files, f"{sp}/a.py": {"kind": "wheel", "sha256": "c" * 64}}
    assert inventory.fingerprint({"files": changed}) != base


def test_library_rules() -> None:
    from oracle_build.oracle.identity import library_mismatches

    built = {"/usr/lib/libc.so.6": "a" * 64, "/py/lib/python3.11/lib-dynload/_ssl.so": "b" * 64}

    def facts(files: dict[str, str | None]) -> dict[str, Any]:
        return {"python": {"base_prefix": "/py"}, "libraries": {"prefix": "/v", "files": files}}

    assert library_mismatches(built, facts({**built, "/v/lib/torch/libgomp.so.1": None})) == []
    # the base interpreter's own extensions may differ in which are loaded
    assert library_mismatches(built, facts({**built, "/py/lib/python3.11/lib-dynload/x.so":
                                            "c" * 64})) == []
    (bad,) = library_mismatches(built, facts({**built, "/usr/lib/libgomp.so.1": "d" * 64}))
    assert bad[0] == "library /usr/lib/libgomp.so.1" and "LD_LIBRARY_PATH" in bad[2]
    (bad,) = library_mismatches(built, facts({**built, "/usr/lib/libc.so.6": "e" * 64}))
    assert "changed since the build" in bad[2]
    (bad,) = library_mismatches(built, {"libraries": {"error": "no /proc"}})
    assert bad[0] == "mapped libraries"


def test_oracle_env_scrubs_the_loader(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from oracle_build.core import env as envmod

    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/x86_64-linux-gnu")
    monkeypatch.setattr(envmod, "_told", set())
    env = envmod.oracle_env({"LD_LIBRARY_PATH": "/opt/cuda/lib64"})
    assert "LD_PRELOAD" not in env and env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "LD_PRELOAD not passed to the oracle" in capsys.readouterr().err
    assert envmod.recorded({"LD_LIBRARY_PATH": "x", "OMP_NUM_THREADS": "2"}) == {
        "LD_LIBRARY_PATH": "x", "OMP_NUM_THREADS": "2"}


def test_oracle_env_is_built_not_inherited(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45: of the caller's environment only what a process needs to run (and which
    device the scheduler gave it) reaches the oracle; every variable the engine would have
    read is dropped and said once, escaped; the overlay (pin, variant, caches, a spec's
    [env]) is what sets them."""
    from oracle_build.core import env as envmod

    dropped = {"VLLM_LOGGING_CONFIG_PATH": "/tmp/evil.json", "VLLM_PLUGINS": "evil",
               "TORCHINDUCTOR_CACHE_DIR": "/tmp/kernels", "PYTHONPATH": "/tmp/mods",
               "HF_HOME": "/tmp/hf", "TRITON_CACHE_DIR": "/tmp/t", "OMP_NUM_THREADS": "7",
               "VLLM_X\nORACLE_IDENTITY_OK": "1"}
    kept = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "1", "TZ": "UTC"}
    for k in list(os.environ):
        monkeypatch.delenv(k)
    for k, v in {**dropped, **kept, "SOME_UNRELATED": "x"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(envmod, "_told", set())
    env = envmod.oracle_env({"OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "all"})
    # PATH and HOME are made, never the caller's (issue 63): the system's folders, a HOME
    # of the tool's
    made = {"PATH": os.pathsep.join(envmod.SYSTEM_PATH), "HOME": envmod.oracle_home()}
    assert env == {**kept, **made, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "2",
                   "VLLM_CPU_OMP_THREADS_BIND": "all"}
    err = capsys.readouterr().err
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_PLUGINS", "TORCHINDUCTOR_CACHE_DIR",
                 "PYTHONPATH", "HF_HOME", "TRITON_CACHE_DIR", "OMP_NUM_THREADS"):
        assert name in err, name
    assert "SOME_UNRELATED" not in err and "\nORACLE_IDENTITY_OK" not in err
    assert "VLLM_X\\nORACLE_IDENTITY_OK" in err  # escaped, never a line of its own
    envmod.oracle_env({})
    assert capsys.readouterr().err == ""  # said once


@pytest.mark.parametrize(("name", "value", "why"), [
    ("VLLM_LOGGING_CONFIG_PATH", "x.json", "names a path"),
    ("VLLM_PLUGINS", "evil", "names a plugin"),
    ("TORCHINDUCTOR_CACHE_DIR", "k", "names a dir"),
    ("PYTHONPATH", "x", "set by the tool"),
    ("LD_PRELOAD", "x", "set by the tool"),
    ("ATEN_CPU_CAPABILITY", "avx2", "set by the tool"),
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "1", "set by the tool"),
    ("VLLM_ATTENTION_BACKEND", "/tmp/x", "not a plain setting"),
    ("vllm_lower", "1", "not an environment variable name"),
])
def test_spec_env_refuses_what_loads_code(tmp_path: Path, name: str, value: str,
                                          why: str) -> None:
    """A capture spec's [env] is configuration: a golden is someone else's file, re-run by
    verify, so it may set plain settings and nothing that names a file, loads code or sets
    what the tool sets."""
    from oracle_build.contracts.spec import load_spec
    from oracle_build.core.errors import BadInput

    spec = (REPO / "goldens" / "tiny-llama-greedy" / "spec.toml").read_text()
    path = tmp_path / "spec.toml"
    path.write_text(spec + f'\n[env]\nVLLM_CPU_OMP_THREADS_BIND = "all"\n{name} = "{value}"\n')
    with pytest.raises(BadInput) as exc:
        load_spec(path)
    assert why in exc.value.message, exc.value.message
    path.write_text(spec + '\n[env]\nVLLM_CPU_OMP_THREADS_BIND = "all"\n')
    assert load_spec(path).env == {"VLLM_CPU_OMP_THREADS_BIND": "all"}


def test_names_that_become_paths_stay_beside_their_pin(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45 item 2: a pin's lock is a plain file name beside it (a pin embedded in a
    golden from elsewhere too); a link out of the folder is refused; and an error about a
    lock's content names the line and column, never quoting it (the file could be any)."""
    from oracle_build.cli import main
    from oracle_build.contracts.pins import load_pin
    from oracle_build.core.errors import EXIT_BAD_INPUT, BadInput

    pins = tmp_path / "pins"
    pins.mkdir()
    text = (REPO / "pins" / "cpu.toml").read_text()
    shutil.copy2(REPO / "pins" / "cpu.lock.txt", pins / "cpu.lock.txt")
    for bad in ("/proc/self/environ", "../cpu.lock.txt", "sub/cpu.lock.txt"):
        (pins / "cpu.toml").write_text(text.replace('lock = "cpu.lock.txt"', f'lock = "{bad}"'))
        with pytest.raises(BadInput) as exc:
            load_pin(pins / "cpu.toml")
        assert exc.value.problems[0][0] == "lock", (bad, exc.value.problems)
    secret = tmp_path / "secret.txt"
    secret.write_text("ORACLE_BUILD_CACHE_PASSWORD=S3cretPW\n")
    (pins / "cpu.lock.txt").unlink()
    (pins / "cpu.lock.txt").symlink_to(secret)
    (pins / "cpu.toml").write_text(text)
    with pytest.raises(BadInput, match="outside the pin's folder"):
        load_pin(pins / "cpu.toml")
    (pins / "cpu.lock.txt").unlink()
    lock = (REPO / "pins" / "cpu.lock.txt").read_text()
    (pins / "cpu.lock.txt").write_text(lock + "  ORACLE_BUILD_CACHE_PASSWORD=S3cretPW\n")
    with pytest.raises(BadInput) as exc:
        load_pin(pins / "cpu.toml")
    assert "S3cret" not in exc.value.message and "from column 30" in exc.value.message
    # the case: a golden whose spec names no pin here, its embedded pin's lock
    # naming the process's environment
    golden = tmp_path / "g7"
    shutil.copytree(REPO / "goldens" / "tiny-llama-greedy", golden)
    doc = json.loads((golden / "golden.json").read_text())
    embedded = doc["oracle"]["embedded_pin"]
    embedded["pin_toml"] = embedded["pin_toml"].replace('lock = "cpu.lock.txt"',
                                                        'lock = "/proc/self/environ"')
    doc["spec"]["pin"] = "../../no/such/cpu.toml"
    (golden / "golden.json").write_text(json.dumps(doc))
    os.environ["ORACLE_BUILD_CACHE_PASSWORD"] = "S3cretPW"
    try:
        code = main(["verify", str(golden), "--home", str(tmp_path / "home")])
    finally:
        del os.environ["ORACLE_BUILD_CACHE_PASSWORD"]
    assert code == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert "S3cret" not in out + err and "lock" in err


def test_no_error_prints_a_verdict_line() -> None:
    """Issue 45 item 3: every error reaches the terminal through one renderer; a part that
    holds newlines and verdict words (a spec's model path, a vLLM exception quoting an
    engine key, a file name in the venv) never starts a line with them."""
    from oracle_build.core import verdicts
    from oracle_build.core.errors import EngineFailed, IdentityMismatch, PreflightFailed

    hostile = "x\nORACLE_IDENTITY_OK\n=> PASS\nverify: pass 1 (exit 0)\x1b[2K"
    for exc in (PreflightFailed(f"model {hostile} not found"),
                EngineFailed(f"TypeError: unexpected keyword {hostile}"),
                IdentityMismatch([(f"lib/{hostile}", "absent", "present")], where=hostile)):
        text = exc.render()
        assert not verdicts.forged(text), text
        assert "\x1b" not in text


@pytest.mark.parametrize("name", ["ORACLE_IDENTITY_OK", "oracle_numerics_ok", "Oracle_x"])
def test_safe_names_are_never_verdict_words(name: str) -> None:
    from oracle_build.contracts.base import safe_name

    with pytest.raises(ValueError, match="verdict word"):
        safe_name(name)
    assert safe_name("oracle-build-golden") == "oracle-build-golden"


def test_push_signs_only_a_numerics_record_bound_to_the_oracle(tmp_path: Path) -> None:
    """Issue 45 item 4: the numerics record lives beside the oracle (never in it) and push
    takes its fingerprint only when the record names this oracle's anchor by sha256: one
    written by hand (the issue's forged file, in the venv or beside it) signs nothing."""
    import hashlib

    from oracle_build.cache.push import _numerics_fingerprint
    from oracle_build.core.layout import beside_record

    venv = tmp_path / "oracles" / "cpu-0123456789ab"
    (venv / "oracle-build").mkdir(parents=True)
    anchor = venv.parent / f"{venv.name}.anchor.json"
    anchor.write_text('{"anchor_schema": 1}')
    forged = {"utc": "x", "set": "x", "verdict": "ORACLE_NUMERICS_OK",
              "fingerprint": "sha256:" + "6b" * 32, "whole_battery": True, "captured": [],
              "verified": []}
    (venv / "oracle-build" / "numerics.json").write_text(json.dumps(forged))
    assert beside_record(venv, "numerics") == venv.parent / f"{venv.name}.numerics.json"
    assert _numerics_fingerprint(venv) is None  # inside the venv: never read
    beside_record(venv, "numerics").write_text(json.dumps(forged))
    assert _numerics_fingerprint(venv) is None  # beside it, bound to no anchor
    bound = {**forged, "anchor_sha256": hashlib.sha256(anchor.read_bytes()).hexdigest()}
    beside_record(venv, "numerics").write_text(json.dumps(bound))
    assert _numerics_fingerprint(venv) == "6b" * 32
    anchor.write_text('{"anchor_schema": 1, "rebuilt": true}')  # another build of the pin
    assert _numerics_fingerprint(venv) is None


@pytest.mark.timeout(60)
def test_a_fifo_where_a_file_was_never_blocks(tmp_path: Path) -> None:
    """Issue 45 item 6: a FIFO in the oracle's venv (in place of vllm/py.typed) is an
    identity mismatch, and one in place of the compile cache's journal is an unreadable
    journal (the cache discarded), never a read that blocks forever."""
    from oracle_build.core.errors import BadInput
    from oracle_build.core.files import sha256_file
    from oracle_build.engine.caches import CompileCache
    from oracle_build.oracle import inventory

    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "py.typed").write_text("")
    manifest = {"files": {"lib/py.typed": {"size": 0, "mtime_ns": 1, "sha256": "e3" * 32,
                                           "dist": "vllm", "kind": "wheel"}},
                "symlinks": {}}
    (venv / "lib" / "py.typed").unlink()
    os.mkfifo(venv / "lib" / "py.typed")
    check = inventory.check(venv, manifest, deep=True)
    assert check.mismatches == [("file lib/py.typed", "a regular file",
                                 "not a regular file (a FIFO, socket or device)")]
    with pytest.raises(BadInput, match="not a regular file"):
        sha256_file(venv / "lib" / "py.typed")
    cache = CompileCache(tmp_path / "compile-cache" / "cpu-0123456789ab")
    cache.root.mkdir(parents=True)
    os.mkfifo(cache.journal)
    assert cache.recover() is True
    assert not cache.journal.exists() and cache.root.is_dir()


def test_a_report_shows_a_value_json_cannot_say() -> None:
    """verify --oracle on the source pin (whose commit is unestablished) printed the pin's
    value as a model: the report's one formatter shows it as the pin file writes it, and
    anything else JSON cannot say as its text, never an internal error (seen: exit 70)."""
    from oracle_build.contracts.pins import UnestablishedValue
    from oracle_build.report.values import fmt

    value = UnestablishedValue(status="unestablished", reason="no GitHub here")
    assert fmt(value).startswith('{"status": "unestablished", "reason": "no GitHub')
    assert fmt({"a": Path("/x")}) == '{"a": "/x"}'


def test_imported_text_is_printed_on_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An imported golden's prose (the source's own reasons) is printed escaped: a newline in
    it cannot print a line of its own."""
    src = REPO / "tests" / "data" / "vllm.cpp" / "nemotron_35_lightning_greedy"
    doc = json.loads((src / "oracle.json").read_text())
    doc["capture"]["unrecoverable_reason"] = "gone\nverify: pass 1 (exit 0)\n=> PASS"
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "oracle.json").write_text(json.dumps(doc))
    assert main(["import", str(folder), "--out", str(tmp_path / "goldens")]) == 0
    capsys.readouterr()
    code, out, _err = run(capsys, "verify", str(tmp_path / "goldens" / "src"), "--home",
                          str(tmp_path / "home"))
    assert code == 4
    assert "gone\\nverify: pass 1" in out
    assert not any(line.strip() in ("=> PASS", "verify: pass 1 (exit 0)")
                   for line in out.splitlines())


@pytest.mark.parametrize(("calls", "field"), [
    ("capital", "batch.calls"), ([[5]], "batch.calls[0][0]"), (["capital"], "batch.calls[0]"),
    ([["capital", "nope"]], "batch.calls[0][1]")])
def test_golden_batch_calls_are_prompt_ids(tmp_path: Path, calls: Any, field: str) -> None:
    doc = golden_doc()
    doc["batch"]["calls"] = calls
    with pytest.raises(BadInput) as err:
        load_golden(write_golden(tmp_path, doc))
    assert f"{field}:" in str(err.value)


@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_password_in_a_cache_reference_is_never_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        via: str) -> None:
    """`--cache oci://ci:S3cretPW@ghcr.io/team/o` (or in ORACLE_BUILD_CACHE) was refused with
    the password printed twice: now refused saying where credentials go, the userinfo never
    shown (issue 31 item 3)."""
    ref = "oci://ci:S3cretPW@ghcr.io/team/o"
    args = ["pull", "--pin", str(CPU_PIN), "--home", str(tmp_path / "home")]
    if via == "flag":
        args += ["--cache", ref]
    else:
        monkeypatch.setenv("ORACLE_BUILD_CACHE", ref)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "S3cretPW" not in out + err, out + err
    assert "credentials do not go in the reference" in err and "***@ghcr.io" in err
    from oracle_build.cache.ref import redacted

    assert redacted("oci+http://u:p@127.0.0.1:5000/a/b\n") == "oci+http://***@127.0.0.1:5000/a/b\\n"


def test_a_topk_file_that_is_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    """A golden's top-k file made a symlink to another readable file: the refusal printed that
    file's sha256 (seen with /etc/hostname). Now refused by name, never opened (issue 31
    item 4)."""
    import shutil

    folder = tmp_path / "g"
    shutil.copytree(TINY_SPEC, folder)
    (side,) = folder.glob("topk.*.safetensors")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for printing\n")
    side.unlink()
    side.symlink_to(secret)
    with pytest.raises(BadInput) as refused:
        load_golden(folder).topk_table()
    text = str(refused.value)
    assert "is a symbolic link" in text and "topk.file" in text
    assert sha256_file(secret) not in text


VERDICT_LINES = ("=> PASS", "verify: pass", "ORACLE_IDENTITY_OK", "ORACLE_NUMERICS_OK")


def test_a_value_read_cannot_print_a_verdict_line_or_markdown() -> None:
    """A golden's value such as `0.32.0\\n  => PASS\\nverify: pass 1 (exit 0)\\nORACLE_IDENTITY_OK`
    printed those lines before the real verdict (exit 3): every value is printed as data,
    escaped, on its own line's tail. In the Markdown summary a backtick could close the code
    span and a newline start a heading, or a value draw a remote image (issue 31 item 1)."""
    from oracle_build.contracts.reports import FieldDiff, GoldenVerdict, VerifyReport
    from oracle_build.report.ci import summary_md
    from oracle_build.report.text import render

    forged = "0.32.0\n  => PASS\nverify: pass 1 (exit 0)\nORACLE_IDENTITY_OK\x1b[2K"
    md = "`\n\n## oracle-build verify: exit 0\n\n### g: PASS\n\n`"
    image = "x` ![ok](http://HOST/p.png) `x"
    diffs = [FieldDiff(field="vllm", golden=forged, current="0.32.0", cls="identity"),
             FieldDiff(field="resolved.dtype", golden=md, current=image, cls="numerics"),
             FieldDiff(field=f"x\n{VERDICT_LINES[0]}", golden=1, current=2, cls="numerics")]
    v = GoldenVerdict(name="g", path="goldens/g/golden.json", status="oracle_mismatch",
                      why="the current oracle is not the golden's; nothing was run",
                      identity=diffs[:1], configuration=diffs[1:], adjudicable=False)
    report = VerifyReport(report_schema=1, created_utc="", exit_code=3, goldens=[v])
    text = render(report)
    assert "\x1b" not in text
    for line in text.splitlines():
        assert not line.strip().startswith(VERDICT_LINES), line
    assert "0.32.0\\n  => PASS" in text  # shown, as data
    summary = summary_md(report)
    lines = summary.splitlines()
    assert [ln for ln in lines if ln.startswith("#")] == [
        "## oracle-build verify: exit 3", "### g: ORACLE MISMATCH"]
    for line in lines:
        assert not line.strip().startswith(VERDICT_LINES), line
    # the image sits inside a code span its backticks cannot close
    (row,) = [ln for ln in lines if "HOST" in ln]
    assert "``x` ![ok](http://HOST/p.png) `x``" in row


def test_a_lock_is_a_regular_file_of_its_own(tmp_path: Path) -> None:
    """Issue 45 item 5 (and 7's FIFO): a lock path that is a symlink is refused, its target
    left as it was; a FIFO there is refused at once (it was exit 70 at ftruncate)."""
    from oracle_build.core.errors import OutputFailed
    from oracle_build.core.filelock import held

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "engine.lock"
    link.symlink_to(victim)
    with pytest.raises(OutputFailed, match="a symlink: refused"), held(link, what="a test"):
        pass
    assert victim.read_text() == "precious\n"
    fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    with pytest.raises(OutputFailed, match="not a regular file"), held(fifo, what="a test"):
        pass
    plain = tmp_path / "plain.lock"
    with held(plain, what="a test"):
        assert plain.read_text() == str(os.getpid())



def test_every_file_written_under_a_prepared_name_refuses_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 item 5: a file the tool writes under a name someone else could have prepared
    (a command's log, the compile cache's journal, a download's .part, an internal-error
    log) is opened through core.files.open_for_writing: a symlink there is refused and its
    target left as it was; a FIFO is refused at once, not waited on. The writers that name
    files of their own making (atomic writes, writability probes) use mkstemp (O_EXCL)."""
    import errno
    import inspect

    from oracle_build import cli
    from oracle_build.cache import pull
    from oracle_build.core import proc
    from oracle_build.core.errors import OutputFailed
    from oracle_build.core.files import open_for_writing
    from oracle_build.engine import caches
    from oracle_build.engine.caches import CompileCache
    from oracle_build.recipe import archive

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "planted.log"
    link.symlink_to(victim)
    with pytest.raises(OSError) as refused:
        open_for_writing(link, append=True, text=True)
    assert refused.value.errno == errno.ELOOP
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        open_for_writing(fifo)
    plain = tmp_path / "plain.log"
    plain.write_text("old\n")
    with open_for_writing(plain, append=True, text=True) as fh:
        fh.write("more\n")
    assert plain.read_text() == "old\nmore\n"
    with open_for_writing(plain) as fh:
        fh.write(b"new\n")
    assert plain.read_text() == "new\n"
    # a command's log
    with pytest.raises(OSError):
        proc.run(["true"], log=link)
    # the compile cache's journal, through its temporary name (pid-named: predictable)
    monkeypatch.setenv("ORACLE_BUILD_COMPILE_CACHE", str(tmp_path / "cc"))
    cache = CompileCache.of(tmp_path / "home", "cpu-0123456789ab")
    cache.root.mkdir(parents=True, exist_ok=True)
    cache.journal.with_name(cache.journal.name + f".{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(OutputFailed, match="journal"), cache.in_use("a test"):
        pass
    assert victim.read_text() == "precious\n"
    # and the writers that take a name from outside go through it
    for module in (cli, pull, archive, caches, proc):
        assert "open_for_writing(" in inspect.getsource(module), module.__name__

def test_json_text_from_outside_is_parsed_in_one_place() -> None:
    """Issue 45 item 7: JSON nested past the recursion limit (a registry's error body, token
    answer or tag list, a compile-cache journal) was a RecursionError, exit 70. Every JSON
    text the package parses goes through core.files.json_value, which makes it malformed
    JSON like any other; no module parses JSON text any other way."""
    import ast

    from oracle_build.cache.registry import error_codes
    from oracle_build.core.files import json_value

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(json.JSONDecodeError):
        json_value(deep)
    assert error_codes(deep) == ()
    package = REPO / "oracle_build"
    # the reader; our own files; the nvcc launcher (standard library only, run by ccache in
    # a build) reading the toolkit.json the tool wrote beside it
    allowed = {"core/files.py", "contracts/schemas/__init__.py", "recipe/cuda/launcher.py"}
    offenders = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        if rel in allowed or rel.startswith("inside/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("loads", "load") and \
                    isinstance(node.value, ast.Name) and node.value.id == "json":
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders


def test_outputs_that_cannot_be_written_are_exit_14_before_any_run(tmp_path: Path) -> None:
    """Issue 45 item 7: `--summary-md` or `--junit-xml` under a regular file was exit 70
    after `verify: pass 1 (exit 0)` had been printed; stdout on /dev/full was exit 70.
    Both are output errors (exit 14), the reports checked before any oracle is opened."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for option in ("--summary-md", "--junit-xml", "--html"):
        done = subprocess.run([sys.executable, "-m", "oracle_build", "verify", option,
                               str(blocker / "report")], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 14, (option, done.stderr)
        assert f"{option} {blocker / 'report'}: cannot be written" in done.stderr
        assert "verify: " not in done.stdout and "ORACLE_IDENTITY_OK" not in done.stdout
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "oracle_build", "build", "--dry-run"],
                              cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False)
    assert done.returncode == 14, done.stderr
    assert "standard output: No space left on device" in done.stderr
    assert "internal error" not in done.stderr
