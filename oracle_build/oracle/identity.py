"""Identity: is the venv at this path provably the pin's oracle?

The facts are gathered by ``inside/probe.py`` run by the oracle's own python
in isolated mode (-I: no PYTHONPATH, no user site, no script dir on sys.path)
from a fresh empty working directory. The comparison with the pin lives here.
``ORACLE_IDENTITY_OK`` is printed only when the list of mismatches is empty.
"""

from __future__ import annotations

import json
import os
import platform
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from oracle_build import devices, host
from oracle_build.contracts.compiled import RECIPE, load_compiled
from oracle_build.contracts.pins import (
    ArchiveSource,
    FromSource,
    GitSource,
    Pin,
    UnestablishedValue,
)
from oracle_build.contracts.probe import ProbeFacts
from oracle_build.contracts.record import CompiledFacts, load_record
from oracle_build.contracts.targets import Target
from oracle_build.core import layout, proc, verdicts
from oracle_build.core.env import RECORDED_PREFIXES
from oracle_build.core.errors import BadInput, BuildFailed, IdentityMismatch, as_data
from oracle_build.core.files import json_value, sha256_file, validate
from oracle_build.devices import Hold
from oracle_build.oracle import inventory
from oracle_build.oracle.venv import OracleVenv

OK_LINE = verdicts.IDENTITY_OK
MISMATCH_LINE = verdicts.IDENTITY_MISMATCH


@dataclass
class Identity:
    venv: Path
    facts: dict[str, Any]
    device: str  # the target's device: its module reads the probe's device facts
    mismatches: list[tuple[str, str, str]] = field(default_factory=list)
    compiled_sm: list[str] | None = None
    files: inventory.Check | None = None
    # the pin's patches this oracle's source was built with (its build record's), by file
    patches: list[str] = field(default_factory=list)
    # a source oracle's compiled files against the pin's established bytes, in words
    compiled: str | None = None
    # the device's checks that did not run (built with --no-gpu): never ORACLE_IDENTITY_OK
    skipped: tuple[str, ...] = ()
    # the build's network as its record says ("closed (<how>) ..."; None: not recorded)
    build_network: str | None = None
    # how its own processes (this probe, the engine host) ran: ``closed (<how>)`` or
    # ``open (<why>)``
    run_network: str | None = None
    # the compiler its engines compile run-time kernels with (engine/compiler.py's line)
    runtime_compiler: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> dict[str, Any]:
        mods = self.facts.get("modules", {})
        return {
            "ok": self.ok,
            "venv": str(self.venv),
            "vllm": mods.get("vllm", {}).get("version"),
            "vllm_file": mods.get("vllm", {}).get("file"),
            "torch": mods.get("torch", {}).get("version"),
            "transformers": mods.get("transformers", {}).get("version"),
            "flashinfer": mods.get("flashinfer", {}).get("version"),
            "device": self.device_label(),
            "kernel": self.facts.get("kernel"),
            "cpu_variant": self.cpu_variant,
            "compiled_sm": self.compiled_sm,
            "files": ({"checked": self.files.files, "hashed": self.files.hashed,
                       "seconds": round(self.files.seconds, 3)} if self.files else None),
            "distributions": {k: v["version"] for k, v in
                              sorted(self.facts.get("distributions", {}).items())},
            "patches": list(self.patches),
            "compiled": self.compiled,
            "device_checks_skipped": list(self.skipped),
            "build_network": self.build_network,
            "run_network": self.run_network,
            "mismatches": [{"field": f, "expected": e, "found": g} for f, e, g in self.mismatches],
        }

    @property
    def cpu_variant(self) -> str | None:
        """The CPU kernel variant the oracle loaded (CPU targets; None elsewhere)."""
        variant = (self.facts.get("cpu_kernels") or {}).get("variant")
        return variant if isinstance(variant, str) else None

    def device_label(self) -> str:
        """The probed device as its device module names it (the target's, when known)."""
        return devices.module(self.device).label(self.facts)

    def block(self) -> str:
        s = {k: as_data(str(v)) if v else v for k, v in self.summary().items()
             if isinstance(v, str | int | float) or v is None}
        patched = (f" ({len(self.patches)} patch{'es' if len(self.patches) != 1 else ''})"
                   if self.patches else "")
        lines = [
            f"vllm {s['vllm'] or '-'}{patched}   transformers {s['transformers'] or '-'}   "
            f"flashinfer {s['flashinfer'] or '-'}",
            f"torch {s['torch'] or '-'}   {s['device']}",
            f"vllm_file {s['vllm_file'] or '-'}",
        ]
        kernels = self.facts.get("cpu_kernels")
        if isinstance(kernels, dict):  # a CPU oracle: the variant its kernels ran as
            held = kernels.get("held")
            loaded = [str(x) for x in kernels.get("loaded") or [] if isinstance(x, str)]
            lines.append(
                f"kernel variant {as_data(str(self.cpu_variant or '(unknown)'))}"
                + (f" (held as {as_data(str(held))})" if isinstance(held, str) else
                   " (this CPU's own)")
                + f"   vllm library {as_data(' '.join(loaded) or '(none)')}"
                + f"   torch capability {as_data(str(kernels.get('torch_capability')))}")
        if self.compiled_sm is not None:  # the device code the loaded extensions hold
            lines.append(f"kernels {as_data(' '.join(self.compiled_sm) or '(none)')}")
        if self.compiled:
            lines.append(f"compiled {as_data(self.compiled)}")
        if self.build_network:
            lines.append(f"built with the network {as_data(self.build_network)}")
        if self.run_network:
            lines.append(f"runs with the network {as_data(self.run_network)}")
        if self.runtime_compiler:
            lines.append(self.runtime_compiler)  # escaped where it was made
        lines.append(verdicts.identity(self.ok, self.skipped))
        if not self.ok:
            lines += [f"  {as_data(f)}: expected {as_data(str(e))}, found {as_data(str(g))}"
                      for f, e, g in self.mismatches]
        return "\n".join(lines)


def probe_args(target: Target, *, no_gpu: bool = False) -> list[str]:
    """What probe.py (alone, or in the engine host) is told: kernel check ("none" without
    the GPU it runs on), device, the environment prefixes it records."""
    return [target.kernel_check if not no_gpu else "none",
            devices.module(target).PROBE_DEVICE, ",".join(RECORDED_PREFIXES)]


def run_probe(venv: Path, target: Target, *, log: Path | None = None,
              timeout: float = 600, hold: Hold | None = None,
              no_gpu: bool = False) -> dict[str, Any]:
    """The facts ``inside/probe.py`` gathers, run by the venv's own python (held to
    ``hold``'s kernel variant: the pin target's when not given)."""
    hold = hold if hold is not None else host.hold(target)
    answer = OracleVenv(venv).run_inside(
        "probe.py", probe_args(target, no_gpu=no_gpu), env={**target.env, **hold.env},
        log=log,
        what="identity probe",
        timeout=timeout, echo=False)
    if answer.result.returncode != 0 or answer.data is None:
        text = answer.result.output or (log.read_text(errors="replace") if log else "")
        tail = text.strip().splitlines()[-20:]
        raise BuildFailed(
            f"identity probe failed (exit {answer.result.returncode}) with "
            f"{OracleVenv(venv).python}:\n" + "\n".join("    | " + ln for ln in tail))
    facts = answer.data
    facts["machine"] = platform.machine()
    return facts


def probe_answer(facts: dict[str, Any], venv: Path) -> ProbeFacts:
    """The probe's answer validated before identity compares one field of it: it comes from a
    process inside the venv, and a venv edited by hand (or a python that is not the venv's
    own) can answer anything. A malformed answer is a failed probe, naming the field."""
    try:
        return validate(ProbeFacts, facts, venv / "oracle-build" / layout.IDENTITY_FACTS)
    except BadInput as exc:
        raise BuildFailed(
            f"the identity probe run by {OracleVenv(venv).python} answered what this "
            "oracle-build does not read (a venv edited by hand, or a python that is not its "
            "own?):\n" + "\n".join(f"    {f}: {m}" for f, m in exc.problems[:20])) from None


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def compare(pin: Pin, target: Target, venv: Path, facts: dict[str, Any],
            hold: Hold | None = None, *, no_gpu: bool = False) -> list[tuple[str, str, str]]:
    """Every way the facts differ from the pin, as (field, expected, found). ``no_gpu``:
    the kernel check and the device's facts are not compared (they were not asked for:
    the identity that follows names them as not run)."""
    bad: list[tuple[str, str, str]] = []
    hold = hold if hold is not None else host.hold(target)
    py = facts["python"]
    expected_prefix = os.path.realpath(venv)
    if venv.is_symlink():
        bad.append(("venv_path", f"a real directory at {venv}",
                    f"a symlink to {os.path.realpath(venv)}"))
    elif os.path.realpath(venv) != os.path.abspath(venv):
        bad.append(("venv_path", f"{venv} with no symlink in it",
                    f"reached through a symlink (real path {os.path.realpath(venv)})"))
    if py["real_prefix"] != expected_prefix:
        bad.append(("sys.prefix", expected_prefix, py["real_prefix"]))
    if not py["version"].startswith(pin.model.python + "."):
        bad.append(("python", pin.model.python, py["version"]))
    site_dirs = sorted({py["purelib"], py["platlib"]})
    foreign = [p for p in py["sys_path"] if p and not (
        _under(os.path.realpath(p), [expected_prefix, os.path.realpath(py["base_prefix"])]))]
    if foreign:
        bad.append(("sys.path", "only the venv and its base interpreter", ", ".join(foreign)))

    mods = facts.get("modules", {})
    vllm = mods.get("vllm", {})
    if "error" in vllm:
        bad.append(("vllm import", "imports", vllm["error"]))
    else:
        want = pin.expected_runtime_version()
        if vllm.get("version") != want:
            bad.append(("vllm.__version__", want, str(vllm.get("version"))))
        src = pin.model.vllm
        if isinstance(src, GitSource):
            m = re.search(r"\+g([0-9a-f]+)", vllm.get("version") or "")
            if not m or not src.commit.startswith(m.group(1)):
                bad.append(("vllm commit", f"+g<prefix of {src.commit}>",
                            str(vllm.get("version"))))
        if not _under(vllm.get("file", ""), site_dirs):
            bad.append(("vllm_file", f"inside {site_dirs[0]}", str(vllm.get("file"))))
        package = facts.get("vllm_package") or {}
        if isinstance(src, GitSource):
            commit_id = package.get("commit_id")
            if commit_id and not src.commit.startswith(commit_id.removeprefix("g")):
                bad.append(("vllm/_version.py __commit_id__", f"g<prefix of {src.commit}>",
                            commit_id))
        if isinstance(src, ArchiveSource):
            # setup.py rewrites vllm/_version.py from the sdist's PKG-INFO (commit None):
            # the commit is the archive's, which the source step checked and the record holds
            commit_id = package.get("commit_id")
            found = commit_id.removeprefix("g") if commit_id else None
            if found and not (found.startswith(src.commit_id)
                              or src.commit_id.startswith(found)):
                bad.append(("vllm/_version.py __commit_id__", f"g{src.commit_id}", str(commit_id)))
        if isinstance(src, GitSource | ArchiveSource):
            decision = pin.model.build.rust_frontend
            if decision is not None and bool(package.get("rust_frontend")) != (
                    decision == "build"):
                bad.append(("vllm/vllm-rs (Rust front end)",
                            "present" if decision == "build" else "absent",
                            "present" if package.get("rust_frontend") else "absent"))

    dists = facts.get("distributions", {})
    expected = pin.expected_versions(target)
    for key, version in expected.items():
        found = dists.get(key)
        if found is None:
            bad.append((f"{key} (installed)", version, "not installed"))
            continue
        if found["version"] != version:
            bad.append((f"{key} (installed)", version, found["version"]))
        if not _under(found["location"], site_dirs):
            bad.append((f"{key} (location)", f"inside {site_dirs[0]}", found["location"]))
    for key, entries in facts.get("duplicate_distributions", {}).items():
        bad.append((f"{key} (installed)", "one copy",
                    ", ".join(f"{e['version']} at {e['location']}" for e in entries)))
    for module, dist in (("torch", "torch"), ("transformers", "transformers"),
                         ("flashinfer", "flashinfer-python")):
        pinned = expected.get(canonicalize_name(dist))
        if pinned is None:
            continue
        want = pinned
        got = mods.get(module, {})
        if "error" in got or got.get("version") != want:
            bad.append((f"{module}.__version__", want, got.get("error") or str(got.get("version"))))
        elif not _under(got.get("file", ""), site_dirs):
            bad.append((f"{module} file", f"inside {site_dirs[0]}", str(got.get("file"))))

    if no_gpu:
        return bad
    kernel = facts.get("kernel", {})
    if not kernel.get("ok"):
        bad.append(("compiled kernel", f"{target.kernel_check} runs",
                    str(kernel.get("error") or kernel)))
    bad += devices.module(target).device_mismatches(target, facts, hold)
    return bad


def check(pin: Pin, target: Target, venv: Path, *, log: Path | None = None,
          staged: bool = False, deep: bool = False,
          facts: dict[str, Any] | None = None,
          files: inventory.Check | None = None, hold: Hold | None = None,
          no_gpu: bool = False, toolkit: str | None = None) -> Identity:
    """Probe ``venv`` (or take ``facts`` its engine host's probe wrote). Outside staging a
    venv without build_oracle's record is incomplete (an interrupted publish, or a venv made
    by hand) and never passes; every file is compared with the manifest the build wrote, the
    manifest with its anchor outside the venv (``deep``: every file hashed; ``files``: that
    comparison, made by the caller meanwhile), and the shared libraries the process mapped
    with those the build's process mapped. ``hold``: the CPU kernel variant the process
    must run (default: the pin target's), proved from the process itself. ``no_gpu``: a
    build without its GPU (build_oracle --no-gpu): the device's checks are not run, and the
    identity says so (``skipped``) instead of passing."""
    hold = hold if hold is not None else host.hold(target)
    oracle = OracleVenv(venv)
    loaded: tuple[dict[str, Any] | None, list[tuple[str, str, str]]] | None = None
    if facts is None and not staged and files is None and oracle.has_record():
        # the probe (a process importing vLLM) runs while every file is checked here
        with ThreadPoolExecutor(1, thread_name_prefix="probe") as pool:
            probing = pool.submit(run_probe, venv, target, log=log, hold=hold,
                                  no_gpu=no_gpu)
            loaded = inventory.load(venv)
            if loaded[0] is not None:
                files = inventory.check(venv, loaded[0], deep=deep)
            facts = probing.result()
    elif facts is None:
        facts = run_probe(venv, target, log=log, hold=hold, no_gpu=no_gpu)
    else:
        facts["machine"] = platform.machine()
    probe_answer(facts, venv)
    ident = Identity(venv=venv, facts=facts, device=target.device,
                     run_network=proc.oracle_network()[1])
    ident.mismatches = compare(pin, target, venv, facts, hold, no_gpu=no_gpu)
    if no_gpu:
        ident.skipped = devices.module(target).DEVICE_CHECKS
    if not staged and not oracle.has_record():
        ident.mismatches.append(("build record", str(oracle.record_path),
                                 "missing: not a venv build_oracle completed"))
    elif not staged:
        recorded, problems = loaded if loaded is not None else inventory.load(venv)
        ident.mismatches += problems
        if recorded is not None:
            ident.files = files if files is not None else inventory.check(venv, recorded,
                                                                          deep=deep)
            ident.mismatches += ident.files.mismatches
            ident.mismatches += inventory.check_startup(recorded,
                                                        inventory.outside_startup(facts, venv))
            ident.mismatches += record_checks(venv, facts)
            ident.mismatches += source_record_checks(pin, venv)
            problems, ident.compiled = recorded_compiled_checks(pin, target, venv)
            ident.mismatches += problems
        ident.patches = applied_patches(venv)
        ident.build_network = built_network(venv)
    libs = [e["path"] for e in facts.get("extensions", [])]
    ident.compiled_sm, problems = devices.module(target).compiled(
        target, libs, toolkit=toolkit or recorded_toolkit(venv))
    ident.mismatches += problems
    return ident


def recorded_toolkit(venv: Path) -> str | None:
    """The toolkit folder the oracle's build prepared (its record's ``preflight.toolkit``),
    whose tools check its compiled code; None when it had none or has no record yet."""
    oracle = OracleVenv(venv)
    if not oracle.has_record():
        return None
    try:
        found = load_record(oracle.record_path).preflight.get("toolkit")
    except (BadInput, OSError):
        return None
    home = found.get("home") if isinstance(found, dict) else None
    return home if isinstance(home, str) and Path(home).is_dir() else None


def source_record_checks(pin: Pin, venv: Path) -> list[tuple[str, str, str]]:
    """A release archive's build: the record (anchored: never edited after publish) names
    the pin's archive, by sha256, with the commit its vllm/_version.py recorded, and the
    pin's patches as they were decided (a patch file since changed is another source)."""
    src = pin.model.vllm
    if not isinstance(src, ArchiveSource):
        return []
    try:
        record = load_record(OracleVenv(venv).record_path)
    except (BadInput, OSError):
        return []  # the record's own checks say what is wrong with it
    bad: list[tuple[str, str, str]] = []
    if record.archive is None:
        return [("source archive (build record)", f"{src.filename} sha256 {src.sha256}",
                 "not recorded: not built from the pin's archive")]
    if record.archive.sha256 != src.sha256:
        bad.append(("source archive (build record)", f"sha256 {src.sha256}",
                    f"sha256 {record.archive.sha256}"))
    found = (record.archive.commit_id or "").removeprefix("g")
    if not found or not (found.startswith(src.commit_id) or src.commit_id.startswith(found)):
        bad.append(("vllm commit (the archive's vllm/_version.py, build record)",
                    f"g{src.commit_id}", record.archive.commit_id or "none"))
    pinned = {p.file: p.sha256 for p in pin.model.patches}
    for patch in record.patches or []:
        if patch.applied and pinned.get(patch.file) != patch.sha256:
            bad.append((f"patch {patch.file} (build record)",
                        f"sha256 {pinned.get(patch.file) or '(not in the pin)'}",
                        f"sha256 {patch.sha256}"))
    return bad


CHECK_HINT = "rebuilt from the same source, other bytes: see `build_oracle -- --check`"


def recorded_compiled_checks(pin: Pin, target: Target, venv: Path) -> tuple[
        list[tuple[str, str, str]], str | None]:
    """compiled_checks on what the oracle's (anchored) build record says it compiled; the
    files themselves are the manifest's, which the file check holds them to."""
    if not isinstance(pin.model.vllm, FromSource):
        return [], None
    try:
        record = load_record(OracleVenv(venv).record_path)
    except (BadInput, OSError):
        return [], None  # the record's own checks say what is wrong with it
    name = record.target.get("name")
    return compiled_checks(pin, str(name), target.machine, record.compiled)


def compiled_checks(pin: Pin, target_name: str, machine: str,
                    compiled: CompiledFacts | None) -> tuple[list[tuple[str, str, str]],
                                                            str | None]:
    """A source oracle's compiled files against the bytes the pin holds for its content
    hash, target and machine (pins/<id>.compiled.toml): the mismatches, and a line saying
    what was compared. Equal to any established entry passes; otherwise the entry of the
    same toolchain (same source, same toolchain, other bytes: not reproducible, or not the
    pin's build) or the latest one (another toolchain) is named, file by file."""
    if not isinstance(pin.model.vllm, FromSource):
        return [], None
    held = pin.model.compiled
    if isinstance(held, UnestablishedValue):
        return [], f"bytes unestablished in the pin: {held.reason}"
    path = pin.compiled_path
    if path is None:
        return [], "bytes not held by the pin (it names no compiled file)"
    if not path.exists() and not path.is_symlink():
        return [], (f"bytes unestablished: {path.name} is not written yet (`oracle-build lock "
                    "--compiled` establishes them from this oracle)")
    lock = load_compiled(path)
    if lock.pin != pin.id:
        raise BadInput(path, [("pin", f"names pin {lock.pin!r}; {pin.path.name} is "
                               f"{pin.id!r}")])
    # a record without a recipe: written before recipes (1), or an install of a wheel an
    # earlier build made (no toolchain: held to the current recipe's bytes)
    recipe = RECIPE if compiled is None or compiled.toolchain is None else (compiled.recipe or 1)
    entries = lock.entries_for(pin.content_hash, target_name, machine, recipe)
    if not entries:
        others = sorted({e.recipe for e in lock.established
                         if (e.pin_hash, e.target, e.machine)
                         == (pin.content_hash, target_name, machine)})
        why = (f" (it holds this pin's bytes of build recipe "
               f"{', '.join(map(str, others))}; this oracle's recipe is {recipe}: "
               "docs/reproducible-builds.md#recipes)" if others else "")
        return [], (f"bytes unestablished in {path.name} for this pin (content hash "
                    f"{pin.content_hash[:12]}), target {target_name} on {machine}{why}: "
                    "`oracle-build lock --compiled` establishes them from this oracle")
    if compiled is None:
        return [("compiled files (build record)", f"the bytes {path.name} holds",
                 "not recorded: built by an earlier oracle-build (`build_oracle -- --rebuild`)")
                ], None
    got = compiled.files
    for entry in entries:
        if entry.files == got:
            return [], (f"{len(got)} files, the pin's bytes ({path.name}, established "
                        f"{entry.established_utc})")
    same = [e for e in entries if e.toolchain == compiled.toolchain]
    ref = same[-1] if same else entries[-1]
    names = sorted(set(ref.files) | set(got))
    differ = [n for n in names if ref.files.get(n) != got.get(n)]
    out = [(f"compiled file {n}",
            f"sha256 {ref.files[n][:16]}... ({path.name})" if n in ref.files else
            f"absent ({path.name})",
            f"sha256 {got[n][:16]}..." if n in got else "absent")
           for n in differ[:inventory.SHOWN]]
    if len(differ) > inventory.SHOWN:
        out.append(("compiled files", "the pin's bytes",
                    f"... and {len(differ) - inventory.SHOWN} more differ"))
    if same:
        out.append(("compiled files", f"the bytes {path.name} holds for this toolchain",
                    CHECK_HINT))
    else:
        out.append(("toolchain (compiled files)", ref.toolchain,
                    f"{compiled.toolchain or 'unknown'}: other compilers give other bytes; "
                    "build with the pin's toolchain, or establish this one's with "
                    "`oracle-build lock --compiled` (docs/reproducible-builds.md)"))
    return out, None


def applied_patches(venv: Path) -> list[str]:
    """The patches the build record says were applied to this oracle's source."""
    try:
        record = load_record(OracleVenv(venv).record_path)
    except (BadInput, OSError):
        return []
    return [p.file for p in record.patches or [] if p.applied]


def built_network(venv: Path) -> str | None:
    """The build's network as the build record says (None: a record from before it)."""
    try:
        record = load_record(OracleVenv(venv).record_path)
    except (BadInput, OSError):
        return None
    return record.environment.network if record.environment else None


def outside_libraries(facts: dict[str, Any]) -> dict[str, str]:
    """The shared libraries (and executable) a probe's process mapped from outside its venv,
    path -> sha256."""
    files = (facts.get("libraries") or {}).get("files") or {}
    return {p: d for p, d in sorted(files.items()) if isinstance(d, str)}


def record_checks(venv: Path, facts: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The build record against the anchor (the record is never edited after publish), and
    this process's mapped libraries against those the build's process mapped."""
    anchor = inventory.read_anchor(venv) or {}
    record_file = OracleVenv(venv).record_path
    digest = sha256_file(record_file)
    if digest != anchor.get("build_record_sha256"):
        return [("build record", f"sha256 {str(anchor.get('build_record_sha256'))[:16]}... "
                 "(the anchor)", f"sha256 {digest[:16]}...: edited after publish")]
    try:
        record = load_record(record_file)
    except BadInput as exc:
        return [("build record", "a build record", f"not one: {exc.message}")]
    return library_mismatches(record.libraries, facts)


def library_mismatches(built: dict[str, str], facts: dict[str, Any]) -> list[
        tuple[str, str, str]]:
    """A library mapped now from outside the venv must be one the build's process mapped,
    with the same sha256 (the system's libgomp in place of torch's own, through
    LD_LIBRARY_PATH, is a different oracle). The base interpreter's own standard library
    extensions may differ in which are loaded (the engine host imports more of them): a
    new one there is allowed, a changed one is not."""
    now = outside_libraries(facts)
    libraries = facts.get("libraries") or {}
    if "error" in libraries:
        return [("mapped libraries", "read from /proc/self/maps", str(libraries["error"]))]
    base = os.path.realpath((facts.get("python") or {}).get("base_prefix") or "/nonexistent")
    bad = []
    for path, digest in now.items():
        old = built.get(path)
        if old is None:
            if not _under(path, [base]):
                bad.append((f"library {path}", "not mapped by the build's process",
                            "mapped now (another library in place of the oracle's: "
                            "LD_LIBRARY_PATH, LD_PRELOAD or /etc/ld.so.preload?)"))
        elif old != digest:
            bad.append((f"library {path}", f"sha256 {old[:16]}...",
                        f"sha256 {digest[:16]}... (changed since the build: an OS update? "
                        "`build_oracle -- --rebuild`)"))
    return bad


def relocated(pin: Pin, target: Target, ident: Identity, old: Path, new: Path) -> Identity:
    """After a venv checked at ``old`` was renamed to ``new`` (same files, one atomic rename):
    observe where its python now lives and where vllm now resolves (without importing it,
    milliseconds), and carry the full facts over to the new path, compared again."""
    prefix, origin = OracleVenv(new).locate()
    moved = replace_path(ident.facts, old, new)
    result = Identity(venv=new, facts=moved, device=ident.device,
                      compiled_sm=ident.compiled_sm, patches=list(ident.patches),
                      compiled=ident.compiled, skipped=ident.skipped,
                      build_network=ident.build_network, run_network=ident.run_network,
                      runtime_compiler=ident.runtime_compiler)
    result.mismatches = compare(pin, target, new, moved, no_gpu=bool(ident.skipped))
    if prefix != os.path.realpath(new):
        result.mismatches.append(("sys.prefix (after the move)", os.path.realpath(new),
                                  str(prefix)))
    if origin != moved.get("modules", {}).get("vllm", {}).get("file"):
        result.mismatches.append(("vllm_file (after the move)",
                                  str(moved.get("modules", {}).get("vllm", {}).get("file")),
                                  str(origin)))
    result.facts["relocated_from"] = str(old)
    return result


def replace_path(value: Any, old: Path, new: Path) -> Any:
    """``value`` (JSON-able) with every mention of ``old``'s real path replaced by ``new``'s:
    a venv renamed into place holds the same files under another name."""
    text = json.dumps(value).replace(os.path.realpath(old), os.path.realpath(new))
    return json_value(text)


def require(pin: Pin, target: Target, venv: Path, *, log: Path | None = None) -> Identity:
    ident = check(pin, target, venv, log=log)
    if not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(venv),
                               hint="`build_oracle -- --rebuild` replaces a drifted oracle")
    return ident
