"""The one strict base model and the value rules every contract shares.

Every file oracle-build reads is a model derived from ``Strict``: unknown keys are errors (a
typo in a pin is never a silent default) and loaded values are frozen.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any

from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from oracle_build.core.errors import BadInput, as_data

MAX_TOKEN_ID = 2**31 - 1
# a name (a golden's, a prompt's, a pin's) is printed where gates grep for verdicts
VERDICT_PREFIXES = ("ORACLE_",)
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def safe_name(value: str) -> str:
    """A name that becomes a folder or file name: no slashes, no leading dot."""
    if not SAFE_NAME.match(value) or value in (".", ".."):
        raise ValueError(f"{value!r} is not a safe name (letters, digits, '.', '_', '-'; "
                         "no slashes; at most 100)")
    if value.upper().startswith(VERDICT_PREFIXES):
        raise ValueError(f"{value!r} is not a safe name: it starts like a verdict word "
                         "(ORACLE_...), which only the tool prints")
    return value


def sha256(value: str) -> str:
    if not SHA256.match(value):
        raise ValueError("must be 64 lowercase hex digits (a sha256)")
    return value


def full_sha(value: str) -> str:
    if not FULL_SHA.match(value):
        if re.fullmatch(r"[0-9a-fA-F]{4,39}", value):
            raise ValueError(
                f"{value!r} is a short SHA; a pin needs the full 40-hex commit "
                "(git rev-parse <sha> on a checkout gives it)")
        raise ValueError(
            f"{value!r} is not a full 40-hex commit; branches, tags and short SHAs move or "
            "collide, so a pin refuses them")
    return value


def exact_version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{value!r} is not a valid exact version (PEP 440)") from None
    if any(ch in value for ch in "<>=!~*, "):
        raise ValueError(f"{value!r} must be one exact version, not a range")
    return value


def dist_name(value: str) -> str:
    if not DIST_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid distribution name")
    return value


def _finite(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError("must be a finite number")
    return value


SafeName = Annotated[str, AfterValidator(safe_name)]
Sha256 = Annotated[str, AfterValidator(sha256)]
FullSha = Annotated[str, AfterValidator(full_sha)]
ExactVersion = Annotated[str, AfterValidator(exact_version)]
DistName = Annotated[str, AfterValidator(dist_name)]
# strict: "87", 87.0 and true are not token ids (lax parsing would take all three)
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID, strict=True)]
Logprob = Annotated[float, AfterValidator(_finite), Field(le=0.0, strict=True)]
Count = Annotated[int, Field(ge=0, strict=True)]


CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character shown as an escape, for printing a value read
    from someone else's file on one line (a newline could otherwise print a verdict). The
    same escaping as ``core.errors.as_data``, without its length bound."""
    return as_data(text, limit=max(len(text) * 10, 1))


# A number in a file someone else wrote: at most this many digits in a row inside a string
# (a version's part, a size, a patch's condition: Python's int() refuses 4,300 and more,
# exit 70 before), and an integer within TOML's 64 bits.
MAX_DIGITS = 64  # a sha256 in hex may be all digits
DIGIT_RUN = re.compile(r"\d{" + str(MAX_DIGITS + 1) + ",}")
INT_LIMIT = 2**63


def unsafe_values(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(field, problem) for every value in ``value`` (keys included) that no field may hold,
    whatever its type says: a string with a control character (a tab aside), which printed
    could print a line of its own (a newline and ``ORACLE_IDENTITY_OK``) or rewrite the
    terminal; a run of more than MAX_DIGITS digits; an integer outside 64 bits."""
    out: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            field = f"{where}.{k}" if where else str(k)
            if CONTROL.search(str(k)):
                out.append((field, "key holds a control character"))
            elif DIGIT_RUN.search(str(k)):
                out.append((field, f"key holds a number of more than {MAX_DIGITS} digits"))
            out += unsafe_values(v, field)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += unsafe_values(v, f"{where}[{i}]")
    elif isinstance(value, str) and CONTROL.search(value):
        ch = CONTROL.search(value)
        assert ch is not None
        out.append((where or "<top level>", f"holds control character {ch.group()!r} "
                    "(newlines and escapes are refused in pin values)"))
    elif isinstance(value, str) and DIGIT_RUN.search(value):
        run = DIGIT_RUN.search(value)
        assert run is not None
        out.append((where or "<top level>", f"holds a number of {len(run.group())} digits "
                    f"(at most {MAX_DIGITS})"))
    elif isinstance(value, int) and not isinstance(value, bool) and \
            not -INT_LIMIT <= value < INT_LIMIT:
        out.append((where or "<top level>", "an integer outside 64 bits"))
    return out


def check_schema_number(data: Any, path: Path, key: str, supported: int) -> None:
    """A versioned file's schema number, before its fields: a newer file says so plainly."""
    if not isinstance(data, dict):
        raise BadInput(path, [("<top level>", "expected a JSON object")])
    number = data.get(key)
    if not isinstance(number, int) or isinstance(number, bool):
        raise BadInput(path, [(key, "missing or not an integer: not a file of this tool")])
    if number > supported:
        raise BadInput(path, [(key, f"schema {number} is newer than this oracle-build reads "
                               f"({supported}); upgrade oracle-build")])
    if number < 1:
        raise BadInput(path, [(key, f"unknown schema {number}")])


ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """A pin's environment table: variable names only, never VLLM_USE_PRECOMPILED, a sane
    MAX_JOBS."""
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if key == "VLLM_USE_PRECOMPILED":
            raise ValueError(
                "VLLM_USE_PRECOMPILED downloads kernels from nightly wheels; an oracle is "
                "built from source, so a pin may not set it (older vLLM treats even '0' as on)")
    jobs = env.get("MAX_JOBS")
    if jobs is not None and not (jobs.isascii() and jobs.isdigit() and 1 <= int(jobs) <= 4096):
        raise ValueError(f"MAX_JOBS = {jobs[:40]!r}: the compile's parallel jobs, a whole "
                         "number from 1 to 4096")
    return env


def relative_file(value: str) -> str:
    """A file named relative to the pin's folder that stays inside it."""
    parts = value.split("/")
    if (not value or value.startswith("/") or any(part in ("", ".", "..") for part in parts)
            or not all(SAFE_NAME_PART.match(part) for part in parts)):
        raise ValueError(f"{value!r} must be a relative path inside the pin's folder "
                         "(no '..', no absolute path, plain names)")
    return value


SAFE_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
