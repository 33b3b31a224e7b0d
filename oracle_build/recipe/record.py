"""The build record, and publishing: the record is written into the staging venv, then
one rename moves the venv into place (the commit point). A venv at the oracle path
without a build record is never the oracle."""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name, parse_wheel_filename

from oracle_build import devices, host
from oracle_build.contracts.compiled import RECIPE
from oracle_build.contracts.pins import FromSource
from oracle_build.contracts.record import (
    RECORD_SCHEMA,
    BuildEnvironment,
    BuildRecord,
    CompiledFacts,
    InstalledDistribution,
    Installer,
    ManifestSummary,
    ToolFacts,
)
from oracle_build.core import env as envmod
from oracle_build.core import layout
from oracle_build.core.errors import IdentityMismatch
from oracle_build.core.files import atomic_write_json, sha256_file
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import OracleVenv
from oracle_build.recipe import toolchain
from oracle_build.recipe.model import (
    REPRODUCIBLE_CMAKE_ARGS,
    SOURCE_DATE_EPOCH,
    STAGING_SHOWN,
    UV_VERSION,
    reproducible_text,
)

if TYPE_CHECKING:
    from oracle_build.recipe.model import BuildState, Plan

def levers(p: Plan) -> list[str]:
    """What a source build sets so that its compiled bytes depend on the pin and the
    toolchain only, not on where or when it ran."""
    out = [f"SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}: every timestamp the build writes (the "
           "wheel's entries, checked-hash bytecode) is this one, not the build's time"]
    out.append(f"-ffile-prefix-map=<the staging folder>={toolchain.MAPPED_TO} (CFLAGS, "
               "CXXFLAGS and the device compiler's flags): no object names where it was built "
               "(__FILE__ in torch's TORCH_CHECK, debug info), with or without the compiler "
               f"cache (build recipe {RECIPE})")
    cc = p.compiler_cache
    if cc is not None and cc.active:
        out.append("ccache in depend mode, CCACHE_BASEDIR=<the staging folder>, "
                   "CCACHE_NOHASHDIR, the path map's flags left out of the keys "
                   "(CCACHE_IGNOREOPTIONS): the cache's keys do not depend on the home")
    out += [f"CMAKE_ARGS {a}: linked once with the install RPATH; no build-tree RPATH "
            "blanked in place at install (which left .dynstr as long as the build path)"
            for a in REPRODUCIBLE_CMAKE_ARGS]
    return out


def compiled_facts(state: BuildState) -> CompiledFacts | None:
    """A source pin's compiled files, toolchain and levers (None for a wheel pin)."""
    p = state.plan
    src = p.pin.model.vllm
    if not isinstance(src, FromSource):
        return None
    tools = state.facts.toolchain
    return CompiledFacts(
        files=inventory.compiled_files(p.staging_venv, src.distribution),
        toolchain=(toolchain.toolchain_key(
            tools, devices.module(p.target).toolchain_parts(state.facts.preflight))
                   if p.from_source and tools is not None else None),
        levers=levers(p) if p.from_source else [],
        reproducible=reproducible_text(p.pin),
        recipe=RECIPE if p.from_source else None)


def build_record(state: BuildState, ident: identity.Identity, *, manifest_summary: ManifestSummary,
                 content_fingerprint: str, timings: dict[str, float]) -> BuildRecord:
    """The record of the build ``state`` ran, with ``ident`` its identity at the final path."""
    p = state.plan
    lock_hashes = {e.key: e.sha256[0] for e in (p.pin.lock_entries or ())}
    files = p.wheelhouse.files() if p.wheelhouse.manifest_path.exists() else {}
    wheel_by_key: dict[str, tuple[str | None, str | None]] = {}
    for filename, info in files.items():
        name, _version, _b, _t = parse_wheel_filename(filename)
        wheel_by_key[str(canonicalize_name(name))] = (filename, info["sha256"])
    dists = OracleVenv(p.staging_venv).distributions()
    facts = state.facts
    return BuildRecord(
        record_schema=RECORD_SCHEMA,
        created_utc=layout.utc_now(),
        tool=ToolFacts.model_validate(host.tool_facts()),
        pin=p.pin.summary(),
        target={"name": p.target_name, **p.target.model_dump(mode="json")},
        resolved=p.resolved(),
        host=host.facts(p.build_env),
        installer=Installer(uv=UV_VERSION, pip_for_wheel_build=(
            p.pin.model.build.pip if isinstance(p.pin.model.vllm, FromSource) else None)),
        origin=state.origin,
        source=facts.source,
        externals=facts.externals,
        externals_declared=facts.checkout.externals_declared if facts.checkout else None,
        build_requirements=facts.build_requirements,
        wheel=facts.wheel,
        compiled_arches=facts.compiled_arches,
        distributions=[
            InstalledDistribution(name=k, version=v,
                                  wheel=wheel_by_key.get(k, (None, None))[0],
                                  sha256=wheel_by_key.get(k, (None, lock_hashes.get(k)))[1])
            for k, v in sorted(dists.items())],
        preflight=facts.preflight,
        timings=timings,
        log=str(layout.record_dir(p.venv) / layout.BUILD_LOG),
        identity=ident.summary(),
        libraries=identity.outside_libraries(ident.facts),
        content_fingerprint=content_fingerprint,
        archive=facts.archive,
        patches=facts.patches,
        toolchain=facts.toolchain,
        externals_by_tree=facts.externals_by_tree,
        compiler_cache=facts.compiler_cache,
        compiled=compiled_facts(state),
        manifest=manifest_summary,
        environment=build_environment(state))


def build_environment(state: BuildState) -> BuildEnvironment:
    """What reached the build's processes, for its record (while the build runs)."""
    p = state.plan
    staged = str(p.staging)
    base = {k: v.replace(staged, STAGING_SHOWN) for k, v in envmod.build_env().items()}
    dropped, others = envmod.dropped_from_build()
    return BuildEnvironment(base=envmod.masked(base), wheel=state.facts.wheel_environment,
                            network=p.network_text(), dropped=dropped, dropped_others=others,
                            stripped=p.base.stripped if p.base else False)


def publish(state: BuildState) -> identity.Identity:
    p = state.plan
    ident = state.identity
    assert ident is not None
    publish_start = time.monotonic()
    staged = OracleVenv(p.staging_venv)
    final_venv = OracleVenv(p.venv)
    staged.record_dir.mkdir(parents=True, exist_ok=True)
    # every file, as it will stand at the final path (console scripts name that python),
    # checked against its wheel's RECORD: written before the rename, like the record
    start = time.monotonic()
    relocated = staged.retarget_scripts(p.venv)
    files = inventory.build(p.staging_venv, relocated=relocated,
                            startup=inventory.outside_startup(ident.facts, p.staging_venv),
                            hashed=state.hashed)
    atomic_write_json(inventory.path(p.staging_venv), files)
    fingerprint = inventory.fingerprint(files)
    summary = ManifestSummary(
        files=len(files["files"]), symlinks=len(files["symlinks"]),
        bytecode=sum(1 for f in files["files"].values() if f["kind"] == "bytecode"),
        bytes=sum(f["size"] for f in files["files"].values()),
        startup_outside=files["startup_outside"], created_utc=files["created_utc"])
    timings = dict(state.steps.timings)
    timings["manifest"] = round(time.monotonic() - start, 3)
    # written as it will read at the final path (the venv is renamed into place)
    staged_record = BuildRecord.model_validate(identity.replace_path(
        build_record(state, ident, manifest_summary=summary, content_fingerprint=fingerprint,
                     timings=timings).model_dump(mode="json"), p.staging_venv, p.venv))
    # a source pin that holds its compiled bytes: this build must have given them (unless it
    # was made to be compared with them, by build_oracle --check)
    problems, ident.compiled = identity.compiled_checks(
        p.pin, p.target_name, p.target.machine, staged_record.compiled)
    if problems and not p.compare_only:
        raise IdentityMismatch(problems, where=f"{p.staging_venv} (not published)",
                               hint=identity.CHECK_HINT)
    shutil.copy2(p.log, staged.record_dir / layout.BUILD_LOG)
    atomic_write_json(staged.record_dir / layout.IDENTITY_FACTS, ident.facts)
    atomic_write_json(staged.record_path, staged_record.model_dump(mode="json"))
    replaced = None
    p.venv.parent.mkdir(parents=True, exist_ok=True)
    if final_venv.exists():
        replaced = layout.set_aside(p.home, "replaced", p.pin.key)
        os.rename(p.venv, replaced)
    os.rename(p.staging_venv, p.venv)  # the commit point
    start = time.monotonic()
    ident.build_network = p.network_text()  # what the record written above says
    final = identity.relocated(p.pin, p.target, ident, p.staging_venv, p.venv)
    if not final.ok:  # never leave a venv in place that fails identity
        os.rename(p.venv, p.staging_venv)
        if replaced is not None:
            os.rename(replaced, p.venv)
        raise IdentityMismatch(final.mismatches, where=f"{p.venv} (after the move)")
    timings["identity (final path)"] = round(time.monotonic() - start, 3)
    timings["publish"] = round(time.monotonic() - publish_start, 3)
    timings["total"] = round(sum(  # steps only; the final identity is in publish
        v for k, v in timings.items() if k not in ("total", "identity (final path)", "manifest")),
        3)
    published = staged_record.model_copy(update={"identity": final.summary(),
                                                 "timings": timings})
    atomic_write_json(final_venv.record_dir / layout.IDENTITY_FACTS, final.facts)
    atomic_write_json(final_venv.record_path, published.model_dump(mode="json"))
    # the anchor, outside the venv: written last, once the record is final (an oracle without
    # its anchor is an interrupted publish, never the oracle)
    inventory.write_anchor(p.venv, manifest_sha256=sha256_file(inventory.path(p.venv)),
                           record_sha256=sha256_file(final_venv.record_path),
                           content_fingerprint=fingerprint)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    shutil.rmtree(p.staging, ignore_errors=True)
    return final
