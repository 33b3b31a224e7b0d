"""A golden says in itself how to reproduce its numbers (issue 55): tests/reproduce_golden.py,
a script that imports nothing of oracle_build, run with the oracle venv's python (plain
vLLM 0.32.0 from PyPI, as the pin installs it), reproduces the bundled golden and a numerics
member bit for bit from their fields alone."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from oracle_build.checkpoints.resolve import recorded_model
from oracle_build.contracts.golden import load_golden, recorded
from tests.conftest import REPO, TINY_SPEC, BuiltOracle

DRIVER = REPO / "tests" / "reproduce_golden.py"
MEMBER = (REPO / "goldens" / "numerics" / "sets" / "cpu-26df6bc30703" / "cpu" / "x86_64-avx2"
          / "llama" / "golden.json")


def test_the_driver_imports_nothing_of_oracle_build() -> None:
    """The script is what a third party runs: the standard library, vLLM and what vLLM
    brings (torch, safetensors), nothing of the harness."""
    tree = ast.parse(DRIVER.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert names == {"hashlib", "json", "os", "sys", "torch", "vllm", "safetensors"}


def test_a_golden_without_its_hold_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A golden that does not record its kernel-variant hold cannot be reproduced from its
    fields: exit 2, the field named (before any engine)."""
    import sys

    doc = json.loads((TINY_SPEC / "golden.json").read_text())
    doc["engine"]["kernel_variant"] = None
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, str(DRIVER), str(path), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "engine.kernel_variant.predicates" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("golden_path", "held"), [
    (TINY_SPEC / "golden.json", True), (MEMBER, True), (TINY_SPEC / "golden.json", False)],
    ids=["bundled", "numerics-avx2-llama", "bundled-without-its-predicates"])
def test_plain_vllm_reproduces_a_golden_bit_for_bit_from_its_fields(
        cpu_oracle: BuiltOracle, golden_path: Path, held: bool, tmp_path: Path) -> None:
    """Slow: one real vLLM engine per golden (about a minute each). The oracle venv's python
    runs the script in an environment of its own making (PATH, HOME and the golden's
    variables): every token and every top-k logprob is the golden's, bit for bit. The
    control: the same golden with its predicates left out (the variant's variables alone)
    is not reproduced on a CPU other than the variant's (here an AVX-512 one: vLLM maps
    `_C`), and the script says where."""
    import shutil

    from oracle_build import host

    golden = load_golden(golden_path)
    model = recorded_model(recorded(golden, golden_path), golden_path, cpu_oracle.home)
    if not held:
        if host.facts().get("cpu_variant") == "x86_64-avx2":
            pytest.skip("on an AVX2 host the variables alone are the variant")
        doc = json.loads(golden_path.read_text())
        doc["engine"]["kernel_variant"]["predicates"] = {}
        shutil.copy2(golden_path.parent / doc["topk"]["file"], tmp_path / doc["topk"]["file"])
        golden_path = tmp_path / "golden.json"
        golden_path.write_text(json.dumps(doc))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    done = subprocess.run([str(cpu_oracle.venv / "bin" / "python"), "-I", str(DRIVER),
                           str(golden_path), str(model)], env=env, capture_output=True,
                          text=True, timeout=1100, check=False)
    if held:
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        assert "reproduced bit for bit: " in done.stdout
    else:
        assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-3000:])
        assert "NOT reproduced:" in done.stdout and "position 0: top-k" in done.stdout


def test_the_drivers_top_k_order_is_the_tools_own() -> None:
    """The script keeps its own copy of the capture driver's top-k ordering (it may import
    nothing of oracle_build): both order the same logprobs the same way, ties included."""
    import importlib.util
    from types import SimpleNamespace

    def load(path: Path) -> object:
        spec = importlib.util.spec_from_file_location(path.stem + "_copy", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    tool = load(REPO / "oracle_build" / "inside" / "driver.py")
    script = load(DRIVER)
    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731
    position = {7: lp(-1.5, 2), 3: lp(-0.25, 1), 9: lp(-1.5, None), 4: lp(-1.5, 2)}
    want = [[3, -0.25], [4, -1.5], [7, -1.5], [9, -1.5]]
    assert tool.topk(position, 4) == script.topk(position) == want  # type: ignore[attr-defined]
