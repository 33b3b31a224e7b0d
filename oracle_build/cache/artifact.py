"""What the push and the pull share: the wheel file name rule and the canonical JSON."""

from __future__ import annotations

import json
import re
from typing import Any

# a layer's title becomes a file name in the wheelhouse: a plain name, never a path
WHEEL_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl$")


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
