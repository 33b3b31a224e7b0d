"""What the README claims and the CLI promises, each exercised: exit codes 8, 9, 10 from the
command line, the default pin choice, ORACLE_BUILD_HOME / ORACLE_BUILD_WHEELHOUSE, the
build's memory preflight, --no-wait, classification (context vs numerics, and a golden
tightening it), export from the CLI. Fast: none of these starts a build or an engine."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oracle_build.cli import main
from oracle_build.contracts.golden import ReadValue, load_golden, recorded
from oracle_build.contracts.pins import load_pin
from oracle_build.core import layout
from oracle_build.core.errors import OutputFailed, PreflightFailed
from oracle_build.core.filelock import held
from oracle_build.judge import config_diffs
from tests.conftest import CPU_PIN, REPO, TINY_SPEC, git_pin_text


def git_pin(tmp_path: Path, *, repository: str, externals: str = "") -> Path:
    """A git pin for a small repository made here (a commit three past tag v0.1.0)."""
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                               "user.email=t@example.com", *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (repo / "a.txt").write_text("a")
    git("add", "-A")
    git("commit", "-qm", "a")
    git("tag", "v0.1.0")
    commit = git("rev-parse", "HEAD")
    pin = tmp_path / "git.toml"
    pin.write_text(git_pin_text(repository or str(repo), commit,
                                f"0.1.1.dev0+g{commit[:9]}", externals))
    return pin


def test_unsafe_mirror_is_exit_9_before_any_work(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pin = git_pin(tmp_path, repository="")
    code = main(["build", "--pin", str(pin), "--home", str(tmp_path / "h"), "--mirror",
                 "ext::sh -c touch${IFS}/tmp/pwned"])
    assert code == 9, capsys.readouterr().err
    assert "remote-helper transport" in capsys.readouterr().err
    assert not (tmp_path / "h" / "staging").exists()


def test_unestablished_external_is_exit_10_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pin = git_pin(tmp_path, repository="", externals="""
[[externals]]
name = "cutlass"
repository = "https://github.com/nvidia/cutlass.git"
src_dir_var = "VLLM_CUTLASS_SRC_DIR"
commit = { status = "unestablished", reason = "read from the checkout's cmake files" }
""")
    code = main(["build", "--pin", str(pin), "--home", str(tmp_path / "h")])
    err = capsys.readouterr().err
    assert code == 10, err
    assert "externals.cutlass.commit is unestablished" in err
    assert not (tmp_path / "h" / "staging").exists()


def test_no_wait_refuses_while_another_build_holds_the_lock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "h"
    pin = load_pin(CPU_PIN)
    with held(layout.build_lock(home, pin.key), what="a build in another process"):
        code = main(["build", "--pin", str(CPU_PIN), "--home", str(home), "--no-wait"])
    err = capsys.readouterr().err
    assert code == 8, err
    assert "another run holds" in err and "--no-wait" in err
    assert not (home / "staging").exists()


def test_engine_lock_is_the_homes_or_one_for_the_host(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One engine at a time per home, or per host: ORACLE_BUILD_ENGINE_LOCK names one lock
    file for every home (the engine waits on it: test_faults holds it against a verify)."""
    monkeypatch.delenv("ORACLE_BUILD_ENGINE_LOCK", raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    assert layout.engine_lock(a) == a / "locks" / "engine.lock"
    assert layout.engine_lock(a) != layout.engine_lock(b)
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(tmp_path / "host" / "engine.lock"))
    assert layout.engine_lock(a) == layout.engine_lock(b) == tmp_path / "host" / "engine.lock"
    # a lock path that cannot be made is an output error (exit 14) naming it, not exit 70
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(tmp_path / "file" / "engine.lock"))
    with pytest.raises(OutputFailed) as caught, held(layout.engine_lock(a), what="an engine"):
        pass
    assert caught.value.exit_code == 14
    assert f"cannot use the lock file {tmp_path / 'file' / 'engine.lock'}" in \
        caught.value.message


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["build", "--dry-run", "--json", *args]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_default_pin_home_and_wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("ORACLE_BUILD_WHEELHOUSE", raising=False)
    resolved = _dry_run(capsys)["resolved"]
    # this x86_64 host has no GPU: the pin under ./pins with a target for it is the CPU pin
    assert resolved["pin"] == str(CPU_PIN) and resolved["target"] == "cpu"
    monkeypatch.setenv("ORACLE_BUILD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORACLE_BUILD_WHEELHOUSE", str(tmp_path / "wheels"))
    resolved = _dry_run(capsys)["resolved"]
    key = load_pin(CPU_PIN).key
    assert resolved["venv"] == str(tmp_path / "home" / "oracles" / key)
    assert resolved["wheelhouse"] == str(tmp_path / "wheels" / key)
    monkeypatch.delenv("ORACLE_BUILD_WHEELHOUSE")
    assert _dry_run(capsys)["resolved"]["wheelhouse"] == str(tmp_path / "home" / "wheelhouse"
                                                              / key)
    # an explicit ORACLE_BUILD_PIN wins over the choice
    monkeypatch.setenv("ORACLE_BUILD_PIN", str(REPO / "pins" / "vllm-555967922.toml"))
    assert _dry_run(capsys, "--target", "sm_110")["resolved"]["pin_id"] == "vllm-555967922"


def test_build_memory_preflight_names_both_numbers(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle_build import recipe

    monkeypatch.setenv("ORACLE_BUILD_MIN_MEMORY_GIB", "100000")
    p = recipe.plan(load_pin(CPU_PIN), "cpu", home=tmp_path / "h",
                    wheelhouse_root=tmp_path / "w")
    with pytest.raises(PreflightFailed) as info:
        recipe.run(p)
    assert re.search(r"[\d.]+ GiB of host memory available, the build needs 100000\.0 GiB",
                     info.value.message)
    assert not layout.oracle_path(tmp_path / "h", p.pin.key).exists()


def _recorded_and_rerun(**resolved_changes: Any) -> tuple[Any, dict[str, Any]]:
    golden = load_golden(TINY_SPEC)
    rec = recorded(golden, TINY_SPEC / "golden.json")
    engine = rec.engine
    resolved = dict(engine.resolved)
    for key, value in resolved_changes.items():
        resolved[key] = ReadValue.model_validate({"value": value, "from": "test"})
    new = {"engine": engine.model_copy(update={"resolved": resolved}),
           "environment": dict(rec.environment), "sampling": dict(golden.sampling),
           "calls": rec.batch["calls"]}
    return rec, new


def test_classification_context_numerics_and_tightening() -> None:
    rec, new = _recorded_and_rerun()
    assert config_diffs(rec, new) == ([], [])  # the golden against itself
    rec, new = _recorded_and_rerun(num_gpu_blocks=12345)
    numerics, context = config_diffs(rec, new)
    assert numerics == [] and [d.field for d in context] == ["resolved.num_gpu_blocks"]
    rec, new = _recorded_and_rerun(block_size=64)
    numerics, context = config_diffs(rec, new)
    assert [d.field for d in numerics] == ["resolved.block_size"] and context == []
    # a golden whose spec tightens num_gpu_blocks to numerics
    golden = rec.golden.model_copy(update={"classification": {
        "resolved.num_gpu_blocks": "numerics"}})
    tightened = rec.__class__(golden, rec.oracle, rec.engine, rec.spec, rec.batch,
                              rec.environment, rec.logprobs)
    _, new = _recorded_and_rerun(num_gpu_blocks=12345)
    numerics, context = config_diffs(tightened, new)
    assert [d.field for d in numerics] == ["resolved.num_gpu_blocks"] and context == []


def test_export_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "tiny"
    assert main(["export", "--format", "vllm.cpp", str(TINY_SPEC), str(dest)]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert sorted(p.name for p in dest.iterdir()) == [
        "greedy_dist.npy", "greedy_ids.npy", "oracle.json", "p0_prompt.i32", "p1_prompt.i32",
        "p2_prompt.i32", "topk_ids.npy", "topk_logprobs.npy"]
    oracle = json.loads((dest / "oracle.json").read_text())
    assert oracle["capture"]["engine_config_recorded"] is True
    assert main(["export", "--format", "vllm.cpp", str(TINY_SPEC), str(dest)]) == 8


def test_contracts_import_no_engine_or_build_code() -> None:
    """Writing a schema loads the data contracts only (not the engine, the builder or uv)."""
    code = ("import sys, oracle_build.contracts.schemas as s; s.generated(); "
            "print(sorted(m for m in sys.modules if m.startswith(('oracle_build', 'uv'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    loaded = eval(out)  # a printed list of module names
    assert loaded and all(m.startswith(("oracle_build.contracts", "oracle_build.core"))
                          or m == "oracle_build" for m in loaded), loaded


def test_two_pins_fitting_this_host_equally_are_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default pin is never an alphabetical accident: a second CPU pin beside pins/cpu.toml
    stops the default choice (exit 6) naming both; a pin under pins/previous/ is not a
    candidate."""
    shutil.copytree(REPO / "pins", tmp_path / "pins")
    monkeypatch.chdir(tmp_path)
    assert main(["build", "--dry-run", "--json"]) == 0  # previous/cpu-0.31 is not considered
    capsys.readouterr()
    for name in ("cpu-0.31.toml", "cpu-0.31.lock.txt"):
        shutil.copy2(tmp_path / "pins" / "previous" / name, tmp_path / "pins" / name)
    assert main(["build", "--dry-run", "--json"]) == 6
    err = capsys.readouterr().err
    assert "several pins under pins/ fit this host" in err
    assert "pins/cpu.toml" in err and "pins/cpu-0.31.toml" in err


def test_tests_session_names_what_it_cannot_install(tmp_path: Path) -> None:
    """The README's test command on a host where the suite's system programs are missing and
    cannot be installed (no apt-get on PATH): it stops before any test with the preflight
    exit code, naming each program, its package and the command. Real nox, the real
    noxfile; a PATH holding none of them (nor apt-get). Where they are missing and apt-get
    works, the same session installs them: CI's `.ci/run` installs nothing itself."""
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "nox", "--no-venv", "-s", "tests"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": str(empty), "HOME": str(tmp_path)})
    said = done.stdout + done.stderr
    assert done.returncode == 6, said
    for prog, pkg in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils"),
                      ("chromium", "chromium"), ("ccache", "ccache")):
        assert f"{prog} (package {pkg})" in said, said
    assert "no apt-get on this host" in said
    import glob

    import noxfile
    files = {f: pkg for f, pkg in noxfile.SYSTEM_FILES.items()
             if not any(Path(m).is_file() for m in glob.glob(f))}
    assert "sudo apt-get install " + " ".join(sorted(
        {*noxfile.SYSTEM_PROGRAMS.values(), *files.values()})) in said
    assert "nox > pytest" not in said  # stopped before any test
    assert noxfile.missing_programs(lambda prog: "/usr/bin/" + prog) == files
    assert noxfile.missing_programs(lambda prog: None) == {**noxfile.SYSTEM_PROGRAMS, **files}


def test_every_slow_test_says_why() -> None:
    """A slow test (real venvs, the real engine) carries a docstring: what it proves and
    what makes it slow, so that CI's time can be read from the tests themselves."""
    import ast

    silent = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_slow = any(isinstance(n, ast.Assign) and "slow" in ast.unparse(n.value)
                          and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                          for n in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                slow = module_slow or any("slow" in ast.unparse(d) for d in node.decorator_list)
                if slow and not ast.get_docstring(node):
                    silent.append(f"{path.name}::{node.name}")
    assert silent == []
