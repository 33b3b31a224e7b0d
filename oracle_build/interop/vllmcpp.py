"""vllm.cpp's golden formats: import them as they are, export ours into them.

Formats (see ../shared/interop/vllm.cpp/README.md):
- legacy ``oracle.json``: seven keys (vllm, transformers, flashinfer, model, revision,
  sampling{temperature,max_tokens}, golden[{prompt,prompt_token_ids,token_ids,text}]);
- ``oracle.json`` with a schema-2 ``capture`` block, "unattributed"
  (engine_config_recorded=false, engine/batch/legs null, prose reasons) or "attributed"
  (engine{profile,resolved{20 keys},torch,device}, batch{shape,prompts}, legs>=2,
  legs_agree=true);
- a greedy battery folder: greedy_ids.npy int32 [N,T] (run 0), greedy_dist.npy int32
  [N,T,K] (K runs, -1 pads short runs), p{i}_prompt.i32 (raw little-endian int32), and
  optionally our_ids.npy [N,T] (a candidate) and neartie_gap_mnats.npy [N,T]. Our export
  adds topk_ids.npy int32 [N,T,W] and topk_logprobs.npy float [N,T,W] (run 0's top-k plus
  the sampled token, best first; -1 and NaN pad), which import reads back: a battery
  round trip keeps the margins.

Import never invents a value: what the source did not record is ``unrecorded`` with the
source's own reasons, and the source files' sha256 are kept as provenance.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from oracle_build import goldens, host, judge
from oracle_build.contracts.base import MAX_TOKEN_ID, SAFE_NAME, Strict, TokenId
from oracle_build.contracts.golden import (
    GOLDEN_SCHEMA,
    RESOLVED_KEYS,
    EngineRecord,
    Golden,
    ImportRecord,
    LegsRecord,
    ModelRecord,
    PromptRecord,
    ReadValue,
    StatedOracle,
    recorded,
)
from oracle_build.contracts.spec import GateSpec
from oracle_build.contracts.topk import TopKTable
from oracle_build.core.errors import BadInput, OutputFailed, Refused
from oracle_build.core.files import (
    atomic_write_bytes,
    dumps_json,
    field_error,
    field_path,
    load_json,
    read_bytes,
    require_regular,
    sha256_file,
    validate,
)
from oracle_build.core.layout import utc_now

LEGACY_KEYS = {"vllm", "transformers", "flashinfer", "model", "revision", "sampling", "golden"}
RESOLVED_20 = RESOLVED_KEYS
NULLABLE_RESOLVED = {"num_gpu_blocks_override"}
PAD = -1
TOPK_IDS, TOPK_LOGPROBS = "topk_ids.npy", "topk_logprobs.npy"


class LegacySampling(Strict):
    temperature: float
    max_tokens: int = Field(ge=1)


class LegacyPrompt(Strict):
    prompt: str
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    token_ids: list[TokenId]
    text: str


class CaptureBlock(BaseModel):
    """Schema 2's capture block. Its prose keys vary, so unknown keys are carried over;
    the keys the format defines are checked."""

    model_config = ConfigDict(extra="allow", frozen=True)
    schema_: Literal[2] = Field(alias="schema")  # the one schema with a capture block
    engine_config_recorded: bool = Field(strict=True)
    engine: dict[str, Any] | None = None
    batch: dict[str, Any] | None = None
    legs: int | None = Field(default=None, ge=1, strict=True)
    legs_agree: bool | None = Field(default=None, strict=True)

    @model_validator(mode="after")
    def _shapes(self) -> CaptureBlock:
        if self.engine is not None:
            resolved = self.engine.get("resolved")
            if resolved is not None and not isinstance(resolved, dict):
                raise field_error("engine.resolved", "must be an object (setting -> value)")
        if self.batch is not None and "prompts" in self.batch:
            calls = self.batch["prompts"]
            if not isinstance(calls, list):
                raise field_error("batch.prompts", "must be a list of generate() calls, each "
                                  "a list of prompt indices")
            for c, call in enumerate(calls):
                members = call if isinstance(call, list) else [call]
                for m, idx in enumerate(members):
                    where = f"batch.prompts[{c}][{m}]" if isinstance(call, list) \
                        else f"batch.prompts[{c}]"
                    if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
                        raise field_error(where, f"{idx!r} is not a prompt index (an integer "
                                          ">= 0)")
        return self


class OracleJson(Strict):
    vllm: str
    transformers: str
    flashinfer: str
    model: str
    revision: str
    sampling: LegacySampling
    capture: CaptureBlock | None = None
    golden: list[LegacyPrompt] = Field(min_length=1)

    @model_validator(mode="after")
    def _batch_names_every_prompt_once(self) -> OracleJson:
        batch = self.capture.batch if self.capture is not None else None
        if not batch or "prompts" not in batch:
            return self
        seen: list[int] = []
        for c, call in enumerate(batch["prompts"]):
            for m, idx in enumerate(call if isinstance(call, list) else [call]):
                where = (f"capture.batch.prompts[{c}][{m}]" if isinstance(call, list)
                         else f"capture.batch.prompts[{c}]")
                if idx >= len(self.golden):
                    raise field_error(where, f"prompt {idx} does not exist (golden holds "
                                      f"{len(self.golden)})")
                seen.append(idx)
        if sorted(seen) != list(range(len(self.golden))):
            raise field_error("capture.batch.prompts", f"names prompts {sorted(seen)}: the "
                              f"batch composition names each of the {len(self.golden)} "
                              "prompts exactly once")
        return self


def attributed_problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's contract for schema 2's attributed state, as (field, problem)."""
    cap = data.get("capture")
    if not isinstance(cap, dict):
        return [("capture", "missing")]
    out = []
    if cap.get("schema") != 2:
        out.append(("capture.schema", "must be 2"))
    if cap.get("engine_config_recorded") is not True:
        out.append(("capture.engine_config_recorded", "must be true"))
    engine = cap.get("engine")
    if not isinstance(engine, dict):
        return [*out, ("capture.engine", "must be an object")]
    for key in ("profile", "resolved", "torch", "device"):
        if key not in engine:
            out.append((f"capture.engine.{key}", "missing"))
    resolved = engine.get("resolved") or {}
    for key in RESOLVED_20:
        if key not in resolved:
            out.append((f"capture.engine.resolved.{key}", "missing"))
        elif resolved[key] is None and key not in NULLABLE_RESOLVED:
            out.append((f"capture.engine.resolved.{key}", "null (only "
                        "num_gpu_blocks_override may be)"))
    batch = cap.get("batch")
    if not (isinstance(batch, dict) and "shape" in batch and "prompts" in batch):
        out.append(("capture.batch", "must hold shape and prompts"))
    legs = cap.get("legs")
    if not (isinstance(legs, int) and not isinstance(legs, bool) and legs >= 2):
        out.append(("capture.legs", "must be an integer >= 2"))
    if cap.get("legs_agree") is not True:
        out.append(("capture.legs_agree", "must be true"))
    return out


# ----------------------------------------------------------------------------- reading


def _load_npy(path: Path, ndim: int, *, floating: bool = False) -> np.ndarray:
    """An array of ``ndim`` dimensions; integers must lie in [-1, 2**31 - 1] (token ids, -1
    padding, mnats), checked in the file's own dtype before any cast: a uint64 2**64 - 1
    would otherwise wrap to -1, which reads as padding."""
    require_regular(path)
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # a corrupt header fails in numpy's parser in many ways
        raise BadInput(path, [("<file>", f"not a readable .npy array "
                               f"({type(exc).__name__}: {exc})"[:300])]) from None
    kind = np.floating if floating else np.integer
    if not np.issubdtype(arr.dtype, kind):
        raise BadInput(path, [("dtype", f"expected {'a float' if floating else 'an integer'} "
                               f"array, found {arr.dtype}")])
    if arr.ndim != ndim:
        raise BadInput(path, [("shape", f"expected {ndim} dimensions, found {arr.shape}")])
    if not floating and arr.size:
        low, high = arr.min(), arr.max()
        if low < PAD or high > MAX_TOKEN_ID:
            at = np.unravel_index(int(np.argmax((arr < PAD) | (arr > MAX_TOKEN_ID))), arr.shape)
            raise BadInput(path, [(f"[{','.join(str(int(i)) for i in at)}]",
                                   f"value {arr[at]} out of range (token ids are "
                                   f"0..{MAX_TOKEN_ID}, -1 pads)")])
    out: np.ndarray = arr.astype(np.float64 if floating else np.int64)
    return out


def _row(values: np.ndarray, path: Path, where: str) -> list[int]:
    """A token row without its -1 padding (padding only at the end)."""
    row = [int(v) for v in values]
    if PAD in row:
        cut = row.index(PAD)
        if any(v != PAD for v in row[cut:]):
            raise BadInput(path, [(where, "-1 padding in the middle of a row")])
        row = row[:cut]
    if any(v < 0 for v in row):
        raise BadInput(path, [(where, "negative token id other than -1 padding")])
    return row


@dataclass(frozen=True)
class Battery:
    """A vllm.cpp battery folder, read and checked: each prompt's ids, the oracle's greedy
    tokens, its K runs (``greedy_dist.npy``) and their agreement, the candidate's ids (and
    near-tie gaps) when the folder has them, the top-k rows, and every file read."""

    prompts: list[list[int]]
    tokens: list[list[int]]
    legs: list[list[list[int]]]
    agreement: judge.LegAgreement
    candidate: dict[str, Any] | None  # our_ids.npy (neartie_gap_mnats.npy), as imported
    files: dict[str, Path]
    shape: tuple[int, int, int]  # N prompts, T positions, K runs
    topk: TopKTable | None


def read_battery(folder: Path) -> Battery:
    ids_path, dist_path = folder / "greedy_ids.npy", folder / "greedy_dist.npy"
    for p in (ids_path, dist_path):
        if not p.is_file():
            raise BadInput(folder, [(p.name, "missing: a battery needs greedy_ids.npy and "
                                     "greedy_dist.npy")])
    ids = _load_npy(ids_path, 2)
    dist = _load_npy(dist_path, 3)
    n, t = ids.shape
    if dist.shape[:2] != (n, t):
        raise BadInput(dist_path, [("shape", f"{dist.shape} does not match greedy_ids.npy "
                                    f"{ids.shape} as [N,T,K]")])
    k = dist.shape[2]
    if n < 1 or k < 1:
        raise BadInput(dist_path, [("shape", f"empty battery {dist.shape}")])
    files = {"greedy_ids.npy": ids_path, "greedy_dist.npy": dist_path}
    prompts = []
    for i in range(n):
        p = folder / f"p{i}_prompt.i32"
        if not (p.exists() or p.is_symlink()):
            raise BadInput(folder, [(p.name, f"missing: greedy_ids.npy has {n} prompts")])
        raw = read_bytes(p)
        if not raw or len(raw) % 4:
            raise BadInput(p, [("size", f"{len(raw)} bytes is not a non-empty whole number of "
                                "int32 values")])
        toks = np.frombuffer(raw, dtype="<i4")
        if (toks < 0).any():
            raise BadInput(p, [("values", "negative token id")])
        prompts.append([int(x) for x in toks])
        files[p.name] = p
    extra = folder / f"p{n}_prompt.i32"
    if extra.exists():
        raise BadInput(extra, [("count", f"more prompt files than greedy_ids.npy's {n} rows")])
    candidate: dict[str, Any] | None = None
    our_path, gap_path = folder / "our_ids.npy", folder / "neartie_gap_mnats.npy"
    if our_path.is_file():
        our = _load_npy(our_path, 2)
        if our.shape != (n, t):
            raise BadInput(our_path, [("shape", f"{our.shape}, greedy_ids.npy is {ids.shape}")])
        files[our_path.name] = our_path
        candidate = {"token_ids": [_row(our[i], our_path, f"row {i}") for i in range(n)]}
        if gap_path.is_file():
            gap = _load_npy(gap_path, 2)
            if gap.shape != (n, t):
                raise BadInput(gap_path, [("shape", f"{gap.shape}, greedy_ids.npy is "
                                           f"{ids.shape}")])
            if (gap < 0).any():
                raise BadInput(gap_path, [("values", "negative gap")])
            files[gap_path.name] = gap_path
            candidate["neartie_gap_mnats"] = gap.tolist()
    elif gap_path.is_file():
        raise BadInput(gap_path, [("our_ids.npy", "a gap file needs the candidate's ids")])
    tokens = [_row(ids[i], ids_path, f"row {i}") for i in range(n)]
    legs = [[_row(dist[i, :, j], dist_path, f"[{i},:,{j}]") for i in range(n)]
            for j in range(k)]
    topk_ids, topk_lps = folder / TOPK_IDS, folder / TOPK_LOGPROBS
    table: TopKTable | None = None
    if topk_ids.is_file() != topk_lps.is_file():
        raise BadInput(folder, [(TOPK_IDS if not topk_ids.is_file() else TOPK_LOGPROBS,
                                 f"missing: {TOPK_IDS} and {TOPK_LOGPROBS} come together")])
    if topk_ids.is_file():
        lps = _load_npy(topk_lps, 3, floating=True)
        table = TopKTable.from_padded(_load_npy(topk_ids, 3), lps,
                                      [len(t_) for t_ in tokens], topk_ids)
        files[TOPK_IDS], files[TOPK_LOGPROBS] = topk_ids, topk_lps
    agreement = judge.legs_agreement(legs, [f"p{i}" for i in range(n)])
    return Battery(prompts=prompts, tokens=tokens, legs=legs, agreement=agreement,
                   candidate=candidate, files=files, shape=(n, t, k), topk=table)


def _oracle_json(path: Path) -> tuple[dict[str, Any], OracleJson]:
    data = load_json(path)
    if not isinstance(data, dict):
        raise BadInput(path, [("<top level>", "expected a JSON object")])
    keys = set(data)
    if not keys >= LEGACY_KEYS:
        raise BadInput(path, [("<top level>", f"no known format: a vllm.cpp oracle.json has "
                               f"{sorted(LEGACY_KEYS)} (+capture); found {sorted(keys)[:12]}")])
    return data, validate(OracleJson, data, path)


def detect(path: Path) -> str:
    if path.is_dir():
        if (path / "greedy_ids.npy").exists() or (path / "greedy_dist.npy").exists():
            return "battery"
        if (path / "oracle.json").is_file():
            return "oracle.json"
        raise BadInput(path, "no known format: expected oracle.json or a greedy battery "
                       "(greedy_ids.npy, greedy_dist.npy, p{i}_prompt.i32)")
    if path.suffix == ".json":
        return "oracle.json"
    if path.suffix == ".npy":
        return "battery"
    raise BadInput(path, "no known format: expected oracle.json or a battery folder")


def import_path(path: Path, *, name: str | None = None) -> Golden:
    """Read any vllm.cpp golden at ``path`` into our golden format."""
    path = Path(path)
    if not path.exists():
        raise BadInput(path, "not found")
    kind = detect(path)
    if kind == "battery" and path.is_file():
        path = path.parent
    folder = path if path.is_dir() else path.parent
    golden_name = name or folder.name.replace(" ", "_")
    if not SAFE_NAME.match(golden_name):
        raise BadInput(path, [("name", f"{golden_name!r} is not a safe golden name; pass "
                               "--name")])
    battery = read_battery(folder) if kind == "battery" else None
    oracle_file = (folder / "oracle.json") if path.is_dir() else path
    doc = _oracle_json(oracle_file) if oracle_file.is_file() else None
    files: dict[str, str] = {}
    if battery is not None:
        files.update({k: sha256_file(v) for k, v in battery.files.items()})
    if doc:
        files[oracle_file.name] = sha256_file(oracle_file)
    where = folder if path.is_dir() else path
    try:
        return _build(golden_name, where, doc, battery, files)
    except ValidationError as exc:  # a value the source holds that our format refuses
        raise BadInput(where, [(field_path(e["loc"]), e["msg"])
                               for e in exc.errors(include_url=False)][:10]) from None


@dataclass
class _Half:
    """What one half of a vllm.cpp golden states (oracle.json, or the battery files)."""

    fmt: str
    oracle: StatedOracle
    model: ModelRecord | None
    sampling: dict[str, Any]
    prompts: list[PromptRecord]
    source_fields: dict[str, Any]
    unrecorded: dict[str, str]


def _from_oracle_json(raw: dict[str, Any], oj: OracleJson) -> _Half:
    stated = {"vllm": oj.vllm, "transformers": oj.transformers, "flashinfer": oj.flashinfer}
    return _Half(
        fmt="vllm.cpp-schema2" if oj.capture else "vllm.cpp-legacy",
        oracle=StatedOracle(stated=stated, note="versions as the source states them; it "
                            "names no pin and records no identity check"),
        model=ModelRecord(source=f"path:{oj.model}", path=oj.model, revision=oj.revision,
                          files={}, architectures=None, tokenizer_sha256=None,
                          generation_config_sha256=None),
        sampling=oj.sampling.model_dump(),
        prompts=[PromptRecord(id=f"p{i}", text=g.prompt, prompt_token_ids=g.prompt_token_ids,
                              token_ids=g.token_ids, output_text=g.text, finish_reason=None,
                              topk=None) for i, g in enumerate(oj.golden)],
        source_fields={k: v for k, v in raw.items() if k != "golden"},
        unrecorded={"model.files": "the source names the checkpoint and its revision, and "
                    "hashes no file"})


def _from_battery(battery: Battery) -> _Half:
    return _Half(
        fmt="vllm.cpp-battery",
        oracle=StatedOracle(stated={}, note="a battery records no versions, pin or identity"),
        model=None, sampling={},
        prompts=[PromptRecord(id=f"p{i}", text=None, prompt_token_ids=ids,
                              token_ids=battery.tokens[i], output_text=None,
                              finish_reason=None, topk=None)
                 for i, ids in enumerate(battery.prompts)],
        source_fields={},
        unrecorded={"model": "a battery records no model",
                    "sampling": "a battery records no sampling parameters"})


def _same_story(prompts: list[PromptRecord], battery: Battery, path: Path) -> None:
    """Our own export holds both halves: they must tell the same story."""
    for i, p in enumerate(prompts):
        if i >= len(battery.prompts) or battery.prompts[i] != p.prompt_token_ids \
                or battery.tokens[i] != p.token_ids:
            raise BadInput(path, [(f"golden[{i}]", "oracle.json and the battery disagree "
                                   "on this prompt's ids or tokens")])
    if len(battery.prompts) != len(prompts):
        raise BadInput(path, [("golden", "oracle.json and the battery hold different "
                               "numbers of prompts")])


def _engine_and_batch(cap: CaptureBlock | None, prompts: list[PromptRecord], legacy: bool,
                      unrecorded: dict[str, str]) -> tuple[EngineRecord | None,
                                                           dict[str, Any] | None]:
    if cap is not None and cap.engine_config_recorded and cap.engine:
        eng = cap.engine
        resolved = {k: ReadValue.model_validate({"value": v, "from": "vllm.cpp capture."
                                                 "engine.resolved"})
                    for k, v in (eng.get("resolved") or {}).items()}
        unrecorded["engine.requested"] = f"the source names a profile ({eng.get('profile')}) " \
            "but not its arguments"
        batch = {"shape": (cap.batch or {}).get("shape"),
                 "calls": [[prompts[i].id for i in c] if isinstance(c, list) else [c]
                           for c in (cap.batch or {}).get("prompts", [])]}
        return EngineRecord(requested={}, resolved=resolved, backends={}), batch
    if cap is not None:
        unrecorded["engine"] = str(getattr(cap, "unrecoverable_reason", None) or
                                   "engine_config_recorded is false")
    else:
        unrecorded["engine"] = ("the legacy format records no engine setting at all" if legacy
                                else "a battery records no engine setting")
    unrecorded["batch"] = "the source records no batch composition (see engine)"
    return None, None


def _legs(battery: Battery | None, cap: CaptureBlock | None,
          unrecorded: dict[str, str]) -> tuple[LegsRecord | None, bool | None,
                                               list[dict[str, Any]]]:
    """The repeated runs: (legs, non-deterministic, the cells where they differ)."""
    if battery is not None:
        agreement = battery.agreement
        legs = None
        if len(battery.legs) >= 2:
            legs = LegsRecord(count=len(battery.legs), agree=agreement.agree,
                              tokens=battery.legs, disagreements=agreement.disagreements)
        else:
            unrecorded["legs"] = "the battery holds a single run"
        return legs, not agreement.agree, agreement.cells
    if cap is not None and cap.legs is not None:
        unrecorded["legs"] = f"the source records legs={cap.legs}, legs_agree=" \
            f"{cap.legs_agree}, and no per-leg tokens"
        return None, (not cap.legs_agree) if cap.legs_agree is not None else None, []
    unrecorded["legs"] = "the source records no repeated runs"
    return None, None, []


def _build(name: str, path: Path, doc: tuple[dict[str, Any], OracleJson] | None,
           battery: Battery | None, files: dict[str, str]) -> Golden:
    """One golden from oracle.json (``doc``), the battery files, or both (our own export)."""
    if doc is not None:
        half = _from_oracle_json(*doc)
        if battery is not None:
            _same_story(half.prompts, battery, path)
    else:
        assert battery is not None
        half = _from_battery(battery)
    cap = doc[1].capture if doc else None
    unrecorded = half.unrecorded
    table = battery.topk if battery is not None else None
    if table is None:
        unrecorded["topk"] = "the source records no logprobs"
    engine, batch = _engine_and_batch(cap, half.prompts, doc is not None, unrecorded)
    legs, nondet, cells = _legs(battery, cap, unrecorded)
    for field, why in (("spec", "imported: there is no capture spec"),
                       ("environment", "the source records no environment"),
                       ("logprobs", "the source records no logprobs"),
                       ("run", "the source records no run of oracle-build")):
        unrecorded.setdefault(field, why)
    if table is not None:
        unrecorded["logprobs"] = (f"the source's {TOPK_IDS} holds up to {table.width} entries "
                                  "per position (top-k plus the sampled token) and states no k")
    source = ImportRecord(format=half.fmt, path=str(path.resolve()), files=files,
                          imported_utc=utc_now(), tool=host.tool_facts(),
                          source_fields=half.source_fields,
                          candidate=battery.candidate if battery is not None else None)
    golden = Golden(golden_schema=GOLDEN_SCHEMA, name=name, spec=None, oracle=half.oracle,
                    model=half.model, engine=engine, environment=None, sampling=half.sampling,
                    logprobs=None, batch=batch, legs=legs, nondeterministic=nondet,
                    nondeterministic_cells=cells,
                    gate=GateSpec(kind="distributional" if nondet else "strict"),
                    prompts=half.prompts, run=None, source=source, unrecorded=unrecorded)
    golden._table = table
    return golden


def import_to(path: Path, out: Path, *, name: str | None = None) -> Path:
    golden = import_path(path, name=name)
    dest = out / golden.name / "golden.json"
    goldens.publish(golden, dest, replace=False)
    return dest


# ----------------------------------------------------------------------------- writing


def export(golden: Golden, golden_path: Path, dest: Path) -> Path:
    """Write a battery and an attributed oracle.json for vllm.cpp's C++ tests."""
    rec = recorded(golden, golden_path)
    legs = golden.legs
    if legs is None or not legs.agree:
        raise Refused(f"{golden_path}: the legs disagree (or were not recorded); vllm.cpp's "
                      "attributed contract needs legs_agree=true")
    if dest.exists():
        raise Refused(f"{dest} exists; export never overwrites")
    resolved: dict[str, Any] = {}
    for key in RESOLVED_20:
        item = rec.engine.resolved.get(key)
        value = getattr(item, "value", None) if item is not None else None
        if key == "attention_backend" and value is None:
            chosen = rec.engine.backends.get("attention")
            value = getattr(chosen, "value", None)
            value = ",".join(value) if isinstance(value, list) else value
        if key == "quantization" and item is not None and hasattr(item, "value") and \
                value is None:
            value = "none"  # vLLM's None means unquantized; the contract forbids null here
        if value is None and key not in NULLABLE_RESOLVED:
            why = getattr(item, "unreadable", "null")
            raise Refused(f"{golden_path}: engine.resolved.{key} has no value ({why}); the "
                          "attributed contract needs it")
        resolved[key] = value
    n = len(golden.prompts)
    t = max(len(p.token_ids) for p in golden.prompts)
    ids = np.full((n, t), PAD, dtype=np.int32)
    dist = np.full((n, t, legs.count), PAD, dtype=np.int32)
    for i, p in enumerate(golden.prompts):
        ids[i, : len(p.token_ids)] = p.token_ids
        for j, leg in enumerate(legs.tokens):
            dist[i, : len(leg[i]), j] = leg[i]
    index = {p.id: i for i, p in enumerate(golden.prompts)}
    ident = rec.oracle.identity
    oracle_json = {
        "vllm": ident.get("vllm"),
        "transformers": ident.get("transformers"),
        "flashinfer": ident.get("flashinfer") or "none",
        "model": golden.model.path if golden.model else None,
        "revision": (golden.model.revision if golden.model and golden.model.revision else
                     (golden.model.files.get("model.safetensors", {}).get("sha256")
                      if golden.model else None)),
        "sampling": {"temperature": golden.sampling.get("temperature"),
                     "max_tokens": golden.sampling.get("max_tokens")},
        "capture": {
            "schema": 2,
            "generator": f"oracle-build {golden.run.tool.get('version') if golden.run else ''}"
                         f" (golden {golden.name})",
            "captured_utc": golden.run.created_utc if golden.run else None,
            "host": (golden.run.host.get("hostname") if golden.run else None),
            "engine_config_recorded": True,
            "engine": {"profile": golden.name, "resolved": resolved,
                       "torch": ident.get("torch"), "device": ident.get("device")},
            "batch": {"shape": rec.batch.get("mode"),
                      "prompts": [[index[pid] for pid in call] for call in rec.batch["calls"]]},
            "legs": legs.count,
            "legs_agree": True,
        },
        "golden": [{"prompt": p.text or "", "prompt_token_ids": p.prompt_token_ids,
                    "token_ids": p.token_ids, "text": p.output_text or ""}
                   for p in golden.prompts],
    }
    problems = attributed_problems(oracle_json)
    if problems:  # never write a file that breaks the contract
        raise Refused(f"{golden_path}: cannot satisfy vllm.cpp's attributed contract: "
                      + "; ".join(f"{f}: {m}" for f, m in problems))
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    except OSError as exc:
        raise OutputFailed(f"cannot write {dest}: {exc.strerror or exc} "
                           f"({exc.filename or dest.parent}); nothing was written") from None
    try:
        np.save(tmp / "greedy_ids.npy", ids)
        np.save(tmp / "greedy_dist.npy", dist)
        table = golden.topk_table()
        if table is not None:
            topk_ids, topk_lps = table.to_padded(t)
            np.save(tmp / TOPK_IDS, topk_ids)
            np.save(tmp / TOPK_LOGPROBS, topk_lps)
        for i, p in enumerate(golden.prompts):
            (tmp / f"p{i}_prompt.i32").write_bytes(
                np.asarray(p.prompt_token_ids, dtype="<i4").tobytes())
        atomic_write_bytes(tmp / "oracle.json", dumps_json(oracle_json).encode())
        tmp.rename(dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputFailed(f"cannot write {dest}: {exc.strerror or exc}; nothing was "
                           "written") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest

