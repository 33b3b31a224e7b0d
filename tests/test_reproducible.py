"""Exactly: a source pin's rebuild gives the same compiled bytes, `build --check` proves it
(or names the file and the ELF section that differ), and a pin that holds its compiled bytes
(`lock --compiled`) holds every rebuild to them. On the small CMake package of tests/srcpkg.py
as a release archive: each build is seconds. vLLM's own (an hour each, by hand) is in
docs/reproducible-builds.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oracle_build.contracts.compiled import RECIPE, load_compiled
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.record import load_record
from oracle_build.core import layout, verdicts
from oracle_build.core.errors import (
    EXIT_IDENTITY,
    EXIT_NOT_REPRODUCED,
    EXIT_OK,
    EXIT_REFUSED,
    plain,
)
from oracle_build.oracle import elf
from oracle_build.oracle.venv import OracleVenv
from tests.conftest import REPO
from tests.srcpkg import (
    BUILD_DIR_CMAKE,
    BUILD_DIR_OPS_C,
    STAMPED_OPS_C,
    Sdist,
    make_sdist,
    write_sdist_pin,
)

pytestmark = pytest.mark.slow
SO = "vllm/_C.cpython-311-x86_64-linux-gnu.so"


def ob(*args: str, home: Path | None, wheelhouse: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORACLE_BUILD_WHEELHOUSE": str(wheelhouse)}
    env.pop("ORACLE_BUILD_COMPILER_CACHE", None)
    where = ["--home", str(home)] if home is not None else []
    return subprocess.run([sys.executable, "-m", "oracle_build", *args, *where],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          check=False)


def compiled_pin(s: Sdist) -> Path:
    """The archive pin, naming the file of its established compiled bytes."""
    pin = write_sdist_pin(s)
    text = pin.read_text()
    pin.write_text(text.replace('\nlock = ', '\ncompiled = "srcarchive.compiled.toml"\nlock = ', 1))
    return pin


def record_of(pin: Path, home: Path):  # type: ignore[no-untyped-def]
    venv = layout.oracle_path(home, load_pin(pin).key)
    return load_record(OracleVenv(venv).record_path)


def test_two_homes_same_bytes_and_check_proves_it(tmp_path: Path) -> None:
    """A package with the time of its compile in its bytes (__DATE__ __TIME__), built cold in
    one home, then rebuilt cold by `build --check` in a scratch home at a longer path,
    minutes later: the same compiled bytes (GCC takes both from SOURCE_DATE_EPOCH, one of
    the levers the record names), exit 0, ORACLE_REPRODUCED, the scratch build removed and
    its wheel never in the wheelhouse."""
    s = make_sdist(tmp_path / "sdist", ops_c=STAMPED_OPS_C)
    pin = write_sdist_pin(s)
    wheelhouse, home = tmp_path / "wh", tmp_path / "a"
    done = ob("build", "--pin", str(pin), "--externals", str(s.externals),
              "--no-compiler-cache", home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    first = record_of(pin, home).compiled
    assert first is not None and list(first.files) == [SO]
    assert first.toolchain and "cc: " in first.toolchain and "ld: " in first.toolchain
    assert any(lever.startswith("SOURCE_DATE_EPOCH") for lever in first.levers)
    assert any(lever.startswith("-ffile-prefix-map=<the staging folder>=.")
               for lever in first.levers)
    assert first.recipe == RECIPE
    assert any("CMAKE_BUILD_WITH_INSTALL_RPATH=ON" in lever for lever in first.levers)
    assert first.reproducible.startswith("not measured")
    wheels = sorted(p.name for p in wheelhouse.rglob("*.whl"))
    done = ob("build", "--pin", str(pin), "--externals", str(s.externals), "--check",
              home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == plain(verdicts.reproduced(True, 1))
    assert f"same    {SO}  sha256 {first.files[SO]}" in done.stdout
    assert "/check/" in done.stderr  # built in a scratch home at another path
    assert not any((home / "check").iterdir())  # and removed
    assert sorted(p.name for p in wheelhouse.rglob("*.whl")) == wheels


def test_an_unreproducible_build_is_caught_by_check_and_by_the_pins_bytes(
        tmp_path: Path) -> None:
    """A package that bakes its build folder into its bytes (a define no compiler cache
    rewrites). `lock --compiled` writes the oracle's bytes beside the pin (its key does not
    move) and identity compares them; `build --check` rebuilds and differs (exit 19, naming
    the library and .rodata); a rebuild is not published (exit 3, the file named,
    `build_oracle -- --check` said) and the oracle in place stays; establishing other bytes
    over the held ones is refused; held bytes edited are a mismatch."""
    s = make_sdist(tmp_path / "sdist", ops_c=BUILD_DIR_OPS_C, cmake_extra=BUILD_DIR_CMAKE)
    pin = compiled_pin(s)
    key = load_pin(pin).key
    home, wheelhouse = tmp_path / "home", tmp_path / "wh"
    args = ("--pin", str(pin), "--externals", str(s.externals))
    done = ob("build", *args, home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert ("compiled bytes unestablished: srcarchive.compiled.toml is not written yet"
            in done.stdout)
    done = ob("lock", "--pin", str(pin), "--compiled", home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    path = pin.parent / "srcarchive.compiled.toml"
    (entry,) = load_compiled(path).established
    installed = record_of(pin, home).compiled
    assert installed is not None and entry.files == installed.files
    assert entry.toolchain == installed.toolchain
    assert load_pin(pin).key == key  # the recipe's output is not its input
    done = ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "compiled 1 files, the pin's bytes (srcarchive.compiled.toml" in done.stdout
    # --check: a cold rebuild elsewhere, other bytes, said where
    done = ob("build", *args, "--check", home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_NOT_REPRODUCED, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("  differs "))
    assert SO in line and ".rodata" in line, done.stdout
    assert done.stdout.splitlines()[-1] == plain(verdicts.reproduced(False, 1))
    assert not any((home / "check").iterdir())
    # a rebuild in place: other bytes (another staging folder), not published
    done = ob("build", *args, "--rebuild", "--no-compiler-cache", home=home,
              wheelhouse=wheelhouse)
    assert done.returncode == EXIT_IDENTITY, done.stderr[-3000:]
    assert f"compiled file {SO}: expected sha256 {entry.files[SO][:16]}" in done.stderr
    assert "build_oracle -- --check" in done.stderr
    assert record_of(pin, home).compiled == installed  # the oracle in place is the one held
    assert ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse).returncode == 0
    # the held bytes, edited: the oracle in place no longer matches them
    original = path.read_text()
    path.write_text(original.replace(entry.files[SO], "0" * 64))
    done = ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_IDENTITY and verdicts.IDENTITY_OK not in done.stdout
    assert f"compiled file {SO}" in done.stdout + done.stderr
    refused = ob("lock", "--pin", str(pin), "--compiled", home=home, wheelhouse=wheelhouse)
    assert refused.returncode == EXIT_REFUSED, refused.stderr[-2000:]
    assert "already holds other bytes" in refused.stderr
    assert path.read_text() != original  # refused: nothing written
    path.write_text(original)
    assert ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse).returncode == 0


def test_elf_sections_name_what_differs(tmp_path: Path) -> None:
    """The section reader on a real shared object of this interpreter: a copy is the same; a
    byte changed inside .rodata is named as .rodata; a file that is not ELF, or is cut short,
    is said to be so."""
    import sysconfig

    lib = next(Path(sysconfig.get_config_var("DESTSHARED")).glob("_json*.so"))
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    shutil.copy2(lib, a)
    shutil.copy2(lib, b)
    assert elf.differences(a, b) == []
    parts = elf.sections(a).parts
    assert ".text" in parts and ".rodata" in parts
    data = bytearray(b.read_bytes())
    out = subprocess.run(["readelf", "-S", "-W", str(a)], capture_output=True, text=True,
                         check=False)
    if out.returncode == 0:  # the sections readelf lists are the ones read here
        listed = set(re.findall(r"\[\s*[1-9]\d*\]\s+(\S+)", out.stdout))
        assert set(parts) - {"ELF header", "program headers", "section headers"} == listed
    text = json.dumps(sorted(parts))
    assert "ELF header" in text
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        name_off, _kind = struct.unpack_from("<II", data, shoff + i * shentsize)
        name = bytes(data[names_off + name_off:data.index(0, names_off + name_off)])
        if name == b".rodata":
            off = struct.unpack_from("<Q", data, shoff + i * shentsize + 0x18)[0]
            data[off] ^= 0xFF
    b.write_bytes(bytes(data))
    assert elf.differences(a, b) == [".rodata"]
    b.write_bytes(b"not an elf file")
    assert elf.differences(a, b) == ["second: not an ELF file"] + [
        f"{n} (only in the first)" for n in parts]
    b.write_bytes(bytes(data[:200]))
    assert elf.sections(b).problem is not None


def test_the_cache_carries_and_holds_the_compiled_bytes(tmp_path: Path) -> None:
    """Through the OCI cache (a real registry): a source oracle's push signs its compiled
    bytes (the config's build record, the statement's byproducts); `list` shows their
    fingerprint; a pull for a pin that holds those bytes is taken, and one whose held bytes
    are other is refused (exit 18) before any wheel enters the wheelhouse."""
    from oracle_build.cache.signing import generate
    from oracle_build.core.errors import EXIT_CACHE_REFUSED
    from tests import registry as regmod
    from tests.srcpkg import make_repo, write_locked_pin

    pin = write_locked_pin(tmp_path, make_repo(tmp_path / "src" / "pkg"))
    pin.write_text(pin.read_text().replace(
        '\nlock = ', '\ncompiled = "srcpkg.compiled.toml"\nlock = ', 1))
    home, wheelhouse = tmp_path / "home", tmp_path / "wh"
    assert ob("build", "--pin", str(pin), home=home, wheelhouse=wheelhouse).returncode == 0
    assert ob("lock", "--pin", str(pin), "--compiled", home=home,
              wheelhouse=wheelhouse).returncode == 0
    compiled = record_of(pin, home).compiled
    assert compiled is not None
    srv = regmod.start(tmp_path / "registry")
    try:
        secret, _public, key = generate("ci-builder-1", tmp_path / "keys")
        trusted = tmp_path / "trusted-keys"
        trusted.write_text(key.public_line + "\n")
        ref = srv.ref()
        done = ob("push", "--pin", str(pin), "--cache", ref, "--signing-key", str(secret),
                  home=home, wheelhouse=wheelhouse)
        assert done.returncode == 0, done.stderr[-3000:]
        done = ob("list", "--cache", ref, "--trusted-keys", str(trusted), "--json",
                  home=None, wheelhouse=wheelhouse)
        (entry,) = json.loads(done.stdout)["oracles"]
        assert entry["compiled_fingerprint"] == compiled.fingerprint
        fresh = tmp_path / "fresh"
        done = ob("pull", "--pin", str(pin), "--cache", ref, "--trusted-keys", str(trusted),
                  home=fresh, wheelhouse=fresh / "wh")
        assert done.returncode == 0, done.stderr[-3000:]
        held = pin.parent / "srcpkg.compiled.toml"
        (digest,) = compiled.files.values()
        held.write_text(held.read_text().replace(digest, "1" * 64))
        other = tmp_path / "other"
        done = ob("pull", "--pin", str(pin), "--cache", ref, "--trusted-keys", str(trusted),
                  home=other, wheelhouse=other / "wh")
        assert done.returncode == EXIT_CACHE_REFUSED, done.stderr[-3000:]
        assert "compiled bytes are not the ones the pin holds" in done.stderr
        assert not list((other / "wh").rglob("*.whl"))
    finally:
        srv.stop()


def test_list_groups_source_oracles_with_the_same_compiled_bytes() -> None:
    """`list`'s text: two trusted source oracles of one pin whose compiled bytes are the
    same are one line, `the same bytes`; an untrusted one is not counted in it, and an
    oracle with other bytes has its own line."""
    from oracle_build.cache.fleet import Listed, render

    def entry(tag: str, fp: str, host: str, signature: str = "trusted") -> Listed:
        return Listed(tag=tag, pin_id="cpu-source", pin_hash="10" * 32, target="cpu",
                      built_on=host, signature=signature, compiled_fingerprint=fp)

    text = render([entry("a", "ab" * 32, "host-a"), entry("b", "ab" * 32, "host-b"),
                   entry("c", "ab" * 32, "host-c", "untrusted (x-1)"),
                   entry("d", "cd" * 32, "host-d")], "oci://r/team/oracles")
    lines = text.splitlines()
    same = next(x for x in lines if x.startswith(f"  {'ab' * 8}:"))
    assert "host-a" in same and "host-b" in same and same.endswith("the same bytes")
    assert "host-c" not in same
    other = next(x for x in lines if x.startswith(f"  {'cd' * 8}:"))
    assert "host-d" in other and not other.endswith("the same bytes")
