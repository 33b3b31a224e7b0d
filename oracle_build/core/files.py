"""Reading and writing the files the tool owns: strict parsing, atomic publishing.

Every reader turns a parse or validation failure into ``BadInput`` naming the
file and the field; every writer publishes through a temporary file in the
same folder and ``os.replace``, so a reader never sees half a file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from oracle_build.core.errors import BadInput, OutputFailed, as_data

M = TypeVar("M", bound=BaseModel)

MAX_JSON_DEPTH = 64


@dataclass
class RateFloor:
    """A transfer held to a minimum average rate over every window of ``window`` seconds
    (curl's --speed-limit/--speed-time): a peer that drips a byte at a time never trips a
    read's own timeout. ``slow(total)`` after each read: (rate, seconds) when the window just
    ended below ``minimum`` bytes a second, else None."""

    minimum: float
    window: float
    start: float = field(default_factory=time.monotonic)
    at_start: int = 0

    def slow(self, total: int) -> tuple[float, float] | None:
        now = time.monotonic()
        seconds = now - self.start
        if seconds < self.window:
            return None
        rate = (total - self.at_start) / seconds
        self.start, self.at_start = now, total
        return (rate, seconds) if rate < self.minimum else None


def sha256_file(path: Path, *, chunk: int = 1 << 20) -> str:
    """A regular file's sha256. Anything else (a FIFO would block the reader forever, a
    device never end) is refused on the open descriptor, before a byte is read."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(path, [("<file>", "not a regular file (a FIFO, socket or device): "
                                   "refused, never read")])
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            while block := fh.read(chunk):
                digest.update(block)
    finally:
        os.close(fd)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path, *, field: str = "<file>") -> bytes:
    """A file's bytes, refusing anything but a regular file (a FIFO or a device would block
    or never end). Opened without blocking, checked on the open descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise BadInput(path, [(field, "file not found")]) from exc
    except IsADirectoryError as exc:
        raise BadInput(path, [(field, "is a directory, expected a file")]) from exc
    except OSError as exc:
        raise BadInput(path, [(field, f"cannot read: {exc.strerror}")]) from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise BadInput(path, [(field, "is a directory, expected a file")])
        if not stat.S_ISREG(mode):
            raise BadInput(path, [(field, "not a regular file (a FIFO, socket or device): "
                                   "refused, it could block forever")])
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as exc:
        raise BadInput(path, [(field, f"cannot read: {exc.strerror}")]) from exc
    finally:
        os.close(fd)


def require_regular(path: Path, *, field: str = "<file>") -> None:
    """For readers that open the file themselves (numpy): a regular file, or BadInput."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as exc:
        raise BadInput(path, [(field, "file not found")]) from exc
    except OSError as exc:
        raise BadInput(path, [(field, f"cannot read: {exc.strerror}")]) from exc
    if not stat.S_ISREG(mode):
        raise BadInput(path, [(field, "not a regular file (a FIFO, socket, device or "
                               "folder): refused")])


def read_text(path: Path) -> str:
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(path, [(f"byte {exc.start}", "not valid UTF-8")]) from exc


def load_toml(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"at line (\d+), column (\d+)", str(exc))
        field = (f"line {m.group(1)} column {m.group(2)}" if m
                 else "<end of document>" if "end of document" in str(exc) else "<syntax>")
        raise BadInput(path, [(field, f"not valid TOML: {exc}")]) from exc
    except RecursionError:
        raise BadInput(path, [("<nesting>", "TOML nested too deeply")]) from None
    except ValueError as exc:  # an integer past Python's digit limit, and the like
        long = re.search(r"[0-9_]{100,}", text)
        field = (f"line {text.count(chr(10), 0, long.start()) + 1}" if long else "<value>")
        raise BadInput(path, [(field, f"not valid TOML: {str(exc)[:200]}")]) from None
    _check_depth(value, path, what="TOML")
    return value


def _check_depth(value: Any, path: Path, depth: int = 0, *, what: str = "JSON") -> None:
    if depth > MAX_JSON_DEPTH:
        raise BadInput(path, [("<nesting>", f"{what} nested deeper than {MAX_JSON_DEPTH} "
                                             "levels")])
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, path, depth + 1, what=what)
    elif isinstance(value, list):
        for item in value:
            _check_depth(item, path, depth + 1, what=what)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


# what this package writes beside a file before it is whole: ".<name>.<pid>.<random>.tmp"
# (atomic writes), ".<name>.<pid>.<random>.check" (a writability probe)
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.(tmp|check)")


def temporary_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone's: not ours to judge dead
    return True


def clear_stale_temporaries(folder: Path) -> list[str]:
    """Remove the temporary files a process of this package that died (killed mid-write)
    left in ``folder``: its own names only (TEMPORARY), of processes no longer alive, never a
    folder. The names removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = TEMPORARY.fullmatch(entry.name)
        if m is None or pid_alive(int(m.group("pid"))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    return removed


def open_for_writing(path: Path, *, append: bool = False, text: bool = False) -> Any:
    """The one way this package opens a file it writes under a name someone else could have
    prepared (a home's logs, a wheelhouse's downloads, a journal): never through a symlink
    (O_NOFOLLOW: a link planted at the name would have the write land on its target), never
    into a FIFO, a device or a socket (opened without blocking, then checked), then emptied
    unless ``append``. OSError (ELOOP for a link, EINVAL for the rest) for the caller to
    say, naming the file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_APPEND if append else 0), 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads, or a socket
            raise OSError(errno.EINVAL, "not a regular file", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        if not append:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    if text:
        return os.fdopen(fd, "a" if append else "w", encoding="utf-8", errors="replace")
    return os.fdopen(fd, "ab" if append else "wb")


def check_writable(path: Path, *, what: str) -> None:
    """Before any work: ``path`` can be written (its folder exists or can be made, a file can
    be created there; a temporary one, removed) and is not a folder. OutputFailed (exit 14)
    names the option and the path: a report nobody can write is found before the engine
    runs, not after the verdict was printed."""
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path),
                                     suffix=".check")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputFailed(f"{what} {as_data(str(path))}: cannot be written: "
                           f"{exc.strerror or exc}",
                           hint="a writable folder with room; nothing was run") from None


def json_value(text: str | bytes) -> Any:
    """``json.loads`` for text that came from outside (a registry's answer, a journal, a
    probe's output): JSON nested past Python's recursion limit is a ``ValueError`` like any
    other malformed JSON, which every reader already handles (it was a RecursionError:
    exit 70). The one place the package parses JSON text (a test keeps it so)."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else ""
        raise json.JSONDecodeError("JSON nested too deeply", doc, 0) from None


def load_json(path: Path) -> Any:
    text = read_text(path)
    if not text.strip():
        raise BadInput(path, "file is empty")
    try:
        value = json.loads(text, parse_constant=_reject_constant,
                           object_pairs_hook=_no_duplicate_keys)
    except RecursionError as exc:
        raise BadInput(path, [("<nesting>", "JSON nested too deeply")]) from exc
    except _DuplicateKey as exc:  # JSON readers disagree on which one wins: refuse both
        raise BadInput(path, [(exc.key, "key given twice in one object")]) from None
    except json.JSONDecodeError as exc:
        raise BadInput(path, [(f"line {exc.lineno} column {exc.colno}",
                               f"not valid JSON: {exc.msg}")]) from exc
    except ValueError as exc:  # NaN/Infinity, refused by _reject_constant
        raise BadInput(path, [("<number>", f"not valid JSON: {exc}")]) from exc
    _check_depth(value, path)
    return value


# A discriminated union's tag appears in pydantic's error location after its field; files
# never name it. Keyed by the field (golden.oracle: the tags "oracle" and "stated"), or by
# the table holding one per key (a pin's targets.<name>), with the key naming its tag there
# (the target's "device": its value in the file is the tag, whatever devices there are).
UNION_TAGS = {"oracle": {"oracle", "stated"}}
UNION_TABLE_TAGS = {"targets": "device"}


def field_path(loc: tuple[int | str, ...], data: Any = None) -> str:
    """Pydantic's error location as the file's own path to the field (``data``: what was
    validated, where a table entry's union tag is read)."""
    out = ""
    for n, part in enumerate(loc):
        if n and part in UNION_TAGS.get(str(loc[n - 1]), ()):
            continue
        tag_key = UNION_TABLE_TAGS.get(str(loc[n - 2])) if n > 1 else None
        if tag_key is not None:
            table = data.get(loc[n - 2]) if isinstance(data, dict) and n == 2 else None
            entry = table.get(loc[n - 1]) if isinstance(table, dict) else None
            if isinstance(entry, dict) and entry.get(tag_key) == part:
                continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<top level>"


def validate(model: type[M], data: Any, path: Path, *, context: dict[str, Any] | None = None) -> M:
    """Validate ``data`` against ``model``; failures name the file and every bad field."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            msg = err["msg"]
            loc = field_path(err["loc"], data)
            m = FIELD_ERROR.match(msg)
            if m:  # a model validator naming the field inside the model (field_error)
                sub = m.group(1)
                loc = sub if loc == "<top level>" else (
                    f"{loc}{sub}" if sub.startswith("[") else f"{loc}.{sub}")
                msg = m.group(2)
            if err["type"] == "extra_forbidden":
                msg = "unknown key (not part of the format; check its spelling)"
            elif err["type"] == "missing":
                msg = "required field is missing"
            problems.append((loc, msg))
        raise BadInput(path, problems) from None


FIELD_ERROR = re.compile(r"^Value error, @([^:]+): (.*)$", re.S)


def field_error(field: str, message: str) -> ValueError:
    """Raised by a model validator to name a field inside its model (``validate`` puts it on
    the error's location): ``raise field_error("agree", "...")``."""
    return ValueError(f"@{field}: {message}")


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def atomic_write_bytes(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder.

    With ``overwrite=False`` an existing ``path`` is never replaced (link, not rename).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".tmp",
                                    dir=path.parent)
    tmp = Path(tmp_name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails with FileExistsError if path exists
            tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def dumps_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, allow_nan=False, ensure_ascii=False) + "\n"


def atomic_write_json(path: Path, value: Any, *, overwrite: bool = True) -> None:
    atomic_write_bytes(path, dumps_json(value).encode("utf-8"), overwrite=overwrite)
