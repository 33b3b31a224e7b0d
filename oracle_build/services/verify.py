"""verify: for each golden, in this order: identity, configuration, tokens, gate.

A configuration difference is reported as such, before any token result, with its own
exit code; tokens are still compared and shown, marked not adjudicable. verify only
reads goldens.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from oracle_build import devices, goldens, host, judge
from oracle_build.checkpoints.resolve import recorded_model
from oracle_build.contracts.base import printable
from oracle_build.contracts.golden import (
    RESOLVED_KEYS,
    Golden,
    OracleRecord,
    Recorded,
    golden_file,
    load_golden,
    recorded,
)
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.reports import (
    VERIFY_REPORT_SCHEMA,
    FieldDiff,
    GateVerdict,
    GoldenVerdict,
    Status,
    VerifyReport,
)
from oracle_build.core import layout, proc
from oracle_build.core.errors import (
    EXIT_CONFIG_DIFF,
    EXIT_DRIFT,
    EXIT_IDENTITY,
    EXIT_NOT_HERE,
    EXIT_OK,
    BadInput,
)
from oracle_build.core.layout import utc_now
from oracle_build.core.log import say
from oracle_build.core.verdicts import UNRECORDED_BANNER
from oracle_build.engine.runs import by_engine, engine_args, run_from_golden
from oracle_build.engine.session import EngineResult, EngineSession
from oracle_build.goldens import run_variant
from oracle_build.oracle.opening import Oracle, Oracles, opened
from oracle_build.report import page as pages

IDENTITY_FIELDS = ("vllm", "torch", "transformers", "flashinfer", "device")
def records_complete(rec: Recorded, path: Path) -> None:
    """A golden must carry what it takes to re-derive it; refuse one that does not."""
    golden = rec.golden
    problems = []
    for key in RESOLVED_KEYS:
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


def wheel_diff(rec: Recorded, oracle: Oracle) -> list[FieldDiff]:
    """The vLLM wheel's sha256 (or commit) the golden's pin names against the current
    pin's, when the golden carries its pin."""
    embedded = rec.oracle.embedded_pin
    if embedded is None:
        return []
    try:
        old = tomllib.loads(embedded.pin_toml).get("vllm", {})
    except tomllib.TOMLDecodeError:
        return []
    new = oracle.pin.model.vllm
    out = []
    for key in ("sha256", "commit"):
        b: Any = getattr(new, key, None)
        if isinstance(b, BaseModel):  # an unestablished value, as the pin file writes it
            b = b.model_dump(mode="json")
        a = old.get(key)
        if a != b:
            out.append(FieldDiff(field=f"vllm.{key}", golden=a, current=b, cls="identity"))
    return out


def identity_diffs(rec: Recorded, oracle: Oracle) -> list[FieldDiff]:
    now = oracle.identity.summary()
    diffs = [FieldDiff(field=f, golden=rec.oracle.identity.get(f), current=now.get(f),
                       cls="identity")
             for f in IDENTITY_FIELDS if rec.oracle.identity.get(f) != now.get(f)]
    if rec.oracle.pin_hash != oracle.pin.content_hash:
        diffs.append(FieldDiff(field="pin_hash", golden=rec.oracle.pin_hash,
                               current=oracle.pin.content_hash, cls="identity"))
    if rec.oracle.content_fingerprint is not None and \
            rec.oracle.content_fingerprint != oracle.content_fingerprint:
        # every installed file, hashed: the same pin installed differently is another oracle
        diffs.append(FieldDiff(field="content_fingerprint", golden=rec.oracle.content_fingerprint,
                               current=oracle.content_fingerprint, cls="identity"))
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
    target_name: str = ""
    oracle: Oracle | None = None
    model_path: Path | None = None
    args: dict[str, Any] = field(default_factory=dict)
    # verify --oracle: the oracle is knowingly not the golden's; run anyway, report this
    oracle_differs: list[FieldDiff] = field(default_factory=list)
    # the CPU kernel variant its engine is held to (the golden's own, or --kernel-variant)
    variant: str | None = None

    def configuration(self) -> tuple[Oracle, Path, dict[str, Any]]:
        """The engine configuration this golden re-runs under (once it is to run)."""
        assert self.oracle is not None and self.model_path is not None
        return self.oracle, self.model_path, self.args


def token_results(golden: Golden, leg: list[dict[str, Any]], band: float) -> list[
        judge.TokenResult]:
    return [judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids, golden.prompt_topk(i),
                                 out["prompt_token_ids"], out["token_ids"], out["topk"], band)
            for i, (p, out) in enumerate(zip(golden.prompts, leg, strict=True))]


def verdict(item: Item, result: EngineResult, run: dict[str, Any]) -> GoldenVerdict:
    g = item.rec.golden
    new = {"engine": result.engine_record(), "environment": result.environment,
           "sampling": run["sampling"],
           "calls": [[g.prompts[i].id for i in call]
                     for call in run_from_golden(item.rec)["calls"]]}
    numerics, context = judge.config_diffs(item.rec, new)
    network = g.run.network if g.run is not None else None
    if network is not None and network != proc.oracle_network()[1]:
        # captured open and verified closed (or the other way): context, never failing
        context.append(FieldDiff(field="run.network", golden=network,
                                 current=proc.oracle_network()[1], cls="context"))
    band = g.gate.band_nats
    results = token_results(g, run["legs"][0], band)
    difference = judge.first_topk_difference(
        [p.id for p in g.prompts], g.topk_table(), run["leg_tables"][0], item.rec.logprobs)
    moved = judge.numbers_moved([p.id for p in g.prompts], g.topk_table(),
                                run["leg_tables"][0], item.rec.logprobs)
    summary = judge.summarize(results)
    passed = judge.gate_passes(g.gate.kind, results)
    if g.gate.bit_exact and moved is not None and moved["cells"]:
        passed = False  # the golden's gate holds its numbers too, bit for bit
    gate = GateVerdict(kind=g.gate.kind, admissible=True, reason=item.gate_reason,
                       passed=passed if not numerics else None)
    status: Status = "pass"
    why = ""
    if item.oracle_differs:
        gate = GateVerdict(kind=g.gate.kind, admissible=True, reason=item.gate_reason,
                           passed=None)
        return GoldenVerdict(
            name=g.name, path=str(item.path), status="oracle_mismatch",
            why=f"ORACLE DIFFERS (run on pin {item.oracle.pin.key if item.oracle else '?'} "
            "as asked): tokens and margins shown, not adjudicable for the golden's gate",
            identity=item.oracle_differs, configuration=numerics, context=context,
            adjudicable=False, tokens=[r.as_dict() for r in results],
            summary=summary.line(g.gate.kind), gate=gate,
            logprobs_identical=difference is None, logprobs_difference=difference,
            logprobs_moved=moved)
    if numerics:
        status, why = "config_difference", ("the re-run's configuration differs from the "
                                            "golden's: tokens are not adjudicable")
    elif not passed:
        tokens_ok = judge.gate_passes(g.gate.kind, results)
        status, why = "drift", ("tokens match, but the numbers moved and the golden's gate "
                                "is bit-exact" if tokens_ok else "tokens differ from the golden")
    return GoldenVerdict(name=g.name, path=str(item.path), status=status, why=why,
                         configuration=numerics, context=context,
                         adjudicable=not numerics,
                         tokens=[r.as_dict() for r in results],
                         summary=summary.line(g.gate.kind), gate=gate,
                         logprobs_identical=difference is None,
                         logprobs_difference=difference, logprobs_moved=moved)


def discover(paths: list[Path]) -> list[Path]:
    if paths:
        return [golden_file(p) for p in paths]
    found = sorted(Path("goldens").glob("*/golden.json"))
    if not found:
        raise BadInput(Path("goldens"), "no goldens found (goldens/<name>/golden.json)")
    return found


def verify(paths: list[Path], *, home: Path, oracles: Oracles | None = None,
           pin_override: Pin | None = None, cross_target: bool = False,
           page: pages.PageData | None = None,
           kernel_variant: str | None = None) -> VerifyReport:
    """``page``: filled with what an HTML report shows of each golden that ran (its
    prompts, the token pieces, the oracle). ``pin_override``: run every golden on this
    pin's oracle instead of the golden's own (identity then reports what differs).
    ``cross_target``: run a golden recorded for another target on this host's target
    (reported at identity level, not adjudicable). ``kernel_variant``: hold every CPU
    engine to this variant instead of each golden's own (a difference is then a
    configuration difference).

    In order: each golden admitted (or answered without an engine), each oracle's identity
    (probed inside its engine host), then one engine start per configuration."""
    items: list[Item] = []
    verdicts: list[GoldenVerdict] = []
    for path in discover(paths):
        admitted = admit(path, home=home, pin_override=pin_override,
                         cross_target=cross_target, kernel_variant=kernel_variant)
        if isinstance(admitted, Item):
            items.append(admitted)
        else:
            verdicts.append(admitted)
    # an engine will run: each oracle's identity is probed inside its engine host
    with opened(home, oracles, engine_for=("verify", items[0].rec.golden.name)
                       if items else None) as oracles:
        to_run = [item for item in items if
                  ready(item, oracles, home, asked_other=pin_override is not None or
                        cross_target)]
        run_groups(to_run, home, page)
    verdicts = [i.verdict for i in items if i.verdict is not None] + verdicts
    return VerifyReport(report_schema=VERIFY_REPORT_SCHEMA, created_utc=utc_now(),
                        exit_code=exit_code(verdicts), goldens=verdicts,
                        network=proc.oracle_network()[1] if items else None)


def admit(path: Path, *, home: Path, pin_override: Pin | None, cross_target: bool,
          kernel_variant: str | None) -> Item | GoldenVerdict:
    """A golden to run (its pin, target and CPU kernel variant), or its verdict when no
    engine can say more: configuration unrecorded, another host's target, a CPU variant
    this host cannot run. A golden whose records are incomplete is refused (BadInput)."""
    golden = load_golden(path)
    if not golden.configuration_recorded or golden.source is not None:
        return offline_verdict(golden, path)
    rec = recorded(golden, path)
    records_complete(rec, path)
    reason = judge.admit_gate(golden, path)
    pin = pin_override or goldens.golden_pin(rec, path, unpack_to=layout.pins_dir(home))
    if cross_target:
        # run it on this host's target of the pin (a GB10 golden on Thor, or on the CPU
        # oracle); the target difference is reported at identity level
        item = Item(path, rec, pin, reason,
                    target_name=devices.choose_target(pin, host.host(), None))
        if item.target_name != rec.oracle.target:
            item.oracle_differs.append(FieldDiff(
                field="target", golden=rec.oracle.target, current=item.target_name,
                cls="identity"))
    else:
        if rec.oracle.target not in pin.model.targets:
            raise BadInput(path, [("oracle.target", f"{rec.oracle.target!r} is not a target "
                                   f"of pin {pin.path}")],
                           hint="--cross-target runs it on this host's target of that pin")
        ok, why = devices.fits(pin.target(rec.oracle.target), host.host())
        if not ok:
            return GoldenVerdict(
                name=golden.name, path=str(path), status="not_verifiable_here",
                why=f"target {rec.oracle.target}: {why}; its records are complete (run it "
                "here anyway: --cross-target)", adjudicable=False)
        item = Item(path, rec, pin, reason, target_name=rec.oracle.target)
    target = pin.target(item.target_name)
    item.variant = run_variant(rec, path, target, kernel_variant)
    lacking = host.missing_instructions(target, item.variant)
    if lacking:
        # the golden's numbers come from kernels this CPU cannot run: not drift
        return lacks(golden, path, item.variant, lacking)
    return item


def ready(item: Item, oracles: Oracles, home: Path, *, asked_other: bool) -> bool:
    """Identity first: the item's oracle opened and compared with the golden's record.
    False (the item's verdict set) when tokens from it would only mislead; ``asked_other``
    (--oracle, --cross-target): another oracle was asked for, so it runs, not adjudicable."""
    oracle = oracles.get(item.pin, item.target_name, require=False, variant=item.variant,
                         spec_env=item.rec.spec_env)
    if not oracle.identity.ok:
        item.verdict = GoldenVerdict(
            name=item.rec.golden.name, path=str(item.path), status="oracle_mismatch",
            why="the oracle is not its pin's; nothing was run",
            identity=[FieldDiff(field=f, golden=e, current=g, cls="identity")
                      for f, e, g in oracle.identity.mismatches], adjudicable=False)
        return False
    ident = identity_diffs(item.rec, oracle)
    if item.oracle_differs:  # --cross-target: the target differs, and so may more
        ident = ident + item.oracle_differs
        item.oracle_differs = []
    if ident and asked_other:
        # identity is still reported first, and the tokens are shown for what moved, never
        # judged against the golden's gate
        item.oracle_differs = ident + wheel_diff(item.rec, oracle)
        ident = []
    if ident:
        item.verdict = GoldenVerdict(
            name=item.rec.golden.name, path=str(item.path), status="oracle_mismatch",
            why="the current oracle is not the golden's; nothing was run",
            identity=ident, adjudicable=False)
        return False
    item.model_path = recorded_model(item.rec, item.path, home, oracle)
    item.args = dict(item.rec.engine.requested)
    if item.target_name != item.rec.oracle.target:  # this target's defaults (KV bound)
        item.args = engine_args(item.args, oracle.target)
    item.oracle = oracle
    return True


def run_groups(to_run: list[Item], home: Path, page: pages.PageData | None) -> None:
    """One engine start per distinct configuration; each item's verdict from its run."""
    groups = by_engine(to_run, Item.configuration)
    for n, group in enumerate(groups, start=1):
        lead = group[0]
        say(f"==> engine {n}/{len(groups)}: {', '.join(i.rec.golden.name for i in group)}")
        session = EngineSession(*lead.configuration(), home)
        wanted = None
        if page is not None:
            wanted = set().union(*(pages.wanted_ids(p.token_ids, i.rec.golden.prompt_topk(n))
                                   for i in group
                                   for n, p in enumerate(i.rec.golden.prompts)))
        result = session.run([run_from_golden(i.rec) for i in group], what="verify",
                             name=lead.rec.golden.name, pieces=wanted).require()
        for item, run in zip(group, result.runs, strict=True):
            item.verdict = verdict(item, result, run)
            if page is not None:
                page.add(item.path, item.rec.golden, run["legs"][0], item.verdict.tokens,
                         result.result.pieces, lead.oracle)


def lacks(golden: Golden, path: Path, variant: str | None, lacking: list[str]) -> GoldenVerdict:
    return GoldenVerdict(
        name=golden.name, path=str(path), status="not_verifiable_here",
        why=f"captured under CPU kernel variant {variant}, whose instructions this host's CPU "
        f"lacks ({', '.join(lacking)}): not verifiable here, not drift; its records are "
        "complete", adjudicable=False)


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
    results: list[judge.TokenResult] = []
    cand = golden.source.candidate if golden.source else None
    if cand and cand.get("token_ids") is not None:
        gaps = cand.get("neartie_gap_mnats")
        for n, p in enumerate(golden.prompts):
            new = cand["token_ids"][n]
            r = judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids,
                                     golden.prompt_topk(n), p.prompt_token_ids, new, None,
                                     golden.gate.band_nats)
            if r.index is not None and gaps is not None and r.index < len(gaps[n]):
                margin = judge.from_mnats(gaps[n][r.index])
                r = judge.TokenResult(**{**r.as_dict(), "golden_margin": margin,
                                         "kind": judge.classify(margin, golden.gate.band_nats)})
            results.append(r)
        notes.append("tokens: the source's candidate (our_ids.npy) against the oracle's run 0"
                     + ("; margins from neartie_gap_mnats.npy" if gaps is not None else ""))
    elif golden.legs is not None and golden.legs.count > 1:
        for n, p in enumerate(golden.prompts):
            last = golden.legs.tokens[-1][n]
            results.append(judge.compare_prompt(p.id, p.prompt_token_ids, p.token_ids,
                                                  golden.prompt_topk(n), p.prompt_token_ids,
                                                  last, None,
                                                  golden.gate.band_nats))
        notes.append(f"tokens: the oracle's last run (of {golden.legs.count}) against run 0")
    else:
        notes.append("tokens: no second run or candidate in the source to compare offline")
    summary = judge.summarize(results).line(golden.gate.kind) if results else ""
    return GoldenVerdict(name=golden.name, path=str(path), status="config_unrecorded",
                         why=UNRECORDED_BANNER, notes=[printable(n) for n in notes],
                         adjudicable=False,
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
