"""The run as closed as the build (issue 63): every process that runs oracle code runs with
its network closed and its environment made; nothing of a spec, golden or model folder runs
in the engine; the engine's run-time compiler is the tool's choice, recorded and held; verify
says when the numbers moved. Against the real things: the real CPU oracle and vLLM engine,
real network namespaces and a real loopback server, a second real compiler (Debian's clang,
which `nox -s tests` installs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oracle_build.checkpoints.resolve import resolve_model
from oracle_build.cli import main
from oracle_build.contracts import engine_keys
from oracle_build.contracts.driver import DriverResult
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.reports import VerifyReport
from oracle_build.contracts.spec import ModelSpec
from oracle_build.contracts.topk import TopKTable, moved_cells
from oracle_build.core import env as envmod
from oracle_build.core import layout, proc
from oracle_build.core.errors import EXIT_BAD_INPUT, EXIT_CONFIG_DIFF, BadInput, EngineFailed
from oracle_build.engine.session import EngineResult
from oracle_build.oracle.opening import open_oracle
from oracle_build.report import text
from tests.conftest import REPO, TINY_SPEC, BuiltOracle
from tests.test_hostile4 import _counting_server

DRIVER = REPO / "oracle_build" / "inside" / "driver.py"
CLANG = "/usr/bin/clang++"


def spec_with(tmp_path: Path, name: str, engine: dict[str, str] | None = None,
              extra: str = "") -> Path:
    """The bundled spec under another name, its pin absolute, with engine lines changed."""
    text = (TINY_SPEC / "spec.toml").read_text()
    text = text.replace('name = "tiny-llama-greedy"', f'name = "{name}"')
    text = text.replace('pin = "../../pins/cpu.toml"', f'pin = "{REPO / "pins" / "cpu.toml"}"')
    for line, new in (engine or {}).items():
        assert line in text, line
        text = text.replace(line, new)
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "spec.toml").write_text(text + extra)
    return folder


# ---------------------------------------------------------------- fast


@pytest.mark.parametrize("line", ["trust_remote_code = true", 'worker_cls = "evil.Worker"',
                                  'model_impl = "transformers"', 'load_format = "dummy"',
                                  "some_future_argument = 1"])
def test_an_engine_key_outside_the_allow_list_is_refused_before_any_engine(
        tmp_path: Path, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 naming the spec and the key, with the oracle home empty: nothing was opened,
    no engine started."""
    folder = spec_with(tmp_path, "keys", {"[engine]\n": f"[engine]\n{line}\n"})
    home = tmp_path / "home"
    assert main(["capture", str(folder), "--home", str(home)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    key = line.split(" ", 1)[0]
    assert f"engine.{key}" in err and "spec.toml" in err
    assert ("refused: " in err) == (key != "some_future_argument")
    assert not (home / "oracles").exists()


def test_a_golden_that_records_a_code_loading_key_is_bad_input_on_verify(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify re-runs what a golden records: the same allow-list holds, before any engine."""
    shutil.copytree(REPO / "pins", tmp_path / "pins")
    dest = tmp_path / "goldens" / "g"
    shutil.copytree(TINY_SPEC, dest, ignore=shutil.ignore_patterns("replaced"))
    doc = json.loads((dest / "golden.json").read_text())
    doc["spec"]["engine"]["trust_remote_code"] = True
    doc["engine"]["requested"]["trust_remote_code"] = True
    (dest / "golden.json").write_text(json.dumps(doc))
    assert main(["verify", str(dest), "--home", str(tmp_path / "home")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "spec.engine.trust_remote_code" in err and "engine.requested.trust_remote_code" in err


def test_a_pin_target_cannot_default_a_code_loading_key(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(REPO / "pins", tmp_path / "pins")
    pin = tmp_path / "pins" / "cpu.toml"
    pin.write_text(pin.read_text().replace(
        "engine_defaults = { kv_cache_memory_bytes = 1073741824 }",
        'engine_defaults = { kv_cache_memory_bytes = 1073741824, worker_cls = "x.Y" }'))
    assert main(["identity", "--pin", str(pin), "--home", str(tmp_path / "h")]) == \
        EXIT_BAD_INPUT
    assert "engine_defaults.worker_cls" in capsys.readouterr().err


def test_a_model_folder_holding_code_is_refused_naming_each_file(tmp_path: Path) -> None:
    """A configuration_*.py beside the weights, an auto_map, a tokenizer named by a
    qualified class: each named; a clean folder passes."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    resolve_model(ModelSpec(path="model"), tmp_path, tmp_path / "home")  # clean: passes
    (model / "configuration_evil.py").write_text("import os; os.system('touch PWNED')\n")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    (model / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "tokenization_evil.EvilTokenizer"}))
    with pytest.raises(BadInput) as caught:
        resolve_model(ModelSpec(path="model"), tmp_path, tmp_path / "home")
    fields = [f for f, _ in caught.value.problems]
    assert fields == ["configuration_evil.py", "config.json: auto_map",
                      "tokenizer_config.json: tokenizer_class"]
    assert not Path("PWNED").exists()


def test_every_refused_key_is_named_with_why_and_no_key_is_both() -> None:
    known, refused = engine_keys.known_keys(), engine_keys.refused_keys()
    assert not set(known) & set(refused)
    assert {"trust_remote_code", "worker_cls", "worker_extension_cls", "logits_processors",
            "model_impl", "hf_overrides"} <= set(refused)
    assert all(len(why) > 10 for why in refused.values())


def test_an_oracle_process_gets_a_made_path_and_home_never_the_callers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/planted/bin:" + os.environ["PATH"])
    monkeypatch.setenv("HOME", "/planted/home")
    env = envmod.oracle_env({})
    assert env["PATH"] == os.pathsep.join(envmod.SYSTEM_PATH)
    assert env["HOME"] != "/planted/home" and Path(env["HOME"]).is_dir()
    assert envmod.oracle_env({"HOME": "/cache/home"})["HOME"] == "/cache/home"


@dataclass
class _Server:
    """A server on the host's loopback that notes every request (test_hostile4's)."""

    port: int
    seen: list[str]


@pytest.fixture
def server() -> Iterator[_Server]:
    port, seen, httpd = _counting_server()
    yield _Server(port, seen)
    httpd.shutdown()
    httpd.server_close()


WATCH = """
import importlib.util, json, socket, sys, urllib.request
spec = importlib.util.spec_from_file_location("driver", sys.argv[1])
driver = importlib.util.module_from_spec(spec); spec.loader.exec_module(driver)
driver.watch_network()
try:
    urllib.request.urlopen("http://127.0.0.1:%s/probe" % sys.argv[2], timeout=5).read()
    reached = True
except OSError:
    reached = False
for host in ("huggingface.co", "10.255.255.1"):
    try:
        socket.create_connection((host, 443), timeout=2)
    except OSError:
        pass
print(json.dumps({"loopback_server": reached, **driver.network_facts()}))
"""


def test_the_drivers_network_is_its_own_loopback_and_it_names_what_it_reached_for(
        server: _Server) -> None:
    """The closure every oracle process runs under (core/proc.py, as the build's), with the
    driver's own watch: the host's loopback server is not reached, only `lo` is there, and
    the names and addresses it tried are named. Control: the same script unclosed reaches
    the server."""
    how = proc.oracle_network()[0]
    assert how in ("netns", "userns")
    argv = [sys.executable, "-c", WATCH, str(DRIVER), str(server.port)]
    open_run = json.loads(subprocess.run(argv, capture_output=True, text=True,
                                         check=True).stdout)
    assert open_run["loopback_server"] is True and server.seen == ["/probe"]
    closed = proc.run(argv, capture=True, echo=False, closed=how)
    facts = json.loads(closed.output.strip().splitlines()[-1])
    assert facts["loopback_server"] is False and server.seen == ["/probe"]
    assert facts["interfaces"] == ["lo"]
    assert "huggingface.co:443 (name lookup)" in facts["reached_for"]
    assert "10.255.255.1:443 (connect)" in facts["reached_for"]


def test_an_engine_that_fails_for_want_of_the_network_says_what_it_reached_for(
        tmp_path: Path) -> None:
    result = DriverResult.model_validate({
        "driver_schema": 2, "ok": False, "error": "OSError: [Errno -3] name resolution",
        "network": {"interfaces": ["lo"], "reached_for": ["huggingface.co:443 (name lookup)"]}})
    with pytest.raises(EngineFailed) as caught:
        EngineResult(result, {}, {}, tmp_path / "log").require()
    assert "it reached for the network" in caught.value.message
    assert "huggingface.co:443 (name lookup)" in caught.value.message
    assert caught.value.hint and "local disk" in caught.value.hint


def test_moved_cells_counts_every_logprob_that_is_not_the_goldens() -> None:
    a = TopKTable.from_rows([[[(1, -0.1), (2, -0.5)], [(3, -0.2), (4, -0.9)]]])
    same = TopKTable.from_rows([[[(1, -0.1), (2, -0.5)], [(3, -0.2), (4, -0.9)]]])
    assert moved_cells(["p"], a, same) == {"cells": 0, "of": 4, "max_abs_delta": None}
    one = TopKTable.from_rows([[[(1, -0.1), (2, -0.5)], [(3, -0.2), (4, -0.9000001)]]])
    got = moved_cells(["p"], a, one)
    assert got["cells"] == 1 and got["of"] == 4
    assert got["max_abs_delta"] == pytest.approx(1e-7, rel=0.5)
    swapped = TopKTable.from_rows([[[(1, -0.1), (5, -0.5)], [(4, -0.2), (3, -0.9)]]])
    assert moved_cells(["p"], a, swapped)["cells"] == 3  # token 2 gone; 3 and 4 swapped


# ---------------------------------------------------------------- slow: the real engine


@pytest.mark.slow
def test_every_allowed_engine_key_is_an_argument_of_the_pinned_vllm(
        cpu_oracle: BuiltOracle) -> None:
    """The allow-list is read against the pinned vLLM's own EngineArgs (not a copy of it)."""
    code = ("import dataclasses, json; from vllm.engine.arg_utils import EngineArgs; "
            "print(json.dumps([f.name for f in dataclasses.fields(EngineArgs)]))")
    out = subprocess.run([str(cpu_oracle.venv / "bin" / "python"), "-I", "-c", code],
                         capture_output=True, text=True, check=True, cwd=cpu_oracle.home)
    fields = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert set(engine_keys.known_keys()) <= fields, set(engine_keys.known_keys()) - fields
    assert set(engine_keys.refused_keys()) <= fields, set(engine_keys.refused_keys()) - fields


@pytest.mark.slow
def test_the_engine_host_runs_closed_with_its_made_environment(
        cpu_oracle: BuiltOracle, tmp_path: Path, server: _Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live engine host of the real CPU oracle (the process that then runs the engine):
    a network namespace other than ours, in which the host's loopback server cannot be
    reached; HOME the compile cache's, PATH the system's, CXX the tool's compiler, whatever
    the caller's environment said."""
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "callers-home"))
    monkeypatch.setenv("CXX", "/planted/c++")
    oracle = open_oracle(cpu_oracle.pin, "cpu", cpu_oracle.home,
                         engine_log=tmp_path / "engine.log")
    engine_host = oracle.take_host()
    assert engine_host is not None
    try:
        pid = engine_host.live.proc.pid
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ")
                       .read_bytes().decode().split("\0") if "=" in item)
        assert environ["PATH"] == os.pathsep.join(envmod.SYSTEM_PATH)
        assert environ["HOME"] == str(oracle.compile_cache(cpu_oracle.home).root / "home")
        assert environ["CXX"] == "/usr/bin/g++"
        assert environ["TORCHINDUCTOR_CPP_MARCH"] == "x86-64-v3"
        probe = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", sys.executable, "-c",
             "import urllib.request, sys\ntry:\n urllib.request.urlopen("
             f"'http://127.0.0.1:{server.port}/from-the-engine', timeout=3)\n"
             "except OSError as e:\n print('refused', e); sys.exit(0)\nsys.exit(9)"],
            capture_output=True, text=True)
        assert probe.returncode == 0 and "refused" in probe.stdout, probe
        assert server.seen == []
    finally:
        engine_host.close()
    block = oracle.identity.block()
    assert "runs with the network closed (" in block
    assert "run-time compiler /usr/bin/g++ (" in block and "-march=x86-64-v3" in block


@pytest.mark.slow
def test_the_run_time_compiler_is_recorded_held_and_the_moved_numbers_named(
        cpu_oracle: BuiltOracle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With enforce_eager = false the engine compiles the model's own kernels at run time.
    Captured with the default compiler (the system's g++): the golden names it (version, the
    sha256 of driver, cc1plus, as, ld; -march from the held variant) and the kernels it
    compiled and ran. Verified with clang (a second real compiler, through
    $ORACLE_BUILD_RUNTIME_CXX), one engine for three copies: the golden that records its
    compiler is a configuration difference naming it (exit 4), before the tokens; a golden
    from before the compiler was recorded passes its token gate, and verify says the numbers
    moved, with the count and the largest difference; its bit-exact copy fails (drift). The
    compile cache keeps each compiler's kernels apart."""
    assert Path(CLANG).is_file(), "clang++ is missing: `nox -s tests` installs clang and libomp-dev"
    folder = spec_with(tmp_path, "compiled",
                       {"enforce_eager = true": "enforce_eager = false"})
    home = str(cpu_oracle.home)
    assert main(["capture", str(folder), "--home", home]) == 0
    golden = load_golden(folder)
    assert golden.engine is not None and golden.run is not None
    compiler = golden.engine.compiler
    assert compiler is not None and compiler.path == "/usr/bin/g++"
    assert compiler.march == "x86-64-v3" and compiler.version and "g++" in compiler.version
    assert set(compiler.tools) == {"driver", "cc1plus", "as", "ld"} and all(
        compiler.tools.values())
    assert compiler.kernels and all(k.endswith(".so") for k in compiler.kernels)
    assert golden.run.network and golden.run.network.startswith("closed (")
    assert "compiler" not in golden.run.host  # `cc --version` is not the engine's compiler

    old = tmp_path / "before" / "compiled"  # as a golden from before issue 63 records it
    shutil.copytree(folder, old)
    doc = json.loads((old / "golden.json").read_text())
    doc["engine"]["compiler"] = None
    (old / "golden.json").write_text(json.dumps(doc))
    exact = tmp_path / "exact" / "compiled"
    shutil.copytree(old, exact)
    doc["gate"]["bit_exact"] = True
    (exact / "golden.json").write_text(json.dumps(doc))

    monkeypatch.setenv("ORACLE_BUILD_RUNTIME_CXX", CLANG)
    capsys.readouterr()
    code = main(["verify", str(folder), str(old), str(exact), "--home", home, "--json",
                 "--junit-xml", str(tmp_path / "junit.xml"),
                 "--summary-md", str(tmp_path / "summary.md")])
    data = json.loads(capsys.readouterr().out)
    assert code == EXIT_CONFIG_DIFF, data
    out = text.render(VerifyReport.model_validate(data))  # the terminal's words, as printed
    by = {v["path"]: v for v in data["goldens"]}
    recorded, before, bit_exact = (by[str(p / "golden.json")] for p in (folder, old, exact))
    assert recorded["status"] == "config_difference"
    assert {d["field"] for d in recorded["configuration"]} >= {"compiler.version",
                                                               "compiler.tools"}
    assert before["status"] == "pass" and bit_exact["status"] == "drift"
    for v in (before, bit_exact):
        moved = v["logprobs_moved"]
        assert all(t["tokens_equal"] for t in v["tokens"])
        assert 0 < moved["cells"] <= moved["of"] and 0 < moved["max_abs_delta"] < 1e-3
    assert out.count("tokens match; numbers moved: ") == 3
    assert "(its gate is bit-exact: FAIL)" in out
    assert "numbers_moved" in (tmp_path / "junit.xml").read_text()
    assert (tmp_path / "summary.md").read_text().count("**numbers:** tokens match") == 3
    assert out.startswith("engines ran with the network closed (")
    caches = layout.compile_cache(Path(home), cpu_oracle.pin.key)
    assert len(list(caches.glob("cxx-*"))) >= 2  # g++'s kernels and clang's, apart


def test_a_tools_probe_reaches_nothing_of_the_hosts(server: _Server) -> None:
    """Issue 65 (6), by construction: every short question the tool asks a program (a
    compiler's version, a git, a device's listing: `core.proc.query`) runs closed by default;
    the same program asked with the network left open (the control) reaches the server."""
    code = ("import urllib.request, sys\ntry:\n urllib.request.urlopen("
            f"'http://127.0.0.1:{server.port}/probe', timeout=3)\n print('reached')\n"
            "except OSError:\n print('refused')")
    assert proc.query([sys.executable, "-c", code], closed=None).output.strip() == "reached"
    assert server.seen == ["/probe"]
    assert proc.query([sys.executable, "-c", code]).output.strip() == "refused"
    assert server.seen == ["/probe"]


def test_the_run_time_compiler_is_the_tools_choice_and_its_fingerprint_its_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """engine/compiler.py against this host's real compilers: the default is the system's g++
    (never the caller's PATH: a planted folder first on it changes nothing); naming the same
    compiler another way gives the same fingerprint (the same compile cache), clang another;
    a generic name (c++) is given by the file it resolves to (inductor picks flags by the
    name); a compiler that is not there is a preflight failure naming it, exit 6."""
    from oracle_build.contracts.pins import load_pin
    from oracle_build.core.errors import PreflightFailed
    from oracle_build.devices import NO_HOLD
    from oracle_build.engine import compiler as runtime

    target = load_pin(REPO / "pins" / "cpu.toml").target("cpu")
    monkeypatch.setenv("PATH", "/planted/bin:" + os.environ["PATH"])
    default = runtime.choose(target, NO_HOLD)
    assert default.path == "/usr/bin/g++" and default.chosen_by.startswith("the default")
    assert default.march is None and "TORCHINDUCTOR_CPP_MARCH" not in default.env()
    monkeypatch.setenv(runtime.VARIABLE, "/usr/bin/c++")
    generic = runtime.choose(target, NO_HOLD)
    assert generic.path == os.path.realpath("/usr/bin/c++") and "g++" in generic.path
    assert generic.fingerprint == default.fingerprint
    monkeypatch.setenv(runtime.VARIABLE, CLANG)
    assert runtime.choose(target, NO_HOLD).fingerprint != default.fingerprint
    # a source build's linker is asked the same way (recipe/toolchain.py): the real ld
    from oracle_build.recipe import toolchain

    env = {"PATH": os.pathsep.join(envmod.SYSTEM_PATH)}
    ld = runtime.prog_path("/usr/bin/g++", "ld", env)
    assert ld is not None and os.path.basename(ld) == "ld" and os.access(ld, os.X_OK)
    line = toolchain.linker(toolchain.find_compiler("cxx", "/usr/bin/g++"), env)
    assert line is not None and "ld" in line.lower()
    monkeypatch.setenv(runtime.VARIABLE, "/nonexistent/c++")
    with pytest.raises(PreflightFailed, match="/nonexistent/c"):
        runtime.choose(target, NO_HOLD)
