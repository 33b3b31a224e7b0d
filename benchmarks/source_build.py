"""A source oracle's build against its floor, and a rebuild through the compiler cache against
the cold build, measured in one run on this machine.

    python benchmarks/source_build.py --externals ../shared/externals          # vLLM: ~2 hours
    python benchmarks/source_build.py --quick                                    # CI: seconds
    python benchmarks/source_build.py --externals ../shared/externals --units \
        csrc/cpu/utils.cpp:_C.dir src/common/bfloat16.cpp                       # minutes

Three timings, each in a fresh home:
  floor  the bare build: the same source, patches, externals, torch and build requirements
         prepared by the tool's own steps (not timed), then only what a build by hand would
         run, timed: the plan's `pip wheel --no-build-isolation` command with the plan's
         flags and no compiler launcher, and the offline install of the wheel and the lock
  cold   `oracle-build build` into an empty compiler cache (nothing to reuse: every object
         compiled; the cache filled as it goes), the whole command
  warm   `oracle-build build` in another home at another path, the same compiler cache
         (a reimaged host that kept its cache, a second checkout, a --rebuild)
and the ratios cold / floor (target: at most 1.05, the compile is the limit) and warm / cold
(target: a tenth). Each leg's compiled files (the ELF files the built distribution's wheel
installs) are hashed and compared across the legs: cold and warm are two builds of one pin in
two homes at paths of different lengths, at different times (issue 44: the same bytes); the
floor, with no compiler launcher, sees absolute source paths (for timing, not for bytes).
--cache DIR keeps the cold leg's compiler cache (absent or empty at the start) for later
builds, instead of a throwaway one. --quick runs the small package of tests/srcpkg.py as an
sdist through the same code paths. Without --quick: pins/cpu-source.toml (an hour for each of
floor and cold). --units FILE[:TEXT]... measures instead what the compiler cache costs on a
miss, unit by unit: the tree configured as the floor's is, then each named compile as Ninja
runs it, bare and through ccache into an empty cache, alternating, paired.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import fmt  # noqa: E402
from oracle_build.contracts.pins import load_pin  # noqa: E402
from oracle_build.core import layout, proc  # noqa: E402
from oracle_build.core.log import Steps  # noqa: E402
from oracle_build.oracle.inventory import compiled_files  # noqa: E402
from oracle_build.recipe.model import BuildState, Plan  # noqa: E402
from oracle_build.recipe.plan import plan as make_plan  # noqa: E402

Compiled = dict[str, str]


def built(pin: Path, home: Path) -> Compiled:
    """The compiled files of the oracle a build left in ``home``."""
    p = load_pin(pin)
    return compiled_files(layout.oracle_path(home, p.key), p.model.vllm.distribution)


def scratch_wheelhouse(source: Path | None, dest: Path) -> Path | None:
    """A leg's own wheelhouse: ``source``'s downloads and source archives hard-linked in, and
    no wheel a build made (the plan then compiles; a wheelhouse holding the pin's built wheel
    plans no wheel step at all, and the next leg would reuse the last one's)."""
    if source is None:
        return None
    for folder in sorted(p for p in source.iterdir() if p.is_dir()) if source.is_dir() else []:
        manifest = folder / "manifest.json"
        data = json.loads(manifest.read_text()) if manifest.is_file() else None
        built = {name for name, info in ((data or {}).get("wheels") or {}).items()
                 if isinstance(info, dict) and info.get("origin") == "built"}
        for item in folder.rglob("*"):
            rel = item.relative_to(folder)
            if not item.is_file() or rel.parts[0] in ("rejected",) or str(rel) in built \
                    or rel.name == "manifest.json":
                continue
            target = dest / folder.name / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(item, target)
        if data is not None:
            data["wheels"] = {k: v for k, v in data["wheels"].items() if k not in built}
            (dest / folder.name).mkdir(parents=True, exist_ok=True)
            (dest / folder.name / "manifest.json").write_text(json.dumps(data, indent=2))
    return dest


@dataclass
class Leg:
    """One timed leg: its wall time, the CPU time its processes used (user and system, every
    descendant waited for), and the time this virtual machine's CPUs were taken by its host
    while it ran (``steal`` in /proc/stat: when it grows, the wall time says more about the
    neighbours than about the build)."""

    wall: float
    cpu: float
    steal: float


def _steal() -> float:
    """The machine's CPU time stolen so far, in seconds (0 where /proc/stat does not say)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" else 0.0
    except (OSError, IndexError, ValueError):
        return 0.0


class Meter:
    """Measures a leg: ``with Meter() as m: ...`` then ``m.leg``."""

    def __enter__(self) -> Meter:
        self._t, self._s = time.monotonic(), _steal()
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._c = r.ru_utime + r.ru_stime
        return self

    def __exit__(self, *exc: object) -> None:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.leg = Leg(time.monotonic() - self._t, r.ru_utime + r.ru_stime - self._c,
                       _steal() - self._s)


def timed_build(pin: Path, home: Path, cache: Path, externals: Path | None,
                wheelhouse: Path | None) -> Leg:
    env = {**os.environ, "ORACLE_BUILD_COMPILER_CACHE": str(cache)}
    if wheelhouse is not None:
        env["ORACLE_BUILD_WHEELHOUSE"] = str(wheelhouse)
    argv = [sys.executable, "-m", "oracle_build", "build", "--pin", str(pin), "--home",
            str(home)]
    if externals is not None:
        argv += ["--externals", str(externals)]
    with Meter() as m:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True,
                              text=True, check=False)
    if done.returncode != 0 or "ORACLE_IDENTITY_OK" not in done.stdout:
        raise SystemExit(f"build of {pin} in {home} exited {done.returncode}:\n"
                         f"{done.stderr[-3000:]}")
    return m.leg


@dataclass
class Prepared:
    plan: Plan
    state: BuildState
    wheel: proc.Cmd  # the plan's wheel command
    env: dict[str, str]  # its environment without the compiler launcher, the cache disabled
    cache_env: dict[str, str]  # the plan's CCACHE_* settings


def prepare(pin_path: Path, home: Path, externals: Path | None, wheelhouse: Path | None,
            label: str) -> Prepared:
    """The tool's own steps up to the wheel (not timed), and the plan's wheel command as a
    person would run it: no compiler launcher, ccache off (setup.py adds `ccache` itself
    when it finds one), the plan's flags (the path map among them) kept."""
    pin = load_pin(pin_path)
    target = next(iter(pin.model.targets))
    p = make_plan(pin, target, home=home, wheelhouse_root=wheelhouse or home / "wheelhouse",
                  externals_dir=externals, compiler_cache=False)
    names = [s.name for s in p.steps]
    p.staging.mkdir(parents=True)
    p.log.write_text(f"# benchmarks/source_build.py: {label}\n")
    state = BuildState(p, Steps(len(p.steps)))
    for step in p.steps[:names.index("wheel")]:
        with state.steps.step(step.name):
            step.action(state, step)
    wheel_cmd = p.steps[names.index("wheel")].commands[0]
    full = wheel_cmd.environment()
    env = {k: v for k, v in full.items() if not k.startswith("CCACHE_")}
    env["CMAKE_ARGS"] = " ".join(a for a in env.get("CMAKE_ARGS", "").split()
                                 if "_COMPILER_LAUNCHER=" not in a)
    env["CCACHE_DISABLE"] = "1"
    return Prepared(p, state, wheel_cmd, env,
                    {k: v for k, v in full.items() if k.startswith("CCACHE_")})


def floor(pin_path: Path, home: Path, externals: Path | None,
          wheelhouse: Path | None) -> tuple[Leg, Compiled]:
    """The tool's own steps prepare the staging folder up to the wheel (not timed); then the
    plan's wheel command without a compiler launcher and the plan's install commands, each
    run as a person would run them (timed)."""
    ready = prepare(pin_path, home, externals, wheelhouse, "floor")
    p, state, wheel_cmd, env = ready.plan, ready.state, ready.wheel, ready.env
    pin = p.pin
    names = [s.name for s in p.steps]
    with Meter() as m:
        proc.run(wheel_cmd.argv, env=env, log=p.log, what="pip wheel (floor)")
        for cmd in p.steps[names.index("install")].commands:
            if "-r" in cmd.argv:  # the lock's list, as the install step writes it
                from oracle_build.recipe.steps import write_lock_requirements

                write_lock_requirements(state, exclude={"vllm"})
            proc.run_cmd(cmd, log=p.log)
    compiled = compiled_files(p.staging_venv, pin.model.vllm.distribution)
    shutil.rmtree(p.staging, ignore_errors=True)
    return m.leg, compiled


def units(pin_path: Path, home: Path, externals: Path | None, wheelhouse: Path | None,
          names: list[str], rounds: int) -> list[tuple[str, list[float], list[float]]]:
    """The compiler cache's cost on a miss, per translation unit: the tool's own steps and the
    plan's wheel command (no launcher) up to CMake's configure; then each unit's compile as
    Ninja would run it (``ninja -t compdb``: -MD and its dependency file included, which
    ccache's depend mode keys on), bare and through ccache with the plan's settings into an
    empty cache, alternating, ``rounds`` times each. ``names``: a file name, optionally
    ``name:text`` to pick the command holding ``text`` (vLLM compiles a file once per ISA)."""
    import shlex

    from oracle_build.recipe.model import CONFIGURED

    ready = prepare(pin_path, home, externals, wheelhouse, "units")
    p, wheel_cmd, env, cache_env = ready.plan, ready.wheel, ready.env, ready.cache_env
    proc.Live(wheel_cmd.argv, env=env, log=p.log, stop_at=CONFIGURED).finish(check=False)
    (build,) = (p.staging / "src" / "build").glob("temp.*")
    compdb = json.loads(subprocess.run([str(p.staging_venv / "bin" / "ninja"), "-C", str(build),
                                        "-t", "compdb"], capture_output=True, text=True,
                                       check=True).stdout)
    ccache = shutil.which("ccache")
    if ccache is None:
        raise SystemExit("--units: no ccache on this host")
    out = []
    for want in names:
        name, _, text = want.partition(":")
        entry = next((e for e in compdb if e["file"].endswith(name) and text in e["command"]),
                     None)
        if entry is None:
            raise SystemExit(f"--units: no compile of {want} in {build}")
        argv = shlex.split(entry["command"])
        bare: list[float] = []
        cached: list[float] = []
        for r in range(rounds):
            for kind in ("bare", "ccache") if r % 2 == 0 else ("ccache", "bare"):
                run_env = dict(env)
                cmd = argv
                folder = Path(tempfile.mkdtemp(prefix="ccache-", dir=p.staging))
                if kind == "ccache":
                    run_env = {**env, **cache_env, "CCACHE_DIR": str(folder)}
                    del run_env["CCACHE_DISABLE"]
                    cmd = [ccache, *argv]
                with Meter() as m:
                    subprocess.run(cmd, cwd=entry["directory"], env=run_env, check=True,
                                   stdout=subprocess.DEVNULL)
                (cached if kind == "ccache" else bare).append(m.leg.wall)
                shutil.rmtree(folder, ignore_errors=True)
        out.append((want, bare, cached))
    shutil.rmtree(p.staging, ignore_errors=True)
    return out


def leg_done(leg: str, n: int, m: Leg) -> None:
    """Each leg's figures as soon as they are measured (a later leg that fails loses nothing)."""
    print(f"  round {n + 1} {leg}: {m.wall:.1f} s wall, {m.cpu:.1f} s CPU, {m.steal:.1f} s "
          "stolen", flush=True)


def compare(legs: dict[str, Compiled]) -> list[str]:
    """Lines saying, per compiled file, whether every leg gave the same bytes."""
    names = sorted({n for c in legs.values() for n in c})
    lines = []
    for name in names:
        got = {leg: c.get(name, "absent") for leg, c in legs.items()}
        same = len(set(got.values())) == 1
        short = name.rsplit("/site-packages/", 1)[-1]
        first = next(iter(got.values()))
        lines.append(f"    {short}: " + (
            f"same in {', '.join(got)} ({first[:16]})" if same
            else "DIFFERS: " + ", ".join(f"{leg} {h[:16]}" for leg, h in got.items())))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pin", default=str(REPO / "pins" / "cpu-source.toml"))
    ap.add_argument("--externals", help="the externals' local sources (--externals of build)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of floor, cold and warm (about an hour each for vLLM; the "
                    "order alternates: floor, cold, warm, then cold, warm, floor)")
    ap.add_argument("--wheelhouse", default=str(layout.default_wheelhouse(
        layout.default_home())), help="where the locked wheels and the source archive are "
        "kept between rounds (default: the default home's)")
    ap.add_argument("--cache", help="the cold leg's compiler cache, absent or empty, kept "
                    "afterwards (default: a throwaway one)")
    ap.add_argument("--quick", action="store_true",
                    help="the small package of tests/srcpkg.py as an sdist (CI)")
    ap.add_argument("--units", nargs="+", metavar="FILE[:TEXT]",
                    help="instead of the three legs: the compiler cache's cost on a miss for "
                    "these translation units (bare and through ccache, paired, --rounds 3 "
                    "by default), e.g. csrc/cpu/utils.cpp:_C.dir (with --quick: csrc/ops.c)")
    args = ap.parse_args(argv)
    legs: dict[str, list[Leg]] = {"floor": [], "cold": [], "warm": []}
    ratios: list[float] = []
    bytes_lines: list[str] = []
    kept = Path(args.cache).resolve() if args.cache else None
    if kept is not None and kept.exists() and any(kept.iterdir()):
        ap.error(f"--cache {kept}: not empty (the cold leg needs an empty compiler cache)")
    with tempfile.TemporaryDirectory(prefix="source-bench-") as tmp:
        root = Path(tmp)
        pin = Path(args.pin)
        externals = Path(args.externals).resolve() if args.externals else None
        wheelhouse: Path | None = Path(args.wheelhouse)
        if args.quick:
            from tests.srcpkg import make_sdist, write_sdist_pin

            sdist = make_sdist(root / "sdist")
            pin, externals, wheelhouse = write_sdist_pin(sdist), sdist.externals, None
        if args.units:
            per_unit = units(pin, root / "units", externals, scratch_wheelhouse(
                wheelhouse, root / "wh-units") if wheelhouse else None, args.units,
                max(args.rounds, 3))
            print(f"compiler cache on a miss, per unit ({max(args.rounds, 3)} rounds each, "
                  "alternating)")
            for want, bare, cached in per_unit:
                print(f"  {want}: bare {fmt(bare)}; ccache {fmt(cached)}; ccache / bare: "
                      f"{statistics.median(cached) / statistics.median(bare):.3f}x")
            return 0
        for n in range(args.rounds):
            floor_home = root / f"floor-{n}"
            cache = kept if kept is not None and n == 0 else root / f"ccache-{n}"
            cold, warm = root / f"cold-{n}", root / "elsewhere" / "at-a-longer-path" / f"warm-{n}"
            # the order alternates, round by round: a machine that slows (or speeds up) over
            # an hour then weighs on each leg alike, and a round's two legs stay neighbours
            order = ["floor", "cold", "warm"] if n % 2 == 0 else ["cold", "warm", "floor"]
            print(f"round {n + 1}: {', '.join(order)}", flush=True)
            for leg in order:
                wh = scratch_wheelhouse(wheelhouse, root / f"wh-{leg}-{n}")
                if leg == "floor":
                    measured, floor_bytes = floor(pin, floor_home, externals, wh)
                else:
                    measured = timed_build(pin, cold if leg == "cold" else warm, cache,
                                           externals, wh)
                legs[leg].append(measured)
                leg_done(leg, n, legs[leg][-1])
            ratio = legs["cold"][-1].wall / legs["floor"][-1].wall
            ratios.append(ratio)
            print(f"  round {n + 1} cold / floor: {ratio:.3f}x", flush=True)
            bytes_lines.append(f"  round {n + 1}, compiled files (sha256):")
            bytes_lines += compare({"cold": built(pin, cold), "warm": built(pin, warm),
                                    "floor": floor_bytes})
            for home in (floor_home, cold, warm, *root.glob(f"wh-*-{n}")):
                shutil.rmtree(home, ignore_errors=True)
            if cache != kept:
                shutil.rmtree(cache, ignore_errors=True)
    print(f"source build of {load_pin(pin).id if not args.quick else 'the small sdist'}, "
          f"{args.rounds} round(s)")
    for key, xs in legs.items():
        print(f"  {key:<6} {fmt([x.wall for x in xs])}")
    for key, xs in legs.items():
        print(f"  {key:<6} cpu {fmt([x.cpu for x in xs])}; steal "
              f"{', '.join(f'{x.steal:.1f}' for x in xs)} s")
    med = {k: statistics.median(x.wall for x in v) for k, v in legs.items()}
    cpu = {k: statistics.median(x.cpu for x in v) for k, v in legs.items()}
    print(f"  cold / floor: {med['cold'] / med['floor']:.3f}x (target <= 1.05x); "
          f"round by round: {', '.join(f'{r:.3f}x' for r in ratios)}; "
          f"median of the rounds: {statistics.median(ratios):.3f}x")
    print(f"  cold / floor, CPU time: {cpu['cold'] / cpu['floor']:.3f}x")
    print(f"  warm / cold:  {med['warm'] / med['cold']:.3f}x (target <= 0.10x)")
    print("\n".join(bytes_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
