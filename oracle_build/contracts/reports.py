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


TokenKind = Literal["match", "exact_tie", "near_tie", "real"]


class TokenRow(Strict):
    """One prompt's token result, as judge.TokenResult gives it: the first divergence
    (``index``, None when the tokens are equal), both tokens there, both margins (nats; None
    outside the top-k) and its class."""

    prompt: str
    prompt_ids_equal: bool
    tokens_equal: bool
    n_golden: int
    n_new: int
    index: int | None
    golden_token: int | None
    new_token: int | None
    golden_margin: float | None
    new_margin: float | None
    kind: TokenKind


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
    tokens: list[TokenRow] = Field(default_factory=list)
    summary: str = ""
    gate: GateVerdict | None = None
    # Beyond tokens: are the re-run's top-k logprobs bit-identical to the golden's (None when
    # nothing was run), and where they first differ.
    logprobs_identical: bool | None = None
    logprobs_difference: dict[str, Any] | None = None
    # how many of the golden's top-k logprobs differ ("cells"), of how many ("of"), and the
    # largest difference in nats ("max_abs_delta"); None when nothing was compared
    logprobs_moved: dict[str, Any] | None = None


class VerifyReport(Strict):
    report_schema: int
    created_utc: str
    exit_code: int
    goldens: list[GoldenVerdict]
    # how the engines' network was: "closed (<how>)" or "open (<why>)"
    network: str | None = None


# ----------------------------------------------------------------------------- diff

DIFF_REPORT_SCHEMA = 1
DiffVerdict = Literal["same", "moved at near-ties only", "moved", "not run",
                      "engine failed on A", "engine failed on B"]
# the verdicts of a golden whose tokens were not compared
NOT_COMPARED: tuple[DiffVerdict, ...] = ("not run", "engine failed on A", "engine failed on B")


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


class RecipeChange(Strict):
    """How two oracles were made differs here (from their build records): the vLLM source,
    a patch, a compiler, cmake or ninja, a flag of the compile."""

    what: str  # "source", "patch <file>", "toolchain.cxx", "toolchain.flags.CMAKE_ARGS", ...
    a: str | None  # None: A has none
    b: str | None


class GoldenDiff(Strict):
    name: str
    path: str
    verdict: DiffVerdict
    why: str = ""
    tokens: list[TokenRow] = Field(default_factory=list)  # A as reference, B as new
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
    recipe: list[RecipeChange] = Field(default_factory=list)


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


# ----------------------------------------------------------------------------- margin, determinism


class MarginReport(Strict):
    """`margin --json`: the teacher-forced top-k at one position of a golden's prompt (the
    candidate's fields only with --candidate)."""

    golden: str
    prompt: str
    position: int = Field(ge=0)
    prefix: Literal["golden", "candidate"]
    prefix_length: int = Field(ge=0)
    topk: list[tuple[int, float]] = Field(min_length=1)  # best first
    argmax: int
    top2_margin_nats: float | None
    golden_token: int | None  # None past the golden's last token
    candidate_token: int | None = None
    candidate_gap_nats: float | None = None  # None: outside the top-k
    candidate_gap_mnats: int | None = None  # vllm.cpp's milli-nats (its marker outside)


class DeterminismLeg(Strict):
    leg: int = Field(ge=0)
    matches_leg0: int = Field(ge=0)  # prompts whose tokens equal leg 0's
    matches_golden: int | None = None  # a golden's legs only
    first_divergence_vs_golden: list[int | None] | None = None


class DeterminismReport(Strict):
    """`determinism --json`: K legs of one configuration in one process."""

    source: str
    legs: int = Field(ge=1)
    prompts: int = Field(ge=1)
    deterministic: bool
    per_leg: list[DeterminismLeg]
    disagreements: list[dict[str, Any]]
    engine_start_seconds: float | None
    leg_seconds: list[float]
