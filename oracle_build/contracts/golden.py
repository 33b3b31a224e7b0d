"""Goldens (goldens/<name>/golden.json): prompts, tokens, top-k logprobs and the full
configuration they were captured under.

A golden is a pydantic model that forbids unknown keys. A golden carries its schema
version; a file from a newer oracle-build, or with an unknown schema, fails
clearly. The golden's JSON Schema is committed (schemas/golden.schema.json) and a
test keeps it in step with this model. Goldens are published atomically and never
overwritten: a replaced golden is kept under replaced/.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from oracle_build.contracts.base import (
    Logprob,
    SafeName,
    Sha256,
    Strict,
    TokenId,
    check_schema_number,
)
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.contracts.spec import Classification, EngineValue, GateSpec
from oracle_build.core.errors import BadInput, OutputFailed, Refused
from oracle_build.core.files import atomic_write_bytes, dumps_json, load_json, validate
from oracle_build.core.layout import stamp

# The configuration a golden must carry as resolved by the engine (BRIEF section 5; also
# vllm.cpp's attributed contract).
RESOLVED_KEYS = (
    "attention_backend", "block_size", "cudagraph_capture_sizes", "cudagraph_mode",
    "compilation_mode", "dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "enforce_eager", "gpu_memory_utilization", "kv_cache_dtype", "max_model_len",
    "max_num_batched_tokens", "max_num_seqs", "moe_backend", "num_gpu_blocks",
    "num_gpu_blocks_override", "quantization", "seed", "tensor_parallel_size")
GOLDEN_SCHEMA = 1


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


class EmbeddedPin(Strict):
    """The pin's own files, so a golden copied into another tree still names its oracle."""

    pin_name: str
    pin_toml: str
    lock_name: str | None = None
    lock_text: str | None = None


class OracleRecord(Strict):
    pin_id: str
    pin_hash: str
    pin_key: str
    target: str
    identity: dict[str, Any]
    build_record_sha256: str
    embedded_pin: EmbeddedPin | None = None


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


class ReplacedRecord(Strict):
    """What a re-baselined golden replaced, and why (capture --replace --reason)."""

    reason: str = Field(min_length=1)
    golden_sha256: Sha256  # the replaced file's bytes: the copy under replaced/ has this hash
    pin_hash: str | None = None
    pin_key: str | None = None
    vllm: str | None = None
    created_utc: str | None = None


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
    replaces: ReplacedRecord | None = None

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


def golden_file(path: Path) -> Path:
    """A golden's file from its folder or itself."""
    path = Path(path)
    return path / "golden.json" if path.is_dir() else path


def load_golden(path: Path) -> Golden:
    path = golden_file(path)
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
                          hint="--replace --reason TEXT writes the new one and keeps the old "
                          "under replaced/")
        kept = path.parent / "replaced" / f"{path.stem}.{stamp()}.json"
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

    def pin(self, path: Path, *, unpack_to: Path | None = None) -> Pin:
        """The golden's pin: the file its spec names relative to the golden's folder when
        it is there (the tree's current pin: if it changed since the capture, identity says
        so); otherwise the copy the golden carries (a golden copied into another tree),
        unpacked under ``unpack_to`` and checked against the recorded hash."""
        rel = self.spec.get("pin")
        if not isinstance(rel, str):
            raise BadInput(path, [("spec.pin", "missing")])
        pin_path = (path.parent / rel).resolve()
        embedded = self.oracle.embedded_pin
        if embedded is not None and unpack_to is not None:
            unpacked = unpack_pin(embedded, unpack_to / self.oracle.pin_key)
            pin = load_pin(unpacked)
            if pin.content_hash != self.oracle.pin_hash:
                raise BadInput(path, [("oracle.embedded_pin", f"hashes to {pin.content_hash}; "
                                       f"the golden records pin_hash {self.oracle.pin_hash}")],
                               hint="the golden was edited or damaged: re-capture it")
            if not pin_path.exists():
                return pin
        if not pin_path.exists():
            raise BadInput(path, [("spec.pin", f"{pin_path} not found, and the golden carries "
                                   "no copy of its pin (captured before goldens did)")],
                           hint="pass --pin FILE")
        return load_pin(pin_path)


def unpack_pin(embedded: EmbeddedPin, folder: Path) -> Path:
    """Write a golden's copy of its pin (and lock) into ``folder``; return the pin file."""
    for name in (embedded.pin_name, embedded.lock_name):
        if name is not None and ("/" in name or name.startswith(".")):
            raise BadInput(folder, [("oracle.embedded_pin", f"file name {name!r} is not a plain "
                                     "file name")])
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / embedded.pin_name, embedded.pin_toml.encode())
    if embedded.lock_name is not None and embedded.lock_text is not None:
        atomic_write_bytes(folder / embedded.lock_name, embedded.lock_text.encode())
    return folder / embedded.pin_name


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
