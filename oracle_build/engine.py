"""Running the oracle's engine: model files, engine arguments, the in-venv driver.

Shared by capture, verify, margin, determinism and explain. One call to
``run_driver`` is one engine start; every run in the request shares it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle_build import build, identity, proc, tinymodel
from oracle_build.errors import EngineFailed, ModelMismatch, OracleMissing, PreflightFailed
from oracle_build.files import load_json, sha256_file
from oracle_build.golden import ModelRecord, ModelSpec
from oracle_build.locks import held
from oracle_build.log import say
from oracle_build.pins import Pin, Target
from oracle_build.targets import meminfo

DRIVER = Path(__file__).parent / "inside" / "driver.py"
MODEL_FILE_GLOBS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken")
BACKEND_LOG = re.compile(r"Using (?:the )?([A-Za-z0-9_]+) (?:attention )?backend", re.I)


@dataclass(frozen=True)
class Oracle:
    pin: Pin
    target_name: str
    target: Target
    venv: Path
    identity: identity.Identity
    build_record_sha256: str


def open_oracle(pin: Pin, target_name: str, home: Path) -> Oracle:
    """The pin's built oracle, its identity re-checked (refuses one that is not the pin's)."""
    venv = build.oracle_path(home, pin)
    if not venv.exists():
        raise OracleMissing(f"no oracle for pin {pin.id} at {venv}",
                            hint="run `nox -s build_oracle` first")
    target = pin.target(target_name)
    say(f"checking oracle identity: {venv}")
    ident = identity.require(pin, target, venv)
    record = venv / build.RECORD_DIR / "build-record.json"
    if not record.exists():
        raise OracleMissing(f"{venv} has no build record; it was not made by build_oracle",
                            hint="`nox -s build_oracle -- --rebuild`")
    return Oracle(pin, target_name, target, venv, ident, sha256_file(record))


def memory_preflight(target: Target) -> int | None:
    available = meminfo().get("MemAvailable")
    floor = int(target.memory_floor_gib * 2**30)
    if available is not None and available < floor:
        raise PreflightFailed(
            f"host memory available is {available / 2**30:.1f} GiB, below this target's floor "
            f"of {target.memory_floor_gib:.1f} GiB: starting the engine could exhaust memory",
            hint="stop other work on the host, or lower the pin target's memory_floor_gib "
            "knowingly")
    return available


def resolve_model(spec: ModelSpec, base: Path, home: Path) -> tuple[Path, ModelRecord]:
    """The model folder and its record: every file hashed, pinned hashes enforced."""
    if spec.generate:
        path = home / "models" / spec.generate
        tinymodel.generate(path)
        source = f"generated:{spec.generate}"
    elif spec.path:
        path = (base / spec.path).resolve()
        source = f"path:{spec.path}"
    else:
        assert spec.repo_id and spec.revision
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path.home() / ".cache/huggingface/hub")
        path = hub / f"models--{spec.repo_id.replace('/', '--')}" / "snapshots" / spec.revision
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


def engine_args(requested: dict[str, Any], target: Target) -> dict[str, Any]:
    """The spec's arguments over the target's defaults. On CPU the KV cache is always
    bounded: left alone, vLLM's CPU engine takes most of the host's memory."""
    args = {**target.engine_defaults, **requested}
    if target.device == "cpu" and not args.get("kv_cache_memory_bytes"):
        raise PreflightFailed(
            "a CPU engine needs kv_cache_memory_bytes (it would size its KV cache from free "
            "host memory: 21 GiB of 24 seen)", hint="set engine.kv_cache_memory_bytes")
    return args


def run_driver(oracle: Oracle, model_path: Path, args: dict[str, Any],
               runs: list[dict[str, Any]], *, log: Path) -> dict[str, Any]:
    """One engine start; every run in ``runs``. Returns the driver's result."""
    request = {"model": str(model_path), "engine_args": args, "runs": runs}
    env = identity.oracle_env(oracle.target, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    log.parent.mkdir(parents=True, exist_ok=True)
    # One engine at a time per oracle home: two engines can exhaust a host's memory (GB10's
    # unified memory included). A second capture/verify/explain waits here and says so.
    engine_lock = held(oracle.venv.parent.parent / "locks" / "engine.lock",
                       what="a vLLM engine")
    with engine_lock, tempfile.TemporaryDirectory(prefix="oracle-driver-") as tmp:
        req = Path(tmp) / "request.json"
        out = Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        res = proc.run([str(identity.venv_python(oracle.venv)), "-I", str(DRIVER), str(req),
                        str(out)], env=env, cwd=Path(tmp), log=log, check=False,
                       what="vLLM engine")
        if not out.exists():
            raise EngineFailed(f"the driver exited with {res.returncode} and wrote no result; "
                               f"log: {log}\n" + _tail(log))
        result: dict[str, Any] = json.loads(out.read_text())
    if not result.get("ok"):
        raise EngineFailed(f"{result.get('error')}\n  log: {log}\n"
                           + "\n".join("    | " + ln for ln in
                                       str(result.get("traceback", "")).splitlines()[-8:]))
    result["log_backends"] = sorted(set(BACKEND_LOG.findall(log.read_text(errors="replace"))))
    return result


def _tail(log: Path, n: int = 20) -> str:
    lines = log.read_text(errors="replace").splitlines()[-n:]
    return "\n".join("    | " + ln for ln in lines)
