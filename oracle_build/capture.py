"""capture: identity -> preflight -> driver (one engine start per configuration) -> golden.

Specs in one call that share an engine configuration share one engine start. A
golden records the configuration the engine resolved, read back from it; legs that
disagree stop the publish unless a non-deterministic golden is asked for.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build import engine
from oracle_build.errors import OutputFailed, Refused
from oracle_build.files import sha256_bytes, sha256_file
from oracle_build.golden import (
    GOLDEN_SCHEMA,
    BackendValue,
    EngineRecord,
    Golden,
    LegsRecord,
    ModelRecord,
    OracleRecord,
    PromptRecord,
    ReadValue,
    RunRecord,
    Spec,
    Unreadable,
    load_spec,
    publish,
)
from oracle_build.locks import held
from oracle_build.log import say
from oracle_build.meta import host_facts, tool_facts, utc_now
from oracle_build.pins import Pin, load_pin
from oracle_build.targets import choose_target, detect_host


@dataclass
class Job:
    spec: Spec
    spec_path: Path
    golden_path: Path
    pin: Pin
    target_name: str
    model_path: Path | None = None
    model: ModelRecord | None = None
    args: dict[str, Any] | None = None

    def run_request(self) -> dict[str, Any]:
        prompts = [{"token_ids": p.token_ids} if p.token_ids is not None else {"text": p.text}
                   for p in self.spec.prompts]
        return {"name": self.spec.name, "prompts": prompts, "calls": self.spec.calls(),
                "legs": self.spec.legs,
                "sampling": self.spec.sampling.vllm_kwargs(self.spec.logprobs)}


def spec_file(path: Path) -> Path:
    return path / "spec.toml" if path.is_dir() else path


def make_job(path: Path, *, host_target: str | None = None, out: Path | None = None) -> Job:
    sp = spec_file(Path(path))
    spec = load_spec(sp)
    pin = load_pin((sp.parent / spec.pin).resolve())
    target = spec.target or choose_target(pin, detect_host(), host_target)
    pin.target(target)
    golden = (out / spec.name / "golden.json") if out else sp.parent / "golden.json"
    return Job(spec, sp, golden, pin, target)


def legs_record(legs: list[list[dict[str, Any]]], ids: list[str]) -> LegsRecord:
    tokens = [[p["token_ids"] for p in leg] for leg in legs]
    disagreements = []
    for i, pid in enumerate(ids):
        first = tokens[0][i]
        for leg_no, leg in enumerate(tokens[1:], start=1):
            other = leg[i]
            if other != first:
                pos = next((j for j, (a, b) in enumerate(zip(first, other, strict=False))
                            if a != b), min(len(first), len(other)))
                disagreements.append({
                    "prompt": pid, "leg": leg_no, "position": pos,
                    "tokens": [first[pos] if pos < len(first) else None,
                               other[pos] if pos < len(other) else None]})
    return LegsRecord(count=len(legs), agree=not disagreements, tokens=tokens,
                      disagreements=disagreements)


def engine_record(requested: dict[str, Any], result: dict[str, Any]) -> EngineRecord:
    resolved: dict[str, ReadValue | Unreadable] = {}
    for key, item in result["resolved_after"].items():
        resolved[key] = (Unreadable(**item) if "unreadable" in item
                         else ReadValue.model_validate(item))
    resolved["torch_threads"] = ReadValue.model_validate(
        {"value": result.get("torch_threads"), "from": "torch.get_num_threads()"})
    backends: dict[str, BackendValue | Unreadable] = {}
    log_names = result.get("log_backends") or []
    for kind in ("attention", "moe"):
        item = result["backends"][kind]
        if "unreadable" in item:
            backends[kind] = Unreadable(**item)
        else:
            backends[kind] = BackendValue(value=item.get("value"), layers=item.get("layers"),
                                          note=item.get("note"),
                                          log=log_names if kind == "attention" else None)
    return EngineRecord(requested=requested, resolved=resolved, backends=backends,
                        start_seconds=result.get("engine_start_seconds"))


def golden_from(job: Job, oracle: engine.Oracle, result: dict[str, Any], run: dict[str, Any],
                *, log: Path, durations: dict[str, float]) -> Golden:
    spec = job.spec
    assert job.model is not None and job.args is not None
    legs = legs_record(run["legs"], [p.id for p in spec.prompts])
    nondet = not legs.agree
    first = run["legs"][0]
    prompts = [
        PromptRecord(id=p.id, text=p.text, prompt_token_ids=out["prompt_token_ids"],
                     token_ids=out["token_ids"], output_text=out["text"],
                     finish_reason=out["finish_reason"],
                     topk=[[(t, lp) for t, lp in pos[: spec.logprobs + 1]]
                           for pos in out["topk"]])
        for p, out in zip(spec.prompts, first, strict=True)
    ]
    env = dict(result.get("env", {}))
    gate = spec.gate
    if nondet and gate.kind == "strict":
        gate = gate.model_copy(update={"kind": "distributional"})
    return Golden(
        golden_schema=GOLDEN_SCHEMA,
        name=spec.name,
        spec=spec.model_dump(mode="json", by_alias=True),
        spec_sha256=sha256_file(job.spec_path),
        oracle=OracleRecord(pin_id=oracle.pin.id, pin_hash=oracle.pin.content_hash,
                            pin_key=oracle.pin.key, target=oracle.target_name,
                            identity=oracle.identity.summary(),
                            build_record_sha256=oracle.build_record_sha256),
        model=job.model,
        engine=engine_record(job.args, result),
        environment=env,
        sampling=run["sampling"],
        logprobs=spec.logprobs,
        batch={"mode": spec.batch.mode, "calls": [[spec.prompts[i].id for i in call]
                                                  for call in spec.calls()],
               "environment_set_by_engine": result.get("env_after_import", {})},
        legs=legs,
        nondeterministic=nondet,
        gate=gate,
        classification=spec.classification,
        prompts=prompts,
        run=RunRecord(host=host_facts(), created_utc=utc_now(), command=list(sys.argv),
                      tool=tool_facts(), durations=durations, log=str(log)),
    )


def writable_or_refuse(folder: Path) -> None:
    """Before any engine starts: the golden's folder can be created and written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        raise OutputFailed(f"cannot write goldens to {folder}: {exc.strerror or exc}",
                           hint="check the folder's permissions, mount and free space; "
                           "nothing was run") from None


def golden_lock(home: Path, golden: Path) -> Path:
    digest = sha256_bytes(str(golden.resolve()).encode())[:16]
    return home / "locks" / f"golden-{digest}.lock"


def config_key(job: Job) -> str:
    return json.dumps([job.pin.key, job.target_name, str(job.model_path), job.args],
                      sort_keys=True, default=str)


def capture(paths: list[Path], *, home: Path, replace: bool = False,
            allow_nondeterministic: bool = False, target: str | None = None,
            out: Path | None = None) -> list[Path]:
    """Capture every spec in ``paths``; returns the goldens written."""
    jobs = [make_job(p, host_target=target, out=out) for p in paths]
    names = [j.golden_path for j in jobs]
    if len(set(names)) != len(names):
        raise Refused("two specs in one call write the same golden")
    for job in jobs:  # refuse before any engine starts
        if job.golden_path.exists() and not replace:
            raise Refused(f"{job.golden_path} exists; a golden is never overwritten",
                          hint="--replace writes a new one and keeps the old under replaced/")
        writable_or_refuse(job.golden_path.parent)
    oracles: dict[tuple[str, str], engine.Oracle] = {}
    for job in jobs:
        key = (job.pin.key, job.target_name)
        if key not in oracles:
            start = time.monotonic()
            oracles[key] = engine.open_oracle(job.pin, job.target_name, home)
            say(f"ORACLE_IDENTITY_OK ({time.monotonic() - start:.1f}s)")
        oracle = oracles[key]
        job.model_path, job.model = engine.resolve_model(job.spec.model, job.spec_path.parent,
                                                         home)
        job.args = engine.engine_args(job.spec.engine, oracle.target)
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(config_key(job), []).append(job)
    written: list[Path] = []
    for n, group in enumerate(groups.values(), start=1):
        lead = group[0]
        oracle = oracles[(lead.pin.key, lead.target_name)]
        engine.memory_preflight(oracle.target)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        log = home / "logs" / f"capture-{lead.spec.name}-{stamp}.log"
        say(f"==> engine {n}/{len(groups)}: {', '.join(j.spec.name for j in group)} "
            f"(log: {log})")
        locks = [held(golden_lock(home, j.golden_path), what=f"capture {j.golden_path}")
                 for j in group]
        for lk in locks:
            lk.__enter__()
        try:
            for job in group:  # another capture may have published while we waited
                if job.golden_path.exists() and not replace:
                    raise Refused(f"{job.golden_path} was published by another capture while "
                                  "this one waited; a golden is never overwritten")
            start = time.monotonic()
            assert lead.model_path is not None and lead.args is not None
            result = engine.run_driver(oracle, lead.model_path, lead.args,
                                       [j.run_request() for j in group], log=log)
            wall = time.monotonic() - start
            for job, run in zip(group, result["runs"], strict=True):
                durations = {"engine_start": result.get("engine_start_seconds") or 0.0,
                             "legs": sum(run["leg_seconds"]), "driver_wall": round(wall, 3)}
                golden = golden_from(job, oracle, result, run, log=log, durations=durations)
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
                kept = publish(golden, job.golden_path, replace=replace)
                if kept:
                    say(f"    kept the replaced golden at {kept}")
                say(f"    wrote {job.golden_path} ({len(golden.prompts)} prompts, "
                    f"{legs.count} legs, legs agree: {legs.agree})")
                written.append(job.golden_path)
        finally:
            for lk in reversed(locks):
                lk.__exit__(None, None, None)
    return written
