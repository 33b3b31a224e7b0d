"""The GPU pin's build plans for sm_121 and sm_110, asserted without the hardware."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.contracts.pins import load_pin
from oracle_build.core import env as envmod
from oracle_build.core import layout
from oracle_build.core.errors import EXIT_UNESTABLISHED, Unestablished
from oracle_build.core.proc import Cmd
from oracle_build.devices import cuda
from tests.conftest import GPU_PIN, established_gpu_pin


def plan_for(pin_path: Path, target: str, tmp_path: Path, **kw: object) -> recipe.Plan:
    pin = load_pin(pin_path)
    return recipe.plan(pin, target, home=tmp_path / "home", wheelhouse_root=tmp_path / "wh",
                       **kw)  # type: ignore[arg-type]


def wheel_cmd(p: recipe.Plan) -> Cmd:
    (step,) = [s for s in p.steps if s.name == "wheel"]
    (cmd,) = step.commands
    return cmd


@pytest.mark.parametrize(("target", "arch", "sm"), [("sm_121", "12.1", "sm_121"),
                                                     ("sm_110", "11.0", "sm_110")])
def test_gpu_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, arch: str,
                  sm: str) -> None:
    monkeypatch.setenv("VLLM_USE_PRECOMPILED", "0")  # even "0" must not reach the build
    pin = established_gpu_pin(tmp_path)
    mirrors = tmp_path / "mirrors"
    for name in ("cutlass", "vllm-flash-attn", "flashmla", "qutlass", "triton_kernels",
                 "deepgemm"):
        (mirrors / name).mkdir(parents=True)  # one a git mirror would be (plan: present)
    p = plan_for(pin, target, tmp_path, externals_dir=mirrors)
    assert not [b for s in p.steps for b in s.blocked_by]
    cmd = wheel_cmd(p)
    assert cmd.env["TORCH_CUDA_ARCH_LIST"] == arch
    # the pin's CMake arguments, then nvcc (and the host compilers) through the compiler
    # cache, nvcc itself being oracle-build's launcher in front of the host's toolkit
    launcher = p.compiler_cache.ccache if p.compiler_cache and p.compiler_cache.active else ""
    assert p.toolkit is not None and p.toolkit.lock is None
    assert cmd.env["CMAKE_ARGS"] == ("-DFETCHCONTENT_FULLY_DISCONNECTED=ON "
                                     "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON ") + " ".join(
        f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in ("C", "CXX", "CUDA")) + \
        f" -DCMAKE_CUDA_COMPILER={p.toolkit.launcher}"
    assert cmd.env["ORACLE_BUILD_NVCC_PREFIX_MAP"] == f"{p.staging};{p.toolkit.folder}"
    assert [s.name for s in p.steps].index("toolkit") < [s.name for s in p.steps].index(
        "wheel")
    assert cmd.env["VLLM_TARGET_DEVICE"] == "cuda"
    assert cmd.env["CMAKE_BUILD_TYPE"] == "Release"
    assert cmd.env["CUDA_HOME"] == "/usr/local/cuda"
    assert cmd.env["MAX_JOBS"] == "8" and cmd.env["NVCC_THREADS"] == "2"
    for var in ("VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "FLASH_MLA_SRC_DIR",
                "QUTLASS_SRC_DIR", "TRITON_KERNELS_SRC_DIR", "DEEPGEMM_SRC_DIR"):
        assert cmd.env[var].startswith(str(p.staging / "externals"))
    assert "VLLM_USE_PRECOMPILED" not in cmd.env
    assert "VLLM_USE_PRECOMPILED" in cmd.unset
    argv = cmd.argv
    assert argv[1:4] == ["-m", "pip", "wheel"]
    assert {"--no-build-isolation", "--no-cache-dir", "--no-deps"} <= set(argv)
    assert "-e" not in argv and "--editable" not in argv
    # torch from the cu130 index, before the build
    (torch,) = [s for s in p.steps if s.name == "torch"]
    assert "torch==2.13.0+cu130" in torch.commands[0].argv
    assert "https://download.pytorch.org/whl/cu130" in torch.commands[0].argv
    assert p.target.expected_sm == [sm, sm + "a"]
    # the executed environment really drops VLLM_USE_PRECOMPILED
    env = envmod.build_env()
    assert "VLLM_USE_PRECOMPILED" not in env
    names = [s.name for s in p.steps]
    assert names.index("source") < names.index("externals") < names.index("wheel") \
        < names.index("check-wheel") < names.index("install") < names.index("identity") \
        < names.index("publish")


def test_shipped_gpu_pin_refuses_unestablished_externals(tmp_path: Path) -> None:
    p = plan_for(GPU_PIN, "sm_121", tmp_path)
    (ext,) = [s for s in p.steps if s.name == "externals"]
    assert len(ext.blocked_by) == 7  # six externals and the missing --externals
    with pytest.raises(Unestablished) as info:
        recipe.run(p)
    assert "externals.cutlass.commit is unestablished" in info.value.message
    assert not p.staging.exists()  # refused before any work


def test_dry_run_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "--dry-run", "--json", "--pin", str(GPU_PIN), "--target", "sm_110",
                 "--home", str(tmp_path)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resolved"]["target"] == "sm_110"
    wheel = next(s for s in data["steps"] if s["name"] == "wheel")["commands"][0]
    assert wheel["env"]["TORCH_CUDA_ARCH_LIST"] == "11.0"


def test_gpu_build_on_this_host_is_refused_before_work(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "--pin", str(GPU_PIN), "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 6
    assert "has no target for this host" in err and "sm_121" in err and "sm_110" in err
    assert not (tmp_path / "staging").exists()


def test_unestablished_exit_code(tmp_path: Path) -> None:
    assert Unestablished("x").exit_code == EXIT_UNESTABLISHED == 10


def test_configure_log_arch_parse() -> None:
    log = ("-- CUDA supported target architectures: 7.5;8.0;8.9;9.0;10.0;11.0;12.0;12.1\n"
           "-- CUDA target architectures: 12.1\n")
    assert cuda.configure_arches(log) == {
        "CUDA supported target architectures": "7.5;8.0;8.9;9.0;10.0;11.0;12.0;12.1",
        "CUDA target architectures": "12.1"}


def test_build_preflight_disk_and_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle_build.core.errors import PreflightFailed
    from tests.conftest import CPU_PIN

    pin = load_pin(CPU_PIN)
    monkeypatch.setenv("ORACLE_BUILD_MIN_FREE_GIB", "1000000")
    p = recipe.plan(pin, "cpu", home=tmp_path / "h", wheelhouse_root=tmp_path / "w")
    with pytest.raises(PreflightFailed, match=r"GiB free at .*, the build needs 1000000\.0 GiB"):
        recipe.run(p)
    assert not layout.oracle_path(tmp_path / "h", pin.key).exists()
    monkeypatch.delenv("ORACLE_BUILD_MIN_FREE_GIB")
    odd = tmp_path / "odd.toml"
    odd.write_text(CPU_PIN.read_text().replace('python = "3.11"', 'python = "3.99"'))
    (tmp_path / "cpu.lock.txt").write_text((CPU_PIN.parent / "cpu.lock.txt").read_text())
    p = recipe.plan(load_pin(odd), "cpu", home=tmp_path / "h2", wheelhouse_root=tmp_path / "w")
    with pytest.raises(PreflightFailed, match=r"no Python 3\.99 on this host"):
        recipe.run(p)


def test_engine_memory_floor_gives_both_numbers() -> None:
    from oracle_build.contracts.targets import CpuTarget as Target
    from oracle_build.core.errors import PreflightFailed
    from oracle_build.engine.session import memory_preflight

    huge = Target(device="cpu", machine="x86_64", memory_floor_gib=4096)
    with pytest.raises(PreflightFailed) as info:
        memory_preflight(huge)
    assert "below this target's floor of 4096.0 GiB" in info.value.message
    assert "host memory available is" in info.value.message
    assert memory_preflight(Target(device="cpu", machine="x86_64", memory_floor_gib=0.5))
