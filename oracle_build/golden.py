"""Capture specs (goldens/<name>/spec.toml) and goldens (goldens/<name>/golden.json).

Both are pydantic models that forbid unknown keys. A golden carries its schema
version; a file from a newer oracle-build, or with an unknown schema, fails
clearly. The golden's JSON Schema is committed (schemas/golden.schema.json) and a
test keeps it in step with this model. Goldens are published atomically and never
overwritten: a replaced golden is kept under replaced/.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from oracle_build.errors import BadInput, OutputFailed, Refused
from oracle_build.files import (
    atomic_write_bytes,
    dumps_json,
    load_json,
    load_toml,
    validate,
)

SPEC_SCHEMA = 1
# The configuration a golden must carry as resolved by the engine (BRIEF section 5; also
# vllm.cpp's attributed contract).
RESOLVED_KEYS = (
    "attention_backend", "block_size", "cudagraph_capture_sizes", "cudagraph_mode",
    "compilation_mode", "dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "enforce_eager", "gpu_memory_utilization", "kv_cache_dtype", "max_model_len",
    "max_num_batched_tokens", "max_num_seqs", "moe_backend", "num_gpu_blocks",
    "num_gpu_blocks_override", "quantization", "seed", "tensor_parallel_size")
GOLDEN_SCHEMA = 1
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_TOKEN_ID = 2**31 - 1


def _safe_name(value: str) -> str:
    if not SAFE_NAME.match(value) or value in (".", ".."):
        raise ValueError(f"{value!r} is not a safe name (letters, digits, '.', '_', '-'; "
                         "no slashes)")
    return value


def _sha256(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError("must be 64 lowercase hex digits (a sha256)")
    return value


SafeName = Annotated[str, AfterValidator(_safe_name)]
Sha256 = Annotated[str, AfterValidator(_sha256)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
EngineValue = bool | int | float | str | list[int] | list[str] | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- spec


class ModelSpec(Strict):
    generate: Literal["tiny-llama-v1"] | None = None
    path: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    files: dict[str, Sha256] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        sources = [s for s in (self.generate, self.path, self.repo_id) if s]
        if len(sources) != 1:
            raise ValueError("give exactly one of generate, path, repo_id")
        if self.repo_id and not (self.revision and re.fullmatch(r"[0-9a-f]{40}",
                                                                 self.revision)):
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
        for key in self.engine:
            if key in ("model", "tokenizer"):
                raise ValueError(f"engine.{key}: the model comes from [model], not engine")
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
                raise ValueError(f"engine key {key!r} is not an engine argument name")
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


def load_spec(path: Path) -> Spec:
    path = Path(path)
    if path.is_dir():
        path = path / "spec.toml"
    return validate(Spec, load_toml(path), path)


# ----------------------------------------------------------------------------- golden


def _finite(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("must be a finite number")
    return value


Logprob = Annotated[float, AfterValidator(_finite), Field(le=0.0)]


class Unreadable(Strict):
    unreadable: str


class ReadValue(Strict):
    value: Any
    # Where it was read: "vllm_config.<path>" or "engine log"; never the request.
    from_: str = Field(alias="from")


class BackendValue(Strict):
    value: list[str] | str | None
    layers: dict[str, int] | None = None
    note: str | None = None
    log: list[str] | None = None


class ModelRecord(Strict):
    source: str
    path: str
    revision: str | None
    files: dict[str, dict[str, Any]]
    architectures: list[str] | None
    tokenizer_sha256: str | None
    generation_config_sha256: str | None


class EngineRecord(Strict):
    requested: dict[str, EngineValue]
    resolved: dict[str, ReadValue | Unreadable]
    backends: dict[str, BackendValue | Unreadable]
    start_seconds: float | None = None


class LegsRecord(Strict):
    count: int = Field(ge=2)
    agree: bool
    # tokens[leg][prompt] = token ids
    tokens: list[list[list[TokenId]]]
    disagreements: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shape(self) -> LegsRecord:
        if len(self.tokens) != self.count:
            raise ValueError(f"count is {self.count} but tokens has {len(self.tokens)} legs")
        if len({len(t) for t in self.tokens}) > 1:
            raise ValueError("legs hold different numbers of prompts")
        return self


class PromptRecord(Strict):
    id: SafeName
    text: str | None
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    token_ids: list[TokenId]
    output_text: str | None
    finish_reason: str | None
    # topk[position] = [[token_id, logprob], ...], best first; None: the source recorded none
    topk: list[list[tuple[TokenId, Logprob]]] | None

    @model_validator(mode="after")
    def _shape(self) -> PromptRecord:
        if self.topk is None:
            return self
        if len(self.topk) != len(self.token_ids):
            raise ValueError(f"topk has {len(self.topk)} positions for "
                             f"{len(self.token_ids)} tokens")
        for pos, entries in enumerate(self.topk):
            if not entries:
                raise ValueError(f"topk[{pos}] is empty")
            lps = [lp for _t, lp in entries]
            if any(a < b for a, b in itertools.pairwise(lps)):
                raise ValueError(f"topk[{pos}] is not sorted best first")
        return self


class OracleRecord(Strict):
    pin_id: str
    pin_hash: str
    pin_key: str
    target: str
    identity: dict[str, Any]
    build_record_sha256: str


class RunRecord(Strict):
    host: dict[str, Any]
    created_utc: str
    command: list[str]
    tool: dict[str, Any]
    durations: dict[str, float]
    log: str | None = None


class StatedOracle(Strict):
    """An imported golden's oracle: only what its source states; no pin, no identity."""

    stated: dict[str, str]
    note: str


class ImportRecord(Strict):
    """Where an imported golden came from, and the source's own words, carried over."""

    format: Literal["vllm.cpp-legacy", "vllm.cpp-schema2", "vllm.cpp-battery"]
    path: str
    files: dict[str, Sha256]
    imported_utc: str
    tool: dict[str, Any]
    source_fields: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] | None = None


# Fields a golden may leave null only when ``unrecorded`` says why.
NULLABLE = ("spec", "model", "engine", "environment", "batch", "legs", "logprobs", "run")


class Golden(Strict):
    golden_schema: int
    name: SafeName
    spec: dict[str, Any] | None
    spec_sha256: Sha256 | None = None
    oracle: OracleRecord | StatedOracle
    model: ModelRecord | None
    engine: EngineRecord | None
    environment: dict[str, str] | None
    sampling: dict[str, Any]
    logprobs: int | None = Field(default=None, ge=1, le=20)
    batch: dict[str, Any] | None
    legs: LegsRecord | None
    nondeterministic: bool | None
    nondeterministic_cells: list[dict[str, Any]] = Field(default_factory=list)
    gate: GateSpec
    classification: dict[str, Classification] = Field(default_factory=dict)
    prompts: list[PromptRecord] = Field(min_length=1)
    run: RunRecord | None
    source: ImportRecord | None = None
    # field -> why it was not recorded (an imported golden carries its source's reasons)
    unrecorded: dict[str, str] = Field(default_factory=dict)

    @property
    def configuration_recorded(self) -> bool:
        return self.engine is not None

    @model_validator(mode="after")
    def _consistent(self) -> Golden:
        for name in NULLABLE:
            if getattr(self, name) is None and name not in self.unrecorded:
                raise ValueError(f"{name} is null but unrecorded gives no reason")
        if self.source is None and (self.engine is None or not isinstance(
                self.oracle, OracleRecord)):
            raise ValueError("a captured golden records its engine and its oracle")
        if self.legs is not None:
            if any(len(leg) != len(self.prompts) for leg in self.legs.tokens):
                raise ValueError("legs.tokens does not hold one entry per prompt")
            if self.nondeterministic != (not self.legs.agree):
                raise ValueError("nondeterministic must be true exactly when the legs disagree")
        if self.nondeterministic and self.gate.kind == "strict":
            raise ValueError("a non-deterministic golden cannot back a strict gate")
        return self


def check_schema_number(data: Any, path: Path, key: str, supported: int) -> None:
    if not isinstance(data, dict):
        raise BadInput(path, [("<top level>", "expected a JSON object")])
    number = data.get(key)
    if not isinstance(number, int) or isinstance(number, bool):
        raise BadInput(path, [(key, "missing or not an integer: not a golden of this tool")])
    if number > supported:
        raise BadInput(path, [(key, f"schema {number} is newer than this oracle-build reads "
                               f"({supported}); upgrade oracle-build")])
    if number < 1:
        raise BadInput(path, [(key, f"unknown schema {number}")])


def load_golden(path: Path) -> Golden:
    path = Path(path)
    if path.is_dir():
        path = path / "golden.json"
    data = load_json(path)
    check_schema_number(data, path, "golden_schema", GOLDEN_SCHEMA)
    return validate(Golden, data, path)


def golden_json(golden: Golden) -> str:
    return dumps_json(golden.model_dump(mode="json", by_alias=True))


def publish(golden: Golden, path: Path, *, replace: bool) -> Path | None:
    """Write ``golden`` to ``path`` atomically. Never overwrites: with ``replace`` the old
    file is first moved to replaced/<name>.<utc>.json and kept. Returns where it went."""
    data = golden_json(golden).encode()
    try:
        return _publish(data, path, replace=replace)
    except OSError as exc:
        raise OutputFailed(f"cannot write {path}: {exc.strerror or exc}; nothing was written "
                           "(the golden is published whole or not at all)",
                           hint="check the folder's permissions and free space") from None


def _publish(data: bytes, path: Path, *, replace: bool) -> Path | None:
    kept: Path | None = None
    if path.exists():
        if not replace:
            raise Refused(f"{path} exists; a golden is never overwritten",
                          hint="--replace writes the new one and keeps the old under replaced/")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = path.parent / "replaced" / f"{path.stem}.{stamp}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        path.rename(kept)
    try:
        atomic_write_bytes(path, data, overwrite=False)
    except FileExistsError:
        raise Refused(f"{path} appeared while this capture ran (another capture?); "
                      "nothing overwritten") from None
    return kept


@dataclass(frozen=True)
class Recorded:
    """A golden whose configuration was recorded: what re-running it needs, typed."""

    golden: Golden
    oracle: OracleRecord
    engine: EngineRecord
    spec: dict[str, Any]
    batch: dict[str, Any]
    environment: dict[str, str]
    logprobs: int


def recorded(golden: Golden, path: Path) -> Recorded:
    """The golden's recorded configuration, or a clear refusal naming what is unrecorded."""
    missing = [(name, golden.unrecorded.get(name, "not recorded")) for name in
               ("engine", "spec", "batch", "environment", "logprobs")
               if getattr(golden, name) is None]
    if not isinstance(golden.oracle, OracleRecord):
        missing.insert(0, ("oracle", "no pin or identity recorded: " + golden.oracle.note))
    if missing:
        raise BadInput(path, [(f, f"unrecorded ({why})"[:300]) for f, why in missing],
                       hint="CONFIGURATION UNRECORDED: this golden cannot be re-run; "
                       "re-capture it under a recorded configuration")
    assert isinstance(golden.oracle, OracleRecord) and golden.engine is not None
    assert golden.spec is not None and golden.batch is not None
    assert golden.environment is not None and golden.logprobs is not None
    return Recorded(golden, golden.oracle, golden.engine, golden.spec, golden.batch,
                    golden.environment, golden.logprobs)
