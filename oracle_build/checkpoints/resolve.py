"""The model a run uses: a generated model (written byte-identically from its recipe), a
local folder, or the hub's cache, with every file's sha256 against what the spec or the
golden records (a mismatch is never run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from oracle_build.checkpoints import families
from oracle_build.contracts.golden import (
    ModelRecord,
    Recorded,
)
from oracle_build.contracts.spec import ModelSpec
from oracle_build.core import layout
from oracle_build.core.errors import (
    ModelMismatch,
    PreflightFailed,
)
from oracle_build.core.files import load_json, sha256_file
from oracle_build.oracle.opening import Oracle

MODEL_FILE_GLOBS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken")


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
        families.generate(spec.generate, path, home=home,
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
