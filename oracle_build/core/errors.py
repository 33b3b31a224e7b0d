"""One error base class; each failure kind has its own exit code.

Only ``cli.main`` catches these. Everything below raises, so tests call the
functions directly and assert on the exception type and message.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

# Exit codes, documented in the README. 0 = success.
EXIT_OK = 0
EXIT_DRIFT = 1  # verify: token drift
EXIT_BAD_INPUT = 2  # a file we read (pin, spec, golden, candidate) is invalid
EXIT_IDENTITY = 3  # the oracle is not the pin's (ORACLE_IDENTITY_OK not printed)
EXIT_CONFIG_DIFF = 4  # verify: the re-run's configuration differs from the golden's
EXIT_BUILD = 5  # a build/install command failed
EXIT_PREFLIGHT = 6  # the host does not fit (target, disk, memory, python, toolchain)
EXIT_NO_ORACLE = 7  # no oracle venv for this pin yet
EXIT_REFUSED = 8  # refused to act: would overwrite, lock held, legs disagree
EXIT_SOURCE = 9  # git source problem: shallow, dirty, wrong commit, unsafe URL
EXIT_UNESTABLISHED = 10  # a pin value the step needs is recorded as unestablished
EXIT_NOT_HERE = 11  # verify: golden's target is not this host (records still checked)
EXIT_ENGINE = 12  # the vLLM engine failed to start or to generate (log tail shown)
EXIT_MODEL = 13  # the model's files are not the ones the spec or golden pins
EXIT_OUTPUT = 14  # an output could not be written (read-only folder, disk full); nothing partial
EXIT_REGISTRY = 15  # the oracle cache's registry failed (unreachable, 5xx, reset) after retries
EXIT_REGISTRY_AUTH = 16  # the registry refused our credentials, or we have none it accepts
EXIT_NOT_CACHED = 17  # the cache holds no artifact for this pin and target
EXIT_CACHE_REFUSED = 18  # an artifact refused: unsigned, untrusted, tampered, another pin's
EXIT_NOT_REPRODUCED = 19  # build --check: a cold rebuild gave other compiled bytes
EXIT_INTERNAL = 70  # an unforeseen error (a bug of ours): one line, the traceback in a log
EXIT_INTERRUPTED = 130


class OracleBuildError(Exception):
    """Base class. ``message`` says what failed and why; ``hint`` says which knob to turn."""

    exit_code = EXIT_INTERNAL
    label = "error"

    # True for the errors whose message quotes a registry's answer (a status text, a body,
    # a header, a field of a manifest or a signature): the whole message is printed as data
    # (``as_data``), so none of it can start a line; ``details`` are the lines of our own.
    quotes_input = False

    def __init__(self, message: str, *, hint: str | None = None,
                 details: list[str] | None = None) -> None:
        if self.quotes_input:
            message = as_data(message, 4000)
            hint = as_data(hint, 1000) if hint else hint
            details = [as_data(d, 1000) for d in details or []]
        if details:
            message += "".join(f"\n  {d}" for d in details)
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The one way an error reaches a terminal or a log: its lines, each with what
        could rewrite a terminal escaped, and any line that reads as a verdict (an error is
        never one, so such a line quotes something: a vLLM exception, a file's value) shown
        behind a bar, so no error prints a verdict word or a status arrow at a line's start,
        whatever its parts held."""
        text = f"oracle-build: {self.label}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return defused_lines(text)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


# What a gate script or a reader takes for a verdict, at the start of a line (after blanks).
# Here, below core/verdicts.py (which writes the lines and reads this), because every error
# line is rendered against it.
LOOKS_LIKE_VERDICT = re.compile(
    r"^\s*(ORACLE_[A-Z_]+|=> |verify: .*\(exit \d+\)|#+ oracle-build |"
    r"#+ .*: (PASS|DRIFT|ORACLE MISMATCH|CONFIGURATION DIFFERENCE)\b)")


# The mark a verdict line carries from core/verdicts.py (the only caller of ``verdict_line``)
# to the one renderer below, which takes it off: a per-process random token, so no value
# read from a file, the environment or a registry can carry it, whether or not the call site
# that printed the value escaped it.
_MARK = "\x1f" + secrets.token_hex(12) + "\x1f"


def verdict_line(line: str) -> str:
    """``line`` (one line, made by core/verdicts.py from the tool's own facts) marked as a
    verdict the tool wrote: the renderer shows it as it is."""
    assert "\n" not in line, line
    return _MARK + line


def defused_lines(text: str) -> str:
    """``text`` as lines a terminal, a log or a report can show: in each line what could
    rewrite a terminal escaped, and a line that reads as a verdict put behind a bar unless
    core/verdicts.py made it (the one place this is done: every line the tool prints, on
    stdout or stderr, its errors and its reports alike)."""
    out = []
    for line in text.split("\n"):
        own = line.startswith(_MARK)
        if own:
            line = line[len(_MARK):]
        shown = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(),
                             line.replace(_MARK, ""))
        out.append(f"  | {shown}" if LOOKS_LIKE_VERDICT.match(shown) and not own else shown)
    return "\n".join(out)


def plain(text: str) -> str:
    """``text`` without its verdict marks (a value compared, not printed)."""
    return text.replace(_MARK, "")


def as_data(text: str, limit: int = 1000) -> str:
    """Text that quotes what someone else wrote (a file's field, a registry's answer), as it
    may be printed: control characters escaped (a newline cannot start a line, an escape
    sequence cannot rewrite the terminal), the length bounded."""
    shown = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)
    return shown if len(shown) <= limit else shown[:limit] + "..."


class BadInput(OracleBuildError):
    """A file we read is invalid. Names the file and the field."""

    exit_code = EXIT_BAD_INPUT
    label = "bad input"

    def __init__(
        self,
        path: Path | str,
        problems: list[tuple[str, str]] | str,
        *,
        hint: str | None = None,
    ) -> None:
        self.path = str(path)
        if isinstance(problems, str):  # a problem of the file as a whole
            problems = [("<file>", problems)]
        self.problems = problems
        lines = [f"{as_data(self.path)}:"]
        for field, msg in problems:  # each problem one line: a field or value cannot add one
            lines.append(f"  {as_data(field)}: {as_data(msg)}" if field else f"  {as_data(msg)}")
        super().__init__("\n".join(lines), hint=hint)


class IdentityMismatch(OracleBuildError):
    exit_code = EXIT_IDENTITY
    label = "oracle identity mismatch"

    def __init__(
        self, mismatches: list[tuple[str, str, str]], *, where: str, hint: str | None = None
    ) -> None:
        self.mismatches = mismatches
        # every part may quote a file name in the venv, a record's or a golden's value
        lines = [f"the oracle at {as_data(where)} is not the pin's:"]
        for field, expected, found in mismatches:
            lines.append(f"  {as_data(str(field))}: expected {as_data(str(expected))}, "
                         f"found {as_data(str(found))}")
        super().__init__("\n".join(lines), hint=hint)




class BuildFailed(OracleBuildError):
    """``log``: the full log the message already names (None: it names none yet)."""

    log: str | None = None

    exit_code = EXIT_BUILD
    label = "build failed"


class PreflightFailed(OracleBuildError):
    exit_code = EXIT_PREFLIGHT
    label = "preflight"


class OracleMissing(OracleBuildError):
    exit_code = EXIT_NO_ORACLE
    label = "no oracle"


class Refused(OracleBuildError):
    exit_code = EXIT_REFUSED
    label = "refused"


class SourceError(OracleBuildError):
    exit_code = EXIT_SOURCE
    label = "source"


class Unestablished(OracleBuildError):
    exit_code = EXIT_UNESTABLISHED
    label = "unestablished pin value"



class EngineFailed(OracleBuildError):
    exit_code = EXIT_ENGINE
    label = "engine failed"


class ModelMismatch(OracleBuildError):
    exit_code = EXIT_MODEL
    label = "model mismatch"


class OutputFailed(OracleBuildError):
    exit_code = EXIT_OUTPUT
    label = "cannot write output"


class RegistryError(OracleBuildError):
    exit_code = EXIT_REGISTRY
    label = "registry"
    quotes_input = True

    def __init__(self, message: str, *, hint: str | None = None,
                 details: list[str] | None = None, status: int | None = None,
                 codes: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint=hint, details=details)
        self.status = status  # the HTTP status, when the registry answered with one
        self.codes = codes  # the OCI error codes of its body (MANIFEST_BLOB_UNKNOWN, ...)

    @property
    def blob_unknown(self) -> bool:
        """The registry refused a manifest naming a blob it does not hold."""
        return "MANIFEST_BLOB_UNKNOWN" in self.codes


class RegistryAuth(OracleBuildError):
    exit_code = EXIT_REGISTRY_AUTH
    label = "registry auth"
    quotes_input = True


class NotCached(OracleBuildError):
    exit_code = EXIT_NOT_CACHED
    label = "not in the cache"
    quotes_input = True


class CacheRefused(OracleBuildError):
    exit_code = EXIT_CACHE_REFUSED
    label = "cache artifact refused"
    quotes_input = True


class UntrustedSigner(CacheRefused):
    """A signature that verifies under a key the trusted-keys file does not hold (a pull
    may take it with --allow-untrusted; a listing shows it as untrusted)."""
