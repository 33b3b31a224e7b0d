"""What an engine is asked to run: the engine arguments over the target's defaults, one
run request per spec or golden, and the grouping of runs that share one engine
configuration (one engine start each)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from oracle_build import devices
from oracle_build.contracts.golden import (
    Recorded,
)
from oracle_build.contracts.spec import SamplingSpec, Spec
from oracle_build.contracts.targets import Target
from oracle_build.oracle.opening import Oracle

T = TypeVar("T")


def engine_args(requested: dict[str, Any], target: Target) -> dict[str, Any]:
    """The spec's arguments over the target's defaults. On CPU the KV cache is always
    bounded: left alone, vLLM's CPU engine takes most of the host's memory."""
    args = {**target.engine_defaults, **requested}
    devices.module(target).engine_args(args)
    return args


def run_from_spec(spec: Spec, *, legs: int | None = None) -> dict[str, Any]:
    """One run of a spec: its prompts, generate() calls, legs and sampling."""
    prompts = [{"token_ids": p.token_ids} if p.token_ids is not None else {"text": p.text}
               for p in spec.prompts]
    return {"name": spec.name, "prompts": prompts, "calls": spec.calls(),
            "legs": legs if legs is not None else spec.legs,
            "sampling": spec.sampling.vllm_kwargs(spec.logprobs)}


def run_from_golden(rec: Recorded, *, legs: int = 1) -> dict[str, Any]:
    """One run under a golden's recorded prompts, batch composition and sampling."""
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


def config_key(oracle: Oracle, model_path: Path, args: dict[str, Any]) -> str:
    """Runs whose keys are equal share one engine start."""
    return json.dumps([oracle.pin.key, oracle.target_name, oracle.hold.variant,
                       str(model_path), args],
                      sort_keys=True, default=str)


def by_engine(items: Iterable[T],
              configuration: Callable[[T], tuple[Oracle, Path, dict[str, Any]]]) -> list[list[T]]:
    """``items`` grouped by the engine configuration each runs under (oracle, model, engine
    arguments), groups and members in first-seen order: one engine start per group."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(config_key(*configuration(item)), []).append(item)
    return list(groups.values())
