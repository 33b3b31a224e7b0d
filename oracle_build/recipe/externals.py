"""`oracle-build externals --checkout DIR`: the pin's ``[[externals]]`` block written from a
checkout's cmake files, tags resolved to commits in local mirrors (git), what is still
unestablished said with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oracle_build.contracts.base import FULL_SHA
from oracle_build.recipe.checkout import read_checkout


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
    from oracle_build.recipe.source import git

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
                  f"devices = [{_toml_str(device)}]",
                  f"machines = [{_toml_str(machine)}]"]
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
            elif (refused := _refused_mirror(mirror)) is not None:
                reason = refused
            else:
                answer = git(["rev-parse", "--verify", "--quiet", f"{dec.tag}^{{commit}}"],
                             cwd=mirror, check=False, echo=False)
                if answer.returncode == 0 and FULL_SHA.match(answer.output.strip()):
                    commit = answer.output.strip()
                else:
                    reason = f"tag {dec.tag} is not in the mirror {mirror}"
        if commit is not None:
            lines.append(f"commit = {_toml_str(commit)}")
            mirror = mirrors / dec.name if mirrors else None
            if mirror is not None and mirror.exists() and _refused_mirror(mirror) is None:
                # the files it names, by content
                tree = git(["rev-parse", "--verify", "--quiet", f"{commit}^{{tree}}"],
                           cwd=mirror, check=False, echo=False)
                if tree.returncode == 0 and FULL_SHA.match(tree.output.strip()):
                    lines.append(f"tree = {_toml_str(tree.output.strip())}")
        else:
            lines.append(f"commit = {{ status = \"unestablished\", reason = {_toml_str(reason)} }}")
            missing.append(f"{dec.name}: {reason}")
        lines.append(f"source = {_toml_str(dec.source)}")
    return ExternalsBlock("\n".join(lines) + "\n", missing)


def _refused_mirror(mirror: Path) -> str | None:
    """Why ``mirror`` is not read (its git config would have git act: source.check_mirror),
    or None."""
    from oracle_build.core.errors import SourceError
    from oracle_build.recipe.source import check_mirror

    try:
        check_mirror(mirror)
    except SourceError as exc:
        return exc.message
    return None
