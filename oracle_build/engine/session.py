"""One engine start (``EngineSession``): memory preflight, the one-engine-per-home lock, the
driver in the oracle venv (or the engine host that already proved identity), and its
answer validated (``EngineResult``), the top-k rows put back from their arrays."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build import devices, host
from oracle_build.contracts.driver import DriverResult
from oracle_build.contracts.golden import (
    BackendValue,
    EngineRecord,
    KernelVariantRecord,
    ReadValue,
    Unreadable,
)
from oracle_build.contracts.targets import Target
from oracle_build.contracts.topk import TopKTable
from oracle_build.core import layout, proc
from oracle_build.core.env import CPU_NUMERICS, RECORDED_PREFIXES
from oracle_build.core.errors import (
    BadInput,
    EngineFailed,
    IdentityMismatch,
    PreflightFailed,
    as_data,
)
from oracle_build.core.filelock import held
from oracle_build.core.files import validate
from oracle_build.core.log import say
from oracle_build.engine.compiler import SET as COMPILER_SET
from oracle_build.engine.compiler import RuntimeCompiler
from oracle_build.oracle.opening import Oracle, engine_env

BACKEND_LOG = re.compile(r"Using (?:the )?([A-Za-z0-9_]+) (?:attention )?backend", re.I)


@dataclass(frozen=True)
class EngineResult:
    """The driver's answer for one engine start: ``result`` validated, ``raw`` the same
    answer with each output's top-k rows put back (``runs``)."""

    result: DriverResult
    raw: dict[str, Any]
    args: dict[str, Any]
    log: Path
    variant: KernelVariantRecord | None = None
    compiler: RuntimeCompiler | None = None

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def error(self) -> str:
        return str(self.result.error)

    @property
    def reached_for(self) -> list[str]:
        """What the engine's process tried to reach beyond its own loopback."""
        return list(self.result.network.reached_for) if self.result.network else []

    def require(self) -> EngineResult:
        if not self.ok:
            reached = self.reached_for
            wanted = (f"\n  it reached for the network, which an oracle's engine runs without "
                      f"({proc.oracle_network()[1]}): {as_data('; '.join(reached), 600)}"
                      if reached else "")
            raise EngineFailed(f"{self.result.error}{wanted}\n  log: {self.log}\n"
                               + "\n".join("    | " + ln for ln in
                                           str(self.result.traceback or "").splitlines()[-8:]),
                               hint="nothing an engine computes with comes from the network: "
                               "put what it wanted (a model, a tokenizer) on local disk and name "
                               "it in the spec" if reached else None)
        return self

    @property
    def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.raw["runs"]
        return runs

    @property
    def start_seconds(self) -> float:
        return float(self.result.engine_start_seconds or 0.0)

    @property
    def environment(self) -> dict[str, str]:
        """The recorded variables the engine saw, less those its kernel variant and its
        run-time compiler set (their records hold them)."""
        return {k: v for k, v in self.result.env.items()
                if k not in CPU_NUMERICS and k not in COMPILER_SET}

    @property
    def environment_set_by_engine(self) -> dict[str, str]:
        return dict(self.result.env_after_import)

    def engine_record(self) -> EngineRecord:
        """The configuration the engine resolved, read back from it (never the request)."""
        result = self.result
        resolved: dict[str, ReadValue | Unreadable] = {}
        for key, item in (result.resolved_after or {}).items():
            resolved[key] = (Unreadable(**item) if "unreadable" in item
                             else ReadValue.model_validate(item))
        resolved["torch_threads"] = ReadValue.model_validate(
            {"value": result.torch_threads, "from": "torch.get_num_threads()"})
        backends: dict[str, BackendValue | Unreadable] = {}
        log_names = self.raw.get("log_backends") or []
        for kind in ("attention", "moe"):
            item = (result.backends or {})[kind]
            if "unreadable" in item:
                backends[kind] = Unreadable(**item)
            else:
                backends[kind] = BackendValue(value=item.get("value"), layers=item.get("layers"),
                                              note=item.get("note"),
                                              log=log_names if kind == "attention" else None)
        return EngineRecord(requested=self.args, resolved=resolved, backends=backends,
                            start_seconds=result.engine_start_seconds,
                            kernel_variant=self.variant,
                            compiler=self.compiler.record(result.compiled_kernels)
                            if self.compiler is not None else None)


@dataclass(frozen=True)
class EngineSession:
    """One engine configuration of one oracle: a call to ``run`` is one engine start, and
    every run in it shares that engine."""

    oracle: Oracle
    model_path: Path
    args: dict[str, Any]
    home: Path

    def run(self, runs: list[dict[str, Any]], *, what: str, name: str,
            audit_weights: bool = False, pieces: set[int] | None = None) -> EngineResult:
        """Start the engine, run ``runs``, stop. A driver that fails returns a result whose
        ``ok`` is false (``require()`` raises EngineFailed with the log's tail).
        ``audit_weights``: the result says which checkpoint tensors vLLM's loader skipped.
        ``pieces``: decode these ids and every id the runs produce with the model's own
        tokenizer (the result's ``pieces``), for a report to show text."""
        memory_preflight(self.oracle.target)
        target = self.oracle.target
        by_variant = devices.module(target).BY_CPU_VARIANT
        request = {"model": str(self.model_path), "engine_args": self.args, "runs": runs,
                   "record_env_prefixes": list(RECORDED_PREFIXES),
                   "audit_weights": audit_weights, "cpu_kernels": by_variant}
        if pieces is not None:
            request.update(pieces=True, piece_ids=sorted(pieces))
        # One engine at a time per oracle home: two engines can exhaust a host's memory
        # (GB10's unified memory included). Another capture/verify/explain waits here.
        # Engines sharing a compile cache also run one at a time: one whose journal is left
        # over did not finish, and the cache it wrote into is discarded first.
        caches = self.oracle.compile_cache(self.home)
        with held(layout.engine_lock(self.home), what="a vLLM engine"), \
                caches.in_use(f"{what} {name}") as use:
            engine_host = self.oracle.take_host()
            if engine_host is not None:  # identity proved in this process: start the engine
                log = engine_host.log
                say("    the engine host passed identity: starting its engine")
                answer = engine_host.run(request)
            else:
                log = layout.log_path(self.home, what, name)
                log.parent.mkdir(parents=True, exist_ok=True)
                answer = self.oracle.venv.run_inside(
                    "driver.py", [], request=request,
                    env=engine_env(target, self.oracle.hold, caches, self.oracle.spec_env,
                                   self.oracle.compiler),
                    log=log,
                    what="vLLM engine")
            use.clean = answer.data is not None and answer.data.get("ok") is True
        if answer.data is None:
            raise EngineFailed(f"the driver exited with {answer.result.returncode} and wrote "
                               f"no result; log: {log}\n" + _tail(log))
        raw = dict(answer.data)
        try:
            result = validate(DriverResult, raw, log)
        except BadInput as exc:
            raise EngineFailed("the driver's answer is not one this oracle-build reads: "
                               + exc.message.replace(str(log), "its answer", 1)) from None
        attach_topk(raw, answer.arrays, log)
        raw["log_backends"] = sorted(set(BACKEND_LOG.findall(log.read_text(errors="replace"))))
        variant = self.kernel_variant(result, log) if by_variant and result.ok else None
        engine = EngineResult(result, raw, self.args, log, variant, self.oracle.compiler)
        if result.ok and engine.reached_for:
            say("note: the engine reached for the network (closed to it) and went on without "
                f"it: {as_data('; '.join(engine.reached_for), 600)}")
        return engine

    def kernel_variant(self, result: DriverResult, log: Path) -> KernelVariantRecord:
        """The variant the engine's process ran, read from it, against the one asked for:
        another variant than the one held is an identity mismatch, never a silent run."""
        hold = self.oracle.hold
        kernels = result.cpu_kernels or {}
        bad = devices.variant_mismatches(self.oracle.target, kernels, hold)
        if bad:
            raise IdentityMismatch(bad, where=f"the engine's process (log: {log})",
                                   hint="the engine did not run the CPU kernel variant it "
                                   "was held to; nothing it computed is recorded")
        loaded = kernels.get("loaded")
        capability = kernels.get("torch_capability")
        given, real = kernels.get("predicates"), kernels.get("answers")
        return KernelVariantRecord(
            requested=hold.requested, resolved=kernels.get("variant"),
            libraries=[str(x) for x in loaded] if isinstance(loaded, list) else [],
            torch_capability=capability if isinstance(capability, str) else None,
            env={k: v for k, v in result.env.items() if k in CPU_NUMERICS},
            predicates=({str(k): bool(v) for k, v in given.items() if isinstance(v, bool)}
                        if isinstance(given, dict) else {}),
            cpu_answers=({str(k): v if isinstance(v, bool) else None
                          for k, v in real.items()} if isinstance(real, dict) else None))


def attach_topk(raw: dict[str, Any], arrays: dict[str, Any] | None, where: Path) -> None:
    """Put each leg's top-k table (the driver saves them as arrays) back on its outputs:
    ``out["topk"]`` reads as the rows it always held; ``leg_tables`` keeps the tables."""
    if not raw.get("ok"):
        return
    if arrays is None:
        raise EngineFailed(f"the driver reported success but saved no top-k arrays; log: {where}")
    for r, run in enumerate(raw["runs"]):
        run["leg_tables"] = []
        for leg_no, leg in enumerate(run["legs"]):
            try:
                table = TopKTable.from_arrays(arrays, where, f"r{r}_l{leg_no}_")
            except BadInput as exc:
                raise EngineFailed(f"the driver's top-k arrays are malformed: {exc}") from None
            if table.prompts != len(leg):
                raise EngineFailed(f"the driver's top-k arrays r{r}_l{leg_no} hold "
                                   f"{table.prompts} prompts for {len(leg)} outputs")
            for i, out in enumerate(leg):
                out["topk"] = table.rows(i)
            run["leg_tables"].append(table)


def memory_preflight(target: Target) -> int | None:
    available = host.available_memory()
    floor = int(target.memory_floor_gib * 2**30)
    if available is not None and available < floor:
        raise PreflightFailed(
            f"host memory available is {available / 2**30:.1f} GiB, below this target's floor "
            f"of {target.memory_floor_gib:.1f} GiB: starting the engine could exhaust memory",
            hint="stop other work on the host, or lower the pin target's memory_floor_gib "
            "knowingly")
    return available


def _tail(log: Path, n: int = 20) -> str:
    lines = log.read_text(errors="replace").splitlines()[-n:] if log.exists() else []
    return "\n".join("    | " + ln for ln in lines)
