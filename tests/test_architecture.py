"""docs/architecture.md names every module of the package (issue 33 item 6, in part): a
module added without saying there what it holds fails here."""

from __future__ import annotations

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
