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
    lead_cfg = config_mod.load().forecast.lead_max_steps
    rows, kinds = [], []
    for h in (int(x) for x in args.horizons.split(",")):
        lead_max = accuracy.lead_steps(round(h / ds.step_s), lead_cfg)
        got = bounds(ds, lead_max)
        rows.append(summarise(h, lead_max, ds.step_s, got))
        for kind in sorted({k for k, _ in got}):
            v = [b for k, b in got if k == kind]
            kinds.append({"horizon_s": h, "kind": kind, "breaches": len(v), "mean_s": round(statistics.fmean(v), 1),
                          "median_s": statistics.median(v), f"share_ge_{int(TARGET_LEAD_S)}s":
                          round(sum(b >= TARGET_LEAD_S for b in v) / len(v), 3)})
    print_table(rows, "Held-out precursor-fault breaches: seconds from the fault's start to the breach (causal bound)")
    print_table(kinds, "Per fault kind")
    write_result("forecaster_bound", {"data": str(args.data), "digest": ds.digest(), "step_s": ds.step_s,
                                      "target": {"recall": TARGET_RECALL, "mean_lead_s": TARGET_LEAD_S},
                                      "rows": rows, "kinds": kinds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
