"""Shared fixtures. Slow ones build real things once per session: the CPU oracle (a real
venv with the real vLLM), a capture with the real engine. The wheelhouse is shared
with the developer's default one (every wheel is sha256-checked before use), so a
second run does not download 1.3 GB again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oracle_build import recipe
from oracle_build.contracts.pins import Pin, load_pin
from oracle_build.core import layout
from oracle_build.oracle import inventory

REPO = Path(__file__).resolve().parent.parent

# A shell that starts a job in the background without job control (`.ci/run &`, nohup) hands
# it SIGINT ignored, and every process it starts inherits that: a SIGINT the kill tests send
# would then be ignored by the build and capture they start, as by any process told to
# ignore it. The tests are of what the tool does with a SIGINT it receives, so SIGINT is
# handled here; a handler (unlike SIG_IGN) is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
CPU_PIN = REPO / "pins" / "cpu.toml"
GPU_PIN = REPO / "pins" / "vllm-555967922.toml"
TINY_SPEC = REPO / "goldens" / "tiny-llama-greedy"


def established_gpu_pin(tmp_path: Path) -> Path:
    """The GPU pin with every external's commit filled in, as `externals` would."""
    out = []
    for n, line in enumerate(GPU_PIN.read_text().splitlines()):
        if line.startswith("commit = { status"):
            line = f'commit = "{n:040x}"'
        out.append(line)
    path = tmp_path / "gpu.toml"
    path.write_text("\n".join(out) + "\n")
    return path


def shared_wheelhouse() -> Path:
    env = os.environ.get("ORACLE_BUILD_TEST_WHEELHOUSE")
    if env:
        return Path(env)
    return layout.default_wheelhouse(layout.default_home())


def site_packages(venv: Path) -> Path:
    """A venv's site-packages, whatever its Python version (lib/pythonX.Y/site-packages)."""
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    return site.resolve()


# A passing test's tmp_path goes at its teardown and a failing one's is kept for inspection
# (pyproject.toml: tmp_path_retention_policy = "failed"; an oracle is 3.4 GB).

# Two workers (pytest-xdist; `nox -s tests` passes `-n 2 --dist loadfile`): on these 2-core
# machines most of a slow test is one busy core (vLLM's import, an engine that serves on one
# torch thread, hashing, unpacking), so two tests at once use the second. What they share:
# - one engine at a time on the host, whichever worker or home starts it: every engine the
#   tool starts (and a benchmark's bare one) holds ORACLE_BUILD_ENGINE_LOCK, which the run
#   sets once, for every worker, to a lock file in SHARED;
# - the engines' compile caches (ORACLE_BUILD_COMPILE_CACHE, set the same way to a folder
#   in SHARED): a kernel torch compiles for one test's engine is loaded by the next, in
#   whichever home, and a run leaves nothing in the host's /tmp/torchinductor_<user>;
# - the session warm-ups, in turns through a lock file in SHARED, as cibuildwheel's tests
#   share theirs: the session oracle, built once in a home in SHARED (another worker
#   re-checks a hard-linked copy of it in a home of its own: `cpu_oracle`), which fills the
#   default wheelhouse on a fresh machine, and the JUnit schema's download;
# - nothing else: every other home and folder is a test's or a worker's own.
# SHARED is made by the process that starts the run (the controller, or a plain pytest) and
# inherited by its workers, which start after pytest_configure. A passing run removes it; a
# failing one keeps it (the session oracle's build log), as pytest keeps a failing run's
# folders.
SHARED_ENV = "ORACLE_BUILD_TEST_SHARED"
ENGINE_LOCK_ENV = "ORACLE_BUILD_ENGINE_LOCK"
COMPILE_CACHE_ENV = "ORACLE_BUILD_COMPILE_CACHE"
_OWN_SHARED: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(SHARED_ENV):
        shared = Path(os.environ[SHARED_ENV])
    elif hasattr(config, "workerinput"):
        raise pytest.UsageError(f"an xdist worker without ${SHARED_ENV}: its engines could "
                                "overlap another worker's")
    else:
        shared = Path(tempfile.mkdtemp(prefix="oracle-build-tests-"))
        os.environ[SHARED_ENV] = str(shared)
        _OWN_SHARED.append(shared)
    os.environ.setdefault(ENGINE_LOCK_ENV, str(shared / "engine.lock"))
    os.environ.setdefault(COMPILE_CACHE_ENV, str(shared / "compile-cache"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus != 0:
        _OWN_SHARED.clear()  # kept for inspection


def pytest_unconfigure(config: pytest.Config) -> None:
    for shared in _OWN_SHARED:
        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(SHARED_ENV, None)
        if os.environ.get(ENGINE_LOCK_ENV) == str(shared / "engine.lock"):
            os.environ.pop(ENGINE_LOCK_ENV)
        if os.environ.get(COMPILE_CACHE_ENV) == str(shared / "compile-cache"):
            os.environ.pop(COMPILE_CACHE_ENV)


def taking_turns(what: str) -> Any:
    """A lock every worker of this run shares, for a warm-up that writes where all read."""
    from oracle_build.core.filelock import held

    return held(Path(os.environ[SHARED_ENV]) / f"{what}.lock", what=what)


# Per-test time limits (pytest-timeout, pyproject.toml's default for a test that starts an
# engine or two): a hang fails that test, with its stack, not the whole run. The session
# fixtures build in whichever test first asks for them: that test gets the build's budget.
# With two workers taking whole files (`--dist loadfile`), any file may be a worker's first
# to need the session's oracle: the first such test of each file gets it.
FIRST_BUILD_TIMEOUT = 3600
FILE_TIMES: dict[str, float] = {}
# Files in the order their work is handed out, heaviest first (seconds summed in the last
# measured run: docs/performance.md), so that two workers end together instead of one
# waiting on the other's last long file; a file not named here comes after them (the fast
# ones). `--no-loadscope-reorder` keeps this order (xdist's own puts the most tests first).
HEAVY_FIRST = ["test_oracle_cpu.py", "test_cache.py", "test_faults_cpu_pin.py",
               "test_faults.py", "test_capture.py", "test_benchmarks.py",
               "test_source_archive.py",
               "test_oracle_change.py", "test_explain.py", "test_numerics.py",
               "test_gate_host.py", "test_portable.py", "test_verify.py", "test_forging.py",
               "test_analyze.py", "test_wheelhouse.py", "test_html.py", "test_variants.py",
               "test_source.py"]
RUN_START = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
    seen: set[Path] = set()
    for item in items:
        if "cpu_oracle" not in getattr(item, "fixturenames", ()) or item.path in seen:
            continue
        seen.add(item.path)
        marker = item.get_closest_marker("timeout")
        own = float(marker.args[0]) if marker and marker.args else 0.0
        item.add_marker(pytest.mark.timeout(FIRST_BUILD_TIMEOUT + own))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    FILE_TIMES[path] = FILE_TIMES.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Time per test file (setup, call and teardown of its tests; a session fixture's build
    counts in the file whose test first asked for it on that worker), beside --durations,
    and the run's wall time: with two workers the files' times add up to more than it."""
    if not FILE_TIMES:
        return
    terminalreporter.write_sep("=", "time per test file")
    for path, seconds in sorted(FILE_TIMES.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
    terminalreporter.write_line(f"{sum(FILE_TIMES.values()):8.1f}s  all files, added up")
    terminalreporter.write_line(f"{time.monotonic() - RUN_START:8.1f}s  the run's wall time")


@pytest.fixture(autouse=True)
def _no_env_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ORACLE_BUILD_HOME", "ORACLE_BUILD_PIN", "ORACLE_BUILD_VLLM_MIRROR",
                "ORACLE_BUILD_EXTERNALS"):
        monkeypatch.delenv(key, raising=False)


@dataclass
class BuiltOracle:
    pin: Pin
    home: Path
    wheelhouse: Path
    venv: Path
    outcome: recipe.BuildOutcome


@pytest.fixture(scope="session")
def cpu_oracle(tmp_path_factory: pytest.TempPathFactory) -> BuiltOracle:
    """The real CPU oracle, built once per run through build_oracle itself, in a home in
    SHARED (every worker's tests may read it until the run ends). Another worker publishes a
    hard-linked copy of it and its anchor in a home of its own (`linked_copy`: seconds, not
    a second install; one page cache for both) and re-checks it there through build_oracle:
    identity, every file hashed, nothing rebuilt. Its tests then never touch the first
    worker's home, only the same files."""
    pin = load_pin(CPU_PIN)
    wheelhouse = shared_wheelhouse()
    shared_home = Path(os.environ[SHARED_ENV]) / "oracle-home"
    built = layout.oracle_path(shared_home, pin.key)
    with taking_turns("session oracle build"):
        if not built.exists():  # the run's first: build it
            outcome = recipe.build_oracle(pin, "cpu", home=shared_home,
                                          wheelhouse_root=wheelhouse)
            return BuiltOracle(pin, shared_home, wheelhouse, built, outcome)
        home = tmp_path_factory.mktemp("oracle-home")
        venv = layout.oracle_path(home, pin.key)
        venv.parent.mkdir(parents=True)
        if home.stat().st_dev == built.stat().st_dev:  # else no links: build
            linked_copy(built, venv)
            anchor = inventory.anchor_path(built)
            shutil.copy2(anchor, inventory.anchor_path(venv))
        outcome = recipe.build_oracle(pin, "cpu", home=home, wheelhouse_root=wheelhouse)
    assert outcome.identity.ok, outcome.identity.mismatches
    return BuiltOracle(pin, home, wheelhouse, venv, outcome)


def default_compiler(oracle: BuiltOracle) -> str:
    """The fingerprint of the run-time compiler the tool gives this oracle's engines: its
    compile cache is that compiler's folder of the pin's (engine/compiler.py)."""
    from oracle_build import host
    from oracle_build.engine import compiler as runtime

    target = oracle.pin.target("cpu")
    return runtime.choose(target, host.hold(target)).fingerprint


def linked_copy(src: Path, dest: Path) -> Path:
    """A copy of a folder (a venv, a wheelhouse) whose files are hard links to ``src``'s: an
    oracle venv in 2 s instead of a 3.4 GB install, a wheelhouse without 857 MB copied. A
    test may add, remove, rename or reinstall files in it: each of those makes or drops a
    link (uv's uninstall unlinks; its installs and Python's bytecode writes write new files),
    so ``src`` never sees it. What no test may do is edit a file of it in place: that would
    edit ``src`` too (`break_link` first)."""
    shutil.copytree(src, dest, symlinks=True, copy_function=os.link)
    return dest


def break_link(path: Path) -> Path:
    """Give ``path`` (a file of a linked copy) an inode of its own before editing it."""
    tmp = path.with_name(path.name + ".unlinked")
    shutil.copy2(path, tmp)
    os.replace(tmp, path)
    return path


@pytest.fixture
def scratch_venv(cpu_oracle: BuiltOracle, tmp_path: Path) -> Iterator[Path]:
    """A second real venv holding exactly the CPU oracle's files, for tests that damage a
    venv: a hard-linked copy of the session's oracle (`linked_copy`) without its
    build record, as a staged venv before publish is. It was an offline install of the
    locked set from the wheelhouse, a minute each: the files are the same, byte for byte
    (the same links), and test_scratch_copy_passes_only_as_staged checks it still passes
    the probe. The session's oracle is checked against its manifest after each use: a test
    that edited a shared file in place fails here."""
    venv = linked_copy(cpu_oracle.venv, tmp_path / "venv")
    shutil.rmtree(venv / layout.RECORD_DIR)
    yield venv
    shutil.rmtree(venv, ignore_errors=True)
    assert_session_oracle_unchanged(cpu_oracle)


def assert_session_oracle_unchanged(oracle: BuiltOracle) -> None:
    """After a test that had a linked copy: every file of the session's oracle as its
    manifest says (size and mtime, its hash where they moved), none added or gone."""
    files, problems = inventory.load(oracle.venv)
    assert files is not None and not problems, problems
    check = inventory.check(oracle.venv, files)
    assert not check.mismatches, ("a test changed the session's oracle through a hard link",
                                  check.mismatches)


@dataclass
class Captured:
    oracle: BuiltOracle
    golden_path: Path
    stderr: str = ""  # what the capture said
    evil_ran: Path | None = None  # written by the caller's hostile logging config, if it ran


# Issue 45: a caller's environment that would run code in the engine (vLLM hands this file
# to logging.config.dictConfig, whose "()" factory runs any callable): the session's capture
# runs under it, and its tokens must be the committed golden's.
EVIL_PY = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from vllm.v1.sample import sampler as s
f = s.Sampler.forward
def g(self, logits, *a, **k):
    logits = logits.clone(); logits[:, 13] += 50.0
    return f(self, logits, *a, **k)
s.Sampler.forward = g
"""


@pytest.fixture(scope="session")
def captured(cpu_oracle: BuiltOracle) -> Captured:
    """The embedded default captured once by the real CPU engine (one engine start), as a
    user runs it: `capture` with no spec, from the repository, into the oracle's home, from
    an environment holding VLLM_LOGGING_CONFIG_PATH at a config that would patch the
    sampler (it must never reach the engine)."""
    import contextlib
    import io
    import json as jsonmod
    import sys

    from oracle_build.cli import main

    before = (TINY_SPEC / "golden.json").read_bytes()
    # under the run's shared folder: removed with it
    evil = Path(tempfile.mkdtemp(prefix="evil-config-", dir=os.environ[SHARED_ENV]))
    marker = evil / "ran"
    (evil / "evil.py").write_text(EVIL_PY.format(marker=str(marker)))
    (evil / "evil.json").write_text(jsonmod.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"x": {"()": "runpy.run_path", "path_name": str(evil / "evil.py")}}}))
    cwd = os.getcwd()
    os.chdir(REPO)
    err = io.StringIO()
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(evil / "evil.json")
    try:
        with contextlib.redirect_stderr(err):
            code = main(["capture", "--home", str(cpu_oracle.home)])
    finally:
        os.environ.pop("VLLM_LOGGING_CONFIG_PATH", None)
        os.chdir(cwd)
        sys.stderr.write(err.getvalue())
    assert code == 0
    (path,) = (cpu_oracle.home / "captures").glob("*/tiny-llama-greedy/golden.json")
    assert (TINY_SPEC / "golden.json").read_bytes() == before
    return Captured(cpu_oracle, path, err.getvalue(), marker)


UNESTABLISHED_LOCK = '{ status = "unestablished", reason = "a test package with no dependencies" }'


def git_pin_text(repository: str, commit: str, version: str, extra: str = "",
                 lock: str = UNESTABLISHED_LOCK) -> str:
    """A git pin for a small test package (no dependencies, an import check only); ``lock``
    is the pin's `lock` value (a TOML value: a quoted file name establishes one)."""
    return f"""
schema = 1
id = "srcpkg"
python = "3.11"
lock = {lock}

[vllm]
kind = "git"
repository = "{repository}"
commit = "{commit}"
runtime_version = "{version}"
distribution = "vllm"

[targets.cpu]
device = "cpu"
machine = "x86_64"
kernel_check = "extension"
{extra}"""


def inline_golden_doc(path: Path | None = None) -> dict[str, Any]:
    """A golden's JSON document (default: the bundled golden) with its top-k rows inline
    (prompts[].topk, as format 1 and a sidecar-less format 2 hold them; no sidecar), so
    that a test edits one document. Still the same golden: same tokens, same rows."""
    import json

    from oracle_build.contracts.golden import golden_file, load_golden

    src = golden_file(path or TINY_SPEC)
    golden = load_golden(src)
    doc: dict[str, Any] = json.loads(src.read_text())
    if doc.get("topk") is not None:
        doc["topk"] = None
        for i, prompt in enumerate(doc["prompts"]):
            prompt["topk"] = [[[int(t), float(lp)] for t, lp in row]
                              for row in golden.prompt_topk(i) or []]
    return doc


def copy_tree_for_golden(tmp_path: Path, name: str = "tiny-llama-greedy",
                         source: Path | None = None) -> Path:
    """A goldens/<name>/ folder beside a pins/ copy, so a golden's relative pin resolves,
    holding ``source`` (default: the bundled golden; `host_golden` for a test that runs it
    on this host's engine) as `inline_golden_doc` writes it."""
    import json

    from oracle_build.contracts.golden import load_golden

    shutil.copytree(REPO / "pins", tmp_path / "pins")
    dest = tmp_path / "goldens" / name
    dest.mkdir(parents=True)
    shutil.copy2(TINY_SPEC / "spec.toml", dest / "spec.toml")
    (dest / "golden.json").write_text(json.dumps(inline_golden_doc(source), indent=1))
    load_golden(dest)  # still a valid golden
    return dest


@pytest.fixture(scope="session")
def host_golden(cpu_oracle: BuiltOracle) -> Path:
    """The golden of the embedded default this host's engine reproduces: the bundled one, on
    every x86_64 host with AVX2. It records x86_64-avx2 (captured on an AMD EPYC), and every
    engine re-running it is held to that kernel variant (vLLM's _C_AVX2, torch's, oneDNN's
    and MKL's AVX2 dispatch), so an AVX-512 or AMX host reproduces it bit for bit."""
    return TINY_SPEC / "golden.json"


def reliability(section: str, case: str) -> None:
    """Count a fault case survived, for the README's Reliability figures
    (written only when ORACLE_BUILD_RELIABILITY_OUT names a file)."""
    import json

    dest = os.environ.get("ORACLE_BUILD_RELIABILITY_OUT")
    if not dest:
        return
    path = Path(dest)
    data = json.loads(path.read_text()) if path.exists() else {}
    bucket = data.setdefault(section, {})
    bucket[case] = bucket.get(case, 0) + 1
    path.write_text(json.dumps(data, indent=2))


READ_ONLY = ("rev-parse", "status --porcelain", "describe --tags", "cat-file", "/probe.py ")


def planned_and_executed(build_log: Path) -> tuple[set[str], list[str]]:
    """From a build log: the commands the plan printed at its top, and the commands that
    ran (read-only questions between them, such as git rev-parse and the identity probe,
    left out)."""
    planned: set[str] = set()
    executed: list[str] = []
    for line in build_log.read_text(errors="replace").splitlines():
        if line.startswith("      $ "):
            planned.add(line[len("      $ "):])
        elif line.startswith("$ ") and not any(q in line for q in READ_ONLY):
            executed.append(line[2:])
    return planned, executed


# The JUnit schema CI reporters follow: Surefire's junit-10.xsd, which pytest validates its
# own junitxml against. It ships in pytest's sdist (testing/example_scripts/), fetched from
# the package registry by its sha256 and kept outside the repository.
JUNIT_SDIST = ("pytest==8.3.4",
               "965370d062bce11e73868e0335abac31b4d3de0e82f4007408d242b4f8610761")
JUNIT_MEMBER = "pytest-8.3.4/testing/example_scripts/junit-10.xsd"


@pytest.fixture(scope="session")
def junit_xsd() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
        "oracle-build-tests" / JUNIT_SDIST[1][:16]
    xsd = cache / "junit-10.xsd"
    with taking_turns("the JUnit schema's download"):
        if not xsd.exists():
            fetch_junit_xsd(cache, xsd)
    return xsd


def fetch_junit_xsd(cache: Path, xsd: Path) -> None:
    import sys
    import tarfile

    cache.mkdir(parents=True, exist_ok=True)
    req = cache / "requirements.txt"
    req.write_text(f"{JUNIT_SDIST[0]} --hash=sha256:{JUNIT_SDIST[1]}\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", "--require-hashes", "-q", "-r", str(req), "-d", str(cache)],
                   check=True, timeout=300)
    with tarfile.open(cache / "pytest-8.3.4.tar.gz") as tar:
        member = tar.extractfile(JUNIT_MEMBER)
        assert member is not None
        xsd.write_bytes(member.read())


def golden_says(doc: dict[str, Any], prompt: int, position: int, token: int, *,
                keep_original: bool) -> None:
    """Edit a format-1 golden document so that it says ``token`` at ``position``, as a golden
    captured by another oracle would: its tokens, its legs and its own top-k row agree (the
    token is the row's top-1, with the top-1's logprob). ``keep_original``: the token the
    golden said before stays in the row, with the new token's old logprob (a near-tie the
    other way round); otherwise it leaves the row (a real divergence, outside the top-k)."""
    p = doc["prompts"][prompt]
    row = p["topk"][position]
    original = p["token_ids"][position]
    top_lp = row[0][1]
    if keep_original:
        old_lp = next(lp for t, lp in row if t == token)
        rest = [[t, old_lp if t == original else lp] for t, lp in row if t != token]
        rest.sort(key=lambda e: -e[1])
    else:
        rest = [[t, lp] for t, lp in row[1:] if t not in (token, original)]
    p["topk"][position] = [[token, top_lp], *rest]
    p["token_ids"][position] = token
    for leg in (doc.get("legs") or {}).get("tokens", []):
        leg[prompt][position] = token
