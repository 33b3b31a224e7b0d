"""Goldens outside the project: a golden carries its pin (and lock), so a copy in another
tree verifies against the built oracle found by the pin's hash; a damaged copy is bad input.
Models from the Hugging Face cache honour HF_HOME and the hub layout (snapshots whose files
are symlinks into blobs). Real engine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from oracle_build.checkpoints import tiny
from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden
from oracle_build.core.errors import EXIT_BAD_INPUT, EXIT_OK
from tests.conftest import TINY_SPEC, Captured

pytestmark = pytest.mark.slow


def test_golden_copied_outside_the_project_verifies(captured: Captured, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    golden = load_golden(captured.golden_path)
    assert golden.oracle.embedded_pin is not None  # type: ignore[union-attr]
    elsewhere = tmp_path / "their-repo" / "tests" / "goldens" / "tiny"
    elsewhere.mkdir(parents=True)
    shutil.copy2(captured.golden_path, elsewhere / "golden.json")
    # golden.json alone is half a format-2 golden: bad input naming the missing sidecar
    capsys.readouterr()
    assert main(["verify", str(elsewhere), "--home", str(captured.oracle.home)]) == \
        EXIT_BAD_INPUT
    assert "topk.file" in capsys.readouterr().err
    (sidecar,) = captured.golden_path.parent.glob("topk.*.safetensors")
    shutil.copy2(sidecar, elsewhere / sidecar.name)
    assert not (elsewhere / json.loads((elsewhere / "golden.json").read_text())["spec"]["pin"]
                ).exists()  # the pin the spec names is not there
    home = str(captured.oracle.home)
    capsys.readouterr()
    assert main(["verify", str(elsewhere), "--home", home]) == EXIT_OK, capsys.readouterr().out
    out = capsys.readouterr()
    assert "=> PASS" in out.out
    assert str(captured.oracle.venv) in out.err  # the built oracle, found by the pin's hash
    unpacked = captured.oracle.home / "pins" / captured.oracle.pin.key
    assert (unpacked / "cpu.toml").read_bytes() == (TINY_SPEC / ".." / ".." / "pins" /
                                                    "cpu.toml").resolve().read_bytes()
    # a golden whose carried pin does not hash to its recorded pin_hash: bad input, named
    data = json.loads((elsewhere / "golden.json").read_text())
    data["oracle"]["embedded_pin"]["pin_toml"] = data["oracle"]["embedded_pin"][
        "pin_toml"].replace('memory_floor_gib = 4.0', 'memory_floor_gib = 3.0')
    assert "memory_floor_gib = 3.0" in data["oracle"]["embedded_pin"]["pin_toml"]
    (elsewhere / "golden.json").write_text(json.dumps(data))
    assert main(["verify", str(elsewhere), "--home", home]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "oracle.embedded_pin" in err and "pin_hash" in err
    assert "==> engine" not in err


def hub_layout(hf_home: Path, repo_id: str, revision: str, files: dict[str, bytes]) -> Path:
    """The Hugging Face hub cache layout: blobs named by their sha256, a snapshot folder per
    revision whose files are relative symlinks into blobs, refs/main naming the revision."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return snapshot


def test_hub_layout_model_under_hf_home_captures_and_verifies(
        captured: Captured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    files = tiny.files()
    revision = hashlib.sha1(b"oracle-build hub layout test").hexdigest()
    snapshot = hub_layout(tmp_path / "hf", "oracle-build/tiny-llama", revision, files)
    assert all((snapshot / n).is_symlink() for n in files)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    spec_dir = tmp_path / "goldens" / "hub-tiny"
    spec_dir.mkdir(parents=True)
    text = (TINY_SPEC / "spec.toml").read_text()
    text = text.replace('name = "tiny-llama-greedy"', 'name = "hub-tiny"')
    text = text.replace('generate = "tiny-llama-v1"',
                        f'repo_id = "oracle-build/tiny-llama"\nrevision = "{revision}"')
    text = text.replace('pin = "../../pins/cpu.toml"',
                        f'pin = "{(TINY_SPEC / ".." / ".." / "pins" / "cpu.toml").resolve()}"')
    assert 'repo_id = "oracle-build/tiny-llama"' in text
    (spec_dir / "spec.toml").write_text(text)
    home = str(captured.oracle.home)
    capsys.readouterr()
    assert main(["capture", str(spec_dir), "--home", home]) == EXIT_OK, capsys.readouterr().err
    golden = load_golden(spec_dir / "golden.json")
    assert golden.model is not None
    assert golden.model.source == f"hub:oracle-build/tiny-llama@{revision}"
    assert golden.model.path == str(snapshot)
    assert golden.model.files["model.safetensors"]["sha256"] == hashlib.sha256(
        files["model.safetensors"]).hexdigest()
    capsys.readouterr()
    assert main(["verify", str(spec_dir), "--home", home]) == EXIT_OK, capsys.readouterr().out
    # the same tokens as the generated model's committed golden: the files are the same
    committed = load_golden(TINY_SPEC)
    assert [p.token_ids for p in golden.prompts] == [p.token_ids for p in committed.prompts]
    # without HF_HOME, the default cache has no such snapshot: a clear preflight error
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    assert main(["verify", str(spec_dir), "--home", home]) == 6
    assert "models--oracle-build--tiny-llama" in capsys.readouterr().err
