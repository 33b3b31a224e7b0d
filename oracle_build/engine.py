"""Running the oracle's engine, for every command that does (capture, verify, margin,
determinism, explain): the oracle opened with its identity checked, the model resolved and
its files' hashes enforced, the engine arguments, the run requests, the grouping of runs
that share one engine configuration, and one ``EngineSession`` per engine start (memory
preflight, the one-engine-per-home lock, the driver, the result parsed).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle_build import devices, generators, host, identity, manifest
from oracle_build.contracts.driver import DriverResult
from oracle_build.contracts.golden import (
    BackendValue,
    EngineRecord,
    ModelRecord,
    ReadValue,
    Recorded,
    Unreadable,
)
from oracle_build.contracts.pins import Pin, Target
from oracle_build.contracts.spec import ModelSpec, SamplingSpec, Spec
from oracle_build.contracts.topk import TopKTable
from oracle_build.core import layout
from oracle_build.core.env import RECORDED_PREFIXES
from oracle_build.core.errors import (
    BadInput,
    EngineFailed,
    IdentityMismatch,
    ModelMismatch,
    OracleMissing,
    PreflightFailed,
)
from oracle_build.core.filelock import held
from oracle_build.core.files import load_json, sha256_file, validate
from oracle_build.core.log import say
from oracle_build.oracle_venv import EngineHost, OracleVenv

MODEL_FILE_GLOBS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken")
BACKEND_LOG = re.compile(r"Using (?:the )?([A-Za-z0-9_]+) (?:attention )?backend", re.I)


# ----------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Oracle:
    pin: Pin
    target_name: str
    target: Target
    venv: OracleVenv
    identity: identity.Identity
    build_record_sha256: str
    content_fingerprint: str | None
    # the engine host whose probe gave ``identity``, waiting for the first engine run
    hosts: list[EngineHost] = field(default_factory=list, compare=False)

    def take_host(self) -> EngineHost | None:
        return self.hosts.pop() if self.hosts else None


def engine_env(target: Target) -> dict[str, str]:
    """The environment every engine of this target runs with (in-process engine core)."""
    return {**target.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def open_oracle(pin: Pin, target_name: str, home: Path, *, require: bool = True,
                engine_log: Path | None = None, deep: bool = True) -> Oracle:
    """The pin's built oracle with its identity re-checked. ``require``: refuse one that is
    not the pin's (IdentityMismatch); otherwise the caller reads ``identity.ok``.

    ``engine_log``: an engine will run, so the identity probe runs inside the engine host
    (driver.py --serve, logging there): it imports vLLM once for both, and starts no engine
    until the harness has compared its facts with the pin and hands it a request.
    ``deep``: every file hashed (every engine-running command's check; without an engine
    host, alone)."""
    venv = OracleVenv(layout.oracle_path(home, pin.key))
    if not venv.exists():
        raise OracleMissing(f"no oracle for pin {pin.id} at {venv.path}",
                            hint="run `nox -s build_oracle` first")
    target = pin.target(target_name)
    say(f"checking oracle identity: {venv.path}")
    hosts: list[EngineHost] = []
    if engine_log is not None:
        engine_host = venv.serve(identity.probe_args(target), env=engine_env(target),
                                 log=engine_log)
        # every file hashed (not only those whose size or mtime moved: both can be put back)
        # while the host imports vLLM; no engine starts before the hashes agree
        try:
            files = deep_files(venv.path)
            facts = engine_host.facts()
        except BaseException:
            engine_host.close()
            raise
        ident = identity.check(pin, target, venv.path, facts=facts, files=files) \
            if facts is not None else identity.check(pin, target, venv.path, deep=True)
        if ident.ok and facts is not None:
            hosts.append(engine_host)
        else:
            engine_host.close()
    else:  # identity.check hashes while its probe imports vLLM
        ident = identity.check(pin, target, venv.path, deep=deep)
    if require and not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(venv.path),
                               hint="`build_oracle -- --rebuild` replaces a drifted oracle")
    digest = sha256_file(venv.record_path) if venv.has_record() else ""
    anchor = manifest.read_anchor(venv.path) or {}
    return Oracle(pin, target_name, target, venv, ident, digest,
                  anchor.get("content_fingerprint"), hosts)


def deep_files(venv: Path) -> manifest.Check | None:
    """Every file of the venv hashed against its anchored manifest; None when the manifest
    cannot be read (identity.check then says why)."""
    recorded, problems = manifest.load(venv)
    if recorded is None or problems:
        return None
    say(f"    hashing every file of the oracle ({len(recorded['files'])}) while its python "
        "imports vLLM for the identity probe")
    return manifest.check(venv, recorded, deep=True)


@dataclass
class Oracles:
    """The oracles one command uses, each opened (identity checked) once. ``engine``:
    (what, name) of the engine runs to come: each oracle's identity is then probed inside
    its engine host (see ``open_oracle``). ``close`` ends hosts no engine run took."""

    home: Path
    opened: dict[tuple[str, str], Oracle] = field(default_factory=dict)
    engine: tuple[str, str] | None = None

    def close(self) -> None:
        for oracle in self.opened.values():
            while (engine_host := oracle.take_host()) is not None:
                engine_host.close()

    def __enter__(self) -> Oracles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, pin: Pin, target_name: str, *, require: bool = True) -> Oracle:
        key = (pin.key, target_name)
        if key not in self.opened:
            log = layout.log_path(self.home, *self.engine) if self.engine else None
            self.opened[key] = open_oracle(pin, target_name, self.home, require=False,
                                           engine_log=log)
        oracle = self.opened[key]
        if require and not oracle.identity.ok:
            raise IdentityMismatch(oracle.identity.mismatches, where=str(oracle.venv.path),
                                   hint="`build_oracle -- --rebuild` replaces a drifted "
                                   "oracle")
        return oracle


@contextmanager
def opened(home: Path, given: Oracles | None, *,
           engine_for: tuple[str, str] | None) -> Iterator[Oracles]:
    """The caller's Oracles, or one of its own for a command whose engines will run
    (``engine_for``: what and name of the first engine log) whose unused engine hosts are
    ended on the way out."""
    if given is not None:
        yield given
        return
    with Oracles(home, engine=engine_for) as oracles:
        yield oracles


# ----------------------------------------------------------------------------- the model


def hub_cache() -> Path:
    """The Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def resolve_model(spec: ModelSpec, base: Path, home: Path,
                  oracle: Oracle | None = None) -> tuple[Path, ModelRecord]:
    """The model folder and its record: every file hashed, pinned hashes enforced. A
    generated battery model takes its layout from ``oracle``'s transformers."""
    if spec.generate:
        path = layout.model_dir(home, spec.generate)
        generators.generate(spec.generate, path, home=home,
                            venv=oracle.venv if oracle else None,
                            transformers=oracle.identity.summary()["transformers"]
                            if oracle else None)
        source = f"generated:{spec.generate}"
    elif spec.path:
        path = (base / spec.path).resolve()
        source = f"path:{spec.path}"
    else:
        assert spec.repo_id and spec.revision
        path = (hub_cache() / f"models--{spec.repo_id.replace('/', '--')}" / "snapshots"
                / spec.revision)
        source = f"hub:{spec.repo_id}@{spec.revision}"
    if not path.is_dir():
        raise PreflightFailed(f"model folder {path} not found",
                              hint="models are read from local disk only; put the files there")
    files: dict[str, dict[str, Any]] = {}
    for pattern in MODEL_FILE_GLOBS:
        for f in sorted(path.glob(pattern)):
            if f.is_file():
                files[f.name] = {"sha256": sha256_file(f), "size": f.stat().st_size}
    problems = []
    for name, digest in spec.files.items():
        got = files.get(name)
        if got is None:
            problems.append(f"{name}: pinned but missing from {path}")
        elif got["sha256"] != digest:
            problems.append(f"{name}: sha256 {got['sha256']} but the spec pins {digest}")
    if problems:
        raise ModelMismatch("the model is not the pinned one:\n  " + "\n  ".join(problems),
                            hint="restore the pinned files; a changed model needs a new spec")
    arch = None
    if "config.json" in files:
        cfg = load_json(path / "config.json")
        arch = cfg.get("architectures") if isinstance(cfg, dict) else None
    record = ModelRecord(
        source=source, path=str(path), revision=spec.revision, files=files,
        architectures=arch,
        tokenizer_sha256=(files.get("tokenizer.json") or files.get("tokenizer.model") or {}
                          ).get("sha256"),
        generation_config_sha256=(files.get("generation_config.json") or {}).get("sha256"),
    )
    return path, record


def recorded_model(rec: Recorded, golden_path: Path, home: Path,
                   oracle: Oracle | None = None) -> Path:
    """The model folder a recorded golden names, its pinned hashes enforced."""
    path, _record = resolve_model(ModelSpec.model_validate(rec.spec.get("model", {})),
                                  golden_path.parent, home, oracle)
    return path


# ----------------------------------------------------------------------------- requests


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
    return json.dumps([oracle.pin.key, oracle.target_name, str(model_path), args],
                      sort_keys=True, default=str)


# ----------------------------------------------------------------------------- one engine


@dataclass(frozen=True)
class EngineResult:
    """The driver's answer for one engine start: ``result`` validated, ``raw`` the same
    answer with each output's top-k rows put back (``runs``)."""

    result: DriverResult
    raw: dict[str, Any]
    args: dict[str, Any]
    log: Path

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def error(self) -> str:
        return str(self.result.error)

    def require(self) -> EngineResult:
        if not self.ok:
            raise EngineFailed(f"{self.result.error}\n  log: {self.log}\n"
                               + "\n".join("    | " + ln for ln in
                                           str(self.result.traceback or "").splitlines()[-8:]))
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
        return dict(self.result.env)

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
                            start_seconds=result.engine_start_seconds)


@dataclass(frozen=True)
class EngineSession:
    """One engine configuration of one oracle: a call to ``run`` is one engine start, and
    every run in it shares that engine."""

    oracle: Oracle
    model_path: Path
    args: dict[str, Any]
    home: Path

    def run(self, runs: list[dict[str, Any]], *, what: str, name: str,
            audit_weights: bool = False) -> EngineResult:
        """Start the engine, run ``runs``, stop. A driver that fails returns a result whose
        ``ok`` is false (``require()`` raises EngineFailed with the log's tail).
        ``audit_weights``: the result says which checkpoint tensors vLLM's loader skipped."""
        memory_preflight(self.oracle.target)
        request = {"model": str(self.model_path), "engine_args": self.args, "runs": runs,
                   "record_env_prefixes": list(RECORDED_PREFIXES),
                   "audit_weights": audit_weights}
        # One engine at a time per oracle home: two engines can exhaust a host's memory
        # (GB10's unified memory included). Another capture/verify/explain waits here.
        with held(layout.engine_lock(self.home), what="a vLLM engine"):
            engine_host = self.oracle.take_host()
            if engine_host is not None:  # identity proved in this process: start the engine
                log = engine_host.log
                say("    the engine host passed identity: starting its engine")
                answer = engine_host.run(request)
            else:
                log = layout.log_path(self.home, what, name)
                log.parent.mkdir(parents=True, exist_ok=True)
                answer = self.oracle.venv.run_inside(
                    "driver.py", [], request=request, env=engine_env(self.oracle.target),
                    log=log, what="vLLM engine")
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
        return EngineResult(result, raw, self.args, log)


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
