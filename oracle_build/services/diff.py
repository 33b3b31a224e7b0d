"""diff: what moves between two oracles (a pin bump, a second gate host's pin), over the
recorded configurations of goldens.

Both oracles must pass their own identity. For each golden, its recorded prompts, batch
composition, sampling and engine arguments run on oracle A, then on oracle B (one engine at
a time); B's tokens are compared with A's (A is the reference), with both margins at the
first divergence, classed exact-tie, near-tie or real, and whether the top-k logprobs are
bit-identical. The package diff comes from the two oracles' identities. The record (schema
contracts/schemas/diff.schema.json) is written under the home; nothing under goldens/ is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracle_build import devices, host, judge
from oracle_build.checkpoints.resolve import recorded_model
from oracle_build.contracts.golden import load_golden, recorded
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.record import BuildRecord, load_record
from oracle_build.contracts.reports import (
    DIFF_REPORT_SCHEMA,
    DiffReport,
    GoldenDiff,
    OracleSide,
    PackageChange,
    RecipeChange,
)
from oracle_build.core import layout
from oracle_build.core.errors import BadInput
from oracle_build.core.files import atomic_write_json
from oracle_build.core.log import say
from oracle_build.engine.runs import engine_args, run_from_golden
from oracle_build.engine.session import EngineResult, EngineSession
from oracle_build.oracle.opening import Oracle, Oracles
from oracle_build.report import page as pages
from oracle_build.services.verify import discover


def side(oracle: Oracle) -> OracleSide:
    s = oracle.identity.summary()
    return OracleSide(pin_id=oracle.pin.id, pin_key=oracle.pin.key,
                      pin_hash=oracle.pin.content_hash, target=oracle.target_name,
                      vllm=s.get("vllm"), torch=s.get("torch"),
                      transformers=s.get("transformers"), venv=str(oracle.venv.path))


def package_changes(a: Oracle, b: Oracle) -> list[PackageChange]:
    da = a.identity.summary().get("distributions") or {}
    db = b.identity.summary().get("distributions") or {}
    return [PackageChange(name=n, a=da.get(n), b=db.get(n))
            for n in sorted(set(da) | set(db)) if da.get(n) != db.get(n)]


def recipe_facts(rec: BuildRecord) -> dict[str, str]:
    """How an oracle was made, flat, from its build record: its vLLM source, the patches it
    applied, its compilers, cmake, ninja and the compile's flags (what differs between a
    wheel oracle and a source one, or two hosts' source builds)."""
    out = {"source": rec.resolved.vllm}
    for patch in rec.patches or []:
        if patch.applied:
            out[f"patch {patch.file}"] = f"sha256 {patch.sha256[:16]}..."
    if rec.toolchain is not None:
        for role, c in rec.toolchain.compilers.items():
            out[f"toolchain.{role}"] = f"{c.real_path or c.path or c.asked} {c.version or '?'}"
        for name in ("cmake", "ninja"):
            value = getattr(rec.toolchain, name)
            if value:
                out[f"toolchain.{name}"] = value
        for key, value in rec.toolchain.flags.items():
            if not key.startswith("CCACHE_"):  # where a build ran, not what it compiled
                out[f"toolchain.flags.{key}"] = value
    return out


def _recipe(oracle: Oracle) -> dict[str, str]:
    try:
        return recipe_facts(load_record(oracle.venv.record_path))
    except (BadInput, OSError):
        return {}


def recipe_changes(a: Oracle, b: Oracle) -> list[RecipeChange]:
    fa, fb = _recipe(a), _recipe(b)
    return [RecipeChange(what=k, a=fa.get(k), b=fb.get(k))
            for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def verdict_of(results: list[judge.TokenResult]) -> str:
    moved = [r for r in results if not r.tokens_equal]
    if not moved:
        return "same"
    if all(r.kind in ("exact_tie", "near_tie") for r in moved):
        return "moved at near-ties only"
    return "moved"


def diff(pin_a: Pin, pin_b: Pin, paths: list[Path], *, home: Path,
         target: str | None = None,
         page: pages.PageData | None = None) -> tuple[DiffReport, Path]:
    """``page``: filled with what an HTML report shows (A as the reference, B the
    candidate)."""
    oracles = Oracles(home)
    target_a = devices.choose_target(pin_a, host.host(), target)
    target_b = devices.choose_target(pin_b, host.host(), target)
    a = oracles.get(pin_a, target_a)
    b = oracles.get(pin_b, target_b)
    out: list[GoldenDiff] = []
    goldens = discover(paths)
    for n, path in enumerate(goldens, start=1):
        golden = load_golden(path)
        if not golden.configuration_recorded or golden.source is not None:
            out.append(GoldenDiff(name=golden.name, path=str(path), verdict="not run",
                                  why="its configuration was never recorded"))
            continue
        rec = recorded(golden, path)
        request = run_from_golden(rec)
        runs = []
        # under the golden's own [env]: each oracle opened again for it (identity first)
        pair = ((("A", a), ("B", b)) if not rec.spec_env else
                (("A", oracles.get(pin_a, target_a, spec_env=rec.spec_env)),
                 ("B", oracles.get(pin_b, target_b, spec_env=rec.spec_env))))
        for label, oracle in pair:
            say(f"==> {golden.name} ({n}/{len(goldens)}) on {label}: {oracle.pin.key}")
            model = recorded_model(rec, path, home, oracle)
            args = engine_args(dict(rec.engine.requested), oracle.target)
            result = EngineSession(oracle, model, args, home).run(
                [request], what="diff", name=f"{golden.name}-{label}",
                pieces=set() if page is not None else None)
            if not result.ok:  # what moved can be that one oracle no longer runs it
                say(f"    engine failed on {label}: {result.error} (log: {result.log})")
                break
            runs.append((result, result.runs[0]))
        if len(runs) < 2:
            label = "A" if not runs else "B"
            out.append(GoldenDiff(name=golden.name, path=str(path),
                                  verdict=f"engine failed on {label}",
                                  why=f"{result.error} (log: {result.log})"))
            continue
        (ra, run_a), (rb, run_b) = runs
        band = golden.gate.band_nats
        results = [judge.compare_prompt(p.id, x["prompt_token_ids"], x["token_ids"], x["topk"],
                                        y["prompt_token_ids"], y["token_ids"], y["topk"], band)
                   for p, x, y in zip(golden.prompts, run_a["legs"][0], run_b["legs"][0],
                                      strict=True)]
        # A is the reference: its rows cut as capture records them (top-k + sampled token)
        difference = judge.first_topk_difference(
            [p.id for p in golden.prompts], run_a["leg_tables"][0].cut(rec.logprobs + 1),
            run_b["leg_tables"][0], rec.logprobs)
        numerics, context = judge.config_diffs(
            _recorded_as(rec, ra, run_a),
            {"engine": rb.engine_record(), "environment": rb.environment,
             "sampling": run_b["sampling"], "calls": rec.batch["calls"]})
        if page is not None:
            page.prompts[str(path)] = [
                pages.prompt(p.id, p.text, x["prompt_token_ids"], x["token_ids"], x["topk"],
                             y["token_ids"], y["topk"], r.row())
                for p, x, y, r in zip(golden.prompts, run_a["legs"][0], run_b["legs"][0],
                                      results, strict=True)]
            page.pieces.update(ra.result.pieces or {})
            page.pieces.update(rb.result.pieces or {})
        out.append(GoldenDiff(name=golden.name, path=str(path), verdict=verdict_of(results),
                              tokens=[r.as_dict() for r in results],
                              logprobs_identical=difference is None,
                              configuration=numerics + context,
                              summary=judge.summarize(results).line(golden.gate.kind)))
    report = DiffReport(diff_schema=DIFF_REPORT_SCHEMA, created_utc=layout.utc_now(),
                        a=side(a), b=side(b), packages=package_changes(a, b), goldens=out,
                        recipe=recipe_changes(a, b))
    dest = home / "diffs" / f"{layout.stamp()}-{a.pin.key}-vs-{b.pin.key}.json"
    atomic_write_json(dest, report.model_dump(mode="json"))
    return report, dest


def _recorded_as(rec: Any, result: EngineResult, run: dict[str, Any]) -> Any:
    """The golden's record with A's run in place of the golden's configuration, so B's run
    is compared with A's, setting by setting, by verify's own comparison."""
    golden = rec.golden.model_copy(update={"sampling": run["sampling"]})
    return type(rec)(golden, rec.oracle, result.engine_record(), rec.spec, rec.batch,
                     result.environment, rec.logprobs)
