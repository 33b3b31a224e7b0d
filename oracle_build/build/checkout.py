"""What a vLLM checkout says about building it, read from its own files (never guessed):

- the CMake externals a build of a given device and machine fetches: every
  ``FetchContent_Declare`` / ``FetchContent_Populate`` with a ``GIT_REPOSITORY``, its tag
  or commit resolved through ``set()`` (in the same file or in CMakeLists.txt, branch by
  branch), the ``*_SRC_DIR`` environment variable it honours instead, and which cmake file
  declares it. The files are walked as CMake runs them: ``include()`` is followed, ``if()``
  conditions are evaluated for the device and machine (what cannot be known before
  configure, such as a CPU feature, counts as possibly true), ``return()`` ends a file;
- the build requirements: pyproject.toml's ``[build-system] requires`` first (PEP 518),
  then the requirements file the tree has for the device;
- the precompiled-kernel switches vllm/envs.py and setup.py read;
- the Rust front end's toolchain (rust-toolchain.toml) and whether setup.py builds it;
- vllm/_version.py's commit id, where the tree has one (release sdists do).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from oracle_build import devices
from oracle_build.contracts.base import FULL_SHA
from oracle_build.core.errors import BadInput

Tri = bool | None  # three-valued: True, False, or not known before configure

# ----------------------------------------------------------------------------- cmake


@dataclass(frozen=True)
class Command:
    name: str  # lower case
    args: list[str]  # tokens; quoted ones keep their quotes
    file: Path
    line: int


def _strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        quoted = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                quoted = not quoted
            elif ch == "#" and not quoted:
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\(|\)|[^\s()"]+')
CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def commands(path: Path) -> list[Command]:
    """The command invocations of a cmake file, in order, with their argument tokens."""
    text = _strip_comments(path.read_text(errors="replace"))
    out: list[Command] = []
    pos = 0
    while True:
        m = CALL.search(text, pos)
        if m is None:
            return out
        depth, i, quoted = 1, m.end(), False
        while i < len(text) and depth:
            ch = text[i]
            if ch == '"' and text[i - 1] != "\\":
                quoted = not quoted
            elif not quoted and ch == "(":
                depth += 1
            elif not quoted and ch == ")":
                depth -= 1
            i += 1
        body = text[m.end():i - 1]
        out.append(Command(m.group(1).lower(), TOKEN.findall(body), path,
                           text.count("\n", 0, m.start()) + 1))
        pos = i


def _unquote(token: str) -> str:
    return token[1:-1] if len(token) >= 2 and token[0] == token[-1] == '"' else token


UNARY = {"DEFINED", "EXISTS", "IS_DIRECTORY", "IS_ABSOLUTE", "COMMAND", "TARGET", "POLICY"}
BINARY = {"STREQUAL", "MATCHES", "EQUAL", "LESS", "GREATER", "LESS_EQUAL", "GREATER_EQUAL",
          "VERSION_LESS", "VERSION_GREATER", "VERSION_EQUAL", "VERSION_LESS_EQUAL",
          "VERSION_GREATER_EQUAL", "STRLESS", "STRGREATER", "IN_LIST"}
TRUE_CONSTANTS = {"1", "ON", "YES", "TRUE", "Y"}
FALSE_CONSTANTS = {"0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND", ""}


class Scope:
    """Variables as CMake would hold them for one device and machine; a value of None is
    one that cannot be known before configure."""

    def __init__(self, known: dict[str, str | None]) -> None:
        self.vars: dict[str, str | None] = dict(known)

    def expand(self, text: str) -> str | None:
        if "$ENV{" in text:
            return None  # the caller's environment: not known here
        def one(m: re.Match[str]) -> str:
            value = self.vars.get(m.group(1))
            if value is None:
                raise KeyError(m.group(1))
            return value
        try:
            return re.sub(r"\$\{([A-Za-z0-9_]+)\}", one, _unquote(text))
        except KeyError:
            return None

    def value(self, token: str) -> str | None:
        """An operand: a quoted string expands; a bare word is a variable if one is known
        by that name, else itself (CMake's rule for if())."""
        if token.startswith('"'):
            return self.expand(token)
        if "${" in token:
            return self.expand(token)
        if token in self.vars:
            return self.vars[token]
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", token) and token not in TRUE_CONSTANTS | \
                FALSE_CONSTANTS:
            return None  # an unknown variable
        return token

    def truth(self, token: str) -> Tri:
        if token.upper() in TRUE_CONSTANTS or re.fullmatch(r"[1-9][0-9]*", token):
            return True
        if token.upper() in FALSE_CONSTANTS:
            return False
        value = self.value(token)
        if value is None:
            return None
        return value.upper() not in FALSE_CONSTANTS and not value.endswith("-NOTFOUND")

    def condition(self, tokens: list[str]) -> Tri:
        return _Cond(tokens, self).or_()


class _Cond:
    """CMake's if() grammar: parentheses, unary tests, binary tests, NOT, AND, OR."""

    def __init__(self, tokens: list[str], scope: Scope) -> None:
        self.t, self.i, self.scope = tokens, 0, scope

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self) -> str:
        self.i += 1
        return self.t[self.i - 1]

    def or_(self) -> Tri:
        left = self.and_()
        while self.peek() == "OR":
            self.take()
            right = self.and_()
            left = True if (left or right) else (None if None in (left, right) else False)
        return left

    def and_(self) -> Tri:
        left = self.not_()
        while self.peek() == "AND":
            self.take()
            right = self.not_()
            left = False if (left is False or right is False) else (
                None if None in (left, right) else True)
        return left

    def not_(self) -> Tri:
        if self.peek() == "NOT":
            self.take()
            inner = self.not_()
            return None if inner is None else not inner
        return self.test()

    def test(self) -> Tri:
        tok = self.peek()
        if tok is None:
            return None
        if tok == "(":
            self.take()
            inner = self.or_()
            if self.peek() == ")":
                self.take()
            return inner
        if tok in UNARY:
            self.take()
            operand = self.take() if self.peek() is not None else ""
            if tok == "DEFINED":
                name = operand[4:-1] if operand.startswith("ENV{") else operand
                if operand.startswith("ENV{"):
                    return None  # the caller's environment: not known here
                return True if self.scope.vars.get(name) is not None else (
                    None if name not in self.scope.vars else False)
            return None
        self.take()
        if self.peek() in BINARY:
            op = self.take()
            right = self.take() if self.peek() is not None else ""
            a, b = self.scope.value(tok), self.scope.value(right)
            if a is None or b is None:
                return None
            if op == "STREQUAL":
                return a == b
            if op == "MATCHES":
                return re.search(b, a) is not None
            return None
        return self.scope.truth(tok)


@dataclass
class Declared:
    name: str
    repository: str | None
    tag: str | None  # as written in GIT_TAG, resolved through set(); None if unresolved
    src_dir_var: str | None
    source: str  # file:line
    note: str = ""

    @property
    def is_commit(self) -> bool:
        return bool(self.tag and FULL_SHA.match(self.tag))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "is_commit": self.is_commit}


SRC_VAR = re.compile(r"ENV\{([A-Z0-9_]*(?:SRC_DIR|SOURCE_DIR[A-Z0-9_]*|ROOT_DIR))\}")


def _src_dir_var(lines: list[str], line: int) -> str | None:
    """The nearest *_SRC_DIR-like environment variable the file reads before ``line``."""
    for i in range(line - 1, max(-1, line - 60), -1):
        found = SRC_VAR.findall(lines[i])
        if found:
            return str(found[-1])
    return None


@dataclass
class _Frame:
    seen_true: Tri  # whether an earlier branch of this if() was taken
    current: Tri  # whether the branch being walked is taken


def scan_externals(checkout: Path, *, device: str = "cuda",
                   machine: str = "x86_64") -> list[Declared]:
    """Every external a build of ``device`` on ``machine`` fetches, in configure order."""
    checkout = checkout.resolve()
    top = checkout / "CMakeLists.txt"
    if not checkout.is_dir():
        raise BadInput(checkout, "not a folder: expected a vLLM checkout")
    if not top.is_file():
        return []  # no CMake build: nothing fetched at configure time
    scope = Scope({**devices.cmake_known(device, machine),
                   "CMAKE_SOURCE_DIR": str(checkout.resolve())})
    found: dict[str, Declared] = {}
    _walk(top.resolve(), checkout, scope, found, certain=True)
    return list(found.values())


def _walk(path: Path, checkout: Path, scope: Scope, found: dict[str, Declared], *,
          certain: bool, within: tuple[Path, ...] = ()) -> bool:
    """Walk one file; False when a return() certainly ended it. ``within``: the files whose
    include() led here (an include cycle is bad input, as CMake itself refuses it)."""
    if path in within:
        chain = " -> ".join(str(p.relative_to(checkout.resolve())) if checkout.resolve() in
                            p.parents else str(p) for p in (*within, path))
        raise BadInput(path, [("include", f"include cycle: {chain}")])
    within = (*within, path)
    lines = path.read_text(errors="replace").splitlines()
    stack: list[_Frame] = []
    scope.vars["CMAKE_CURRENT_LIST_DIR"] = str(path.parent)

    def active() -> Tri:
        state: Tri = True
        for f in stack:
            if f.current is False:
                return False
            if f.current is None:
                state = None
        return state

    defining = 0  # inside function()/macro() bodies: definitions, not run here
    for cmd in commands(path):
        if cmd.name in ("function", "macro"):
            defining += 1
            continue
        if cmd.name in ("endfunction", "endmacro"):
            defining -= 1
            continue
        if defining:
            continue
        if cmd.name == "if":
            taken = scope.condition(cmd.args) if active() is not False else False
            stack.append(_Frame(seen_true=taken, current=taken))
            continue
        if cmd.name in ("elseif", "else") and stack:
            frame = stack[-1]
            cond: Tri = scope.condition(cmd.args) if cmd.name == "elseif" else True
            if frame.seen_true is True:
                frame.current = False
            elif frame.seen_true is None:
                frame.current = None if cond is not False else False
            else:
                frame.current = cond
            if frame.current is True:
                frame.seen_true = True
            elif frame.current is None and frame.seen_true is False:
                frame.seen_true = None
            continue
        if cmd.name == "endif" and stack:
            stack.pop()
            continue
        state = active()
        if state is False:
            continue
        here_certain = certain and state is True
        if cmd.name == "set" and cmd.args:
            name = cmd.args[0]
            if "CACHE" in cmd.args and "FORCE" not in cmd.args and \
                    scope.vars.get(name) is not None:
                continue  # a cache default never overrides a value given on the command line
            values = [v for v in cmd.args[1:] if v not in ("CACHE", "PARENT_SCOPE")]
            value = scope.expand(values[0]) if values else ""
            if here_certain or name not in scope.vars:
                scope.vars[name] = value if (here_certain or value is not None) else None
            elif scope.vars.get(name) != value:
                scope.vars[name] = None  # set differently on branches we cannot decide
        elif cmd.name == "include" and cmd.args:
            target = scope.expand(cmd.args[0])
            if target is None:
                continue
            inc = Path(target) if Path(target).is_absolute() else checkout / target
            inc = inc.resolve()
            if inc.suffix == ".cmake" and inc.is_file() and checkout.resolve() in inc.parents:
                ended = not _walk(inc, checkout, scope, found, certain=here_certain,
                                  within=within)
                scope.vars["CMAKE_CURRENT_LIST_DIR"] = str(path.parent)
                if ended and state is True:
                    return False
        elif cmd.name == "return" and state is True:
            return False
        elif cmd.name in ("fetchcontent_declare", "fetchcontent_populate") and cmd.args:
            _declared(cmd, scope, lines, checkout, found)
    return True


def _declared(cmd: Command, scope: Scope, lines: list[str], checkout: Path,
              found: dict[str, Declared]) -> None:
    name = _unquote(cmd.args[0])
    keys: dict[str, str] = {}
    for i, tok in enumerate(cmd.args[1:-1], start=1):
        if tok in ("GIT_REPOSITORY", "GIT_TAG", "SOURCE_DIR", "URL"):
            keys[tok] = cmd.args[i + 1]
    src_var = _src_dir_var(lines, cmd.line)
    where = f"{cmd.file.relative_to(checkout)}:{cmd.line}"
    if "GIT_REPOSITORY" not in keys:
        if name in found and found[name].src_dir_var is None and src_var:
            found[name].src_dir_var = src_var
        return
    repo = scope.expand(keys["GIT_REPOSITORY"])
    tag = scope.expand(keys["GIT_TAG"]) if "GIT_TAG" in keys else None
    note = ""
    if tag is None and "GIT_TAG" in keys:
        note = f"GIT_TAG {keys['GIT_TAG']} could not be resolved from set() in the tree"
    previous = found.get(name)
    if previous is not None and (previous.repository, previous.tag) != (repo, tag):
        # declared differently on branches this scan cannot decide between (e.g. the host's
        # CPU features): keep both facts visible
        previous.note = (previous.note + "; " if previous.note else "") + \
            f"also {repo} @ {tag} at {where}"
        return
    found[name] = Declared(name, repo, tag, src_var, where, note)


# ----------------------------------------------------------------------------- the rest


@dataclass(frozen=True)
class BuildRequirements:
    pyproject: list[str]  # [build-system] requires
    file: list[str]  # the requirements file's lines, its -r includes followed
    sources: list[str]
    options: list[str]  # index options the file names

    @property
    def lines(self) -> list[str]:
        return [*self.pyproject, *self.file]


def build_requirements(checkout: Path, *, device: str,
                       preferred: str = "auto") -> BuildRequirements:
    """pyproject.toml's [build-system] requires first, then the ``preferred`` requirements
    file if the tree has it, else the one it has for the device, its ``-r`` includes
    followed and its index options kept."""
    sources = []
    pyproject_reqs: list[str] = []
    file_reqs: list[str] = []
    options: list[str] = []
    pyproject = checkout / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise BadInput(pyproject, [("<syntax>", f"not valid TOML: {exc}")]) from None
        requires = data.get("build-system", {}).get("requires")
        if isinstance(requires, list):
            pyproject_reqs = [str(r) for r in requires]
            sources.append("pyproject.toml [build-system] requires")
    layout = [f"requirements/build/{device}.txt", "requirements/build.txt"]
    for rel in ([preferred] if preferred != "auto" else []) + layout:
        if (checkout / rel).is_file():
            read = read_requirement_lines(checkout / rel)
            file_reqs, options = read.lines, read.options
            sources.append(rel)
            sources += [f"{inc.relative_to(checkout.resolve())} (-r from {rel})"
                        for inc in read.included]
            break
    if not sources:
        raise BadInput(checkout, [("pyproject.toml", "no [build-system] requires and no "
                                   "requirements/build file: cannot tell the build's needs")])
    return BuildRequirements(pyproject_reqs, file_reqs, sources, options)


# pip options a requirements file may carry that say where packages come from: kept (the
# build installs with them), never a reason to refuse the file
INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i", "--find-links", "-f")


@dataclass(frozen=True)
class ReadRequirements:
    lines: list[str]
    options: list[str]  # "--extra-index-url URL", in the order met
    included: list[Path]  # files reached through -r


def read_requirement_lines(path: Path, *, _stack: tuple[Path, ...] = ()) -> ReadRequirements:
    """A requirements file as pip reads it: comments dropped, ``-r FILE`` followed
    (relative to the file; a cycle is an error), index options kept; any other option
    line is refused, naming it."""
    path = path.resolve()
    if path in _stack:
        raise BadInput(path, [("-r", "includes itself (a cycle through "
                               + " -> ".join(p.name for p in _stack) + ")")])
    lines: list[str] = []
    options: list[str] = []
    included: list[Path] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            flag, _, value = line.replace("=", " ", 1).partition(" ")
            value = value.strip()
            if flag in ("-r", "--requirement") and value:
                target = (path.parent / value).resolve()
                if not target.is_file():
                    raise BadInput(path, [(line[:60], f"{target} not found")])
                inner = read_requirement_lines(target, _stack=(*_stack, path))
                lines += inner.lines
                options += [o for o in inner.options if o not in options]
                included += [target, *inner.included]
                continue
            if flag in INDEX_OPTIONS and value:
                long = {"-i": "--index-url", "-f": "--find-links"}.get(flag, flag)
                if f"{long} {value}" not in options:
                    options.append(f"{long} {value}")
                continue
            raise BadInput(path, [(line[:40], "option lines other than -r and index options "
                                   "are not followed")])
        lines.append(line)
    return ReadRequirements(lines, options, included)


@dataclass(frozen=True)
class Requirements:
    lines: list[str]  # torch dropped; one line per distinct requirement, first source wins
    torch: list[str]  # the tree's torch requirements, as written
    sources: list[str]
    options: list[str] = field(default_factory=list)  # index options the tree's files name


def split_torch(reqs: list[str], path: Path) -> Requirements:
    """Drop torch (the pin installs it) and keep each distribution's first requirement."""
    lines, torch, seen = [], [], set()
    for line in reqs:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise BadInput(path, [(line[:60], f"not a requirement: {exc}")]) from None
        key = canonicalize_name(req.name)
        if key == "torch":
            torch.append(line)
            continue
        if key in seen:
            continue
        seen.add(key)
        lines.append(line)
    return Requirements(lines, torch, [])


def torch_disagreement(torch_lines: list[str], pinned: str, *,
                       machine: str = "x86_64") -> str | None:
    """Why the tree's torch requirements refuse the pin's torch version (None: they agree)."""
    for line in torch_lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(
                {"platform_machine": machine, "platform_system": "Linux"}):
            continue
        if not req.specifier.contains(pinned, prereleases=True):
            return f"the tree requires {line!r}, the pin installs torch {pinned}"
    return None


SWITCH = re.compile(r"\b(VLLM_[A-Z0-9_]*PRECOMPILED[A-Z0-9_]*)\b")


def precompiled_switches(checkout: Path) -> list[str]:
    """Every VLLM_*PRECOMPILED* variable vllm/envs.py and setup.py read."""
    names: set[str] = set()
    for rel in ("vllm/envs.py", "setup.py"):
        path = checkout / rel
        if path.is_file():
            names.update(SWITCH.findall(path.read_text(errors="replace")))
    return sorted(names)


@dataclass(frozen=True)
class RustFacts:
    toolchain: str | None  # rust-toolchain.toml's channel
    setup_builds_it: bool  # setup.py passes rust_extensions (optional unless required)
    require_switch: str | None  # the variable that makes it mandatory


def rust_facts(checkout: Path) -> RustFacts:
    channel = None
    tc = checkout / "rust-toolchain.toml"
    if tc.is_file():
        channel = tomllib.loads(tc.read_text()).get("toolchain", {}).get("channel")
    setup = (checkout / "setup.py").read_text(errors="replace") if (
        checkout / "setup.py").is_file() else ""
    switch = re.search(r"\b(VLLM_REQUIRE_RUST_FRONTEND)\b", setup)
    return RustFacts(str(channel) if channel else None, "rust_extensions=" in setup,
                     switch.group(1) if switch else None)


COMMIT_ID = re.compile(r"__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"](g?[0-9a-f]+)['\"]")


def commit_id_in(version_py: str) -> str | None:
    """``__commit_id__`` as vllm/_version.py's text records it (``g<hex>``), or None."""
    m = COMMIT_ID.search(version_py)
    return m.group(1) if m else None


def version_commit_id(checkout_or_package: Path) -> str | None:
    """``__commit_id__`` from vllm/_version.py (``g<hex>``), where the file has one."""
    for path in (checkout_or_package / "vllm" / "_version.py",
                 checkout_or_package / "_version.py"):
        if path.is_file():
            found = commit_id_in(path.read_text(errors="replace"))
            if found:
                return found
    return None


@dataclass
class CheckoutFacts:
    externals: list[Declared]
    other_device_externals: dict[str, list[Declared]] = field(default_factory=dict)
    switches: list[str] = field(default_factory=list)
    requirements: Requirements | None = None
    rust: RustFacts | None = None
    commit_id: str | None = None


def read_checkout(checkout: Path, *, device: str, machine: str,
                  preferred_requirements: str = "auto") -> CheckoutFacts:
    facts = CheckoutFacts(scan_externals(checkout, device=device, machine=machine))
    for other in ("cuda", "cpu", "rocm"):
        if other != device:
            names = {d.name for d in facts.externals}
            facts.other_device_externals[other] = [
                d for d in scan_externals(checkout, device=other, machine=machine)
                if d.name not in names]
    facts.switches = precompiled_switches(checkout)
    found = build_requirements(checkout, device=device, preferred=preferred_requirements)
    split = split_torch(found.lines, checkout / "pyproject.toml")
    # The build runs without isolation: the device file's torch is the one its build uses
    # (vLLM 0.32.0's pyproject says torch == 2.13.0, its ROCm file torch==2.12.0+rocm7.14.0);
    # pyproject's decides only when the file names none.
    file_torch = split_torch(found.file, checkout / "pyproject.toml").torch
    facts.requirements = Requirements(split.lines, file_torch or split.torch, found.sources,
                                      found.options)
    facts.rust = rust_facts(checkout)
    facts.commit_id = version_commit_id(checkout)
    return facts


# Read from vLLM 0.32.0's vllm/envs.py and setup.py: the switches a plan removes when it has
# no checkout to read them from (a plan with --checkout lists the tree's own).
KNOWN_SWITCHES = ("VLLM_PRECOMPILED_WHEEL_COMMIT", "VLLM_PRECOMPILED_WHEEL_LOCATION",
                  "VLLM_PRECOMPILED_WHEEL_VARIANT", "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX",
                  "VLLM_USE_PRECOMPILED", "VLLM_USE_PRECOMPILED_RUST")


def pin_problems(facts: CheckoutFacts, externals: list[Any], rust_frontend: str | None,
                 torch_version: str | None, machine: str) -> list[str]:
    """Where a pin and a checkout disagree on what the build needs; each names both."""
    problems = []
    pinned = {e.name: e for e in externals}
    for dec in facts.externals:
        ext = pinned.get(dec.name)
        if ext is None:
            problems.append(
                f"the checkout's cmake declares external {dec.name} ({dec.repository} @ "
                f"{dec.tag}, {dec.source}, read from ${dec.src_dir_var or '?'}), which the "
                "pin does not list: CMake would fetch it, or with "
                "FETCHCONTENT_FULLY_DISCONNECTED fail deep in configure")
            continue
        if dec.is_commit and ext.established and ext.commit != dec.tag:
            problems.append(f"external {dec.name}: the checkout declares commit {dec.tag} "
                            f"({dec.source}), the pin says {ext.commit}")
        elif dec.tag and not dec.is_commit and ext.tag != dec.tag:
            problems.append(f"external {dec.name}: the checkout declares tag {dec.tag} "
                            f"({dec.source}), the pin says tag {ext.tag}")
        if dec.src_dir_var and ext.src_dir_var != dec.src_dir_var:
            problems.append(f"external {dec.name}: the checkout reads ${dec.src_dir_var}, "
                            f"the pin sets ${ext.src_dir_var}")
    declared = {d.name for d in facts.externals}
    for name in pinned:
        if name not in declared:
            problems.append(f"the pin lists external {name}, which this checkout's cmake "
                            "does not fetch for this target")
    if facts.rust is not None and facts.rust.setup_builds_it and rust_frontend is None:
        problems.append("setup.py builds an optional Rust front end (vllm/vllm-rs, toolchain "
                        f"{facts.rust.toolchain}) when cargo is present: the pin must say "
                        "[build] rust_frontend = \"build\" or \"skip\"")
    if facts.requirements is not None and torch_version is not None:
        why = torch_disagreement(facts.requirements.torch, torch_version, machine=machine)
        if why:
            problems.append(f"torch: {why}")
    return problems


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ExternalsBlock:
    toml: str  # a valid [[externals]] block for the pin
    missing: list[str]  # what is still unestablished, and why


def externals_block(checkout: Path, *, device: str, machine: str,
                    mirrors: Path | None = None) -> ExternalsBlock:
    """The pin's [[externals]] for a build of ``device`` on ``machine`` from this checkout:
    a commit stays a commit; a tag is resolved to its commit in ``mirrors/<name>`` (a local
    git mirror named as the external), or recorded as unestablished with the reason."""
    from oracle_build.build.source import git

    facts = read_checkout(checkout, device=device, machine=machine)
    lines = [f"# [[externals]] of {checkout} for a {device} build on {machine}, read from its "
             "cmake files by `oracle-build externals`"]
    for other, declared in facts.other_device_externals.items():
        if declared:
            lines.append(f"# not fetched by a {device} build (a {other} build fetches them): "
                         + ", ".join(f"{d.name} ({d.source})" for d in declared))
    missing = []
    for dec in facts.externals:
        lines += ["", "[[externals]]", f"name = {_toml_str(dec.name)}",
                  f"repository = {_toml_str(dec.repository or '')}",
                  f"src_dir_var = {_toml_str(dec.src_dir_var or '')}",
                  f"devices = [{_toml_str(device)}]"]
        if not dec.src_dir_var:
            missing.append(f"{dec.name}: no *_SRC_DIR variable found near {dec.source}")
        commit = None
        reason = ""
        if dec.tag is None:
            reason = dec.note or "its GIT_TAG could not be resolved"
        elif dec.is_commit:
            commit = dec.tag
        else:
            lines.append(f"tag = {_toml_str(dec.tag)}")
            mirror = mirrors / dec.name if mirrors else None
            if mirror is None:
                reason = (f"GIT_TAG is the tag {dec.tag}, not a commit: resolve it with "
                          "--externals MIRRORS (a git mirror of each external, named as here)")
            elif not mirror.exists():
                reason = f"tag {dec.tag}: no mirror at {mirror}"
            else:
                answer = git(["rev-parse", "--verify", "--quiet", f"{dec.tag}^{{commit}}"],
                             cwd=mirror, check=False, echo=False)
                if answer.returncode == 0 and FULL_SHA.match(answer.output.strip()):
                    commit = answer.output.strip()
                else:
                    reason = f"tag {dec.tag} is not in the mirror {mirror}"
        if commit is not None:
            lines.append(f"commit = {_toml_str(commit)}")
        else:
            lines.append(f"commit = {{ status = \"unestablished\", reason = {_toml_str(reason)} }}")
            missing.append(f"{dec.name}: {reason}")
        lines.append(f"source = {_toml_str(dec.source)}")
    return ExternalsBlock("\n".join(lines) + "\n", missing)
