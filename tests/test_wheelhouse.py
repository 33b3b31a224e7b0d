"""The wheelhouse: keyed by the pin, every wheel hash-checked, tampering refused."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from oracle_build import recipe
from oracle_build.contracts.pins import load_pin
from oracle_build.core import env as envmod
from oracle_build.core import layout
from oracle_build.core.errors import BadInput
from oracle_build.oracle.venv import uv
from oracle_build.recipe.wheelhouse import Wheelhouse
from tests.conftest import CPU_PIN, BuiltOracle, linked_copy

pytestmark = pytest.mark.slow


def uv_cache_bytes() -> tuple[Path, int]:
    """uv's cache as a build's uv sees it (the build environment: UV_* scrubbed), and the
    bytes it holds."""
    env = {**envmod.build_env(network=True), **envmod.UV}
    where = Path(subprocess.run([uv(), "cache", "dir"], env=env, capture_output=True,
                                text=True, check=True).stdout.strip())
    total = sum(f.lstat().st_size for f in where.rglob("*") if f.is_file()) \
        if where.exists() else 0
    return where, total


def record(venv: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (venv / "oracle-build" / "build-record.json").read_text())
    return data


def test_rebuild_installs_the_same_set_and_tampered_wheel_is_refused(
        cpu_oracle: BuiltOracle, tmp_path: Path) -> None:
    """Slow: builds a real oracle venv (an install from the wheelhouse, about a minute)."""
    pin = cpu_oracle.pin
    wh_root = tmp_path / "wh"
    linked_copy(cpu_oracle.wheelhouse / pin.key, wh_root / pin.key)
    victim = next(p for p in (wh_root / pin.key).glob("mdurl-*.whl"))
    tampered = victim.with_suffix(".tmp")
    tampered_bytes = victim.read_bytes()[:-10] + b"0123456789"
    tampered.write_bytes(tampered_bytes)
    tampered.replace(victim)  # a new inode: the shared wheelhouse is untouched
    home = tmp_path / "home"
    # the second oracle into a fresh home (the session's is the first), from a wheelhouse at
    # a path uv has never seen: uv's own cache must not gain an unpacked oracle (issue 35;
    # before the build had a cache of its own, it grew by 3.4 GB here)
    cache, before = uv_cache_bytes()
    outcome = recipe.build_oracle(pin, "cpu", home=home, wheelhouse_root=wh_root)
    assert outcome.identity.ok
    _, after = uv_cache_bytes()
    assert after - before < 8 * 2**20, f"{cache} grew by {(after - before) / 2**20:.0f} MiB"
    assert not any((home / "staging").glob("*/uv-cache"))  # the build's own cache is gone
    rejected = list((wh_root / pin.key / "rejected").iterdir())
    assert [r.name.split(".whl")[0] for r in rejected] == [victim.name.split(".whl")[0]]
    rec = record(layout.oracle_path(home, pin.key))
    assert rec["origin"] == "fetched"  # the refused wheel was downloaded again
    first = record(cpu_oracle.venv)
    assert rec["distributions"] == first["distributions"]  # same names, versions, sha256
    # the same pin, installed twice: the same content fingerprint (every file's path and
    # sha256; moved here from test_oracle_cpu, whose damaged oracles are now linked copies)
    anchor = lambda venv: json.loads(  # noqa: E731
        (venv.parent / f"{venv.name}.anchor.json").read_text())["content_fingerprint"]
    assert anchor(layout.oracle_path(home, pin.key)) == anchor(cpu_oracle.venv)
    # and the wheelhouse is whole again: every locked wheel there, its bytes the lock's (the
    # next build takes them offline, as a rebuild from a whole wheelhouse does: origin
    # `wheelhouse`, test_oracle_cpu's drift test), the downloaded one among them
    wh = Wheelhouse.for_pin(wh_root, pin)
    found = {entry.key: wh.find(entry) for entry in pin.require_lock()}
    assert all(path is not None for path in found.values()), [
        k for k, v in found.items() if v is None]
    fetched = next(p for p in found.values() if p is not None and p.name == victim.name)
    assert fetched.read_bytes() != tampered_bytes


def test_another_pins_wheelhouse_is_not_used(cpu_oracle: BuiltOracle, tmp_path: Path) -> None:
    """Slow: needs the session's real CPU oracle (built once per run); its own work is seconds."""
    other = tmp_path / "cpu.toml"
    other.write_text(CPU_PIN.read_text().replace("memory_floor_gib = 4.0",
                                                 "memory_floor_gib = 6.0"))
    shutil.copy2(CPU_PIN.parent / "cpu.lock.txt", tmp_path / "cpu.lock.txt")
    pin_b = load_pin(other)
    assert pin_b.key != cpu_oracle.pin.key
    wh_b = Wheelhouse.for_pin(cpu_oracle.wheelhouse, pin_b)
    assert wh_b.root != cpu_oracle.wheelhouse / cpu_oracle.pin.key
    # B's folder gets A's manifest: refused, naming the pin it belongs to
    linked_copy(cpu_oracle.wheelhouse / cpu_oracle.pin.key, tmp_path / "whb" / pin_b.key)
    forged = Wheelhouse.for_pin(tmp_path / "whb", pin_b)
    with pytest.raises(BadInput) as info:
        forged.find(pin_b.require_lock()[0])
    assert info.value.problems[0][0] == "pin_hash"
    assert cpu_oracle.pin.key in info.value.message
