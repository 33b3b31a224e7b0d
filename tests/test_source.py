"""The from-source path, for real: a small package in a local git repository (version
from setuptools-scm tags, a compiled C extension), built through the same plan as vLLM
at a commit several commits past a tag."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from oracle_build import recipe
from oracle_build.contracts.pins import load_pin
from oracle_build.core import layout
from oracle_build.core.errors import BadInput, SourceError
from oracle_build.recipe import source, steps
from tests.conftest import planned_and_executed
from tests.srcpkg import Repo, git, make_repo, write_pin


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return make_repo(tmp_path_factory.mktemp("src") / "pkg")


@pytest.mark.slow
def test_builds_at_pinned_commit_with_scm_version(tmp_path: Path, repo: Repo) -> None:
    """Slow: two real builds of the small C-extension package from a real git repository (a
    clone, a wheel build, a venv), the second from the wheelhouse."""
    pin = load_pin(write_pin(tmp_path, repo))
    outcome = recipe.build_oracle(pin, "cpu", home=tmp_path / "home",
                                  wheelhouse_root=tmp_path / "wh")
    ident = outcome.identity
    assert ident.ok, ident.mismatches
    assert ident.summary()["vllm"] == repo.version  # dev count 3 and +g<sha> of the pin
    assert ident.facts["kernel"]["modules"] == ["vllm._C"]
    venv = layout.oracle_path(tmp_path / "home", pin.key)
    import json

    record = json.loads((venv / "oracle-build" / "build-record.json").read_text())
    assert record["source"]["commit"] == repo.pinned
    assert record["source"]["describe"].startswith("v0.1.0-3-g")
    assert record["origin"] == "built"
    assert record["wheel"]["version"] == repo.version
    assert len(record["wheel"]["sha256"]) == 64
    assert not any(r.startswith("torch") for r in record["build_requirements"])
    # what the checkout's cmake declares (nothing here: no CMake build) is recorded, not null
    assert record["externals_declared"] == []
    # every command that ran is one the plan printed: clone, fetch, checkout, build, install
    planned, executed = planned_and_executed(venv / "oracle-build" / "build.log")
    assert [c for c in executed if c not in planned] == []
    for what in (" clone --no-checkout -- ", " fetch --tags --force origin",
                 " checkout --detach ", " -m pip wheel --no-deps --no-build-isolation ",
                 f" vllm=={repo.version}"):
        assert any(what in c for c in executed), what
    # the built wheel is kept in the wheelhouse, keyed by the pin
    manifest = json.loads((tmp_path / "wh" / pin.key / "manifest.json").read_text())
    assert [v["origin"] for v in manifest["wheels"].values()] == ["built"]
    # a rebuild installs that wheel instead of building again
    again = recipe.build_oracle(pin, "cpu", home=tmp_path / "home",
                                wheelhouse_root=tmp_path / "wh", rebuild=True)
    assert again.identity.ok
    record = json.loads((venv / "oracle-build" / "build-record.json").read_text())
    assert record["origin"] == "wheelhouse"


def test_shallow_mirror_is_refused(tmp_path: Path, repo: Repo) -> None:
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "2", f"file://{repo.path}", str(shallow)],
                   check=True)
    with pytest.raises(SourceError, match="shallow"):
        source.clone_at(str(shallow), tmp_path / "clone", repo.pinned)


def test_dirty_tree_is_refused(tmp_path: Path, repo: Repo) -> None:
    clone = tmp_path / "clone"
    facts = source.clone_at(str(repo.path), clone, repo.pinned)
    assert facts.commit == repo.pinned
    (clone / "setup.py").write_text("# edited\n")
    with pytest.raises(SourceError, match=r"dirty .*\.dYYYYMMDD"):
        source.verify_checkout(clone, repo.pinned)


def test_wrong_commit_is_refused(tmp_path: Path, repo: Repo) -> None:
    with pytest.raises(SourceError, match="is not in"):
        source.clone_at(str(repo.path), tmp_path / "c", "0123456789" * 4)
    clone = tmp_path / "c2"
    source.clone_at(str(repo.path), clone, repo.pinned)
    head_after = git(repo.path, "rev-parse", "HEAD")
    with pytest.raises(SourceError, match="HEAD is"):
        source.verify_checkout(clone, head_after)


def test_short_sha_is_refused(tmp_path: Path, repo: Repo) -> None:
    with pytest.raises(BadInput, match="short SHA"):
        load_pin(write_pin(tmp_path, repo, commit=repo.pinned[:9],
                           version=repo.version))


def test_tagless_mirror_is_refused(tmp_path: Path, repo: Repo) -> None:
    notags = tmp_path / "notags"
    subprocess.run(["git", "clone", "-q", "--no-tags", str(repo.path), str(notags)],
                   check=True)
    git(notags, "tag", "-d", "v0.1.0") if "v0.1.0" in git(notags, "tag") else None
    bare = tmp_path / "notags.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--no-tags", str(notags), str(bare)],
                   check=True)
    with pytest.raises(SourceError, match="no tag"):
        source.clone_at(str(bare), tmp_path / "c", repo.pinned)


@pytest.mark.parametrize("url", ["ext::sh -c id", "fd::3", "-uhelp", "foo::bar"])
def test_command_running_transports_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(SourceError, match="refusing source"):
        source.clone_at(url, tmp_path / "c", "0" * 40)


def test_bundle_source(tmp_path: Path, repo: Repo) -> None:
    bundle = tmp_path / "vllm.bundle"
    git(repo.path, "bundle", "create", str(bundle), "--all")
    facts = source.clone_at(str(bundle), tmp_path / "c", repo.pinned)
    assert facts.commit == repo.pinned and facts.describe.startswith("v0.1.0-3-g")


def test_version_hints() -> None:
    assert steps.version_hint("0.1.1.dev3+ga9eb142e3") == ""
    assert "dirty" in steps.version_hint("0.1.1.dev3+ga9eb142e3.d20261129")
    assert "PRECOMPILED" in steps.version_hint("0.23.1rc1.dev1511+g555967922.precompiled")
    assert "VLLM_MAIN_CUDA_VERSION" in steps.version_hint("0.23.1rc1.dev1511+g555967922.cu130")
    assert "no tags" in steps.version_hint("0.1.dev1511+g555967922")
