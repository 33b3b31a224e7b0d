"""The numerics battery on the real CPU oracle: generators byte-identical, the battery
verified (ORACLE_NUMERICS_OK and its fingerprint through nox), a changed MoE expert is
DRIFT naming qwen3-moe (exit 13 first while its spec pins the old hash), a skipped
checkpoint tensor refuses the capture, a set of another held CPU kernel variant verifies
under that variant, and a golden of a variant whose instructions the CPU lacks is exit 11,
never drift."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from oracle_build import host
from oracle_build.checkpoints import families
from oracle_build.cli import main
from oracle_build.contracts.spec import GENERATED_MODELS, load_spec
from oracle_build.core.errors import (
    EXIT_DRIFT,
    EXIT_MODEL,
    EXIT_NOT_HERE,
    EXIT_PREFLIGHT,
    EXIT_REFUSED,
)
from oracle_build.oracle.venv import OracleVenv
from oracle_build.services.numerics import set_dir
from tests.conftest import REPO, TINY_SPEC, BuiltOracle

BATTERY = REPO / "goldens" / "numerics"
MOE_EXPERT = "model.layers.0.mlp.experts.1.down_proj.weight"


# ----------------------------------------------------------------------------- fast


def test_every_generated_model_the_spec_accepts_has_a_generator() -> None:
    assert set(GENERATED_MODELS) == set(families.NAMES)
    specs = {load_spec(p).model.generate for p in (BATTERY / "specs").glob("*.toml")}
    assert specs == set(families.NAMES)  # the battery covers every generator


def test_bf16_rounding_is_round_to_nearest_even() -> None:
    x = np.array([1.0, -2.0, 1.00390625, 1.01171875, 3.0e38], dtype=np.float32)
    # 1+2^-8 is a tie between 1.0 and 1+2^-7: even (1.0) wins; 1+3*2^-8 rounds up
    assert [hex(v) for v in families.to_bf16_bits(x)] == ["0x3f80", "0xc000", "0x3f80",
                                                             "0x3f82", "0x7f62"]


@pytest.mark.parametrize(("flags", "machine", "variant"), [
    ("fpu avx avx2", "x86_64", "x86_64-avx2"),
    ("avx2 avx512f avx512bw avx512vl", "x86_64", "x86_64-avx2"),  # no avx512dq: AVX2 kernels
    ("avx2 avx512f avx512bw avx512vl avx512dq", "x86_64", "x86_64-avx512"),
    ("avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16", "x86_64", "x86_64-avx512_bf16"),
    ("avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_tile amx_bf16", "x86_64",
     "x86_64-avx512_bf16-amx"),
    ("fp asimd bf16 sve", "aarch64", "aarch64"),
])
def test_cpu_variant_follows_the_flags_vllm_chooses_by(flags: str, machine: str,
                                                       variant: str, tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    key = "Features" if machine == "aarch64" else "flags"
    info.write_text(f"processor\t: 0\n{key}\t\t: {flags}\n\n")
    assert host.cpu_variant(machine, host.cpu_flags(info)) == variant


HELD = "x86_64-avx2"  # pins/cpu.toml's kernel_variant


def test_committed_set_is_keyed_by_pin_target_and_variant() -> None:
    sets = sorted(p.relative_to(BATTERY / "sets") for p in (BATTERY / "sets").glob("*/*/*"))
    assert sets, "no committed battery set"
    for key in sets:
        pin_key, target, variant = key.parts
        members = sorted(p.parent.name for p in (BATTERY / "sets" / key).glob("*/golden.json"))
        assert members == sorted(p.stem for p in (BATTERY / "specs").glob("*.toml"))
        for m in members:
            golden = json.loads((BATTERY / "sets" / key / m / "golden.json").read_text())
            assert golden["oracle"]["pin_key"] == pin_key
            assert golden["oracle"]["target"] == target
            assert golden["oracle"]["identity"]["cpu_variant"] == variant


# ----------------------------------------------------------------------------- slow


def copy_battery(dest: Path) -> Path:
    """goldens/numerics and pins/ side by side, as in the repository (set specs name their
    pin by a relative path)."""
    shutil.copytree(BATTERY, dest / "goldens" / "numerics")
    shutil.copytree(REPO / "pins", dest / "pins")
    return dest / "goldens" / "numerics"


@pytest.mark.slow
def test_generators_reproduce_the_committed_model_files(cpu_oracle: BuiltOracle,
                                                       tmp_path: Path) -> None:
    """Generated in a fresh home (the layouts read from transformers afresh), every member's
    files are byte for byte the ones its committed spec pins (generated when the set was
    captured, on another day and machine): the generators are deterministic across
    generations and hosts."""
    venv = OracleVenv(cpu_oracle.venv)
    transformers = venv.distributions()["transformers"]
    runs = [{name: families.generate(name, tmp_path / "gen1" / name, home=tmp_path / "home1",
                                     venv=venv, transformers=transformers)
             for name in families.NAMES}]
    # a damaged layout cache is read again from transformers, never trusted
    (cache,) = (tmp_path / "home1" / "models" / ".layouts" / transformers).glob(
        "tiny-qwen3-moe-v1-*.json")
    cache.write_text('{"class": "Qwen3MoeForCausalLM", "tensors": {"x": [0]}}')
    again = families.generate("tiny-qwen3-moe-v1", tmp_path / "gen3", home=tmp_path / "home1",
                              venv=venv, transformers=transformers)
    assert again == runs[0]["tiny-qwen3-moe-v1"]
    assert json.loads(cache.read_text())["tensors"][MOE_EXPERT] == [128, 64]
    covered = set()
    for spec_path in [*(BATTERY / "specs").glob("*.toml"), TINY_SPEC / "spec.toml"]:
        spec = load_spec(spec_path)
        assert spec.model.generate is not None
        assert runs[0][spec.model.generate] == spec.model.files, spec_path.name
        covered.add(spec.model.generate)
    assert covered == set(families.NAMES)  # every generator, against a committed spec
    # MoE experts are one tensor per expert on disk, as real checkpoints are
    header = (tmp_path / "gen1" / "tiny-qwen3-moe-v1" / "model.safetensors").read_bytes()
    names = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    assert MOE_EXPERT in names and not any("gate_up_proj" in n for n in names)


# The whole battery through nox (ORACLE_NUMERICS_OK, its fingerprint, the verdict beside the
# build record) runs once per suite, on the oracle recovered from the cache:
# tests/test_cache.py::test_recovery_into_a_fresh_home_from_the_registry.


@pytest.mark.slow
def test_changed_moe_expert_is_drift_naming_qwen3_moe(cpu_oracle: BuiltOracle, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    battery = copy_battery(tmp_path)
    home = str(cpu_oracle.home)
    # the set of the pin's held variant (committed: verified on every host with AVX2)
    where = set_dir(battery, cpu_oracle.pin, "cpu", HELD)
    assert (where / "qwen3-moe" / "golden.json").exists()
    original = families.values

    def one_value_changed(generator: str, name: str, shape: list[int]) -> np.ndarray:
        out = original(generator, name, shape)
        if generator == "tiny-qwen3-moe-v1" and name == MOE_EXPERT:
            out = out.copy()
            out[0, 0] = np.float32(4.0)
        return out

    monkeypatch.setattr(families, "values", one_value_changed)
    capsys.readouterr()
    # the spec still pins the old hash: the model is refused before any engine starts
    assert main(["numerics", "--home", home, "--battery", str(battery),
                 "--only", "qwen3-moe"]) == EXIT_MODEL
    assert "model.safetensors: sha256" in capsys.readouterr().err
    # the spec and golden pin the regenerated model: the oracle's numbers now differ
    model = cpu_oracle.home / "models" / "tiny-qwen3-moe-v1" / "model.safetensors"
    new_hash = hashlib.sha256(model.read_bytes()).hexdigest()
    golden_path = where / "qwen3-moe" / "golden.json"
    golden = json.loads(golden_path.read_text())
    old_hash = golden["spec"]["model"]["files"]["model.safetensors"]
    assert new_hash != old_hash
    golden["spec"]["model"]["files"]["model.safetensors"] = new_hash
    golden_path.write_text(json.dumps(golden))
    spec_path = where / "qwen3-moe" / "spec.toml"
    spec_path.write_text(spec_path.read_text().replace(old_hash, new_hash))
    code = main(["numerics", "--home", home, "--battery", str(battery), "--only", "qwen3-moe"])
    out = capsys.readouterr().out
    assert code == EXIT_DRIFT, out[-3000:]
    assert "ORACLE_NUMERICS_DRIFT" in out and "ORACLE_NUMERICS_OK" not in out
    assert re.search(r"^  qwen3-moe: prompt \w+ position \d+", out, re.M), out[-3000:]
    monkeypatch.setattr(families, "values", original)
    families.generate("tiny-qwen3-moe-v1", model.parent, home=cpu_oracle.home,
                      venv=OracleVenv(cpu_oracle.venv),
                      transformers=OracleVenv(cpu_oracle.venv).distributions()["transformers"])


@pytest.mark.slow
def test_a_checkpoint_tensor_the_loader_skips_refuses_the_capture(
        cpu_oracle: BuiltOracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's Llama loader skips `rotary_emb.inv_freq` by name: a generator writing one
    would leave a tensor no loader read. The capture says which, and publishes nothing."""
    family = families.BY_GENERATOR["tiny-llama-bf16-v1"]
    original = families.family_files

    def with_extra(fam: families.Family, tensors: dict[str, list[int]]) -> dict[str, bytes]:
        if fam.generator == family.generator:
            tensors = {**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": [32]}
        return original(fam, tensors)

    monkeypatch.setattr(families, "family_files", with_extra)
    venv = OracleVenv(cpu_oracle.venv)
    files = families.generate(family.generator, tmp_path / "m", home=tmp_path / "h",
                              venv=venv, transformers=venv.distributions()["transformers"])
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    text = (BATTERY / "specs" / "llama-bf16.toml").read_text()
    text = re.sub(r'^pin = ".*"$', f'pin = "{REPO / "pins" / "cpu.toml"}"', text, flags=re.M)
    for name, digest in files.items():
        text = re.sub(rf'^"{re.escape(name)}" = "[0-9a-f]{{64}}"$', f'"{name}" = "{digest}"',
                      text, flags=re.M)
    (spec_dir / "spec.toml").write_text(text)
    capsys.readouterr()
    code = main(["capture", str(spec_dir), "--home", str(cpu_oracle.home)])
    err = capsys.readouterr().err
    assert code == EXIT_REFUSED, err[-3000:]
    assert "skipped 1 of 22 checkpoint tensors" in err
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" in err
    assert not (spec_dir / "golden.json").exists()
    monkeypatch.setattr(families, "family_files", original)
    families.generate(family.generator, cpu_oracle.home / "models" / family.generator,
                      home=cpu_oracle.home, venv=venv,
                      transformers=venv.distributions()["transformers"])


@pytest.mark.slow
def test_golden_of_a_variant_this_cpu_lacks_is_not_verifiable_here_naming_the_flags(
        cpu_oracle: BuiltOracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: needs the built oracle's home. A committed member of the AVX-512 BF16 set on
    an AVX2-only CPU (this host's flags less every AVX-512 one: refused before anything
    runs, so no engine is needed to see it): NOT VERIFIABLE HERE naming the missing flags,
    not drift; the same golden with its records damaged is still bad input (2)."""
    battery = copy_battery(tmp_path)
    path = set_dir(battery, cpu_oracle.pin, "cpu", "x86_64-avx512_bf16") / "llama" / "golden.json"
    real = host.host()
    avx2_only = dataclasses.replace(
        real, cpu_flags=frozenset(f for f in real.cpu_flags if not f.startswith(("avx512",
                                                                                 "amx"))),
        cpu_variant="x86_64-avx2")
    monkeypatch.setattr(host, "host", lambda: avx2_only)
    capsys.readouterr()
    code = main(["verify", str(path), "--home", str(cpu_oracle.home)])
    out = capsys.readouterr()
    assert code == EXIT_NOT_HERE, out.out[-2000:]
    assert ("captured under CPU kernel variant x86_64-avx512_bf16, whose instructions this "
            "host's CPU lacks (avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, "
            "avx512_vnni)") in out.out
    assert "not drift" in out.out and "DRIFT" not in out.out
    assert "==> engine" not in out.err  # nothing was run
    # numerics and capture refuse such a variant by name too (exit 6), before any engine
    code = main(["numerics", "--home", str(cpu_oracle.home), "--battery", str(battery),
                 "--kernel-variant", "x86_64-avx512"])
    err = capsys.readouterr().err
    assert code == EXIT_PREFLIGHT, err[-2000:]
    assert "x86_64-avx512 needs instructions this host's CPU lacks: avx512f" in err
    golden = json.loads(path.read_text())
    del golden["engine"]["resolved"]["dtype"]
    path.write_text(json.dumps(golden))
    assert main(["verify", str(path), "--home", str(cpu_oracle.home)]) == 2


@pytest.mark.slow
def test_other_held_variant_sets_verify_bit_for_bit_or_say_why(
        cpu_oracle: BuiltOracle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine once. The committed set of another variant than the
    pin's, verified under its own held variant on this host when its CPU has that variant's
    instructions; on a CPU without them, refused naming them. Its gemma2 member was captured
    on an AMD EPYC: on an Intel host it is the cross-vendor case, bit for bit only because
    the variant holds MKL to one code path (MKL_CBWR=COMPATIBLE; measured 4.8e-7 nats apart
    without)."""
    battery = copy_battery(tmp_path)
    variant = "x86_64-avx512_bf16"
    lacking = host.missing_instructions(cpu_oracle.pin.target("cpu"), variant)
    capsys.readouterr()
    code = main(["numerics", "--home", str(cpu_oracle.home), "--battery", str(battery),
                 "--kernel-variant", variant, "--only", "gemma2"])
    out = capsys.readouterr()
    if lacking:
        assert code == EXIT_PREFLIGHT and ", ".join(lacking) in out.err
        return
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    assert "ORACLE_NUMERICS_OK" in out.out
    assert out.out.count("top-k logprobs bit-identical") == 1
    assert "CPU kernel variant x86_64-avx512_bf16, held" in out.err
