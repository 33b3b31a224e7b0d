"""What the push and the pull share: the wheel file name rule, the canonical JSON, and the
documents built through the models pull validates."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

# a layer's title becomes a file name in the wheelhouse: a plain name, never a path
WHEEL_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl$")


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def document(model: type[BaseModel], value: dict[str, Any]) -> bytes:
    """A document push writes (a manifest, an attestation, a statement), built through the
    model pull validates it with: what push sends is what pull reads, by construction."""
    built = model.model_validate(value)
    return canonical_json(built.model_dump(mode="json", by_alias=True, exclude_none=True))
