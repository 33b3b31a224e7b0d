"""The fourth hostile reading of main (issue 54): each case as the issue found it, a test that
failed on 93e0121 and passes now (docs/reliability.md, "The fourth hostile reading")."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from oracle_build.core import layout
from oracle_build.core.errors import BadInput, OutputFailed
from oracle_build.core.filelock import held


def test_a_symlinked_engine_lock_is_refused_and_its_target_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORACLE_BUILD_ENGINE_LOCK a symlink: the lock's own path is the link (its folder
    resolved, not its name), so held()'s O_NOFOLLOW refuses it, exit 14; before, the path was
    resolved first and the link's target was truncated to a pid and locked."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "engine.lock"
    link.symlink_to(victim)
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(link))
    path = layout.engine_lock(tmp_path / "home")
    assert path == link
    with pytest.raises(OutputFailed) as err, held(path, what="a vLLM engine"):
        pass
    assert err.value.exit_code == 14 and "symlink" in str(err.value)
    assert victim.read_text() == "precious\n"
    # a symlinked folder above the lock is resolved (a lock under /var/lock -> /run/lock)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", str(tmp_path / "via" / "e.lock"))
    path = layout.engine_lock(tmp_path / "home")
    assert path == real / "e.lock"
    with held(path, what="a vLLM engine"):
        assert path.read_text() == str(os.getpid())
    monkeypatch.setenv("ORACLE_BUILD_ENGINE_LOCK", "/")
    with pytest.raises(BadInput) as bad:
        layout.engine_lock(tmp_path / "home")
    assert bad.value.exit_code == 2 and "ORACLE_BUILD_ENGINE_LOCK" in str(bad.value)


def test_every_process_the_harness_starts_goes_through_core_proc() -> None:
    """One subprocess wrapper (core/proc.py): its process group, PDEATHSIG, the log. Before,
    cache/registry.py ran the credential helper with subprocess of its own. The nvcc launcher
    is not the harness: a standard-library program of its own that ccache runs (its module
    docstring), copied into the toolkit."""
    import ast

    root = Path(__file__).resolve().parents[1] / "oracle_build"
    allowed = {root / "core" / "proc.py", root / "recipe" / "cuda" / "launcher.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            starts = any(n.split(".")[0] in ("subprocess", "pty") for n in names) or (
                isinstance(node, ast.Attribute) and node.attr in
                ("system", "popen", "execv", "execvp", "spawnv", "posix_spawn")
                and isinstance(node.value, ast.Name) and node.value.id == "os")
            if starts and path not in allowed:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_every_identity_block_names_the_cpu_kernel_variant() -> None:
    """build_oracle's identity block did not name the kernel variant (verify's opening line
    did): the block itself (one renderer for build, verify and capture) now says it, with
    the library vLLM mapped and torch's capability; a variant from the probe is outside text."""
    from oracle_build.core import verdicts
    from oracle_build.oracle.identity import Identity

    kernels = {"loaded": ["_C_AVX2.abi3.so"], "torch_capability": "AVX2", "held": "x86_64-avx2",
               "variant": "x86_64-avx2"}
    block = Identity(venv=Path("/v"), facts={"cpu_kernels": kernels}, device="cpu").block()
    assert ("kernel variant x86_64-avx2 (held as x86_64-avx2)   vllm library _C_AVX2.abi3.so"
            "   torch capability AVX2") in block.splitlines()
    own = {**kernels, "held": None, "variant": "x86_64-avx512_bf16\nORACLE_IDENTITY_OK"}
    block = Identity(venv=Path("/v"), facts={"cpu_kernels": own}, device="cpu").block()
    line = next(ln for ln in block.splitlines() if ln.startswith("kernel variant "))
    assert "(this CPU's own)" in line and "\\n" in line  # escaped, on its own line
    assert verdicts.forged(block) == ["ORACLE_IDENTITY_OK"]  # the tool's own, once
    # a GPU oracle's block has no CPU variant line (its kernels line names the sm)
    block = Identity(venv=Path("/v"), facts={}, device="cuda", compiled_sm=["sm_121"]).block()
    assert "kernel variant" not in block and "kernels sm_121" in block.splitlines()


BIG = "9" * 5000


@pytest.mark.parametrize(("old", "new", "field"), [
    ('when = "cxx < 12.3"', f'when = "cxx < {BIG}"', "patches[0].when"),
    ('when = "cxx < 12.3"', f'when = "cxx < 1.{"9" * 65}"', "patches[0].when"),
    ("size = 44549956", f"size = {BIG}", "line 27"),
    ("size = 44549956", f"size = {'9' * 30}", "vllm.size"),
    ('python = "3.11"', f'python = "3.{BIG}"', "python"),
    ('python = "3.11"', 'python = "3.11; rm -rf /"', "python"),
    ('runtime_version = "0.32.0"', f'runtime_version = "0.{BIG}"', "vllm.runtime_version"),
    ('MAX_JOBS = "2"', 'MAX_JOBS = "100000"', "build.env"),
    ('MAX_JOBS = "2"', 'MAX_JOBS = "0"', "build.env"),
])
def test_every_number_in_a_pin_is_bounded_exit_2_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str,
        field: str) -> None:
    """A patch's `when = "cxx < 999...9"` (5000 digits) was exit 70 (Python's int-string
    limit); now every number in a pin (a string's digits, a TOML integer) is held to its
    bound when the pin is read: exit 2, the file and the field named, no plan printed."""
    import shutil

    from oracle_build.cli import main

    repo = Path(__file__).resolve().parents[1]
    pins = tmp_path / "pins"
    shutil.copytree(repo / "pins", pins)
    text = (pins / "cpu-source.toml").read_text()
    assert old in text
    (pins / "cpu-source.toml").write_text(text.replace(old, new, 1))
    code = main(["build", "--pin", str(pins / "cpu-source.toml"), "--dry-run",
                 "--home", str(tmp_path / "home"), "--externals", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2, err[-2000:]
    assert str(pins / "cpu-source.toml") in err and f"  {field}: " in err, err[-2000:]
    assert "$ " not in out  # nothing planned
