#!/usr/bin/env python3
"""oracle-build's nvcc launcher: the compiler CMake is told is nvcc, in the chain
``ccache -> this -> nvcc``. Standard library only, and nothing of oracle-build: the tool
copies this file into a toolkit's ``launcher/`` folder as ``nvcc`` (the name ccache knows
nvcc by) with ``TOOLKIT`` set to the toolkit's digest (recipe/cuda/toolkit.py), so that
ccache's ``compiler_check = content`` keys every object by this file's bytes and so by the
toolkit's sha256s, never by a folder.

What nvcc 13.0 puts into an object by default, measured (docs/reproducible-builds.md): the
process id (its temporary files are ``tmpxft_<pid>_...``, and that name lands in the
object), the absolute source path (the module id ``_GLOBAL__N__<hash>`` hashes it) and
the folders of the build (``__FILE__``). For a compile (``-c``) of a CUDA source this
launcher adds, and ccache never sees (so its keys hold no folder):

- ``-Xcompiler=-ffile-prefix-map=<dir>=.`` for each folder ``ORACLE_BUILD_NVCC_PREFIX_MAP``
  names (separated by ';'), covering host and device ``__FILE__`` both;
- ``--keep --keep-dir=<a fresh temporary folder>``, removed after the call: nvcc then names
  its intermediate files after the source, not after its process (the folder's own path
  reaches no object);
- ``-Xcudafe --orig_src_path_name=<the source path, mapped as above>``, so the module id
  hashes the mapped path.

Any other call (``--version``, ``-E``, a link, CMake's probes) runs nvcc unchanged. The
toolkit behind the launcher is checked on every call against ``toolkit.json`` beside it
(the digest this file holds; the size and mtime of each tool the digest covers): another
toolkit behind the same launcher is refused (exit 97), never compiled with silently.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import NoReturn

TOOLKIT = "@TOOLKIT@"
PREFIX_MAP_VARIABLE = "ORACLE_BUILD_NVCC_PREFIX_MAP"
CUDA_SUFFIXES = (".cu",)
REFUSED = 97


def fail(message: str) -> NoReturn:
    sys.stderr.write("oracle-build nvcc launcher: " + message + "\n")
    sys.exit(REFUSED)


def toolkit() -> str:
    """The real nvcc, after checking that the toolkit is the one this launcher was made for."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, "toolkit.json"), encoding="utf-8") as f:
            facts = json.load(f)
    except (OSError, ValueError) as exc:
        fail(f"cannot read toolkit.json beside the launcher ({exc})")
    if not isinstance(facts, dict) or facts.get("digest") != TOOLKIT:
        fail(f"toolkit.json names another toolkit than this launcher's ({TOOLKIT})")
    tools = facts.get("tools")
    if not isinstance(tools, dict) or not tools:
        fail("toolkit.json lists no tools")
    for path, seen in sorted(tools.items()):
        try:
            st = os.stat(path)
        except OSError:
            fail(f"{path} is gone: reinstall the toolkit (oracle-build makes it again)")
        if [st.st_size, st.st_mtime_ns] != seen:
            fail(f"{path} changed since its sha256 was taken: not the toolkit {TOOLKIT}")
    nvcc = facts.get("nvcc")
    if not isinstance(nvcc, str) or nvcc not in tools:
        fail("toolkit.json names no nvcc among its tools")
    return nvcc


def prefix_maps() -> list[str]:
    text = os.environ.get(PREFIX_MAP_VARIABLE, "")
    maps = []
    for line in text.split(";"):
        line = line.strip()
        if not line:
            continue
        if not os.path.isabs(line) or any(c in line for c in "= \t\"'\\"):
            fail(f"{PREFIX_MAP_VARIABLE} holds {line!r}: absolute folders separated by ';', "
                 "no '=', quote or blank")
        maps.append(line.rstrip("/") or "/")
    # the longest folder first: a file under two of them is named by the deeper one
    return sorted(set(maps), key=len, reverse=True)


def mapped(path: str, maps: list[str]) -> str:
    full = os.path.abspath(path)
    for folder in maps:
        if full == folder or full.startswith(folder + "/"):
            return "." + full[len(folder):]
    return path


def sources(argv: list[str]) -> tuple[str, ...]:
    """The CUDA sources of a compile, or () when the call is not one this launcher changes."""
    if "-c" not in argv and "--compile" not in argv:
        return ()
    for flag in ("-E", "--preprocess", "-M", "-MM", "--generate-dependencies", "--keep",
                 "-keep", "--keep-dir", "-keep-dir", "--dryrun", "-dryrun"):
        if flag in argv:
            return ()
    return tuple(a for a in argv if not a.startswith("-") and a.endswith(CUDA_SUFFIXES))


def main(argv: list[str]) -> int:
    nvcc = toolkit()
    units = sources(argv)
    if len(units) != 1:  # not a compile of one CUDA unit: nvcc as it was asked
        return subprocess.call([nvcc, *argv])
    maps = prefix_maps()
    keep = tempfile.mkdtemp(prefix="oracle-build-nvcc-")
    try:
        added = [f"-Xcompiler=-ffile-prefix-map={folder}=." for folder in maps]
        added += ["--keep", "--keep-dir=" + keep,
                  "-Xcudafe", "--orig_src_path_name=" + mapped(units[0], maps)]
        return subprocess.call([nvcc, *argv, *added])
    finally:
        shutil.rmtree(keep, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
