"""The engine arguments a spec, a pin target's engine_defaults or a golden may hold: an
allow-list (``oracle_build/engine_keys.toml``), each key with its class. A key that loads code,
names a class to import or points the engine at files is refused, saying why; a key the list
does not know is refused too (vLLM adds arguments every release, and some load code)."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Literal

KeyClass = Literal["numerics", "scheduling", "context"]
CLASSES: tuple[KeyClass, ...] = ("numerics", "scheduling", "context")
TABLE = Path(__file__).parent.parent / "engine_keys.toml"


@cache
def _table() -> tuple[dict[str, KeyClass], dict[str, str]]:
    data = tomllib.loads(TABLE.read_text())
    known: dict[str, KeyClass] = {}
    for cls in CLASSES:
        for key in data[cls]["keys"]:
            known[key] = cls
    refused = {str(k): str(v) for k, v in data["refused"].items()}
    return known, refused


def known_keys() -> dict[str, KeyClass]:
    return dict(_table()[0])


def refused_keys() -> dict[str, str]:
    return dict(_table()[1])


def key_class(key: str) -> KeyClass | None:
    """The class of an allowed engine argument; None when it is not allowed."""
    return _table()[0].get(key)


def key_problem(key: str) -> str | None:
    """Why an engine table may not hold ``key`` (None: it may)."""
    known, refused = _table()
    if key in known:
        return None
    if key in refused:
        return f"refused: {refused[key]}; nothing of a spec or golden runs in the engine"
    return ("is not an engine argument this oracle-build knows (the allow-list: "
            "oracle_build/engine_keys.toml); refused rather than passed to vLLM unread")


def engine_problems(engine: object, where: str) -> list[tuple[str, str]]:
    """(field, problem) for every key of an engine table that may not be there. A key that
    is not a plain argument name is not echoed."""
    if not isinstance(engine, dict):
        return [(where, "is not a table of engine arguments")]
    out = []
    for key in engine:
        if not isinstance(key, str) or not key.isidentifier() or not key.islower() \
                or len(key) > 64:
            out.append((f"{where}.<key>", "is not an engine argument name"))
            continue
        problem = key_problem(key)
        if problem is not None:
            out.append((f"{where}.{key}", problem))
    return out
