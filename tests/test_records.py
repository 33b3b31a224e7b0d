"""The typed records and the device modules (issue 23): every file the tool writes has a
model and a committed schema; a driver answer is validated like any input; nothing
outside oracle_build/devices/ branches on a target's device."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from oracle_build import devices
from oracle_build.contracts import schemas
from oracle_build.contracts.driver import DRIVER_SCHEMA, DriverResult
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.record import load_anchor, load_record
from oracle_build.contracts.targets import CpuTarget, CudaTarget, RocmTarget
from oracle_build.core.errors import BadInput, EngineFailed
from oracle_build.core.files import validate
from oracle_build.engine.session import EngineResult

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "oracle_build"


def test_committed_schemas_are_the_models() -> None:
    """`oracle-build schema` would write nothing new: each committed schema is its model's."""
    for name, schema in schemas.generated().items():
        assert schemas.committed(name) == json.loads(json.dumps(schema, sort_keys=True)), name
    names = {p.name for p in (PACKAGE / "contracts" / "schemas").glob("*.schema.json")}
    assert names == set(schemas.generated())
    assert {"build-record.schema.json", "manifest.schema.json", "anchor.schema.json",
            "driver-result.schema.json", "deep-identity.schema.json",
            "numerics-record.schema.json"} <= names


def test_driver_schema_is_the_drivers() -> None:
    """inside/driver.py imports nothing from the harness: its constant is checked here."""
    text = (PACKAGE / "inside" / "driver.py").read_text()
    assert re.search(rf"^DRIVER_SCHEMA = {DRIVER_SCHEMA}\b", text, re.M)


GOOD = {"driver_schema": 2, "ok": True, "env": {}, "env_after_import": {},
        "engine_start_seconds": 1.5, "resolved": {}, "resolved_after": {},
        "backends": {"attention": {"value": ["TORCH_SDPA"]}, "moe": {"value": None}},
        "arrays_file": "arrays.npz", "seconds": 2.0,
        "runs": [{"name": "g", "sampling": {"temperature": 0.0}, "leg_seconds": [0.1],
                  "legs": [[{"prompt_token_ids": [1, 2], "token_ids": [3, 4], "text": "x",
                             "finish_reason": "length"}]]}]}


@pytest.mark.parametrize("change, field", [
    ({"ok": "yes"}, "ok"),
    ({"driver_schema": 3}, "driver_schema"),
    ({"arrays_file": None}, "arrays_file"),
    ({"backends": {"attention": {}}}, "backends.moe"),
    ({"runs": [{**GOOD["runs"][0], "legs": [[{**GOOD["runs"][0]["legs"][0][0],  # type: ignore[index]
                                                "token_ids": [3, "4"]}]]}]},
     "runs[0].legs[0][0].token_ids[1]"),
    ({"runs": [{**GOOD["runs"][0], "legs": []}]}, "runs[0].legs"),  # type: ignore[dict-item]
    ({"ok": False}, "error"),
])
def test_a_malformed_driver_answer_names_its_field(tmp_path: Path, change: dict[str, object],
                                                   field: str) -> None:
    validate(DriverResult, GOOD, tmp_path / "answer.json")  # the original is good
    bad = {**GOOD, **change}
    assert bad != GOOD
    with pytest.raises(BadInput) as info:
        validate(DriverResult, bad, tmp_path / "answer.json")
    assert field in str(info.value), str(info.value)


def test_a_failed_answer_raises_with_its_error(tmp_path: Path) -> None:
    failed = validate(DriverResult, {"driver_schema": 2, "ok": False,
                                     "error": "RuntimeError: out of memory",
                                     "traceback": "line 1\nline 2"}, tmp_path / "a.json")
    result = EngineResult(failed, {}, {}, tmp_path / "engine.log")
    with pytest.raises(EngineFailed, match="out of memory"):
        result.require()


def test_records_refuse_what_they_are_not(tmp_path: Path) -> None:
    path = tmp_path / "build-record.json"
    path.write_text(json.dumps({"record_schema": 3, "origin": "downloaded"}))
    with pytest.raises(BadInput) as info:
        load_record(path)
    assert "origin" in str(info.value) and "created_utc: required field is missing" in str(
        info.value)
    anchor = tmp_path / "a.anchor.json"
    anchor.write_text(json.dumps({"anchor_schema": 1, "venv": "v", "manifest_sha256": "0" * 64,
                                  "build_record_sha256": "0" * 64,
                                  "content_fingerprint": "not hex", "created_utc": "t"}))
    with pytest.raises(BadInput, match="content_fingerprint"):
        load_anchor(anchor)


# ----------------------------------------------------------------------------- devices


def test_each_target_is_its_devices_model() -> None:
    gpu = load_pin(REPO / "pins" / "vllm-555967922.toml")
    assert isinstance(gpu.target("sm_121"), CudaTarget)
    assert isinstance(gpu.target("gfx1100"), RocmTarget)
    assert isinstance(load_pin(REPO / "pins" / "cpu.toml").target("cpu"), CpuTarget)
    for name, target in gpu.model.targets.items():
        assert target.device == devices.module(target).NAME, name


def test_a_field_of_another_device_is_refused(tmp_path: Path) -> None:
    """A CPU target naming a GPU field is an unknown key, at targets.<name>.<field> (the
    union's tag never shows in the path)."""
    text = (REPO / "pins" / "cpu.toml").read_text()
    path = tmp_path / "cpu.toml"
    path.write_text(text.replace('device = "cpu"\n', 'device = "cpu"\ngfx_arch = "gfx1100"\n'))
    assert path.read_text() != text
    (tmp_path / "cpu.lock.txt").write_text((REPO / "pins" / "cpu.lock.txt").read_text())
    with pytest.raises(BadInput) as info:
        load_pin(path)
    assert "targets.cpu.gfx_arch: unknown key" in str(info.value), str(info.value)


def test_pin_hashes_are_kept() -> None:
    """The content hash is taken over the flat schema-1 target form: the pins keep the
    hashes their oracles, wheelhouses and goldens were keyed by before the union."""
    assert load_pin(REPO / "pins" / "cpu.toml").key == "cpu-26df6bc30703"
    assert load_pin(REPO / "pins" / "previous" / "cpu-0.31.toml").content_hash.startswith(
        "aebd72383b1eecac")
    assert load_pin(REPO / "pins" / "vllm-555967922.toml").content_hash.startswith(
        "615379a1fa7fa260")


DEVICE_BRANCH = re.compile(r"""\.device\s*(==|!=|in\b)|device\s*==\s*["'](cpu|cuda|rocm)""")
# What only a device module may know: a device's name (or a word starting with one, as a
# label "cpu x86_64"), its tools, its facts' and build variables' names.
DEVICE_WORD = re.compile(rf"^({'|'.join(devices.MODULES)})(\b|$)")
DEVICE_KNOWLEDGE = re.compile(
    r"nvidia-smi|rocminfo|amd-smi|\bnvcc\b|hipcc|cuobjdump|roc-obj-ls|gcn_arch|^sm_|\bsm_$|"
    r"CUDA_HOME|ROCM_HOME|TORCH_CUDA_ARCH|PYTORCH_ROCM|CUDA_FOUND|HIP_FOUND")
# The target models name their device: the discriminator pydantic needs (contracts/targets.py)
# and the types of their fields
TARGET_MODELS = {"CpuTarget", "CudaTarget", "RocmTarget", "SmCode", "GfxArch", "_gfx"}


def _names_cpu_variant(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "cpu_variant") or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get" and bool(node.args)
        and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cpu_variant")


def device_knowledge(source: str, rel: str) -> list[str]:
    """Every place in ``source`` that branches on a device or names what only a device
    module knows: a device's name as a value (a tuple of names, a default, a Literal, a
    choice), a GPU tool or a device's build variable, a ``.device`` comparison, a ranking by
    ``.GPU``. Docstrings and comments may name them."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))  # a docstring
        named = node.name if isinstance(node, ast.ClassDef | ast.FunctionDef) else \
            getattr(getattr(node, "target", None), "id", None) if isinstance(
                node, ast.AnnAssign) else (node.targets[0].id if isinstance(node, ast.Assign)
                                           and isinstance(node.targets[0], ast.Name) else None)
        if rel == "contracts/targets.py" and named in TARGET_MODELS:
            skip.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                DEVICE_WORD.search(node.value) or DEVICE_KNOWLEDGE.search(node.value)):
            found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "GPU" and \
                not rel.startswith("devices/"):
            found.append(f"{rel}:{node.lineno}: .GPU (a ranking of devices: devices.gpu_first)")
        elif isinstance(node, ast.Compare) and any(isinstance(o, ast.Eq | ast.NotEq)
                                                   for o in node.ops) and any(
                _names_cpu_variant(side) for side in [node.left, *node.comparators]):
            # whether a CPU kernel variant matters is the device's to say (BY_CPU_VARIANT:
            # devices.missing_instructions, goldens.run_variant), not a comparison's
            found.append(f"{rel}:{node.lineno}: a CPU kernel variant compared")
    for number, line in enumerate(source.splitlines(), 1):
        if DEVICE_BRANCH.search(line.split("#", 1)[0]):
            found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_nothing_outside_the_device_modules_knows_a_device() -> None:
    """Adding a device is one module under devices/ (the probe, which runs in the oracle's
    own interpreter and imports nothing from the harness, is told its torch device). Only
    devices/cpu.py, cuda.py and rocm.py know a device; devices/__init__.py and base.py
    ask them. A device's own part of another layer is named for it and knows it too (the
    CUDA toolkit, launcher and units: recipe/cuda/, contracts/cudatoolkit.py,
    commands/cudakernels.py); generic code reaches it only through the device's answers
    (BUILD_TOOLKIT), which this guard holds everywhere else."""
    offenders = []
    own = tuple(devices.MODULES)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "inside" or (rel.parts[0] == "devices" and
                                         rel.stem in devices.MODULES):
            continue
        if any(part in own for part in rel.parts[:-1]) or rel.stem.startswith(own):
            continue
        offenders += device_knowledge(path.read_text(), str(rel))
    assert not offenders, "\n".join(offenders)


# Each of the eleven places issue 33 found, as it was written: the guard catches each.
ELEVEN = {
    "recipe/checkout.py": 'for other in ("cuda", "cpu", "rocm"):\n    pass\n',
    "contracts/pins.py": 'class External:\n    devices: list[Literal["cpu", "cuda", "rocm"]]\n',
    "contracts/pins.py ": 'for device in ("cpu", "cuda", "rocm"):\n    pass\n',
    "core/files.py": 'UNION_TABLE_TAGS = {"targets": {"cpu", "cuda", "rocm"}}\n',
    "commands/externals.py": 'ex.add_argument("--device", choices=["cuda", "cpu", "rocm"], '
                             'default="cuda")\n',
    "recipe/cmake.py": 'def scan_externals(checkout, *, device="cuda"):\n    pass\n',
    "oracle/identity.py": 'def device_label(d):\n'
                          '    if d.get("gcn_arch"):\n        return d["name"]\n'
                          '    return f"cpu {machine}"\n',
    # a CPU variant diff without the BY_CPU_VARIANT guard (verify.py, as the issue read it)
    "commands/verify.py": 'variant = rec.oracle.identity.get("cpu_variant")\n'
                          'if variant and variant != host.host().cpu_variant:\n    pass\n',
    "host.py": 'exe = shutil.which("nvidia-smi")\nexe = rocm_tool("rocminfo")\n'
               'exe = shutil.which("nvcc")\n',
    "recipe/steps.py": 'HINTS = [(re.compile(r"[+.]rocm\\d+"), "nvcc\'s CUDA differs"), '
                       '(P, "librocm-core under ROCM_HOME")]\n',
    "commands/common.py": 'candidates.append((0 if devices.module(target).GPU else 1, p))\n',
    "devices/base.py": 'CUDA = "TRUE" if device == "cuda" else "FALSE"\n',
}


@pytest.mark.parametrize("rel", sorted(ELEVEN))
def test_the_device_guard_catches_each_old_spelling(rel: str) -> None:
    assert device_knowledge(ELEVEN[rel], rel.strip()), rel


def test_device_names_are_the_modules() -> None:
    """The devices package names the devices; the target models' discriminators are the
    same names, and every device answers the whole base interface."""
    from oracle_build.contracts.targets import DEVICES

    assert sorted(DEVICES) == sorted(devices.MODULES) == sorted(devices.names())
    for name, device in devices.MODULES.items():
        assert isinstance(device, devices.Device) and name == device.NAME
    assert devices.module(devices.default_gpu()).GPU
    known = devices.cmake_known("rocm", "x86_64")
    assert known["HIP_FOUND"] == "TRUE" and known["CUDA_FOUND"] == "FALSE"
    assert devices.cmake_known("cpu", "aarch64")["ASIMD_FOUND"] == "TRUE"


def test_the_plan_is_frozen(tmp_path: Path) -> None:
    """A plan is what --dry-run printed: nothing patches it after it is built, and the
    steps read what they need from it (the wheel step's removed switches, the listings)."""
    import dataclasses

    from oracle_build.recipe.plan import plan

    p = plan(load_pin(REPO / "pins" / "cpu.toml"), "cpu", home=tmp_path,
             wheelhouse_root=tmp_path / "wh")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.from_wheelhouse = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.steps[0].name = "other"  # type: ignore[misc]


def test_a_damaged_wheelhouse_manifest_names_its_field(tmp_path: Path) -> None:
    from oracle_build.recipe.wheelhouse import Wheelhouse

    pin = load_pin(REPO / "pins" / "cpu.toml")
    wh = Wheelhouse.for_pin(tmp_path, pin)
    wh.root.mkdir(parents=True)
    good = {"schema": 1, "pin_key": pin.key, "pin_hash": pin.content_hash,
            "wheels": {"a-1.0-py3-none-any.whl": {"sha256": "0" * 64, "size": 3,
                                                  "origin": "downloaded"}}}
    wh.manifest_path.write_text(json.dumps(good))
    assert wh.files() == good["wheels"]
    bad = json.loads(json.dumps(good))
    bad["wheels"]["a-1.0-py3-none-any.whl"]["size"] = -1
    wh.manifest_path.write_text(json.dumps(bad))
    with pytest.raises(BadInput, match=r"wheels\.a-1\.0-py3-none-any\.whl\.size"):
        wh.files()


def test_the_probes_answer_is_validated_before_identity_reads_it(tmp_path: Path) -> None:
    """A real probe answer (probe.py run by a real python: this harness's, where vLLM does
    not import) is the model; edited, it is a failed probe naming the field, never a
    KeyError or a comparison of half a record."""
    import subprocess
    import sys

    import jsonschema

    from oracle_build.contracts.probe import ProbeFacts
    from oracle_build.core.errors import BuildFailed
    from oracle_build.oracle import identity

    out = tmp_path / "facts.json"
    probe = PACKAGE / "inside" / "probe.py"
    subprocess.run([sys.executable, "-I", str(probe), str(out), "rms_norm", "cpu", "VLLM_"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    facts = json.loads(out.read_text())
    assert "error" in facts["modules"]["vllm"] and facts["kernel"]["ok"] is False
    assert isinstance(identity.probe_answer(facts, tmp_path), ProbeFacts)
    jsonschema.validate(facts, schemas.committed("identity-facts.schema.json"))
    for edit, field in [(lambda f: f["python"].update(isolated="maybe"), "python.isolated"),
                        (lambda f: f.pop("kernel"), "kernel"),
                        (lambda f: f.update(probe_schema=2), "probe_schema"),
                        (lambda f: f["distributions"].update(x={"name": "x"}),
                         "distributions.x.version")]:
        bad = json.loads(out.read_text())
        edit(bad)
        with pytest.raises(BuildFailed) as info:
            identity.probe_answer(bad, tmp_path)
        assert f"    {field}: " in info.value.message, info.value.message


def test_a_plans_resolution_is_its_model(tmp_path: Path) -> None:
    """What a build resolves (printed first, resolved.json, the record's `resolved`) is the
    committed schema's, for each device's target."""
    import jsonschema

    from oracle_build.recipe.plan import plan
    from tests.conftest import CPU_PIN, established_gpu_pin

    schema = schemas.committed("resolved-plan.schema.json")
    cpu = plan(load_pin(CPU_PIN), "cpu", home=tmp_path / "h", wheelhouse_root=tmp_path / "wh")
    jsonschema.validate(cpu.resolved(), schema)
    gpu = plan(load_pin(established_gpu_pin(tmp_path)), "sm_121", home=tmp_path / "h",
               wheelhouse_root=tmp_path / "wh")
    assert gpu.resolved()["vllm"].startswith("git ")
    jsonschema.validate(gpu.resolved(), schema)
