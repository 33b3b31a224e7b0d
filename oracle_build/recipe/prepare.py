"""The steps that prepare the source tree a build compiles: the vLLM source (a git clone
at the pinned commit, or the release archive by sha256), what the tree says (its
FetchContent externals, build switches), the pin's patches, the toolchain and the CUDA
toolkit the compile runs with, and each external taken by its git tree from the sources
`--externals` offers. The compile, install and identity steps are in steps.py; both run
from the same Plan (model.py)."""

from __future__ import annotations

import shutil
from typing import Any

from oracle_build.contracts.pins import ArchiveSource, GitSource
from oracle_build.contracts.record import (
    ArchiveFacts,
    CheckoutFacts,
    CompilerFacts,
    DeclaredExternal,
    ExternalFacts,
    PatchFacts,
    SourceFacts,
    ToolchainFacts,
)
from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.errors import (
    BuildFailed,
    PreflightFailed,
    SourceError,
    as_data,
)
from oracle_build.core.log import say
from oracle_build.recipe import archive, checkout, source, toolchain
from oracle_build.recipe.cmake import scan
from oracle_build.recipe.cuda import toolkit as cudatoolkit
from oracle_build.recipe.model import (
    BuildState,
    Step,
    archive_path,
    run_logged,
)


def source_(state: BuildState, step: Step) -> None:
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, GitSource)
    facts = source.clone_at(p.mirror or src.repository, p.staging / "src", src.commit,
                            log=p.log)
    state.facts.source = SourceFacts.model_validate(facts.as_dict())
    say(f"    HEAD {facts.commit}  ({facts.describe})")
    read_tree(state)


def archive_source(state: BuildState, step: Step) -> None:
    """The pin's release archive: in the wheelhouse by its sha256 (fetched when absent),
    unpacked into the staging folder, its recorded commit the pin's."""
    p = state.plan
    src = p.pin.model.vllm
    assert isinstance(src, ArchiveSource)
    where = archive_path(p.wheelhouse, src)
    got = archive.fetch(src.url, src.sha256, where, size=src.size)
    say(f"    {src.filename}: " + ("in the wheelhouse, sha256 checked" if got.origin ==
                                   "present" else f"fetched from {got.origin}, sha256 checked"))
    tree = archive.unpack(where, p.staging / "src")
    commit_id = checkout.version_commit_id(tree)
    found = commit_id.removeprefix("g") if commit_id else None
    if found is None or not (found.startswith(src.commit_id) or src.commit_id.startswith(found)):
        raise SourceError(f"{src.filename}'s vllm/_version.py records commit "
                          f"{commit_id or '(none)'}, the pin says {src.commit_id}",
                          hint="the archive is not the release the pin names")
    state.facts.archive = ArchiveFacts(url=src.url, filename=src.filename, sha256=src.sha256,
                                       origin=got.origin, commit_id=commit_id)
    say(f"    unpacked into {tree}; vllm/_version.py: commit {commit_id}")
    read_tree(state)


def read_tree(state: BuildState) -> None:
    """What the source tree says about building it, against the pin: before any patch, any
    external, any configure."""
    p = state.plan
    tree = checkout.read_checkout(p.staging / "src", device=p.target.device,
                                  machine=p.target.machine,
                                  preferred_requirements=p.pin.model.build.build_requirements)
    state.tree = tree
    state.facts.checkout = CheckoutFacts(
        externals_declared=[DeclaredExternal.model_validate(d.as_dict())
                            for d in tree.externals],
        other_device_externals={dev: [d.name for d in decl] for dev, decl in
                                tree.other_device_externals.items()},
        precompiled_switches=tree.switches,
        rust=tree.rust.__dict__ if tree.rust else None)
    problems = checkout.pin_problems(
        tree, p.pin.externals_for(p.target), p.pin.model.build.rust_frontend,
        torch.version if (torch := p.pin.torch_for(p.target)) else None, p.target.machine)
    if problems:  # before configure: CMake would fetch, or fail deep in its own log
        raise SourceError("the pin and the checkout at its commit disagree:\n  "
                          + "\n  ".join(problems),
                          hint="`oracle-build externals --checkout DIR --externals MIRRORS` "
                          "prints the [[externals]] block this commit needs")
    planned = set(p.wheel_unset)
    unlisted = [s for s in tree.switches if s not in planned]
    if unlisted:  # dropped anyway (every VLLM_*PRECOMPILED* is), but the plan did not say
        say(f"    note: this tree also reads {', '.join(unlisted)}; removed from the build "
            "environment with every VLLM_*PRECOMPILED* variable (plan with --checkout to "
            "list them)")


def patches(state: BuildState, step: Step) -> None:
    """Each applying patch checked (git apply --check), then applied, in the pin's order; the
    ones that do not apply here recorded with why."""
    p = state.plan
    applying = [d for d in p.patches if d.applies]
    for decision, cmd in zip(applying, step.commands, strict=True):
        check = proc.Cmd([*cmd.argv[:-2], "--check", *cmd.argv[-2:]], env=cmd.env,
                         cwd=cmd.cwd, what=f"{cmd.what} --check")
        done = proc.run_cmd(check, log=p.log, capture=True, check=False)
        if not done.ok:
            said = [ln.strip() for ln in done.output.splitlines()
                    if ln.startswith(("error:", "warning:"))][:6]
            failed = BuildFailed(f"patch {decision.patch.file} does not apply to this source "
                                 f"(git apply --check exited {done.returncode}):\n  "
                                 + "\n  ".join(as_data(ln) for ln in said)
                                 + f"\n  full log: {p.log}",
                                 hint="the source is not the one the patch was written for: "
                                 "review the patch and record a new one (file and sha256)")
            failed.log = str(p.log)
            raise failed
        run_logged(state, cmd)
        say(f"    applied {decision.patch.file}")
    state.facts.patches = [
        PatchFacts(file=d.patch.file, sha256=d.patch.sha256, reason=d.patch.reason,
                   when=d.patch.when, applied=d.applies, why=d.why) for d in p.patches]


def toolchain_(state: BuildState, step: Step) -> None:
    """The compilers against the source's own floors, read from the tree as patched."""
    p = state.plan
    found = scan(p.staging / "src", device=p.target.device, machine=p.target.machine)
    problems = toolchain.floor_problems(found.floors, p.compilers, p.patches)
    cxx = p.compilers.get("cxx")
    state.facts.toolchain = ToolchainFacts(
        compilers={r: CompilerFacts.model_validate(c.as_dict())
                   for r, c in p.compilers.items()},
        linker=toolchain.linker(cxx, envmod.build_env()) if cxx is not None else None,
        floors=[{"lang": f.lang, "version": f.version, "compiler_id": f.compiler_id,
                 "source": f.source} for f in found.floors])
    for role, tool in p.compilers.items():
        say(f"    {role}: {tool.label()}")
    if state.facts.toolchain.linker:
        say(f"    ld: {state.facts.toolchain.linker}")
    if problems:
        first = problems[0]
        lifting = first.lifting
        raise PreflightFailed(
            "; ".join(pr.message() for pr in problems),
            hint=(f"this pin's patch {lifting[0]} lifts it where its `when` holds"
                  if lifting else "a patch recorded in the pin ([[patches]]) that lowers the "
                  "floor, with its reason and a `when` on the compiler's version")
            + f"; or name a newer compiler in the pin: [build] {first.floor.lang} = \"...\" "
            "(Debian 13's gcc-12 and g++-12 are 12.4)")
    for role, tool in p.compilers.items():
        if tool.path is None:
            raise PreflightFailed(f"no {role} compiler: {tool.asked} is not on PATH",
                                  hint="install the toolchain (Debian: build-essential)")


def toolkit(state: BuildState, step: Step) -> None:
    """The CUDA toolkit the plan names: a lock's wheels unpacked into the home (once per
    lock; the wheels kept in the wheelhouse by sha256), or the host's described; the nvcc
    launcher written beside it. Its facts (nvcc's version, the six tools' sha256, the lock)
    go into the build record and the toolchain key."""
    p = state.plan
    assert p.toolkit is not None
    kit = cudatoolkit.prepare(p.toolkit, p.wheelhouse.root.parent / "toolkits",
                             p.target.machine)
    state.facts.preflight = {**state.facts.preflight,
                             "toolkit": {**kit.as_dict(), "key": kit.key_part(),
                                         "home": str(kit.cuda_home),
                                         "launcher": str(p.toolkit.launcher)}}


def externals(state: BuildState, step: Step) -> None:
    p = state.plan
    for ext in p.pin.externals_for(p.target):
        assert isinstance(ext.commit, str)
        if ext.tree is not None:
            _external_by_tree(state, ext)
            continue
        origin = str(p.externals_dir / ext.name) if p.externals_dir else ext.repository
        dest = p.staging / "externals" / ext.name
        facts = source.clone_at(origin, dest, ext.commit, log=p.log, need_tags=False)
        if ext.tag is not None:  # the tag the cmake names must still be this commit
            tagged = source.git(["rev-parse", "--verify", "--quiet",
                                 f"refs/tags/{ext.tag}^{{commit}}"], cwd=dest, log=p.log,
                                check=False, echo=False).output.strip()
            if tagged != ext.commit:
                raise SourceError(f"external {ext.name}: tag {ext.tag} in {origin} is "
                                  f"{tagged or 'absent'}, the pin says {ext.commit}",
                                  hint="a moved tag is a different external: review it and "
                                  "regenerate the pin's [[externals]]")
        state.facts.externals = {**(state.facts.externals or {}),
                                 ext.name: SourceFacts.model_validate(facts.as_dict())}


def _external_by_tree(state: BuildState, ext: Any) -> None:
    """The external from whatever local source hashes to its tree: a git mirror at its
    commit, an archive of its files (ours, GitHub's tag archive); a source that hashes to
    another tree is refused, naming the external, before configure."""
    p = state.plan
    assert p.externals_dir is not None and ext.tree is not None
    dest = p.staging / "externals" / ext.folder
    dest.parent.mkdir(parents=True, exist_ok=True)
    tried: list[str] = []
    for cand in archive.candidates(p.externals_dir, ext.name):
        shown = as_data(str(cand.path), 300)  # a file name is someone else's text
        if cand.kind == "mirror":
            try:  # a broken mirror (or one without the commit) is one source that failed
                facts = source.clone_at(str(cand.path), dest, ext.commit, log=p.log,
                                        need_tags=False)
                tree = source.git(["rev-parse", f"{ext.commit}^{{tree}}"], cwd=dest,
                                  log=p.log, echo=False).output.strip()
            except (SourceError, BuildFailed) as exc:
                shutil.rmtree(dest, ignore_errors=True)
                tried.append(f"{shown} (git mirror): "
                             f"{as_data(exc.message.splitlines()[0], 300)}")
                continue
            if tree != ext.tree:
                shutil.rmtree(dest)
                tried.append(f"{shown} (git mirror): commit {ext.commit} has tree "
                             f"{as_data(tree, 80)}")
                continue
            shutil.rmtree(dest / ".git")  # the files, as an archive would give them
            state.facts.externals = {**(state.facts.externals or {}),
                                     ext.name: SourceFacts.model_validate(facts.as_dict())}
        else:
            try:
                archive.unpack(cand.path, dest)
            except SourceError as exc:
                tried.append(f"{shown}: {as_data(exc.message, 600)}")
                continue
            tree = archive.tree_id(dest)
            if tree != ext.tree:
                shutil.rmtree(dest)
                tried.append(f"{shown} (archive): its files hash to tree {tree}")
                continue
        state.facts.externals_by_tree = {
            **(state.facts.externals_by_tree or {}),
            ext.name: ExternalFacts(tree=ext.tree, commit=ext.commit, origin=str(cand.path),
                                    kind="mirror" if cand.kind == "mirror" else "archive")}
        for passed in tried:  # what was tried first and did not hold it, said
            say(f"    {ext.name}: not from {passed}")
        say(f"    {ext.name}: {shown} ({cand.kind}) holds tree {ext.tree}")
        return
    raise SourceError(
        f"external {ext.name}: nothing in {p.externals_dir} holds its files (git tree "
        f"{ext.tree}, commit {ext.commit})"
        + ("; tried:\n    " + "\n    ".join(tried) if tried else
           "; no git mirror named after it and no source archive there"),
        hint=f"put a git mirror at {p.externals_dir / ext.name} or an archive of the tag "
        f"{ext.tag or ext.commit} ({ext.repository}) in {p.externals_dir}")
