"""The fifth hostile reading of main (issue 65): each case as a user with a hostile PATH,
golden, toolkit wheel or migration folder would hit it, against the real thing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.core.errors import EXIT_REFUSED, Refused
from tests.srcpkg import make_cuda_sdist, write_cuda_sdist_pin

LOCK = Path(__file__).resolve().parent.parent / "pins" / "toolkits" / "cuda-13.0.3.toml"


@pytest.fixture(scope="module")
def cuda_sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small CUDA package's sdist and its pin (tests/srcpkg.py)."""
    s = make_cuda_sdist(tmp_path_factory.mktemp("cuda-sdist"))
    return write_cuda_sdist_pin(s, LOCK), s.externals


def test_stop_after_builds_with_every_flag_the_whole_build_takes(
        tmp_path: Path, cuda_sdist: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Item 3: `build --no-gpu --stop-after venv` on a CUDA pin, on this host with no NVIDIA
    driver: it stops after the step, as asked (it stopped at preflight, exit 6, "no NVIDIA
    driver answers", with a hint to pass the flag it was given). Without --no-gpu it is
    refused at preflight, as the whole build is."""
    pin, externals = cuda_sdist
    # a CUDA build wants 60 GiB free; the steps before the compile need none of it
    monkeypatch.setenv("ORACLE_BUILD_MIN_FREE_GIB", "1")
    args = ["build", "--pin", str(pin), "--target", "sm_121", "--externals", str(externals),
            "--home", str(tmp_path / "h"), "--stop-after", "venv"]
    assert main(args) == 6
    assert "--no-gpu" in capsys.readouterr().err
    assert main([*args, "--no-gpu"]) == 0
    err = capsys.readouterr().err
    assert "stopped after venv" in err and "no NVIDIA driver" not in err


@pytest.mark.parametrize(("flag", "option", "value"), [
    ("--no-gpu", "no_gpu", True),
    ("--no-compiler-cache", "compiler_cache", False),
    ("--mirror=/srv/vllm.git", "mirror", "/srv/vllm.git"),
    ("--externals=/srv/externals", "externals_dir", Path("/srv/externals")),
    ("--checkout=/srv/checkout", "checkout", Path("/srv/checkout")),
])
def test_every_flag_that_changes_the_plan_reaches_each_way_a_build_is_planned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda_sdist: tuple[Path, Path],
        flag: str, option: str, value: Any) -> None:
    """Item 3, by construction: the dry run, a build stopped after a step and the whole
    build are planned from one resolution of the flags (recipe.PlanOptions). Each flag that
    changes the plan reaches recipe.plan on all three paths (the planner is stopped there,
    exit 8: what it was asked is the point)."""
    seen: list[dict[str, Any]] = []

    def plan(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise Refused("planned")

    monkeypatch.setattr(recipe, "plan", plan)
    pin, _externals = cuda_sdist
    base = ["build", "--pin", str(pin), "--target", "sm_121", "--home", str(tmp_path / "h"),
            "--no-gpu", flag]
    for more in (["--dry-run"], ["--stop-after", "venv"], ["--rebuild"]):
        assert main([*base, *more]) == EXIT_REFUSED
    assert len(seen) == 3
    for kwargs in seen:
        assert kwargs[option] == value, (flag, kwargs)


PLANTED = """#!/bin/sh
echo "$0" >> {marker}
exec {real} "$@"
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_made_path_holds_only_the_programs_the_recipe_resolved(tmp_path: Path) -> None:
    """Item 1, slow (the small sdist's whole build, about 20 s): the caller's PATH is
    `realcc:py/bin:/usr/bin:/bin`, where realcc/cc links to gcc and py/bin holds a real
    python3.11 (the interpreter's own binary, copied) and a `cc`, `as` and `ld` of its own
    (each notes that it ran, then runs the real one). The build's PATH holds a link per
    program the recipe resolved and recorded (its own bin folder), then the system's
    folders: none of the planted programs runs, and the record's compilers are what ran."""
    import json
    import os
    import shutil
    import stat
    import subprocess
    import sys

    from uv import find_uv_bin

    from oracle_build.contracts.pins import load_pin
    from oracle_build.core import layout
    from tests.conftest import REPO
    from tests.srcpkg import make_sdist, write_sdist_pin

    found = subprocess.run([find_uv_bin(), "python", "find", "--system", "3.11"],
                           capture_output=True, text=True, check=True).stdout.strip()
    realcc, py = tmp_path / "realcc", tmp_path / "py" / "bin"
    realcc.mkdir()
    py.mkdir(parents=True)
    (realcc / "cc").symlink_to(shutil.which("gcc") or "/usr/bin/gcc")
    (realcc / "c++").symlink_to(shutil.which("g++") or "/usr/bin/g++")
    shutil.copy2(os.path.realpath(found), py / "python3.11")
    marker = tmp_path / "planted-ran"
    for name, real in (("cc", shutil.which("gcc")), ("as", shutil.which("as")),
                       ("ld", shutil.which("ld"))):
        script = py / name
        script.write_text(PLANTED.format(marker=marker, real=real))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    s = make_sdist(tmp_path / "w")
    pin = write_sdist_pin(s)
    env = {**os.environ, "PATH": f"{realcc}:{py}:/usr/bin:/bin",
           "ORACLE_BUILD_COMPILER_CACHE": str(tmp_path / "cc-cache")}
    done = subprocess.run([sys.executable, "-m", "oracle_build", "build", "--pin", str(pin),
                           "--home", str(tmp_path / "home"), "--externals", str(s.externals),
                           "--no-compiler-cache"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ORACLE_IDENTITY_OK" in done.stdout
    assert not marker.exists(), f"a planted program ran: {marker.read_text()}"
    assert f"cc -> {realcc / 'cc'}" in done.stderr  # the plan names each program's link
    venv = layout.oracle_path(tmp_path / "home", load_pin(pin).key)
    record = json.loads(layout.build_record_path(venv).read_text())
    assert record["toolchain"]["compilers"]["cc"]["path"] == str(realcc / "cc")
    path = record["environment"]["base"]["PATH"].split(":")
    assert str(py) not in path and str(realcc) not in path


def _golden_folder(tmp_path: Path) -> Path:
    """The bundled golden as committed (golden.json, its top-k file, its spec) in a tree
    with the pins beside it, so its relative pin resolves."""
    import shutil

    from tests.conftest import REPO, TINY_SPEC

    shutil.copytree(REPO / "pins", tmp_path / "pins")
    dest = tmp_path / "goldens" / "tiny-llama-greedy"
    shutil.copytree(TINY_SPEC, dest, ignore=shutil.ignore_patterns("replaced"))
    return dest


def test_a_migration_refuses_a_folder_spec_that_changes_the_goldens_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 4: the folder's spec edited to a loose gate (near_tie, 50 nats, a made-up
    ratification) and max_model_len 256 -> 200: `capture --migrate` is refused, exit 8,
    naming each field, before any engine (the home stays empty), the golden untouched (on
    9f917cd it exited 0 and the new golden carried the new gate, recorded as a pure
    migration)."""
    folder = _golden_folder(tmp_path)
    before = (folder / "golden.json").read_bytes()
    spec = folder / "spec.toml"
    spec.write_text(spec.read_text().replace("max_model_len = 256", "max_model_len = 200")
                    + '\n[gate]\nkind = "near_tie"\nband_nats = 50.0\n'
                    'ratification = "made-up"\n')
    home = tmp_path / "home"
    assert main(["capture", str(folder), "--migrate", "--home", str(home)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    for field in ("spec.gate.kind", "spec.gate.band_nats", "spec.gate.ratification",
                  "spec.engine.max_model_len"):
        assert field in err, (field, err)
    assert (folder / "golden.json").read_bytes() == before
    assert not (home / "oracles").exists() and not (folder / "replaced").exists()


@pytest.mark.slow
def test_a_migration_changes_nothing_but_what_it_fills(
        cpu_oracle: Any, tmp_path: Path) -> None:
    """Item 4, slow (one real engine): the bundled golden as a golden from before its hold
    was recorded in full (its predicates taken out) is migrated: the run replays its own
    recorded spec and request, reproduces it bit for bit, and the new golden.json differs
    from the old one in the filled fields and `replaces` alone (the two JSON documents
    diffed key by key)."""
    import json

    from oracle_build import judge

    folder = _golden_folder(tmp_path)
    doc = json.loads((folder / "golden.json").read_text())
    doc["engine"]["kernel_variant"]["predicates"] = None
    doc["engine"]["kernel_variant"]["cpu_answers"] = None
    (folder / "golden.json").write_text(json.dumps(doc, indent=1))
    assert main(["capture", str(folder), "--migrate", "--home", str(cpu_oracle.home)]) == 0
    new = json.loads((folder / "golden.json").read_text())
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    judge.flat("", doc, a)
    judge.flat("", new, b)
    moved = {k.split(".")[1] + "." + k.split(".")[2] if k.startswith(".engine.") or
             k.startswith(".run.") else k.split(".")[1]
             for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>")}
    assert moved <= {"engine.kernel_variant", "run.network", "replaces"}, moved
    assert "engine.kernel_variant" in moved and "replaces" in moved
    filled = new["replaces"]["reproduced"]["filled"]
    assert "engine.kernel_variant" in filled
    assert new["replaces"]["reproduced"]["bit_for_bit"] is True


@pytest.mark.parametrize("planted", ["lib64-folder", "lib64-file", "lib-file", "lib-link"])
def test_a_toolkit_whose_bytes_match_but_whose_layout_does_not_is_named_exit_5(
        tmp_path: Path, planted: str) -> None:
    """Item 6: the toolkit's wheels unpacked (their sha256 the lock's) into a layout NVIDIA's
    wheels never have: a `lib64` already there, `lib` a file or a link. A clear error naming
    it (BuildFailed, exit 5), never an unforeseen one (exit 70: FileExistsError)."""
    from oracle_build.core.errors import EXIT_BUILD, BuildFailed
    from oracle_build.recipe.cuda import toolkit

    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    if planted == "lib64-folder":
        (cuda / "lib64").mkdir()
    elif planted == "lib64-file":
        (cuda / "lib64").write_text("x")
    elif planted == "lib-file":
        (cuda / "lib").write_text("x")
    else:
        (cuda / "lib").symlink_to("/etc")
    with pytest.raises(BuildFailed) as caught:
        toolkit._layout(cuda)
    assert caught.value.exit_code == EXIT_BUILD
    assert ("lib64" if planted.startswith("lib64") else "`lib`") in caught.value.message
    assert not (Path("/etc") / "libcuda.so").is_symlink()


def test_a_build_command_reads_no_pip_configuration_of_the_hosts(tmp_path: Path) -> None:
    """Item 6: a build command that does not download runs pip with no configuration file
    read, the system's included (this host's /etc/pip.conf names a constraint file, which
    pip's wheel step would have taken); a download reads the caller's (where the wheels
    are), as before: the control."""
    import subprocess
    import sys

    from oracle_build.core import env as envmod
    from oracle_build.core.proc import Cmd

    base = envmod.BuildBase(path=os.pathsep.join(envmod.SYSTEM_PATH),
                            home=str(tmp_path / "home"), tmpdir=str(tmp_path / "tmp"))
    argv = [sys.executable, "-m", "pip", "config", "list"]
    with envmod.building(base):
        closed = subprocess.run(argv, env=Cmd(argv).environment(), capture_output=True,
                                text=True, check=True)
        download = subprocess.run(argv, env=Cmd(argv, network=True).environment(),
                                  capture_output=True, text=True, check=True)
    read = [line for line in closed.stdout.splitlines() if not line.startswith(":env:")]
    assert read == [], read  # nothing but the setting that says so
    host = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    if host:  # a host with a pip configuration: the download reads it
        assert download.stdout.strip() != ""
