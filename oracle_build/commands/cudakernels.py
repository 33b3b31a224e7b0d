"""cuda-kernels: real CUDA units of vLLM compiled here without a GPU, through the toolkit
lock, the nvcc launcher and the compiler cache, in two fresh homes (recipe/cuda/units.py)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from oracle_build.commands.common import Subparsers
from oracle_build.core.errors import EXIT_NOT_REPRODUCED, EXIT_OK, OutputFailed
from oracle_build.core.files import atomic_write_json
from oracle_build.core.layout import default_home, default_wheelhouse
from oracle_build.core.log import emit, fmt_seconds, say

DEFAULT_SPEC = Path("pins/kernels/cuda-source.toml")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "cuda-kernels", help="compile real vLLM CUDA units for the CUDA targets, no GPU "
        "needed: same bytes in two homes, a second home from the cache",
        description="Compile the CUDA units a spec names (default pins/kernels/cuda-source.toml: "
        "three of vLLM 0.32.0's _C_stable_libtorch units) for each CUDA target of its pin "
        "(sm_121, sm_110), with the flags vLLM's own CMake gives them (its cmake/utils.cmake "
        "functions, called by a CMake project of ours), with the toolkit of the targets' lock "
        "(NVIDIA's wheels by sha256, unpacked into each home), through ccache -> oracle-"
        "build's nvcc launcher -> nvcc, in two fresh homes sharing one compiler cache. "
        "Prints one row an object (unit, arch, seconds, sha256, the same in both homes, cache "
        "hit) and checks each object's sm_XX code with cuobjdump against the target. Exit 0 "
        "when every object has one sha256 in both homes and the second home's compiles hit "
        "the cache for at least 90%; 19 when not; 5 when a compile or the sm_XX check fails.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC,
                   help="the units' spec (default %(default)s)")
    p.add_argument("--out", type=Path, help="leave the objects as DIR/<home>/<arch>/<unit>.o "
                   "beside DIR/report.json (default: nothing is left)")
    p.add_argument("--work", type=Path, help="the folder the two homes and the compiler "
                   "cache are made in (default: a temporary folder, removed after); it must "
                   "not exist")
    p.add_argument("--downloads", type=Path, help="where the sdist and the wheels are taken "
                   "by sha256, fetched when absent (default: <wheelhouse>/toolkits, where a "
                   "build keeps its toolkit's wheels; env ORACLE_BUILD_WHEELHOUSE)")
    p.add_argument("--plain-nvcc", action="store_true",
                   help="the control: compile through ccache -> nvcc with no launcher "
                   "between, as a build without oracle-build's launcher does (expect exit "
                   "19: nvcc's process id and folders in the objects)")
    p.set_defaults(func=run_cuda_kernels)


def run_cuda_kernels(args: argparse.Namespace) -> int:
    from oracle_build.recipe.cuda import units as cudaunits

    if args.work is not None and args.work.exists():
        raise OutputFailed(f"--work {args.work} exists: the homes must be fresh",
                           hint="name a folder that does not exist yet")
    if args.out is not None and (args.out / "report.json").exists():
        raise OutputFailed(f"{args.out / 'report.json'} exists: refusing to mix two runs",
                           hint="name another --out, or remove that folder")
    work = (args.work.resolve() if args.work else
            Path(tempfile.mkdtemp(prefix="oracle-build-cuda-kernels-", dir="/var/tmp")))
    work.mkdir(parents=True, exist_ok=True)
    # the toolkit's wheels where a build's toolkit step keeps them (<wheelhouse>/toolkits),
    # beside the CUDA torch wheel and the sdist the units come from
    downloads = (args.downloads or default_wheelhouse(default_home()) / "toolkits").resolve()
    out = (args.out.resolve() if args.out else work / "objects")
    try:
        outcome = cudaunits.run(args.spec.resolve(), work=work, out=out, downloads=downloads,
                                cache_folder=work / "ccache", plain_nvcc=args.plain_nvcc)
        _render(outcome)
        if args.out is not None:
            data = outcome.report.as_dict()
            data["same_in_both_homes"] = outcome.same_bytes
            data["second_home_cache_hits"] = round(outcome.second_home_hits, 3)
            atomic_write_json(out / "report.json", data, overwrite=False)
            say(f"cuda-kernels: objects and report.json in {out}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return EXIT_OK if outcome.same_bytes and \
        outcome.second_home_hits >= cudaunits.SECOND_HOME_HITS else EXIT_NOT_REPRODUCED


def _render(outcome: object) -> None:
    from oracle_build.recipe.cuda.units import LEGS, SECOND_HOME_HITS, Outcome

    assert isinstance(outcome, Outcome)
    r = outcome.report
    by: dict[tuple[str, str], set[str]] = {}
    for e in r.entries:
        by.setdefault((e.unit, e.arch), set()).add(e.sha256)
    chain = "PLAIN nvcc, no launcher (the control)" if r.plain_nvcc else \
        "ccache -> launcher -> nvcc"
    emit(f"cuda-kernels: {r.pin}, {chain}, toolkit {r.toolkit['lock']} "
          f"(nvcc V{r.toolkit['version']}, tools {r.toolkit['digest'][:12]}), launcher "
          f"{r.launcher_sha256[:12]}")
    emit(f"vLLM's CMake: CUDA_SUPPORTED_ARCHS {r.tree['cuda_supported_archs']} "
          f"({r.tree['cuda_supported_archs_line']}); definitions "
          f"{' '.join(r.tree['definitions'])}")
    emit(f"{'unit':<28} {'arch':<7} {'nvcc':<5} {'leg':<13} {'seconds':>8}  "
          f"{'sha256':<16} {'same':<5} {'cache':<10} sm")
    for e in r.entries:
        same = "yes" if len(by[(e.unit, e.arch)]) == 1 else "NO"
        emit(f"{e.unit:<28} {e.arch:<7} {e.nvcc_arch:<5} {e.leg:<13} "
              f"{fmt_seconds(e.seconds):>8}  {e.sha256[:16]} {same:<5} {e.cache:<10} "
              f"{','.join(e.sm)}")
    n = sum(1 for e in r.entries if e.leg == LEGS[1][0])
    emit(f"cache: {LEGS[1][0]} took {round(outcome.second_home_hits * n)}/{n} compiles from it "
          f"(goal {SECOND_HOME_HITS:.0%}); one sha256 an object across "
          f"{', '.join(leg for leg, _, _ in LEGS)}: {'yes' if outcome.same_bytes else 'NO'}")
