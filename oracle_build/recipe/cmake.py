"""A small CMake interpreter for one question: which external sources (FetchContent) a
configure of vLLM for a device and machine fetches. The files are walked as CMake runs them:
``include()`` is followed, ``if()`` conditions are evaluated for the device and machine
(what cannot be known before configure, such as a CPU feature, counts as possibly true),
``return()`` ends a file; each ``FetchContent_Declare`` / ``FetchContent_Populate`` with a
``GIT_REPOSITORY`` gives its tag or commit resolved through ``set()``, the ``*_SRC_DIR``
environment variable it honours instead, and the file:line that declares it."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oracle_build import devices
from oracle_build.contracts.base import FULL_SHA
from oracle_build.core.errors import BadInput

Tri = bool | None  # three-valued: True, False, or not known before configure



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
    args: list[str] = field(default_factory=list)  # the condition of the branch walked


@dataclass(frozen=True)
class Floor:
    """A compiler version below which the tree's own CMake stops configure (an if() on
    CMAKE_<LANG>_COMPILER_VERSION around a message(FATAL_ERROR))."""

    lang: str  # "cxx" or "cc"
    version: str
    compiler_id: str | None  # the CMAKE_<LANG>_COMPILER_ID the same condition names
    source: str  # file:line of the FATAL_ERROR
    message: str


_VERSION_VAR = {"CMAKE_CXX_COMPILER_VERSION": "cxx", "CMAKE_C_COMPILER_VERSION": "cc"}


def _floor(frames: list[_Frame], cmd: Command, checkout: Path, scope: Scope) -> Floor | None:
    for frame in reversed(frames):
        args = [_unquote(a) for a in frame.args]
        for i, tok in enumerate(args[:-2]):
            lang = _VERSION_VAR.get(tok)
            op = args[i + 1]
            if lang is None or op not in ("VERSION_GREATER_EQUAL", "VERSION_LESS"):
                continue
            negated = "NOT" in args[:i]
            if (op == "VERSION_GREATER_EQUAL") != negated:
                continue  # not a floor: the error is for versions at or above it
            version = scope.expand(args[i + 2]) or args[i + 2]
            if not re.fullmatch(r"\d+(\.\d+)*", version):
                continue
            cid = None
            id_var = "CMAKE_CXX_COMPILER_ID" if lang == "cxx" else "CMAKE_C_COMPILER_ID"
            if id_var in args:
                j = args.index(id_var)
                if j + 2 < len(args) and args[j + 1] == "STREQUAL":
                    cid = args[j + 2]
            text = " ".join(_unquote(a) for a in cmd.args[1:])
            return Floor(lang, version, cid, f"{cmd.file.relative_to(checkout)}:{cmd.line}",
                         text)
    return None


@dataclass
class Scan:
    externals: list[Declared]
    floors: list[Floor]


def scan_externals(checkout: Path, *, device: str,
                   machine: str = "x86_64") -> list[Declared]:
    """Every external a build of ``device`` on ``machine`` fetches, in configure order."""
    return scan(checkout, device=device, machine=machine).externals


def scan(checkout: Path, *, device: str, machine: str = "x86_64") -> Scan:
    """What a configure of ``device`` on ``machine`` fetches, and the compiler floors it
    stops below."""
    checkout = checkout.resolve()
    top = checkout / "CMakeLists.txt"
    if not checkout.is_dir():
        raise BadInput(checkout, "not a folder: expected a vLLM checkout")
    if not top.is_file():
        return Scan([], [])  # no CMake build: nothing fetched at configure time
    scope = Scope({**devices.cmake_known(device, machine),
                   "CMAKE_SOURCE_DIR": str(checkout.resolve())})
    found: dict[str, Declared] = {}
    floors: list[Floor] = []
    _walk(top.resolve(), checkout, scope, found, certain=True, floors=floors)
    return Scan(list(found.values()), floors)


def _walk(path: Path, checkout: Path, scope: Scope, found: dict[str, Declared], *,
          certain: bool, within: tuple[Path, ...] = (),
          floors: list[Floor] | None = None) -> bool:
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
            stack.append(_Frame(seen_true=taken, current=taken, args=list(cmd.args)))
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
            frame.args = list(cmd.args) if cmd.name == "elseif" else []
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
                                  within=within, floors=floors)
                scope.vars["CMAKE_CURRENT_LIST_DIR"] = str(path.parent)
                if ended and state is True:
                    return False
        elif cmd.name == "return" and state is True:
            return False
        elif cmd.name in ("fetchcontent_declare", "fetchcontent_populate") and cmd.args:
            _declared(cmd, scope, lines, checkout, found)
        elif (cmd.name == "message" and cmd.args and cmd.args[0] == "FATAL_ERROR"
              and floors is not None):
            floor = _floor(stack, cmd, checkout, scope)
            if floor is not None and floor not in floors:
                floors.append(floor)
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
