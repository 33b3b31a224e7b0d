"""The vLLM source at a pinned commit: clone (never shallow) from the pin's URL, a
local mirror or a git bundle; check out the commit; assert HEAD, full history,
tags and a clean tree. Nothing here modifies a checkout the user owns."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oracle_build import proc
from oracle_build.errors import BuildFailed, SourceError
from oracle_build.pins import check_git_url

# git may only use transports that move data; never ext:: or fd:: (they run commands).
GIT_ENV = {
    "GIT_ALLOW_PROTOCOL": "file:https:http:ssh:git",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ADVICE": "0",
}
GIT_SAFE = ["-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never",
            "-c", "advice.detachedHead=false", "-c", "core.hooksPath=/dev/null"]


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV)
    return env


def git(args: list[str], *, cwd: Path | None = None, log: Path | None = None,
        check: bool = True, echo: bool = True) -> proc.Result:
    return proc.run(["git", *GIT_SAFE, *args], cwd=cwd, log=log, env=git_env(), capture=True,
                    check=check, echo=echo, what="git " + args[0])


@dataclass(frozen=True)
class SourceFacts:
    origin: str
    commit: str
    describe: str
    shallow: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_origin(origin: str) -> str:
    """A mirror may be a local path (folder or .bundle file) or a safe URL."""
    try:
        check_git_url(origin if not Path(origin).exists() else str(Path(origin).resolve()))
    except ValueError as exc:
        raise SourceError(f"refusing source {origin!r}: {exc}") from None
    return str(Path(origin).resolve()) if Path(origin).exists() else origin


def verify_checkout(path: Path, commit: str, *, log: Path | None = None) -> SourceFacts:
    """HEAD is the commit, history is full, tags are present, the tree is clean."""
    shallow = git(["rev-parse", "--is-shallow-repository"], cwd=path, log=log,
                  echo=False).output.strip()
    if shallow == "true":
        raise SourceError(
            f"{path} is a shallow clone: setuptools-scm would compute a wrong version "
            "(0.1.devN+g<sha>) from it",
            hint="use a full clone (or --filter=blob:none) with tags as the mirror",
        )
    head = git(["rev-parse", "HEAD"], cwd=path, log=log, echo=False).output.strip()
    if head != commit:
        raise SourceError(f"{path}: HEAD is {head}, the pin says {commit}")
    status = git(["status", "--porcelain", "--untracked-files=all"], cwd=path, log=log,
                 echo=False).output
    if status.strip():
        lines = status.strip().splitlines()
        raise SourceError(
            f"{path}: the tree is dirty ({len(lines)} changed or untracked paths, e.g. "
            f"{lines[0].strip()}); a dirty tree builds a version ending in .dYYYYMMDD that "
            "is not the pin's",
            hint="build from a clean checkout; run tree-modifying steps such as "
            "use_existing_torch.py on a copy",
        )
    described = git(["describe", "--tags", "--long"], cwd=path, log=log, check=False,
                    echo=False)
    if described.returncode != 0:
        raise SourceError(
            f"{path}: no tag reachable from {commit[:12]}; setuptools-scm would give 0.1.devN",
            hint="fetch tags into the mirror (git fetch --tags)",
        )
    return SourceFacts(origin=str(path), commit=head, describe=described.output.strip(),
                       shallow=False)


def clone_at(origin: str, dest: Path, commit: str, *, log: Path | None = None) -> SourceFacts:
    """Clone ``origin`` into ``dest`` and check out ``commit``, verified."""
    origin = check_origin(origin)
    if dest.exists():
        raise BuildFailed(f"{dest} already exists; refusing to clone over it")
    is_remote = "://" in origin and not origin.startswith("file://")
    args = ["clone", "--no-checkout"]
    if is_remote:
        args.append("--filter=blob:none")  # full history, blobs on demand; never --depth
    git([*args, "--", origin, str(dest)], log=log)
    if git(["rev-parse", "--is-shallow-repository"], cwd=dest, log=log,
           echo=False).output.strip() == "true":
        raise SourceError(
            f"the source {origin} is a shallow repository, so its clone is shallow too; "
            "setuptools-scm needs the full history to compute the pinned version",
            hint="mirror with `git clone --mirror` (or --filter=blob:none), not --depth",
        )
    git(["fetch", "--tags", "--force", "origin"], cwd=dest, log=log)
    found = git(["cat-file", "-t", commit], cwd=dest, log=log, check=False, echo=False)
    if found.returncode != 0 or found.output.strip() != "commit":
        raise SourceError(f"commit {commit} is not in {origin}",
                          hint="is the mirror up to date? `git fetch` it, or name another")
    git(["checkout", "--detach", commit], cwd=dest, log=log)
    facts = verify_checkout(dest, commit, log=log)
    return SourceFacts(origin=origin, commit=facts.commit, describe=facts.describe, shallow=False)


def read_requirements(path: Path, *, drop: tuple[str, ...] = ("torch",)) -> list[str]:
    """Requirement lines of a requirements file, minus the dropped packages (the pin
    installs torch itself). Read-only: the checkout is never rewritten."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            raise SourceError(f"{path}: option lines ({line!r}) are not followed")
        name = re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]
        if name.lower() in drop:
            continue
        out.append(line)
    return out


FETCH_DECL = re.compile(r"FetchContent_Declare\s*\((.*?)\)", re.S)


def scan_externals(checkout: Path) -> list[dict[str, str]]:
    """FetchContent externals declared by vLLM's cmake files: name, repository, GIT_TAG and
    the file that declares them. Used to fill and to cross-check a pin's [[externals]]."""
    found = []
    files = [checkout / "CMakeLists.txt", *sorted((checkout / "cmake").rglob("*.cmake"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for m in FETCH_DECL.finditer(text):
            body = m.group(1).split()
            if not body:
                continue
            fields = {}
            for key in ("GIT_REPOSITORY", "GIT_TAG"):
                if key in body:
                    idx = body.index(key)
                    if idx + 1 < len(body):
                        fields[key] = body[idx + 1]
            if "GIT_TAG" not in fields:
                continue
            line = text.count("\n", 0, m.start()) + 1
            found.append({"name": body[0], "repository": fields.get("GIT_REPOSITORY", ""),
                          "commit": fields["GIT_TAG"],
                          "source": f"{path.relative_to(checkout)}:{line}"})
    return found
