"""Environment: what a build or an oracle run never inherits, what each adds, and which
variables records keep. The one place these lists live; inside/ scripts receive the recorded
prefixes in their request (they import nothing from the harness)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from oracle_build.core.log import say

# Never reaches the oracle's python: each would change what gets imported or built.
SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP",
            "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "VIRTUAL_ENV", "VLLM_USE_PRECOMPILED")
# A build also drops these: uv's own configuration (the pin says where wheels come from), a
# pretend version (setuptools-scm would stamp any version asked), every precompiled-kernel
# switch (every VLLM_*PRECOMPILED* variable), and git's environment (GIT_DIR would point
# setuptools-scm at another repository), and ccache's (the plan sets the compiler cache's
# settings: a caller's CCACHE_NODEPEND or CCACHE_SLOPPINESS would change what a hit means).
BUILD_DROPPED_PREFIXES = ("UV_", "SETUPTOOLS_SCM_PRETEND", "VLLM_USE_PRECOMPILED", "GIT_",
                          "CCACHE_")
# Recorded in goldens and logs: every variable that can change what vLLM computes.
RECORDED_PREFIXES = ("VLLM_", "CUDA", "TORCH", "TRITON_", "FLASHINFER_", "NCCL", "CUBLAS",
                     "OMP_", "KMP_", "MKL_", "PYTORCH_", "LD_", "HIP_", "ROCM_", "ATEN_",
                     "ONEDNN_", "DNNL_")
# Move CPU numerics below vLLM: torch's dispatch level, oneDNN's maximum ISA (both spellings),
# MKL's conditional numerical reproducibility and instruction cap. A caller's values never
# reach the oracle (scrubbed, and said); under a held kernel variant the tool sets them from
# the variant (oracle_build/devices/cpu.py), and the golden records them with the variant.
CPU_NUMERICS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR",
                "MKL_ENABLE_INSTRUCTIONS")
# Shown in a command's log when the environment it ran under differs from ours.
SHOWN_PREFIXES = ("VLLM_", "PYTHON", "CUDA", "TORCH", "CMAKE", "PIP_", "UV_", "GIT_")

# uv's default is to hard-link installed files to its cache: an edit to one venv's file
# would then change the cache and every venv installed from it (seen here: a patched
# sampler.py in one oracle appeared in the next build). An oracle owns copies.
UV = {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1",
      "UV_LINK_MODE": "copy"}
# Bytecode compiled at install is part of the oracle's identity: hash-based pycs (py_compile
# writes checked-hash pycs when SOURCE_DATE_EPOCH is set), whose bytes do not depend on when
# the files were unpacked, and which Python never rewrites while the source is unchanged.
BYTECODE = {"SOURCE_DATE_EPOCH": "315532800"}
# The oracle's processes never write bytecode into it: the venv stays as its manifest says.
ORACLE_RUN = {"PYTHONDONTWRITEBYTECODE": "1"}
# The dynamic loader's variables choose which shared libraries run (LD_LIBRARY_PATH put the
# system's libgomp in place of torch's own): never inherited; a pin's target env may set them.
LOADER_PREFIX = "LD_"
# git may only use transports that move data; never ext:: or fd:: (they run commands).
# Every git the tool runs: safe transports only, no prompt, neither the system's nor the
# user's configuration, no lazy fetch (git >= 2.45; older gits: source.check_mirror).
GIT = {"GIT_ALLOW_PROTOCOL": "file:https:http:ssh:git", "GIT_TERMINAL_PROMPT": "0",
       "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ADVICE": "0",
       "GIT_NO_LAZY_FETCH": "1"}


_told: set[str] = set()


# What of the caller's environment reaches a process of the oracle (probe, engine host,
# numerics, margin, explain, diff): what a process needs to run, and which device the
# machine's scheduler gave it. Nothing else: every variable that chooses code, libraries,
# caches or numerics is built (the pin's target env, the held kernel variant, the compile
# caches, a capture spec's [env]), never inherited (Nix's pure build environment, Bazel's
# --incompatible_strict_action_env). VLLM_LOGGING_CONFIG_PATH alone runs any callable
# (logging.config.dictConfig's "()" factory).
PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
          "NO_COLOR")
PASSED_PREFIXES = ("LC_",)
DEVICE_SELECTION = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                    "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
# the caller's variables a dropped note names (what the engine or a library it loads reads)
READ_BY_ENGINE = (*RECORDED_PREFIXES, "PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS_",
                  "TOKENIZERS_", "XDG_")


def passed(key: str) -> bool:
    """Whether the caller's ``key`` reaches a process of the oracle."""
    return key in PASSED or key in DEVICE_SELECTION or key.startswith(PASSED_PREFIXES)


def oracle_env(overlay: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process run by the oracle's python: the caller's PASSED
    variables, plus ORACLE_RUN, plus ``overlay`` (the pin's target env, the held variant,
    the caches, a spec's [env]). What the caller set that the engine would have read, and
    that is dropped, is said once per process of the tool."""
    overlay = overlay or {}
    loader = sorted(k for k in os.environ if k.startswith(LOADER_PREFIX))
    untold = [k for k in loader if k not in _told and k not in overlay]
    if untold:
        say(f"note: {', '.join(untold)} not passed to the oracle (the shared libraries it "
            "maps are part of its identity; a pin's target env may set them)")
        _told.update(untold)
    numerics = sorted(k for k in os.environ if k in CPU_NUMERICS)
    untold = [k for k in numerics if k not in _told]
    if untold:
        shown = ", ".join(f"{k}={as_shown(repr(os.environ[k]))}" for k in untold)
        say(f"note: {shown} not passed to the oracle (they move CPU numerics: the kernel "
            "variant the run holds sets them; a pin's kernel_variant or --kernel-variant "
            "chooses it)")
        _told.update(untold)
    rest = sorted(k for k in os.environ if not passed(k) and k not in _told
                  and k.startswith(READ_BY_ENGINE) and k not in ORACLE_RUN
                  and k not in loader and k not in numerics
                  and os.environ[k] != overlay.get(k))
    if rest:
        say(f"note: {', '.join(as_shown(k) for k in rest)} not passed to the oracle (its "
            "environment is built, not inherited: a variable the engine should see is "
            "configuration, set in the capture spec's [env], recorded in the golden and held "
            "to on verify; docs/build-and-identity.md#what-reaches-the-engine)")
        _told.update(rest)
    env = {k: v for k, v in os.environ.items() if passed(k) and k not in MADE}
    # made, never the caller's: inside a build the build's own (its probe's HOME is the
    # build's); else the system's folders (a compiler the engine runs is given by its
    # path: core/ never lets the caller's PATH choose one) and the HOME the caller of this
    # function makes (the compile cache's, a neutral folder)
    if _base is not None:
        env.update({"PATH": _base.path, "HOME": _base.home, "TMPDIR": _base.tmpdir})
    else:
        env["PATH"] = os.pathsep.join(SYSTEM_PATH)
        if os.environ.get("TMPDIR"):
            env["TMPDIR"] = os.environ["TMPDIR"]
        if "HOME" not in overlay:
            env["HOME"] = oracle_home()
    env.update(ORACLE_RUN)
    env.update({k: v for k, v in overlay.items() if not (_base is not None and k in MADE)})
    return env


# What an oracle process never takes from its caller: made (see oracle_env)
MADE = ("PATH", "HOME", "TMPDIR")


def oracle_home() -> str:
    """The HOME of an oracle process no caller gave one (an identity probe, a generator): a
    folder of this user's own in the temporary folder, empty of the caller's configuration
    (~/.config/vllm, ~/.cache/huggingface). An engine's is its compile cache's."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"oracle-build-home-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        from oracle_build.core.errors import PreflightFailed

        raise PreflightFailed(f"{path} is not a folder of this user's own",
                              hint=f"remove {path}")
    return str(path)


def as_shown(value: str) -> str:
    """A caller's name or value in a note: escaped (a newline cannot start a line)."""
    from oracle_build.core.errors import as_data

    return as_data(value, 200)


# What a capture spec's [env] may not set. A golden is someone else's file, and its spec
# is re-run by verify: it may not load code or libraries (a file, a folder, a module, a
# plugin), move a cache, or set what the tool itself sets (the held kernel variant, the
# engine's process layout, the tool's own variables).
SPEC_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
SPEC_ENV_WORDS = ("PATH", "DIR", "ROOT", "HOME", "FILE", "CONFIG", "PLUGIN", "CACHE",
                  "MODULE", "LIB", "PRELOAD", "SCRIPT", "HOOK", "CMD", "COMMAND", "EXEC",
                  "URL", "HOST", "PORT", "ENDPOINT", "PROXY", "TOKEN", "KEY", "SECRET")
TOOL_SET = ("VLLM_ENABLE_V1_MULTIPROCESSING",)


def spec_env_problems(env: object, where: str) -> list[tuple[str, str]]:
    """(field, problem) for a capture spec's [env] as read from a spec or a golden's spec
    (``where``: the field's prefix); a name that is not one is never echoed."""
    if not isinstance(env, dict) or len(env) > 64:
        return [(where, "is not a table of at most 64 settings")]
    out = []
    for name, value in env.items():
        problem = (spec_env_problem(name, value) if isinstance(value, str)
                   else "value is not a string")
        if problem is not None:
            shown = name if isinstance(name, str) and SPEC_ENV_NAME.match(name) else "<name>"
            out.append((f"{where}.{shown}", problem))
    return out


# A compiler, or flags for one: torch inductor compiles the engine's CPU kernels with CXX at
# run time (and Triton, nvcc and hipcc read their own), so a spec naming one would choose the
# compiler of the kernels the golden's numbers come from.
SPEC_COMPILER_VARS = frozenset({
    "CC", "CXX", "CPP", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDLIBS", "CUDAHOSTCXX",
    "CUDACXX", "HIPCXX", "FC", "FFLAGS", "AR", "AS", "LD", "NM", "RANLIB", "STRIP", "OBJCOPY"})
SPEC_COMPILER_PREFIXES = ("NVCC_", "HIPCC_", "CCACHE_", "DISTCC_", "SCCACHE_")


def spec_env_problem(name: str, value: str) -> str | None:
    """Why a capture spec may not set ``name`` to ``value`` (None: it may)."""
    if not SPEC_ENV_NAME.match(name):
        return "is not an environment variable name (A-Z, 0-9 and _, at most 64)"
    if name in SPEC_COMPILER_VARS or name.startswith(SPEC_COMPILER_PREFIXES):
        return ("names a compiler or its flags: torch inductor compiles the engine's kernels "
                "at run time, so a compiler of the spec's choosing would build them")
    if (name in SCRUBBED or name in CPU_NUMERICS or name in TOOL_SET or name in PASSED
            or name in DEVICE_SELECTION or name.startswith(("LD_", "PYTHON", "ORACLE_BUILD_"))):
        return ("is set by the tool, or never passed to the oracle (the held kernel variant, "
                "the loader, Python's start-up, the tool's own)")
    word = next((w for w in SPEC_ENV_WORDS if w in name), None)
    if word is not None:
        return (f"names a {word.lower()}: a spec may not point the engine at files, code, "
                "caches or the network (a pin's target env may, on its own host)")
    if len(value) > 256 or "/" in value or "\\" in value or any(
            ord(c) < 32 or ord(c) == 127 for c in value):
        return "value is not a plain setting (a path, a control character, or over 256)"
    return None


# What of the caller's environment reaches a process of a build (fetch, unpack, externals,
# patches, configure, compile, pip wheel, install, identity): what a process needs to run and
# to talk to a person (locale, terminal, who). Everything else of a build's environment is
# made: a PATH of the recorded toolchain's folders and the system's, a HOME and TMPDIR of the
# build's own (``BuildBase``), SOURCE_DATE_EPOCH, the tool's settings (the compiler cache,
# MAX_JOBS, the CMake arguments), the pin's and the target's build_env. Nix's pure build
# environment, Bazel's --incompatible_strict_action_env, pip's isolated build environment.
BUILD_PASSED = ("USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "NO_COLOR")
BUILD_PASSED_PREFIXES = ("LC_",)
# A command that downloads (pip download of the lock, a uv install from an index) also gets
# where the network is and what it trusts, and pip's own configuration (the caller's HOME:
# pip.conf, find-links): what it may fetch is fixed by the lock's sha256 or the pin's index,
# where it fetches it from is the host's business.
NETWORK_PASSED = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy",
                  "https_proxy", "no_proxy", "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR",
                  "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH",
                  "HOME")
NETWORK_PASSED_PREFIXES = ("PIP_",)
# The stripped environment of build_oracle --check's second build: the caller's BUILD_PASSED
# replaced by these, so that a build whose bytes follow the caller's locale or time zone is
# told apart from one that does not.
STRIPPED = {"LANG": "C.UTF-8", "TZ": "UTC", "USER": "oracle-build", "LOGNAME": "oracle-build"}
# The caller's parallel-jobs setting is the tool's to take (a count, checked): it changes how
# long, never what.
JOBS = "MAX_JOBS"
# The system's folders, last on every build's PATH (after the staging venv's and the recorded
# toolchain's): what a build's own scripts call by name (sh, uname, ld through the compiler).
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# The caller's variables a build's dropped note names, by name (what CMake, a compiler,
# ccache, pip, setuptools, vLLM's setup.py or torch's extension builder read); the rest are
# counted.
READ_BY_BUILD = ("CMAKE", "CC", "CXX", "CPP", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS",
                 "LDLIBS", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
                 "LIBRARY_PATH", "GCC_", "COMPILER_PATH", "LD_", "PIP_", "PYTHON", "UV_",
                 "GIT_", "CCACHE_", "VLLM_", "TORCH", "CUDA", "NVCC", "HIP", "ROCM", "NINJA",
                 "MAKEFLAGS", "MFLAGS", "SETUPTOOLS", "DISTUTILS", "CARGO", "RUST",
                 "PKG_CONFIG", "VIRTUAL_ENV", "CONDA", "MKL", "OMP_", "DNNL", "ONEDNN", "XDG_",
                 "FETCHCONTENT", "SOURCE_DATE_EPOCH", "TMPDIR", "HOME", "PATH")
# A value that looks like a secret by its name is recorded as set, not shown.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "APIKEY",
                "API_KEY", "PRIVATE")


def build_dropped(key: str) -> bool:
    return (key in SCRUBBED or key.startswith(BUILD_DROPPED_PREFIXES)
            or (key.startswith("VLLM_") and "PRECOMPILED" in key))


@dataclass(frozen=True)
class BuildBase:
    """What a build's every process starts from besides the allow-list: the PATH the plan
    made, the build's own HOME and TMPDIR, and whether the caller's BUILD_PASSED are
    replaced (``stripped``: build_oracle --check's second build)."""

    path: str
    home: str
    tmpdir: str
    stripped: bool = False
    # how the build's commands that do not download have their network closed
    # (core.proc.CLOSURES' key), None: open
    network: str | None = None
    # the build's own bin folder on PATH (``bin``): a link per program the recipe resolved
    # (name -> its path), made when the build starts
    links: tuple[tuple[str, str], ...] = ()
    bin: str | None = None

    def env(self, *, network: bool = False) -> dict[str, str]:
        env = (dict(STRIPPED) if self.stripped else
               {k: v for k, v in os.environ.items() if build_passed(k)})
        env.update({"PATH": self.path, "HOME": self.home, "TMPDIR": self.tmpdir,
                    **BYTECODE})
        jobs = jobs_setting()
        if jobs is not None:
            env[JOBS] = jobs
        if network:
            env.update({k: v for k, v in os.environ.items() if network_passed(k)})
        else:  # pip reads no configuration file at all, the system's included
            env.update(NO_TOOL_CONFIG)
        return env


# What a build command that does not download reads of a tool's own configuration: nothing.
# The build's HOME keeps the user's files away, and these the system's and the folder's
# (pip's /etc/pip.conf and /etc/xdg/pip/pip.conf: a host's `constraint` there would reach
# the wheel step). A download reads the caller's pip configuration on purpose (where the
# wheels are: find-links, an index, a CA bundle); what it may fetch is fixed by sha256.
NO_TOOL_CONFIG = {"PIP_CONFIG_FILE": os.devnull}


_base: BuildBase | None = None


@contextmanager
def building(base: BuildBase) -> Iterator[None]:
    """Every build command run inside starts from ``base`` (``build_env``)."""
    global _base
    before, _base = _base, base
    Path(base.home).mkdir(parents=True, exist_ok=True)
    Path(base.tmpdir).mkdir(parents=True, exist_ok=True)
    if base.bin is not None:
        own = Path(base.bin)
        own.mkdir(parents=True, exist_ok=True)
        for name, target in base.links:
            link = own / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
    try:
        yield
    finally:
        _base = before


def current_base() -> BuildBase | None:
    return _base


def build_passed(key: str) -> bool:
    return key in BUILD_PASSED or key.startswith(BUILD_PASSED_PREFIXES)


def network_passed(key: str) -> bool:
    return key in NETWORK_PASSED or (key.startswith(NETWORK_PASSED_PREFIXES)
                                     and not build_dropped(key))


def jobs_setting() -> str | None:
    """The caller's MAX_JOBS, when it is a count from 1 to 4096 (else refused, exit 2)."""
    from oracle_build.core.errors import BadInput

    value = os.environ.get(JOBS)
    if not value:
        return None
    if not re.fullmatch(r"[1-9][0-9]{0,3}", value) or int(value) > 4096:
        raise BadInput(f"${JOBS}", [("<value>", f"{as_shown(value)}: not a count of parallel "
                                     "jobs from 1 to 4096")], hint=f"unset {JOBS} or set it "
                       "to a count")
    return value


def build_env(*, network: bool = False) -> dict[str, str]:
    """The base environment of every build command; each command overlays its own. Inside a
    build (``building``): the allow-list and the build's made PATH, HOME and TMPDIR. Outside
    one (a version query while planning, `oracle-build externals`): the allow-list with the
    caller's PATH, HOME and TMPDIR."""
    if _base is not None:
        return _base.env(network=network)
    env = {k: v for k, v in os.environ.items()
           if build_passed(k) or k in ("PATH", "HOME", "TMPDIR")
           or (network and network_passed(k))}
    jobs = jobs_setting()
    if jobs is not None:
        env[JOBS] = jobs
    return env


def made_path(first: list[str], tools: list[str | None]) -> str:
    """A build's PATH: ``first`` (the staging venv's bin), the folders of the recorded
    tools (the compilers, ccache, git), then the system's; each folder once."""
    out: list[str] = []
    for folder in [*first, *(os.path.dirname(t) for t in tools if t), *SYSTEM_PATH]:
        if folder and folder not in out:
            out.append(folder)
    return os.pathsep.join(out)


def dropped_from_build() -> tuple[list[str], int]:
    """The caller's variables a build does not pass: those a build's tools read, by name
    (sorted), and how many others. PATH, HOME and TMPDIR are the build's own (made), a
    download's settings reach the downloads."""
    named, others = [], 0
    for key in sorted(os.environ):
        if build_passed(key) or key in ("PATH", "HOME", "TMPDIR") or network_passed(key):
            continue
        if key.startswith(READ_BY_BUILD):
            named.append(key)
        else:
            others += 1
    return named, others


def say_dropped_from_build() -> None:
    """Said once per process of the tool, naming what it has not named before."""
    named, others = dropped_from_build()
    untold = [k for k in named if ("build", k) not in _told_build]
    if not untold:
        return
    _told_build.update(("build", k) for k in untold)
    say(f"note: the build's environment is built, not inherited: "
        f"{', '.join(as_shown(k) for k in untold)}"
        + (f" and {others} other variables" if others else "")
        + " of the caller's not passed (docs/build-and-identity.md#what-reaches-a-build)")


_told_build: set[tuple[str, str]] = set()


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """An environment for a record: a value whose name looks like a secret's is "<set>"."""
    return {k: ("<set>" if any(w in k.upper() for w in SECRET_WORDS) else v)
            for k, v in sorted(env.items())}


def recorded(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_PREFIXES)}


def tool_variable(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """One of the tool's own variables (``ORACLE_BUILD_*``), or None when unset or empty.
    It comes from whoever set up the caller's environment: a value with a control character
    (a newline could print a line of its own, an escape rewrite the terminal) is refused,
    exit 2, named, and shown escaped."""
    from oracle_build.core.errors import BadInput, as_data

    value = (os.environ if environ is None else environ).get(name)
    if not value:
        return None
    if as_data(value, limit=len(value) * 10 + 1) != value:
        raise BadInput(f"${name}", [("<value>", f"{as_data(value, 200)}: holds a control "
                                     "character (a newline, an escape): refused")],
                       hint=f"unset {name} or set it to a plain value")
    return value
