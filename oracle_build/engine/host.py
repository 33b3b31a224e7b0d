"""The engine host: the oracle's python running ``inside/driver.py --serve``. It imports vLLM
once, writes the identity probe's facts, and waits: the harness compares those facts with the
pin and then hands it at most one engine request, or closes it (the oracle was refused).
It needs only the oracle's venv, so opening an oracle (``oracle/opening.py``) can probe its
identity inside the process that will run the engine."""

from __future__ import annotations

import json
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


def serve(venv: OracleVenv, probe_args: Sequence[str], *, env: Mapping[str, str] | None,
          log: Path) -> EngineHost:
    """Start ``venv``'s engine host (``driver.py --serve``): it probes its own identity first
    and then waits; ``EngineHost.facts`` returns what it found."""
    venv.require()
    folder = tempfile.TemporaryDirectory(prefix="oracle-driver-")
    facts = Path(folder.name) / "facts.json"
    try:
        live = proc.Live([str(venv.python), *RUN_FLAGS, str(INSIDE / "driver.py"), "--serve",
                          str(facts), *probe_args],
                         env=envmod.oracle_env(env), cwd=Path(folder.name), log=log,
                         what="vLLM engine host", stdin=True)
    except BaseException:
        folder.cleanup()
        raise
    return EngineHost(venv, live, folder, log)
