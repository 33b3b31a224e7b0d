"""The CPU kernel variant as a setting the oracle holds: the pin names it, every engine and
probe runs under it on any host whose CPU has its instructions, identity proves it from the
running process, a caller's own numerics variables never reach the oracle, and a golden
records it (requested and resolved) like any setting."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from oracle_build import devices, host, judge
from oracle_build.cli import main
from oracle_build.contracts.golden import load_golden, recorded
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.targets import KernelVariant
from oracle_build.core import env as envmod
from oracle_build.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_CONFIG_DIFF,
    EXIT_NOT_HERE,
    BadInput,
    PreflightFailed,
)
from oracle_build.devices import cpu
from oracle_build.oracle import identity
from tests.conftest import (
    REPO,
    TINY_SPEC,
    BuiltOracle,
    assert_session_oracle_unchanged,
    copy_tree_for_golden,
)

CPU_PIN = REPO / "pins" / "cpu.toml"
AVX2_ONLY = frozenset(["fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2",
                       "fma", "f16c"])
ZEN4 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
                    "avx512_vnni"}


def _target(variant: str = "x86_64-avx2") -> typing.Any:
    pin = load_pin(CPU_PIN)
    return pin.target("cpu").model_copy(update={"kernel_variant": variant})


# ----------------------------------------------------------------------------- fast


def test_the_pins_variants_are_the_devices_variants() -> None:
    assert set(typing.get_args(KernelVariant)) == {*cpu.known_variants("x86_64"), "aarch64"}
    assert cpu.known_variants("aarch64") == ["native", "aarch64"]
    for name, v in cpu.VARIANTS.items():
        assert v.name == name and set(v.env) <= set(envmod.CPU_NUMERICS)
        assert set(v.predicates) == set(cpu.PREDICATES)
        # the variant's own flags hold it; the detected variant of such a CPU is itself
        assert host.cpu_variant("x86_64", frozenset(v.flags)) == name


def test_pin_kernel_variant_is_validated_and_outside_the_hash(tmp_path: Path) -> None:
    text = CPU_PIN.read_text()
    assert 'kernel_variant = "x86_64-avx2"' in text
    (tmp_path / "cpu.lock.txt").write_text((REPO / "pins" / "cpu.lock.txt").read_text())

    def pin_with(line: str) -> Path:
        path = tmp_path / "cpu.toml"
        path.write_text(text.replace('kernel_variant = "x86_64-avx2"', line))
        return path

    held = load_pin(CPU_PIN)
    native = load_pin(pin_with('kernel_variant = "native"'))
    unset = load_pin(pin_with(""))
    # how engines run, not what is built: one oracle (one key) for every variant
    assert held.content_hash == native.content_hash == unset.content_hash
    assert unset.target("cpu").kernel_variant == "native"  # type: ignore[union-attr]
    with pytest.raises(BadInput) as bad:
        load_pin(pin_with('kernel_variant = "x86_64-avx3"'))
    assert "targets.cpu.kernel_variant: Input should be 'native', 'x86_64-avx2'" in str(bad.value)
    with pytest.raises(BadInput) as bad:
        load_pin(pin_with('kernel_variant = "aarch64"'))
    assert "kernel_variant 'aarch64' is not a variant of an x86_64 CPU" in str(bad.value)


def test_hold_sets_the_variant_and_refuses_a_cpu_without_its_instructions() -> None:
    target = _target()
    h = cpu.hold(target, None, AVX2_ONLY, "x86_64-avx2")
    assert (h.requested, h.variant, h.library, h.torch_capability) == (
        "x86_64-avx2", "x86_64-avx2", "_C_AVX2", "AVX2")
    assert h.env["ATEN_CPU_CAPABILITY"] == "avx2" and h.env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert h.env["MKL_CBWR"] == "COMPATIBLE"  # one MKL code path on Intel and AMD
    inside = json.loads(h.env[cpu.HOLD_VARIABLE])
    # on an AVX2-only CPU, holding AVX2 answers what the CPU answers: a no-op there
    assert inside["predicates"] == {**dict.fromkeys(cpu.PREDICATES, False),
                                    "_is_avx2_supported": True}
    # a golden's or --kernel-variant's variant overrides the pin's
    assert cpu.hold(target, "x86_64-avx512_bf16", ZEN4, "x86_64-avx512_bf16").env[
        "ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    with pytest.raises(PreflightFailed) as lacking:
        cpu.hold(target, "x86_64-avx512_bf16-amx", ZEN4, "x86_64-avx512_bf16")
    assert "needs instructions this host's CPU lacks: amx_tile, amx_bf16" in str(lacking.value)
    assert cpu.missing_flags("x86_64-avx512", AVX2_ONLY) == [
        "avx512f", "avx512bw", "avx512vl", "avx512dq"]
    with pytest.raises(PreflightFailed, match="'x86_64-sse' is not one an x86_64 oracle runs"):
        cpu.hold(target, "x86_64-sse", ZEN4, None)
    # native holds nothing: the host's own variant must be the one in force
    native = cpu.hold(_target("native"), None, ZEN4, "x86_64-avx512_bf16")
    assert native.env == {} and native.inside is None and native.variant == "x86_64-avx512_bf16"
    # a GPU target runs no CPU variant
    gb10 = load_pin(REPO / "pins" / "vllm-555967922.toml", check_lock=False)
    gpu_target = next(t for t in gb10.model.targets.values() if t.device == "cuda")
    assert devices.module(gpu_target).hold(gpu_target, None, ZEN4, None) == devices.NO_HOLD
    with pytest.raises(PreflightFailed, match="runs no CPU kernel variant"):
        devices.module(gpu_target).hold(gpu_target, "x86_64-avx2", ZEN4, None)


def test_a_process_running_another_variant_than_held_is_an_identity_mismatch() -> None:
    h = cpu.hold(_target(), None, ZEN4, "x86_64-avx512_bf16")
    # vLLM fell back, or the hold did not take: every way is named
    bad = cpu.variant_mismatches(h, {"variant": "x86_64-avx512_bf16", "held": None,
                                     "torch_capability": "AVX512",
                                     "loaded": ["_C.abi3.so"]})
    assert [f for f, _e, _g in bad] == ["cpu kernel variant", "cpu kernel variant held",
                                        "torch cpu capability"]
    assert bad[0] == ("cpu kernel variant", "x86_64-avx2",
                      "x86_64-avx512_bf16 (libraries loaded: _C.abi3.so)")
    assert cpu.variant_mismatches(h, {"variant": "x86_64-avx2", "held": "x86_64-avx2",
                                      "torch_capability": "AVX2",
                                      "loaded": ["_C_AVX2.abi3.so"]}) == []


def test_callers_numerics_variables_never_reach_the_oracle_and_are_said(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(envmod, "_told", set())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    monkeypatch.setenv("MKL_CBWR", "AVX512")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX512")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")  # MKL_, but not one that moves the ISA
    h = cpu.hold(_target(), None, AVX2_ONLY, "x86_64-avx2")
    env = envmod.oracle_env(h.env)
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    # MKL_NUM_THREADS moves no ISA, but reaches no oracle either: its environment is built
    assert env["MKL_CBWR"] == "COMPATIBLE" and "MKL_NUM_THREADS" not in env
    assert "MKL_ENABLE_INSTRUCTIONS" not in env
    native = envmod.oracle_env({})
    assert not set(envmod.CPU_NUMERICS) & set(native)
    err = capsys.readouterr().err
    assert "ATEN_CPU_CAPABILITY='default'" in err and "MKL_CBWR='AVX512'" in err
    assert "not passed to the oracle (they move CPU numerics" in err
    (note,) = [ln for ln in err.splitlines() if "its environment is built" in ln]
    assert "MKL_NUM_THREADS" in note


def before_holding() -> Path:
    """The bundled golden as it was before it recorded its hold (kept under replaced/ by
    its migration, issue 55)."""
    return next(p for p in sorted((TINY_SPEC / "replaced").glob("golden.*.json"))
                if json.loads(p.read_text())["engine"].get("kernel_variant") is None)


def test_a_golden_from_before_holding_is_held_to_its_detected_variant(tmp_path: Path) -> None:
    rec = recorded(load_golden(before_holding()), before_holding())
    assert rec.engine.kernel_variant is None and rec.kernel_variant == "x86_64-avx2"
    target = _target("native")
    from oracle_build.goldens import run_variant

    assert run_variant(rec, TINY_SPEC, target, None) == "x86_64-avx2"
    assert run_variant(rec, TINY_SPEC, target, "x86_64-avx512") == "x86_64-avx512"
    # a golden naming a variant no oracle runs is bad input, naming the field
    folder = copy_tree_for_golden(tmp_path)
    doc = json.loads((folder / "golden.json").read_text())
    doc["oracle"]["identity"]["cpu_variant"] = "x86_64-avx9\nORACLE_IDENTITY_OK"
    doc["engine"]["kernel_variant"] = None  # as before holding: the identity's is the one
    (folder / "golden.json").write_text(json.dumps(doc))
    bad = recorded(load_golden(folder), folder / "golden.json")
    with pytest.raises(BadInput) as refused:
        run_variant(bad, folder / "golden.json", target, None)
    assert "oracle.identity.cpu_variant" in str(refused.value)
    assert "\nORACLE_IDENTITY_OK" not in str(refused.value)


def test_the_variant_in_force_is_a_numerics_setting_and_what_was_asked_is_context() -> None:
    golden = load_golden(before_holding())
    rec = recorded(golden, before_holding())
    from oracle_build.contracts.golden import KernelVariantRecord

    def new(resolved: str, requested: str) -> dict[str, typing.Any]:
        engine = rec.engine.model_copy(update={"kernel_variant": KernelVariantRecord(
            requested=requested, resolved=resolved)})
        return {"engine": engine, "environment": rec.environment, "sampling": golden.sampling,
                "calls": rec.batch["calls"]}

    numerics, context = judge.config_diffs(rec, new("x86_64-avx2", "x86_64-avx2"))
    assert numerics == [] and context == []  # an older golden, held to its own: the same
    numerics, _ = judge.config_diffs(rec, new("x86_64-avx512_bf16-amx", "native"))
    assert [(d.field, d.golden, d.current) for d in numerics] == [
        ("kernel_variant", "x86_64-avx2", "x86_64-avx512_bf16-amx")]
    held = rec.engine.model_copy(update={"kernel_variant": KernelVariantRecord(
        requested="native", resolved="x86_64-avx2")})
    rec2 = type(rec)(golden, rec.oracle, held, rec.spec, rec.batch, rec.environment,
                     rec.logprobs)
    numerics, context = judge.config_diffs(rec2, new("x86_64-avx2", "x86_64-avx2"))
    assert numerics == [] and [d.field for d in context] == ["kernel_variant.requested"]


def test_the_whole_hold_a_golden_records_is_held_to_on_verify() -> None:
    """Issue 55: a golden that records the whole hold (the library the process mapped,
    torch's capability, every torch.cpu answer given) is held to each: a run whose hold
    answered one predicate otherwise, or mapped another library, is a numerics difference,
    named; the CPU's own answers (another CPU answers otherwise) are not compared."""
    from oracle_build.contracts.golden import KernelVariantRecord

    golden = load_golden(TINY_SPEC)
    rec = recorded(golden, TINY_SPEC / "golden.json")
    given = {"_is_avx2_supported": True, "_is_avx512_supported": False,
             "_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}
    full = KernelVariantRecord(requested="x86_64-avx2", resolved="x86_64-avx2",
                               libraries=["_C_AVX2.abi3.so"], torch_capability="AVX2",
                               env={"ATEN_CPU_CAPABILITY": "avx2"}, predicates=given,
                               cpu_answers={"_is_avx512_supported": True})
    rec2 = type(rec)(golden, rec.oracle, rec.engine.model_copy(update={"kernel_variant": full}),
                     rec.spec, rec.batch, rec.environment, rec.logprobs)

    def run(**update: typing.Any) -> dict[str, typing.Any]:
        engine = rec.engine.model_copy(update={"kernel_variant": full.model_copy(
            update=update)})
        return {"engine": engine, "environment": rec.environment, "sampling": golden.sampling,
                "calls": rec.batch["calls"]}

    assert judge.config_diffs(rec2, run()) == ([], [])
    assert judge.config_diffs(rec2, run(cpu_answers={"_is_avx512_supported": False})) == (
        [], [])
    numerics, _ = judge.config_diffs(rec2, run(predicates={**given,
                                                           "_is_avx512_supported": True}))
    assert [d.field for d in numerics] == ["kernel_variant.predicates"]
    numerics, _ = judge.config_diffs(rec2, run(libraries=["_C.abi3.so"],
                                               torch_capability="AVX512"))
    assert [d.field for d in numerics] == ["kernel_variant.libraries",
                                           "kernel_variant.torch_capability"]


# ----------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_identity_proves_the_held_variant_from_the_process(cpu_oracle: BuiltOracle) -> None:
    """Slow: two identity probes (each imports vLLM in the oracle's python, ~20 s). Held
    at AVX2 on whatever CPU this is, the probe's own process maps vLLM's _C_AVX2 and torch
    dispatches AVX2; a hold that claims one variant and applies another is a mismatch. The
    hold writes nothing into the oracle."""
    pin = cpu_oracle.pin
    target = pin.target("cpu")
    ident = identity.check(pin, target, cpu_oracle.venv)
    assert ident.ok, ident.mismatches
    kernels = ident.facts["cpu_kernels"]
    assert kernels["loaded"] == ["_C_AVX2.abi3.so"] and kernels["torch_capability"] == "AVX2"
    assert kernels["held"] == ident.cpu_variant == "x86_64-avx2"
    assert kernels["avx512"] is False and kernels["amx"] is False  # as vLLM sees the CPU
    real = kernels["cpu"]  # what the CPU itself answers, before the hold
    flags = host.host().cpu_flags
    assert real["_is_avx512_supported"] == all(
        f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    # claim AVX-512, apply AVX2: the process's own facts give it away
    avx2 = host.hold(target)
    lying = devices.Hold(requested="x86_64-avx512", variant="x86_64-avx512", env=avx2.env,
                         inside=avx2.inside, library="_C_AVX512", torch_capability="AVX512")
    wrong = identity.check(pin, target, cpu_oracle.venv, hold=lying)
    fields = {f: g for f, _e, g in wrong.mismatches}
    assert fields["cpu kernel variant"].startswith("x86_64-avx2 (libraries loaded: "
                                                   "_C_AVX2.abi3.so)")
    assert fields["torch cpu capability"] == "AVX2"
    assert_session_oracle_unchanged(cpu_oracle)


@pytest.mark.slow
def test_another_variant_than_the_goldens_is_a_configuration_difference(
        cpu_oracle: BuiltOracle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: runs the real vLLM engine once. The bundled AVX2 golden re-run under another
    variant this CPU has (`--kernel-variant`): CONFIGURATION DIFFERENCE naming the variant
    before any token (exit 4). On an AVX2-only CPU, which has no other variant, the same
    request is refused naming the flags it lacks (exit 11), with no engine run."""
    folder = copy_tree_for_golden(tmp_path)
    others = [v for v in cpu.VARIANTS if v != "x86_64-avx2"
              and not host.missing_instructions(cpu_oracle.pin.target("cpu"), v)]
    asked = others[-1] if others else "x86_64-avx512"
    capsys.readouterr()
    code = main(["verify", str(folder), "--kernel-variant", asked, "--home",
                 str(cpu_oracle.home)])
    out = capsys.readouterr()
    if not others:
        assert code == EXIT_NOT_HERE and "lacks (avx512f" in out.out
        return
    assert code == EXIT_CONFIG_DIFF, out.out[-3000:]
    text = out.out
    assert f"kernel_variant: golden x86_64-avx2, now {asked}" in text
    assert text.index("kernel_variant: golden") < text.index("tokens:")
    assert f"CPU kernel variant {asked}, held" in out.err
    # an unknown variant asked for is bad input naming the option
    assert main(["verify", str(folder), "--kernel-variant", "x86_64-sse", "--home",
                 str(cpu_oracle.home)]) == EXIT_BAD_INPUT
    assert "--kernel-variant" in capsys.readouterr().err


def test_a_logprob_difference_from_another_cpu_model_is_not_held_never_drift(
        tmp_path: Path) -> None:
    from oracle_build.contracts.reports import GoldenVerdict
    from oracle_build.services.numerics import differences

    folder = copy_tree_for_golden(tmp_path)
    doc = json.loads((folder / "golden.json").read_text())
    here = host.cpu_model()

    def verdict(cpu: dict[str, typing.Any], status: str = "pass") -> GoldenVerdict:
        doc["run"]["host"].update(cpu)
        (folder / "golden.json").write_text(json.dumps(doc))
        tokens = [] if status == "pass" else [{
            "prompt": "capital", "prompt_ids_equal": True, "tokens_equal": False,
            "n_golden": 8, "n_new": 8, "index": 3, "golden_token": 1, "new_token": 2,
            "golden_margin": 0.1, "new_margin": 0.1, "kind": "near_tie"}]
        return GoldenVerdict(
            name="gemma2", path=str(folder / "golden.json"), status=status, why="",  # type: ignore[arg-type]
            tokens=tokens, logprobs_identical=False,
            logprobs_difference={"prompt": "capital", "position": 1, "max_abs_delta": 4.8e-7,
                                 "golden": [[156, -3.78]], "current": [[156, -3.78]]})

    other = verdict({"cpu_vendor": "AuthenticAMD", "cpu_model": "AMD EPYC 9B14"})
    drift, not_held = differences([other])
    assert drift == [] and len(not_held) == 1
    assert "not held across CPU models: captured on AMD EPYC 9B14" in not_held[0]
    same = verdict(here)  # this very CPU model: a logprob difference is drift
    drift, not_held = differences([same])
    assert not_held == [] and "top-k logprobs differ" in drift[0]
    moved = verdict({"cpu_vendor": "AuthenticAMD", "cpu_model": "AMD EPYC 9B14"}, "drift")
    drift, not_held = differences([moved])  # a token that moved is drift on any CPU
    assert not_held == [] and "prompt capital position 3" in drift[0]


def test_numbers_differ_finds_any_bit_of_a_goldens_numbers() -> None:
    """Issue 55: what capture --migrate compares. A golden against itself: nothing, and
    every token and top-k cell counted; one logprob one ulp off, or one token other: named
    by prompt and position."""
    import numpy as np

    from oracle_build.goldens import numbers_differ

    golden = load_golden(TINY_SPEC)
    same, tokens, cells = numbers_differ(golden, golden)
    assert same == [] and tokens == sum(len(p.token_ids) for p in golden.prompts) == 72
    assert cells == sum(len(row) for i in range(len(golden.prompts))
                        for row in golden.prompt_topk(i) or []) > 72
    rows = [[list(map(list, golden.prompt_topk(i) or [])) for i in range(len(golden.prompts))]]
    rows[0][1][5][3][1] = float(np.nextafter(np.float32(rows[0][1][5][3][1]), np.float32(0)))
    prompts = [p.model_copy(update={"topk": rows[0][i]}) for i, p in enumerate(golden.prompts)]
    off = golden.model_copy(update={"prompts": prompts, "topk": None})
    object.__setattr__(off, "_table", None)
    differ, _, _ = numbers_differ(golden, off)
    assert differ == [f"prompt {golden.prompts[1].id} position 5: top-k differs"]
    other = golden.model_copy(update={"prompts": [golden.prompts[0].model_copy(update={
        "token_ids": [*golden.prompts[0].token_ids[:3], 299,
                      *golden.prompts[0].token_ids[4:]]}), *golden.prompts[1:]]})
    differ, _, _ = numbers_differ(golden, other)
    assert differ[0] == f"prompt {golden.prompts[0].id}: tokens differ from position 3"
