"""oracle-build sessions. Each is a thin wrapper: `nox -s X -- ARGS` runs
`python -m oracle_build X ARGS`, so everything here can be done without nox.

`nox` with no arguments runs the main job on the embedded default: build the
CPU oracle (or re-check its identity), then verify the bundled golden.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["build_oracle", "verify"]

PYTHON = "3.11"


def _cli(session: nox.Session, *args: str) -> None:
    session.install("-e", ".")
    session.run("python", "-m", "oracle_build", *args, *session.posargs)


@nox.session(python=PYTHON)
def build_oracle(session: nox.Session) -> None:
    """Build the pinned oracle and print ORACLE_IDENTITY_OK (`-- --pin P --target T --dry-run`).

    Also: --rebuild, --mirror M, --externals D, --home H, --wheelhouse W.
    """
    _cli(session, "build")


@nox.session(python=PYTHON)
def identity(session: nox.Session) -> None:
    """Re-check the built oracle's identity against its pin."""
    _cli(session, "identity")


@nox.session(python=PYTHON)
def capture(session: nox.Session) -> None:
    """Capture goldens (`-- goldens/NAME ... [--replace] [--out DIR]`; none: embedded default).

    With no spec, the embedded default is captured into a fresh folder under the oracle home.
    """
    _cli(session, "capture")


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """Re-run goldens: identity, then configuration, then tokens (`-- goldens/NAME --json`)."""
    _cli(session, "verify")


@nox.session(python=PYTHON)
def margin(session: nox.Session) -> None:
    """Teacher-forced top-k and top-2 margin (`-- GOLDEN PROMPT POSITION [--candidate F]`)."""
    _cli(session, "margin")


@nox.session(python=PYTHON)
def determinism(session: nox.Session) -> None:
    """K legs of a golden's configuration in one process (`-- GOLDEN_OR_SPEC --legs K`)."""
    _cli(session, "determinism")


@nox.session(python=PYTHON)
def compare(session: nox.Session) -> None:
    """Offline: another engine's output against a golden (`-- GOLDEN CANDIDATE.json`)."""
    _cli(session, "compare")


@nox.session(python=PYTHON)
def explain(session: nox.Session) -> None:
    """Find which setting moves a divergent token (`-- GOLDEN [--vary S=V1,V2] [--budget N]`)."""
    _cli(session, "explain")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Regenerate a pin's hash-locked dependency list (`-- --pin pins/cpu.toml`)."""
    _cli(session, "lock")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the tests, slow ones included (`-- -m "not slow"` for the fast ones only)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff and mypy --strict over the package."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", "oracle_build", "tests", "noxfile.py")
    session.run("mypy")
