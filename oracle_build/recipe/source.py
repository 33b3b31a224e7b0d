"""The vLLM source at a pinned commit: clone (never shallow) from the pin's URL, a
local mirror or a git bundle; check out the commit; assert HEAD, full history,
tags and a clean tree. Nothing here modifies a checkout the user owns."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oracle_build.contracts.pins import check_git_url
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import BuildFailed, SourceError, as_data
from oracle_build.core.proc import Cmd

GIT_SAFE = ["-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never",
            "-c", "advice.detachedHead=false", "-c", "core.hooksPath=/dev/null",
            "-c", "core.fsmonitor=false"]

# What a local mirror's own git configuration may hold: a plain clone's settings (a
# partial clone's promisor remote included: its URL is held to GIT_ALLOW_PROTOCOL's
# transports). Anything else is refused before git runs there: a remote's `uploadpack`
# command runs on a lazy fetch, which GIT_NO_LAZY_FETCH stops only from git 2.45 on (Debian
# 12 has 2.39); a `core.fsmonitor`, `core.sshCommand`, a filter's or a diff driver's
# command, an include.
MIRROR_KEYS = re.compile(
    r"^(core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|"
    r"precomposeunicode|symlinks)"
    r"|remote\.[^\n]+\.(url|fetch|mirror|tagopt|promisor|partialclonefilter)"
    r"|branch\.[^\n]+\.(remote|merge)"
    r"|extensions\.(objectformat|partialclone)|gc\.[a-z]+|init\.defaultbranch"
    r"|uploadpack\.allow[a-z0-9]+"
    r"|user\.(name|email))$")


def git_cmd(args: list[str], *, cwd: Path | None = None, when: str | None = None,
            network: bool = False) -> Cmd:
    """A git command: safe transports only, no hooks, no system config, no prompt.
    ``network``: it talks to a remote origin (the pin's URL or a --mirror URL): the network
    open for it, and lazy fetch allowed, from that origin only (a blob-less clone's checkout
    fetches its blobs); a local mirror's never."""
    env = {**envmod.GIT, "GIT_NO_LAZY_FETCH": "0"} if network else dict(envmod.GIT)
    return Cmd(["git", *GIT_SAFE, *args], env=env, cwd=str(cwd) if cwd else None,
               what="git " + args[0], when=when, network=network)


def git(args: list[str], *, cwd: Path | None = None, log: Path | None = None,
        check: bool = True, echo: bool = True) -> proc.Result:
    return proc.run_cmd(git_cmd(args, cwd=cwd), log=log, capture=True, check=check, echo=echo)


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


def check_mirror(folder: Path) -> None:
    """A local git mirror (bare, or a work tree's ``.git``) whose configuration holds only a
    plain clone's settings (MIRROR_KEYS); otherwise SourceError naming the keys, before any
    git runs there. The file is read by ``git config --file`` (no include is followed, no
    command runs)."""
    gitdir = folder if (folder / "objects").is_dir() and (folder / "HEAD").is_file() \
        else folder / ".git"
    config = gitdir / "config"
    if not config.exists():
        return
    if not config.is_file() or config.is_symlink():
        raise SourceError(f"the mirror {as_data(str(folder))}: its git config is not a "
                          "regular file: refused")
    listed = proc.query(["git", "config", "--file", str(config), "--null", "--list"],
                        env={**envmod.build_env(), **envmod.GIT}, timeout=60)
    if not listed.ok:
        raise SourceError(f"the mirror {as_data(str(folder))}: git cannot read its config: "
                          f"{as_data(listed.output.strip()[-300:])}")
    keys = sorted({item.split("\n", 1)[0].lower() for item in listed.output.split("\0")
                   if item})
    foreign = [k for k in keys if not MIRROR_KEYS.match(k)]
    if foreign:
        raise SourceError(
            f"the mirror {as_data(str(folder))}: its git config sets "
            + ", ".join(as_data(k, 80) for k in foreign[:8])
            + ("..." if len(foreign) > 8 else "")
            + ": git would act on it (a command it names, a lazy fetch); a mirror holds only "
            "a plain clone's settings: refused, nothing run there",
            hint=f"make a fresh mirror (git clone --mirror) or remove those keys from {config}")


def verify_checkout(path: Path, commit: str, *, log: Path | None = None,
                    need_tags: bool = True) -> SourceFacts:
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
    described = git(["describe", "--tags", "--long", "--always"], cwd=path, log=log,
                    check=False, echo=False)
    if need_tags and (described.returncode != 0 or "-g" not in described.output):
        raise SourceError(
            f"{path}: no tag reachable from {commit[:12]}; setuptools-scm would give 0.1.devN",
            hint="fetch tags into the mirror (git fetch --tags)",
        )
    return SourceFacts(origin=str(path), commit=head, describe=described.output.strip(),
                       shallow=False)


def clone_commands(origin: str, dest: Path, commit: str) -> list[Cmd]:
    """The three commands that clone ``origin`` at ``commit`` (full history and tags, never
    --depth): what the plan prints and what ``clone_at`` runs, between its checks."""
    origin = check_origin(origin)
    is_remote = "://" in origin and not origin.startswith("file://")
    args = ["clone", "--no-checkout"]
    if is_remote:
        args.append("--filter=blob:none")  # full history, blobs on demand; never --depth
    return [git_cmd([*args, "--", origin, str(dest)], network=is_remote),
            git_cmd(["fetch", "--tags", "--force", "origin"], cwd=dest, network=is_remote),
            git_cmd(["checkout", "--detach", commit], cwd=dest, network=is_remote)]


def clone_at(origin: str, dest: Path, commit: str, *, log: Path | None = None,
             need_tags: bool = True) -> SourceFacts:
    """Run ``clone_commands``, checking between them: the clone is not shallow, the commit
    is in it, and after checkout HEAD, history, tags and a clean tree (``verify_checkout``)."""
    clone, fetch_tags, checkout = clone_commands(origin, dest, commit)
    origin = check_origin(origin)
    if Path(origin).is_dir():
        check_mirror(Path(origin))
    if dest.exists():
        raise BuildFailed(f"{dest} already exists; refusing to clone over it")
    proc.run_cmd(clone, log=log, capture=True)
    if git(["rev-parse", "--is-shallow-repository"], cwd=dest, log=log,
           echo=False).output.strip() == "true":
        raise SourceError(
            f"the source {origin} is a shallow repository, so its clone is shallow too; "
            "setuptools-scm needs the full history to compute the pinned version",
            hint="mirror with `git clone --mirror` (or --filter=blob:none), not --depth",
        )
    proc.run_cmd(fetch_tags, log=log, capture=True)
    found = git(["cat-file", "-t", commit], cwd=dest, log=log, check=False, echo=False)
    if found.returncode != 0 or found.output.strip() != "commit":
        raise SourceError(f"commit {commit} is not in {origin}",
                          hint="is the mirror up to date? `git fetch` it, or name another")
    proc.run_cmd(checkout, log=log, capture=True)
    facts = verify_checkout(dest, commit, log=log, need_tags=need_tags)
    return SourceFacts(origin=origin, commit=facts.commit, describe=facts.describe, shallow=False)
