"""The verdict lines, written here and nowhere else.

By construction: each function below returns its line marked (``errors.verdict_line``), and
every line the tool prints (``core.log.say`` and ``core.log.out``, the only writers of its
stdout and stderr) or writes to a report passes one renderer (``errors.defused_lines``),
which shows a marked line as it is and puts any other line that reads as a verdict behind a
bar: whatever a value held, and whether or not its call site escaped it, no other code can
print a line that starts with a verdict.

Our users' gates read these words: a CI script greps a log for ``ORACLE_IDENTITY_OK``, a
person reads ``=> PASS`` and the closing ``verify: ... (exit N)``, a step summary's headings.
Each is made by one function of this module, from the tool's own facts (a status, a count,
an exit code), never from a value read from a file, the environment or a registry; every
such value is printed through ``core.errors.as_data`` (escaped, on the tail of a line the
tool began). ``forged`` is the test's side of it: the lines of an output that look like a
verdict, which only the tool itself may have written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from oracle_build.core.errors import LOOKS_LIKE_VERDICT, as_data, verdict_line

IDENTITY_OK = "ORACLE_IDENTITY_OK"
IDENTITY_MISMATCH = "ORACLE_IDENTITY_MISMATCH"
# every check run passed, but the device's own did not run (build_oracle --no-gpu): never OK
IDENTITY_INCOMPLETE = "ORACLE_IDENTITY_INCOMPLETE"
NUMERICS_OK = "ORACLE_NUMERICS_OK"
NUMERICS_DRIFT = "ORACLE_NUMERICS_DRIFT"
NUMERICS_NOT_HELD = "ORACLE_NUMERICS_NOT_HELD"
NUMERICS_CAPTURED = "ORACLE_NUMERICS_CAPTURED"
REPRODUCED = "ORACLE_REPRODUCED"
NOT_REPRODUCED = "ORACLE_NOT_REPRODUCED"
NUMERICS_LINES = (NUMERICS_OK, NUMERICS_DRIFT, NUMERICS_NOT_HELD, NUMERICS_CAPTURED)
# an imported golden's banner: nothing can be re-run under a configuration never recorded
UNRECORDED_BANNER = "CONFIGURATION UNRECORDED: NOT ADJUDICABLE"

# what a gate script or a reader takes for a verdict, at the start of a line (after blanks):
# core/errors.py holds the pattern (every error line is rendered against it)
VERDICT = LOOKS_LIKE_VERDICT


def identity(ok: bool, skipped: tuple[str, ...] = ()) -> str:
    """The identity block's last line (mismatches follow a MISMATCH line, indented). With
    checks that did not run (``skipped``: the device's own words for them, constants of
    the device module), a pass is INCOMPLETE and names them: never OK."""
    if not ok:
        return verdict_line(IDENTITY_MISMATCH)
    if skipped:
        return verdict_line(f"{IDENTITY_INCOMPLETE}: every check ran and passed but the "
                            f"device's, which need the GPU (--no-gpu): {'; '.join(skipped)}")
    return verdict_line(IDENTITY_OK)


def reproduced(same: bool, files: int) -> str:
    """build_oracle --check's closing line: a cold rebuild gave the same compiled bytes (or
    not), over how many files."""
    assert files >= 0
    return verdict_line(f"{REPRODUCED if same else NOT_REPRODUCED}: {files} compiled files "
                        "compared")


def identity_then(ok_what: str) -> str:
    """``ORACLE_IDENTITY_OK: pushing``: identity passed, and what the command does next
    (the tool's own word, a constant of the caller)."""
    return verdict_line(f"{IDENTITY_OK}: {ok_what}")


def numerics(line: str, fingerprint: str | None = None) -> str:
    """The battery's closing line: one of ``NUMERICS_LINES``, then its fingerprint
    (``sha256:<hex>``, made by the tool from the goldens' bytes)."""
    assert line in NUMERICS_LINES, line
    if fingerprint is not None:
        assert re.fullmatch(r"(sha256:)?[0-9a-f]{8,128}", fingerprint), fingerprint
        return verdict_line(f"{line} {fingerprint}")
    return verdict_line(line)


def status_words(status: str) -> str:
    """A golden's status as the report says it: ``config_difference`` is
    ``CONFIGURATION DIFFERENCE``."""
    assert re.fullmatch(r"[a-z_]+", status), status
    return status.upper().replace("_", " ")


def golden(status: str, why: str = "") -> str:
    """A golden's verdict line in verify's report: ``  => PASS`` or ``  => DRIFT: why``
    (``why`` is the tool's own sentence; any value inside it was escaped where it was
    written, and it is escaped again here, so that it cannot end this line)."""
    return verdict_line(f"  => {status_words(status)}"
                        + (f": {as_data(why, 2000)}" if why else ""))


def verify_closing(counts: Mapping[str, int], exit_code: int) -> str:
    """``verify: drift 1, pass 2 (exit 1)``: the statuses counted, then the exit code."""
    for k in counts:
        assert re.fullmatch(r"[a-z_]+", k), k
    parts = ", ".join(f"{k} {int(n)}" for k, n in sorted(counts.items()))
    return verdict_line(f"verify: {parts} (exit {int(exit_code)})")


def summary_heading(exit_code: int) -> str:
    """The step summary's first heading (Markdown)."""
    return verdict_line(f"## oracle-build verify: exit {int(exit_code)}")


def summary_golden(name_md: str, status: str) -> str:
    """A golden's heading in the step summary; ``name_md`` already escaped for Markdown."""
    return verdict_line(f"### {name_md}: {status_words(status)}")


def forged(text: str, allowed: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The lines of ``text`` that look like a verdict and are not in ``allowed`` (the ones
    the tool wrote itself, given by the test that knows them)."""
    return [line for line in text.splitlines()
            if VERDICT.match(line) and line not in allowed]
