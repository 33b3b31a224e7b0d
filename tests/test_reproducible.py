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

from oracle_build.contracts.compiled import load_compiled
from oracle_build.contracts.pins import load_pin
from oracle_build.contracts.record import load_record
from oracle_build.core import layout, verdicts
from oracle_build.core.errors import (
    EXIT_IDENTITY,
    EXIT_NOT_REPRODUCED,
    EXIT_OK,
    EXIT_REFUSED,
)
from oracle_build.oracle import elf
from oracle_build.oracle.venv import OracleVenv
from tests.conftest import REPO
from tests.srcpkg import STAMPED_OPS_C, Sdist, make_sdist, write_sdist_pin

pytestmark = pytest.mark.slow
SO = "vllm/_C.cpython-311-x86_64-linux-gnu.so"


def ob(*args: str, home: Path, wheelhouse: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORACLE_BUILD_WHEELHOUSE": str(wheelhouse)}
    env.pop("ORACLE_BUILD_COMPILER_CACHE", None)
    return subprocess.run([sys.executable, "-m", "oracle_build", *args, "--home", str(home)],
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
    """Two cold builds of one pin in two homes at paths of other lengths give the same
    compiled bytes, recorded with the toolchain and the levers; `build --check` rebuilds
    cold in a third place and says so (exit 0, ORACLE_REPRODUCED), leaving nothing behind."""
    s = make_sdist(tmp_path / "sdist")
    pin = write_sdist_pin(s)
    wheelhouse = tmp_path / "wh"
    homes = [tmp_path / "a", tmp_path / "a-home-at-a-much-longer-path" / "and-deeper" / "b"]
    for home in homes:
        done = ob("build", "--pin", str(pin), "--externals", str(s.externals),
                  "--no-compiler-cache", home=home, wheelhouse=wheelhouse)
        assert done.returncode == EXIT_OK, done.stderr[-3000:]
    first, second = (record_of(pin, h).compiled for h in homes)
    assert first is not None and second is not None
    assert list(first.files) == [SO] and first.files == second.files
    assert first.toolchain and "cc: " in first.toolchain and "ld: " in first.toolchain
    assert any(lever.startswith("CCACHE_BASEDIR") for lever in first.levers)
    assert any("CMAKE_BUILD_WITH_INSTALL_RPATH=ON" in lever for lever in first.levers)
    assert first.reproducible.startswith("not measured")
    done = ob("build", "--pin", str(pin), "--externals", str(s.externals), "--check",
              home=homes[0], wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == verdicts.reproduced(True, 1)
    assert f"same    {SO}  sha256 {first.files[SO]}" in done.stdout
    assert not any((homes[0] / "check").iterdir())  # the scratch build removed
    # the built wheel of the check never replaced the oracle's in the wheelhouse
    kept = json.loads((wheelhouse / load_pin(pin).key / "manifest.json").read_text()) \
        if (wheelhouse / load_pin(pin).key / "manifest.json").exists() else None
    if kept is not None:
        built = [w for w in kept["wheels"].values() if w["origin"] == "built"]
        assert len(built) == 1


def test_check_names_the_file_and_section_of_an_unreproducible_build(tmp_path: Path) -> None:
    """A package that writes its compile time into its bytes (__DATE__ __TIME__): --check's
    cold rebuild differs, exit 19, naming the library and .rodata; the scratch build gone."""
    s = make_sdist(tmp_path / "sdist", ops_c=STAMPED_OPS_C)
    pin = write_sdist_pin(s)
    home, wheelhouse = tmp_path / "home", tmp_path / "wh"
    done = ob("build", "--pin", str(pin), "--externals", str(s.externals), home=home,
              wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    done = ob("build", "--pin", str(pin), "--externals", str(s.externals), "--check",
              home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_NOT_REPRODUCED, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("  differs "))
    assert SO in line and ".rodata" in line, done.stdout
    assert done.stdout.splitlines()[-1] == verdicts.reproduced(False, 1)
    assert not any((home / "check").iterdir())
    # the oracle in place is untouched: identity still passes
    assert ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse).returncode == 0


def test_pin_held_bytes_catch_a_rebuild_with_other_bytes(tmp_path: Path) -> None:
    """`lock --compiled` writes the oracle's compiled bytes beside the pin (the pin's key does
    not move); identity then compares; a rebuild that compiled other bytes is not published
    (exit 3, the file named, `build_oracle -- --check` said) and the oracle in place stays;
    establishing those other bytes over the held ones is refused."""
    s = make_sdist(tmp_path / "sdist", ops_c=STAMPED_OPS_C)
    pin = compiled_pin(s)
    key = load_pin(pin).key
    home, wheelhouse = tmp_path / "home", tmp_path / "wh"
    args = ("--pin", str(pin), "--externals", str(s.externals))
    done = ob("build", *args, home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "compiled bytes unestablished in srcarchive.compiled.toml" in done.stdout
    done = ob("lock", "--pin", str(pin), "--compiled", home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    held = load_compiled(pin.parent / "srcarchive.compiled.toml")
    (entry,) = held.established
    installed = record_of(pin, home).compiled
    assert installed is not None and entry.files == installed.files
    assert load_pin(pin).key == key  # the recipe's output is not its input
    done = ob("identity", "--pin", str(pin), home=home, wheelhouse=wheelhouse)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "compiled 1 files, the pin's bytes (srcarchive.compiled.toml" in done.stdout
    # a rebuild from the same source and toolchain: other bytes (its compile time)
    done = ob("build", *args, "--rebuild", "--no-compiler-cache", home=home,
              wheelhouse=wheelhouse)
    assert done.returncode == EXIT_IDENTITY, done.stderr[-3000:]
    assert f"compiled file {SO}: expected sha256 {entry.files[SO][:16]}" in done.stderr
    assert "build_oracle -- --check" in done.stderr
    assert record_of(pin, home).compiled == installed  # the oracle in place is the one held
    # the held bytes, edited: the oracle in place no longer matches them
    path = pin.parent / "srcarchive.compiled.toml"
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
