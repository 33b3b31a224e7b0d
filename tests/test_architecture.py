"""The house (issue 33): docs/architecture.md names every module of the package and its
layers, imports run one way, services stay apart from the command line, no decision is taken
on a message's text, a verdict's words are chosen in one place, and the HTML page escapes
by default and draws its cells in one place."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def test_every_module_is_named_in_the_architecture_page() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    package = REPO / "oracle_build"
    modules = sorted(p.relative_to(package) for p in package.rglob("*.py"))
    assert len(modules) > 80
    missing = [str(m) for m in modules if m.name not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    # the packages, each with its folder line
    folders = sorted({str(m.parent) for m in modules if str(m.parent) != "."})
    assert [f for f in folders if f"{f}/" not in page] == []


# ----------------------------------------------------------------------------- the house


PACKAGE = REPO / "oracle_build"


def _modules(folder: str) -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted((PACKAGE / folder).glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_services_import_no_command_and_commands_no_other_command() -> None:
    """A service never reaches up into the command line; a command module is its own
    arguments, one service call and its printing (common.py and cacheopts.py are the
    argument pieces they share)."""
    shared = {"common", "cacheopts", "__init__"}
    for name, tree in _modules("services").items():
        assert not [m for m in _imports(tree) if m.startswith("oracle_build.commands")], name
    for name, tree in _modules("commands").items():
        if name in shared:
            continue
        others = {m.split(".")[2] for m in _imports(tree)
                  if m.startswith("oracle_build.commands.")} - shared
        assert not others, (name, others)
        defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        assert "register" in defs, name
        extra = [d for d in defs if d != "register" and not d.startswith(("run_", "_"))]
        assert not extra, f"commands/{name}.py holds {extra}: a service's or a report's work"


def decides_on_text(tree: ast.Module) -> list[int]:
    """Lines that decide on a message's or a verdict's text: ``"x" in exc.message``,
    ``v.why.startswith(...)``, ``"x" in str(exc)``."""
    texts = ("message", "why", "msg")

    def is_text(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in texts) or (
            isinstance(node, ast.Name) and node.id in texts)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(o, ast.In | ast.NotIn)
                                                 for o in node.ops):
            for side in node.comparators:
                if is_text(side) or (
                        isinstance(side, ast.Call) and isinstance(side.func, ast.Name)
                        and side.func.id == "str" and side.args
                        and isinstance(side.args[0], ast.Name)
                        and side.args[0].id in ("exc", "e", "err", "error")):
                    found.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and is_text(node.func.value):
            found.append(node.lineno)
    return found


# Where only a message says it: tomllib gives an error's position in its text alone before
# Python 3.14 (core/files.py reads it from there to name the line of a bad TOML file).
TEXT_ONLY = {"core/files.py:load_toml"}


def test_no_decision_is_taken_on_a_messages_text() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "inside":
            continue
        tree = ast.parse(path.read_text())
        allowed = {line for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                   and f"{path.relative_to(PACKAGE)}:{fn.name}" in TEXT_ONLY
                   for line in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)}
        for line in decides_on_text(tree):
            if line not in allowed:
                offenders.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert not offenders, offenders
    # the check sees each spelling issue 33 found
    for old in ('if "does not trust" not in exc.message:\n    raise\n',
                'if not (opts.allow_untrusted and "does not trust" in exc.message):\n    pass\n',
                'if why.startswith(OTHER_VARIANT):\n    pass\n',
                'if v.why.startswith("captured under"):\n    pass\n',
                'if "full log" not in exc.message:\n    pass\n'):
        assert decides_on_text(ast.parse(old)), old


VERDICT_WORDS = {"ORACLE DIFFERS", "ORACLE MISMATCH", "CONFIGURATION DIFFERENCE", "PASS",
                 "FAIL", "not judged", "NOT VERIFIABLE HERE"}


def test_a_verdicts_words_are_chosen_in_one_place() -> None:
    """report/words.py alone turns a verdict into its words (a word as a value of its own,
    as report.py once chose them three times over); every format asks it. A sentence that
    mentions a word (a --help text) is not a choice of it."""
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if str(rel) == "report/words.py" or rel.parts[0] == "inside":
            continue
        spelled += [f"{rel}:{n.lineno}: {n.value}" for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, ast.Constant) and n.value in VERDICT_WORDS]
    assert not spelled, spelled
    for fmt in ("text.py", "ci.py", "page.py"):
        assert "verdict_words" in (PACKAGE / "report" / fmt).read_text(), fmt


def test_the_page_has_one_renderer_of_a_cell_and_escapes_by_default() -> None:
    """The page's template is rendered with autoescape on, and draws no cell: the shade and
    the visible spaces of a token are the page's script's alone."""
    from oracle_build.contracts.page import PAGE_SCHEMA, Page, PageGolden, PagePrompt
    from oracle_build.report import html

    assert html._template().environment.autoescape is True
    python_side = (PACKAGE / "report" / "html.py").read_text() + (
        PACKAGE / "report" / "templates" / "page.html.j2").read_text()
    script = (PACKAGE / "report" / "templates" / "page.js").read_text()
    assert "hsl(" not in python_side and "hsl(" in script
    assert "\\u00b7" not in python_side and "\\u00b7" in script
    hostile = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    prompt = PagePrompt(id=hostile, text=hostile, prompt_ids=[1], reference=[5, 6],
                        candidate=[5, 7], margins=[0.1, 0.2], fork=1, kind="real",
                        topk=[[(5, -0.1)], [(6, -0.2)]])
    page = Page(page_schema=PAGE_SCHEMA, kind="verify", title=hostile, created_utc=hostile,
                oracle={"pin": hostile}, reference_label=hostile, candidate_label=hostile,
                goldens=[PageGolden(name=hostile, path=hostile, status="drift",
                                    words={"identity": hostile}, why=hostile,
                                    prompts=[prompt])], pieces={"5": hostile})
    text = html.render(page)
    assert "<img" not in text and "<script>alert" not in text
    assert text.count("<script") == 2  # the data block and the page's own script
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in text


# The layers of docs/architecture.md, from the base up: a module imports only from its own
# layer or below (an import under TYPE_CHECKING is a type, not a dependency).
LAYERS = [
    ("", "core"), ("contracts",), ("devices",), ("host",),
    ("oracle.venv", "oracle.inventory", "oracle.elf", "oracle.identity"),
    ("engine.host", "engine.caches", "engine.compiler"),
    ("oracle.opening",),
    ("engine.session", "engine.runs", "checkpoints", "recipe", "cache", "judge", "goldens"),
    ("report",), ("services",), ("commands", "interop"), ("cli", "__main__"),
]


def layer(module: str) -> int:
    name = module.removeprefix("oracle_build").removeprefix(".")
    found = [(len(p), rank) for rank, prefixes in enumerate(LAYERS) for p in prefixes
             if name == p or (p and name.startswith(p + "."))]
    assert found, f"{module} is in no layer of docs/architecture.md"
    return max(found)[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every harness module ``path`` imports at run time."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("oracle_build"):
            folder = REPO.joinpath(*str(node.module).split("."))
            subs = [f"{node.module}.{a.name}" for a in node.names
                    if (folder / f"{a.name}.py").exists() or (folder / a.name).is_dir()]
            out += [(node.lineno, m) for m in subs or [str(node.module)]]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names
                    if a.name.startswith("oracle_build")]
    return out


def test_imports_run_one_way() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        me = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if ".inside" in me:
            assert not imports_of(path), f"{me} runs in the oracle venv: no harness import"
            continue
        upward += [f"{me}:{line} imports {m}" for line, m in imports_of(path)
                   if layer(m) > layer(me)]
    assert not upward, upward
    # the check is real: a contract importing a service is caught
    assert layer("oracle_build.services.verify") > layer("oracle_build.contracts.golden")


def all_imports_of(path: Path) -> set[str]:
    """Every harness module ``path`` imports: at the top, inside a function, or under
    TYPE_CHECKING alike (a reader follows each of them; a deferred import only hides a
    circle from Python)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and \
                (node.module or "").startswith("oracle_build"):
            folder = REPO.joinpath(*str(node.module).split("."))
            subs = [f"{node.module}.{a.name}" for a in node.names
                    if (folder / f"{a.name}.py").exists() or (folder / a.name).is_dir()]
            out.update(subs or [str(node.module)])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("oracle_build"))
    return out


def module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        me = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[me] = {m for m in all_imports_of(path) if m != me}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_no_import_cycle_even_deferred() -> None:
    """No circle of imports, counting those under TYPE_CHECKING and inside functions
    (issue 43 item 8: devices, recipe, oracle and host once made a circle of twelve files,
    hidden from Python by deferred imports). A device describes (facts, flags, checks); the
    recipe plans with them; host asks the devices what they find."""
    found = cycles(module_graph())
    assert not found, found
    # the check is real: a deferred import back up the layers is a cycle
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
