"""Engine-backed analyses of one golden: the teacher-forced margin at a position, and the
determinism probe (K legs of the recorded configuration in one process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from oracle_build import compare, engine
from oracle_build.candidate import load_candidate, pair
from oracle_build.capture import make_job
from oracle_build.errors import BadInput
from oracle_build.golden import Golden, ModelSpec, Recorded, load_golden, recorded
from oracle_build.verify import pin_for, run_request

OUTSIDE_TOPK_MNATS = 99_999_000  # vllm.cpp's marker for a token outside the top-20


def _oracle_and_model(rec: Recorded, path: Path, home: Path) -> tuple[engine.Oracle, Path]:
    pin = pin_for(rec, path)
    oracle = engine.open_oracle(pin, rec.oracle.target, home)
    model, _ = engine.resolve_model(ModelSpec.model_validate(rec.spec.get("model", {})),
                                    path.parent, home)
    engine.memory_preflight(oracle.target)
    return oracle, model


def _log(home: Path, what: str, name: str) -> Path:
    return home / "logs" / f"{what}-{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.log"


def golden_file(path: Path) -> Path:
    return path / "golden.json" if path.is_dir() else path


def margin(path: Path, prompt: str, position: int, *, home: Path,
           candidate: Path | None = None, k: int = 20) -> dict[str, Any]:
    """Teacher-forced top-k at ``position``: prompt ids + the golden's (or the candidate's)
    tokens before it, one new token, logprobs k, prefix caching off."""
    path = golden_file(path)
    golden = load_golden(path)
    ids = [p.id for p in golden.prompts]
    index = ids.index(prompt) if prompt in ids else (int(prompt) if prompt.isdigit() else -1)
    if not 0 <= index < len(ids):
        raise BadInput(path, [("prompts", f"no prompt {prompt!r}; it has {ids}")])
    g = golden.prompts[index]
    prefix_source = "golden"
    tokens = g.token_ids
    cand_token = None
    if candidate is not None:
        cand = load_candidate(candidate)
        matches = [cp for i, cp in pair(golden, cand, candidate) if i == index]
        if not matches:
            raise BadInput(candidate, [("prompts", f"no prompt matching {g.id!r}")])
        tokens = matches[0].token_ids
        prefix_source = "candidate"
        if position < len(tokens):
            cand_token = tokens[position]
    if not 0 <= position <= len(tokens):
        raise BadInput(path, [("position", f"{position} is outside 0..{len(tokens)}")])
    rec = recorded(golden, path)
    oracle, model = _oracle_and_model(rec, path, home)
    args = {**rec.engine.requested, "enable_prefix_caching": False}
    run = {"name": "margin", "prompts": [{"token_ids": list(g.prompt_token_ids)
                                          + list(tokens[:position])}],
           "calls": [[0]], "legs": 1,
           "sampling": {"temperature": 0.0, "max_tokens": 1, "ignore_eos": True,
                        "logprobs": k}}
    result = engine.run_driver(oracle, model, args, [run], log=_log(home, "margin", g.id))
    out = result["runs"][0]["legs"][0][0]
    topk = out["topk"][0]
    report: dict[str, Any] = {
        "golden": str(path), "prompt": g.id, "position": position,
        "prefix": prefix_source, "prefix_length": len(g.prompt_token_ids) + position,
        "topk": topk, "argmax": topk[0][0], "top2_margin_nats": compare.top2_margin(topk),
        "golden_token": g.token_ids[position] if position < len(g.token_ids) else None,
    }
    if candidate is not None:
        report["candidate_token"] = cand_token
        gap = compare.margin(topk, topk[0][0], cand_token) if cand_token is not None else None
        report["candidate_gap_nats"] = gap
        report["candidate_gap_mnats"] = (OUTSIDE_TOPK_MNATS if gap is None
                                         else round(gap * 1000))
    return report


def determinism(path: Path, *, home: Path, legs: int = 5) -> dict[str, Any]:
    """K legs of a golden's recorded configuration (or a spec's) in one process: per leg,
    matches against the golden and against leg 0; deterministic when every leg agrees."""
    golden: Golden | None = None
    if (path.is_dir() and not (path / "golden.json").exists()) or path.suffix == ".toml":
        job = make_job(path)
        oracle = engine.open_oracle(job.pin, job.target_name, home)
        model, _ = engine.resolve_model(job.spec.model, job.spec_path.parent, home)
        args = engine.engine_args(job.spec.engine, oracle.target)
        engine.memory_preflight(oracle.target)
        run = {**job.run_request(), "legs": legs}
        name, n_prompts = job.spec.name, len(job.spec.prompts)
    else:
        path = golden_file(path)
        golden = load_golden(path)
        rec = recorded(golden, path)
        oracle, model = _oracle_and_model(rec, path, home)
        run = run_request(rec, legs=legs)
        args = dict(rec.engine.requested)
        name, n_prompts = golden.name, len(golden.prompts)
    result = engine.run_driver(oracle, model, args, [run], log=_log(home, "determinism", name))
    all_legs = result["runs"][0]["legs"]
    first = [p["token_ids"] for p in all_legs[0]]
    per_leg = []
    for n, leg in enumerate(all_legs):
        toks = [p["token_ids"] for p in leg]
        entry: dict[str, Any] = {
            "leg": n, "matches_leg0": sum(a == b for a, b in zip(toks, first, strict=True))}
        if golden is not None:
            entry["matches_golden"] = sum(t == g.token_ids for t, g in
                                          zip(toks, golden.prompts, strict=True))
            entry["first_divergence_vs_golden"] = [
                compare.first_divergence(g.token_ids, t)
                for t, g in zip(toks, golden.prompts, strict=True)]
        per_leg.append(entry)
    deterministic = all(p["matches_leg0"] == n_prompts for p in per_leg)
    return {"source": str(path), "legs": legs, "prompts": n_prompts,
            "deterministic": deterministic, "per_leg": per_leg,
            "engine_start_seconds": result.get("engine_start_seconds"),
            "leg_seconds": result["runs"][0]["leg_seconds"]}
