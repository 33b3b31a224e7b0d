"""Facts about this tool and this host, for records."""

from __future__ import annotations

import datetime as dt
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from oracle_build import __version__

REPO = Path(__file__).resolve().parent.parent


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def tool_commit() -> str | None:
    if not (REPO / ".git").exists():
        return None
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--",
                            "oracle_build"], capture_output=True, text=True, check=False)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def tool_facts() -> dict[str, Any]:
    return {"name": "oracle-build", "version": __version__, "git_commit": tool_commit(),
            "python": sys.version.split()[0]}


def nvcc_version(cuda_home: str | None) -> str | None:
    exe = shutil.which("nvcc")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        exe = str(Path(cuda_home) / "bin" / "nvcc")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"release (\d+\.\d+)", out.stdout)
    return m.group(1) if m else None


def host_facts(cuda_home: str | None = None) -> dict[str, Any]:
    from oracle_build.targets import detect_host

    host = detect_host()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "machine": host.machine,
        "kernel": platform.release(),
        "libc": "-".join(platform.libc_ver()),
        "cpu_count": __import__("os").cpu_count(),
        "mem_total_bytes": host.mem_total_bytes,
        "mem_available_bytes": host.mem_available_bytes,
        "gpus": [g.__dict__ for g in host.gpus],
        "driver": host.gpus[0].driver if host.gpus else None,
        "nvcc": nvcc_version(cuda_home),
        "compiler": _first_line(["cc", "--version"]),
    }
