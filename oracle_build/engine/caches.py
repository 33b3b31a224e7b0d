"""The engine's compile caches: one folder per oracle (``layout.compile_cache``) that the
engine's process compiles into (torch inductor's kernels and precompiled headers, vLLM's
compile cache, Triton's), instead of the host's shared ``/tmp/torchinductor_<user>``.

Why the tool owns them: a compile killed mid-write leaves a file that looks cached (an
empty ``.main.so`` from a linker killed as it opened its output) and every later engine
start on the host loads it and fails (``ImportError: ... file too short``), whoever started
it. So every engine run holds its cache's lock and a journal beside it for as long as it
runs; the journal goes only when the engine answered ``ok``. A journal found by the next
run means the last one was killed, crashed, or failed: the cache is deleted before the
engine starts, and that start compiles from nothing (about 16 s more here).

The driver receives the folder in ``INSIDE_VARIABLE`` and points the caches' own variables
below it, unless the caller set them (then the caller owns that cache); ``TMPDIR`` always,
since inductor keeps its precompiled headers (150 MB each, one per oracle path and set of
flags: 17 of them, 2.6 GB, from one test run) in the temporary folder whatever its cache
variable says. Where a cache lives changes no arithmetic: the tool's paths are not
recorded in goldens."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from oracle_build.core import layout
from oracle_build.core.errors import BadInput, OutputFailed, Refused, as_data
from oracle_build.core.filelock import held
from oracle_build.core.files import json_value, open_for_writing, read_bytes
from oracle_build.core.log import say

# read by inside/driver.py (it imports nothing from here): the folder the caches go under,
# and each cache's variable and its folder below it (the driver holds the same table, and
# sets TMPDIR even over the caller's; a test keeps the two tables equal)
INSIDE_VARIABLE = "ORACLE_BUILD_INSIDE_COMPILE_CACHE"
VARIABLES = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("VLLM_CACHE_ROOT", "vllm"),
             ("TRITON_CACHE_DIR", "triton"), ("TMPDIR", "tmp"))


@dataclass
class Use:
    """One engine run on a compile cache: ``clean`` once the engine answered ok."""

    clean: bool = False


@dataclass(frozen=True)
class CompileCache:
    root: Path

    @classmethod
    def of(cls, home: Path, pin_key: str, compiler: str | None = None) -> CompileCache:
        """The pin's compile cache; ``compiler``: the run-time compiler's fingerprint
        (engine/compiler.py), whose own folder it is: kernels another compiler built are
        never reused."""
        return cls.of_pin(layout.compile_cache(home, pin_key), compiler)

    @classmethod
    def of_pin(cls, pin_cache: Path, compiler: str | None = None) -> CompileCache:
        """The cache of the run-time compiler ``compiler`` (its fingerprint) in a pin's
        compile-cache folder."""
        return cls(pin_cache / f"cxx-{compiler[:16]}" if compiler else pin_cache)

    @property
    def lock(self) -> Path:
        return self.root.parent / f"{self.root.name}.lock"

    @property
    def journal(self) -> Path:
        """Present while an engine runs on this cache, and after one that did not finish."""
        return self.root.parent / f"{self.root.name}.running.json"

    def env(self) -> dict[str, str]:
        """For a driver: it sets ``variables()`` itself, after recording the environment.
        Its HOME is the cache's own (made: nothing of the caller's ~/.config or ~/.cache
        reaches the engine)."""
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        return {INSIDE_VARIABLE: str(self.root), "HOME": str(home)}

    def variables(self) -> dict[str, str]:
        """The caches' own variables, for a process that is not the driver (a benchmark's
        bare engine run): its folders are made here, as the driver makes them."""
        out = {name: self.root / sub for name, sub in VARIABLES}
        for path in out.values():
            path.mkdir(parents=True, exist_ok=True)
        return {name: str(path) for name, path in out.items()}

    @contextmanager
    def in_use(self, what: str) -> Iterator[Use]:
        """Hold the cache for one engine run: discard what an unfinished run left, journal
        this one, and drop the journal only when ``Use.clean`` was set."""
        with held(self.lock, what="the engine's compile cache"):
            self.recover()
            entry = {"pid": os.getpid(), "started": layout.utc_now(), "what": what}
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                tmp = self.journal.with_name(self.journal.name + f".{os.getpid()}.tmp")
                with open_for_writing(tmp, text=True) as fh:
                    fh.write(json.dumps(entry))
                os.replace(tmp, self.journal)
            except OSError as exc:
                raise OutputFailed(f"cannot write the compile cache's journal "
                                   f"{as_data(str(self.journal))}: {exc.strerror or exc}",
                                   hint="a home (or ORACLE_BUILD_COMPILE_CACHE) the tool "
                                   "can write") from None
            use = Use()
            try:
                yield use
            finally:
                if use.clean:
                    self.journal.unlink(missing_ok=True)
                else:
                    say(f"    the engine did not finish cleanly: the next engine start "
                        f"discards its compile cache ({self.root})")

    def recover_before_start(self) -> None:
        """Before an engine host starts (its variables point into this cache): discard what
        an unfinished run left, unless an engine holds the cache right now (then ``in_use``
        finds the journal that engine may leave)."""
        try:
            with held(self.lock, what="the engine's compile cache", wait=False):
                self.recover()
        except Refused:
            pass

    def recover(self) -> bool:
        """Under the lock: a journal means the last engine on this cache did not finish,
        so its files cannot be trusted. Delete the cache, then the journal (a kill in
        between leaves the journal, and the next run deletes what is left), and make its
        folders again (an engine host started before the lock was taken already points at
        them: a ``TMPDIR`` that is gone fails its next temporary file). True when something
        was discarded."""
        if not self.journal.exists():
            return False
        say(f"    the last engine run on this compile cache ({self._describe()}) did not "
            "finish: a compile killed mid-write leaves files that fail every later start; "
            f"discarding {self.root} (this start compiles from nothing)")
        try:
            if self.root.exists():
                shutil.rmtree(self.root)
            self.journal.unlink()
            self.variables()  # the folders again, empty
            (self.root / "home").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputFailed(f"cannot discard the compile cache {as_data(str(self.root))}: "
                               f"{exc.strerror or exc}",
                               hint=f"delete {self.root} and {self.journal.name} beside it "
                               "by hand") from None
        return True

    def _describe(self) -> str:
        """The journal's own words (it is the tool's file, but read as data: any text)."""
        try:  # a regular file only: a FIFO in its place would block every later run
            data = json_value(read_bytes(self.journal).decode(errors="replace"))
        except (OSError, ValueError, BadInput):
            return "journal unreadable"
        if not isinstance(data, dict):
            return "journal unreadable"
        return ", ".join(f"{k} {as_data(str(data.get(k)), 80)}"
                         for k in ("what", "pid", "started") if k in data) or "no details"
