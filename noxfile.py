"""oracle-build sessions. Each is a thin wrapper: `nox -s X -- ARGS` runs
`python -m oracle_build X ARGS`, so everything here can be done without nox.

`nox` with no arguments runs the main job on the embedded default: build the
CPU oracle (or re-check its identity), then verify the bundled golden.

No session names a Python: the harness runs on whatever Python >= 3.11 nox runs on
(3.12 on Ubuntu 24.04 / DGX OS 7). The oracle venv's Python is the pin's, and its absence
is the build's preflight error (exit 6), never a skipped session. Every session ends with
the command's own exit code (0 pass, 1 drift, 2 bad input, 3 identity, 4 configuration...),
not nox's blanket 1.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import nox

# "uv|virtualenv" (a backend with a fallback) and error_on_missing_interpreters as used here
nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
if os.environ.get("PYTHONINSPECT"):
    # Python would end nox, and any exit code it ends with, as a SystemExit traceback, a
    # prompt and exit 1 (drift's code): start nox again without it, so every session ends
    # with the tool's own code.
    print("noxfile: PYTHONINSPECT is set; running nox again without it (it would turn every "
          "exit code into 1)", file=sys.stderr, flush=True)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONINSPECT"}
    os.execve(sys.executable, [sys.executable, "-m", "nox", *sys.argv[1:]], clean)  # noqa: S606

nox.options.sessions = ["build_oracle", "verify"]
# A session pinned to an absent interpreter is skipped with exit 0 by default: a gate host
# would "pass" without doing anything. Never.
nox.options.error_on_missing_interpreters = True

PYTHON = None  # the interpreter nox runs on
MIN_PYTHON = (3, 11)
EXIT_PREFLIGHT = 6
# The suite on two workers: on a 2-core machine most of a slow test keeps one core busy, so
# two tests at once use the second (docs/performance.md). Whole files per worker, so a
# file's module fixtures are built once, heaviest first (tests/conftest.py: the order, which
# `--no-loadscope-reorder` keeps); the engines still take turns. A later `-n` in the posargs
# wins (`nox -s tests -- -n 0`: one process).
TEST_WORKERS = ("-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")


def _run(session: nox.Session, *args: str) -> None:
    """Run a command; a failure ends nox with that command's exit code."""
    try:
        session.run(*args)
    except nox.command.CommandFailed as exc:
        raise SystemExit(exc.return_code or 1) from None


def _harness(session: nox.Session, *install: str) -> None:
    if sys.version_info < MIN_PYTHON:
        session.log(f"oracle-build's harness needs Python >= 3.11; nox runs on "
                    f"{sys.version.split()[0]}: run nox with a newer Python "
                    "(`pipx run --python python3.12 nox`, `uvx -p 3.12 nox`)")
        raise SystemExit(EXIT_PREFLIGHT)
    # The project is installed editable: code changes are live without reinstalling. Only
    # a different install request or pyproject.toml calls for one (pip took 4 s of every
    # `nox -s verify`); a venv nox recreates has no stamp and installs.
    location = getattr(session.virtualenv, "location", None)
    if not location:  # no venv of nox's own (--no-venv): install as asked
        session.install(*install)
        return
    stamp = Path(str(location)) / ".oracle-build-installed"
    want = hashlib.sha256("\0".join([*install, sys.version, Path("pyproject.toml").read_text()])
                          .encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == want and _imports_here(session):
        session.log("oracle-build already installed in this venv (pyproject.toml unchanged)")
        return
    stamp.unlink(missing_ok=True)
    session.install(*install)
    stamp.write_text(want)


def _imports_here(session: nox.Session) -> bool:
    """The venv's python imports oracle_build from this checkout (not a copy elsewhere)."""
    python = Path(str(session.virtualenv.location)) / "bin" / "python"
    try:
        out = session.run(str(python), "-c", "import oracle_build, os; "
                          "print(os.path.dirname(os.path.dirname(oracle_build.__file__)))",
                          silent=True, log=False, external=True)
    except nox.command.CommandFailed:
        return False
    return isinstance(out, str) and Path(out.strip()).resolve() == Path.cwd().resolve()


def _cli(session: nox.Session, *args: str) -> None:
    _harness(session, "-e", ".")
    _run(session, "python", "-m", "oracle_build", *args, *session.posargs)


@nox.session(python=PYTHON)
def build_oracle(session: nox.Session) -> None:
    """Build the pinned oracle and print ORACLE_IDENTITY_OK (`-- --pin P --target T --dry-run`).

    Also: --rebuild, --mirror M, --externals D, --home H, --wheelhouse W, --recompile,
    --no-compiler-cache, and --check (a source pin: a cold rebuild compared byte for byte).
    """
    _cli(session, "build")


@nox.session(python=PYTHON)
def identity(session: nox.Session) -> None:
    """Re-check the built oracle's identity against its pin."""
    _cli(session, "identity")


@nox.session(python=PYTHON)
def push(session: nox.Session) -> None:
    """Push the built oracle to the oracle cache, signed (`-- --cache REF --signing-key F`)."""
    _cli(session, "push")


@nox.session(python=PYTHON)
def pull(session: nox.Session) -> None:
    """Pull a cached oracle's wheels into the wheelhouse, verified (`-- --cache REF`)."""
    _cli(session, "pull")


@nox.session(python=PYTHON, name="list")
def list_cache(session: nox.Session) -> None:
    """Every oracle the cache holds, and which agree (`-- --cache REF [--json]`)."""
    _cli(session, "list")


@nox.session(python=PYTHON)
def keygen(session: nox.Session) -> None:
    """Make an Ed25519 key pair for signing pushes (`-- NAME-1 --out DIR`)."""
    _cli(session, "keygen")


@nox.session(python=PYTHON)
def capture(session: nox.Session) -> None:
    """Capture goldens (`-- goldens/NAME ... [--out DIR]`; none: the embedded default).

    `--replace --reason TEXT` re-baselines (the old golden is kept). With no spec, the
    embedded default is captured into a fresh folder under the oracle home.
    """
    _cli(session, "capture")


@nox.session(python=PYTHON)
def numerics(session: nox.Session) -> None:
    """The kernel battery: ORACLE_NUMERICS_OK and the fingerprint (`-- --only qwen3-moe`).

    Verifies this pin/target/CPU-variant's golden set; with none, captures it and names the
    folder to commit.
    """
    _cli(session, "numerics")


@nox.session(python=PYTHON)
def diff(session: nox.Session) -> None:
    """What moves between two oracles: `-- PIN_A PIN_B [GOLDENS...]` (both built)."""
    _cli(session, "diff")


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


# The CPU build of torch the units' CMake asks for torch's nvcc flags (its
# torch.utils.cpp_extension has the CUDA wheel's bytes: checked by the command); these
# machines hold it on disk (PyTorch's own index is out of reach); elsewhere PyPI's torch.
LOCAL_WHEELS = Path("/opt/wheels")
CPU_TORCH = "torch==2.13.0+cpu"


@nox.session(python=PYTHON)
def cuda_kernels(session: nox.Session) -> None:
    """Compile real vLLM 0.32.0 CUDA units for sm_121 and sm_110 here, no GPU needed
    (`-- --out DIR` leaves the objects and report.json; `-- --help`).

    NVIDIA's toolkit wheels by sha256 (pins/toolkits/), the flags of vLLM's own CMake,
    ccache -> oracle-build's nvcc launcher -> nvcc, in two fresh homes: one sha256 an object,
    the second home from the cache. About 5 minutes on 2 cores, 1.7 GB of downloads once.
    """
    _harness(session, "-e", ".")
    if not shutil.which("ccache"):
        session.log("cuda_kernels compiles through ccache: apt-get install ccache")
        raise SystemExit(EXIT_PREFLIGHT)
    session.install("cmake>=3.26,<5", "ninja")
    wheels = sorted(LOCAL_WHEELS.glob("torch-2.13.0+cpu-*.whl")) if LOCAL_WHEELS.is_dir() \
        else []
    if wheels:
        session.install(CPU_TORCH, "--find-links", str(LOCAL_WHEELS))
    else:
        session.log(f"no {CPU_TORCH} wheel in {LOCAL_WHEELS}: PyPI's torch==2.13.0 instead")
        session.install("torch==2.13.0")
    _run(session, "python", "-m", "oracle_build", "cuda-kernels", *session.posargs)


# The system programs the suite runs, and the Debian/Ubuntu package of each: a real OCI
# registry (distribution 2.8) and htpasswd for the oracle cache's tests, which start their
# own registry on 127.0.0.1 (never the packaged service), the browser the HTML report's
# tests open the page in, and the compiler cache the source builds compile through.
SYSTEM_PROGRAMS = {"docker-registry": "docker-registry", "htpasswd": "apache2-utils",
                   "chromium": "chromium", "ccache": "ccache",
                   # a second real C++ compiler: the engine's run-time kernels compiled by
                   # another compiler than the golden's (tests/test_run_closed.py)
                   "clang++": "clang"}
# ... and the system files: vLLM's CPU extension links libnuma (the source pin's configure
# test gets past the build's preflight only with its header)
SYSTEM_FILES = {"/usr/include/numa.h": "libnuma-dev",
                # clang's OpenMP runtime, which torch inductor's kernels link (a glob: its
                # folder names the LLVM version, 14 on Debian 12, 19 on Debian 13)
                "/usr/lib/llvm-*/lib/libomp.so": "libomp-dev"}
# Debian's way to keep a package's postinst from starting its service (invoke-rc.d asks it)
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def missing_programs(which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """The suite's system programs not on PATH (and system files not there): program or
    file -> the package that installs it."""
    return {**{prog: pkg for prog, pkg in SYSTEM_PROGRAMS.items() if which(prog) is None},
            **{f: pkg for f, pkg in SYSTEM_FILES.items()
               if not any(Path(m).is_file() for m in glob.glob(f))}}


def _as_root() -> list[str] | None:
    """The prefix that runs a command as root here: none when root, `sudo -n` when sudo
    works without a password, else None (nothing can be installed)."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo and subprocess.run([sudo, "-n", "true"], capture_output=True).returncode == 0:
        return [sudo, "-n"]
    return None


def system_setup(log: Callable[[str], None]) -> int:
    """Install the suite's missing system programs with apt-get (as root, or through `sudo
    -n`), saying what and why; 0 when all are there after, else the preflight exit code
    with each missing program and the command that installs it said."""
    missing = missing_programs()
    if not missing:
        return 0
    packages = sorted(set(missing.values()))
    command = "sudo apt-get install " + " ".join(packages)
    names = ", ".join(f"{prog} (package {pkg})" for prog, pkg in missing.items())
    root = _as_root()
    apt = shutil.which("apt-get")
    if apt is None or root is None:
        why = "no apt-get on this host" if apt is None else "not root, and `sudo -n` refused"
        log(f"the tests need {names}, not found on PATH; {why}, so they are not installed "
            f"here: install them (Debian/Ubuntu: `{command}`) and run again")
        return EXIT_PREFLIGHT
    log(f"the tests need {names}: installing {' '.join(packages)} with apt-get "
        f"({'as root' if not root else 'through sudo -n'}); the registry's packaged service "
        "is not started (the tests start their own on 127.0.0.1)")
    # through `env`: sudo resets the environment, so the variable is given on the command
    noninteractive = ["env", "DEBIAN_FRONTEND=noninteractive"]
    policy = not POLICY_RC_D.exists()  # another tool's policy is left as it is
    try:
        if policy:  # exit 101: "action forbidden", so the postinst starts no service
            subprocess.run([*root, "tee", str(POLICY_RC_D)], input=b"#!/bin/sh\nexit 101\n",
                           stdout=subprocess.DEVNULL, check=True)
            subprocess.run([*root, "chmod", "755", str(POLICY_RC_D)], check=True)
        for argv in ([*root, apt, "update", "-qq"],
                     [*root, *noninteractive, apt, "install", "-y", "-qq", *packages]):
            log("$ " + " ".join(argv))
            if subprocess.run(argv, stdout=subprocess.DEVNULL).returncode != 0:
                log(f"apt-get failed: install them by hand (`{command}`) and run again")
                return EXIT_PREFLIGHT
    finally:
        if policy:
            subprocess.run([*root, "rm", "-f", str(POLICY_RC_D)], check=False)
    still = missing_programs()
    if still:
        log(f"still not on PATH after apt-get: {', '.join(still)}; install them "
            f"(`{command}`) and run again")
        return EXIT_PREFLIGHT
    return 0


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the tests, slow ones included (`-- -m "not slow"` for the fast ones only).

    Two workers (pytest-xdist: whole files, heaviest first), one engine at a time across
    them; `-- -n 0` runs in one process.

    First installs what the suite runs and Python cannot install: Debian's docker-registry,
    apache2-utils (htpasswd), chromium, ccache and libnuma-dev, with apt-get where they are
    missing (as root or through `sudo -n`); elsewhere it stops (exit 6) naming each and how
    to install it.
    """
    code = system_setup(session.log)
    if code:
        raise SystemExit(code)
    _harness(session, "-e", ".[test]")
    _run(session, "pytest", *TEST_WORKERS, *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the package, its tests and benchmarks; mypy --strict over the package and
    the benchmarks."""
    _harness(session, "-e", ".[dev]")
    _run(session, "ruff", "check", "oracle_build", "tests", "noxfile.py", "benchmarks")
    _run(session, "mypy")
