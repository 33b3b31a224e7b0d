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


# ----------------------------------------------------------------------------- an sdist

# The same package as a release archive built with CMake, the way vLLM 0.32.0's sdist is:
# its version from PKG-INFO (setuptools-scm, no git), vllm/_version.py recording the commit
# (and rewritten by the build, as vLLM's is), a CMake extension with one FetchContent external
# taken from FETCHCONTENT_SOURCE_DIR_TINYDEP, and a compiler floor no compiler meets (99.0),
# which the pin's patch lowers: the floor, the patch, the external by its git tree and the
# compiler cache, each in seconds.
ARCHIVE_SETUP_PY = """
import os, subprocess, sys
from pathlib import Path
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class cmake_build_ext(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve()
        build.mkdir(parents=True, exist_ok=True)
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        args = ["cmake", str(Path(__file__).parent.resolve()), "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
                f"-DOUT_DIR={out.parent}", f"-DOUT_NAME={out.name}",
                *os.environ.get("CMAKE_ARGS", "").split()]
        subprocess.check_call(args, cwd=build)
        subprocess.check_call(["cmake", "--build", "."], cwd=build)


setup(ext_modules=[CMakeExtension("vllm._C")], cmdclass={"build_ext": cmake_build_ext})
"""
# the git package's pyproject, with CMake and ninja to build with and vLLM's version_file
ARCHIVE_PYPROJECT = PYPROJECT.replace(
    '"setuptools-scm>=8"]', '"setuptools-scm>=8", "cmake>=3.26", "ninja"]').replace(
    "[tool.setuptools_scm]\n", '[tool.setuptools_scm]\nversion_file = "vllm/_version.py"\n')
# tinydep by FetchContent from the folder the build names, as vLLM's externals are
FETCH_TINYDEP = """include(FetchContent)
if (DEFINED ENV{FETCHCONTENT_SOURCE_DIR_TINYDEP})
    set(FETCHCONTENT_SOURCE_DIR_TINYDEP $ENV{FETCHCONTENT_SOURCE_DIR_TINYDEP})
endif()
FetchContent_Declare(
    tinydep
    GIT_REPOSITORY https://github.com/example/tinydep.git
    GIT_TAG v1.0)
FetchContent_MakeAvailable(tinydep)
"""
ARCHIVE_CMAKE = """
cmake_minimum_required(VERSION 3.26)
project(srcpkg C)

if (NOT (CMAKE_C_COMPILER_ID STREQUAL "GNU" AND
        CMAKE_C_COMPILER_VERSION VERSION_GREATER_EQUAL 99.0))
    message(FATAL_ERROR "srcpkg requires gcc >= 99.0")
endif()

""" + FETCH_TINYDEP + """
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
add_library(_C MODULE csrc/ops.c)
target_include_directories(_C PRIVATE ${Python_INCLUDE_DIRS} ${tinydep_SOURCE_DIR})
set_target_properties(_C PROPERTIES PREFIX "" SUFFIX "" OUTPUT_NAME "${OUT_NAME}"
                      LIBRARY_OUTPUT_DIRECTORY "${OUT_DIR}")
"""
ARCHIVE_OPS_C = OPS_C.replace("#include <Python.h>", '#include <Python.h>\n#include "tinydep.h"') \
    .replace("PyLong_FromLong(42)", "PyLong_FromLong(TINYDEP_VALUE)")
# the header names itself as torch's TORCH_CHECK does (__FILE__ in a header found through an
# absolute -I under the staging folder): only ccache's relative paths keep a home out of the
# bytes (its depend mode does not rewrite them: vLLM's bytes named the build folder)
TINYDEP_H = ("#define TINYDEP_VALUE 42\n"
             "static const char tinydep_where[] __attribute__((used)) = __FILE__;\n")
# the same package with the time of its compile in its bytes: reproducible all the same,
# because GCC takes __DATE__ and __TIME__ from SOURCE_DATE_EPOCH, which every build sets
STAMPED_OPS_C = ARCHIVE_OPS_C + (
    'const char srcpkg_built_at[] __attribute__((used)) = "built " __DATE__ " " __TIME__;\n')
# ... and made unreproducible, as many packages are: its build folder (an absolute path, in
# a define, which no compiler cache rewrites) in its bytes
BUILD_DIR_CMAKE = ('target_compile_definitions(_C PRIVATE '
                   '"SRCPKG_BUILT_IN=\\"${CMAKE_BINARY_DIR}\\"")\n')
BUILD_DIR_OPS_C = ARCHIVE_OPS_C + (
    'const char srcpkg_built_in[] __attribute__((used)) = "built in " SRCPKG_BUILT_IN;\n')


def floor_patch() -> str:
    """The patch that lowers the test package's compiler floor (99.0, which no compiler
    meets) to 4.0: a unified diff with a line of why, as the pin's patches are."""
    import difflib

    old = ARCHIVE_CMAKE.lstrip("\n")
    new = old.replace("99.0", "4.0")
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                "a/CMakeLists.txt", "b/CMakeLists.txt")
    return "Lower the test package's compiler floor to 4.0.\n\n" + "".join(diff)


ARCHIVE_VERSION = "0.2.0+srcpkg"  # no such vllm on any index: the install takes the built one
ARCHIVE_COMMIT = "5df63a7200" + "1" * 30  # a full commit; its sdist records 9 hex digits


@dataclass
class Sdist:
    archive: Path  # vllm-0.2.0.tar.gz
    sha256: str
    externals: Path  # a folder holding tinydep-1.0.tar.gz
    tinydep_commit: str
    tinydep_tree: str
    patch: Path
    patch_sha256: str


def _tar(folder: Path, out: Path) -> None:
    """A gzipped tar of ``folder`` under its own name (as an sdist or `git archive` is)."""
    import tarfile

    with tarfile.open(out, "w:gz") as tf:
        tf.add(folder, arcname=folder.name)


def make_sdist(root: Path, *, ops_c: str = ARCHIVE_OPS_C, cmake_extra: str = "",
               cmake: str | None = None, extra: dict[str, str] | None = None,
               init_extra: str = "") -> Sdist:
    """The package's release archive, its external's archive (and the external's commit and
    git tree, from a real git repository), and the patch that lowers its floor."""
    import hashlib

    root.mkdir(parents=True, exist_ok=True)
    dep = root / "tinydep-repo"
    dep.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(dep)], check=True)
    (dep / "tinydep.h").write_text(TINYDEP_H)
    (dep / "README").write_text("a one-header external\n")
    git(dep, "add", "-A")
    git(dep, "commit", "-qm", "tinydep 1.0")
    git(dep, "tag", "v1.0")
    commit = git(dep, "rev-parse", "HEAD")
    tree = git(dep, "rev-parse", "HEAD^{tree}")
    externals = root / "externals"
    externals.mkdir()
    subprocess.run(["git", "-C", str(dep), "archive", "--format=tar.gz",
                    "--prefix=tinydep-1.0/", "-o", str(externals / "tinydep-1.0.tar.gz"),
                    "v1.0"], check=True)
    top = root / "build" / f"vllm-{ARCHIVE_VERSION.split('+')[0]}"
    (top / "vllm").mkdir(parents=True)
    (top / "csrc").mkdir()
    (top / "setup.py").write_text(ARCHIVE_SETUP_PY)
    (top / "pyproject.toml").write_text(ARCHIVE_PYPROJECT)
    (top / "CMakeLists.txt").write_text((cmake or ARCHIVE_CMAKE).lstrip("\n") + cmake_extra)
    (top / "csrc" / "ops.c").write_text(ops_c)
    for rel, text in (extra or {}).items():
        (top / rel).write_text(text)
    (top / "vllm" / "__init__.py").write_text(INIT_PY + init_extra)
    (top / "vllm" / "_version.py").write_text(
        f"__version__ = version = '{ARCHIVE_VERSION}'\n"
        f"__commit_id__ = commit_id = 'g{ARCHIVE_COMMIT[:9]}'\n")
    (top / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: "
                                  f"{ARCHIVE_VERSION}\n")
    archive = root / f"vllm-{ARCHIVE_VERSION.split('+')[0]}.tar.gz"
    _tar(top, archive)
    patch = root / "pins" / "patches" / "floor.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text(floor_patch())
    return Sdist(archive, hashlib.sha256(archive.read_bytes()).hexdigest(), externals,
                 commit, tree, patch, hashlib.sha256(patch.read_bytes()).hexdigest())


def sdist_pin_text(s: Sdist, *, patches: str | None = None, tree: str | None = None,
                   lock: str = UNESTABLISHED_LOCK) -> str:
    """The archive pin (in ``s.patch``'s pins/ folder): the sdist by sha256, tinydep by its
    tree, the floor patch where the C compiler is below 99.0 (``patches``: other
    [[patches]] tables instead)."""
    if patches is None:
        patches = f"""
[[patches]]
file = "patches/floor.patch"
sha256 = "{s.patch_sha256}"
reason = "no compiler is 99.0: the test package's floor, lowered"
when = "cc < 99.0"
"""
    return f"""
schema = 1
id = "srcarchive"
python = "3.11"
lock = {lock}

[vllm]
kind = "archive"
url = "{s.archive.as_uri()}"
filename = "{s.archive.name}"
sha256 = "{s.sha256}"
commit_id = "{ARCHIVE_COMMIT[:9]}"
commit = "{ARCHIVE_COMMIT}"
runtime_version = "{ARCHIVE_VERSION}"
distribution = "vllm"

[build]
cmake_args = ["-DFETCHCONTENT_FULLY_DISCONNECTED=ON"]
build_requirements = "auto"
pip = "26.0.1"

[[externals]]
name = "tinydep"
repository = "https://github.com/example/tinydep.git"
src_dir_var = "FETCHCONTENT_SOURCE_DIR_TINYDEP"
tag = "v1.0"
commit = "{s.tinydep_commit}"
tree = "{tree or s.tinydep_tree}"
devices = ["cpu"]
{patches}
[targets.cpu]
device = "cpu"
machine = "x86_64"
kernel_check = "extension"
"""


def write_sdist_pin(s: Sdist, **kw: str) -> Path:
    path = s.patch.parent.parent / "srcarchive.toml"
    path.write_text(sdist_pin_text(s, **kw))
    return path


# ----------------------------------------------------------------------------- a CUDA sdist

# The same release archive with a CUDA unit in its extension, built the way vLLM's CUDA
# build is: nvcc (oracle-build's launcher in front of the lock's toolkit) through ccache,
# for the target's TORCH_CUDA_ARCH_LIST; the kernel has __FILE__ in device code and an
# anonymous namespace (nvcc's module id), what vLLM's units have. No GPU is needed to build
# it; the extension imports without one (the CUDA runtime is linked statically).
CUDA_CMAKE = """
cmake_minimum_required(VERSION 3.26)
project(srcpkg LANGUAGES C CUDA)

""" + FETCH_TINYDEP + """
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
# the target's arch list as vLLM's CMake takes TORCH_CUDA_ARCH_LIST ("12.1": sm_121 code)
string(REPLACE "." "" SRCPKG_ARCH "$ENV{TORCH_CUDA_ARCH_LIST}")
add_library(_C MODULE csrc/ops.c csrc/kernels.cu)
target_include_directories(_C PRIVATE ${Python_INCLUDE_DIRS} ${tinydep_SOURCE_DIR})
set_target_properties(_C PROPERTIES CUDA_ARCHITECTURES "${SRCPKG_ARCH}-real" PREFIX ""
                      SUFFIX "" OUTPUT_NAME "${OUT_NAME}" LIBRARY_OUTPUT_DIRECTORY "${OUT_DIR}")
"""
KERNELS_CU = """
#include <cstdio>
#include "tinydep.h"
namespace { __device__ int twice(int v) { return 2 * v; } }
__global__ void srcpkg_kernel(int *x) {
    if (!x) printf("%s\\n", __FILE__);
    x[threadIdx.x] = twice(TINYDEP_VALUE);
}
extern "C" int srcpkg_launch(int *x) { srcpkg_kernel<<<1, 1>>>(x); return 0; }
"""


def make_cuda_sdist(root: Path) -> Sdist:
    return make_sdist(root, cmake=CUDA_CMAKE, extra={"csrc/kernels.cu": KERNELS_CU})


def write_cuda_sdist_pin(s: Sdist, toolkit_lock: Path) -> Path:
    """The archive pin with one CUDA target (this host's machine, GB10's arch) whose
    toolkit is ``toolkit_lock`` (copied beside the pin), no patch, tinydep for every
    device."""
    text = sdist_pin_text(s, patches="")
    text = text.replace('devices = ["cpu"]\n', "")
    text = text[:text.index("[targets.cpu]")] + f"""[targets.sm_121]
device = "cuda"
machine = "{os.uname().machine}"
compute_capability = "12.1"
device_name = "GB10"
torch_cuda_arch_list = "12.1"
expected_sm = ["sm_121"]
toolkit = "toolkits/{toolkit_lock.name}"
kernel_check = "extension"
build_env = {{ VLLM_TARGET_DEVICE = "cuda" }}
"""
    pins = s.patch.parent.parent
    (pins / "toolkits").mkdir(exist_ok=True)
    (pins / "toolkits" / toolkit_lock.name).write_text(toolkit_lock.read_text())
    path = pins / "srccuda.toml"
    path.write_text(text.replace('id = "srcarchive"', 'id = "srccuda"'))
    return path
