"""The engine host: the oracle's python running ``inside/driver.py --serve``. It imports vLLM
once, writes the identity probe's facts, and waits: the harness compares those facts with the
pin and then hands it at most one engine request, or closes it (the oracle was refused).
It needs only the oracle's venv, so opening an oracle (``oracle/opening.py``) can probe its
identity inside the process that will run the engine."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oracle_build.core import env as envmod
from oracle_build.core import proc
from oracle_build.core.files import json_value
from oracle_build.oracle.venv import INSIDE, RUN_FLAGS, Answer, OracleVenv, arrays_beside


class EngineHost:
    """A driver started with ``--serve``: identity facts first (vLLM imported once), then
    at most one engine run, or none (``close``: the harness refused the oracle)."""

    def __init__(self, venv: OracleVenv, live: proc.Live,
                 folder: tempfile.TemporaryDirectory[str], log: Path) -> None:
        self.venv, self.live, self.folder, self.log = venv, live, folder, log
        self.used = False

    @property
    def _dir(self) -> Path:
        return Path(self.folder.name)

    def facts(self, timeout: float = 600) -> dict[str, Any] | None:
        """The probe's facts once written; None when the host ended without them."""
        path = self._dir / "facts.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if not self.live.alive() or time.monotonic() > deadline:
                self.close()
                return None
            time.sleep(0.05)
        data: dict[str, Any] = json_value(path.read_text())
        return data

    def run(self, request: Any) -> Answer:
        """Hand the host its one request; wait for its answer."""
        if self.used:
            raise RuntimeError("an engine host runs one request")
        self.used = True
        req, out = self._dir / "request.json", self._dir / "answer.json"
        req.write_text(json.dumps(request))
        try:
            self.live.send(f"run {req.name} {out.name}")  # the host runs in this folder
            result = self.live.finish(check=False)
            data = json_value(out.read_text()) if out.exists() else None
            return Answer(data, result, arrays_beside(self._dir, data))
        finally:
            self.folder.cleanup()

    def close(self) -> None:
        """No engine after all: the host exits on end of input."""
        self.used = True
        try:
            self.live.stop()
        finally:
            self.folder.cleanup()


DRIVER_PREFIX = "oracle-driver-"


def sweep_dead_hosts(root: Path | None = None) -> list[Path]:
    """The folders of engine hosts whose harness died without cleaning up (killed outright:
    SIGKILL, the OOM killer): each named for its harness's pid, removed once that process is
    gone, with whatever still works in it (a host, vLLM's engine core) ended first."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    for folder in sorted(root.glob(f"{DRIVER_PREFIX}*-*")):
        head = folder.name[len(DRIVER_PREFIX):].split("-", 1)[0]
        if not head.isdigit() or not folder.is_dir() or folder.is_symlink():
            continue
        try:
            if folder.lstat().st_uid != os.getuid():
                continue
            os.kill(int(head), 0)
            continue  # its harness is alive (or its pid was reused): not ours to judge
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        proc.end_leftovers(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def serve(venv: OracleVenv, probe_args: Sequence[str], *, env: Mapping[str, str] | None,
          log: Path) -> EngineHost:
    """Start ``venv``'s engine host (``driver.py --serve``): it probes its own identity first
    and then waits; ``EngineHost.facts`` returns what it found."""
    venv.require()
    sweep_dead_hosts()
    folder = tempfile.TemporaryDirectory(prefix=f"{DRIVER_PREFIX}{os.getpid()}-")
    facts = Path(folder.name) / "facts.json"
    try:
        live = proc.Live([str(venv.python), *RUN_FLAGS, str(INSIDE / "driver.py"), "--serve",
                          str(facts), *probe_args],
                         env=envmod.oracle_env(env), cwd=Path(folder.name), log=log,
                         what="vLLM engine host", stdin=True,
                         closed=proc.oracle_network()[0])
    except BaseException:
        folder.cleanup()
        raise
    return EngineHost(venv, live, folder, log)
