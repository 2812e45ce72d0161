"""Forecast alerts: hysteresis per target and the Alertmanager webhook v4 poster.

The forecaster talks to alerting only over webhook v4, the payload Alertmanager itself sends,
so the receiver handles forecast alerts and burn-rate alerts with one code path (its policy
matches ``alertname``/``source``). Hysteresis: an alert fires after ``fire_steps`` consecutive
scores at or above the threshold (or ``fire_steps`` of the last ``fire_window``) and resolves after ``resolve_steps`` consecutive scores below
``resolve_ratio * threshold`` (:mod:`llmsla.forecaster.hysteresis`, the same alarm the
evaluation scores and picks thresholds for); a firing alert is re-sent every ``repeat_s``
(Alertmanager's repeat interval). A failed POST is kept and retried on the next step (bounded), so a receiver
restart loses no transition.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import urllib.error
import urllib.request
from collections import deque
from typing import Any

from llmsla import names
from llmsla.forecaster import decide
from llmsla.forecaster.decide import TargetAlarm
from llmsla.forecaster.horizons import label as horizon_label
from llmsla.forecaster.hysteresis import AlarmPolicy

log = logging.getLogger(__name__)

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert
RECEIVER = "llmsla-forecaster"


def rfc3339(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def fingerprint(labels: dict[str, str]) -> str:
    """16 hex digits identifying the label set (stable, like Alertmanager's)."""
    text = "\xff".join(f"{k}\xfe{labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def alert_labels(pool: str, replica: str, model: str, slo_name: str, horizon_s: float) -> dict[str, str]:
    """The label set the receiver's policy matches (docs/alerting.md): a forecast is a ticket-level
    warning from the forecaster, scoped to a replica or (no replica) its whole pool, for one
    horizon (``horizon`` = ``30s``, ``5m``: each horizon is its own alert, and the policy answers
    a warning minutes ahead with a slower action than one seconds ahead)."""
    labels = {names.L_ALERTNAME: names.FORECAST_ALERTNAME, names.L_SEVERITY: names.SEVERITY_TICKET,
              names.L_SOURCE: names.SOURCE_FORECASTER, names.L_SLO: slo_name, names.L_MODEL: model,
              names.L_POOL: pool, names.L_SCOPE: names.SCOPE_REPLICA if replica else names.SCOPE_POOL,
              names.L_HORIZON: horizon_label(horizon_s)}
    if replica:
        labels[names.L_REPLICA] = replica
    return labels


def payload(status: str, alert: dict[str, Any], external_url: str) -> dict[str, Any]:
    """One webhook v4 notification for one alert (its group: alertname, pool, replica)."""
    labels = alert["labels"]
    group = {k: labels[k] for k in (names.L_ALERTNAME, names.L_POOL, names.L_REPLICA) if k in labels}
    group_key = "{}:{" + ", ".join(f'{k}="{v}"' for k, v in group.items()) + "}"
    return {
        "version": "4", "groupKey": group_key, "truncatedAlerts": 0, "status": status, "receiver": RECEIVER,
        "groupLabels": group, "commonLabels": dict(labels), "commonAnnotations": dict(alert["annotations"]),
        "externalURL": external_url, "alerts": [alert],
    }


class Hysteresis:
    """Per-target alarms (:mod:`decide` makes every transition); :meth:`update` returns the
    notifications to send, rendered as webhook v4 alerts."""

    def __init__(self, threshold: float, *, fire_steps: int, resolve_steps: int, resolve_ratio: float,
                 repeat_s: float, horizon_s: int, generator_url: str = "", fire_window: int = 0) -> None:
        self.threshold = threshold
        self.policy = AlarmPolicy(fire_steps, resolve_steps, resolve_ratio, fire_window=fire_window)
        self.resolve_below = threshold * resolve_ratio
        self.repeat_ms = int(repeat_s * 1000)
        self.horizon_s = horizon_s
        self.generator_url = generator_url
        self.states: dict[str, TargetAlarm] = {}

    def _alert(self, st: TargetAlarm, status: str, risk: float, now_ms: int, *, why: str = "",
               breach_ms: int | None = None) -> dict[str, Any]:
        replica = st.labels.get(names.L_REPLICA, "")
        target = f"{st.labels[names.L_POOL]}/{replica or '*'}"
        what = f"replica {replica}" if replica else "the pool"
        ann = {names.ANN_RISK: f"{risk:.4f}", names.ANN_THRESHOLD: f"{self.threshold:.4f}",
               names.ANN_HORIZON_S: str(self.horizon_s),
               names.ANN_SUMMARY: (f"{st.labels[names.L_SLO]} SLO breach forecast within {self.horizon_s} s for {what} "
                                   f"of pool {st.labels[names.L_POOL]} (risk {risk:.2f} >= {self.threshold:.2f})"
                                   if status == "firing" else why or f"forecast risk for {target} back below "
                                   f"{self.resolve_below:.2f}")}
        if status == "firing":
            ann[names.ANN_PREDICTED_BREACH] = rfc3339(now_ms + self.horizon_s * 1000 if breach_ms is None else breach_ms)
        return {"status": status, "labels": dict(st.labels), "annotations": ann,
                "startsAt": rfc3339(st.starts_ms), "endsAt": ZERO_TIME if status == "firing" else rfc3339(now_ms),
                "generatorURL": self.generator_url, "fingerprint": fingerprint(st.labels)}

    def update(self, key: str, risk: float, now_ms: int, labels: dict[str, str], *,
               breach_ms: int | None = None) -> list[tuple[str, dict]]:
        """Feed one score; ``breach_ms`` is when the breach is expected (default: now + this
        alarm's horizon), the firing alert's ``predicted_breach_at``."""
        status, st = decide.on_score(self.states.get(key, TargetAlarm()), risk, now_ms, labels,
                                     threshold=self.threshold, policy=self.policy, repeat_ms=self.repeat_ms)
        self.states[key] = st
        return [] if status is None else [(status, self._alert(st, status, risk, now_ms, breach_ms=breach_ms))]

    def expire(self, key: str, now_ms: int, why: str) -> list[tuple[str, dict]]:
        """The target has nothing left to forecast (no traffic): its alarm is forgotten and a firing
        alert resolves (:func:`decide.on_idle`); traffic brings the target back with a fresh alarm."""
        st = self.states.pop(key, None)
        status = decide.on_idle(st)
        if st is None or status is None:
            return []
        return [(status, self._alert(st, status, float("nan"), now_ms, why=why))]

    def firing_keys(self) -> list[str]:
        return [k for k, st in self.states.items() if st.firing]


class WebhookPoster:
    """POSTs webhook v4 JSON to the receiver; failures are queued and retried next time."""

    def __init__(self, url: str, *, token: str = "", timeout_s: float = 5.0, max_pending: int = 1000) -> None:
        self.url, self.token, self.timeout_s = url, token, timeout_s
        self.pending: deque[dict] = deque(maxlen=max_pending)
        self.sent = 0
        self.failed = 0

    def _post(self, body: dict) -> None:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "llmsla-forecaster"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            resp.read()

    def send(self, bodies: list[dict]) -> list[tuple[dict, str]]:
        """Send queued then new notifications in order; returns (body, outcome) per attempt."""
        self.pending.extend(bodies)
        results = []
        while self.pending:
            body = self.pending[0]
            try:
                self._post(body)
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500 and exc.code not in (408, 429):  # the receiver refused it: retrying cannot help
                    self.pending.popleft()
                    self.failed += 1
                    log.error("forecast alert to %s refused: HTTP %s %s", self.url, exc.code, exc.reason)
                    results.append((body, f"refused {exc.code}"))
                    continue
                self.failed += 1
                results.append((body, "failed"))
                break
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                self.failed += 1
                log.warning("forecast alert to %s failed (%s); %d pending, retried next step",
                            self.url, exc, len(self.pending))
                results.append((body, "failed"))
                break
            self.pending.popleft()
            self.sent += 1
            results.append((body, "sent"))
        return results
