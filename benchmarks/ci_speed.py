"""CI speed, measured in one run on this machine: verify and capture against a bare engine
run doing the same engine work, and verify's own work on a large golden.

    python benchmarks/ci_speed.py [--runs 3] [--home H] [--skip-nox] [--skip-large]
    python benchmarks/ci_speed.py --quick     # CI: one round, no warm-up, no nox, a small
                                              # large golden; every figure still produced

Rounds are paired: each round runs the bare process, the CLI and nox back to back, so a
noisy minute slows all of them. Prints medians and ratios (of medians) against the bare run.

(1) bare: the oracle venv's python imports vLLM, starts one engine with the golden's
    recorded arguments and runs the same generate() calls verify runs (same prompts,
    batch composition, sampling, legs); nothing else (no identity, no records);
(2) `python -m oracle_build verify goldens/tiny-llama-greedy`        target <= 1.15x (1);
(3) `nox -s verify -- goldens/tiny-llama-greedy`                      target <= 1.25x (1);
(4) capture of the same spec (both legs) against a bare run of both legs: the CLI <= 1.15x,
    nox <= 1.25x;
(5) verify's own work (load, validate, compare against the engine's rows) on a generated
    2,000-prompt x 256-token x top-20 golden, format 2 (binary top-k)  target <= 2 s;
    format 1 (JSON top-k) once, for the record.
Reimage recovery is benchmarks/recovery.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import fmt  # noqa: E402
from oracle_build import devices, goldens, host, judge  # noqa: E402
from oracle_build.checkpoints.resolve import recorded_model  # noqa: E402
from oracle_build.contracts.golden import load_golden, recorded  # noqa: E402
from oracle_build.contracts.spec import load_spec  # noqa: E402
from oracle_build.contracts.topk import TopKTable  # noqa: E402
from oracle_build.core import env as envmod  # noqa: E402
from oracle_build.core import layout  # noqa: E402
from oracle_build.core.filelock import held  # noqa: E402
from oracle_build.engine.caches import CompileCache  # noqa: E402
from oracle_build.engine.runs import run_from_golden  # noqa: E402
from oracle_build.goldens import publish  # noqa: E402
from oracle_build.oracle.opening import engine_env, open_oracle  # noqa: E402
from oracle_build.services.verify import records_complete, token_results  # noqa: E402

GOLDEN = REPO / "goldens" / "tiny-llama-greedy"
BARE = """
import json, sys
req = json.load(open(sys.argv[1]))
from vllm import LLM, SamplingParams
llm = LLM(model=req["model"], **req["engine_args"])
for run in req["runs"]:
    params = SamplingParams(**run["sampling"])
    prompts = [{"prompt_token_ids": p["token_ids"]} if "token_ids" in p else
               {"prompt": p["text"]} for p in run["prompts"]]
    for _ in range(run["legs"]):
        for call in run["calls"]:
            llm.generate([prompts[i] for i in call], params, use_tqdm=False)
"""


def timed(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO,
          engine_lock: Path | None = None) -> float:
    """``engine_lock``: a bare engine run takes the engine lock the tool's own runs take
    (one engine at a time per home, or per host with ORACLE_BUILD_ENGINE_LOCK); the time
    counts from when it holds it."""
    with held(engine_lock, what="a bare vLLM engine") if engine_lock else nullcontext():
        start = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def ratio(xs: list[float], base: list[float]) -> float:
    return statistics.median(xs) / statistics.median(base)


def bare_request(home: Path, legs: int, work: Path,
                 path: Path = GOLDEN / "golden.json") -> tuple[Path, dict[str, str], Path]:
    """The request verify's engine runs for the golden at ``path`` (``legs`` legs), its
    environment, and the oracle's python."""
    rec = recorded(load_golden(path), path)
    pin = goldens.golden_pin(rec, path, unpack_to=layout.pins_dir(home))
    oracle = open_oracle(pin, rec.oracle.target, home)
    model = recorded_model(rec, path, home, oracle)
    request = {"model": str(model), "engine_args": dict(rec.engine.requested),
               "runs": [run_from_golden(rec, legs=legs)]}
    req = work / f"bare-{legs}.json"
    req.write_text(json.dumps(request))
    # the same compile cache verify's engine uses (warm after the warm-up round)
    caches = CompileCache.of(home, pin.key)
    env = {**envmod.oracle_env(engine_env(oracle.target, devices.NO_HOLD, caches)),
           **caches.variables()}
    return req, env, oracle.venv.python


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--home", type=Path, default=layout.default_home())
    ap.add_argument("--skip-nox", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new "
                    "temporary one)")
    ap.add_argument("--golden", type=Path, default=GOLDEN / "golden.json",
                    help="the golden verify runs (default: the bundled one; on a host of "
                    "another CPU kernel variant, one captured there)")
    ap.add_argument("--quick", action="store_true",
                    help="CI's mode: one round, no warm-up, no nox, a 50 x 32 x top-20 "
                    "large golden; the same code paths, and it fails when a figure cannot "
                    "be produced")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.skip_nox = 1, True
    large = (50, 32, 20) if args.quick else (2000, 256, 20)
    work = args.work or Path(tempfile.mkdtemp(prefix="oracle-ci-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    neutral = work / "neutral"
    neutral.mkdir()
    cli = [sys.executable, "-m", "oracle_build"]
    nox = [sys.executable, "-m", "nox", "-s"]
    h = host.host()
    print(f"oracle-build CI speed benchmark: {h.machine}, {os.cpu_count()} cores, "
          f"{h.cpu_variant}; home {args.home}; {time.strftime('%Y-%m-%d')}", flush=True)
    results: dict[str, object] = {}

    # warm-up (page cache, nox's venv), not counted
    req1, env, python = bare_request(args.home, 1, work, args.golden)
    req2, _, _ = bare_request(args.home, 2, work, args.golden)
    golden = str(args.golden)
    lock = layout.engine_lock(args.home)
    if not args.quick:
        timed([*cli, "verify", golden, "--home", str(args.home)])
    if not args.skip_nox:
        timed([*nox, "verify", "--", golden, "--home", str(args.home)])

    rows: dict[str, list[float]] = {k: [] for k in (
        "bare_1leg", "verify_cli", "verify_nox", "bare_2legs", "capture_cli", "capture_nox")}
    spec = load_spec(GOLDEN / "spec.toml")
    for n in range(args.runs):
        rows["bare_1leg"].append(timed([str(python), "-I", "-B", "-c", BARE, str(req1)], env=env,
                                       cwd=neutral, engine_lock=lock))
        rows["verify_cli"].append(timed([*cli, "verify", golden, "--home",
                                         str(args.home)]))
        if not args.skip_nox:
            rows["verify_nox"].append(timed([*nox, "verify", "--", golden, "--home",
                                             str(args.home)]))
        rows["bare_2legs"].append(timed([str(python), "-I", "-B", "-c", BARE, str(req2)], env=env,
                                        cwd=neutral, engine_lock=lock))
        out = work / f"cap-cli-{n}"
        rows["capture_cli"].append(timed([*cli, "capture", str(GOLDEN), "--out", str(out),
                                          "--home", str(args.home)]))
        shutil.rmtree(out)
        if not args.skip_nox:
            out = work / f"cap-nox-{n}"
            rows["capture_nox"].append(timed([*nox, "capture", "--", str(GOLDEN), "--out",
                                              str(out), "--home", str(args.home)]))
            shutil.rmtree(out)
        print(f"  round {n + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rows.items()
                                               if v), flush=True)
    print(f"(1) bare engine run, verify's work (1 leg): {fmt(rows['bare_1leg'])}")
    print(f"(2) verify, CLI:                            {fmt(rows['verify_cli'])}  "
          f"{ratio(rows['verify_cli'], rows['bare_1leg']):.2f}x  (target <= 1.15x)")
    if rows["verify_nox"]:
        print(f"(3) verify, nox -s verify:                  {fmt(rows['verify_nox'])}  "
              f"{ratio(rows['verify_nox'], rows['bare_1leg']):.2f}x  (target <= 1.25x)")
    print(f"(4) bare engine run, capture's work (2 legs): {fmt(rows['bare_2legs'])}")
    print(f"    capture, CLI:                           {fmt(rows['capture_cli'])}  "
          f"{ratio(rows['capture_cli'], rows['bare_2legs']):.2f}x  (target <= 1.15x)")
    if rows["capture_nox"]:
        print(f"    capture, nox -s capture:                {fmt(rows['capture_nox'])}  "
              f"{ratio(rows['capture_nox'], rows['bare_2legs']):.2f}x  (target <= 1.25x)")
    results.update(spec=spec.name, **rows)
    del spec

    if not args.skip_large:
        from benchmarks.large_golden import make

        f1 = make(work / "large1" / "golden.json", *large)
        start = time.monotonic()
        g1 = load_golden(f1)
        f1_load = time.monotonic() - start
        f2 = work / "large2" / "golden.json"
        publish(g1, f2, replace=False)
        del g1
        es = []
        for _ in range(args.runs):
            table = load_golden(f2).topk_table()
            assert table is not None
            # the engine's rows as the driver hands them: separate arrays, float64
            arrays = {f"r0_l0_{k}": v.copy() for k, v in (
                ("lengths", table.lengths), ("counts", table.counts), ("ids", table.ids),
                ("logprobs", table.logprobs.astype("float64")))}
            start = time.monotonic()
            g = load_golden(f2)
            rec = recorded(g, f2)
            records_complete(rec, f2)
            new = TopKTable.from_arrays(arrays, f2, "r0_l0_")
            leg = [{"prompt_token_ids": p.prompt_token_ids, "token_ids": p.token_ids,
                    "topk": new.rows(i)} for i, p in enumerate(g.prompts)]
            judge.summarize(token_results(g, leg, g.gate.band_nats))
            assert judge.first_topk_difference([p.id for p in g.prompts], g.topk_table(),
                                               new, rec.logprobs) is None
            es.append(time.monotonic() - start)
        sizes = sum(p.stat().st_size for p in f2.parent.iterdir()) / 1e6
        shape = "x".join(map(str, large[:2])) + f"xtop-{large[2]}"
        print(f"(5) verify's own work, {shape}, format 2 ({sizes:.0f} MB): {fmt(es)}"
              + ("  (target <= 2 s)" if not args.quick else "  (quick: no target)"))
        print(f"    format 1 (JSON top-k, {f1.stat().st_size / 1e6:.0f} MB): loading alone "
              f"{f1_load:.2f} s (1 run)")
        results.update(large_format2_s=es, large_format1_load_s=f1_load)
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"figures: {work / 'results.json'}")
    shutil.rmtree(work / "large1", ignore_errors=True)
    shutil.rmtree(work / "large2", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
