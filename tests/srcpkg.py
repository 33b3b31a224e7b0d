"""A small package in a local git repository, built through the same plan as vLLM: its
version from setuptools-scm tags, a compiled C extension, a commit several past a tag. The
from-source tests build it, and the kill-at-every-step matrix kills its builds (every step
of a source build in seconds: a real venv, a real git repository, a real wheel)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import UNESTABLISHED_LOCK, git_pin_text

SETUP_PY = """
from setuptools import Extension, setup
setup(ext_modules=[Extension("vllm._C", ["csrc/ops.c"])])
"""
PYPROJECT = """
[build-system]
requires = ["setuptools>=77", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
dynamic = ["version"]

[tool.setuptools]
packages = ["vllm"]

[tool.setuptools_scm]
"""
OPS_C = """
#include <Python.h>
static PyObject *selftest(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"selftest", selftest, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
"""
INIT_PY = """
from importlib.metadata import version as _v
__version__ = _v("vllm")
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


@dataclass
class Repo:
    path: Path
    pinned: str  # 3 commits after tag v0.1.0; one more commit follows it
    version: str


def make_repo(path: Path) -> Repo:
    (path / "vllm").mkdir(parents=True)
    (path / "csrc").mkdir()
    (path / "requirements").mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    (path / "setup.py").write_text(SETUP_PY)
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / "csrc" / "ops.c").write_text(OPS_C)
    (path / "vllm" / "__init__.py").write_text(INIT_PY)
    (path / "requirements" / "build.txt").write_text(
        "# build deps, like vLLM's\nsetuptools>=77\nsetuptools-scm>=8\nwheel\ntorch==2.13.0\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "initial")
    git(path, "tag", "v0.1.0")
    for n in range(3):
        (path / f"change{n}.txt").write_text(str(n))
        git(path, "add", "-A")
        git(path, "commit", "-qm", f"change {n}")
    pinned = git(path, "rev-parse", "HEAD")
    (path / "later.txt").write_text("after the pin")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "after the pin")
    # setuptools-scm abbreviates the commit to 9 hex digits, as vLLM's +g555967922 does
    return Repo(path, pinned, f"0.1.1.dev3+g{pinned[:9]}")


def write_pin(tmp_path: Path, repo: Repo, *, commit: str | None = None,
              repository: str | None = None, version: str | None = None,
              lock: str = UNESTABLISHED_LOCK) -> Path:
    path = tmp_path / "srcpkg.toml"
    path.write_text(git_pin_text(repository or str(repo.path), commit or repo.pinned,
                                 version or repo.version, lock=lock))
    return path


# a real wheel from PyPI (10 KB) for the locked variant's lock; the CPU lock has the same line
LOCKED_WHEEL = ("mdurl==0.1.2 --hash=sha256:"
                "84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8")


def write_locked_pin(tmp_path: Path, repo: Repo) -> Path:
    """The small package's pin with an established lock (one real wheel, fetched from the
    index like any locked wheel), so that its oracle can be pushed to and pulled from a
    cache: the benchmarks' quick modes rebuild, push and recover it in seconds."""
    (tmp_path / "srcpkg.lock.txt").write_text(
        "# Hash-locked dependencies of pin 'srcpkg' (a test's)\n" + LOCKED_WHEEL + "\n")
    return write_pin(tmp_path, repo, lock='"srcpkg.lock.txt"')
