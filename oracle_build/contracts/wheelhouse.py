"""A wheelhouse's manifest (``<wheelhouse>/<pin key>/manifest.json``): every wheel kept for a
pin, with the sha256 it had when it came in and where it came from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from oracle_build.contracts.base import Sha256, Strict

WHEELHOUSE_SCHEMA = 1


class WheelhouseEntry(Strict):
    sha256: Sha256
    size: int = Field(ge=0)
    # "built" (this pin's build made it), "cache" (pulled from the oracle cache),
    # "downloaded" (an index), "shared:<pin key>" (linked from another pin's)
    origin: str = Field(min_length=1, max_length=200)


class WheelhouseManifest(Strict):
    schema_: Literal[1] = Field(alias="schema")
    pin_key: str
    pin_hash: Sha256
    wheels: dict[str, WheelhouseEntry]
