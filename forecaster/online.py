"""The online scorer: every step, the latest windows of every target scored in one batch.

One process scores every target of a store (replicas and pools): it holds the last W steps of
request, GPU and policy windows, re-reading only the newest (``window_cache.py``) in three
queries, builds the same features as training for the steps that changed (``feature_window.py``), runs
one batched forward pass, exports ``llmsla_forecast_risk``, upserts the scores into
``forecasts`` and posts firing/resolved alerts (webhook v4, hysteresis) to the receiver. A model
with several horizons gives every target one risk per horizon from the same forward pass; each
horizon has its own threshold, hysteresis and alert (docs/forecaster.md#several-horizons).

The step scored is the last 5 s window that ended at least ``lag_s`` ago, so the streaming job
has written it. A step whose window is missing for every target (streaming down, no traffic) is
skipped with that reason rather than scored on imputed data.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import psycopg
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmsla import names
from llmsla.config import Config
from llmsla.forecaster import accuracy, alerts, decide, features, store_io
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.artifact import Artifact
from llmsla.forecaster.dataset import fleet_inputs
from llmsla.forecaster.feature_window import FeatureWindow
from llmsla.forecaster.hysteresis import AlarmPolicy
from llmsla.forecaster.live_accuracy import AccuracyMetrics, LiveAccuracy
from llmsla.forecaster.window_cache import WindowCache

log = logging.getLogger(__name__)
STEP_MS = features.STEP_MS


@dataclass
class StepResult:
    step_ms: int  # start of the window scored
    scored: int = 0
    skipped: str = ""  # why nothing was scored
    risks: dict[str, float] = field(default_factory=dict)  # the shortest horizon's
    horizon_risks: dict[str, list[float]] = field(default_factory=dict)  # one per horizon, ascending
    idle: list[str] = field(default_factory=list)  # targets not scored: no requests for forecast.idle_s
    notifications: list[tuple[str, dict]] = field(default_factory=list)
    seconds: float = 0.0
    score_seconds: float = 0.0
    #: the forecaster's own accuracy per horizon (s), on the steps it was scored (accuracy_every_steps)
    accuracy: dict[int, accuracy.Accuracy] | None = None


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.risk = Gauge(names.FORECAST_RISK, "Forecast probability of an SLO breach within the horizon",
                          [names.L_TARGET, names.L_MODEL, names.L_POOL, names.L_REPLICA, names.L_HORIZON],
                          registry=registry)
        self.score_seconds = Histogram(names.FORECAST_SCORE_SECONDS, "Time to score one batch of targets, seconds",
                                       registry=registry, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.notifications = Counter(names.FORECAST_NOTIFICATIONS, "Forecast alert notifications to the receiver",
                                     [names.L_STATUS, names.L_OUTCOME], registry=registry)


class BatchScorer:
    """Model + scaler: ``[targets, W, C]`` inputs -> risks, one forward pass. The features are
    the artifact's own list (:attr:`feature_names`), so a model keeps scoring after the default
    list changes."""

    def __init__(self, art: Artifact) -> None:
        if art.meta.get("mode") != "fleet":
            raise ValueError("the online scorer needs a fleet-mode artifact (not a univariate one)")
        if art.scaler is None:  # artifact.load reads one for every fleet-mode artifact
            raise ValueError("the online scorer needs a fleet-mode artifact with its scaler")
        self.feature_names = tuple(art.meta.get("features") or features.FEATURES)
        bad = features.unknown_features(self.feature_names)
        if bad:
            raise ValueError(f"model {art.version} reads features {bad} this llmsla cannot build: upgrade llmsla")
        self.art = art
        self.model = art.model
        self.scaler = art.scaler

    def prepare(self, x: np.ndarray, present: np.ndarray) -> np.ndarray:
        """Features (:attr:`feature_names`) and masks -> model inputs, step by step (so they can
        be rolled forward)."""
        return fleet_inputs(features.transform(x, self.feature_names), present, self.scaler)

    def inputs(self, ts: features.TargetSeries) -> np.ndarray:
        return ts.extra["inputs"] if "inputs" in ts.extra else self.prepare(ts.x, ts.present)

    def score(self, x: np.ndarray) -> np.ndarray:
        """Risks ``[targets]`` (one horizon) or ``[targets, horizons]``."""
        if not np.all(np.isfinite(x)):
            raise FloatingPointError("non-finite model input")  # fleet_inputs never yields one
        return self.model.risk(torch.from_numpy(x)).numpy().astype(float)

    def risks(self, x: np.ndarray) -> np.ndarray:
        """Risks ``[targets, horizons]``, whatever the number of horizons."""
        r = self.score(x)
        return r[:, None] if r.ndim == 1 else r


class OnlineScorer:
    def __init__(self, art: Artifact, cfg: Config, dsn: str, *, registry: CollectorRegistry | None = None,
                 poster: alerts.WebhookPoster | None = None, external_url: str = "") -> None:
        self.cfg = cfg
        self.fc = cfg.forecast
        self.scorer = BatchScorer(art)
        self.window = art.window
        self.slos = slo_mod.from_config(cfg)
        self.gpu_map = features.gpu_map_from(self.fc.gpu_map)
        self.dsn = dsn
        self.name = f"lstm-{art.version}"
        self.horizon_s = art.horizon * names.REQUEST_WINDOW_S  # the shortest
        self.horizons_s = [h * names.REQUEST_WINDOW_S for h in art.horizons]
        self.thresholds = art.thresholds
        registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(registry)
        self.accuracy_metrics = AccuracyMetrics(registry)
        self._export_validation_recall(art)
        self.poster = poster
        self.external_url = external_url
        policy = AlarmPolicy.from_config(self.fc)
        trained = art.meta.get("alarm_policy")
        if trained is not None and trained != policy.to_dict():
            log.warning("the threshold of model %s was chosen for the alarm %s; [forecast] sets %s, so its false "
                        "alarm rate is not the evaluated one", art.version, trained, policy.to_dict())
        #: one alarm per horizon, each with its own threshold and state per target
        self.hysts = [self._alarm(hs, thr) for hs, thr in zip(self.horizons_s, self.thresholds, strict=True)]
        self.hyst = self.hysts[0]
        self.live_accuracy = LiveAccuracy(self.slos, slo_window_steps=self.fc.slo_window_steps, policy=policy,
                                          lead_max_steps=self.fc.lead_max_steps, window_s=self.fc.accuracy_window_s,
                                          settle_s=max(self.fc.reread_s, self.fc.lag_s), prefer=self.name)
        self._steps = 0
        self._conn = None
        self.cache = WindowCache(int(self.fc.reread_s * 1000))
        self.features = FeatureWindow(self.window, self.slos, self.gpu_map, prepare=self.scorer.prepare,
                                      feature_names=self.scorer.feature_names)

    def swap(self, art: Artifact) -> None:
        """Serve ``art`` from the next step on (a newly promoted champion): its scaler, thresholds,
        horizons and window; the window cache and the alarm states of the horizons both models
        have are kept, the features rebuilt once (the inputs depend on the scaler). Raises
        ValueError for a model the scorer cannot serve."""
        scorer = BatchScorer(art)
        self.scorer, self.window = scorer, art.window
        self.name = f"lstm-{art.version}"
        self.horizon_s = art.horizon * names.REQUEST_WINDOW_S
        horizons_s = [h * names.REQUEST_WINDOW_S for h in art.horizons]
        kept = dict(zip(self.horizons_s, self.hysts, strict=True))
        self.hysts = []
        for hs, thr in zip(horizons_s, art.thresholds, strict=True):
            hyst = kept.get(hs) or self._alarm(hs, thr)
            hyst.threshold, hyst.resolve_below, hyst.horizon_s = thr, thr * self.fc.resolve_ratio, hs
            self.hysts.append(hyst)
        self.hyst = self.hysts[0]
        self.horizons_s, self.thresholds = horizons_s, art.thresholds
        self.live_accuracy.prefer = self.name
        self._export_validation_recall(art)
        self.features = FeatureWindow(self.window, self.slos, self.gpu_map, prepare=scorer.prepare,
                                      feature_names=scorer.feature_names)

    def _alarm(self, horizon_s: int, threshold: float) -> alerts.Hysteresis:
        """A horizon's alarm under the ``[forecast]`` alarm policy."""
        return alerts.Hysteresis(threshold, fire_steps=self.fc.fire_steps, resolve_steps=self.fc.resolve_steps,
                                 resolve_ratio=self.fc.resolve_ratio, repeat_s=self.fc.repeat_s,
                                 horizon_s=horizon_s, generator_url=self.external_url,
                                 fire_window=self.fc.fire_window)

    def _export_validation_recall(self, art: Artifact) -> None:
        """The model's validation recall per horizon where the artifact records it (the drift
        alert compares the live recall with it, per horizon)."""
        per = art.meta.get("horizon_metrics") or [{"val": (art.meta.get("metrics") or {}).get("val")}]
        for hs, hm in zip(self.horizons_s[:len(per)], per[:len(self.horizons_s)], strict=True):
            self.accuracy_metrics.validation_recall.labels(self.name, str(hs)).set(
                accuracy.validation_recall({"metrics": {"val": hm.get("val")}}))

    def _connection(self):
        from llmsla.store import connect

        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, timeout_s=self.cfg.store.connect_timeout_s)
        return self._conn

    def _drop_gauge(self, t: features.Target, model: str) -> None:
        for hs in self.horizons_s:
            with contextlib.suppress(KeyError):  # never exported
                self.metrics.risk.remove(t.kind, model, t.pool, t.replica, str(hs))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def score_accuracy(self, conn, step_ms: int) -> dict[int, accuracy.Accuracy] | None:  # noqa: ANN001 - psycopg
        """The forecaster's own accuracy up to ``step_ms``, exported; a failure is logged and the
        scoring goes on (its gauges keep their last values)."""
        try:
            acc = self.live_accuracy.evaluate(conn, step_ms)
        except (psycopg.Error, ValueError) as e:
            conn.rollback()
            log.warning("forecaster accuracy not scored at %s: %s", alerts.rfc3339(step_ms), e)
            return None
        self.accuracy_metrics.set(acc)
        return acc

    def step_for(self, now_ms: int) -> int:
        """Start of the newest window that ended at least ``lag_s`` before ``now_ms``."""
        ready = now_ms - int(self.fc.lag_s * 1000)
        return ready - ready % STEP_MS - STEP_MS

    def step(self, now_ms: int) -> StepResult:
        t_start = time.perf_counter()
        step_ms = self.step_for(now_ms)
        res = StepResult(step_ms)
        t0 = step_ms - (self.window - 1) * STEP_MS
        conn = self._connection()
        req, gpu, pol, eng = self.cache.read(conn, t0, step_ms + STEP_MS)
        if not np.any(req["bucket"] == step_ms):
            res.skipped = f"no request windows at {alerts.rfc3339(step_ms)} (streaming behind or no traffic)"
            res.seconds = time.perf_counter() - t_start
            return res
        ts = self.features.update(req, gpu, pol, t0_ms=t0, changed_from_ms=self.cache.changed_from_ms, eng=eng)
        targets = ts.targets
        x = self.scorer.inputs(ts)
        t_score = time.perf_counter()
        risk = self.scorer.risks(x)
        res.score_seconds = time.perf_counter() - t_score
        self.metrics.score_seconds.observe(res.score_seconds)
        rows, bodies = [], []
        # a target that served nothing for idle_s has nothing to forecast (a drained replica):
        # not scored, its gauge dropped, a firing alert resolved; so is one gone from the windows
        idle_steps = decide.idle_steps(self.fc.idle_s, self.window)
        served = ts.present[:, -idle_steps:, 0].any(axis=1)
        now_ms = step_ms + STEP_MS
        why = f"no requests for {idle_steps * names.REQUEST_WINDOW_S} s: nothing to forecast"
        firing = sorted({k for h in self.hysts for k in h.firing_keys()})
        gone = decide.vanished(firing, (t.id for j, t in enumerate(targets) if served[j]))
        for key in gone:
            res.idle.append(key)
            for hyst in self.hysts:
                for status, alert in hyst.expire(key, now_ms, why):
                    res.notifications.append((status, alert))
                    bodies.append(alerts.payload(status, alert, self.external_url))
        for j, t in enumerate(targets):
            if not served[j]:
                if t.id not in gone:
                    res.idle.append(t.id)
                for hyst in self.hysts:
                    hyst.states.pop(t.id, None)
                self._drop_gauge(t, ts.models[j])
                continue
            rs = [float(v) for v in risk[j]]
            res.risks[t.id] = rs[0]
            res.horizon_risks[t.id] = rs
            worst = int(np.argmax(ts.signals[j, -1]))
            slo_name = next((s.name for s in self.slos if s.sli == features.SIGNALS[worst]), self.slos[0].name)
            breach_s = decide.breach_in_s(rs, self.thresholds, self.horizons_s)
            for hyst, hs, thr, r in zip(self.hysts, self.horizons_s, self.thresholds, rs, strict=True):
                self.metrics.risk.labels(t.kind, ts.models[j], t.pool, t.replica, str(hs)).set(r)
                rows.append((step_ms, self.name, t.kind, t.pool, t.replica, hs, None, thr, r))
                labels = alerts.alert_labels(t.pool, t.replica, ts.models[j], slo_name, hs)
                breach_ms = now_ms + int(1000 * (hs if breach_s is None else min(breach_s, hs)))
                for status, alert in hyst.update(t.id, r, now_ms, labels, breach_ms=breach_ms):
                    res.notifications.append((status, alert))
                    bodies.append(alerts.payload(status, alert, self.external_url))
        store_io.write_forecasts(conn, rows)
        res.scored = len(res.risks)
        every = self.fc.accuracy_every_steps
        self._steps += 1
        if every and (self._steps - 1) % every == 0:
            res.accuracy = self.score_accuracy(conn, step_ms)
        if self.poster is not None and (bodies or self.poster.pending):
            for body, outcome in self.poster.send(bodies):
                self.metrics.notifications.labels(body["status"], outcome).inc()
        res.seconds = time.perf_counter() - t_start
        return res
