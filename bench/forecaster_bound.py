"""How early can any forecaster warn? The causal bound of the held-out precursor-fault breaches.

A warning can only be about an injected fault once the fault has begun: before its first step
the replica is healthy and nothing in its series tells the fault is coming (an alarm then is
chance, like an alarm before a crash). So for each precursor-fault breach of the test split,
the time from its fault's start to its onset bounds the lead of any warning of it. Per horizon
(its lead window as the evaluation sets it: ``forecast.lead_max_steps`` or the horizon where that
is longer, and the events it counts), this prints how many breaches leave at least 30 s, 1, 2 and
5 min between their fault's start and their onset, the mean and median of that time per fault
kind, and what a forecaster that warned of every breach at its fault's first step would score:
recall 1 at that mean lead, or, keeping the 60 % with the longest bounds, their mean lead (what
issue 37's "60 % of precursor-fault breaches warned, mean lead >= 120 s" needs at best).

Then, per horizon, four ideal alarms scored by the evaluation itself (the online loop's alarm
policy, its false-alarm rule), to show what the false-alarm budget asks beyond seeing the fault:

- ``every fault``: on from each precursor fault's first step to its last (a perfect detector of
  the faults, not of what they do);
- ``faults that breach``: the same, only over faults with a breach attributed to them (it also
  knows which faults will break the SLO);
- ``to the breach's end``: on from each such fault's first step to the end of its last breach
  (it also knows when the breach is over);
- ``ideal``: on exactly over each precursor-fault breach's credited window (from
  ``metrics.warn_from`` to its end): recall 1, no false alarm by construction.

It reads the data set only (no model): ``llmsla forecast dataset --runs 1,1,10`` builds the
default test split in about 20 s.

    python bench/forecaster_bound.py --data dataset.npz [--horizons 30,120,300,600]

Results: ``bench/results/forecaster_bound.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla.forecaster import accuracy, evaluate  # noqa: E402
from llmsla.forecaster import metrics as m  # noqa: E402
from llmsla.forecaster.dataset import Dataset  # noqa: E402
from llmsla.forecaster.hysteresis import AlarmPolicy  # noqa: E402

#: Leads (s) whose share of breaches is printed.
LEADS_S = (30, 60, 120, 300)
#: Issue 37's target: this share of precursor-fault breaches warned, with this mean lead (s).
TARGET_RECALL, TARGET_LEAD_S = 0.6, 120.0


def bounds(ds: Dataset, lead_max: int) -> list[tuple[str, float]]:
    """(fault kind, seconds from the fault's start to the breach onset) of every precursor-fault
    breach of the test split that the evaluation counts with a ``lead_max``-step lead window."""
    def zeros(ends: np.ndarray) -> np.ndarray:
        return np.zeros(len(ends))

    out = []
    for s in evaluate.series_scores(ds, "test", zeros):
        for e in s.episodes:
            if e.cause != m.PRECURSOR or e.fault_step is None or e.onset - lead_max < ds.window - 1:
                continue  # not a precursor fault's, or no full look-back: the evaluation skips it
            out.append((e.kind, (e.onset - e.fault_step) * ds.step_s))  # attribution: onset >= its fault's step
    return out


#: The ideal alarms of the module docstring, in the order printed.
IDEALS = ("every fault", "faults that breach", "to the breach's end", "ideal")


def ideal_alarms(ds: Dataset, lead_max: int, policy: AlarmPolicy) -> list[dict]:
    """Each of :data:`IDEALS` on the test split, scored by :func:`metrics.report` under
    ``policy``: precursor-fault breaches warned, mean lead, false alarms per target-day."""
    series = ds.series_of("test")
    scores = evaluate.series_scores(ds, "test", lambda ends: np.zeros(len(ends)))
    onsets: dict[str, np.ndarray] = {name: np.zeros(len(ds.y)) for name in IDEALS}
    precursor = set(ds.info.get("precursor_kinds", ()))
    for si, s in zip(series, scores, strict=True):
        lo = int(ds.offsets[si])
        faults = ds.meta[si].get("faults", [])
        for f, (first, last) in zip(faults, s.fault_spans, strict=True):
            if f["kind"] not in precursor:
                continue
            a, b = max(first, 0), min(int(last), len(s.score) - 1)
            onsets["every fault"][lo + a: lo + b + 1] = 1
            caused = [e for e in s.episodes if e.cause == m.PRECURSOR and first <= e.onset <= last]
            if caused:
                onsets["faults that breach"][lo + a: lo + b + 1] = 1
                onsets["to the breach's end"][lo + a: lo + max(e.end for e in caused) + 1] = 1
        for e in s.episodes:
            if e.cause == m.PRECURSOR and e.fault_step is not None:
                onsets["ideal"][lo + max(0, m.warn_from(e, lead_max)): lo + e.end + 1] = 1
    rows = []
    for name in IDEALS:
        z = onsets[name]
        r = m.report(evaluate.series_scores(ds, "test", lambda ends, z=z: z[ends]), 0.5, lead_max, ds.step_s,
                     ds.window - 1, policy)
        rows.append({"alarm": name, "recall": round(r.recall[m.PRECURSOR], 3),
                     "mean_lead_s": round(r.mean_lead_s[m.PRECURSOR], 1),
                     "false_alarms_per_day": round(r.false_alarms_per_day, 2), "false_alarms": r.false_alarms})
    return rows


def summarise(horizon_s: int, lead_max: int, step_s: float, got: list[tuple[str, float]]) -> dict:
    leads = sorted((b for _, b in got), reverse=True)
    best = leads[: math.ceil(TARGET_RECALL * len(leads))]
    row: dict = {"horizon_s": horizon_s, "lead_window_s": lead_max * step_s, "breaches": len(leads)}
    for lead in LEADS_S:
        row[f"share_ge_{lead}s"] = round(sum(b >= lead for b in leads) / len(leads), 3) if leads else None
    row["mean_s"] = round(statistics.fmean(leads), 1) if leads else None
    row["median_s"] = statistics.median(leads) if leads else None
    row["best_60pct_mean_lead_s"] = round(statistics.fmean(best), 1) if best else None
    row["target_reachable"] = bool(best) and statistics.fmean(best) >= TARGET_LEAD_S
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, type=Path, help="a data set from `llmsla forecast dataset`")
    ap.add_argument("--horizons", default="30,120,300,600", help="horizons, seconds (comma-separated)")
    args = ap.parse_args()
    ds = Dataset.load(args.data)
    fc = config_mod.load().forecast
    lead_cfg, policy = fc.lead_max_steps, AlarmPolicy.from_config(fc)
    rows, kinds, ideals = [], [], []
    for h in (int(x) for x in args.horizons.split(",")):
        lead_max = accuracy.lead_steps(round(h / ds.step_s), lead_cfg)
        got = bounds(ds, lead_max)
        rows.append(summarise(h, lead_max, ds.step_s, got))
        ideals += [{"horizon_s": h, **r} for r in ideal_alarms(ds.with_horizon(round(h / ds.step_s)), lead_max, policy)]
        for kind in sorted({k for k, _ in got}):
            v = [b for k, b in got if k == kind]
            kinds.append({"horizon_s": h, "kind": kind, "breaches": len(v), "mean_s": round(statistics.fmean(v), 1),
                          "median_s": statistics.median(v), f"share_ge_{int(TARGET_LEAD_S)}s":
                          round(sum(b >= TARGET_LEAD_S for b in v) / len(v), 3)})
    print_table(rows, "Held-out precursor-fault breaches: seconds from the fault's start to the breach (causal bound)")
    print_table(kinds, "Per fault kind")
    print_table(ideals, "Ideal alarms scored by the evaluation (test split, the online alarm policy)")
    write_result("forecaster_bound", {"data": str(args.data), "digest": ds.digest(), "step_s": ds.step_s,
                                      "target": {"recall": TARGET_RECALL, "mean_lead_s": TARGET_LEAD_S},
                                      "rows": rows, "kinds": kinds, "ideal_alarms": ideals,
                                      "policy": policy.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
