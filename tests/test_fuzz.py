"""Every reader, fuzzed: valid files mutated (keys deleted or renamed, wrong types, huge or
negative numbers, NaN and infinities, out-of-range token ids, truncated bytes, invalid
UTF-8, deep nesting). Each case must load or end in BadInput naming the file (exit 2 at
the command line), never another exception, never a partial output."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle_build.cli import main
from oracle_build.contracts.candidate import load_candidate
from oracle_build.contracts.golden import load_golden
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.spec import load_spec
from oracle_build.core.errors import BadInput
from oracle_build.interop.vllmcpp import import_path
from tests.conftest import CPU_PIN, GPU_PIN, REPO, TINY_SPEC

DATA = REPO / "tests" / "data" / "vllm.cpp"
EXAMPLES = int(os.environ.get("ORACLE_BUILD_FUZZ_EXAMPLES", "150"))
TRIED: Counter[str] = Counter()
UNCHANGED: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    """After the module: the per-reader counts, for the README's Reliability section (written
    only when ORACLE_BUILD_RELIABILITY_OUT names a file)."""
    yield
    dest = os.environ.get("ORACLE_BUILD_RELIABILITY_OUT")
    if dest:
        path = Path(dest)
        old = json.loads(path.read_text()) if path.exists() else {}
        old["fuzz"] = {"examples_per_test": EXAMPLES, "inputs_tried": dict(TRIED),
                       "outcomes": dict(OUTCOMES), "unchanged_not_counted": dict(UNCHANGED)}
        path.write_text(json.dumps(old, indent=2))


WEIRD_VALUES = st.sampled_from([
    None, True, False, "", "x" * 300, -1, 0, 2**31, 2**63, -(2**63), 10**400, 1e308, -1e308,
    0.5, [], {}, [[[]]], {"a": {"b": [1, "2", None]}}, [-1, -2], "\xff\ufffd", "NaN"])


def _walk(doc: Any, draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[Any, Any]:
    """A random container in ``doc`` and a key/index into it."""
    parent, key = None, None
    node = doc
    for _ in range(draw(st.integers(0, 8))):
        if isinstance(node, dict) and node:
            k = draw(st.sampled_from(sorted(node)))
        elif isinstance(node, list) and node:
            k = draw(st.integers(0, len(node) - 1))
        else:
            break
        parent, key, node = node, k, node[k]
    if parent is None:
        if isinstance(doc, dict) and doc:
            return doc, draw(st.sampled_from(sorted(doc)))
        return None, None
    return parent, key


def mutate_json(raw: bytes, data: st.DataObject) -> bytes:
    op = data.draw(st.sampled_from(["delete", "rename", "retype", "nan", "truncate",
                                    "utf8", "nest", "token"]), label="op")
    if op == "truncate":
        return raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))]
    if op == "utf8":
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + b"\xff\xfe" + raw[at:]
    if op == "nest":
        depth = data.draw(st.integers(50, 5000))
        return b"[" * depth + raw + b"]" * depth
    doc = json.loads(raw)
    parent, key = _walk(doc, data.draw)
    if parent is None:
        return raw[:-1]
    if op == "delete":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        parent["x_" + str(key)] = parent.pop(key)
    elif op == "nan":
        parent[key] = "__NAN__"
        text = json.dumps(doc).replace('"__NAN__"', data.draw(
            st.sampled_from(["NaN", "Infinity", "-Infinity"])))
        return text.encode()
    elif op == "token":
        parent[key] = data.draw(st.sampled_from([-1, -7, 2**31, 2**40, 300, 10**6]))
    else:
        parent[key] = data.draw(WEIRD_VALUES)
    return json.dumps(doc).encode()


def mutate_text(raw: bytes, data: st.DataObject) -> bytes:
    lines = raw.split(b"\n")
    op = data.draw(st.sampled_from(["drop", "dup", "value", "truncate", "utf8", "garble"]))
    i = data.draw(st.integers(0, len(lines) - 1))
    if op == "drop":
        del lines[i]
    elif op == "dup":
        lines.insert(i, lines[i])
    elif op == "value" and b"=" in lines[i]:
        key = lines[i].split(b"=", 1)[0]
        lines[i] = key + b"= " + data.draw(st.sampled_from(
            [b'"garbage"', b"-1", b"1e999", b"[[]]", b"{}", b"nan", b"inf", b"true",
             b'"' + b"0" * 39 + b'"', b'"ext::sh -c id"', b"99999999999999999999999"]))
    elif op == "truncate":
        return raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))]
    elif op == "utf8":
        lines[i] = lines[i] + b"\xc3\x28"
    else:
        lines[i] = lines[i][::-1]
    return b"\n".join(lines)


def digest(path: Path) -> str:
    """The bytes of a file, or of every file in a folder (names included)."""
    h = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def check(reader: str, fn: Callable[[Path], object], path: Path, original: str) -> None:
    """Load a mutated input. Only an input whose bytes differ from the original counts;
    each must load or fail with BadInput naming the file and, for every problem, the field
    (a key path, a line and column, a byte offset, or <file> for the file as a whole)."""
    if digest(path) == original:
        UNCHANGED[reader] += 1
        return
    TRIED[reader] += 1
    try:
        fn(path)
        OUTCOMES[f"{reader}: loaded"] += 1
    except BadInput as exc:
        OUTCOMES[f"{reader}: BadInput"] += 1
        assert exc.exit_code == 2
        assert str(path.parent) in exc.message or str(path) in exc.message, exc.message
        assert exc.problems
        assert all(field.strip() for field, _msg in exc.problems), exc.problems


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="fuzz-"))


@FUZZ
@given(st.data())
def test_fuzz_golden(data: st.DataObject) -> None:
    d = workdir()
    path = d / "golden.json"
    raw = (TINY_SPEC / "golden.json").read_bytes()
    path.write_bytes(raw)
    original = digest(path)
    path.write_bytes(mutate_json(raw, data))
    check("golden", load_golden, path, original)
    shutil.rmtree(d)


@FUZZ
@given(st.data())
def test_fuzz_candidate(data: st.DataObject) -> None:
    golden = load_golden(TINY_SPEC)
    raw = json.dumps({"candidate_schema": 1, "engine": "x", "prompts": [
        {"id": p.id, "prompt_token_ids": p.prompt_token_ids, "token_ids": p.token_ids,
         "topk": p.topk} for p in golden.prompts]}).encode()
    d = workdir()
    path = d / "candidate.json"
    path.write_bytes(raw)
    original = digest(path)
    path.write_bytes(mutate_json(raw, data))
    check("candidate", load_candidate, path, original)
    shutil.rmtree(d)


@FUZZ
@given(st.data())
def test_fuzz_spec(data: st.DataObject) -> None:
    d = workdir()
    path = d / "spec.toml"
    raw = (TINY_SPEC / "spec.toml").read_bytes()
    path.write_bytes(raw)
    original = digest(path)
    path.write_bytes(mutate_text(raw, data))
    check("spec", load_spec, path, original)
    shutil.rmtree(d)


@FUZZ
@given(st.data(), st.sampled_from([CPU_PIN, GPU_PIN]), st.booleans())
def test_fuzz_pin_and_lock(data: st.DataObject, pin: Path, lock: bool) -> None:
    d = workdir()
    path = d / pin.name
    shutil.copy2(CPU_PIN.parent / "cpu.lock.txt", d / "cpu.lock.txt")
    path.write_bytes(pin.read_bytes())
    original = digest(d)
    if lock and pin == CPU_PIN:
        (d / "cpu.lock.txt").write_bytes(mutate_text((d / "cpu.lock.txt").read_bytes(), data))
        check("lock", lambda _d: load_pin(path), d, original)
    else:
        path.write_bytes(mutate_text(pin.read_bytes(), data))
        check("pin", lambda _d: load_pin(path), d, original)
    shutil.rmtree(d)


@FUZZ
@given(st.data(), st.sampled_from(["nemotron_35_lightning_greedy_legacy",
                                   "nemotron_35_lightning_greedy"]))
def test_fuzz_vllmcpp_oracle_json(data: st.DataObject, folder: str) -> None:
    d = workdir() / folder
    d.mkdir()
    raw = (DATA / folder / "oracle.json").read_bytes()
    (d / "oracle.json").write_bytes(raw)
    original = digest(d / "oracle.json")
    (d / "oracle.json").write_bytes(mutate_json(raw, data))
    check("vllm.cpp oracle.json", import_path, d / "oracle.json", original)
    shutil.rmtree(d.parent)


@FUZZ
@given(st.data())
def test_fuzz_vllmcpp_battery(data: st.DataObject) -> None:
    d = workdir() / "battery"
    shutil.copytree(DATA / "opt_greedy", d)
    for f in d.iterdir():
        f.chmod(0o644)
    original = digest(d)
    name = data.draw(st.sampled_from(["greedy_ids.npy", "greedy_dist.npy", "p0_prompt.i32",
                                      "p5_prompt.i32", "our_ids.npy"]))
    target = d / name
    op = data.draw(st.sampled_from(["truncate", "bytes", "dtype", "shape", "values",
                                    "delete"]))
    if name.endswith(".npy") and target.exists():
        arr = np.load(target)
        if op == "dtype":
            np.save(target, arr.astype(data.draw(st.sampled_from(["float32", "bool", "U3"]))))
        elif op == "shape":
            np.save(target, arr.reshape(-1) if arr.ndim > 1 else arr[:, None])
        elif op == "values":
            arr = arr.copy()
            arr.flat[data.draw(st.integers(0, arr.size - 1))] = data.draw(
                st.sampled_from([-1, -2, -(2**31), 2**31 - 1]))
            np.save(target, arr)
    elif name == "our_ids.npy":
        np.save(target, np.load(d / "greedy_ids.npy")[:, : data.draw(st.integers(1, 16))])
    if op == "truncate" and target.exists():
        raw = target.read_bytes()
        target.write_bytes(raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))])
    elif op == "bytes" and target.exists():
        raw = bytearray(target.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
        target.write_bytes(bytes(raw))
    elif op == "delete" and target.exists():
        target.unlink()
    check("vllm.cpp battery", import_path, d, original)
    shutil.rmtree(d.parent)


@FUZZ
@given(st.data())
def test_fuzz_cli_import_never_half_writes(data: st.DataObject) -> None:
    """At the command line: exit 0 or 2, no traceback, and on 2 no golden written."""
    d = workdir()
    src = d / "legacy"
    src.mkdir()
    raw = (DATA / "nemotron_35_lightning_greedy_legacy" / "oracle.json").read_bytes()
    mutated = mutate_json(raw, data)
    if mutated == raw:
        UNCHANGED["cli import"] += 1
        shutil.rmtree(d)
        return
    (src / "oracle.json").write_bytes(mutated)
    out = d / "goldens"
    TRIED["cli import"] += 1
    code = main(["import", str(src), "--out", str(out)])
    assert code in (0, 2)
    OUTCOMES[f"cli import: {'BadInput' if code == 2 else 'loaded'}"] += 1
    written = list(out.rglob("*")) if out.exists() else []
    if code == 2:
        assert not [w for w in written if w.is_file()]
    else:
        assert (out / "legacy" / "golden.json").is_file()
    shutil.rmtree(d)
