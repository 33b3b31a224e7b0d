"""The oracle a command runs on, opened with its identity checked: the venv at its pin's
key, its record and anchor, every file's hash while the engine host imports vLLM (for
commands that start an engine); several oracles held open by one command (``Oracles``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from oracle_build import devices, host
from oracle_build.contracts.pins import Pin
from oracle_build.contracts.targets import Target
from oracle_build.core import layout
from oracle_build.core.errors import (
    IdentityMismatch,
    OracleMissing,
)
from oracle_build.core.files import sha256_file
from oracle_build.core.log import say
from oracle_build.engine import compiler as runtime
from oracle_build.engine.caches import CompileCache
from oracle_build.engine.compiler import RuntimeCompiler
from oracle_build.engine.host import EngineHost, serve
from oracle_build.oracle import identity, inventory
from oracle_build.oracle.venv import OracleVenv


@dataclass(frozen=True)
class Oracle:
    pin: Pin
    target_name: str
    target: Target
    venv: OracleVenv
    identity: identity.Identity
    build_record_sha256: str
    content_fingerprint: str | None
    # the engine host whose probe gave ``identity``, waiting for the first engine run
    hosts: list[EngineHost] = field(default_factory=list, compare=False)
    # the CPU kernel variant every process of this oracle runs under (devices.hold)
    hold: devices.Hold = devices.NO_HOLD
    # a capture spec's [env]: what its engines' environment holds beyond the tool's
    spec_env: dict[str, str] = field(default_factory=dict)
    # the compiler its engines compile their run-time kernels with (engine/compiler.py)
    compiler: RuntimeCompiler | None = field(default=None, compare=False)

    def compile_cache(self, home: Path) -> CompileCache:
        """Its engines' compile cache: the pin's, this run-time compiler's folder of it."""
        return CompileCache.of(home, self.pin.key,
                               self.compiler.fingerprint if self.compiler else None)

    def take_host(self) -> EngineHost | None:
        return self.hosts.pop() if self.hosts else None


def engine_env(target: Target, hold: devices.Hold, caches: CompileCache,
               spec_env: Mapping[str, str] | None = None,
               compiler: RuntimeCompiler | None = None) -> dict[str, str]:
    """What the tool sets for every engine of this target (in-process engine core), held to
    ``hold``'s kernel variant, compiling into ``caches`` with ``compiler``, with a capture
    spec's [env] (checked when the spec was read: it cannot set what follows it here);
    core.env's oracle_env adds the few variables of the caller's that pass."""
    return {**target.env, **(spec_env or {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            **hold.env, **(compiler.env() if compiler else {}), **caches.env()}


def open_oracle(pin: Pin, target_name: str, home: Path, *, require: bool = True,
                engine_log: Path | None = None, deep: bool = True,
                variant: str | None = None,
                spec_env: Mapping[str, str] | None = None) -> Oracle:
    """The pin's built oracle with its identity re-checked. ``require``: refuse one that is
    not the pin's (IdentityMismatch); otherwise the caller reads ``identity.ok``.

    ``engine_log``: an engine will run, so the identity probe runs inside the engine host
    (driver.py --serve, logging there): it imports vLLM once for both, and starts no engine
    until the harness has compared its facts with the pin and hands it a request.
    ``deep``: every file hashed (every engine-running command's check; without an engine
    host, alone). ``variant``: the CPU kernel variant its processes are held to (a golden's,
    ``--kernel-variant``; default: the pin target's)."""
    venv = OracleVenv(layout.oracle_path(home, pin.key))
    if not venv.exists():
        raise OracleMissing(f"no oracle for pin {pin.id} at {venv.path}",
                            hint="run `nox -s build_oracle` first")
    target = pin.target(target_name)
    hold = host.hold(target, variant)
    say(f"checking oracle identity: {venv.path}"
        + (f" (CPU kernel variant {hold.variant}, held)" if hold.inside else ""))
    compiler = runtime.choose(target, hold)
    hosts: list[EngineHost] = []
    if engine_log is not None:
        caches = CompileCache.of(home, pin.key, compiler.fingerprint)
        caches.recover_before_start()
        engine_host = serve(venv, identity.probe_args(target),
                            env=engine_env(target, hold, caches, spec_env, compiler),
                            log=engine_log)
        # every file hashed (not only those whose size or mtime moved: both can be put back)
        # while the host imports vLLM; no engine starts before the hashes agree
        try:
            files = deep_files(venv.path)
            facts = engine_host.facts()
        except BaseException:
            engine_host.close()
            raise
        ident = identity.check(pin, target, venv.path, facts=facts, files=files, hold=hold) \
            if facts is not None else identity.check(pin, target, venv.path, deep=True,
                                                     hold=hold)
        if ident.ok and facts is not None:
            hosts.append(engine_host)
        else:
            engine_host.close()
    else:  # identity.check hashes while its probe imports vLLM
        ident = identity.check(pin, target, venv.path, deep=deep, hold=hold)
    if require and not ident.ok:
        raise IdentityMismatch(ident.mismatches, where=str(venv.path),
                               hint="`build_oracle -- --rebuild` replaces a drifted oracle")
    digest = sha256_file(venv.record_path) if venv.has_record() else ""
    anchor = inventory.read_anchor(venv.path) or {}
    ident.runtime_compiler = compiler.line()
    return Oracle(pin, target_name, target, venv, ident, digest,
                  anchor.get("content_fingerprint"), hosts, hold, dict(spec_env or {}),
                  compiler)


def deep_files(venv: Path) -> inventory.Check | None:
    """Every file of the venv hashed against its anchored manifest; None when the manifest
    cannot be read (identity.check then says why)."""
    recorded, problems = inventory.load(venv)
    if recorded is None or problems:
        return None
    say(f"    hashing every file of the oracle ({len(recorded['files'])}) while its python "
        "imports vLLM for the identity probe")
    return inventory.check(venv, recorded, deep=True)


@dataclass
class Oracles:
    """The oracles one command uses, each opened (identity checked) once. ``engine``:
    (what, name) of the engine runs to come: each oracle's identity is then probed inside
    its engine host (see ``open_oracle``). ``close`` ends hosts no engine run took."""

    home: Path
    opened: dict[tuple[str, str, str | None, tuple[tuple[str, str], ...]], Oracle] = field(
        default_factory=dict)
    engine: tuple[str, str] | None = None

    def close(self) -> None:
        for oracle in self.opened.values():
            while (engine_host := oracle.take_host()) is not None:
                engine_host.close()

    def __enter__(self) -> Oracles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, pin: Pin, target_name: str, *, require: bool = True,
            variant: str | None = None, spec_env: Mapping[str, str] | None = None) -> Oracle:
        """``variant``: the CPU kernel variant its processes are held to (default: the pin
        target's); ``spec_env``: a capture spec's [env]. Each variant and env is its own
        opened oracle (its own identity proof, its own engine host)."""
        key = (pin.key, target_name, devices.held_name(pin.target(target_name), variant),
               tuple(sorted((spec_env or {}).items())))
        if key not in self.opened:
            log = layout.log_path(self.home, *self.engine) if self.engine else None
            self.opened[key] = open_oracle(pin, target_name, self.home, require=False,
                                           engine_log=log, variant=variant,
                                           spec_env=spec_env)
        oracle = self.opened[key]
        if require and not oracle.identity.ok:
            raise IdentityMismatch(oracle.identity.mismatches, where=str(oracle.venv.path),
                                   hint="`build_oracle -- --rebuild` replaces a drifted "
                                   "oracle")
        return oracle


@contextmanager
def opened(home: Path, given: Oracles | None, *,
           engine_for: tuple[str, str] | None) -> Iterator[Oracles]:
    """The caller's Oracles, or one of its own for a command whose engines will run
    (``engine_for``: what and name of the first engine log) whose unused engine hosts are
    ended on the way out."""
    if given is not None:
        yield given
        return
    with Oracles(home, engine=engine_for) as oracles:
        yield oracles
