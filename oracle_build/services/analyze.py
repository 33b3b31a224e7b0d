"""Engine-backed analyses of one golden: the teacher-forced margin at a position, and the
determinism probe (K legs of the recorded configuration in one process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracle_build import goldens, judge
from oracle_build.checkpoints.resolve import recorded_model
from oracle_build.contracts.candidate import load_candidate, pair
from oracle_build.contracts.golden import Golden, golden_file, load_golden, recorded
from oracle_build.contracts.reports import DeterminismLeg, DeterminismReport, MarginReport
from oracle_build.core import layout
from oracle_build.core.errors import BadInput
from oracle_build.engine.runs import run_from_golden, run_from_spec
from oracle_build.engine.session import EngineSession
from oracle_build.oracle.opening import Oracles
from oracle_build.services.capture import make_job, prepare


def _session(golden: Golden, path: Path, home: Path, *,
             changes: dict[str, Any] | None = None) -> EngineSession:
    """An engine session under a golden's recorded configuration (with ``changes``)."""
    rec = recorded(golden, path)
    pin = goldens.golden_pin(rec, path, unpack_to=layout.pins_dir(home))
    # held to the golden's own CPU kernel variant, as verify runs it
    variant = goldens.run_variant(rec, path, pin.target(rec.oracle.target), None)
    oracle = Oracles(home).get(pin, rec.oracle.target, variant=variant,
                               spec_env=rec.spec_env)
    model = recorded_model(rec, path, home, oracle)
    return EngineSession(oracle, model, {**rec.engine.requested, **(changes or {})},
                         home)


def margin(path: Path, prompt: str, position: int, *, home: Path,
           candidate: Path | None = None, k: int = 20) -> MarginReport:
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
    session = _session(golden, path, home, changes={"enable_prefix_caching": False})
    run = {"name": "margin", "prompts": [{"token_ids": list(g.prompt_token_ids)
                                          + list(tokens[:position])}],
           "calls": [[0]], "legs": 1,
           "sampling": {"temperature": 0.0, "max_tokens": 1, "ignore_eos": True,
                        "logprobs": k}}
    result = session.run([run], what="margin", name=g.id).require()
    topk = result.runs[0]["legs"][0][0]["topk"][0]
    fields: dict[str, Any] = {
        "golden": str(path), "prompt": g.id, "position": position,
        "prefix": prefix_source, "prefix_length": len(g.prompt_token_ids) + position,
        "topk": topk, "argmax": topk[0][0], "top2_margin_nats": judge.top2_margin(topk),
        "golden_token": g.token_ids[position] if position < len(g.token_ids) else None,
    }
    if candidate is not None:
        gap = judge.margin(topk, topk[0][0], cand_token) if cand_token is not None else None
        fields.update(candidate_token=cand_token, candidate_gap_nats=gap,
                      candidate_gap_mnats=judge.to_mnats(gap))
    return MarginReport.model_validate(fields)


def determinism(path: Path, *, home: Path, legs: int = 5) -> DeterminismReport:
    """K legs of a golden's recorded configuration (or a spec's) in one process: per leg,
    matches against the golden and against leg 0; deterministic when every leg agrees."""
    golden: Golden | None = None
    if (path.is_dir() and not (path / "golden.json").exists()) or path.suffix == ".toml":
        job = make_job(path)
        prepare(job, Oracles(home), home)
        session = job.session(home)
        run = run_from_spec(job.spec, legs=legs)
        name, ids = job.spec.name, [p.id for p in job.spec.prompts]
    else:
        path = golden_file(path)
        golden = load_golden(path)
        session = _session(golden, path, home)
        run = run_from_golden(recorded(golden, path), legs=legs)
        name, ids = golden.name, [p.id for p in golden.prompts]
    result = session.run([run], what="determinism", name=name).require()
    all_legs = result.runs[0]["legs"]
    tokens = [[p["token_ids"] for p in leg] for leg in all_legs]
    agreement = judge.legs_agreement(tokens, ids)
    per_leg = []
    for n, toks in enumerate(tokens):
        against: dict[str, Any] = {}
        if golden is not None:
            pairs = list(zip(toks, golden.prompts, strict=True))
            against = {"matches_golden": sum(t == g.token_ids for t, g in pairs),
                       "first_divergence_vs_golden": [judge.first_divergence(g.token_ids, t)
                                                      for t, g in pairs]}
        per_leg.append(DeterminismLeg(leg=n, matches_leg0=agreement.matches_leg0[n],
                                      **against))
    return DeterminismReport(source=str(path), legs=legs, prompts=len(ids),
                             deterministic=agreement.agree, per_leg=per_leg,
                             disagreements=agreement.disagreements,
                             engine_start_seconds=result.start_seconds,
                             leg_seconds=result.runs[0]["leg_seconds"])
