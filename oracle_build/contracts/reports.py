"""The reports oracle-build writes: verify's and explain's. Their JSON Schemas are committed
(contracts/schemas/); the models live here with the other contracts, so writing a schema
imports no engine or build code."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from oracle_build.contracts.base import Strict

VERIFY_REPORT_SCHEMA = 1
EXPLAIN_SCHEMA = 1


# ----------------------------------------------------------------------------- verify

Status = Literal["pass", "drift", "config_difference", "config_unrecorded",
                 "oracle_mismatch", "not_verifiable_here"]


class FieldDiff(Strict):
    field: str
    golden: Any
    current: Any
    cls: Literal["numerics", "context", "identity"]


class GateVerdict(Strict):
    kind: str
    admissible: bool
    reason: str
    passed: bool | None


class GoldenVerdict(Strict):
    name: str
    path: str
    status: Status
    why: str = ""
    notes: list[str] = Field(default_factory=list)
    identity: list[FieldDiff] = Field(default_factory=list)
    configuration: list[FieldDiff] = Field(default_factory=list)
    context: list[FieldDiff] = Field(default_factory=list)
    adjudicable: bool = True
    tokens: list[dict[str, Any]] = Field(default_factory=list)
    summary: str = ""
    gate: GateVerdict | None = None
    # Beyond tokens: are the re-run's top-k logprobs bit-identical to the golden's (None when
    # nothing was run), and where they first differ.
    logprobs_identical: bool | None = None
    logprobs_difference: dict[str, Any] | None = None


class VerifyReport(Strict):
    report_schema: int
    created_utc: str
    exit_code: int
    goldens: list[GoldenVerdict]


# ----------------------------------------------------------------------------- diff

DIFF_REPORT_SCHEMA = 1
DiffVerdict = Literal["same", "moved at near-ties only", "moved", "not run",
                      "engine failed on A", "engine failed on B"]


class OracleSide(Strict):
    pin_id: str
    pin_key: str
    pin_hash: str
    target: str
    vllm: str | None
    torch: str | None
    transformers: str | None
    venv: str


class PackageChange(Strict):
    name: str
    a: str | None  # None: not installed in A
    b: str | None


class GoldenDiff(Strict):
    name: str
    path: str
    verdict: DiffVerdict
    why: str = ""
    tokens: list[dict[str, Any]] = Field(default_factory=list)  # A as reference, B as new
    logprobs_identical: bool | None = None
    configuration: list[FieldDiff] = Field(default_factory=list)  # A's run vs B's run
    summary: str = ""


class DiffReport(Strict):
    """`diff PIN_A PIN_B`: what moves between two oracles over goldens' configurations."""

    diff_schema: int
    created_utc: str
    a: OracleSide
    b: OracleSide
    packages: list[PackageChange]
    goldens: list[GoldenDiff]


# ----------------------------------------------------------------------------- explain

class PromptOutcome(Strict):
    id: str
    reproduces: bool
    index: int | None
    golden_token: int | None
    new_token: int | None
    golden_margin: float | None
    new_margin: float | None
    kind: str
    tokens: list[int]
    changed_vs_base: bool | None = None


class CandidateResult(Strict):
    name: str
    changes: dict[str, Any]
    engine_args: dict[str, Any]
    batch: str
    status: Literal["ok", "non_deterministic", "engine_failed", "not_tried"]
    error: str | None = None
    engine: dict[str, Any] | None = None
    environment: dict[str, str] | None = None
    sampling: dict[str, Any] | None = None
    calls: list[list[str]] | None = None
    legs_agree: bool | None = None
    prompts: list[PromptOutcome] = Field(default_factory=list)
    reproduces_all: bool = False


class SettingVerdict(Strict):
    setting: str
    values_tried: list[Any]
    moved: dict[str, list[str]]  # value -> prompts whose tokens differ from the base run
    matters: bool


class ExplainReport(Strict):
    explain_schema: int
    created_utc: str
    golden: str
    golden_sha256: str
    configuration_recorded: bool
    base: dict[str, Any]
    budget: int
    engine_starts: int
    candidates: list[CandidateResult]
    settings: list[SettingVerdict]
    smallest_reproducing: dict[str, Any] | None
    answer: str
    tool: dict[str, Any]
