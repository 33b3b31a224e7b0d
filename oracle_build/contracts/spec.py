"""Capture specs (goldens/<name>/spec.toml): what to capture, under which configuration.

A spec names the pin, the model (generated, a local folder, or a hub snapshot by its full
revision) and its files' sha256, the prompts, the engine arguments, the sampling parameters,
the batch composition, the legs and k. Unknown keys are errors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from oracle_build.contracts.base import FULL_SHA, SafeName, Sha256, Strict, TokenId
from oracle_build.contracts.engine_keys import engine_problems
from oracle_build.core.env import spec_env_problems
from oracle_build.core.files import load_toml, validate

SPEC_SCHEMA = 1
EngineValue = bool | int | float | str | list[int] | list[str] | None
# The models oracle-build generates itself (oracle_build/checkpoints/families.py defines each;
# a test keeps the two lists equal).
GENERATED_MODELS = ("tiny-llama-v1", "tiny-llama-bf16-v1", "tiny-qwen3-v1",
                    "tiny-qwen3-moe-v1", "tiny-gemma2-v1", "tiny-nemotron-h-v1",
                    "tiny-qwen3-next-v1")
GeneratedModel = Literal["tiny-llama-v1", "tiny-llama-bf16-v1", "tiny-qwen3-v1",
                         "tiny-qwen3-moe-v1", "tiny-gemma2-v1", "tiny-nemotron-h-v1",
                         "tiny-qwen3-next-v1"]



class ModelSpec(Strict):
    generate: GeneratedModel | None = None
    path: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    files: dict[str, Sha256] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        sources = [s for s in (self.generate, self.path, self.repo_id) if s]
        if len(sources) != 1:
            raise ValueError("give exactly one of generate, path, repo_id")
        if self.repo_id and not (self.revision and FULL_SHA.match(self.revision)):
            raise ValueError("a repo_id needs revision = the full 40-hex commit: a repo id "
                             "is not a pin (checkpoints are re-quantized in place)")
        if self.generate and not self.files:
            raise ValueError("a generated model pins its files' sha256 (files = {...})")
        for name in self.files:
            if "/" in name or name.startswith("."):
                raise ValueError(f"files key {name!r} must be a plain file name")
        return self


class PromptSpec(Strict):
    id: SafeName
    text: str | None = None
    token_ids: list[TokenId] | None = None

    @model_validator(mode="after")
    def _one(self) -> PromptSpec:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("give exactly one of text, token_ids")
        if self.token_ids is not None and not self.token_ids:
            raise ValueError("token_ids is empty")
        if self.text is not None and not self.text:
            raise ValueError("text is empty")
        return self


class SamplingSpec(Strict):
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    max_tokens: int = Field(default=32, ge=1, le=65536)
    ignore_eos: bool = False
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_tokens: int = Field(default=0, ge=0)
    seed: int | None = None
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=100.0)
    stop_token_ids: list[TokenId] = Field(default_factory=list)

    def vllm_kwargs(self, logprobs: int) -> dict[str, Any]:
        out = self.model_dump()
        out["logprobs"] = logprobs
        if out["seed"] is None:
            del out["seed"]
        return out


class BatchSpec(Strict):
    mode: Literal["per_prompt", "all", "groups"] = "per_prompt"
    groups: list[list[SafeName]] | None = None

    @model_validator(mode="after")
    def _groups(self) -> BatchSpec:
        if (self.mode == "groups") != (self.groups is not None):
            raise ValueError("groups is given exactly when mode = 'groups'")
        return self


class GateSpec(Strict):
    kind: Literal["strict", "near_tie", "distributional"] = "strict"
    band_nats: float = Field(default=0.5, ge=0.0, le=50.0)
    ratification: str | None = None
    # the numbers too: every top-k logprob bit for bit, not only the tokens (a re-run whose
    # tokens match but whose numbers moved is then drift, exit 1)
    bit_exact: bool = False


Classification = Literal["numerics", "context"]


class Spec(Strict):
    schema_: int = Field(alias="schema")
    name: SafeName
    pin: str
    target: SafeName | None = None
    description: str = ""
    model: ModelSpec
    prompts: list[PromptSpec] = Field(min_length=1, max_length=100_000)
    engine: dict[str, EngineValue] = Field(default_factory=dict)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    batch: BatchSpec = Field(default_factory=BatchSpec)
    legs: int = Field(default=2, ge=2, le=64)
    logprobs: int = Field(default=20, ge=1, le=20)
    gate: GateSpec = Field(default_factory=GateSpec)
    classification: dict[str, Classification] = Field(default_factory=dict)
    # what the engine's environment holds beyond what the tool builds: configuration,
    # recorded in the golden and held to on verify (core/env.py says what it may not set)
    env: dict[str, str] = Field(default_factory=dict, max_length=64)

    @model_validator(mode="after")
    def _checks(self) -> Spec:
        if self.schema_ != SPEC_SCHEMA:
            raise ValueError(f"schema {self.schema_} is not one this oracle-build reads "
                             f"({SPEC_SCHEMA})")
        ids = [p.id for p in self.prompts]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"prompt ids repeat: {dup}")
        if self.batch.groups is not None:
            flat = [i for g in self.batch.groups for i in g]
            if sorted(flat) != sorted(ids):
                raise ValueError("batch.groups must name every prompt id exactly once")
            if any(not g for g in self.batch.groups):
                raise ValueError("batch.groups has an empty group")
        for field, problem in spec_env_problems(self.env, "env")[:1]:
            raise ValueError(f"@{field}: {problem}")
        for key in self.engine:
            if key in ("model", "tokenizer"):
                raise ValueError(f"engine.{key}: the model comes from [model], not engine")
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
                raise ValueError(f"engine key {key!r} is not an engine argument name")
        for field, problem in engine_problems(self.engine, "engine")[:1]:
            raise ValueError(f"@{field}: {problem}")
        return self

    def calls(self) -> list[list[int]]:
        """Prompt indices per generate() call, in order."""
        if self.batch.mode == "per_prompt":
            return [[i] for i in range(len(self.prompts))]
        if self.batch.mode == "all":
            return [list(range(len(self.prompts)))]
        index = {p.id: i for i, p in enumerate(self.prompts)}
        assert self.batch.groups is not None
        return [[index[pid] for pid in group] for group in self.batch.groups]


def spec_file(path: Path) -> Path:
    """A spec's file from its folder or itself."""
    path = Path(path)
    return path / "spec.toml" if path.is_dir() else path


def load_spec(path: Path) -> Spec:
    path = spec_file(path)
    return validate(Spec, load_toml(path), path)
