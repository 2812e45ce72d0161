"""Per-minute aggregates of one experiment's traffic, the A/B report's input.

The report runs on the store's 1-minute roll-up (``request_windows_1m``): a handful of rows per
minute whatever the traffic, histograms summed exactly, so a report over a million requests reads
a few thousand rows. :func:`from_store` reads them; :func:`from_arrays` builds the same aggregates
from individual requests (RequestEvents, the simulator's rows) with the definitions the streaming
job uses, which is how the calibration runs thousands of experiments without a store and how the
tests prove the two paths agree.

Groups: each of the experiment's arms (hashed units only), then ``default`` (the pool's traffic
outside the experiment) and ``forced`` (test units): the arms are compared, all groups count
towards the fleet's SLA in breach attribution.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmsla import histogram as H
from llmsla import names
from llmsla.events import RequestEvent
from llmsla.experiments import Experiment, parse_label
from llmsla.seams import StoreReader
from llmsla.store.maintenance import ROLLUP_RETENTION_FACTOR

DEFAULT_GROUP = names.DEFAULT_ARM
FORCED_GROUP = "forced"
UTC = dt.UTC


@dataclass
class ArmMinutes:
    """``(groups, minutes)`` counts and ``(groups, minutes, width)`` histograms over buckets
    ``hist_lo .. hist_lo + width - 1``, for the minutes ``start .. start + minutes - 1``."""

    experiment: Experiment
    start: dt.datetime
    groups: list[str]  # arm names, then DEFAULT_GROUP, FORCED_GROUP
    requests: np.ndarray
    bad: np.ndarray  # requests the availability SLO counts as failed
    ttft_within: np.ndarray
    e2e_within: np.ndarray
    ttft_hist: np.ndarray
    e2e_hist: np.ndarray
    hist_lo: int = 0
    #: inter-token gaps and their sum (ms) per group and minute: the token-weighted mean ITL,
    #: which a per-token slowdown moves whatever the mix of output lengths
    #: (left out: zeros shaped like ``requests``; never None, so readers need no check)
    itl_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    itl_sum_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=float))

    def __post_init__(self) -> None:
        if self.itl_n.size == 0:
            self.itl_n = np.zeros_like(self.requests)
        if self.itl_sum_ms.size == 0:
            self.itl_sum_ms = np.zeros(self.requests.shape, dtype=float)

    @property
    def minutes(self) -> int:
        return self.requests.shape[1]

    @property
    def arms(self) -> list[str]:
        return [a.name for a in self.experiment.arms]

    def index(self, group: str) -> int:
        return self.groups.index(group)

    def minute_times(self) -> list[dt.datetime]:
        return [self.start + dt.timedelta(minutes=m) for m in range(self.minutes)]


def _floor_minute(t: dt.datetime) -> dt.datetime:
    t = t.astimezone(UTC)
    return t.replace(second=0, microsecond=0)


def max_range_days(cfg: Any) -> int:
    """The longest range a report may ask for: what the store keeps of the 1-minute roll-up it
    reads (older minutes are deleted); a report holds arrays per minute of the range."""
    return cfg.store.retention_days * ROLLUP_RETENTION_FACTOR


def minute_range(start: dt.datetime, end: dt.datetime) -> tuple[dt.datetime, int]:
    """The whole minutes of ``[start, end)``: the first minute and how many."""
    s = _floor_minute(start)
    e = _floor_minute(end)
    if e < end.astimezone(UTC):
        e += dt.timedelta(minutes=1)
    return s, max(0, int((e - s).total_seconds() // 60))


def groups_of(exp: Experiment) -> list[str]:
    return [a.name for a in exp.arms] + [DEFAULT_GROUP, FORCED_GROUP]


def group_of(exp: Experiment, label: str) -> str | None:
    """The group of an arm label for this experiment (None: another experiment's)."""
    if label == names.DEFAULT_ARM:
        return DEFAULT_GROUP
    parsed = parse_label(label)
    if parsed is None or parsed[0] != exp.key:
        return None
    return FORCED_GROUP if parsed[2] else parsed[1]


def _empty(exp: Experiment, start: dt.datetime, minutes: int, width: int, lo: int) -> ArmMinutes:
    g = len(groups_of(exp))
    z = np.zeros((g, minutes), dtype=np.int64)
    return ArmMinutes(exp, start, groups_of(exp), z.copy(), z.copy(), z.copy(), z.copy(),
                      np.zeros((g, minutes, width), dtype=np.int64), np.zeros((g, minutes, width), dtype=np.int64), lo)


def from_arrays(exp: Experiment, start: dt.datetime, end: dt.datetime, *, ts_ms: np.ndarray, labels: Sequence[str],
                bad: np.ndarray, ttft_ms: np.ndarray, e2e_ms: np.ndarray, slo_ttft_ms: float,
                slo_e2e_ms: float, itl_n: np.ndarray | None = None, itl_mean_ms: np.ndarray | None = None) -> ArmMinutes:
    """Aggregates from individual requests (``ttft_ms`` NaN when there was no token), with the
    streaming job's definitions: within-SLO counts ``ttft <= slo`` (no TTFT is not within) and
    ``e2e <= slo``; the TTFT histogram holds the requests with a TTFT, the E2E one every request;
    ITL sums ``n`` and ``n * mean`` (as the job's ``itl_n``, ``itl_sum``); a request belongs to the
    minute of its completion time."""
    start, minutes = minute_range(start, end)
    ts_ms = np.asarray(ts_ms, dtype=np.int64)
    t0 = int(start.timestamp() * 1000)
    minute = (ts_ms - t0) // 60_000
    gmap = {g: i for i, g in enumerate(groups_of(exp))}
    lab_idx: dict[str, int] = {}
    gi = np.empty(len(labels), dtype=np.int64)
    for i, lab in enumerate(labels):
        j = lab_idx.get(lab)
        if j is None:
            grp = group_of(exp, lab)
            j = lab_idx[lab] = -1 if grp is None else gmap[grp]
        gi[i] = j
    keep = (gi >= 0) & (minute >= 0) & (minute < minutes)
    gi, minute = gi[keep], minute[keep]
    bad = np.asarray(bad, dtype=bool)[keep]
    ttft = np.asarray(ttft_ms, dtype=float)[keep]
    e2e = np.asarray(e2e_ms, dtype=float)[keep]
    has_ttft = np.isfinite(ttft)
    tb = H.bucket_indices(np.where(has_ttft, ttft, 0.0))
    eb = H.bucket_indices(e2e)
    if gi.size:
        lo = int(min(eb.min(), tb[has_ttft].min() if has_ttft.any() else eb.min()))
        hi = int(max(eb.max(), tb[has_ttft].max() if has_ttft.any() else eb.max()))
    else:
        lo = hi = 0
    out = _empty(exp, start, minutes, hi - lo + 1, lo)
    np.add.at(out.requests, (gi, minute), 1)
    np.add.at(out.bad, (gi, minute), bad.astype(np.int64))
    np.add.at(out.ttft_within, (gi, minute), (has_ttft & (ttft <= slo_ttft_ms)).astype(np.int64))
    np.add.at(out.e2e_within, (gi, minute), (e2e <= slo_e2e_ms).astype(np.int64))
    np.add.at(out.ttft_hist, (gi[has_ttft], minute[has_ttft], tb[has_ttft] - lo), 1)
    np.add.at(out.e2e_hist, (gi, minute, eb - lo), 1)
    if itl_n is not None and itl_mean_ms is not None:
        n = np.asarray(itl_n, dtype=np.int64)[keep]
        np.add.at(out.itl_n, (gi, minute), n)
        np.add.at(out.itl_sum_ms, (gi, minute), n * np.asarray(itl_mean_ms, dtype=float)[keep])
    return out


def from_events(exp: Experiment, events: Iterable[RequestEvent], start: dt.datetime, end: dt.datetime, *,
                slo_ttft_ms: float, slo_e2e_ms: float, failed: frozenset[str]) -> ArmMinutes:
    """``failed``: the statuses the availability SLO counts as failed (the SLO catalog's)."""
    evs = list(events)
    return from_arrays(
        exp, start, end, ts_ms=np.fromiter((e.ts_ms for e in evs), dtype=np.int64, count=len(evs)),
        labels=[e.arm for e in evs], bad=np.fromiter((e.status in failed for e in evs), dtype=bool, count=len(evs)),
        ttft_ms=np.fromiter((np.nan if e.ttft_ms is None else e.ttft_ms for e in evs), dtype=float, count=len(evs)),
        e2e_ms=np.fromiter((e.e2e_ms for e in evs), dtype=float, count=len(evs)),
        slo_ttft_ms=slo_ttft_ms, slo_e2e_ms=slo_e2e_ms,
        itl_n=np.fromiter((e.itl_ms.n for e in evs), dtype=np.int64, count=len(evs)),
        itl_mean_ms=np.fromiter((e.itl_ms.mean for e in evs), dtype=float, count=len(evs)))


def _pools(exp: Experiment) -> list[str]:
    """The pools an experiment's traffic is served in: its own and its arms'."""
    return sorted({exp.pool, *(a.strategy.pool for a in exp.arms if a.strategy.pool)})


#: The columns a report can be cut by (``llmsla ab report --by``): the request's tenant or class.
CUTS: tuple[str, ...] = (names.L_TENANT, names.L_CLASS)


def _cut_sql(cut: tuple[str, str] | None) -> tuple[str, tuple[str, ...]]:
    if cut is None:
        return "", ()
    column, value = cut
    if column not in CUTS:
        raise ValueError(f"cannot cut a report by {column!r}: one of {', '.join(CUTS)}")
    return f" AND {column} = %s", (value,)


def cut_values(conn: StoreReader, exp: Experiment, start: dt.datetime, end: dt.datetime, by: str) -> list[str]:
    """The values of ``by`` (a :data:`CUTS` column) in the experiment's minutes of the range."""
    if by not in CUTS:
        raise ValueError(f"cannot cut a report by {by!r}: one of {', '.join(CUTS)}")
    start, minutes = minute_range(start, end)
    rows = conn.execute(
        f"""SELECT DISTINCT {by} FROM {names.T_REQUEST_WINDOWS_1M}
            WHERE bucket >= %s AND bucket < %s AND (starts_with(arm, %s) OR (arm = %s AND pool = ANY(%s)))
            ORDER BY 1""",
        (start, start + dt.timedelta(minutes=minutes), exp.key + names.ARM_LABEL_SEP, names.DEFAULT_ARM, _pools(exp)),
    ).fetchall()
    return [str(r[0]) for r in rows]


def from_store(conn: StoreReader, exp: Experiment, start: dt.datetime, end: dt.datetime, *,
               failed: frozenset[str], cut: tuple[str, str] | None = None) -> ArmMinutes:
    """Aggregates from ``request_windows_1m``: the experiment's labels, and the ``default`` label
    in the pools its traffic is served in; ``bad`` counts the statuses in ``failed``. ``cut``:
    (column of :data:`CUTS`, value): only that tenant's or class's requests."""
    bad = " + ".join(names.STATUS_COLUMNS[st] for st in sorted(failed))
    start, minutes = minute_range(start, end)
    stop = start + dt.timedelta(minutes=minutes)
    cut_where, cut_args = _cut_sql(cut)
    rows = conn.execute(
        f"""SELECT bucket, arm, requests, bad, ttft_within, e2e_within, itl_n, itl_sum_ms,
                   array_lower(th, 1), th, array_lower(eh, 1), eh
            FROM (SELECT bucket, arm, sum(requests) AS requests, sum({bad}) AS bad,
                         sum(ttft_within_slo) AS ttft_within, sum(e2e_within_slo) AS e2e_within,
                         sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms,
                         llmsla_hist_sum(ttft_hist) AS th, llmsla_hist_sum(e2e_hist) AS eh
                  FROM {names.T_REQUEST_WINDOWS_1M}
                  WHERE bucket >= %s AND bucket < %s
                    AND (starts_with(arm, %s) OR (arm = %s AND pool = ANY(%s))){cut_where}
                  GROUP BY bucket, arm) x""",
        (start, stop, exp.key + names.ARM_LABEL_SEP, names.DEFAULT_ARM, _pools(exp), *cut_args),
    ).fetchall()
    parsed = []
    lo, hi = H.SIZE, -1
    for bucket, label, req, bad, tw, ew, itl_n, itl_sum, tlo, th, elo, eh in rows:
        grp = group_of(exp, label)
        if grp is None:
            continue
        m = int((bucket - start).total_seconds() // 60)
        parsed.append((grp, m, req, bad, tw, ew, itl_n or 0, float(itl_sum or 0.0),
                       H.Hist.from_array(tlo, th), H.Hist.from_array(elo, eh)))
        for h in parsed[-1][8:]:
            if h.counts:
                lo, hi = min(lo, h.lo), max(hi, h.lo + len(h.counts) - 1)
    if hi < 0:
        lo = hi = 0
    out = _empty(exp, start, minutes, hi - lo + 1, lo)
    for grp, m, req, bad, tw, ew, itl_n, itl_sum, th, eh in parsed:
        g = out.index(grp)
        out.requests[g, m] += req
        out.bad[g, m] += bad
        out.ttft_within[g, m] += tw
        out.e2e_within[g, m] += ew
        out.itl_n[g, m] += itl_n
        out.itl_sum_ms[g, m] += itl_sum
        for h, target in ((th, out.ttft_hist), (eh, out.e2e_hist)):
            if h.counts:
                target[g, m, h.lo - lo:h.lo - lo + len(h.counts)] += h.counts
    return out


def weights_timeline(conn: StoreReader, exp: Experiment, start: dt.datetime, minutes: int) -> tuple[np.ndarray, np.ndarray]:
    """The arms' weights in force each minute, from the audited changes in ``action_log``
    (``set_arm_weight``, applied), and a mask of minutes with no change inside them (a minute in
    which the split changed is left out of the sample-ratio test: its expected split is mixed)."""
    configured = {a.name: a.weight for a in exp.arms}
    rows = conn.execute(
        f"SELECT ts, target, params FROM {names.T_ACTION_LOG} WHERE action = 'set_arm_weight' AND outcome = 'applied' "
        f"AND starts_with(target, %s) AND ts < %s ORDER BY ts, id",
        (exp.key + "/", start + dt.timedelta(minutes=minutes)),
    ).fetchall()
    current = dict(configured)
    weights = np.zeros((minutes, len(exp.arms)))
    stable = np.ones(minutes, dtype=bool)
    changes: list[tuple[int, str, float]] = []
    for ts, target, params in rows:
        arm = target.split("/", 1)[1]
        if arm not in current:
            continue
        p = params if isinstance(params, dict) else json.loads(params)
        m = int((ts - start).total_seconds() // 60)
        if m < 0:
            current[arm] = float(p["after"])
        else:
            changes.append((m, arm, float(p["after"])))
    ci = 0
    for m in range(minutes):
        while ci < len(changes) and changes[ci][0] <= m:
            if changes[ci][0] == m:
                stable[m] = False
            current[changes[ci][1]] = changes[ci][2]
            ci += 1
        weights[m] = [current[a.name] for a in exp.arms]
    return weights, stable


def expected_shares(exp: Experiment, weights: np.ndarray) -> np.ndarray:
    """Each minute's expected split among the arms' units, from the weights in force (an arm
    below its configured weight uses only that part of its segment)."""
    conf = np.asarray([a.weight for a in exp.arms], dtype=float)
    used = conf / conf.sum() * np.minimum(1.0, np.asarray(weights, dtype=float) / conf)
    total = used.sum(axis=-1, keepdims=True)
    return np.where(total > 0, used / np.where(total > 0, total, 1.0), 0.0)
