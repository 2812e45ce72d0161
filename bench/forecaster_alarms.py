"""Alarm policies on held-out simulated replays: where the test false alarms come from, and what
k-of-n persistence and the threshold rule buy, for a trained multi-head model and every baseline.

Every method is scored once per horizon on validation and test (the LSTM from ``--model``, the
baselines fitted as ``bench/forecaster_horizons.py`` fits them); then, for each alarm policy of
``--policies`` (``fire_steps/fire_window/resolve_steps``, ``2/0/6`` = the shipped two in a row)
and threshold rule (``--confidences``), the threshold is re-picked on validation for ``--budget``
false alarms per target-day and the test split judged: recall of precursor-fault breaches, mean
lead, false alarms per target-day. Paired: the same scores under every policy. ``--explain``
lists each test false alarm (run, fault on at the time, alarm length, steps at or above the
threshold) under the first policy.

    python bench/forecaster_alarms.py --data dataset.npz --model DIR [--budget 1]
        [--policies 2/0/6,3/6/6] [--confidences 0,0.8] [--methods ...] [--features +x] [--explain]

Results: ``bench/results/<--name>.json`` and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402
from forecaster_horizons import feature_list  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla.forecaster import artifact, baselines, evaluate, horizons  # noqa: E402
from llmsla.forecaster import metrics as m  # noqa: E402
from llmsla.forecaster.dataset import Dataset  # noqa: E402
from llmsla.forecaster.hysteresis import AlarmPolicy, alarm_series, notifications  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def policy_of(spec: str, repeat_s: float, resolve_ratio: float) -> AlarmPolicy:
    k, n, r = (int(x) for x in spec.split("/"))
    return AlarmPolicy(k, r, resolve_ratio, repeat_s, fire_window=n)


def explain(ds: Dataset, test: list[m.SeriesScores], thr: float, lead_max: int, policy: AlarmPolicy) -> list[dict]:
    """Each false notification on test: which run and target, the fault on at the time, the
    alarm's length and how many of its steps were at or above the threshold, whether a breach
    follows later in the series."""
    rows = []
    for si, s in zip(ds.series_of("test"), test, strict=True):
        on = alarm_series(s.score, thr, policy)
        healthy = np.isfinite(s.score) & ~m._excused(s, lead_max, on, policy)
        sent = np.flatnonzero(notifications(on, policy.repeat_steps(ds.step_s)))
        meta = ds.meta[si]
        for o in sent[healthy[sent]].tolist():
            a = o - int(np.flatnonzero(~on[: o + 1][::-1])[0]) + 1 if (~on[: o + 1]).any() else 0
            b = o + (int(np.flatnonzero(~on[o:])[0]) if (~on[o:]).any() else len(on) - o)
            kinds = [f["kind"] for f, (lo, hi) in zip(meta.get("faults", []), s.fault_spans, strict=True)
                     if lo <= o <= hi]
            rows.append({"run": meta.get("run", str(si)), "target": meta.get("target", ""), "step": o,
                         "repeat": o != a, "alarm_steps": b - a, "at_or_above": int((s.score[a:b] >= thr).sum()),
                         "fault": ",".join(kinds) or "-", "breach_later": any(e.onset > o for e in s.episodes)})
    return rows


def judge(ds: Dataset, val: list[m.SeriesScores], test: list[m.SeriesScores], lead_max: int, policy: AlarmPolicy,
          budget: float, confidence: float) -> dict:
    thr = m.threshold_for(val, budget, lead_max, ds.step_s, policy, confidence)
    v = m.report(val, thr, lead_max, ds.step_s, ds.window - 1, policy)
    t = m.report(test, thr, lead_max, ds.step_s, ds.window - 1, policy)
    return {"threshold": thr, "val_recall": v.recall["precursor"], "val_false_alarms_per_day": v.false_alarms_per_day,
            "recall": t.recall["precursor"], "warned": t.warned["precursor"], "events": t.events["precursor"],
            "lead_s": t.mean_lead_s["precursor"], "false_alarms_per_day": t.false_alarms_per_day,
            "false_alarms": t.false_alarms, "false_alarms_in_fault": t.false_alarms_in_fault,
            "crash_warned": t.warned["crash"], "crash_events": t.events["crash"], "chance": t.chance_recall}


def main() -> int:
    fc = config_mod.load().forecast
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(fc.root() / "dataset.npz"))
    ap.add_argument("--model", required=True, help="a multi-head (or one-horizon) artifact directory")
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--policies", default="2/0/6,3/4/6,3/6/6,4/8/6,2/0/12")
    ap.add_argument("--confidences", default="0")
    ap.add_argument("--features", default="", help="the baselines' feature list (default: the model's)")
    ap.add_argument("--methods", default=",".join(baselines.METHODS))
    ap.add_argument("--learned-max-windows", type=int, default=4000)
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--name", default="forecaster_alarms")
    args = ap.parse_args()
    art = artifact.load(Path(args.model))
    full = Dataset.load(Path(args.data))
    ds = full.select(art.meta["features"])
    hs = list(art.meta.get("horizons") or [art.horizon])
    bds = full.select(feature_list(args.features, full)) if args.features else ds
    policies = [policy_of(p, fc.repeat_s, fc.resolve_ratio) for p in args.policies.split(",") if p]
    confs = [float(c) for c in args.confidences.split(",") if c]
    out: dict = {"data_sha256": full.digest()[:12], "model": art.version, "features": ds.features,
                 "baseline_features": bds.features, "budget": args.budget, "horizons_s": [h * ds.step_s for h in hs],
                 "policies": [p.to_dict() for p in policies], "confidences": confs, "methods": {}}
    ec0 = evaluate.EvalConfig(lead_max_steps=fc.lead_max_steps, seed=fc.seed, learned_max_windows=args.learned_max_windows)
    scaler = bds.fit_scaler()
    methods = ["lstm", *(x for x in args.methods.split(",") if x)]
    for meth in methods:
        per_h = []
        for k, h in enumerate(hs):
            t0 = time.perf_counter()
            ec = horizons.eval_config_for(ec0, h)
            if meth == "lstm":
                dsh = ds.with_horizon(h)
                scorer = horizons.head_scorer(art.model, dsh, art.scaler, k)
            else:
                dsh = bds.with_horizon(h)
                if meth in baselines.RULES:
                    scorer = evaluate.rule_scorer(dsh, meth, evaluate.tune_rule(dsh, meth))
                else:
                    tr = evaluate.training_windows(dsh, ec)
                    model = baselines.fit_learned(meth, dsh.inputs(tr, scaler), dsh.y[tr], seed=ec.seed)
                    scorer = (lambda mod, d: lambda ends: mod.score(d.inputs(ends, scaler)))(model, dsh)
            val, test = evaluate.series_scores(dsh, "val", scorer), evaluate.series_scores(dsh, "test", scorer)
            cells = []
            for p in policies:
                for c in confs:
                    cells.append({"policy": p.to_dict(), "confidence": c,
                                  **judge(dsh, val, test, ec.lead_max_steps, p, args.budget, c)})
            entry: dict = {"horizon_s": h * ds.step_s, "seconds": round(time.perf_counter() - t0, 1), "cells": cells}
            if args.explain:
                entry["false_alarms"] = explain(dsh, test, cells[0]["threshold"], ec.lead_max_steps, policies[0])
            per_h.append(entry)
            log(f"{meth} {h * ds.step_s:g}s: " + "; ".join(
                f"{_pname(c['policy'])} c{c['confidence']:g}: {c['recall']:.2f} {c['false_alarms_per_day']:.1f}/d"
                for c in cells))
        out["methods"][meth] = per_h
        write_result(args.name, out)
    print(table(out))
    return 0


def _pname(p: dict) -> str:
    return f"{p['fire_steps']}/{p.get('fire_window', 0)}/{p['resolve_steps']}"


def table(out: dict) -> str:
    hs = out["horizons_s"]
    lines = ["| method | policy k/n/resolve | confidence | " + " | ".join(f"{h:g} s" for h in hs) + " |",
             "|---|---|---|" + "---|" * len(hs)]
    for meth, per_h in out["methods"].items():
        for i, c0 in enumerate(per_h[0]["cells"]):
            cells = [e["cells"][i] for e in per_h]
            txt = []
            for c in cells:
                lead = f"{c['lead_s']:.0f} s" if np.isfinite(c["lead_s"]) else "–"
                txt.append(f"{c['recall']:.2f} ({c['warned']}/{c['events']}), {lead}, {c['false_alarms_per_day']:.1f}/d")
            lines.append(f"| {meth} | {_pname(c0['policy'])} | {c0['confidence']:g} | " + " | ".join(txt) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
