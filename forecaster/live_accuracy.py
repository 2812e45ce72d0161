"""The I/O shell of the live accuracy: stored risks and breaches in, gauges out.

Every ``forecast.accuracy_every_steps`` steps the online scorer asks for the forecaster's own
precision, recall, lead and false alarms per day over the last ``forecast.accuracy_window_s``
(:mod:`llmsla.forecaster.accuracy` scores; this module reads and exports). Breaches are the
labels' own: the request windows through :func:`llmsla.forecaster.features.build` (the SLO
counts) and :func:`llmsla.forecaster.slo.breaches` (the SLO catalog's objectives).

History is read in one-hour chunks; a chunk that ended more than ``reread_s`` ago is kept (the
online scorer reads no later upsert either), so after the first pass an evaluation reads about
the newest hour. See docs/forecaster.md#its-own-accuracy-live.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeHistogramMetricFamily
from prometheus_client.registry import Collector

from llmsla import names
from llmsla.forecaster import accuracy, features, store_io
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster import windowing as w
from llmsla.forecaster.hysteresis import AlarmPolicy
from llmsla.seams import StoreReader

STEP_MS = features.STEP_MS
CHUNK_STEPS = 720  # one hour of 5 s steps
CHUNK_MS = CHUNK_STEPS * STEP_MS
#: steps before the window's start read as context: an alarm already on, a breach already going
CONTEXT_STEPS = 120
LEAD_BUCKETS = (5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)


@dataclass
class Chunk:
    """One hour of history from ``start_ms``: breaches per target id, and risk / threshold per
    (horizon_s, target id); NaN where not scored."""

    start_ms: int
    breach: dict[str, np.ndarray]
    risk: dict[tuple[int, str], np.ndarray]


def read_chunk(conn: StoreReader, start_ms: int, slos: list[slo_mod.SloTarget], slo_window_steps: int,
               prefer: str) -> Chunk:
    pre = (slo_window_steps - 1) * STEP_MS  # an SLO window reaches back this far
    req = store_io.read_table(conn, names.T_REQUEST_WINDOWS, w.REQUEST_KEYS, w.REQUEST_VALUES,
                              start_ms - pre, start_ms + CHUNK_MS)
    breach: dict[str, np.ndarray] = {}
    targets = features.targets_of(req)
    if targets:
        ts = features.build(req, w.empty(w.GPU_KEYS, w.GPU_VALUES), w.empty(w.POLICY_KEYS, w.POLICY_VALUES),
                            targets=targets, t0_ms=start_ms - pre, n_steps=CHUNK_STEPS + slo_window_steps - 1,
                            slos=slos)
        b = slo_mod.breaches(ts.counts, slos, slo_window_steps)[:, slo_window_steps - 1:]
        breach = {t.id: b[j] for j, t in enumerate(targets)}
    risk: dict[tuple[int, str], np.ndarray] = {}
    for ts_ms, pool, replica, horizon_s, threshold, r in store_io.read_forecasts(conn, start_ms, start_ms + CHUNK_MS,
                                                                                  prefer):
        key = (int(horizon_s), features.Target(pool, replica).id)
        if key not in risk:
            risk[key] = np.full(CHUNK_STEPS, np.nan)
        risk[key][(int(ts_ms) - start_ms) // STEP_MS] = float(r) / float(threshold)
    return Chunk(start_ms, breach, risk)


class LiveAccuracy:
    """Scores the stored history per horizon and keeps the settled chunks between calls."""

    def __init__(self, slos: list[slo_mod.SloTarget], *, slo_window_steps: int, policy: AlarmPolicy,
                 lead_max_steps: int, window_s: float, settle_s: float, prefer: str = "") -> None:
        self.slos = slos
        self.slo_window_steps = slo_window_steps
        self.policy = policy
        self.lead_max_steps = lead_max_steps
        self.window_steps = max(1, int(window_s * 1000) // STEP_MS)
        self.settle_ms = int(settle_s * 1000) + STEP_MS
        self.prefer = prefer
        self.chunks: dict[int, Chunk] = {}

    def evaluate(self, conn: StoreReader, last_step_ms: int) -> dict[int, accuracy.Accuracy]:
        """Accuracy per horizon (seconds) over the window ending with the step starting at
        ``last_step_ms`` (the newest step whose request windows are in the store)."""
        last_step_ms -= last_step_ms % STEP_MS
        start_ms = last_step_ms - (self.window_steps - 1) * STEP_MS
        horizons = {h for c in self.chunks.values() for h, _ in c.risk}
        longest = max((accuracy.lead_steps(round(h / names.REQUEST_WINDOW_S), self.lead_max_steps) for h in horizons),
                      default=self.lead_max_steps)
        t0 = start_ms - (longest + CONTEXT_STEPS) * STEP_MS
        t0 -= t0 % CHUNK_MS
        n = (last_step_ms - t0) // STEP_MS + 1
        for cs in list(self.chunks):
            if cs < t0:
                del self.chunks[cs]
        chunks = []
        for cs in range(t0, last_step_ms + 1, CHUNK_MS):
            c = self.chunks.get(cs)
            if c is None:
                c = read_chunk(conn, cs, self.slos, self.slo_window_steps, self.prefer)
                if cs + CHUNK_MS <= last_step_ms - self.settle_ms:  # settled: no later upsert is read
                    self.chunks[cs] = c
            chunks.append(c)
        out = {}
        for h in sorted({h for c in chunks for h, _ in c.risk}):
            lead = accuracy.lead_steps(round(h / names.REQUEST_WINDOW_S), self.lead_max_steps)
            ids = sorted({t for c in chunks for hh, t in c.risk if hh == h})
            tracks = []
            for tid in ids:
                risk = np.concatenate([c.risk.get((h, tid), np.full(CHUNK_STEPS, np.nan)) for c in chunks])[:n]
                breach = np.concatenate([c.breach.get(tid, np.zeros(CHUNK_STEPS, bool)) for c in chunks])[:n]
                tracks.append(accuracy.Track(tid, risk, breach))
            out[h] = accuracy.score(tracks, horizon_s=h, step_s=names.REQUEST_WINDOW_S,
                                    start=(start_ms - t0) // STEP_MS, lead=lead, policy=self.policy)
        return out


class LeadHistogram(Collector):
    """``llmsla_forecast_lead_seconds``: the leads of the warned breaches in the rolling window,
    as a gauge histogram (it is recomputed from the store, not accumulated: a restart loses
    nothing and counts nothing twice)."""

    def __init__(self) -> None:
        self.leads: dict[int, list[float]] = {}

    def collect(self) -> Iterator[GaugeHistogramMetricFamily]:
        fam = GaugeHistogramMetricFamily(names.FORECAST_LEAD_SECONDS,
                                         "Lead of each breach the forecaster warned of, rolling window, seconds",
                                         labels=[names.L_HORIZON])
        for h, leads in sorted(self.leads.items()):
            a = np.asarray(leads, float)
            buckets = [(f"{le:g}", float((a <= le).sum())) for le in LEAD_BUCKETS] + [("+Inf", float(len(a)))]
            fam.add_metric([str(h)], buckets, float(a.sum()))
        yield fam


class AccuracyMetrics:
    """The gauges of the live accuracy, per horizon, and the serving model's validation recall."""

    def __init__(self, registry: CollectorRegistry) -> None:
        by = [names.L_HORIZON]
        self.precision = Gauge(names.FORECAST_PRECISION, "Share of the forecaster's judged alert notifications "
                               "that were not false alarms, rolling window", by, registry=registry)
        self.recall = Gauge(names.FORECAST_RECALL, "Share of judged SLO breaches the forecaster warned of ahead, "
                            "rolling window", by, registry=registry)
        self.false_alarms = Gauge(names.FORECAST_FALSE_ALARMS_PER_DAY, "Forecaster false alarms per healthy "
                                  "target-day, rolling window", by, registry=registry)
        self.breaches = Gauge(names.FORECAST_BREACHES, "SLO breaches judged in the rolling window (what the "
                              "recall rests on)", by, registry=registry)
        self.validation_recall = Gauge(names.FORECAST_VALIDATION_RECALL, "Recall of every breach on the serving "
                                       "model's validation split", [names.L_MODEL, names.L_HORIZON], registry=registry)
        self.lead = LeadHistogram()
        registry.register(self.lead)

    def set(self, acc: dict[int, accuracy.Accuracy]) -> None:
        for h, a in acc.items():
            label = str(h)
            self.precision.labels(label).set(a.precision)
            self.recall.labels(label).set(a.recall)
            self.false_alarms.labels(label).set(a.false_alarms_per_day)
            self.breaches.labels(label).set(a.events)
        self.lead.leads = {h: list(a.leads_s) for h, a in acc.items()}
