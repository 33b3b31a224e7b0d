"""The fifth hostile reading of main (issue 65): each case as a user with a hostile PATH,
golden, toolkit wheel or migration folder would hit it, against the real thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracle_build import recipe
from oracle_build.cli import main
from oracle_build.core.errors import EXIT_REFUSED, Refused
from tests.srcpkg import make_cuda_sdist, write_cuda_sdist_pin

LOCK = Path(__file__).resolve().parent.parent / "pins" / "toolkits" / "cuda-13.0.3.toml"


@pytest.fixture(scope="module")
def cuda_sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The small CUDA package's sdist and its pin (tests/srcpkg.py)."""
    s = make_cuda_sdist(tmp_path_factory.mktemp("cuda-sdist"))
    return write_cuda_sdist_pin(s, LOCK), s.externals


def test_stop_after_builds_with_every_flag_the_whole_build_takes(
        tmp_path: Path, cuda_sdist: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Item 3: `build --no-gpu --stop-after venv` on a CUDA pin, on this host with no NVIDIA
    driver: it stops after the step, as asked (it stopped at preflight, exit 6, "no NVIDIA
    driver answers", with a hint to pass the flag it was given). Without --no-gpu it is
    refused at preflight, as the whole build is."""
    pin, externals = cuda_sdist
    args = ["build", "--pin", str(pin), "--target", "sm_121", "--externals", str(externals),
            "--home", str(tmp_path / "h"), "--stop-after", "venv"]
    assert main(args) == 6
    assert "--no-gpu" in capsys.readouterr().err
    assert main([*args, "--no-gpu"]) == 0
    err = capsys.readouterr().err
    assert "stopped after venv" in err and "no NVIDIA driver" not in err


@pytest.mark.parametrize(("flag", "option", "value"), [
    ("--no-gpu", "no_gpu", True),
    ("--no-compiler-cache", "compiler_cache", False),
    ("--mirror=/srv/vllm.git", "mirror", "/srv/vllm.git"),
    ("--externals=/srv/externals", "externals_dir", Path("/srv/externals")),
    ("--checkout=/srv/checkout", "checkout", Path("/srv/checkout")),
])
def test_every_flag_that_changes_the_plan_reaches_each_way_a_build_is_planned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda_sdist: tuple[Path, Path],
        flag: str, option: str, value: Any) -> None:
    """Item 3, by construction: the dry run, a build stopped after a step and the whole
    build are planned from one resolution of the flags (recipe.PlanOptions). Each flag that
    changes the plan reaches recipe.plan on all three paths (the planner is stopped there,
    exit 8: what it was asked is the point)."""
    seen: list[dict[str, Any]] = []

    def plan(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise Refused("planned")

    monkeypatch.setattr(recipe, "plan", plan)
    pin, _externals = cuda_sdist
    base = ["build", "--pin", str(pin), "--target", "sm_121", "--home", str(tmp_path / "h"),
            "--no-gpu", flag]
    for more in (["--dry-run"], ["--stop-after", "venv"], ["--rebuild"]):
        assert main([*base, *more]) == EXIT_REFUSED
    assert len(seen) == 3
    for kwargs in seen:
        assert kwargs[option] == value, (flag, kwargs)
