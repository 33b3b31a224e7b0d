"""Top-k logprob tables: how recorded top-k rows are held, stored and read, in one place.

A table holds, for every prompt, one row per generated position: the token ids and their
logprobs, best first (the top-k and, where it fell outside, the sampled token). In memory
and on disk it is four arrays:

- ``lengths``  int64  [P]     rows per prompt (= the prompt's generated tokens);
- ``counts``   uint16 [N]     entries in each row (1..W), N = sum(lengths);
- ``ids``      int32  [N, W]  token ids, -1 after a row's last entry;
- ``logprobs`` F32|F64 [N, W] logprobs, NaN after a row's last entry. F32 when every value
  is exactly a float32 (vLLM computes them in float32), F64 otherwise: never lossy.

Golden format 2 keeps the table in a safetensors sidecar next to golden.json (its name
carries its sha256; the golden records the hash); the engine driver hands its rows to the
harness in the same arrays (an .npz beside its result). Reading validates every array:
shapes, dtypes, ranges, padding, best-first order. Rows come out as ``[[id, logprob], ...]``
lists, so code that used JSON rows reads a table unchanged (``TopKRows``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, overload

import numpy as np

from oracle_build.core import safetensors
from oracle_build.core.errors import BadInput
from oracle_build.core.files import json_value

MAX_TOKEN_ID = 2**31 - 1
FIELDS = ("counts", "ids", "lengths", "logprobs")
ST_DTYPES = safetensors.DTYPES
EXPECTED = {"lengths": ("I64",), "counts": ("U16",), "ids": ("I32",),
            "logprobs": ("F32", "F64")}
MAX_HEADER = 1 << 20

Row = list[list[Any]]  # [[token_id, logprob], ...]


@dataclass(frozen=True, eq=False)
class TopKTable:
    lengths: np.ndarray
    counts: np.ndarray
    ids: np.ndarray
    logprobs: np.ndarray

    # ------------------------------------------------------------------ building

    @classmethod
    def from_rows(cls, prompts: Sequence[Sequence[Sequence[Sequence[Any]]]]) -> TopKTable:
        """From per-prompt rows (JSON-style ``[[id, lp], ...]`` per position)."""
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        rows = [row for p in prompts for row in p]
        counts = np.array([len(r) for r in rows], dtype=np.uint16)
        width = int(counts.max()) if len(rows) else 1
        ids = np.full((len(rows), width), -1, dtype=np.int32)
        lps = np.full((len(rows), width), np.nan, dtype=np.float64)
        for n, row in enumerate(rows):
            for j, entry in enumerate(row):
                ids[n, j] = int(entry[0])
                lps[n, j] = float(entry[1])
        return cls(lengths, counts, ids, narrowest(lps))

    def cut(self, width: int) -> TopKTable:
        """Every row cut to its first ``width`` entries."""
        if width >= self.width:
            return self
        return TopKTable(self.lengths, np.minimum(self.counts, width).astype(np.uint16),
                         self.ids[:, :width].copy(), self.logprobs[:, :width].copy())

    # ------------------------------------------------------------------ reading

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    @property
    def prompts(self) -> int:
        return int(self.lengths.shape[0])

    @cached_property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def rows(self, prompt: int) -> TopKRows:
        return TopKRows(self, prompt)

    def row(self, n: int) -> Row:
        c = int(self.counts[n])
        return [[t, lp] for t, lp in zip(self.ids[n, :c].tolist(),
                                          self.logprobs[n, :c].tolist(), strict=True)]

    def to_padded(self, positions: int) -> tuple[np.ndarray, np.ndarray]:
        """As [P, positions, W] arrays (ids -1, logprobs NaN where nothing is recorded):
        the layout of vllm.cpp's battery arrays."""
        ids = np.full((self.prompts, positions, self.width), -1, dtype=np.int32)
        lps = np.full((self.prompts, positions, self.width), np.nan, dtype=self.logprobs.dtype)
        for i in range(self.prompts):
            s, n = int(self.offsets[i]), int(self.lengths[i])
            ids[i, :n] = self.ids[s:s + n]
            lps[i, :n] = self.logprobs[s:s + n]
        return ids, lps

    @classmethod
    def from_padded(cls, ids: np.ndarray, logprobs: np.ndarray, lengths: Sequence[int],
                    path: Path) -> TopKTable:
        """From [P, T, W] arrays and each prompt's number of positions; checked like a
        sidecar, and nothing may be recorded past a prompt's last position."""
        if ids.ndim != 3 or logprobs.shape != ids.shape or ids.shape[0] != len(lengths) \
                or any(n > ids.shape[1] for n in lengths):
            raise BadInput(path, [("shape", f"ids {ids.shape}, logprobs {logprobs.shape} for "
                                   f"{len(lengths)} prompts of up to {max(lengths, default=0)} "
                                   "positions: expected [P, T, W] both")])
        keep = np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]
        if (ids[~keep] != -1).any():
            raise BadInput(path, [("ids", "entries recorded past a prompt's last token")])
        flat_ids = ids[keep].astype(np.int64)
        flat_lps = logprobs[keep].astype(np.float64)
        counts = (flat_ids != -1).sum(axis=1).astype(np.uint16)
        if ((flat_ids < -1) | (flat_ids > MAX_TOKEN_ID)).any():
            raise BadInput(path, [("ids", "a token id out of range")])
        table = cls(np.asarray(lengths, dtype=np.int64), counts, flat_ids.astype(np.int32),
                    narrowest(flat_lps))
        table.check(path)
        return table

    # ------------------------------------------------------------------ bytes

    def to_safetensors(self, metadata: dict[str, str] | None = None) -> bytes:
        code = "F32" if self.logprobs.dtype == np.float32 else "F64"
        return safetensors.to_bytes(
            {"lengths": ("I64", self.lengths), "counts": ("U16", self.counts),
             "ids": ("I32", self.ids), "logprobs": (code, self.logprobs)},
            {"format": "oracle-build-topk", **(metadata or {})})

    @classmethod
    def from_safetensors(cls, data: bytes, path: Path) -> TopKTable:
        if len(data) < 8:
            raise BadInput(path, [("<file>", "too short for a safetensors file")])
        (n,) = struct.unpack("<Q", data[:8])
        if n > MAX_HEADER or 8 + n > len(data):
            raise BadInput(path, [("<header>", f"header length {n} does not fit the file "
                                   f"({len(data)} bytes)")])
        try:
            header = json_value(data[8:8 + n])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadInput(path, [("<header>", f"not JSON: {exc}")]) from None
        if not isinstance(header, dict):
            raise BadInput(path, [("<header>", "not a JSON object")])
        header.pop("__metadata__", None)
        if sorted(header) != sorted(FIELDS):
            raise BadInput(path, [("<header>", f"tensors {sorted(header)}; a top-k table "
                                   f"holds exactly {list(FIELDS)}")])
        body = memoryview(data)[8 + n:]
        arrays: dict[str, np.ndarray] = {}
        for name in FIELDS:
            entry = header[name]
            if not isinstance(entry, dict) or entry.get("dtype") not in EXPECTED[name]:
                raise BadInput(path, [(name, f"dtype {entry.get('dtype') if isinstance(entry, dict) else entry!r}; expected one of {list(EXPECTED[name])}")])  # noqa: E501
            shape, offs = entry.get("shape"), entry.get("data_offsets")
            if not (isinstance(shape, list) and all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                    and isinstance(offs, list) and len(offs) == 2
                    and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
                raise BadInput(path, [(name, "shape or data_offsets malformed")])
            dtype = ST_DTYPES[entry["dtype"]]
            start, end = offs
            # exact integers: a shape such as [2**32, 2**32] wraps to 0 in int64 arithmetic
            if not 0 <= start <= end <= len(body) or end - start != math.prod(
                    shape) * dtype.itemsize:
                raise BadInput(path, [(name, f"data_offsets {offs} do not hold shape {shape} "
                                       f"of {entry['dtype']} within the file")])
            arrays[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
        table = cls(arrays["lengths"], arrays["counts"], arrays["ids"], arrays["logprobs"])
        table.check(path)
        return table

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], path: Path,
                    prefix: str) -> TopKTable:
        """One table from the engine driver's arrays (keys ``<prefix>lengths`` ...)."""
        missing = [prefix + name for name in FIELDS if prefix + name not in arrays]
        if missing:
            raise BadInput(path, [(missing[0], "missing array")])
        got = {name: arrays[prefix + name] for name in FIELDS}
        for name in FIELDS:
            if got[name].dtype.newbyteorder("<") not in [ST_DTYPES[c] for c in EXPECTED[name]]:
                raise BadInput(path, [(prefix + name, f"dtype {got[name].dtype}")])
        table = cls(got["lengths"], got["counts"], got["ids"],
                    narrowest(got["logprobs"].astype(np.float64)))
        table.check(path, prefix, nonempty=False)
        return table

    # ------------------------------------------------------------------ validation

    def check(self, path: Path, prefix: str = "", *, nonempty: bool = True) -> None:
        """Every array's shape, range and padding, and each row best first; ``nonempty``: no
        row without entries (a golden's rule; the engine may return none at a position)."""
        def bad(field: str, msg: str) -> BadInput:
            return BadInput(path, [(prefix + field, msg)])

        if self.lengths.ndim != 1 or self.counts.ndim != 1 or self.ids.ndim != 2 \
                or self.logprobs.shape != self.ids.shape:
            raise bad("<shapes>", f"lengths {self.lengths.shape}, counts {self.counts.shape}, "
                      f"ids {self.ids.shape}, logprobs {self.logprobs.shape}: expected [P], "
                      "[N], [N, W], [N, W]")
        n = int(self.ids.shape[0])
        if (self.lengths < 0).any() or int(self.lengths.sum()) != n or len(self.counts) != n:
            raise bad("lengths", f"sum {int(self.lengths.sum())} for {n} rows "
                      f"({len(self.counts)} counts)")
        if n == 0:
            return
        low = 1 if nonempty else 0
        if self.width < 1 or (self.counts < low).any() or (self.counts > self.width).any():
            where = self._where(int(np.flatnonzero((self.counts < low) |
                                                   (self.counts > self.width))[0]))
            raise bad("counts", f"{where}: a row holds {low}..{self.width} entries")
        mask = np.arange(self.width)[None, :] < self.counts[:, None].astype(np.int64)
        ids_ok = np.where(mask, (self.ids >= 0) & (self.ids <= MAX_TOKEN_ID), self.ids == -1)
        if not ids_ok.all():
            raise bad("ids", f"{self._where(int(np.argwhere(~ids_ok)[0][0]))}: a token id "
                      "out of range, or padding other than -1")
        with np.errstate(invalid="ignore"):
            lp_ok = np.where(mask, np.isfinite(self.logprobs) & (self.logprobs <= 0.0),
                             np.isnan(self.logprobs))
        if not lp_ok.all():
            raise bad("logprobs", f"{self._where(int(np.argwhere(~lp_ok)[0][0]))}: a logprob "
                      "not finite or above 0, or padding other than NaN")
        if self.width > 1:
            with np.errstate(invalid="ignore"):
                rising = mask[:, 1:] & (self.logprobs[:, 1:] > self.logprobs[:, :-1])
            if rising.any():
                raise bad("logprobs", f"{self._where(int(np.argwhere(rising)[0][0]))}: the "
                          "row is not sorted best first")

    def _where(self, row: int) -> str:
        prompt = int(np.searchsorted(self.offsets, row, side="right") - 1)
        return f"prompt {prompt} position {row - int(self.offsets[prompt])}"


def narrowest(logprobs: np.ndarray) -> np.ndarray:
    """float32 when that loses nothing (NaN padding aside), else float64."""
    as32 = logprobs.astype(np.float32)
    same = (as32.astype(np.float64) == logprobs) | np.isnan(logprobs)
    return as32 if bool(same.all()) else logprobs.astype(np.float64)


class TopKRows(Sequence[Row]):
    """One prompt's rows of a table, read like the JSON list of rows it replaces."""

    def __init__(self, table: TopKTable, index: int) -> None:
        self.table, self.prompt = table, index
        self._start = int(table.offsets[index])
        self._len = int(table.lengths[index])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, pos: int) -> Row: ...
    @overload
    def __getitem__(self, pos: slice) -> list[Row]: ...

    def __getitem__(self, pos: int | slice) -> Row | list[Row]:
        if isinstance(pos, slice):
            return [self[i] for i in range(*pos.indices(self._len))]
        if pos < 0:
            pos += self._len
        if not 0 <= pos < self._len:
            raise IndexError(pos)
        return self.table.row(self._start + pos)

    def __iter__(self) -> Iterator[Row]:
        t, s = self.table, self._start
        counts = t.counts[s:s + self._len].tolist()
        ids = t.ids[s:s + self._len].tolist()
        lps = t.logprobs[s:s + self._len].tolist()
        for c, i_row, l_row in zip(counts, ids, lps, strict=True):
            yield [[a, b] for a, b in zip(i_row[:c], l_row[:c], strict=True)]


def first_difference(ids: Sequence[str], a: TopKTable, b: TopKTable) -> dict[str, Any] | None:
    """The first (prompt, position) whose rows differ between ``a`` and ``b`` (token ids and
    logprobs, bit for bit, compared as float64; rows cut alike by the caller); None when every
    row is identical. A prompt with more rows on one side differs where the other ends."""
    if a.prompts != b.prompts or a.prompts != len(ids):
        raise ValueError(f"tables hold {a.prompts} and {b.prompts} prompts for {len(ids)} ids")
    width = max(a.width, b.width)
    for i, pid in enumerate(ids):
        la, lb = int(a.lengths[i]), int(b.lengths[i])
        common = min(la, lb)
        sa, sb = int(a.offsets[i]), int(b.offsets[i])
        ca, cb = a.counts[sa:sa + common], b.counts[sb:sb + common]
        ia, ib = _pad(a.ids[sa:sa + common], width, -1), _pad(b.ids[sb:sb + common], width, -1)
        pa = _pad(a.logprobs[sa:sa + common].astype(np.float64), width, np.nan)
        pb = _pad(b.logprobs[sb:sb + common].astype(np.float64), width, np.nan)
        differs = (ca != cb) | (ia != ib).any(axis=1) | \
            ~((pa == pb) | (np.isnan(pa) & np.isnan(pb))).all(axis=1)
        hit = np.flatnonzero(differs)
        pos = int(hit[0]) if len(hit) else (common if la != lb else None)
        if pos is None:
            continue
        ra = [(int(t), float(lp)) for t, lp in a.row(sa + pos)] if pos < la else []
        rb = [(int(t), float(lp)) for t, lp in b.row(sb + pos)] if pos < lb else []
        known = dict(ra)
        deltas = [abs(lp - known[t]) for t, lp in rb if t in known]
        return {"prompt": pid, "position": pos, "golden": ra[:3], "current": rb[:3],
                "max_abs_delta": max(deltas) if deltas else None,
                "same_tokens": [t for t, _ in ra] == [t for t, _ in rb]}
    return None


def moved_cells(ids: Sequence[str], a: TopKTable, b: TopKTable) -> dict[str, Any]:
    """How many of ``a``'s top-k logprobs (the golden's cells) ``b`` does not give bit for bit
    (a token missing from ``b``'s row at that position, or another logprob), of how many, and
    the largest difference among the tokens both rows hold (nats; None when none differ).
    Rows cut alike by the caller; a position only ``a`` has counts all its cells."""
    if a.prompts != b.prompts or a.prompts != len(ids):
        raise ValueError(f"tables hold {a.prompts} and {b.prompts} prompts for {len(ids)} ids")
    width = max(a.width, b.width)
    moved = total = 0
    worst: float | None = None
    for i in range(len(ids)):
        la, lb = int(a.lengths[i]), int(b.lengths[i])
        common = min(la, lb)
        sa, sb = int(a.offsets[i]), int(b.offsets[i])
        ia, ib = _pad(a.ids[sa:sa + la], width, -1), _pad(b.ids[sb:sb + common], width, -1)
        pa = _pad(a.logprobs[sa:sa + la].astype(np.float64), width, np.nan)
        pb = _pad(b.logprobs[sb:sb + common].astype(np.float64), width, np.nan)
        cells = ia >= 0
        total += int(cells.sum())
        moved += int(cells[common:].sum())  # positions the re-run did not reach
        ia, pa, cells = ia[:common], pa[:common], cells[:common]
        aligned = (ia == ib).all(axis=1)
        same = np.where(aligned[:, None], (pa == pb) | ~cells, False)
        moved += int((cells & ~same)[aligned].sum())
        both = aligned[:, None] & cells & ~np.isnan(pb)
        if both.any():
            delta = float(np.abs(pa - pb)[both].max())
            if delta > 0:
                worst = max(worst or 0.0, delta)
        for r in np.flatnonzero(~aligned):  # another order or set of tokens: by token id
            known = {int(t): float(lp) for t, lp in zip(ib[r], pb[r], strict=True) if t >= 0}
            for t, lp in zip(ia[r], pa[r], strict=True):
                if t < 0:
                    continue
                other = known.get(int(t))
                if other is None or other != lp:
                    moved += 1
                if other is not None and other != lp:
                    worst = max(worst or 0.0, abs(other - float(lp)))
    return {"cells": moved, "of": total, "max_abs_delta": worst}


def _pad(arr: np.ndarray, width: int, value: float) -> np.ndarray:
    if arr.shape[1] == width:
        return arr
    out = np.full((arr.shape[0], width), value, dtype=arr.dtype)
    out[:, : arr.shape[1]] = arr
    return out
