"""What the demo tells: the fault's timeline and, afterwards, what happened, from the data.

Every figure of the summary comes from where an SRE would look for it: latency percentiles are
exact, over the RequestEvents in the spool (an independent reference for the windows); SLO
attainment and the breach time from the stream job's windows in the store; alerts, decisions and
actions from the receiver's audit rows in ``action_log``; nothing is taken from the simulator's
own bookkeeping except the fault label (what was injected, where, when).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmsla import names, spool
from llmsla.config import Config

TRACE = "azure_conv"


@dataclass(frozen=True)
class Story:
    """The run's timeline in simulated seconds: ``history_s`` replayed at once (the forecaster's
    input window and the dashboards' past), then ``live_s`` paced in real time. ``replica``
    degrades gradually (a ramp from ``fault_start``: what the forecaster learned to see coming),
    then dies (a crash from ``crash_start`` to ``fault_end``: what the burn-rate rules page on);
    times are fractions of the live part."""

    live_s: float
    history_s: float = 400.0
    replica: str = "r1"
    factor: float = 4.0
    fault_start: float = 0.2
    crash_start: float = 0.7
    fault_end: float = 0.8
    seed: int = 7
    #: Live seconds before the alerting rules load (demo_stack.Stack.arm_alerts), < fault start.
    arm_alerts_s: float = 20.0

    def _at(self, fraction: float) -> float:
        return self.history_s + fraction * self.live_s

    @property
    def fault_window_s(self) -> tuple[float, float]:
        return self._at(self.fault_start), self._at(self.fault_end)

    def simulate_args(self) -> list[str]:
        """The trace replayed as the forecaster's training data replays it (fleet, stretch, rate:
        fleet/scenarios.py), so the model sees the traffic it learned."""
        from llmsla.fleet.scenarios import TRACES

        setup = TRACES[TRACE]
        ramp = f"ramp:{self.replica}:{self._at(self.fault_start):g}:{self._at(self.crash_start):g}:{self.factor:g}"
        crash = f"crash:{self.replica}:{self._at(self.crash_start):g}:{self._at(self.fault_end):g}"
        trace_s = (self.history_s + self.live_s) / setup.time_scale  # --duration is in trace seconds
        return ["--trace", TRACE, "--duration", f"{trace_s:g}", "--fleet", setup.fleet,
                "--time-scale", f"{setup.time_scale:g}", "--rate-mult", f"{setup.rate:g}",
                "--realtime", "1", "--live-from", f"{self.history_s:g}", "--sessions", "3",
                "--fault", ramp, "--fault", crash, "--seed", str(self.seed)]


@dataclass
class Timeline:
    """Epoch ms of the run's marks, from the simulator's summary (its fault label)."""

    start_ms: int
    live_ms: int
    fault_start_ms: int
    fault_end_ms: int
    end_ms: int

    @classmethod
    def of(cls, story: Story, sim: dict[str, Any]) -> Timeline:
        start = int(sim["start_ms"])
        faults = sim["faults"]
        return cls(start, start + round(story.history_s * 1000), min(int(f["start_ms"]) for f in faults),
                   max(int(f["end_ms"]) for f in faults),
                   start + round((story.history_s + story.live_s) * 1000))

    def phases(self) -> dict[str, tuple[int, int]]:
        return {"before": (self.start_ms, self.fault_start_ms), "during": (self.fault_start_ms, self.fault_end_ms),
                "after": (self.fault_end_ms, self.end_ms)}


@dataclass
class Summary:
    requests: int = 0
    windows: dict[str, int] = field(default_factory=dict)
    latency: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    breaches: dict[str, int] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    share: dict[str, float | None] = field(default_factory=dict)


def exact_latency(spool_dir: Path, tl: Timeline, replica: str) -> tuple[int, dict]:
    """P99 TTFT and E2E per phase, pool-wide and on the faulty replica, over every RequestEvent."""
    rows = []
    for seg in spool.published_segments(spool_dir, names.SPOOL_REQUESTS):
        for ev in spool.read_segment(seg, names.SPOOL_REQUESTS):
            if isinstance(ev, spool.BadLine):
                continue
            rows.append((ev.ts_ms, ev.replica == replica, ev.ttft_ms if ev.ttft_ms is not None else np.nan, ev.e2e_ms))
    if not rows:
        return 0, {}
    a = np.array(rows, dtype=float)
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for phase, (lo, hi) in tl.phases().items():
        in_phase = (a[:, 0] >= lo) & (a[:, 0] < hi)
        for scope, mask in (("pool", in_phase), (replica, in_phase & (a[:, 1] == 1))):
            sel = a[mask]
            ttft = sel[:, 2][~np.isnan(sel[:, 2])]
            out.setdefault(scope, {})[phase] = {
                "requests": int(len(sel)),
                "ttft_p99_ms": float(np.quantile(ttft, 0.99, method="inverted_cdf")) if len(ttft) else None,
                "e2e_p99_ms": float(np.quantile(sel[:, 3], 0.99, method="inverted_cdf")) if len(sel) else None,
            }
    return len(a), out


def first_breaches(conn: Any, cfg: Config, tl: Timeline, replica: str) -> dict[str, int]:
    """Epoch ms at which each SLO first breached in the live part, per target ("pool", replica):
    the forecaster's definition - the share of good events over the trailing 12 windows (60 s,
    counts merged exactly) below the objective."""
    from llmsla.forecaster.slo import SLI_AVAILABILITY, SLI_E2E, SLI_TTFT, from_config

    out: dict[str, int] = {}
    for slo in from_config(cfg):
        def columns(statuses: frozenset[str]) -> str:
            return " + ".join(names.STATUS_COLUMNS[s] for s in sorted(statuses))

        bad_of = {SLI_TTFT: "ttft_count - ttft_within_slo", SLI_E2E: "requests - e2e_within_slo",
                  SLI_AVAILABILITY: columns(slo.failed)}
        total_of = {SLI_TTFT: "ttft_count", SLI_E2E: "requests", SLI_AVAILABILITY: columns(slo.counted)}
        for scope, where in (("pool", ""), (replica, "AND replica = %(rep)s")):
            row = conn.execute(f"""
                WITH w AS (
                    SELECT bucket, sum({bad_of[slo.sli]}) AS bad, sum({total_of[slo.sli]}) AS total
                    FROM {names.T_REQUEST_WINDOWS}
                    WHERE pool = %(pool)s AND bucket >= to_timestamp(%(lo)s / 1000.0) - interval '60 s'
                      AND bucket < to_timestamp(%(hi)s / 1000.0) {where}
                    GROUP BY bucket),
                r AS (SELECT bucket, sum(bad) OVER t AS bad, sum(total) OVER t AS total FROM w
                      WINDOW t AS (ORDER BY bucket RANGE BETWEEN interval '55 s' PRECEDING AND CURRENT ROW))
                SELECT min(extract(epoch FROM bucket) * 1000 + {names.REQUEST_WINDOW_S * 1000})
                FROM r WHERE bucket >= to_timestamp(%(lo)s / 1000.0) AND total > 0
                  AND 1 - bad::float / total < %(objective)s""",
                {"pool": names.DEFAULT_POOL, "lo": tl.live_ms, "hi": tl.end_ms, "rep": replica,
                 "objective": slo.objective}).fetchone()
            if row and row[0] is not None:
                out[f"{scope}/{slo.name}"] = int(row[0])
    return out


def audited(conn: Any, since_ms: int, until_ms: int | None = None) -> tuple[list[dict], list[dict]]:
    """The receiver's alert rows since ``since_ms`` and its action rows from then until
    ``until_ms`` (the end of the run: later, the fleet it acted on is gone), oldest first."""
    rows = conn.execute(f"""
        SELECT extract(epoch FROM ts) * 1000, action, target, alertname, alert_status, decision, outcome, params
        FROM {names.T_ACTION_LOG} WHERE source = 'alert_receiver' AND ts >= to_timestamp(%s / 1000.0)
        ORDER BY ts, id""", (since_ms,)).fetchall()
    alerts, actions = [], []
    for ts, action, target, alertname, status, decision, outcome, params in rows:
        row = {"ts_ms": int(ts), "target": target, "decision": decision, "outcome": outcome}
        if action == "alert":
            labels = (params or {}).get("labels", {})
            alerts.append({**row, "alertname": alertname, "status": status, "source": labels.get(names.L_SOURCE),
                           "severity": labels.get(names.L_SEVERITY), "slo": labels.get(names.L_SLO),
                           "scope": labels.get("scope")})
        elif until_ms is None or row["ts_ms"] < until_ms:
            actions.append({**row, "action": action, "params": {k: v for k, v in (params or {}).items()
                                                                if k not in ("labels", "groupKey")}})
    return alerts, actions


def traffic_share(conn: Any, replica: str, lo_ms: int, hi_ms: int) -> float | None:
    """The replica's share of its pool's requests between two instants (store windows)."""
    row = conn.execute(f"""
        SELECT coalesce(sum(requests) FILTER (WHERE replica = %s), 0)::float / nullif(sum(requests), 0)
        FROM {names.T_REQUEST_WINDOWS}
        WHERE pool = %s AND bucket >= to_timestamp(%s / 1000.0) AND bucket < to_timestamp(%s / 1000.0)""",
        (replica, names.DEFAULT_POOL, lo_ms, hi_ms)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def lead_s(alert: dict[str, Any], breaches: dict[str, int], replica: str) -> float | None:
    """Seconds from the alert to the breach it warns of (positive: it came first): the breach of
    its target (the replica for a replica alert) and its SLO, else that target's first breach."""
    scope = replica if alert.get("scope") == names.SCOPE_REPLICA else "pool"
    key = f"{scope}/{alert.get('slo')}"
    at = breaches.get(key) or min((v for k, v in breaches.items() if k.startswith(scope + "/")), default=None)
    return None if at is None else (at - alert["ts_ms"]) / 1000.0
