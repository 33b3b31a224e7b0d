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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Discriminator, Field, PrivateAttr, Tag, model_validator

from oracle_build.contracts.base import (
    Logprob,
    SafeName,
    Sha256,
    Strict,
    TokenId,
    check_schema_number,
)
from oracle_build.contracts.engine_keys import engine_problems
from oracle_build.contracts.spec import Classification, EngineValue, GateSpec
from oracle_build.contracts.topk import TopKTable
from oracle_build.core.env import spec_env_problems
from oracle_build.core.errors import BadInput
from oracle_build.core.files import (
    dumps_json,
    field_error,
    load_json,
    read_bytes,
    sha256_bytes,
    validate,
)

# The configuration a golden must carry as resolved by the engine (BRIEF section 5; also
# vllm.cpp's attributed contract).
RESOLVED_KEYS = (
    "attention_backend", "block_size", "cudagraph_capture_sizes", "cudagraph_mode",
    "compilation_mode", "dtype", "enable_chunked_prefill", "enable_prefix_caching",
    "enforce_eager", "gpu_memory_utilization", "kv_cache_dtype", "max_model_len",
    "max_num_batched_tokens", "max_num_seqs", "moe_backend", "num_gpu_blocks",
    "num_gpu_blocks_override", "quantization", "seed", "tensor_parallel_size")
# 1: top-k rows inline in golden.json; 2: in a safetensors sidecar (``topk``). Both read.
GOLDEN_SCHEMA = 2
TOPK_FILE = r"^topk\.[0-9a-f]{16}\.safetensors$"


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


class KernelVariantRecord(Strict):
    """The CPU kernel variant the engine ran under (CPU targets): as asked (a variant, or
    "native"), and as read back from the engine's own process: the kernel library it mapped,
    torch's dispatch level, and the variables the tool set for it."""

    requested: str | None
    resolved: str | None
    libraries: list[str] = Field(default_factory=list)
    torch_capability: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # every torch.cpu predicate the hold answered before vLLM was imported, with the answer
    # it gave (empty: the CPU's own answers, nothing held); None: not recorded (a golden
    # captured before issue 55)
    predicates: dict[str, bool] | None = None
    # what this CPU itself answered to each (context: another CPU answers otherwise)
    cpu_answers: dict[str, bool | None] | None = None


class RuntimeCompilerRecord(Strict):
    """The compiler the engine compiled its run-time kernels with (torch inductor's CXX), as
    the tool chose and gave it (engine/compiler.py), and the kernels it compiled and ran."""

    chosen_by: str
    path: str  # what the engine was given as CXX
    real_path: str
    version: str | None  # --version's first line
    # sha256 of the driver and of each program it runs (cc1plus, as, ld); None: none of its
    # own (clang's integrated cc1)
    tools: dict[str, Sha256 | None]
    march: str | None  # TORCHINDUCTOR_CPP_MARCH; None: inductor's -march=native
    # the shared libraries the engine mapped from its compile cache: "<cache>/<file>" -> sha256
    kernels: dict[str, Sha256] | None = None


class EngineRecord(Strict):
    requested: dict[str, EngineValue]
    resolved: dict[str, ReadValue | Unreadable]
    backends: dict[str, BackendValue | Unreadable]
    start_seconds: float | None = None
    # None: a golden captured before variants were held (its identity's cpu_variant says
    # which variant it ran, detected; it is held to that one)
    kernel_variant: KernelVariantRecord | None = None
    # None: a golden captured before the run-time compiler was an input (issue 63)
    compiler: RuntimeCompilerRecord | None = None


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
        same = all(leg == self.tokens[0] for leg in self.tokens)
        if self.agree != same:
            raise field_error("agree", f"{str(self.agree).lower()}, but the legs' tokens "
                              f"{'agree' if same else 'differ'}")
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


class TopKFile(Strict):
    """Golden format 2: every prompt's top-k rows in one safetensors file beside golden.json
    (oracle_build/topk.py says what it holds). Its name carries its hash, so a re-baseline
    never overwrites the file an older golden names."""

    file: str = Field(pattern=TOPK_FILE)
    sha256: Sha256
    bytes: int = Field(ge=8)
    rows: int = Field(ge=0)
    width: int = Field(ge=1)


class EmbeddedPin(Strict):
    """The pin's own files, so a golden copied into another tree still names its oracle."""

    pin_name: SafeName  # file names under the home: plain names, never a path
    pin_toml: str
    lock_name: SafeName | None = None
    lock_text: str | None = None


class OracleRecord(Strict):
    pin_id: str
    pin_hash: str
    pin_key: SafeName  # names the oracle's folder (and the unpacked pin's) under the home
    target: str
    identity: dict[str, Any]
    build_record_sha256: str
    # the oracle's content fingerprint (every wheel file's path and sha256, hashed): the same
    # for the same pin on any host; verify compares it (absent in goldens before it existed)
    content_fingerprint: Sha256 | None = None
    embedded_pin: EmbeddedPin | None = None


class RunRecord(Strict):
    host: dict[str, Any]
    created_utc: str
    command: list[str]
    tool: dict[str, Any]
    durations: dict[str, float]
    log: str | None = None
    # how the engine's network was: "closed (<how>)" or "open (<why>)"; None: a golden from
    # before it was closed (issue 63)
    network: str | None = None


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


def _oracle_kind(value: Any) -> str:
    """An imported golden's oracle states versions (``stated``); a captured one records its
    pin and identity. One is chosen, so errors name that one's fields only."""
    if isinstance(value, StatedOracle) or (isinstance(value, dict) and "stated" in value):
        return "stated"
    return "oracle"


# Fields a golden may leave null only when ``unrecorded`` says why.
NULLABLE = ("spec", "model", "engine", "environment", "batch", "legs", "logprobs", "run")


class MigrationRecord(Strict):
    """What a migration compared: the replaced golden's numbers against the new run's."""

    bit_for_bit: Literal[True]
    tokens: int = Field(ge=0)
    topk_cells: int = Field(ge=0)
    filled: list[str]  # the fields the replaced golden did not record that this one does


class ReplacedRecord(Strict):
    """What a re-baselined golden replaced, and why (capture --replace --reason)."""

    reason: str = Field(min_length=1)
    golden_sha256: Sha256  # the replaced file's bytes: the copy under replaced/ has this hash
    pin_hash: str | None = None
    pin_key: str | None = None
    vllm: str | None = None
    created_utc: str | None = None
    # capture --migrate: the new golden's run reproduced the replaced one's numbers bit for
    # bit (every token, every top-k id and logprob), so only what it records is new
    reproduced: MigrationRecord | None = None


class Golden(Strict):
    golden_schema: int
    name: SafeName
    spec: dict[str, Any] | None
    spec_sha256: Sha256 | None = None
    oracle: Annotated[Annotated[OracleRecord, Tag("oracle")] | Annotated[StatedOracle,
                                                                         Tag("stated")],
                      Discriminator(_oracle_kind)]
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
    # format 2: the top-k rows of every prompt, in a sidecar (prompts[].topk then null)
    topk: TopKFile | None = None
    _table: TopKTable | None = PrivateAttr(default=None)

    def topk_table(self) -> TopKTable | None:
        """Every prompt's top-k rows as one table (the sidecar's, or built from the inline
        rows); None when the golden records none."""
        if self._table is None and self.prompts and all(
                p.topk is not None for p in self.prompts):
            self._table = TopKTable.from_rows([p.topk or [] for p in self.prompts])
        return self._table

    def prompt_topk(self, index: int) -> Sequence[Sequence[Any]] | None:
        """Prompt ``index``'s rows, ``[[token_id, logprob], ...]`` per position."""
        if self.topk is not None and self._table is not None:
            return self._table.rows(index)
        return self.prompts[index].topk

    @property
    def configuration_recorded(self) -> bool:
        return self.engine is not None

    def _prompts_are_the_specs(self) -> None:
        """A prompt's recorded text (or ids) is the one its spec gave, the one a re-run sends:
        a text edited in prompts[] alone would be shown as the prompt of tokens it did not
        produce, and verify, which runs the spec's, would still say ``ids =``."""
        given = (self.spec or {}).get("prompts")
        if not isinstance(given, list):
            return
        by_id = {g.get("id"): g for g in given if isinstance(g, dict)}
        for n, p in enumerate(self.prompts):
            g = by_id.get(p.id)
            if g is None:
                continue
            if isinstance(g.get("text"), str) and p.text != g["text"]:
                raise field_error(f"prompts[{n}].text", "is not spec.prompts' text for "
                                  f"{p.id!r}, the text these tokens were captured from (and "
                                  "a re-run sends)")
            if isinstance(g.get("token_ids"), list) and p.prompt_token_ids != g["token_ids"]:
                raise field_error(f"prompts[{n}].prompt_token_ids", "are not spec.prompts' "
                                  f"token_ids for {p.id!r}, the ids these tokens were captured "
                                  "from (and a re-run sends)")

    @model_validator(mode="after")
    def _consistent(self) -> Golden:
        first: dict[str, int] = {}
        for n, p in enumerate(self.prompts):
            if p.id in first:
                raise field_error(f"prompts[{n}].id", f"{p.id!r} is also "
                                  f"prompts[{first[p.id]}].id: every prompt id is given once")
            first[p.id] = n
        calls = (self.batch or {}).get("calls")
        if calls is not None:  # which prompts went into which generate() call, by id
            if not isinstance(calls, list):
                raise field_error("batch.calls", "must be a list of generate() calls, each a "
                                  "list of prompt ids")
            for c, call in enumerate(calls):
                if not isinstance(call, list):
                    raise field_error(f"batch.calls[{c}]", f"{call!r} is not a list of prompt "
                                      "ids")
                for m, pid in enumerate(call):
                    if not isinstance(pid, str) or pid not in first:
                        raise field_error(f"batch.calls[{c}][{m}]", f"{pid!r} is not a prompt "
                                          "id of this golden")
        self._prompts_are_the_specs()
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
        if self.topk is not None:
            if self.golden_schema < 2:
                raise ValueError("topk (a sidecar) needs golden_schema 2")
            if any(p.topk is not None for p in self.prompts):
                raise ValueError("with a topk sidecar, prompts[].topk must be null")
        return self


def golden_file(path: Path) -> Path:
    """A golden's file from its folder or itself."""
    path = Path(path)
    return path / "golden.json" if path.is_dir() else path


def load_golden(path: Path) -> Golden:
    path = golden_file(path)
    data = load_json(path)
    check_schema_number(data, path, "golden_schema", GOLDEN_SCHEMA)
    golden = validate(Golden, data, path)
    if golden.topk is not None:
        golden._table = read_sidecar(golden, path)
    check_top1(golden, path)
    return golden


def greedy(golden: Golden) -> bool:
    temperature = golden.sampling.get("temperature", 0.0)
    return isinstance(temperature, int | float) and temperature == 0


def check_top1(golden: Golden, path: Path) -> None:
    """A greedy golden's token is its own top-1 at every position (any member of an exact tie
    is): the recorded rows and tokens must tell one story, or every margin read from them is
    wrong. Vectorized: a 2,000 x 256 golden is checked in milliseconds."""
    table = golden.topk_table()
    if table is None or not greedy(golden):
        return
    tokens = np.fromiter((t for p in golden.prompts for t in p.token_ids), dtype=np.int64)
    if len(tokens) != table.ids.shape[0] or len(tokens) == 0:
        return  # the sidecar's shape was checked against the prompts already
    hit = table.ids == tokens[:, None]
    with np.errstate(invalid="ignore"):
        token_lp = np.where(hit, table.logprobs, -np.inf).max(axis=1)
        best = table.logprobs[:, 0]
        ok = hit.any(axis=1) & (token_lp == best)
    if ok.all():
        return
    row = int(np.flatnonzero(~ok)[0])
    prompt = int(np.searchsorted(table.offsets, row, side="right") - 1)
    pos = row - int(table.offsets[prompt])
    got = "not in its row" if not hit[row].any() else f"logprob {float(token_lp[row])!r}"
    raise BadInput(path, [(f"prompts[{prompt}].token_ids[{pos}]",
                           f"token {int(tokens[row])} is not the top-1 of its recorded top-k "
                           f"row ({got}; top-1 {int(table.ids[row, 0])} at "
                           f"{float(best[row])!r}): a greedy golden's tokens are its argmax")],
                   hint="the golden was edited or damaged: re-capture it")


def read_sidecar(golden: Golden, path: Path) -> TopKTable:
    """A format-2 golden's top-k table, checked against the hash and shape it records."""
    ref = golden.topk
    assert ref is not None
    side = path.parent / ref.file
    if not (side.exists() or side.is_symlink()):
        raise BadInput(path, [("topk.file", f"{side} not found: a format-2 golden is its "
                               "golden.json and this file, copied together")])
    if side.is_symlink():
        # it could name any readable file, whose hash the refusal would then print
        raise BadInput(path, [("topk.file", f"{ref.file} is a symbolic link: a golden's top-k "
                               "file is a regular file beside its golden.json (capture writes "
                               "it so); refused, not followed")])
    data = read_bytes(side)
    got = sha256_bytes(data)
    if got != ref.sha256:
        raise BadInput(side, [("sha256", f"is {got}; {path.name} records {ref.sha256}")],
                       hint="the top-k file was edited or damaged: re-capture the golden")
    table = TopKTable.from_safetensors(data, side)
    problems = []
    if (table.ids.shape[0], table.width) != (ref.rows, ref.width):
        problems.append(("ids", f"{table.ids.shape[0]} rows x {table.width}; the golden "
                         f"records {ref.rows} x {ref.width}"))
    if table.prompts != len(golden.prompts):
        problems.append(("lengths", f"{table.prompts} prompts; the golden has "
                         f"{len(golden.prompts)}"))
    else:
        for p, n in zip(golden.prompts, table.lengths.tolist(), strict=True):
            if n != len(p.token_ids):
                problems.append(("lengths", f"prompt {p.id}: {n} rows for {len(p.token_ids)} "
                                 "tokens"))
                break
    if problems:
        raise BadInput(side, problems)
    return table


# Fields added to golden format 2 after it was published, left out of the file while they
# hold their default: a golden that does not use them reads (and diffs) as it did, and an
# oracle-build from before them still reads it.
LATER_DEFAULTS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("engine", "compiler"), None), (("run", "network"), None), (("gate", "bit_exact"), False),
    (("spec", "gate", "bit_exact"), False))


def golden_json(golden: Golden) -> str:
    data = golden.model_dump(mode="json", by_alias=True)
    for path, default in LATER_DEFAULTS:
        holder: Any = data
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and path[-1] in holder and holder[path[-1]] == default:
            del holder[path[-1]]
    return dumps_json(data)


def as_format2(golden: Golden) -> tuple[Golden, tuple[str, bytes] | None]:
    """The golden as written: its top-k rows in a sidecar (name, bytes) when it has any."""
    table = golden.topk_table()
    if table is None:
        return golden.model_copy(update={"golden_schema": GOLDEN_SCHEMA}), None
    blob = table.to_safetensors({"golden": golden.name})
    sha = sha256_bytes(blob)
    ref = TopKFile(file=f"topk.{sha[:16]}.safetensors", sha256=sha, bytes=len(blob),
                   rows=int(table.ids.shape[0]), width=table.width)
    out = golden.model_copy(update={
        "golden_schema": GOLDEN_SCHEMA, "topk": ref,
        "prompts": [p.model_copy(update={"topk": None}) for p in golden.prompts]})
    out._table = table
    return out, (ref.file, blob)


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

    @property
    def spec_env(self) -> dict[str, str]:
        """The capture spec's [env] (checked by ``recorded``): what the engine's environment
        held beyond what the tool builds, set again on every re-run."""
        return dict(self.spec.get("env") or {})

    @property
    def kernel_variant(self) -> str | None:
        """The CPU kernel variant the golden's engine ran under: as read from its process,
        or, for a golden captured before variants were held, the one its identity detected
        (it is held to that one). None: a target whose numbers do not depend on it."""
        if self.engine.kernel_variant is not None:
            return self.engine.kernel_variant.resolved
        variant = self.oracle.identity.get("cpu_variant")
        return variant if isinstance(variant, str) else None


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
    problems = spec_env_problems(golden.spec.get("env", {}), "spec.env")
    # the engine arguments it re-runs with: the same allow-list as a spec on disk (a golden
    # that records trust_remote_code or a class to import is refused, never run)
    problems += engine_problems(golden.spec.get("engine", {}), "spec.engine")
    problems += engine_problems(dict(golden.engine.requested), "engine.requested")
    if problems:  # verify runs the golden's spec: the same rules as a spec on disk
        raise BadInput(path, problems)
    return Recorded(golden, golden.oracle, golden.engine, golden.spec, golden.batch,
                    golden.environment, golden.logprobs)
