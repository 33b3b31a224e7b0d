"""explain: which setting moves a divergent token?

Runs the oracle under candidate configurations: the golden's recorded one (or, for a
golden whose configuration was never recorded, the engine's defaults), then each setting
varied one at a time, then combinations of the settings that moved tokens. Per prompt
it reports which configurations reproduce the golden token-exactly and, for the others,
the first divergence and the margin there. Configurations that differ only in batch
composition share one engine start; ``budget`` caps engine starts. A candidate whose own
legs disagree is non-deterministic: neither a match nor a mismatch. The result is its own
schema-versioned artifact; the golden is never written.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from oracle_build import devices, goldens, host, judge
from oracle_build.checkpoints.resolve import recorded_model
from oracle_build.contracts.golden import Golden, golden_file, load_golden, recorded
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.reports import (
    EXPLAIN_SCHEMA,
    CandidateResult,
    ExplainReport,
    PromptOutcome,
    SettingVerdict,
)
from oracle_build.core import layout
from oracle_build.core.errors import BadInput
from oracle_build.core.files import atomic_write_json, sha256_file
from oracle_build.core.log import fmt_seconds, say
from oracle_build.engine.runs import by_engine, engine_args, run_from_golden
from oracle_build.engine.session import EngineResult, EngineSession
from oracle_build.oracle.opening import Oracle, Oracles

BATCH = "batch"  # the pseudo-setting for batch composition
# Settings known to move greedy numerics (BRIEF section 5), with the values tried.
DEFAULT_VARY: dict[str, list[Any]] = {
    "dtype": ["float32", "bfloat16"],
    "kv_cache_dtype": ["auto", "fp8"],
    "enforce_eager": [True, False],
    BATCH: ["per_prompt", "all"],
    "max_num_seqs": [1, 256],
    "max_num_batched_tokens": [64, 2048],
    "enable_chunked_prefill": [True, False],
    "enable_prefix_caching": [True, False],
    "max_model_len": [512, 2048],
    "block_size": [16, 128],
}


def parse_vary(items: list[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise BadInput("--vary", [(item, "expected SETTING=V1,V2")])
        key, _, raw = item.partition("=")
        values: list[Any] = []
        for text in raw.split(","):
            text = text.strip()
            low = text.lower()
            if low in ("true", "false"):
                values.append(low == "true")
            elif low in ("none", "null"):
                values.append(None)
            else:
                try:
                    values.append(int(text))
                except ValueError:
                    try:
                        values.append(float(text))
                    except ValueError:
                        values.append(text)
        if not key or not values:
            raise BadInput("--vary", [(item, "expected SETTING=V1,V2")])
        out[key.strip()] = values
    return out


def _name(changes: dict[str, Any]) -> str:
    return "base" if not changes else ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))


def explain(path: Path, *, home: Path, vary: dict[str, list[Any]] | None = None,
            budget: int = 12, pin_path: Path | None = None, model_path: Path | None = None,
            legs: int = 2, out: Path | None = None) -> tuple[ExplainReport, Path]:
    path = golden_file(path)
    golden = load_golden(path)
    base_batch = "recorded"
    model: Path | None
    if golden.configuration_recorded and golden.source is None:
        rec = recorded(golden, path)
        pin = goldens.golden_pin(rec, path, unpack_to=layout.pins_dir(home))
        target_name = rec.oracle.target
        # held to the golden's own CPU kernel variant, as verify runs it
        variant = goldens.run_variant(rec, path, pin.target(target_name), None)
        model = None  # resolved once the oracle is open (a battery model needs it)
        base_args = dict(rec.engine.requested)
        request = run_from_golden(rec, legs=legs)
        spec_env = rec.spec_env
    else:
        if pin_path is None or model_path is None:
            raise BadInput(path, [("engine", "unrecorded: explain starts from the engine's "
                                   "defaults and needs --pin and --model to run it")])
        pin = load_pin(pin_path)
        target_name = devices.choose_target(pin, host.host())
        model = model_path.resolve()
        base_args = dict(pin.target(target_name).engine_defaults)
        request = _unrecorded_request(golden, legs)
        base_batch = "per_prompt"
        variant = None
        spec_env = {}
    oracle = Oracles(home).get(pin, target_name, variant=variant, spec_env=spec_env)
    if model is None:
        model = recorded_model(recorded(golden, path), path, home, oracle)
    base_args = engine_args(base_args, oracle.target)
    vary = vary if vary is not None else DEFAULT_VARY
    state = _State(golden, oracle, model, base_args, request, base_batch, budget, home)
    state.try_candidates([{}] + [{k: v} for k, vals in vary.items() for v in vals
                                 if not state.is_base(k, v)])
    base = state.results.get("base")
    mattered: dict[str, list[Any]] = {}
    verdicts = []
    for key, vals in vary.items():
        moved: dict[str, list[str]] = {}
        tried = []
        for v in vals:
            if state.is_base(key, v):
                continue
            res = state.results.get(_name({key: v}))
            if res is None or res.status != "ok" or base is None or base.status != "ok":
                continue
            tried.append(v)
            diff = [p.id for p, b in zip(res.prompts, base.prompts, strict=True)
                    if p.tokens != b.tokens]
            moved[str(v)] = diff
            if diff:
                mattered.setdefault(key, []).append(v)
        verdicts.append(SettingVerdict(setting=key, values_tried=tried, moved=moved,
                                       matters=any(moved.values())))
    combos: list[dict[str, Any]] = []
    keys = list(mattered)
    for size in range(2, len(keys) + 1):
        for subset in itertools.combinations(keys, size):
            for values in itertools.product(*(mattered[k] for k in subset)):
                combos.append(dict(zip(subset, values, strict=True)))
    state.try_candidates(combos)
    report = state.report(path, verdicts)
    dest = out or layout.explain_record(home, golden.name)
    atomic_write_json(dest, report.model_dump(mode="json"), overwrite=False)
    return report, dest


def _unrecorded_request(golden: Golden, legs: int) -> dict[str, Any]:
    max_tokens = max(len(p.token_ids) for p in golden.prompts)
    return {"name": golden.name,
            "prompts": [{"token_ids": list(p.prompt_token_ids)} for p in golden.prompts],
            "calls": [[i] for i in range(len(golden.prompts))], "legs": legs,
            "sampling": {"temperature": 0.0, "max_tokens": max_tokens,
                         "ignore_eos": True, "logprobs": 20}}


class _State:
    def __init__(self, golden: Golden, oracle: Oracle, model: Path,
                 base_args: dict[str, Any], request: dict[str, Any], base_batch: str,
                 budget: int, home: Path) -> None:
        self.golden, self.oracle, self.model = golden, oracle, model
        self.base_args, self.request, self.base_batch = base_args, request, base_batch
        self.budget, self.home = budget, home
        self.results: dict[str, CandidateResult] = {}
        self.engine_starts = 0
        self.start = time.monotonic()

    def is_base(self, key: str, value: Any) -> bool:
        if key == BATCH:
            return False if self.base_batch == "recorded" else value == self.base_batch
        return bool(self.base_args.get(key, _MISSING) == value)

    def _args(self, changes: dict[str, Any]) -> dict[str, Any]:
        return {**self.base_args, **{k: v for k, v in changes.items() if k != BATCH}}

    def _calls(self, changes: dict[str, Any]) -> tuple[str, list[list[int]]]:
        n = len(self.request["prompts"])
        batch = changes.get(BATCH, self.base_batch)
        if batch == "per_prompt":
            return batch, [[i] for i in range(n)]
        if batch == "all":
            return batch, [list(range(n))]
        return batch, self.request["calls"]

    def try_candidates(self, changes_list: list[dict[str, Any]]) -> None:
        pending = [c for c in changes_list if _name(c) not in self.results]
        groups = by_engine(pending, lambda c: (self.oracle, self.model, self._args(c)))
        total = len(groups)
        for n, group in enumerate(groups, start=1):
            if self.engine_starts >= self.budget:
                for changes in group:
                    batch, _ = self._calls(changes)
                    self.results[_name(changes)] = CandidateResult(
                        name=_name(changes), changes=changes, engine_args=self._args(changes),
                        batch=batch, status="not_tried",
                        error=f"budget of {self.budget} engine starts reached")
                continue
            self.engine_starts += 1
            say(f"==> explain: engine start {self.engine_starts} (group {n}/{total}, budget "
                f"{self.budget}), elapsed {fmt_seconds(time.monotonic() - self.start)}: "
                + "; ".join(_name(c) for c in group))
            self._run_group(group)

    def _run_group(self, group: list[dict[str, Any]]) -> None:
        args = self._args(group[0])
        runs = []
        for changes in group:
            _batch, calls = self._calls(changes)
            runs.append({**self.request, "name": _name(changes), "calls": calls})
        session = EngineSession(self.oracle, self.model, args, self.home)
        result = session.run(runs, what="explain", name=self.golden.name)
        if not result.ok:  # a candidate the engine refuses is an answer, not a crash
            for changes in group:
                batch, _ = self._calls(changes)
                self.results[_name(changes)] = CandidateResult(
                    name=_name(changes), changes=changes, engine_args=args, batch=batch,
                    status="engine_failed", error=f"{result.error[:400]} (log: {result.log})")
            return
        eng = result.engine_record().model_dump(mode="json", by_alias=True)
        for changes, run in zip(group, result.runs, strict=True):
            batch, calls = self._calls(changes)
            self.results[_name(changes)] = self._judge(changes, args, batch, calls, run, eng,
                                                       result)

    def _judge(self, changes: dict[str, Any], args: dict[str, Any], batch: str,
               calls: list[list[int]], run: dict[str, Any], eng: dict[str, Any],
               result: EngineResult) -> CandidateResult:
        legs = run["legs"]
        ids = [p.id for p in self.golden.prompts]
        agree = judge.legs_agreement([[p["token_ids"] for p in leg] for leg in legs], ids).agree
        outcomes = []
        base = self.results.get("base")
        band = self.golden.gate.band_nats
        for i, (p, out) in enumerate(zip(self.golden.prompts, legs[0], strict=True)):
            r = judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids,
                                       self.golden.prompt_topk(i),
                                       out["prompt_token_ids"], out["token_ids"], out["topk"],
                                       band)
            changed = None
            if base is not None and base.status == "ok" and changes:
                changed = out["token_ids"] != base.prompts[i].tokens
            outcomes.append(PromptOutcome(
                id=p.id, reproduces=r.kind == "match" and r.prompt_ids_equal, index=r.index,
                golden_token=r.golden_token, new_token=r.new_token,
                golden_margin=r.golden_margin, new_margin=r.new_margin, kind=r.kind,
                tokens=out["token_ids"], changed_vs_base=changed))
        return CandidateResult(
            name=_name(changes), changes=changes, engine_args=args, batch=batch,
            status="ok" if agree else "non_deterministic", engine=eng,
            environment=result.environment, sampling=run["sampling"],
            calls=[[ids[i] for i in c] for c in calls], legs_agree=agree,
            prompts=outcomes, reproduces_all=agree and all(o.reproduces for o in outcomes))

    def report(self, path: Path, verdicts: list[SettingVerdict]) -> ExplainReport:
        cands = list(self.results.values())
        winners = sorted((c for c in cands if c.reproduces_all),
                         key=lambda c: (len(c.changes), c.name))
        smallest = winners[0].changes if winners else None
        tried = [c.name for c in cands if c.status in ("ok", "non_deterministic")]
        lines = []
        for v in verdicts:
            if not v.values_tried:
                lines.append(f"{v.setting}: not tried (budget, or the engine refused it)")
            elif v.matters:
                moved = "; ".join(f"={val} moves {', '.join(p)}" for val, p in v.moved.items()
                                  if p)
                lines.append(f"{v.setting} MATTERS: {moved}")
            else:
                lines.append(f"{v.setting} does not matter here (values tried: "
                             f"{', '.join(map(str, v.values_tried))})")
        for c in cands:
            if c.status == "non_deterministic":
                lines.append(f"{c.name}: NON-DETERMINISTIC (its own legs disagree): neither a "
                             "match nor a mismatch")
        if smallest is not None:
            lines.append(f"REPRODUCED: every prompt token-exact with {_name(smallest)}"
                         + ("" if smallest else " (the recorded configuration)"))
        else:
            per = {p.id: [c.name for c in cands if c.status == "ok" and any(
                o.id == p.id and o.reproduces for o in c.prompts)] for p in self.golden.prompts}
            partial = "; ".join(f"{pid}: {', '.join(names) or 'none'}"
                                for pid, names in per.items())
            lines.append("NOT REPRODUCIBLE by any configuration tried ("
                         f"{len(tried)} tried: {'; '.join(tried)}). Per prompt, the "
                         f"configurations that reproduce it: {partial}")
        return ExplainReport(
            explain_schema=EXPLAIN_SCHEMA, created_utc=layout.utc_now(), golden=str(path),
            golden_sha256=sha256_file(path),
            configuration_recorded=self.golden.configuration_recorded,
            base={"engine_args": self.base_args, "batch": self.base_batch},
            budget=self.budget, engine_starts=self.engine_starts, candidates=cands,
            settings=verdicts, smallest_reproducing=smallest, answer="\n".join(lines),
            tool=host.tool_facts())


_MISSING = object()
