"""verify: for each golden, in this order: identity, configuration, tokens, gate.

A configuration difference is reported as such, before any token result, with its own
exit code; tokens are still compared and shown, marked not adjudicable. verify only
reads goldens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from oracle_build import compare, engine
from oracle_build.capture import engine_record
from oracle_build.errors import (
    EXIT_CONFIG_DIFF,
    EXIT_DRIFT,
    EXIT_IDENTITY,
    EXIT_NOT_HERE,
    EXIT_OK,
    BadInput,
    IdentityMismatch,
)
from oracle_build.golden import (
    RESOLVED_KEYS,
    Golden,
    ModelSpec,
    OracleRecord,
    Recorded,
    SamplingSpec,
    load_golden,
    recorded,
)
from oracle_build.log import say
from oracle_build.meta import utc_now
from oracle_build.pins import Pin, load_pin
from oracle_build.targets import detect_host, fits

REQUIRED_RESOLVED = RESOLVED_KEYS
IDENTITY_FIELDS = ("vllm", "torch", "transformers", "flashinfer", "device")
REPORT_SCHEMA = 1

Status = Literal["pass", "drift", "config_difference", "config_unrecorded",
                 "oracle_mismatch", "not_verifiable_here"]
UNRECORDED_BANNER = "CONFIGURATION UNRECORDED: NOT ADJUDICABLE"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldDiff(_M):
    field: str
    golden: Any
    current: Any
    cls: Literal["numerics", "context", "identity"]


class GateVerdict(_M):
    kind: str
    admissible: bool
    reason: str
    passed: bool | None


class GoldenVerdict(_M):
    name: str
    path: str
    status: Status
    why: str = ""
    notes: list[str] = []
    identity: list[FieldDiff] = []
    configuration: list[FieldDiff] = []
    context: list[FieldDiff] = []
    adjudicable: bool = True
    tokens: list[dict[str, Any]] = []
    summary: str = ""
    gate: GateVerdict | None = None


class VerifyReport(_M):
    report_schema: int
    created_utc: str
    exit_code: int
    goldens: list[GoldenVerdict]


def records_complete(rec: Recorded, path: Path) -> None:
    """A golden must carry what it takes to re-derive it; refuse one that does not."""
    golden = rec.golden
    problems = []
    for key in REQUIRED_RESOLVED:
        if key not in rec.engine.resolved:
            problems.append((f"engine.resolved.{key}", "not recorded (neither a value nor "
                             "unreadable-with-reason)"))
    ids = sorted(p.id for p in golden.prompts)
    called = sorted(pid for call in rec.batch.get("calls", []) for pid in call)
    if called != ids:
        problems.append(("batch.calls", "does not name every prompt exactly once"))
    if golden.model is None or not golden.model.files:
        problems.append(("model.files", "no model file hashes recorded"))
    for key in ("temperature", "max_tokens"):
        if key not in golden.sampling:
            problems.append((f"sampling.{key}", "not recorded"))
    if problems:
        raise BadInput(path, problems, hint="a golden that cannot be re-derived cannot be "
                       "verified; re-capture it with `capture`")


def check_gate(golden: Golden, path: Path) -> str:
    ok, reason = compare.gate_admissible(golden.gate.kind,
                                         measured_nondeterminism=bool(golden.nondeterministic),
                                         ratification=golden.gate.ratification)
    if not ok:
        raise BadInput(path, [("gate.kind", reason)],
                       hint="configuration sensitivity is not non-determinism: re-capture "
                       "under a recorded configuration, or measure with `determinism`")
    return reason


def pin_for(rec: Recorded, path: Path) -> Pin:
    rel = rec.spec.get("pin")
    if not isinstance(rel, str):
        raise BadInput(path, [("spec.pin", "missing")])
    pin_path = (path.parent / rel).resolve()
    if not pin_path.exists():
        raise BadInput(path, [("spec.pin", f"{pin_path} not found")])
    return load_pin(pin_path)


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _setting_value(item: Any) -> Any:
    if hasattr(item, "unreadable"):
        return {"unreadable": item.unreadable}
    return item.value


def config_diffs(rec: Recorded, new: dict[str, Any]) -> tuple[list[FieldDiff],
                                                              list[FieldDiff]]:
    golden = rec.golden
    old: dict[str, Any] = {}
    cur: dict[str, Any] = {}
    for key, item in rec.engine.resolved.items():
        old[f"resolved.{key}"] = _setting_value(item)
    for key, item in new["engine"].resolved.items():
        cur[f"resolved.{key}"] = _setting_value(item)
    for key, backend in rec.engine.backends.items():
        old[f"backends.{key}"] = _setting_value(backend)
    for key, backend in new["engine"].backends.items():
        cur[f"backends.{key}"] = _setting_value(backend)
    _flat("requested", dict(rec.engine.requested), old)
    _flat("requested", dict(new["engine"].requested), cur)
    _flat("environment", dict(rec.environment), old)
    _flat("environment", dict(new["environment"]), cur)
    _flat("sampling", dict(golden.sampling), old)
    _flat("sampling", dict(new["sampling"]), cur)
    old["batch.calls"] = rec.batch.get("calls")
    cur["batch.calls"] = new["calls"]
    numerics: list[FieldDiff] = []
    context: list[FieldDiff] = []
    tightened: dict[str, str] = dict(golden.classification)
    for key in sorted(set(old) | set(cur)):
        a, b = old.get(key, "<not recorded>"), cur.get(key, "<not recorded>")
        if a == b:
            continue
        cls = compare.classify_setting(key, tightened)
        diff = FieldDiff(field=key, golden=a, current=b,
                         cls="numerics" if cls == "numerics" else "context")
        (numerics if cls == "numerics" else context).append(diff)
    return numerics, context


def identity_diffs(rec: Recorded, oracle: engine.Oracle) -> list[FieldDiff]:
    now = oracle.identity.summary()
    diffs = [FieldDiff(field=f, golden=rec.oracle.identity.get(f), current=now.get(f),
                       cls="identity")
             for f in IDENTITY_FIELDS if rec.oracle.identity.get(f) != now.get(f)]
    if rec.oracle.pin_hash != oracle.pin.content_hash:
        diffs.append(FieldDiff(field="pin_hash", golden=rec.oracle.pin_hash,
                               current=oracle.pin.content_hash, cls="identity"))
    old_d = rec.oracle.identity.get("distributions") or {}
    new_d = now.get("distributions") or {}
    for name in sorted(set(old_d) | set(new_d)):
        if old_d.get(name) != new_d.get(name):
            diffs.append(FieldDiff(field=f"distributions.{name}", golden=old_d.get(name),
                                   current=new_d.get(name), cls="identity"))
    return diffs


@dataclass
class Item:
    path: Path
    rec: Recorded
    pin: Pin
    gate_reason: str
    verdict: GoldenVerdict | None = None
    model_path: Path | None = None
    args: dict[str, Any] = field(default_factory=dict)


def run_request(rec: Recorded, legs: int = 1) -> dict[str, Any]:
    golden = rec.golden
    spec_prompts = {p["id"]: p for p in rec.spec.get("prompts", [])}
    prompts = []
    for p in golden.prompts:
        sp = spec_prompts.get(p.id, {})
        prompts.append({"text": sp["text"]} if sp.get("text") is not None
                       else {"token_ids": list(p.prompt_token_ids)})
    index = {p.id: i for i, p in enumerate(golden.prompts)}
    calls = [[index[pid] for pid in call] for call in rec.batch["calls"]]
    sampling = SamplingSpec.model_validate(rec.spec.get("sampling", {}))
    return {"name": golden.name, "prompts": prompts, "calls": calls, "legs": legs,
            "sampling": sampling.vllm_kwargs(rec.logprobs)}


def token_results(golden: Golden, leg: list[dict[str, Any]], band: float) -> list[
        compare.TokenResult]:
    return [compare.compare_prompt(p.id, p.prompt_token_ids, p.token_ids, p.topk,
                                   out["prompt_token_ids"], out["token_ids"], out["topk"],
                                   band)
            for p, out in zip(golden.prompts, leg, strict=True)]


def judge(item: Item, result: dict[str, Any], run: dict[str, Any]) -> GoldenVerdict:
    g = item.rec.golden
    new = {"engine": engine_record(item.args, result), "environment": result.get("env", {}),
           "sampling": run["sampling"],
           "calls": [[g.prompts[i].id for i in call]
                     for call in run_request(item.rec)["calls"]]}
    numerics, context = config_diffs(item.rec, new)
    band = g.gate.band_nats
    results = token_results(g, run["legs"][0], band)
    summary = compare.summarize(results)
    passed = compare.gate_passes(g.gate.kind, results)
    gate = GateVerdict(kind=g.gate.kind, admissible=True, reason=item.gate_reason,
                       passed=passed if not numerics else None)
    status: Status = "pass"
    why = ""
    if numerics:
        status, why = "config_difference", ("the re-run's configuration differs from the "
                                            "golden's: tokens are not adjudicable")
    elif not passed:
        status, why = "drift", "tokens differ from the golden"
    return GoldenVerdict(name=g.name, path=str(item.path), status=status, why=why,
                         configuration=numerics, context=context,
                         adjudicable=not numerics,
                         tokens=[r.as_dict() for r in results],
                         summary=summary.line(g.gate.kind), gate=gate)


def discover(paths: list[Path]) -> list[Path]:
    if paths:
        return [p / "golden.json" if p.is_dir() else p for p in paths]
    found = sorted(Path("goldens").glob("*/golden.json"))
    if not found:
        raise BadInput(Path("goldens"), "no goldens found (goldens/<name>/golden.json)")
    return found


def verify(paths: list[Path], *, home: Path) -> VerifyReport:
    items: list[Item] = []
    verdicts: list[GoldenVerdict] = []
    host = detect_host()
    for path in discover(paths):
        golden = load_golden(path)
        if not golden.configuration_recorded or golden.source is not None:
            verdicts.append(offline_verdict(golden, path))
            continue
        rec = recorded(golden, path)
        records_complete(rec, path)
        reason = check_gate(golden, path)
        pin = pin_for(rec, path)
        target = pin.target(rec.oracle.target)
        ok, why = fits(target, host)
        if not ok:
            verdicts.append(GoldenVerdict(
                name=golden.name, path=str(path), status="not_verifiable_here",
                why=f"target {rec.oracle.target}: {why}; its records are complete",
                adjudicable=False))
            continue
        items.append(Item(path, rec, pin, reason))
    oracles: dict[tuple[str, str], engine.Oracle | IdentityMismatch] = {}
    groups: dict[str, list[Item]] = {}
    for item in items:
        key = (item.pin.key, item.rec.oracle.target)
        if key not in oracles:
            try:
                oracles[key] = engine.open_oracle(item.pin, item.rec.oracle.target, home)
            except IdentityMismatch as exc:
                oracles[key] = exc
        oracle = oracles[key]
        if isinstance(oracle, IdentityMismatch):
            item.verdict = GoldenVerdict(
                name=item.rec.golden.name, path=str(item.path), status="oracle_mismatch",
                why="the oracle is not its pin's; nothing was run",
                identity=[FieldDiff(field=f, golden=e, current=g, cls="identity")
                          for f, e, g in oracle.mismatches], adjudicable=False)
            continue
        ident = identity_diffs(item.rec, oracle)
        if ident:  # identity first: tokens from another oracle would only mislead
            item.verdict = GoldenVerdict(
                name=item.rec.golden.name, path=str(item.path), status="oracle_mismatch",
                why="the current oracle is not the golden's; nothing was run",
                identity=ident, adjudicable=False)
            continue
        spec_model = item.rec.spec.get("model", {})
        item.model_path, _record = engine.resolve_model(
            ModelSpec.model_validate(spec_model), item.path.parent, home)
        item.args = dict(item.rec.engine.requested)
        gkey = json.dumps([item.pin.key, item.rec.oracle.target, str(item.model_path),
                           item.args], sort_keys=True, default=str)
        groups.setdefault(gkey, []).append(item)
    for n, group in enumerate(groups.values(), start=1):
        lead = group[0]
        oracle = oracles[(lead.pin.key, lead.rec.oracle.target)]
        assert isinstance(oracle, engine.Oracle) and lead.model_path is not None
        engine.memory_preflight(oracle.target)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        log = home / "logs" / f"verify-{lead.rec.golden.name}-{stamp}.log"
        say(f"==> engine {n}/{len(groups)}: {', '.join(i.rec.golden.name for i in group)} "
            f"(log: {log})")
        result = engine.run_driver(oracle, lead.model_path, lead.args,
                                   [run_request(i.rec) for i in group], log=log)
        for item, run in zip(group, result["runs"], strict=True):
            item.verdict = judge(item, result, run)
    verdicts = [i.verdict for i in items if i.verdict is not None] + verdicts
    return VerifyReport(report_schema=REPORT_SCHEMA, created_utc=utc_now(),
                        exit_code=exit_code(verdicts), goldens=verdicts)


OUTSIDE_TOPK_MNATS = 99_999_000


def offline_verdict(golden: Golden, path: Path) -> GoldenVerdict:
    """An imported golden whose configuration was never recorded: nothing can be re-run
    under it. Say so first, then give whatever token evidence the source carries."""
    notes = []
    if not isinstance(golden.oracle, OracleRecord):
        stated = ", ".join(f"{k} {v}" for k, v in golden.oracle.stated.items())
        notes.append(f"oracle as the source states it: {stated or 'nothing'} (no pin, no "
                     "identity: not checkable)")
    for name, why in golden.unrecorded.items():
        notes.append(f"unrecorded {name}: {why}")
    if golden.nondeterministic_cells:
        cells = "; ".join(f"prompt {c['prompt']} position {c['position']}: {c['values']}"
                          for c in golden.nondeterministic_cells[:20])
        notes.append(f"MEASURED NON-DETERMINISM at {len(golden.nondeterministic_cells)} "
                     f"cells: {cells}")
    elif golden.legs is not None:
        notes.append(f"the oracle's {golden.legs.count} runs agree at every cell: a strict "
                     "token-exact gate is licensed")
    results: list[compare.TokenResult] = []
    cand = golden.source.candidate if golden.source else None
    if cand and cand.get("token_ids") is not None:
        gaps = cand.get("neartie_gap_mnats")
        for n, p in enumerate(golden.prompts):
            new = cand["token_ids"][n]
            r = compare.compare_prompt(p.id, p.prompt_token_ids, p.token_ids, p.topk,
                                       p.prompt_token_ids, new, None, golden.gate.band_nats)
            if r.index is not None and gaps is not None and r.index < len(gaps[n]):
                gap = gaps[n][r.index]
                margin = None if gap >= OUTSIDE_TOPK_MNATS else gap / 1000.0
                r = compare.TokenResult(**{**r.as_dict(), "golden_margin": margin,
                                           "kind": compare.classify(margin,
                                                                    golden.gate.band_nats)})
            results.append(r)
        notes.append("tokens: the source's candidate (our_ids.npy) against the oracle's run 0"
                     + ("; margins from neartie_gap_mnats.npy" if gaps is not None else ""))
    elif golden.legs is not None and golden.legs.count > 1:
        for n, p in enumerate(golden.prompts):
            last = golden.legs.tokens[-1][n]
            results.append(compare.compare_prompt(p.id, p.prompt_token_ids, p.token_ids,
                                                  p.topk, p.prompt_token_ids, last, None,
                                                  golden.gate.band_nats))
        notes.append(f"tokens: the oracle's last run (of {golden.legs.count}) against run 0")
    else:
        notes.append("tokens: no second run or candidate in the source to compare offline")
    summary = compare.summarize(results).line(golden.gate.kind) if results else ""
    return GoldenVerdict(name=golden.name, path=str(path), status="config_unrecorded",
                         why=UNRECORDED_BANNER, notes=notes, adjudicable=False,
                         tokens=[r.as_dict() for r in results], summary=summary)


def exit_code(verdicts: list[GoldenVerdict]) -> int:
    statuses = {v.status for v in verdicts}
    for status, code in (("oracle_mismatch", EXIT_IDENTITY),
                         ("config_difference", EXIT_CONFIG_DIFF),
                         ("config_unrecorded", EXIT_CONFIG_DIFF), ("drift", EXIT_DRIFT),
                         ("not_verifiable_here", EXIT_NOT_HERE)):
        if status in statuses:
            return code
    return EXIT_OK


def _fmt(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _m(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f}"


def render(report: VerifyReport) -> str:
    lines = []
    for v in report.goldens:
        lines.append(f"== {v.name}  ({v.path})")
        if v.status == "config_unrecorded":
            lines.append(f"  {UNRECORDED_BANNER}")
            lines += [f"    {n}" for n in v.notes]
        if v.status == "not_verifiable_here":
            lines.append(f"  NOT VERIFIABLE HERE: {v.why}")
            continue
        if v.status != "config_unrecorded":
            lines.append("  identity: " + ("OK" if not v.identity else "ORACLE MISMATCH"))
        for d in v.identity:
            lines.append(f"    {d.field}: golden {_fmt(d.golden)}, current {_fmt(d.current)}")
        if (v.tokens or v.configuration) and v.status != "config_unrecorded":
            lines.append("  configuration: " + ("same" if not v.configuration else
                                                 "CONFIGURATION DIFFERENCE"))
        for d in v.configuration:
            lines.append(f"    {d.field}: golden {_fmt(d.golden)}, now {_fmt(d.current)}")
        for d in v.context:
            lines.append(f"    (context, not failing) {d.field}: golden {_fmt(d.golden)}, "
                         f"now {_fmt(d.current)}")
        if v.tokens:
            note = "" if v.adjudicable else f"  [{UNRECORDED_BANNER}]" if (
                v.status == "config_unrecorded") else "  [NOT ADJUDICABLE: configuration differs]"
            lines.append("  tokens:" + note)
            lines.append(f"    {'prompt':<20} {'ids':<4} {'match':<9} {'first div':>9} "
                         f"{'golden tok':>10} {'new tok':>8} {'golden margin':>14} "
                         f"{'new margin':>14}  class")
            for t in v.tokens:
                match = f"{t['n_golden'] if t['tokens_equal'] else t['index']}/{t['n_golden']}"
                lines.append(
                    f"    {t['prompt'][:20]:<20} {'=' if t['prompt_ids_equal'] else 'DIFF':<4} "
                    f"{match:<9} {('-' if t['index'] is None else t['index']):>9} "
                    f"{('-' if t['golden_token'] is None else t['golden_token']):>10} "
                    f"{('-' if t['new_token'] is None else t['new_token']):>8} "
                    f"{(_m(t['golden_margin']) if t['index'] is not None else '-'):>14} "
                    f"{(_m(t['new_margin']) if t['index'] is not None else '-'):>14}  "
                    f"{t['kind']}")
            lines.append(f"  {v.summary}")
        if v.gate:
            lines.append(f"  gate: {v.gate.kind} ({v.gate.reason}): "
                         + {True: "PASS", False: "FAIL", None: "not judged"}[v.gate.passed])
        lines.append(f"  => {v.status.upper().replace('_', ' ')}"
                     + (f": {v.why}" if v.why and v.status != "config_unrecorded" else ""))
    counts: dict[str, int] = {}
    for v in report.goldens:
        counts[v.status] = counts.get(v.status, 0) + 1
    lines.append("verify: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                 + f" (exit {report.exit_code})")
    return "\n".join(lines)
