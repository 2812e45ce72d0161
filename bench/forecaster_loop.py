"""The forecaster's from-store loop, end to end, on a simulated fleet with faults.

What an SRE runs on their own fleet, with a simulator standing in for the fleet:

1. **simulate**: ``--hours`` of ``azure_conv`` on ``6b:5`` as back-to-back 30 min scenarios, each
   with random faults (precursors - ramp, leak, thermal, surge - and crashes; seeded), through
   the gateway's recorders into a spool. The simulator runs in simulated time (a 6 h history
   takes about a minute to compute, not 6 h; no pacing). The scenarios of the held-out part
   replay the last 30 % of the trace, the others the first 70 %, so the held-out load was never
   trained on. The simulator's fault labels are not used.
2. **stream**: the real ``llmsla stream --once`` job drains the spool into the store's windows.
3. **dataset**: ``forecast dataset --from-store`` (labels: the SLO catalog's breaches on the
   store's windows).
4. **train**: ``forecast train --from-store`` - the candidate goes into the model registry and
   the champion/challenger gate scores it against the serving model (the shipped one: cold start).
5. **backtest** the registry's champion and the shipped model on the same history.
6. **retrain on worse data**: a second history later in the same store where every fault is a
   crash (no precursor, nothing to forecast); ``forecast train --from-store`` on it must be
   refused by the gate with its reason.

Every stage is a real command in its own process (``nice``d); the wall time of each is reported.

    python bench/forecaster_loop.py [--hours 6] [--bad-hours 6] [--seed 0] [--epochs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.fleet import scenarios  # noqa: E402
from llmsla.fleet.faults import Fault  # noqa: E402
from llmsla.fleet.sink import RecorderSink  # noqa: E402
from llmsla.store import open_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLMSLA_MAIN = "import sys; from llmsla.app.cli import main; sys.exit(main())"
TRACE = "azure_conv"
SCENARIO_S = 1800.0
#: the worse history starts this long after the good one ends
GAP_MS = 2 * 3600 * 1000
HELD_OUT_SHARE = 0.2  # the --split default's last part (scenarios replaying the trace's held-out 30 %)


def crashes_only(sc: scenarios.Scenario, seed: int) -> scenarios.Scenario:
    """The same scenario with every fault a crash (same start, a crash's duration, one replica):
    breaches without a precursor - data a forecaster cannot learn to warn of."""
    rng = random.Random(f"crash/{seed}")
    lo, hi = scenarios.FAULT_RANGES["crash"][0]
    reps = [f"r{i}" for i in range(int(sc.fleet.split(":")[1]))]
    faults = tuple(Fault(f.start_s, round(f.start_s + rng.uniform(lo, hi), 1), "crash", rng.choice(reps), 0.0)
                   for f in sc.faults)
    return dataclasses.replace(sc, faults=faults)


def history(hours: float, seed: int, *, crash_only: bool = False) -> list[scenarios.Scenario]:
    """Back-to-back scenarios; the ones reaching into the held-out part replay the trace's last 30 %."""
    n = max(1, round(hours * 3600 / SCENARIO_S))
    setup = scenarios.TRACES[TRACE]
    span = setup.span_s * setup.time_scale
    held_from = (1.0 - HELD_OUT_SHARE) * n * SCENARIO_S
    out = []
    for i in range(n):
        held = (i + 1) * SCENARIO_S > held_from
        lo, hi = (0.7 * span, span) if held else (0.0, 0.7 * span)
        sc = scenarios.make(TRACE, seed * 1000 + i, lo_s=lo, hi_s=hi, duration_s=SCENARIO_S)
        out.append(crashes_only(sc, seed * 1000 + i) if crash_only else sc)
    return out


def simulate(cfg: config_mod.Config, scs: list[scenarios.Scenario], spool: Path, t0_ms: int) -> dict[str, Any]:
    faults: dict[str, int] = {}
    n_req = n_gpu = 0
    cache: dict[str, list] = {}
    with RecorderSink(cfg, spool_dir=spool) as sink:
        for i, sc in enumerate(scs):
            scenarios.run(sc, sink, start_ms=t0_ms + int(i * SCENARIO_S * 1000), cache=cache,
                          gpu_interval_s=cfg.gpu.interval_s, timeout_s=cfg.gateway.request_timeout_s,
                          max_concurrency=cfg.gateway.max_concurrency, max_in_flight=cfg.gateway.max_in_flight)
            for f in sc.faults:
                faults[f.kind] = faults.get(f.kind, 0) + 1
        n_req, n_gpu = sink.n_requests, sink.n_gpu
    return {"requests": n_req, "gpu_samples": n_gpu, "faults": faults, "scenarios": len(scs)}


def env_for(cfg: config_mod.Config, spool: Path, work: Path, fa_budget: float = 0.0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update({"LLMSLA_STORE_DSN": cfg.store.dsn, "LLMSLA_SPOOL_DIR": str(spool),
                "LLMSLA_STREAM_CHECKPOINT_DIR": str(work / "ckpt" / spool.name),
                "LLMSLA_STORE_TIMESCALE": cfg.store.timescale, "LLMSLA_STREAM_METRICS_PORT": "0",
                "LLMSLA_FORECAST_DIR": str(work / "forecast")})
    if fa_budget:
        env["LLMSLA_FORECAST_FALSE_ALARMS_PER_DAY"] = str(fa_budget)
    return env


def cli(env: dict[str, str], *args: str, log: Path) -> tuple[float, str]:
    """One ``llmsla`` command, niced, in its own process: (wall s, stdout). Fails loudly."""
    t = time.perf_counter()
    p = subprocess.run(["nice", "-n", "10", sys.executable, "-c", LLMSLA_MAIN, *args], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    with log.open("a") as fh:
        fh.write(f"$ llmsla {' '.join(args)}  ({wall:.1f} s, rc {p.returncode})\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        raise SystemExit(f"llmsla {' '.join(args)} failed (rc {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    return wall, p.stdout


def verdict(stdout: str) -> str:
    """``model N (v…): champion: …`` / ``… refused: …``: the gate's line of ``train --from-store``."""
    lines = stdout.strip().splitlines()
    return next((ln for ln in lines if ": champion: " in ln or ": refused: " in ln), lines[-1] if lines else "")


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def held_out(js: Path) -> dict[str, Any]:
    """The model's row of a backtest's JSON, reduced to what the SRE compares."""
    d = json.loads(js.read_text())
    out = {}
    for i, r in enumerate(d["held_out"]):  # the model first, then the baselines
        t = r["test"]
        out["model" if i == 0 else r["method"]] = {"recall": t["recall"]["none"], "warned": t["warned"]["none"],
                            "events": t["events"]["none"], "fa_per_day": t["false_alarms_per_day"],
                            "mean_lead_s": t["mean_lead_s"]["none"], "auc_pr": t["auc_pr"],
                            "chance_recall": t["chance_recall"]}
    w = d["whole"]
    out["whole"] = {"recall": w["recall"]["none"], "warned": w["warned"]["none"], "events": w["events"]["none"],
                    "fa_per_day": w["false_alarms_per_day"], "mean_lead_s": w["mean_lead_s"]["none"]}
    return out


def loop(args: argparse.Namespace, work: Path, cfg: config_mod.Config) -> dict[str, Any]:
    log = work / "commands.log"
    walls: dict[str, float] = {}
    good_ms = int(args.hours * 3600 * 1000)
    bad_ms = int(args.bad_hours * 3600 * 1000)
    # on an hour boundary, ending an hour ago: the stream job dead-letters events older than
    # stream.max_past_s (7 days), so the history cannot sit at a fixed date
    t0_ms = (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000 - good_ms - GAP_MS - bad_ms
    bad_t0 = t0_ms + good_ms + GAP_MS
    split = ("--split", args.split)
    rng_good = ("--from", iso(t0_ms), "--to", iso(t0_ms + good_ms), *split)
    rng_bad = ("--from", iso(bad_t0), "--to", iso(bad_t0 + bad_ms), *split)
    epochs = ("--epochs", str(args.epochs)) if args.epochs else ()
    out: dict[str, Any] = {}

    t = time.perf_counter()
    out["good_history"] = simulate(cfg, history(args.hours, args.seed), work / "spool-good", t0_ms)
    walls["simulate"] = time.perf_counter() - t
    env = env_for(cfg, work / "spool-good", work, args.fa_budget)
    walls["stream"], _ = cli(env, "stream", "--once", log=log)
    walls["dataset"], ds_out = cli(env, "forecast", "dataset", "--from-store", *rng_good, "--out",
                                   str(work / "fleet.npz"), log=log)
    out["dataset"] = ds_out.strip().splitlines()
    walls["train"], tr_out = cli(env, "forecast", "train", "--from-store", *rng_good, *epochs,
                                 "--trained-by", "bench", log=log)
    out["train"] = verdict(tr_out)
    methods = ("--methods", args.methods)
    walls["backtest_champion"], _ = cli(env, "forecast", "backtest", *rng_good, "--registry", "1", *methods,
                                        "--out", str(work / "bt-champion.md"), log=log)
    walls["backtest_shipped"], _ = cli(env, "forecast", "backtest", *rng_good, *methods,
                                       "--out", str(work / "bt-shipped.md"), log=log)
    out["champion"] = held_out(work / "bt-champion.json")
    out["shipped"] = held_out(work / "bt-shipped.json")

    t = time.perf_counter()
    out["worse_history"] = simulate(cfg, history(args.bad_hours, args.seed + 1, crash_only=True),
                                    work / "spool-worse", bad_t0)
    walls["simulate_worse"] = time.perf_counter() - t
    env_bad = env_for(cfg, work / "spool-worse", work, args.fa_budget)
    walls["stream_worse"], _ = cli(env_bad, "stream", "--once", log=log)
    walls["train_worse"], bad_out = cli(env_bad, "forecast", "train", "--from-store", *rng_bad, *epochs,
                                        "--trained-by", "bench-worse", log=log)
    out["train_worse"] = verdict(bad_out)
    _, models = cli(env, "forecast", "models", "--json", log=log)
    out["registry"] = [{k: r.get(k) for k in ("id", "version", "status", "reason")}
                       for r in (json.loads(line) for line in models.splitlines() if line.startswith("{"))]
    out["walls_s"] = {k: round(v, 1) for k, v in walls.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=6.0, help="good history, hours (default 6)")
    ap.add_argument("--bad-hours", type=float, default=3.0, help="crash-only history, hours (default 3)")
    ap.add_argument("--split", default="0.5,0.3,0.2", help="train,val,test shares of each history (default 0.5,0.3,0.2)")
    ap.add_argument("--fa-budget", type=float, default=8.0,
                    help="forecast.false_alarms_per_day for every command (default 8; 0 = the config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=0, help="training epochs (default forecast.epochs)")
    ap.add_argument("--methods", default="persistence,logistic_regression",
                    help="baselines beside the model in the backtests")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (store, spools, commands.log)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmsla-forecaster-loop-"))
    cfg = config_mod.load(env={})
    cfg.store.data_dir = str(work / "pg")
    handle = open_store(cfg, keep_running=False)
    cfg.store.dsn = handle.dsn
    t = time.perf_counter()
    keep = args.keep
    try:
        res = loop(args, work, cfg)
    except BaseException:
        keep = True  # what failed is in commands.log
        raise
    finally:
        handle.close()
        if keep:
            print(f"kept {work} (commands.log has every command's output)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    res["total_wall_s"] = round(time.perf_counter() - t, 1)
    res["args"] = vars(args)
    res["setup"] = {"trace": TRACE, "fleet": scenarios.TRACES[TRACE].fleet, "scenario_s": SCENARIO_S,
                    "step_s": names.REQUEST_WINDOW_S}
    path = write_result("forecaster_loop", res)
    rows = []
    for name in ("champion", "shipped"):
        r = res[name]["model"]
        rows.append({"model": "store-trained champion" if name == "champion" else "shipped",
                     "held-out recall": f"{r['recall']:.2f} ({r['warned']}/{r['events']})",
                     "FA/target-day": f"{r['fa_per_day']:.1f}", "mean lead s": f"{r['mean_lead_s']:.0f}",
                     "AUC-PR": f"{r['auc_pr']:.3f}", "chance": f"{r['chance_recall']:.2f}"})
    print_table(rows, f"held-out part of a {args.hours:g} h simulated history (the store's windows)")
    print_table([{"stage": k, "wall s": v} for k, v in res["walls_s"].items()], "wall time per stage (nice, 2 cores)")
    print(f"gate, good history:  {res['train']}")
    print(f"gate, crash-only:    {res['train_worse']}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
