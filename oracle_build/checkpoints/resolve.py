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
    BadInput,
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
    code = model_code(path)
    if code:  # refused before any engine: the loader could import it
        raise BadInput(path, code, hint="a model folder holds weights, configuration and a "
                       "tokenizer; a model that needs its own code is not one an oracle runs "
                       "(nothing of a spec or golden runs in the engine)")
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


# The files of a model folder that transformers reads and that may name code to import: an
# ``auto_map`` (a class in a .py file of the folder, or of a hub repository), a tokenizer or
# processor class given by a qualified name.
CONFIG_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json",
                "processor_config.json", "generation_config.json", "image_processor_config.json",
                "feature_extractor_config.json", "video_preprocessor_config.json")
CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type",
              "feature_extractor_type")
MAX_SCANNED = 10_000


def model_code(path: Path) -> list[tuple[str, str]]:
    """(file, why) for everything in a model folder a loader could import: a Python file
    anywhere in it, an ``auto_map`` in a configuration, a class named by a qualified name."""
    out: list[tuple[str, str]] = []
    for n, f in enumerate(sorted(path.rglob("*"))):
        if n >= MAX_SCANNED:
            out.append(("<folder>", f"more than {MAX_SCANNED} entries: not a model folder"))
            break
        if f.suffix in (".py", ".pyc", ".so") or f.name == "__pycache__":
            out.append((str(f.relative_to(path)), "is code a loader could import "
                        "(trust_remote_code is refused; such files are refused with it)"))
    for name in CONFIG_FILES:
        f = path / name
        if not f.is_file():
            continue
        try:
            data = load_json(f)
        except BadInput as exc:
            out.append((name, exc.message[:300]))
            continue
        if not isinstance(data, dict):
            continue
        if "auto_map" in data:
            out.append((f"{name}: auto_map", "names classes to import from code beside the "
                        "model or on the hub"))
        for key in CLASS_KEYS:
            value = data.get(key)
            if isinstance(value, str) and ("." in value or "/" in value or "--" in value):
                out.append((f"{name}: {key}", "names a class by a qualified name (code to "
                            "import)"))
    return out


def recorded_model(rec: Recorded, golden_path: Path, home: Path,
                   oracle: Oracle | None = None) -> Path:
    """The model folder a recorded golden names, its pinned hashes enforced."""
    path, _record = resolve_model(ModelSpec.model_validate(rec.spec.get("model", {})),
                                  golden_path.parent, home, oracle)
    return path
