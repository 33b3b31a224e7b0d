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
    assert names == {"hashlib", "json", "os", "re", "sys", "torch", "vllm", "safetensors"}


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


PRELOAD_C = """
#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen("%s", "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


def _run(path: Path, model: Path) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, str(DRIVER), str(path), str(model)],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("where", ["environment", "engine.kernel_variant.env"])
def test_a_goldens_loader_variable_never_reaches_the_child(tmp_path: Path, where: str) -> None:
    """Issue 65 (5): a golden with LD_PRELOAD=<a real shared library whose constructor
    writes a file> in its environment, or in its kernel variant's, with no model files to
    check: refused, exit 2, naming the field; the library's start-up code never ran (on
    9f917cd the child started with it)."""
    lib = tmp_path / "ran.so"
    src = tmp_path / "ran.c"
    marker = tmp_path / "RAN"
    src.write_text(PRELOAD_C % marker)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    doc = json.loads((TINY_SPEC / "golden.json").read_text())
    doc["model"]["files"] = {}
    if where == "environment":
        doc["environment"]["LD_PRELOAD"] = str(lib)
    else:
        doc["engine"]["kernel_variant"]["env"]["LD_PRELOAD"] = str(lib)
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc))
    done = _run(path, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{where}.LD_PRELOAD" in done.stderr
    assert not marker.exists(), "the golden's library ran"


def test_a_golden_with_nothing_to_reproduce_is_refused(tmp_path: Path) -> None:
    """Empty prompts and calls printed "reproduced bit for bit: 0 tokens ...", exit 0."""
    doc = json.loads((TINY_SPEC / "golden.json").read_text())
    doc["prompts"], doc["batch"]["calls"] = [], []
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc))
    done = _run(path, tmp_path)
    assert done.returncode == 2 and "prompts: no prompt to reproduce" in done.stderr
    assert "reproduced bit for bit" not in done.stdout + done.stderr


def test_a_prompt_id_that_reads_as_a_verdict_is_refused_not_printed(tmp_path: Path) -> None:
    """A prompt id holding a newline and the script's own verdict words: refused (not a
    prompt id), and nothing of it starts a line."""
    doc = json.loads((TINY_SPEC / "golden.json").read_text())
    forged = "capital\nreproduced bit for bit: 72 tokens, 1440 top-k cells, 3 prompts"
    old = doc["prompts"][0]["id"]
    doc["prompts"][0]["id"] = forged
    doc["batch"]["calls"] = [[forged if pid == old else pid for pid in call]
                             for call in doc["batch"]["calls"]]
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc))
    done = _run(path, tmp_path)
    assert done.returncode == 2 and "prompts[0].id: is not a prompt id" in done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert not any(line.startswith("reproduced bit for bit") for line in lines)


def test_the_scripts_hold_variables_are_the_tools() -> None:
    """The script keeps its own list (it imports nothing of oracle_build): equal to the
    variables a kernel-variant hold sets."""
    from oracle_build.core.env import CPU_NUMERICS

    tree = ast.parse(DRIVER.read_text())
    (listed,) = [ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign) and any(
                     isinstance(t, ast.Name) and t.id == "HOLD_VARIABLES" for t in node.targets)]
    assert set(listed) == set(CPU_NUMERICS)


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
