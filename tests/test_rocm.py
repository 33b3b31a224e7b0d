"""The AMD gate host (gfx1100, ROCm), asserted without the hardware: the build plan, host
detection from rocminfo / amd-smi outputs, the .rocmNNN suffix rule on a real wheel file,
the offload-bundle arch check on real bundle bytes, ROCm identity and preflight. Where a
GPU would be needed (a device to probe, a kernel to run) the tests stop, and say so."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from oracle_build import devices, host, recipe
from oracle_build.cli import main
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.targets import Target
from oracle_build.core.errors import BadInput, BuildFailed, PreflightFailed
from oracle_build.core.log import Steps
from oracle_build.devices import rocm
from oracle_build.recipe import steps
from oracle_build.recipe.plan import Plan, fetch_commands
from tests.conftest import GPU_PIN, REPO, established_gpu_pin

DATA = REPO / "tests" / "data" / "rocm"
RUNTIME = "0.23.1rc1.dev1511+g555967922"
HOST_ID = "host-x86_64-unknown-linux-gnu-"


def rocm_plan(tmp_path: Path) -> Plan:
    pin = load_pin(established_gpu_pin(tmp_path))
    (tmp_path / "mirrors" / "triton_kernels").mkdir(parents=True, exist_ok=True)  # its mirror
    return recipe.plan(pin, "gfx1100", home=tmp_path / "home", wheelhouse_root=tmp_path / "wh",
                       externals_dir=tmp_path / "mirrors")


def bundle(ids: list[str]) -> bytes:
    """An uncompressed clang offload bundle holding empty code objects for ``ids``: magic,
    u64 count, then per entry u64 offset, u64 size, u64 id length, id."""
    header = rocm.BUNDLE_MAGIC + struct.pack("<Q", len(ids))
    return header + b"".join(struct.pack("<QQQ", 0, 0, len(i)) + i.encode() for i in ids)


def fake_library(path: Path, ids: list[str]) -> Path:
    """A shared-library stand-in: ELF magic, some bytes, one .hip_fatbin-like bundle."""
    path.write_bytes(b"\x7fELF" + os.urandom(64) + bundle(ids) + os.urandom(64))
    return path


# ----------------------------------------------------------------------------- the plan


def test_gfx1100_dry_run_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_USE_PRECOMPILED", "0")
    monkeypatch.setenv("VLLM_PRECOMPILED_WHEEL_LOCATION", "/somewhere.whl")
    p = rocm_plan(tmp_path)
    assert not [b for s in p.steps for b in s.blocked_by]
    (wheel,) = next(s for s in p.steps if s.name == "wheel").commands
    env = wheel.env
    assert env["VLLM_TARGET_DEVICE"] == "rocm" and env["PYTORCH_ROCM_ARCH"] == "gfx1100"
    assert env["ROCM_HOME"] == "/opt/rocm"
    assert "TORCH_CUDA_ARCH_LIST" not in env and "CUDA_HOME" not in env
    # ROCm's own external only (its triton commit), not CUDA's six
    assert env["TRITON_KERNELS_SRC_DIR"].startswith(str(p.staging / "externals"))
    for cuda_only in ("VLLM_CUTLASS_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "DEEPGEMM_SRC_DIR"):
        assert cuda_only not in env
    # no precompiled switch reaches the build, whatever the caller set
    for switch in ("VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION"):
        assert switch in wheel.unset and switch not in env
    assert {"--no-build-isolation", "--no-cache-dir", "--no-deps"} <= set(wheel.argv)
    assert wheel.argv[1:4] == ["-m", "pip", "wheel"]
    # torch from PyTorch's ROCm index at the target's version
    (torch,) = next(s for s in p.steps if s.name == "torch").commands
    assert "torch==2.13.0+rocm7.2" in torch.argv
    assert "https://download.pytorch.org/whl/rocm7.2" in torch.argv
    # (no lock yet: no fetch step; once locked, a missing torch comes from that index)
    assert "fetch" not in [s.name for s in p.steps]
    last = fetch_commands(p.file, p.wheelhouse, p.pin, p.target)[-1].argv
    assert last[last.index("--index-url") + 1] == "https://download.pytorch.org/whl/rocm7.2"
    # the wheel's version carries exactly the target's suffix
    resolved = p.resolved()
    assert resolved["expected_distribution_version"] == f"{RUNTIME}.rocm723"
    assert resolved["torch"] == "2.13.0+rocm7.2"
    install = next(s for s in p.steps if s.name == "install").commands[0]
    assert f"vllm=={RUNTIME}.rocm723" in install.argv
    check = next(s for s in p.steps if s.name == "check-wheel")
    assert "offload bundles is exactly gfx1100" in check.about
    assert "hipcc" in p.steps[0].about


def test_gfx1100_plan_from_the_cli_names_rocms_external(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["build", "--dry-run", "--json", "--pin", str(GPU_PIN), "--target", "gfx1100",
                 "--home", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resolved"]["device"] == "rocm"
    ext = next(s for s in data["steps"] if s["name"] == "externals")
    # the shipped pin: ROCm's triton commit is unestablished, and the plan says so
    assert any("externals.triton_kernels.commit is unestablished" in b for b in
               ext["blocked_by"])
    assert not any("cutlass" in b for b in ext["blocked_by"])


def test_rocm_target_fields_are_validated(tmp_path: Path) -> None:
    text = GPU_PIN.read_text()
    cases = [('gfx_arch = "gfx1100"\n', "", "gfx_arch: required field is missing"),
             ('pytorch_rocm_arch = "gfx1100"', 'pytorch_rocm_arch = "gfx1100;gfx90a"',
              "builds another arch set"),
             ('expected_gfx = ["gfx1100"]', 'expected_gfx = ["sm_121"]', "not an AMD GPU arch"),
             ('dist_version_suffix = "rocm723"', 'dist_version_suffix = ".rocm723"',
              "dist_version_suffix"),
             ('hip_version = "7.2"', 'hip_version = "seven"', "hip_version")]
    for old, new, message in cases:
        assert old in text, old
        path = tmp_path / "pin.toml"
        path.write_text(text.replace(old, new, 1))
        with pytest.raises(BadInput) as err:
            load_pin(path)
        assert message in str(err.value) and "targets.gfx1100" in str(err.value), str(err.value)


# ----------------------------------------------------------------------------- the host


def test_host_detection_from_rocminfo_and_amd_smi() -> None:
    gpus = rocm.parse_rocminfo((DATA / "rocminfo-4x7900xtx.txt").read_text())
    assert len(gpus) == 4  # the CPU agent is not a GPU; the ISA blocks are not agents
    assert {(g.name, g.arch, g.vendor) for g in gpus} == {
        ("Radeon RX 7900 XTX", "gfx1100", "amd")}
    assert gpus[0].driver == "amdgpu 6.12.12"  # from the ROCk module line
    smi = rocm.parse_amd_smi((DATA / "amd-smi-static-4x7900xtx.txt").read_text())
    assert [(g.name, g.arch, g.driver) for g in smi] == [
        ("Radeon RX 7900 XTX", "gfx1100", "amdgpu 6.12.12")] * 4
    pin = load_pin(GPU_PIN)
    box = host.Host("x86_64", "Linux", gpus, 64 << 30, 128 << 30, "x86_64-avx512")
    assert devices.choose_target(pin, box) == "gfx1100"
    ok, why = devices.fits(pin.target("gfx1100"), box)
    assert ok and why == "Radeon RX 7900 XTX gfx1100"
    # an AMD host with another arch: refused, naming the pin's targets and what it found
    other = dataclasses.replace(box, gpus=rocm.parse_rocminfo(
        (DATA / "rocminfo-gfx90a.txt").read_text()))
    with pytest.raises(PreflightFailed) as err:
        devices.choose_target(pin, other)
    text = str(err.value)
    assert "gfx1100: needs Radeon RX 7900 XTX gfx1100; this host has AMD Instinct MI210 " \
        "(gfx90a)" in text and "sm_121" in text and "sm_110" in text
    # an aarch64 NVIDIA host never picks the AMD target, and vice versa
    thor = host.Host("aarch64", "Linux", (host.Gpu("NVIDIA Thor", "11.0", "580"),), None,
                     None)
    assert devices.choose_target(pin, thor) == "sm_110"
    assert not devices.fits(pin.target("sm_121"), box)[0]


def test_on_the_amd_box_the_default_pin_is_the_gpu_pin(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """`nox` with no --pin on the AMD box: pins/cpu.toml fits any x86_64 host too, but a pin
    with a GPU target for this host comes first; its gfx1100 target is chosen."""
    gpus = rocm.parse_rocminfo((DATA / "rocminfo-4x7900xtx.txt").read_text())
    box = host.Host("x86_64", "Linux", gpus, 64 << 30, 128 << 30, "x86_64-avx512")
    monkeypatch.setattr(host, "host", lambda: box)
    monkeypatch.chdir(REPO)
    from oracle_build.commands.common import find_default_pin

    path = find_default_pin()
    assert path.name == GPU_PIN.name
    assert devices.choose_target(load_pin(path), box) == "gfx1100"


def test_this_host_has_no_amd_gpu_and_the_build_is_refused_before_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "--pin", str(GPU_PIN), "--target", "gfx1100", "--home",
                 str(tmp_path)])
    assert code == 6
    err = capsys.readouterr().err
    assert "does not fit this host" in err and "no AMD GPU" in err
    assert not (tmp_path / "staging").exists()


# ----------------------------------------------------------------------------- the wheel


def make_wheel(dist: Path, version: str, ids: list[str]) -> Path:
    dist.mkdir(parents=True, exist_ok=True)
    wheel = dist / f"vllm-{version}-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/_version.py", "__version__ = version = '0.23.1rc1.dev1511'\n"
                    "__commit_id__ = commit_id = 'g5559679229'\n")
        zf.writestr("vllm/_C.abi3.so", b"\x7fELF" + bundle(ids))
        zf.writestr("vllm/_rocm_C.abi3.so", b"\x7fELF" + bundle(ids))
        zf.writestr("vllm/spinloop.abi3.so", b"\x7fELF host only")
    return wheel


@pytest.mark.parametrize(("version", "ids", "error"), [
    (f"{RUNTIME}.rocm723", [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100"], None),
    (f"{RUNTIME}.rocm724", [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100"],
     "setup.py appends .rocm"),
    (RUNTIME, [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100"], "expects vllm " + RUNTIME),
    (f"{RUNTIME}.precompiled", [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100"],
     "VLLM_USE_PRECOMPILED"),
    (f"{RUNTIME}.rocm723", [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100",
                            "hipv4-amdgcn-amd-amdhsa--gfx90a"], "found gfx1100, gfx90a"),
    (f"{RUNTIME}.rocm723", [HOST_ID], "no gfx code found"),
])
def test_wheel_check_suffix_and_arch_set(tmp_path: Path, version: str, ids: list[str],
                                         error: str | None) -> None:
    """The real check-wheel step on a wheel file: the pinned suffix accepted, any other
    refused with its cause; the offload bundles' arch set exactly gfx1100."""
    p = rocm_plan(tmp_path)
    make_wheel(p.staging / "dist", version, ids)
    p.wheelhouse.root.mkdir(parents=True, exist_ok=True)
    state = steps.BuildState(p, Steps(len(p.steps)))
    step = next(s for s in p.steps if s.name == "check-wheel")
    if error is None:
        steps.check_wheel(state, step)
        assert (state.facts.compiled_arches or {})["offload_bundles"] == {
            "vllm/_C.abi3.so": ["gfx1100"], "vllm/_rocm_C.abi3.so": ["gfx1100"]}
        assert state.facts.wheel is not None
        assert state.facts.wheel.version == f"{RUNTIME}.rocm723"
    else:
        with pytest.raises(BuildFailed) as err:
            steps.check_wheel(state, step)
        assert error in str(err.value), str(err.value)


def test_offload_bundle_reader_and_listings(tmp_path: Path) -> None:
    lib = fake_library(tmp_path / "lib.so", [HOST_ID, "hipv4-amdgcn-amd-amdhsa--gfx1100"])
    found = rocm.offload_arches([str(lib)])
    assert found.gfx == ["gfx1100"] and found.problems(["gfx1100"]) == []
    assert found.problems(["gfx1100", "gfx1101"]) == [
        ("compiled gfx (offload bundles)", "gfx1100, gfx1101", "gfx1100")]
    # target-id features (xnack, sramecc) are not part of the arch
    assert rocm.gfx_of("hipv4-amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-") == ["gfx90a"]
    # a roc-obj-ls listing (bundle number, entry id, URI) reads the same
    listing = ("1       host-x86_64-unknown-linux-gnu-      file:///x/_C.abi3.so#offset=8&size=0\n"
               "1       hipv4-amdgcn-amd-amdhsa--gfx1100    file:///x/_C.abi3.so#offset=4096&size=2\n")
    assert rocm.gfx_of(listing) == ["gfx1100"]
    # a compressed bundle without roc-obj-ls: never a pass
    packed = tmp_path / "packed.so"
    packed.write_bytes(b"\x7fELF" + rocm.COMPRESSED_MAGIC + b"\x03\x00\x01\x00" + bytes(64))
    found = rocm.offload_arches([str(packed)], roc_obj_ls=None)
    assert found.unlisted == [str(packed)]
    assert found.problems(["gfx1100"])[-1] == (
        "compiled gfx of packed.so", "gfx1100",
        "compressed offload bundles, and no roc-obj-ls to list them")
    # with roc-obj-ls (a script printing a recorded listing, standing in for ROCm's tool)
    tool = tmp_path / "roc-obj-ls"
    (tmp_path / "listing.txt").write_text(listing)
    tool.write_text(f"#!/bin/sh\ncat {tmp_path / 'listing.txt'}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    found = rocm.offload_arches([str(packed)], roc_obj_ls=str(tool))
    assert found.gfx == ["gfx1100"] and not found.unlisted
    # a host-only library is not counted
    plain = tmp_path / "plain.so"
    plain.write_bytes(b"\x7fELF" + bytes(128))
    assert rocm.offload_arches([str(plain)]).by_library == {}


# ----------------------------------------------------------------------------- identity


def gpu_device(target: Target, torch: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Identity's device rule for a probe that saw ``torch`` on the target's machine."""
    facts = {"machine": target.machine, "modules": {"torch": torch}}
    return devices.module(target).device_mismatches(target, facts, None)


def test_gpu_device_facts() -> None:
    """Identity's device rule, in each GPU device's module."""
    pin = load_pin(GPU_PIN)
    gb10 = {"cuda": "13.0", "devices": [{"name": "NVIDIA GB10", "capability": "12.1"}]}
    assert gpu_device(pin.target("sm_121"), gb10) == []
    assert gpu_device(pin.target("sm_110"), gb10) == [
        ("device", "Thor sm_110", "NVIDIA GB10 (12.1)")]
    assert gpu_device(pin.target("sm_121"), {"cuda_error": None}) == [
        ("device", "GB10 sm_121", "no CUDA device visible")]
    target = pin.target("gfx1100")
    good = {"hip": "7.2.53211-e9d2e3ca67", "devices": [
        {"name": "Radeon RX 7900 XTX", "capability": "11.0", "gcn_arch": "gfx1100"}]}
    assert gpu_device(target, good) == []
    assert gpu_device(target, {**good, "hip": "7.1.40091"}) == [
        ("torch.version.hip", "7.2.*", "7.1.40091")]
    assert gpu_device(target, {**good, "hip": None})[0][0] == "torch.version.hip"
    mi = {**good, "devices": [{"name": "AMD Instinct MI210", "capability": "9.0",
                               "gcn_arch": "gfx90a:sramecc+:xnack-"}]}
    assert gpu_device(target, mi) == [
        ("device", "Radeon RX 7900 XTX gfx1100", "AMD Instinct MI210 (gfx90a:sramecc+:xnack-)")]
    # what this host gives: torch sees no device
    assert gpu_device(target, {"hip": "7.2.1", "cuda_error": None}) == [
        ("device", "Radeon RX 7900 XTX gfx1100", "no ROCm device visible")]


def test_rocm_preflight_reads_hipcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hipcc's HIP version against the pin's; then the GPU, which this host lacks."""
    p = rocm_plan(tmp_path)
    rocm_home = tmp_path / "rocm"
    (rocm_home / "bin").mkdir(parents=True)
    hipcc = rocm_home / "bin" / "hipcc"
    hipcc.write_text(f"#!/bin/sh\ncat {DATA / 'hipcc-version.txt'}\n")
    hipcc.chmod(hipcc.stat().st_mode | stat.S_IXUSR)
    assert rocm.hip_version((DATA / "hipcc-version.txt").read_text()) == "7.2.53211"
    p.build_env["ROCM_HOME"] = str(rocm_home)
    with pytest.raises(PreflightFailed, match="no AMD GPU answers"):
        rocm.DEVICE.preflight(p, {}, host.host())  # the point where hardware is needed
    hipcc.write_text("#!/bin/sh\necho 'HIP version: 7.1.40091-abc'\n")
    with pytest.raises(PreflightFailed, match=re.escape(
            "reports HIP 7.1.40091; target gfx1100 pins HIP 7.2")):
        rocm.DEVICE.preflight(p, {}, host.host())
    hipcc.unlink()
    with pytest.raises(PreflightFailed, match="no hipcc under ROCM_HOME"):
        rocm.DEVICE.preflight(p, {}, host.host())
