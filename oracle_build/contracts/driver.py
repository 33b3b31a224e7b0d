"""The engine driver's answer (inside/driver.py writes it in the oracle venv; the harness
reads it here). The driver runs in another interpreter with another set of packages, so
its answer is input like any other: a malformed one is an engine failure naming the
field, never a KeyError later. The top-k rows travel beside it as arrays (an .npz read
by contracts/topk.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from oracle_build.contracts.base import Strict, TokenId

DRIVER_SCHEMA = 2  # 2: top-k rows in the arrays file (an .npz), not in the JSON


class DriverOutput(Strict):
    """One prompt's completion in one leg."""

    prompt_token_ids: list[TokenId]
    token_ids: list[TokenId]
    text: str
    finish_reason: str | None


class DriverRun(Strict):
    """One run (a golden, a battery member, an explain variation) on the engine: its
    sampling as vLLM resolved it, and every leg's outputs in prompt order."""

    name: str
    sampling: dict[str, Any]
    legs: list[list[DriverOutput]] = Field(min_length=1)
    leg_seconds: list[float]


class DriverNetwork(Strict):
    interfaces: list[str] = Field(max_length=256)
    reached_for: list[str] = Field(max_length=20)


class DriverResult(Strict):
    """The answer for one engine start."""

    driver_schema: Literal[2]
    ok: Annotated[bool, Field(strict=True)]
    env: dict[str, str] = Field(default_factory=dict)  # the recorded prefixes, before import
    versions: dict[str, str] | None = None
    torch_threads: int | None = None
    env_after_import: dict[str, str] = Field(default_factory=dict)
    weights: dict[str, Any] | None = None  # the weight audit, when asked for
    engine_start_seconds: float | None = None
    resolved: dict[str, Any] | None = None
    backends: dict[str, Any] | None = None
    runs: list[DriverRun] = Field(default_factory=list)
    arrays_file: str | None = None
    pieces: dict[str, str] | None = None  # token id -> its text, when the request asked
    resolved_after: dict[str, dict[str, Any]] | None = None
    # CPU targets: the kernel library this process mapped, torch's dispatch level, the hold
    cpu_kernels: dict[str, Any] | None = None
    # the kernels it compiled at run time and ran: "<cache variable>/<file>" -> sha256
    compiled_kernels: dict[str, str] | None = None
    # the interfaces the process saw and what it reached for beyond its own loopback
    network: DriverNetwork | None = None
    error: str | None = None
    traceback: str | None = None
    seconds: float | None = None

    @model_validator(mode="after")
    def _complete(self) -> DriverResult:
        if self.ok:
            missing = [n for n in ("resolved_after", "backends", "arrays_file")
                       if getattr(self, n) is None]
            if missing:
                raise ValueError(f"a successful answer needs {', '.join(missing)}")
            for kind in ("attention", "moe"):
                if not isinstance((self.backends or {}).get(kind), dict):
                    raise ValueError(f"backends.{kind} is missing")
        elif not self.error:
            raise ValueError("a failed answer names its error")
        return self
