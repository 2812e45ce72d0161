"""Several horizons on held-out simulated replays: one multi-head LSTM, one LSTM per horizon,
the shipped one-horizon model and every baseline, each horizon thresholded on validation.

Per horizon (``--horizons``, seconds): the label is "an SLO breach within the horizon", the lead
window is the configured one or the horizon where that is longer, and the breach events are the
data set's own (the same at every horizon). Every method's threshold is the lowest whose alarms
send at most ``--budget`` false notifications per target per healthy day on validation; the test
split (runs, seeds and trace slices never seen in training; docs/forecaster.md#evaluation) gives
the recall of precursor-fault breaches, their mean lead, the crashes (chance) and false alarms.
The choice between the multi-head model and one model per horizon is made on validation.

    python bench/forecaster_horizons.py --data dataset.npz [--horizons 30,120,300,600]
        [--budget 1] [--confidence 0.8] [--features +gpu_temp_c] [--slopes gpu_mem_used_ratio:60]
        [--epochs 30] [--work DIR] [--candidates multi,single] [--methods ...]
        [--from-fault-start] [--fault-negative-weight 5]

``--features``: the LSTM's and the learned baselines' feature list (default: the product's
default list; ``+name`` adds to it). ``--slopes col:steps,...``: experimental columns, each the
change of ``col`` over the last ``steps`` steps per step (NaN before), computed here only, to
measure whether a long-window trend pays before the scorer learns to build it. ``--confidence``:
thresholds hold the budget at that confidence (metrics.threshold_for). ``--from-fault-start``
and ``--fault-negative-weight``: the LSTM's training labels and weights from the injected faults
(:mod:`llmsla.forecaster.fault_labels`); the baselines are unchanged.

Trained models are kept in ``--work`` and reused by a rerun (delete them to retrain). Results:
``bench/results/forecaster_horizons.json`` and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla.forecaster import artifact, baselines, evaluate, features, horizons, train  # noqa: E402
from llmsla.forecaster.dataset import Dataset  # noqa: E402
from llmsla.forecaster.hysteresis import AlarmPolicy  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def summary(r: evaluate.MethodResult) -> dict:
    t, v = r.test, r.val
    return {"method": r.method, "threshold": r.threshold, "seconds": round(r.seconds, 1),
            "val": {"recall_precursor": v.recall["precursor"], "lead_s": v.mean_lead_s["precursor"],
                    "auc_pr": v.auc_pr, "false_alarms_per_day": v.false_alarms_per_day},
            "test": {"recall_precursor": t.recall["precursor"], "warned": t.warned["precursor"],
                     "events": t.events["precursor"], "lead_s": t.mean_lead_s["precursor"],
                     "recall_crash": t.recall["crash"], "crash_warned": t.warned["crash"],
                     "crash_events": t.events["crash"], "chance": t.chance_recall,
                     "auc_pr": t.auc_pr, "auc_pr_ahead": t.auc_pr_ahead,
                     "false_alarms_per_day": t.false_alarms_per_day},
            "operating_points": [{"budget": p["budget"], "recall": p["test"]["recall"]["precursor"],
                                  "lead_s": p["test"]["mean_lead_s"]["precursor"],
                                  "false_alarms_per_day": p["test"]["false_alarms_per_day"]}
                                 for p in r.extra.get("operating_points", [])]}


def trained(work: Path, name: str, ds: Dataset, tc: train.TrainConfig) -> artifact.Artifact:
    """The model ``name`` from ``work``, trained now if it is not there or was trained with
    another training configuration."""
    path = work / name
    if (path / artifact.META).exists():
        kept = artifact.load(path)
        was = {k: v for k, v in kept.meta.get("train", {}).items() if k not in ("best_epoch", "seconds", "history")}
        if was == json.loads(json.dumps(tc.to_dict())):
            log(f"{name}: reusing {path}")
            return kept
        log(f"{name}: {path} was trained with another configuration")
    log(f"{name}: training (horizons {tc.horizons or ds.horizon})")
    res = train.train_lstm(ds, tc, log=lambda m: log(f"{name}: {m}"))
    hs = list(tc.horizons) or [ds.horizon]
    meta = {"mode": ds.mode, "window": ds.window, "horizon": hs[0], "step_s": ds.step_s, "threshold": 0.5,
            "features": ds.features, "masks": list(features.MASKS),
            "train": {**tc.to_dict(), "best_epoch": res.best_epoch, "seconds": round(res.seconds, 1),
                      "history": res.history}}
    if tc.horizons:
        meta |= {"horizons": hs, "thresholds": [0.5] * len(hs)}
    artifact.save(path, res.model, res.scaler, meta)
    log(f"{name}: trained in {res.seconds:.0f} s, best epoch {res.best_epoch}")
    return artifact.load(path)


def with_slopes(ds: Dataset, spec: str) -> Dataset:
    """``ds`` plus a column ``<col>_slope<steps>`` per ``col:steps`` of ``spec``: per series,
    (value now - value ``steps`` earlier) / ``steps``, NaN where that is not known."""
    if not spec:
        return ds
    cols, names_ = [], []
    for part in spec.split(","):
        col, _, steps_s = part.partition(":")
        k, j = int(steps_s), ds.features.index(col)
        out = np.full(len(ds.y), np.nan, np.float32)
        for s in range(ds.n_series):
            lo, hi = int(ds.offsets[s]), int(ds.offsets[s + 1])
            v = ds.feats[lo:hi, j].astype(float)
            if hi - lo > k:
                out[lo + k:hi] = (v[k:] - v[:-k]) / k
        cols.append(out)
        names_.append(f"{col}_slope{k}")
    feats = np.concatenate([ds.feats, np.stack(cols, axis=1)], axis=1)
    return Dataset(ds.mode, ds.window, ds.horizon, ds.step_s, feats, ds.present, ds.signals, ds.breach, ds.y,
                   ds.offsets, ds.meta, {**ds.info, "features": [*ds.features, *names_]})


def feature_list(arg: str, ds: Dataset) -> list[str]:
    """``--features``: empty = the default list; ``+a,+b`` = the default list and those."""
    if not arg:
        return list(features.FEATURES)
    parts = [p.strip() for p in arg.split(",") if p.strip()]
    if all(p.startswith("+") for p in parts):
        return [*features.FEATURES, *(p[1:] for p in parts)]
    return parts


def main() -> int:
    cfg = config_mod.load()
    fc = cfg.forecast
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(fc.root() / "dataset.npz"))
    ap.add_argument("--horizons", default="30,120,300,600", help="seconds, comma separated")
    ap.add_argument("--budget", type=float, default=1.0, help="false alarms per target per healthy day (validation)")
    ap.add_argument("--budgets", default="4", help="extra operating points, false alarms per day")
    ap.add_argument("--confidence", type=float, default=fc.threshold_confidence,
                    help="threshold rule: Poisson upper bound at this confidence (default forecast.threshold_confidence)")
    ap.add_argument("--features", default="", help="feature list ('' = default; '+a,+b' = default and those)")
    ap.add_argument("--slopes", default="", help="experimental slope columns col:steps,... (see above)")
    ap.add_argument("--epochs", type=int, default=fc.epochs)
    ap.add_argument("--from-fault-start", action="store_true",
                    help="LSTM labels counted from a fault's start (default forecast.label_from_fault_start)")
    ap.add_argument("--fault-negative-weight", type=float, default=0.0,
                    help="LSTM loss weight of negatives inside a fault (0 = forecast.fault_negative_weight)")
    ap.add_argument("--work", default=str(fc.root() / "horizons"))
    ap.add_argument("--candidates", default="multi,single")
    ap.add_argument("--methods", default=",".join(baselines.METHODS))
    ap.add_argument("--learned-max-windows", type=int, default=4000)
    ap.add_argument("--name", default="forecaster_horizons", help="bench/results/<name>.json")
    ap.add_argument("--shipped", default=str(artifact.PRETRAINED), help="today's one-horizon model ('' = skip)")
    args = ap.parse_args()
    full = with_slopes(Dataset.load(Path(args.data)), args.slopes)
    ds = full.select(feature_list(args.features, full))
    hs = horizons.steps_of([float(x) for x in args.horizons.split(",")], ds.step_s)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ec = evaluate.EvalConfig(false_alarms_per_day=args.budget, lead_max_steps=fc.lead_max_steps, seed=fc.seed,
                             policy=AlarmPolicy.from_config(fc), learned_max_windows=args.learned_max_windows,
                             budgets=tuple(float(b) for b in args.budgets.split(",") if b),
                             confidence=args.confidence)
    base = train.TrainConfig(hidden=fc.hidden, layers=fc.layers, dropout=fc.dropout, dense=fc.dense,
                             epochs=args.epochs, batch_size=fc.batch_size, lr=fc.lr, patience=fc.patience,
                             seed=fc.seed, threads=fc.threads, balance_onsets=fc.balance_onsets,
                             label_from_fault_start=args.from_fault_start or fc.label_from_fault_start,
                             fault_negative_weight=args.fault_negative_weight or fc.fault_negative_weight)
    train.seed_everything(fc.seed, fc.threads)
    out: dict = {"horizons_s": [h * ds.step_s for h in hs], "budget": args.budget, "confidence": args.confidence,
                 "features": ds.features, "candidates": {},
                 "baselines": {}, "data_sha256": ds.digest()[:12]}
    cands = [c for c in args.candidates.split(",") if c]
    if "multi" in cands:
        art = trained(work, "multi", ds, dataclasses.replace(base, horizons=hs))
        rs = horizons.evaluate_heads(ds, art.model, art.scaler, hs, ec)
        out["candidates"]["multi"] = {"train": art.meta["train"], "per_horizon": [summary(r) for r in rs]}
        write_result(args.name, out)
        log("multi: " + ", ".join(f"{h * ds.step_s:g}s recall {r.test.recall['precursor']:.2f} "
                                  f"lead {r.test.mean_lead_s['precursor']:.0f}" for h, r in zip(hs, rs, strict=True)))
    if "single" in cands:
        per = []
        for h in hs:
            dsh = ds.with_horizon(h)
            art = trained(work, f"single-{h}", dsh, base)
            r = horizons.evaluate_heads(dsh, art.model, art.scaler, [h], ec)[0]
            per.append(summary(r) | {"train_seconds": art.meta["train"]["seconds"]})
            out["candidates"]["single"] = {"per_horizon": per}
            write_result(args.name, out)
            log(f"single {h * ds.step_s:g}s: recall {r.test.recall['precursor']:.2f} lead "
                f"{r.test.mean_lead_s['precursor']:.0f}")
        out["candidates"]["single"] = {"per_horizon": per}
    if args.shipped:
        art = artifact.load(Path(args.shipped))
        r = horizons.evaluate_heads(full.select(art.meta["features"]).with_horizon(art.horizon), art.model, art.scaler, [art.horizon], ec)[0]
        out["shipped"] = summary(r) | {"horizon_s": art.horizon * ds.step_s, "version": art.version}
        write_result(args.name, out)
        log(f"shipped ({art.horizon * ds.step_s:g}s): recall {r.test.recall['precursor']:.2f}")
    methods = tuple(m for m in args.methods.split(",") if m)
    if methods:
        scaler = ds.fit_scaler()
        for h in hs:
            dsh = ds.with_horizon(h)
            rs = evaluate.run_all(dsh, None, scaler, horizons.eval_config_for(ec, h), methods,
                                  log=lambda m, h=h: log(f"{h * ds.step_s:g}s {m}"))
            out["baselines"][str(h * ds.step_s)] = [summary(r) for r in rs]
            write_result(args.name, out)
    write_result(args.name, out)
    print(table(out))
    return 0


def _cell(s: dict) -> str:
    t = s["test"]
    lead = "–" if not np.isfinite(t["lead_s"] or float("nan")) else f"{t['lead_s']:.0f} s"
    return f"{t['recall_precursor']:.2f} ({t['warned']}/{t['events']}), {lead}, {t['false_alarms_per_day']:.1f}/d"


def table(out: dict) -> str:
    hs = out["horizons_s"]
    lines = ["| method | " + " | ".join(f"{h:g} s" for h in hs) + " |", "|---|" + "---|" * len(hs)]
    for name, c in out["candidates"].items():
        lines.append(f"| lstm {name} | " + " | ".join(_cell(s) for s in c["per_horizon"]) + " |")
    if out["baselines"]:
        first = out["baselines"][str(hs[0])]
        for i, s in enumerate(first):
            lines.append(f"| {s['method']} | " + " | ".join(_cell(out['baselines'][str(h)][i]) for h in hs) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
