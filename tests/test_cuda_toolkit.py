"""The CUDA toolkit as a pin input (contracts/cudatoolkit.py, recipe/cuda/toolkit.py), the nvcc
launcher (recipe/cuda/launcher.py) and what `cuda-kernels` reads of vLLM 0.32.0's real
CMakeLists.txt (recipe/cuda/units.py). The real nvcc runs in the slow tests at the end and in
CI's `nox -s cuda_kernels` (NVIDIA's wheels from PyPI: no GPU needed to compile)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from oracle_build.contracts.cudatoolkit import (
    MACHINES,
    TOOLS,
    load_kernels_spec,
    load_toolkit,
    render,
)
from oracle_build.contracts.pins import load_pin
from oracle_build.core.errors import BadInput, BuildFailed
from oracle_build.recipe.cuda import toolkit as cudatoolkit
from oracle_build.recipe.cuda import units as cudaunits
from tests.conftest import REPO

LOCK = REPO / "pins" / "toolkits" / "cuda-13.0.3.toml"
TREE = REPO / "tests" / "data" / "vllm-src" / "0.32.0"


# ----------------------------------------------------------------------------- the lock


def test_shipped_lock_names_both_machines_and_round_trips() -> None:
    lock = load_toolkit(LOCK)
    assert lock.nvcc == "13.0.88" and lock.cuda == "13.0"
    names = [w.name for w in lock.wheels]
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl",
            "nvidia-cuda-runtime", "nvidia-cuda-cuobjdump"} <= set(names)
    for w in lock.wheels:
        assert set(w.files) == set(MACHINES)
        for m in MACHINES:
            assert w.files[m].filename.endswith(f"_{m}.whl")  # type: ignore[index]
    # one renderer: the file is what render gives for the model it loads to
    assert render(lock) == LOCK.read_text()


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = LOCK.read_text()
    assert old in text
    path = tmp_path / "lock.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old,new,field", [
    ('schema = 1', 'schema = 2', "schema"),
    ('url = "https://files.pythonhosted.org', 'url = "http://files.pythonhosted.org', "url"),
    ("manylinux2014_aarch64.manylinux_2_17_aarch64.whl\"\nurl",
     "manylinux2014_x86_64.manylinux_2_17_x86_64.whl\"\nurl", "aarch64"),
    ('sha256 = "56fe', 'sha256 = "XXfe', "sha256"),
    ('size = 37384532', 'size = -1', "size"),
    ('name = "nvidia-cuda-nvcc"', 'name = "nvidia-cuda-nvcc"\nextra = 1', "extra"),
])
def test_a_bad_lock_is_refused_naming_the_field(tmp_path: Path, old: str, new: str,
                                                field: str) -> None:
    with pytest.raises(BadInput) as err:
        load_toolkit(_edited(tmp_path, old, new))
    assert str(tmp_path / "lock.toml") in err.value.message
    assert field in err.value.message


def test_a_lock_without_nvcc_or_one_machine_is_refused(tmp_path: Path) -> None:
    text = LOCK.read_text()
    head, _first, rest = text.partition("[[wheels]]")
    rest = rest.split("[[wheels]]", 1)[1]  # drop the nvcc wheel
    path = tmp_path / "lock.toml"
    path.write_text(head + "[[wheels]]" + rest)
    with pytest.raises(BadInput, match="nvcc"):
        load_toolkit(path)
    lines = [ln for ln in text.splitlines()]
    cut = lines.index("[wheels.files.aarch64]")
    path.write_text("\n".join(lines[:cut] + lines[cut + 5:]) + "\n")
    with pytest.raises(BadInput, match="no aarch64 file"):
        load_toolkit(path)


def test_the_digest_moves_with_any_hash_and_names_the_home_folder(tmp_path: Path) -> None:
    lock = load_toolkit(LOCK)
    other = load_toolkit(_edited(tmp_path, 'sha256 = "56fe', 'sha256 = "57fe'))
    assert lock.digest != other.digest and lock.folder_name != other.folder_name
    assert lock.folder_name.startswith("cuda-13.0.3-")


def test_the_toolkit_lock_is_part_of_the_pin_content_hash(tmp_path: Path) -> None:
    pins = tmp_path / "pins"
    (pins / "toolkits").mkdir(parents=True)
    (pins / "cuda-source.toml").write_text((REPO / "pins" / "cuda-source.toml").read_text())
    (pins / "toolkits" / "cuda-13.0.3.toml").write_text(LOCK.read_text())
    first = load_pin(pins / "cuda-source.toml", check_lock=False).content_hash
    assert first == load_pin(REPO / "pins" / "cuda-source.toml",
                             check_lock=False).content_hash
    (pins / "toolkits" / "cuda-13.0.3.toml").write_text(
        LOCK.read_text().replace('sha256 = "56fe', 'sha256 = "57fe', 1))
    assert load_pin(pins / "cuda-source.toml", check_lock=False).content_hash != first
    (pins / "toolkits" / "cuda-13.0.3.toml").unlink()
    with pytest.raises(BadInput, match="toolkit"):
        load_pin(pins / "cuda-source.toml", check_lock=False)


# ----------------------------------------------------------------------------- unpacking


def _wheel(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def test_unpack_keeps_exec_bits_and_takes_only_the_toolkit(tmp_path: Path) -> None:
    w = _wheel(tmp_path / "w.whl", {
        "nvidia/cu13/bin/nvcc": (b"#!/bin/sh\n", 0o100755),
        "nvidia/cu13/include/a.h": (b"int a;\n", 0o100644),
        "nvidia_x-1.dist-info/RECORD": (b"", 0o100644)})
    dest = tmp_path / "cuda"
    dest.mkdir()
    assert cudatoolkit._extract(w, dest, 0) == len(b"#!/bin/sh\n") + len(b"int a;\n")
    assert os.access(dest / "bin" / "nvcc", os.X_OK)
    assert not os.access(dest / "include" / "a.h", os.X_OK)
    assert not (dest / "nvidia_x-1.dist-info").exists()


@pytest.mark.parametrize("name,mode,why", [
    ("nvidia/cu13/../../escape", 0o100644, "plain relative path"),
    ("nvidia/cu13/bin/link", 0o120777, "plain file"),
    ("nvidia/cu13/bin/a b", 0o100644, "plain relative path"),
    ("nvidia/cu13/bin/fifo", 0o010644, "plain file"),
])
def test_unpack_refuses_a_hostile_member(tmp_path: Path, name: str, mode: int,
                                         why: str) -> None:
    w = _wheel(tmp_path / "w.whl", {name: (b"x", mode)})
    dest = tmp_path / "cuda"
    dest.mkdir()
    with pytest.raises(BuildFailed, match=why):
        cudatoolkit._extract(w, dest, 0)
    assert not (tmp_path / "escape").exists()


def test_unpack_bounds_the_total_and_refuses_two_different_copies(tmp_path: Path,
                                                                  monkeypatch) -> None:
    dest = tmp_path / "cuda"
    dest.mkdir()
    a = _wheel(tmp_path / "a.whl", {"nvidia/cu13/include/x.h": (b"one", 0o100644)})
    b = _wheel(tmp_path / "b.whl", {"nvidia/cu13/include/x.h": (b"two", 0o100644)})
    same = _wheel(tmp_path / "c.whl", {"nvidia/cu13/include/x.h": (b"one", 0o100644)})
    cudatoolkit._extract(a, dest, 0)
    cudatoolkit._extract(same, dest, 0)  # the same bytes twice: fine
    with pytest.raises(BuildFailed, match="differs from the same file in another wheel"):
        cudatoolkit._extract(b, dest, 0)
    monkeypatch.setattr(cudatoolkit, "MAX_UNPACKED", 10)
    big = _wheel(tmp_path / "big.whl", {"nvidia/cu13/lib/big": (b"0" * 11, 0o100644)})
    with pytest.raises(BuildFailed, match="unpacks past"):
        cudatoolkit._extract(big, dest, 0)


def test_a_broken_wheel_is_a_build_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(BuildFailed, match="could not unpack"):
        cudatoolkit._extract(bad, tmp_path, 0)


def test_layout_gives_lib64_and_unversioned_names(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcudart.so.13").write_bytes(b"")
    (lib / "libnvrtc-builtins.so.13.0").write_bytes(b"")
    (lib / "libcudadevrt.a").write_bytes(b"")
    cudatoolkit._layout(tmp_path)
    assert os.readlink(tmp_path / "lib64") == "lib"
    assert os.readlink(lib / "libcudart.so") == "libcudart.so.13"
    assert os.readlink(lib / "libnvrtc-builtins.so") == "libnvrtc-builtins.so.13.0"


# ----------------------------------------------------------------------------- the launcher


def test_the_launcher_is_standard_library_only() -> None:
    tree = ast.parse(cudatoolkit.LAUNCHER_SOURCE.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


def _fake_toolkit(tmp_path: Path) -> cudatoolkit.Toolkit:
    """A folder shaped as a CUDA_HOME whose nvcc records its arguments (one a line) and
    whether its --keep-dir existed: what the launcher hands the real nvcc, which the slow
    test runs."""
    home = tmp_path / "cuda"
    for rel in TOOLS:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("#!/bin/sh\nexit 0\n")
        (home / rel).chmod(0o755)
    (home / "bin" / "nvcc").write_text(
        "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; case $a in --keep-dir=*) "
        "[ -d \"${a#--keep-dir=}\" ] && echo KEEPDIR_EXISTS;; esac; done > \"$NVCC_ARGS\"\n")
    tools = {rel: hashlib.sha256((home / rel).read_bytes()).hexdigest() for rel in TOOLS}
    return cudatoolkit.Toolkit("host", home, "13.0", "13.0.88", tools)


def _launch(launcher: Path, args: list[str], tmp_path: Path,
            maps: list[Path]) -> tuple[int, list[str]]:
    out = tmp_path / "args.txt"
    out.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", "NVCC_ARGS": str(out),
           **cudatoolkit.launcher_env(maps)}
    done = subprocess.run([sys.executable, str(launcher), *args], env=env,
                          capture_output=True, text=True, check=False)
    return done.returncode, out.read_text().splitlines() if out.exists() else [done.stderr]


def test_the_launcher_adds_the_three_settings_to_a_cuda_compile_only(tmp_path: Path) -> None:
    tk = _fake_toolkit(tmp_path)
    launcher = cudatoolkit.write_launcher(tk, tmp_path / "launcher")
    stage = tmp_path / "home"
    src = stage / "units" / "csrc" / "k.cu"
    code, args = _launch(launcher, ["-O3", "-c", str(src), "-o", "k.o"], tmp_path, [stage])
    assert code == 0
    assert args[:4] == ["-O3", "-c", str(src), "-o"]
    assert f"-Xcompiler=-ffile-prefix-map={stage}=." in args
    assert "--keep" in args and "KEEPDIR_EXISTS" in args  # a fresh folder, there while it ran
    keep = next(a for a in args if a.startswith("--keep-dir="))[len("--keep-dir="):]
    assert not Path(keep).exists()  # and gone after
    i = args.index("-Xcudafe")
    assert args[i + 1] == "--orig_src_path_name=./units/csrc/k.cu"
    # anything else is nvcc's own call, unchanged
    for other in (["--version"], ["-E", str(src)], ["-c", "a.cpp"], ["k.o", "-o", "x"]):
        code, args = _launch(launcher, other, tmp_path, [stage])
        assert code == 0 and args == other


def test_the_launcher_refuses_another_toolkit_behind_it(tmp_path: Path) -> None:
    tk = _fake_toolkit(tmp_path)
    launcher = cudatoolkit.write_launcher(tk, tmp_path / "launcher")
    ptxas = tk.cuda_home / "bin" / "ptxas"
    ptxas.write_text("#!/bin/sh\nexit 1\n# another ptxas\n")
    done = subprocess.run([sys.executable, str(launcher), "--version"], capture_output=True,
                          text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 97 and "changed since its sha256 was taken" in done.stderr
    # a launcher made for another toolkit, beside this toolkit.json
    cudatoolkit.write_launcher(tk, tmp_path / "launcher")
    facts = json.loads((tmp_path / "launcher" / "toolkit.json").read_text())
    facts["digest"] = "0" * 64
    (tmp_path / "launcher" / "toolkit.json").write_text(json.dumps(facts))
    done = subprocess.run([sys.executable, str(launcher), "--version"], capture_output=True,
                          text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 97 and "another toolkit" in done.stderr


def test_the_launcher_refuses_a_prefix_map_that_is_not_a_folder(tmp_path: Path) -> None:
    tk = _fake_toolkit(tmp_path)
    launcher = cudatoolkit.write_launcher(tk, tmp_path / "launcher")
    env = {"PATH": "/usr/bin:/bin", cudatoolkit.PREFIX_MAP_VARIABLE: "/a=/b"}
    done = subprocess.run([sys.executable, str(launcher), "-c", "k.cu"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 97 and "absolute folders separated by ';'" in done.stderr


def test_the_launcher_bytes_name_the_toolkit_and_no_folder(tmp_path: Path) -> None:
    tk = _fake_toolkit(tmp_path)
    one = cudatoolkit.write_launcher(tk, tmp_path / "a" / "launcher").read_bytes()
    two = cudatoolkit.write_launcher(tk, tmp_path / "b" / "x" / "launcher").read_bytes()
    assert one == two and tk.digest.encode() in one and str(tmp_path).encode() not in one
    assert stat.S_IMODE((tmp_path / "a" / "launcher" / "nvcc").stat().st_mode) == 0o755


# ----------------------------------------------------------------------------- the tree


def test_tree_facts_of_vllm_0_32_0() -> None:
    facts = cudaunits.tree_facts(TREE, "13.0", "_C_stable_libtorch")
    assert facts.supported_archs == "7.5;8.0;8.6;8.7;8.9;9.0;10.0;11.0;12.0"
    lines = (TREE / "CMakeLists.txt").read_text().splitlines()
    assert 'CUDA_SUPPORTED_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;10.0;11.0;12.0"' in \
        lines[facts.archs_line - 1]
    assert facts.definitions == ("TORCH_TARGET_VERSION=0x020B000000000000ULL", "USE_CUDA",
                                 "CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1")
    assert any(s.startswith("VLLM_ENABLE_COOPERATIVE_TOPK=1") for s in facts.skipped)
    assert any(s.startswith("USE_ROCM") for s in facts.skipped)
    # another nvcc release takes another branch of the same chain
    assert "10.7" in cudaunits.tree_facts(TREE, "13.4", "_C_stable_libtorch").supported_archs
    assert "12.1" in cudaunits.tree_facts(TREE, "12.8", "_C_stable_libtorch").supported_archs


def test_tree_facts_refuse_a_tree_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(BuildFailed, match="CUDA_SUPPORTED_ARCHS"):
        cudaunits.tree_facts(tmp_path, "13.0", "_C_stable_libtorch")


def test_cmake_statements_join_lines_and_drop_comments() -> None:
    text = 'if(A AND\n   B) # c(\nset(X "a#b")\n'
    assert cudaunits.statements(text) == [(1, "if(A AND B)"), (3, 'set(X "a#b")')]


def test_cache_answers_are_read_per_source(tmp_path: Path) -> None:
    log = tmp_path / "stats.log"
    log.write_text("# ../units/csrc/a.cu\ncache_miss\nlocal_storage_miss\n"
                   "# ../units/csrc/b.cu\ndirect_cache_hit\nlocal_storage_hit\n"
                   "# ../units/csrc/c.cu\nunsupported_compiler_option\n")
    hits = cudaunits.cache_results(log)
    assert cudaunits._cache_of(hits, "csrc/a.cu") == "miss"
    assert cudaunits._cache_of(hits, "csrc/b.cu") == "hit"
    assert cudaunits._cache_of(hits, "csrc/c.cu").startswith("uncached: unsupported")
    assert cudaunits._cache_of(hits, "csrc/d.cu") == "not seen by ccache"


# ----------------------------------------------------------------------------- the spec


def test_shipped_kernels_spec_names_cuda_targets_of_its_pin() -> None:
    spec = load_kernels_spec(REPO / "pins" / "kernels" / "cuda-source.toml")
    pin = load_pin(REPO / "pins" / "kernels" / spec.pin, check_lock=False)
    for name in spec.targets:
        t = pin.model.targets[name]
        assert t.device == "cuda" and getattr(t, "toolkit", None)
    assert set(spec.torch.files) == set(MACHINES)


@pytest.mark.parametrize("old,new,field", [
    ('"csrc/cache_kernels.cu"]', '"csrc/../../etc/passwd.cu"]', "units"),
    ('"csrc/cache_kernels.cu"]', '"csrc/layernorm_kernels.cu"]', "units"),
    ('pin = "../cuda-source.toml"', 'pin = "../../cuda-source.toml"', "pin"),
    ('extension = "_C_stable_libtorch"', 'extension = "_C; rm -rf /"', "extension"),
])
def test_a_bad_kernels_spec_is_refused(tmp_path: Path, old: str, new: str,
                                       field: str) -> None:
    text = (REPO / "pins" / "kernels" / "cuda-source.toml").read_text()
    assert old in text
    path = tmp_path / "spec.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(BadInput) as err:
        load_kernels_spec(path)
    assert field in err.value.message


# ----------------------------------------------------------------------------- the gate pin


CUDA_NINE = ["cutlass", "triton_kernels", "deepgemm", "deepselect", "fmha_sm100", "flashmla",
             "flashkda", "tml_fa4", "vllm-flash-attn"]


def test_dry_run_of_the_gate_pin_shows_toolkit_launcher_and_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oracle_build.cli import main

    assert main(["build", "--pin", str(REPO / "pins" / "cuda-source.toml"), "--target",
                 "sm_121", "--no-gpu", "--externals", str(REPO.parent / "shared" / "externals"),
                 "--home", str(tmp_path / "h"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    kit = tmp_path / "h" / "toolkits" / load_toolkit(LOCK).folder_name
    assert "CUDA toolkit: cuda-13.0.3 (nvcc 13.0.88; 8 NVIDIA wheels for aarch64" in out
    assert f"CUDA compiler: ccache -> {kit}/launcher/nvcc" in out
    assert "device checks: NOT RUN (--no-gpu): nvidia-smi" in out
    assert "TORCH_CUDA_ARCH_LIST=12.1" in out and f"CUDA_HOME={kit}/cuda" in out
    assert f"-DCMAKE_CUDA_COMPILER={kit}/launcher/nvcc" in out
    for var in ("VLLM_CUTLASS_SRC_DIR", "QUTLASS_SRC_DIR", "DEEPGEMM_SRC_DIR",
                "TRITON_KERNELS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR"):
        assert f"      {var}=" in out
    refused = [ln for ln in out.splitlines() if "REFUSES TO RUN: externals." in ln]
    assert sorted(ln.split("externals.")[1].split(":")[0].split(".")[0].split(" ")[0]
                  for ln in refused) == sorted(CUDA_NINE)
    assert "qutlass = the git tree 7c522b19e1341e36c63c86bbd664981dda49cd5e" in out


def test_the_real_build_without_gpu_stops_before_any_work_naming_the_nine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate pin's build, on a host of its machine (here: the pin with its targets made
    x86_64), without a GPU: every step but the device checks would run; it refuses before
    any, exit 10, naming the nine externals this workplace could not have (QuTLASS is
    taken by its git tree from ../shared/externals)."""
    from oracle_build.cli import main

    pins = tmp_path / "pins"
    (pins / "toolkits").mkdir(parents=True)
    (pins / "toolkits" / LOCK.name).write_text(LOCK.read_text())
    text = (REPO / "pins" / "cuda-source.toml").read_text()
    (pins / "cuda-source.toml").write_text(text.replace('machine = "aarch64"',
                                                        'machine = "x86_64"'))
    args = ["build", "--pin", str(pins / "cuda-source.toml"), "--target", "sm_121",
            "--externals", str(REPO.parent / "shared" / "externals"),
            "--home", str(tmp_path / "h")]
    assert main(args) == 6  # without the flag a host with no NVIDIA driver is refused
    assert "--no-gpu" in capsys.readouterr().err
    assert main([*args, "--no-gpu"]) == 10
    err = capsys.readouterr().err
    for name in CUDA_NINE:
        assert f"externals.{name}" in err
    assert "externals.qutlass" not in err
    assert not (tmp_path / "h" / "oracles").exists()


def test_no_gpu_is_for_gpu_targets_and_names_its_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oracle_build.cli import main

    assert main(["build", "--pin", str(REPO / "pins" / "cpu.toml"), "--target", "cpu",
                 "--no-gpu", "--dry-run", "--home", str(tmp_path)]) == 2
    assert "--no-gpu is for GPU targets" in capsys.readouterr().err
    assert main(["build", "--pin", str(REPO / "pins" / "cuda-source.toml"), "--no-gpu",
                 "--home", str(tmp_path)]) == 6
    assert "name it (--target)" in capsys.readouterr().err


def test_an_identity_without_the_device_checks_is_never_ok() -> None:
    from oracle_build.core import verdicts
    from oracle_build.core.errors import defused_lines, plain
    from oracle_build.devices import cuda
    from oracle_build.oracle.identity import Identity

    ident = Identity(venv=Path("/v"), facts={}, device="cuda", skipped=cuda.DEVICE.DEVICE_CHECKS)
    shown = defused_lines(ident.block())  # as printed
    last = shown.splitlines()[-1]
    assert last.startswith("ORACLE_IDENTITY_INCOMPLETE: ") and "ORACLE_IDENTITY_OK" not in \
        ident.block()
    for check in cuda.DEVICE.DEVICE_CHECKS:
        assert check in last
    assert verdicts.forged(shown) == [last]  # a verdict line, the tool's own
    ident.mismatches = [("x", "1", "2")]
    assert defused_lines(ident.block()).splitlines()[-2] == "ORACLE_IDENTITY_MISMATCH"
    assert plain(verdicts.identity(True)) == "ORACLE_IDENTITY_OK"


# ----------------------------------------------------------------------------- real nvcc

# __FILE__ in device code, and an anonymous namespace (nvcc names its module id after the
# source path): what vLLM's units have too
SMALL_CU = """#include <cstdio>
namespace { __device__ float twice(float v) { return 2.0f * v; } }
__global__ void k(float *x) { if (!x) printf("%s\\n", __FILE__); x[threadIdx.x] = twice(x[0]); }
void launch(float *x) { k<<<1, 32>>>(x); }
"""


@pytest.fixture(scope="module")
def toolkit_here(tmp_path_factory: pytest.TempPathFactory) -> cudatoolkit.Toolkit:
    """The lock's toolkit for this machine, its wheels from the shared wheelhouse (PyPI the
    first time: 620 MB), unpacked into a home of the module's."""
    from tests.conftest import shared_wheelhouse

    home = tmp_path_factory.mktemp("cuda-home")
    machine = os.uname().machine
    return cudatoolkit.install(load_toolkit(LOCK), home, shared_wheelhouse() / "toolkits",
                               machine)


@pytest.mark.slow
def test_real_nvcc_through_the_launcher_gives_one_object_in_two_folders(
        toolkit_here: cudatoolkit.Toolkit, tmp_path: Path) -> None:
    """nvcc 13.0.88 from the lock compiles a kernel for sm_121 and sm_110, no GPU: plain,
    two folders (and two processes) give two objects; through the launcher, one. cuobjdump
    lists each object's sm, by the check a built wheel gets. (nox -s cuda_kernels does the
    same for real vLLM units, through ccache, in CI.)"""
    from oracle_build.devices.cuda import cuobjdump_sm

    launcher = toolkit_here.cuda_home.parent / "launcher" / "nvcc"
    assert launcher.is_file()
    for sm in ("121", "110"):
        objects: dict[str, list[bytes]] = {"plain": [], "launcher": []}
        for folder in ("a", "deeper/b"):
            src_dir = tmp_path / sm / folder
            src_dir.mkdir(parents=True)
            (src_dir / "k.cu").write_text(SMALL_CU)
            for how, exe in (("plain", toolkit_here.nvcc), ("launcher", launcher)):
                out = src_dir / f"{how}.o"
                env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                       "HOME": str(tmp_path), **cudatoolkit.launcher_env([src_dir])}
                subprocess.run([str(exe), "-O3", "-gencode", f"arch=compute_{sm},code=sm_{sm}",
                                "-c", str(src_dir / "k.cu"), "-o", str(out)], env=env,
                               check=True, cwd=src_dir, capture_output=True)
                objects[how].append(out.read_bytes())
                assert cuobjdump_sm([str(out)], str(toolkit_here.cuobjdump)) == [f"sm_{sm}"]
        assert objects["plain"][0] != objects["plain"][1]
        assert objects["launcher"][0] == objects["launcher"][1]


@pytest.mark.slow
def test_a_cuda_package_builds_without_gpu_end_to_end(toolkit_here: cudatoolkit.Toolkit,
                                                      tmp_path: Path) -> None:
    """The tool's CUDA device path end to end on a small CUDA package (tests/srcpkg.py: a
    .cu in the extension of a CMake sdist), through the steps vLLM's takes: the toolkit from
    the lock, the launcher, ccache, the cuobjdump check, compiled bytes, --check; and a
    second home from the same compiler cache. --no-gpu: identity INCOMPLETE, never OK."""
    from oracle_build.contracts.record import load_record
    from oracle_build.core import layout
    from oracle_build.oracle.venv import OracleVenv
    from tests.conftest import shared_wheelhouse
    from tests.srcpkg import make_cuda_sdist, write_cuda_sdist_pin

    s = make_cuda_sdist(tmp_path / "sdist")
    pin = write_cuda_sdist_pin(s, LOCK)
    wheelhouse = tmp_path / "wh"
    (wheelhouse / "toolkits").mkdir(parents=True)
    for wheel in (shared_wheelhouse() / "toolkits").glob("*.whl"):  # the fixture fetched them
        os.link(wheel, wheelhouse / "toolkits" / wheel.name)
    cache = tmp_path / "ccache"
    env = {**os.environ, "ORACLE_BUILD_WHEELHOUSE": str(wheelhouse),
           "ORACLE_BUILD_COMPILER_CACHE": str(cache), "ORACLE_BUILD_MIN_FREE_GIB": "5"}

    def ob(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oracle_build", "build", "--pin",
                               str(pin), "--target", "sm_121", "--externals",
                               str(s.externals), "--home", str(home), *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=900,
                              check=False)

    refused = ob(home=tmp_path / "a")
    assert refused.returncode == 6 and "--no-gpu" in refused.stderr  # never implied
    records = []
    # the second home compiles (--recompile: not the first's wheel from the wheelhouse)
    # through the shared compiler cache; the third takes that wheel, its compiled code
    # checked with the toolkit it prepares
    for home, more in ((tmp_path / "a", ()), (tmp_path / "elsewhere" / "b", ("--recompile",)),
                       (tmp_path / "c", ())):
        done = ob("--no-gpu", *more, home=home)
        assert done.returncode == 0, done.stderr[-3000:]
        last = done.stdout.splitlines()[-1]
        assert last.startswith("ORACLE_IDENTITY_INCOMPLETE:") and "nvidia-smi" in last
        assert "ORACLE_IDENTITY_OK" not in done.stdout + done.stderr
        venv = layout.oracle_path(home, load_pin(pin).key)
        record = load_record(OracleVenv(venv).record_path)
        kit = record.preflight["toolkit"]
        assert kit["lock"] == "cuda-13.0.3" and kit["version"] == "13.0.88"
        assert set(kit["tools"]) == set(TOOLS) and kit["launcher"].startswith(str(home))
        assert "\nkernels sm_121\n" in done.stdout  # identity's cuobjdump, every home
        assert record.compiled is not None
        if home.name != "c":  # the wheel step's facts, where the wheel was built
            assert record.compiled_arches == {"configure_log": {}, "cuobjdump": ["sm_121"]}
            assert record.compiled.toolchain is not None
            assert "nvcc: V13.0.88 (tools sha256 " in record.compiled.toolchain
        records.append(record)
    first, second, third = records
    assert first.compiler_cache is not None and second.compiler_cache is not None
    assert first.compiler_cache.misses == 2 and first.compiler_cache.hits == 0  # C and CUDA
    assert second.compiler_cache.hits == 2 and second.compiler_cache.misses == 0
    assert first.compiled.files == second.compiled.files == third.compiled.files
    check = ob("--no-gpu", "--check", home=tmp_path / "a")
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.splitlines()[-1] == "ORACLE_REPRODUCED: 1 compiled files compared"
