"""The safetensors layout, written once: u64 header length, a JSON header (sorted, compact,
space-padded to 8 bytes) naming each tensor's dtype, shape and byte range, then the raw
little-endian data in name order. The generated models and the golden's top-k file use it."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

DTYPES: dict[str, np.dtype[Any]] = {
    "I64": np.dtype("<i8"), "U16": np.dtype("<u2"), "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


def to_bytes(tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str]) -> bytes:
    """``tensors``: name -> (safetensors dtype code, array); BF16 arrays are uint16 bit
    patterns."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        code, arr = tensors[name]
        data = np.ascontiguousarray(arr, dtype=DTYPES[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)
