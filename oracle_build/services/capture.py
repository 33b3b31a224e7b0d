"""capture: identity -> preflight -> engine (one start per configuration) -> golden.

Specs in one call that share an engine configuration share one engine start. A golden
records the configuration the engine resolved, read back from it; legs that disagree stop
the publish unless a non-deterministic golden is asked for.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build import devices, goldens, host, judge
from oracle_build.checkpoints.resolve import resolve_model
from oracle_build.contracts.golden import (
    GOLDEN_SCHEMA,
    EmbeddedPin,
    Golden,
    LegsRecord,
    MigrationRecord,
    ModelRecord,
    OracleRecord,
    PromptRecord,
    ReplacedRecord,
    RunRecord,
    load_golden,
    recorded,
)
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.contracts.spec import Spec, load_spec, spec_file
from oracle_build.core import layout, proc, verdicts
from oracle_build.core.errors import BadInput, EngineFailed, OutputFailed, Refused, as_data
from oracle_build.core.filelock import held
from oracle_build.core.files import (
    clear_stale_temporaries,
    read_text,
    sha256_bytes,
    sha256_file,
    temporary_prefix,
)
from oracle_build.core.log import say
from oracle_build.engine.runs import by_engine, engine_args, run_from_spec
from oracle_build.engine.session import EngineResult, EngineSession
from oracle_build.oracle.opening import Oracle, Oracles, opened

# the embedded default: what `capture` with no spec captures (its committed golden stays)
DEFAULT_SPEC = Path("goldens/tiny-llama-greedy")


@dataclass
class Job:
    spec: Spec
    spec_path: Path
    golden_path: Path
    pin: Pin
    target_name: str
    pin_path: Path
    oracle: Oracle | None = None
    model_path: Path | None = None
    model: ModelRecord | None = None
    args: dict[str, Any] | None = None
    variant: str | None = None  # --kernel-variant (None: the pin target's)
    # capture --migrate: the golden being migrated, whose recorded configuration the run
    # replays (its engine arguments as it requested them)
    migrating: Golden | None = None

    def configuration(self) -> tuple[Oracle, Path, dict[str, Any]]:
        """The engine configuration this job runs under (prepared)."""
        assert self.oracle is not None and self.model_path is not None
        assert self.args is not None
        return self.oracle, self.model_path, self.args

    def session(self, home: Path) -> EngineSession:
        return EngineSession(*self.configuration(), home)


def make_job(path: Path, *, host_target: str | None = None, out: Path | None = None) -> Job:
    sp = spec_file(path)
    spec = load_spec(sp)
    pin_path = (sp.parent / spec.pin).resolve()
    pin = load_pin(pin_path)
    target = spec.target or devices.choose_target(pin, host.host(), host_target)
    pin.target(target)
    golden = (out / spec.name / "golden.json") if out else sp.parent / "golden.json"
    return Job(spec, sp, golden, pin, target, pin_path)


def prepare(job: Job, oracles: Oracles, home: Path) -> None:
    """Open the job's oracle (identity first), resolve its model and engine arguments."""
    job.oracle = oracles.get(job.pin, job.target_name, variant=job.variant,
                            spec_env=job.spec.env)
    job.model_path, job.model = resolve_model(job.spec.model, job.spec_path.parent, home,
                                                     job.oracle)
    job.args = engine_args(job.spec.engine, job.oracle.target)
    if job.migrating is not None and job.migrating.engine is not None:
        # the golden's own request, as it recorded it (a pin target's defaults may have
        # moved since): a migration replays the golden, not today's defaults
        job.args = dict(job.migrating.engine.requested)


def embedded_pin(pin: Pin) -> EmbeddedPin:
    """The pin file and its lock, carried in the golden (portable to another tree)."""
    lock = pin.lock_path
    return EmbeddedPin(pin_name=pin.path.name, pin_toml=read_text(pin.path),
                       lock_name=lock.name if lock else None,
                       lock_text=read_text(lock) if lock else None)


def legs_record(run: dict[str, Any], ids: list[str]) -> LegsRecord:
    tokens = [[p["token_ids"] for p in leg] for leg in run["legs"]]
    agreement = judge.legs_agreement(tokens, ids)
    return LegsRecord(count=agreement.count, agree=agreement.agree, tokens=tokens,
                      disagreements=agreement.disagreements)


def golden_from(job: Job, result: EngineResult, run: dict[str, Any],
                durations: dict[str, float]) -> Golden:
    spec, oracle = job.spec, job.oracle
    assert job.model is not None and oracle is not None
    legs = legs_record(run, [p.id for p in spec.prompts])
    nondet = not legs.agree
    prompts = [
        PromptRecord(id=p.id, text=p.text, prompt_token_ids=out["prompt_token_ids"],
                     token_ids=out["token_ids"], output_text=out["text"],
                     finish_reason=out["finish_reason"],
                     topk=[[(t, lp) for t, lp in pos[: spec.logprobs + 1]]
                           for pos in out["topk"]])
        for p, out in zip(spec.prompts, run["legs"][0], strict=True)
    ]
    gate = spec.gate
    if nondet and gate.kind == "strict":
        gate = gate.model_copy(update={"kind": "distributional"})
    return Golden(
        golden_schema=GOLDEN_SCHEMA,
        name=spec.name,
        # the pin as seen from the golden's own folder (``--out`` writes it elsewhere than
        # its spec), so verify finds it from the golden alone
        spec={**spec.model_dump(mode="json", by_alias=True),
              "pin": os.path.relpath(job.pin_path, job.golden_path.parent.resolve())},
        spec_sha256=sha256_file(job.spec_path),
        oracle=OracleRecord(pin_id=oracle.pin.id, pin_hash=oracle.pin.content_hash,
                            pin_key=oracle.pin.key, target=oracle.target_name,
                            identity=oracle.identity.summary(),
                            build_record_sha256=oracle.build_record_sha256,
                            content_fingerprint=oracle.content_fingerprint,
                            embedded_pin=embedded_pin(oracle.pin)),
        model=job.model,
        engine=result.engine_record(),
        environment=result.environment,
        sampling=run["sampling"],
        logprobs=spec.logprobs,
        batch={"mode": spec.batch.mode, "calls": [[spec.prompts[i].id for i in call]
                                                  for call in spec.calls()],
               "environment_set_by_engine": result.environment_set_by_engine},
        legs=legs,
        nondeterministic=nondet,
        gate=gate,
        classification=spec.classification,
        prompts=prompts,
        # the host's `cc --version` is not the engine's compiler: engine.compiler names that
        run=RunRecord(host={k: v for k, v in host.facts().items() if k != "compiler"},
                      created_utc=layout.utc_now(), command=list(sys.argv),
                      tool=host.tool_facts(), durations=durations, log=str(result.log),
                      network=proc.oracle_network()[1]),
    )


def weights_consumed(job: Job, result: EngineResult) -> None:
    """A generated model's every tensor must reach vLLM's loader: one it skips leaves that
    part of the model at its initial values, and the golden would test nothing there."""
    audit = result.result.weights or {}
    skipped = audit.get("unconsumed")
    if skipped is None:
        raise EngineFailed(f"{job.spec.name}: the driver did not report which checkpoint "
                           f"tensors the loader consumed; log: {result.log}")
    if skipped:
        raise Refused(f"{job.spec.name}: vLLM's loader skipped {len(skipped)} of "
                      f"{audit.get('checkpoint_tensors')} checkpoint tensors "
                      f"({', '.join(skipped[:8])}); not published",
                      hint="the generator's layout is not the one this vLLM reads: fix the "
                      "generator (its names come from transformers' class)")
    say(f"    every one of the {audit.get('checkpoint_tensors')} checkpoint tensors reached "
        "vLLM's loader")


def spec_differences(job: Job, old: Golden) -> list[tuple[str, str]]:
    """Where the folder's spec is not the one the golden recorded (each field, with both
    values), compared as this oracle-build reads them (a setting added since, at its
    default, is no difference). A migration replays the golden's own spec: a folder that
    says otherwise would change the golden's configuration under the name of a migration."""
    mine = {**job.spec.model_dump(mode="json", by_alias=True),
            "pin": os.path.relpath(job.pin_path, job.golden_path.parent.resolve())}
    try:
        theirs = Spec.model_validate(old.spec or {}).model_dump(mode="json", by_alias=True)
    except ValueError as exc:
        return [("spec", f"the golden's recorded spec is not one this oracle-build reads: "
                 f"{as_data(str(exc), 300)}")]
    theirs["pin"] = (old.spec or {}).get("pin")
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    judge.flat("spec", theirs, a)
    judge.flat("spec", mine, b)
    return [(key, f"the golden's {as_data(repr(a.get(key, '<absent>')), 120)}, the folder's "
             f"{as_data(repr(b.get(key, '<absent>')), 120)}")
            for key in sorted(set(a) | set(b)) if a.get(key, "<absent>") != b.get(key,
                                                                                  "<absent>")]


def migrated(path: Path, new: Golden) -> Golden:
    """The golden at ``path`` with what ``new`` (a run replaying its recorded spec under its
    own variant) records that it did not: the migration, when the run's numbers are the old
    golden's bit for bit and its configuration is the old one's; else refused, naming where
    they differ. The result differs from the old golden in the filled fields and
    ``replaces`` alone."""
    old = load_golden(path)
    differ, tokens, cells = goldens.numbers_differ(old, new)
    if differ:
        raise Refused(f"{path}: not migrated: this run does not reproduce its numbers bit "
                      "for bit: " + "; ".join(differ),
                      hint="the golden stays as it is; a re-baseline is `capture --replace "
                      "--reason TEXT` (it says why), or migrate on a host of the CPU model "
                      "it was captured on")
    assert old.engine is not None and new.engine is not None and new.run is not None
    numerics, _context = judge.config_diffs(recorded(old, path), {
        "engine": new.engine, "environment": new.environment or {},
        "sampling": new.sampling, "calls": (new.batch or {}).get("calls")})
    if numerics:
        raise Refused(f"{path}: not migrated: the run's configuration is not the golden's: "
                      + "; ".join(f"{d.field}: the golden's {as_data(repr(d.golden), 80)}, "
                                  f"the run's {as_data(repr(d.current), 80)}"
                                  for d in numerics[:10]),
                      hint="a migration fills what a golden did not record; it never changes "
                      "what it did: a re-baseline is `capture --replace --reason TEXT`")
    filled = []
    engine = old.engine
    held = new.engine.kernel_variant
    was = old.engine.kernel_variant
    if held is not None and (was is None or was.predicates is None):
        filled.append("engine.kernel_variant")
        engine = engine.model_copy(update={"kernel_variant": held})
    run = old.run
    if run is not None:
        host_facts = dict(run.host)
        for key in ("cpu_model", "cpu_vendor"):
            if not host_facts.get(key) and new.run.host.get(key):
                filled.append(f"run.host.{key}")
                host_facts[key] = new.run.host[key]
        update: dict[str, Any] = {"host": host_facts}
        if run.network is None and new.run.network is not None:
            filled.append("run.network")
            update["network"] = new.run.network
        run = run.model_copy(update=update)
    assert new.replaces is not None
    say(f"    reproduced {path} bit for bit ({tokens} tokens, {cells} top-k cells); "
        f"filled: {', '.join(filled) or 'nothing new'}")
    return old.model_copy(update={"engine": engine, "run": run,
                                  "replaces": new.replaces.model_copy(update={
                                      "reproduced": MigrationRecord(
                                          bit_for_bit=True, tokens=tokens, topk_cells=cells,
                                          filled=filled)})})


def replaced_record(path: Path, reason: str) -> ReplacedRecord:
    """The golden about to be replaced: its bytes' sha256, its oracle, when it was made. A
    file that no longer loads is still named by its hash."""
    data = path.read_bytes()
    facts: dict[str, Any] = {}
    try:
        old = load_golden(path)
        if isinstance(old.oracle, OracleRecord):
            facts = {"pin_hash": old.oracle.pin_hash, "pin_key": old.oracle.pin_key,
                     "vllm": old.oracle.identity.get("vllm")}
        facts["created_utc"] = old.run.created_utc if old.run else None
    except BadInput as exc:
        say(f"    the golden being replaced does not load ({exc.message.splitlines()[0]}); "
            "recording its hash only")
    return ReplacedRecord(reason=reason.strip(), golden_sha256=sha256_bytes(data), **facts)


def writable_or_refuse(folder: Path) -> None:
    """Before any engine starts: the golden's folder can be created and written (a probe
    file, removed); what a capture killed mid-publish left there (its temporary files) is
    cleared, said."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        cleared = clear_stale_temporaries(folder)
        if cleared:
            say(f"    cleared what an unfinished capture left in {folder}: "
                + ", ".join(as_data(n, 120) for n in cleared))
        fd, probe = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(folder / "golden"),
                                     suffix=".check")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputFailed(f"cannot write goldens to {folder}: {exc.strerror or exc}",
                           hint="check the folder's permissions, mount and free space; "
                           "nothing was run") from None


def capture(paths: list[Path], *, home: Path, replace: bool = False,
            allow_nondeterministic: bool = False, target: str | None = None,
            out: Path | None = None, oracles: Oracles | None = None,
            reason: str | None = None, kernel_variant: str | None = None,
            migrate: bool = False) -> list[Path]:
    """Capture every spec in ``paths``; returns the goldens written. Replacing a golden
    needs ``reason``; the new golden records it and what it replaced. ``kernel_variant``:
    the CPU kernel variant the engines are held to (default: each pin target's).

    ``migrate``: bring each existing golden up to what a capture records today (the whole
    kernel-variant hold, the CPU model) from a run that reproduces its numbers: each engine
    is held to the golden's own variant, and the new golden replaces the old only when
    every token and every top-k id and logprob is the old one's, bit for bit (else refused,
    exit 8, nothing written for it); the new golden's ``replaces.reproduced`` records what
    was compared and which fields were filled.

    No ``paths``: the embedded default spec. Its committed golden is never overwritten, so
    without ``out`` (and without ``replace``) a fresh one is written under the home's
    captures folder instead."""
    if not paths:
        paths = [DEFAULT_SPEC]
        if out is None and (DEFAULT_SPEC / "golden.json").exists() and not replace:
            out = layout.captures_dir(home)
            say(f"no spec given: capturing the embedded default {DEFAULT_SPEC} into {out} "
                "(its committed golden is never overwritten)")
    jobs = [make_job(p, host_target=target, out=out) for p in paths]
    for job in jobs:
        job.variant = kernel_variant
    if migrate:
        replace = True
        reason = ((reason or "").strip() or "migration: the kernel-variant hold recorded in "
                  "full, from a run that reproduces the golden's numbers bit for bit")
        for job in jobs:
            if not job.golden_path.exists():
                raise Refused(f"{job.golden_path}: no golden to migrate",
                              hint="capture it first (capture without --migrate)")
            job.migrating = load_golden(job.golden_path)
            job.variant = kernel_variant or recorded(job.migrating,
                                                    job.golden_path).kernel_variant
            differ = spec_differences(job, job.migrating)
            if differ:  # before any engine: the folder's spec would change the golden
                raise Refused(f"{job.golden_path}: not migrated: its folder's spec is not the "
                              "one the golden recorded:\n" + "\n".join(
                                  f"  {field}: {why}" for field, why in differ[:20]),
                              hint="a migration replays the golden's own spec; restore the "
                              "folder's spec.toml, or re-baseline with `capture --replace "
                              "--reason TEXT`")
    names = [j.golden_path for j in jobs]
    if len(set(names)) != len(names):
        raise Refused("two specs in one call write the same golden")
    for job in jobs:  # refuse before any engine starts
        if job.golden_path.exists() and not replace:
            raise Refused(f"{job.golden_path} exists; a golden is never overwritten",
                          hint="--replace --reason TEXT writes a new one and keeps the old "
                          "under replaced/")
        if job.golden_path.exists() and not (reason or "").strip():
            raise Refused(f"replacing {job.golden_path} needs a reason",
                          hint="--reason TEXT: the new golden records it, with the replaced "
                          "golden's oracle (a re-baseline says why)")
        writable_or_refuse(job.golden_path.parent)
    # an engine will run: each oracle's identity is probed inside its engine host
    with opened(home, oracles, engine_for=("capture", jobs[0].spec.name) if jobs
                       else None) as oracles:
        for job in jobs:
            prepare(job, oracles, home)
        groups = by_engine(jobs, Job.configuration)
        say(verdicts.identity(True))
        written: list[Path] = []
        for n, group in enumerate(groups, start=1):
            say(f"==> engine {n}/{len(groups)}: {', '.join(j.spec.name for j in group)}")
            with ExitStack() as stack:
                for j in group:
                    stack.enter_context(held(layout.golden_lock(home, j.golden_path),
                                             what=f"capture {j.golden_path}"))
                for job in group:  # another capture may have published while we waited
                    if job.golden_path.exists() and not replace:
                        raise Refused(f"{job.golden_path} was published by another capture while "
                                      "this one waited; a golden is never overwritten")
                generated = group[0].spec.model.generate is not None
                result = group[0].session(home).run(
                    [run_from_spec(j.spec) for j in group], what="capture",
                    name=group[0].spec.name, audit_weights=generated).require()
                say(f"    engine log: {result.log}")
                if generated:
                    weights_consumed(group[0], result)
                for job, run in zip(group, result.runs, strict=True):
                    durations = {"engine_start": result.start_seconds,
                                 "legs": sum(run["leg_seconds"]),
                                 "driver_wall": float(result.result.seconds or 0.0)}
                    golden = golden_from(job, result, run, durations)
                    legs = golden.legs
                    assert legs is not None
                    if golden.nondeterministic and not allow_nondeterministic:
                        where = "; ".join(f"prompt {d['prompt']} leg {d['leg']} position "
                                          f"{d['position']}: {d['tokens'][0]} vs {d['tokens'][1]}"
                                          for d in legs.disagreements)
                        raise Refused(
                            f"{job.spec.name}: the legs disagree ({where}); not published",
                            hint="--allow-nondeterministic records it, marked non-deterministic "
                            "(it can never back a strict gate)")
                    if job.golden_path.exists() and reason:
                        golden = golden.model_copy(update={"replaces": replaced_record(
                            job.golden_path, reason)})
                    if migrate:
                        golden = migrated(job.golden_path, golden)
                    kept = goldens.publish(golden, job.golden_path, replace=replace)
                    if kept:
                        say(f"    kept the replaced golden at {kept} (reason: {reason})")
                    say(f"    wrote {job.golden_path} ({len(golden.prompts)} prompts, "
                        f"{legs.count} legs, legs agree: {legs.agree})")
                    written.append(job.golden_path)
    return written
