"""SLO specs -> Prometheus recording and alerting rules, in Sloth's structure and names.

Sloth's groups and names are kept so its Grafana dashboards work unchanged; llmsla adds only what
Sloth is silent on (a per-replica outlier page, alerts without ``sloth_window``, a low-traffic
guard), each for a reason the page gives. ``window_scale`` compresses every window so a real
Prometheus can run the same rules in a test. See docs/alerting.md#2-llmsla-slo-generate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from llmsla import names
from llmsla.slo_specs import SCOPE_LABELS, SLOTH_K8S_VERSION, SLOTH_VERSION, SloSpec


@dataclass(frozen=True)
class BurnPair:
    """One multiwindow condition: burn factor over a long and a short window."""

    factor: float
    long: str
    short: str
    long_s: int = 0
    short_s: int = 0


#: Google SRE workbook, table 5-8: (budget %, long s, short s). Page: 2 % of the budget in 1 h,
#: 5 % in 6 h; ticket: 10 % in 1 d, 10 % in 3 d. Sloth's window catalog uses these windows
#: unscaled for the periods in :data:`CATALOG_DAYS`.
GOOGLE_PAGE = ((2, 3600, 300), (5, 21600, 1800))
GOOGLE_TICKET = ((10, 86400, 7200), (10, 259200, 21600))
#: Periods Sloth ships windows for (internal/alert/windows/google-{30,28}d.yaml).
CATALOG_DAYS = (30, 28)


def window_name(seconds: int) -> str:
    """Sloth's window name: the largest single unit that divides exactly (28d is 4w, 30d is 30d)."""
    for unit, n in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds % n == 0:
            return f"{seconds // n}{unit}"
    raise ValueError(f"window {seconds} s is not a whole number of seconds")


def burn_pairs(period_days: int) -> tuple[tuple[BurnPair, ...], tuple[BurnPair, ...]]:
    """(page, ticket) pairs for a period; factor = budget fraction * period / long window.

    30d and 28d use the Google windows as Sloth does (28d: 13.44/5.6/2.8/0.933). Any other
    period scales every window by period/30d (whole seconds), keeping the budget fractions, so
    the factors stay 14.4/6/3/1 (Sloth itself refuses such a period without a windows file)."""
    period_s = period_days * 86400
    scale = 1.0 if period_days in CATALOG_DAYS else period_days / 30

    def pairs(table: tuple[tuple[int, int, int], ...]) -> tuple[BurnPair, ...]:
        out = []
        for pct, long_s, short_s in table:
            lo, sh = max(1, round(long_s * scale)), max(1, round(short_s * scale))
            out.append(BurnPair(pct / 100 * period_s / lo, window_name(lo), window_name(sh), lo, sh))
        return tuple(out)

    return pairs(GOOGLE_PAGE), pairs(GOOGLE_TICKET)


def sli_windows(period_days: int) -> tuple[tuple[int, str], ...]:
    """The SLI windows a period needs (seconds, name), shortest first, each once, never the period."""
    page, ticket = burn_pairs(period_days)
    found = {s: n for p in (*page, *ticket) for s, n in ((p.short_s, p.short), (p.long_s, p.long))}
    found.pop(period_days * 86400, None)
    return tuple(sorted(found.items()))


#: The 30-day defaults (kept for the docs and dashboards).
PAGE, TICKET = burn_pairs(30)
#: Sloth's SLI windows (seconds, name) for a 30-day period; the SLO period is added per spec.
WINDOWS: tuple[tuple[int, str], ...] = sli_windows(30)
#: A replica pages only if its short-window error ratio is >= this times its pool's.
OUTLIER_FACTOR = 1.5
SECONDS = dict((n, s) for s, n in WINDOWS)


def num(x: float) -> str:
    """A float as Sloth prints one (Go's shortest round-trip ``%g``), once float noise past 12
    significant digits is dropped: 0.0005, not 0.000499999999999945 (1 - 0.9995); 0.9999995 and
    0.933333333333 whole (an objective of 99.99995 % must not round to 100 %)."""
    r = float(f"{x:.12g}")
    return str(int(r)) if r.is_integer() and abs(r) < 1e15 else repr(r)


def duration(seconds: float) -> str:
    """Prometheus duration of ``seconds`` in the largest exact unit (ms resolution)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration {seconds} s is below Prometheus' 1 ms resolution")
    for unit, n in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % n == 0:
            return f"{ms // n}{unit}"
    return f"{ms}ms"


class Literal(str):
    """A string emitted as a YAML literal block (multi-line PromQL stays readable)."""


@dataclass(frozen=True)
class Profile:
    """How windows map to real ranges (1.0 in production, e.g. 1/240 for an end-to-end test),
    and the low-traffic guard: no burn alert while its long window holds fewer than
    ``min_requests`` requests (0: none, as Sloth generates)."""

    window_scale: float = 1.0
    min_requests: int = 0

    def range(self, seconds: float) -> str:
        return duration(seconds * self.window_scale)


def scope_by(spec: SloSpec) -> tuple[str, ...]:
    """The labels a spec's SLI is computed per: model and pool, plus the tenant and/or class the
    spec targets, so its series and alerts carry them (a tenant's page names the tenant)."""
    return (names.L_MODEL, names.L_POOL, *(k for k in SCOPE_LABELS if k in spec.scope))


def id_labels(spec: SloSpec) -> dict[str, str]:
    return {names.L_SLOTH_ID: spec.sloth_id, names.L_SLOTH_SERVICE: spec.service, names.L_SLOTH_SLO: spec.name}


def id_filter(spec: SloSpec) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in id_labels(spec).items()) + "}"


def _with(selector: str, extra: str) -> str:
    """Append raw matchers (``le="0.8"``) to a selector."""
    if selector.endswith("}"):
        inner = selector[selector.index("{") + 1:-1].strip()
        return f"{selector[:selector.index('{')]}{{{inner + ', ' if inner else ''}{extra}}}"
    return f"{selector}{{{extra}}}"


def sli_error_expr(spec: SloSpec, rng: str, by: tuple[str, ...], extra: str = "") -> str:
    """Error ratio of ``spec`` over ``rng`` aggregated ``by`` labels (a PromQL expression).

    The denominator is filtered ``> 0``: a window without requests has no ratio (no sample)
    rather than 0/0 = NaN, which would poison every ``sum_over_time``/``avg_over_time`` of it -
    the 30-day period SLI and the budget remaining would read NaN for a month after one quiet
    night."""
    if spec.kind == "query":  # Sloth's own shape, the window filled in
        if spec.error_ratio_query:
            return f"({spec.error_ratio_query.replace('{{.window}}', rng)}\n)"
        return (f"({spec.error_query.replace('{{.window}}', rng)})\n/\n"
                f"({spec.total_query.replace('{{.window}}', rng)})")
    grp = f"sum by ({', '.join(by)})"
    filt = ", ".join(f'{k}="{v}"' for k, v in sorted(spec.filters.items()))
    matchers = ", ".join(x for x in (filt, extra) if x)
    if spec.kind == "latency":
        le = f'le="{floatToGoString(spec.threshold_s)}"'
        bucket = f"{spec.histogram}_bucket{{{', '.join(x for x in (matchers, le) if x)}}}"
        count = f"{spec.histogram}_count" + (f"{{{matchers}}}" if matchers else "")
        return (f"1 - (\n  {grp} (rate({bucket}[{rng}]))\n  /\n  ({grp} (rate({count}[{rng}])) > 0)\n)")
    total = _with(spec.total, extra) if extra else spec.total
    if spec.bad:
        bad = _with(spec.bad, extra) if extra else spec.bad
        return f"(\n  {grp} (rate({bad}[{rng}]))\n  /\n  ({grp} (rate({total}[{rng}])) > 0)\n)"
    good = _with(spec.good, extra) if extra else spec.good
    return f"1 - (\n  {grp} (rate({good}[{rng}]))\n  /\n  ({grp} (rate({total}[{rng}])) > 0)\n)"


def _labels(spec: SloSpec, **extra: str) -> dict[str, str]:
    return {**id_labels(spec), **extra, **spec.labels}


def _period(spec: SloSpec) -> str:
    return window_name(spec.window_days * 86400)


def spec_pairs(spec: SloSpec) -> tuple[tuple[BurnPair, ...], tuple[BurnPair, ...]]:
    """(page, ticket) burn pairs of this SLO's period."""
    return burn_pairs(spec.window_days)


def quick_window(spec: SloSpec) -> str:
    """The fast page pair's short window (5m for 30d and 28d, scaled with any other period): the
    SLI the current burn rate and the period SLI read, as Sloth's do."""
    return spec_pairs(spec)[0][0].short


def sli_group(spec: SloSpec, prof: Profile) -> dict:
    pool_by = scope_by(spec)
    rules = [{
        "record": names.slo_sli_error(w),
        "expr": Literal(sli_error_expr(spec, prof.range(s), pool_by)),
        "labels": _labels(spec, **{names.L_SLOTH_WINDOW: w}),
    } for s, w in sli_windows(spec.window_days)]
    period = _period(spec)
    src = f"{names.slo_sli_error(quick_window(spec))}{id_filter(spec)}"
    rng = prof.range(spec.window_days * 86400)
    rules.append({
        "record": names.slo_sli_error(period),
        "expr": Literal(f"sum_over_time({src}[{rng}])\n/ ignoring ({names.L_SLOTH_WINDOW})\n"
                        f"count_over_time({src}[{rng}])"),
        "labels": {names.L_SLOTH_WINDOW: period},
    })
    return {"name": f"sloth-slo-sli-recordings-{spec.sloth_id}", "rules": rules}


def replica_group(spec: SloSpec, prof: Profile) -> dict | None:
    by = (*scope_by(spec), names.L_REPLICA)
    if spec.kind == "query":
        return None  # an arbitrary PromQL SLI has no replica label to split on
    not_none = f'{names.L_REPLICA}!="{names.NO_REPLICA}"'  # requests that never reached a replica
    return {"name": f"llmsla-slo-replica-recordings-{spec.sloth_id}", "rules": [{
        "record": names.slo_replica_sli_error(w),
        "expr": Literal(sli_error_expr(spec, prof.range(s), by, not_none)),
        "labels": _labels(spec, **{names.L_SLOTH_WINDOW: w}),
    } for s, w in replica_windows(spec)]}


def replica_windows(spec: SloSpec) -> list[tuple[int, str]]:
    """The page pairs' windows (seconds, name), shortest first: all the replica page reads."""
    return sorted({(s, n) for p in spec_pairs(spec)[0] for s, n in ((p.short_s, p.short), (p.long_s, p.long))})


def meta_group(spec: SloSpec) -> dict:
    f = id_filter(spec)
    labels = _labels(spec)
    # the constant series name the tenant/class they hold (the others carry it from the data)
    const = {**labels, **spec.scope} if spec.scope else labels
    on = f"on({names.L_SLOTH_ID}, {names.L_SLOTH_SLO}, {names.L_SLOTH_SERVICE}) group_left"

    def burn(window: str) -> Literal:
        return Literal(f"{names.slo_sli_error(window)}{f}\n/ {on}\n{names.SLO_ERROR_BUDGET}{f}")

    mode = {SLOTH_VERSION: "cli-gen-prom", SLOTH_K8S_VERSION: "cli-gen-k8s"}.get(spec.api_version, "cli-gen-openslo")
    info = {**const, "sloth_mode": mode, "sloth_objective": num(spec.target * 100),
            "sloth_spec": spec.api_version, "sloth_version": "llmsla"}
    return {"name": f"sloth-slo-meta-recordings-{spec.sloth_id}", "rules": [
        {"record": names.SLO_OBJECTIVE, "expr": f"vector({num(spec.target)})", "labels": const},
        {"record": names.SLO_ERROR_BUDGET, "expr": f"vector(1-{num(spec.target)})", "labels": const},
        {"record": names.SLO_TIME_PERIOD_DAYS, "expr": f"vector({spec.window_days})", "labels": const},
        {"record": names.SLO_CURRENT_BURN_RATE, "expr": burn(quick_window(spec)), "labels": labels},
        {"record": names.SLO_PERIOD_BURN_RATE, "expr": burn(_period(spec)), "labels": labels},
        {"record": names.SLO_PERIOD_ERROR_BUDGET_REMAINING, "expr": f"1 - {names.SLO_PERIOD_BURN_RATE}{f}",
         "labels": labels},
        {"record": names.SLO_INFO, "expr": "vector(1)", "labels": info},
    ]}


def _pair(metric: Callable[[str], str], f: str, p: BurnPair, budget: float, outlier: str = "",
          guard: Callable[[BurnPair], str] | None = None, pool_on: tuple[str, ...] = (names.L_MODEL, names.L_POOL)) -> str:
    thr = f"({num(p.factor)} * {num(budget)})"
    cond = (f"    ({metric(p.short)}{f} > {thr})\n    and ignoring ({names.L_SLOTH_WINDOW})\n"
            f"    ({metric(p.long)}{f} > {thr})")
    if outlier:
        pool = f"{names.slo_sli_error(p.short)}{f}"
        cond += (f"\n    and ignoring ({names.L_SLOTH_WINDOW})\n    ({metric(p.short)}{f}\n"
                 f"      > on({', '.join((names.L_SLOTH_ID, *pool_on))}) group_left()\n"
                 f"    ({outlier} * {pool}))")
    if guard is not None:
        cond += guard(p)
    return cond


def traffic_total(spec: SloSpec) -> str:
    """The counter of every request the SLI counts (its denominator), as a selector."""
    if spec.kind == "latency":
        filt = ", ".join(f'{k}="{v}"' for k, v in sorted(spec.filters.items()))
        return f"{spec.histogram}_count" + (f"{{{filt}}}" if filt else "")
    return spec.total


def low_traffic_guard(spec: SloSpec, prof: Profile, by: tuple[str, ...]) -> Callable[[BurnPair], str] | None:
    """``and on (by) (requests in the pair's long window >= min_requests)``: a handful of requests
    cannot page (one slow request of three is a 33 % error ratio). None where there is no guard:
    ``min_requests`` 0, or a Sloth query SLI, whose total is arbitrary PromQL."""
    if prof.min_requests <= 0 or spec.kind == "query":
        return None
    on, total = ", ".join(by), traffic_total(spec)

    def guard(p: BurnPair) -> str:
        return (f"\n    and on ({on})\n    (sum by ({on}) (increase({total}[{prof.range(p.long_s)}])) "
                f">= {prof.min_requests})")

    return guard


def mwmb_expr(spec: SloSpec, pairs: tuple[BurnPair, ...], *, replica: bool = False,
              prof: Profile | None = None) -> str:
    metric = names.slo_replica_sli_error if replica else names.slo_sli_error
    f = id_filter(spec)
    outlier = num(OUTLIER_FACTOR) if replica else ""
    by = (*scope_by(spec), names.L_REPLICA) if replica else scope_by(spec)
    guard = low_traffic_guard(spec, prof or Profile(), by)
    parts = [f"  (\n{_pair(metric, f, p, spec.error_budget, outlier, guard, scope_by(spec))}\n  )" for p in pairs]
    return f"max without ({names.L_SLOTH_WINDOW}) (\n" + f"\n  or ignoring ({names.L_SLOTH_WINDOW})\n".join(parts) + "\n)"


def _describe(pairs: tuple[BurnPair, ...]) -> str:
    return ", or ".join(f"{num(p.factor)}x over {p.long} and {p.short}" for p in pairs)


def objective_text(spec: SloSpec) -> str:
    pct = num(spec.target * 100)
    if spec.kind == "latency":
        return f"{pct} % of requests with {spec.histogram} <= {floatToGoString(spec.threshold_s)} s over {spec.window_days}d"
    return f"{pct} % of requests good ({spec.display_name}) over {spec.window_days}d"


def alert_annotations(spec: SloSpec, severity: str, replica: bool) -> dict[str, str]:
    page, ticket = spec_pairs(spec)
    pairs = page if severity == names.SEVERITY_PAGE else ticket
    where = "{{ $labels.model }}/{{ $labels.pool }}" + ("/{{ $labels.replica }}" if replica else "")
    where += "".join(f" {k} {{{{ $labels.{k} }}}}" for k in SCOPE_LABELS if k in spec.scope)
    what = (f"replica burns the {spec.name} error budget at page rate, with >= {num(OUTLIER_FACTOR)}x its pool's error ratio"
            if replica else f"{spec.name} SLO error budget burn rate is too fast")
    if spec.kind == "query":  # an arbitrary PromQL SLI has no model or pool label: Sloth's own title
        where, what = "{{$labels.sloth_service}} {{$labels.sloth_slo}}", "SLO error budget burn rate is too fast"
    return {
        "title": f"({severity}) {where} {what}.",
        "summary": f"{spec.display_name}: {objective_text(spec)}; {severity} at {_describe(pairs)}.",
        **spec.alerting.get("annotations", {}), **spec.alerting.get(severity, {}).get("annotations", {}),
    }


def alert_name(spec: SloSpec, replica: bool = False) -> str:
    if spec.alerting.get("name") and not replica:
        return spec.alerting["name"]
    return f"{spec.camel}{'Replica' if replica else ''}ErrorBudgetBurn"


def alert_labels(spec: SloSpec, severity: str, replica: bool) -> dict[str, str]:
    return {
        names.L_SEVERITY: severity,
        names.L_SLOTH_SEVERITY: severity,
        names.L_SLO: spec.name,
        names.L_SCOPE: names.SCOPE_REPLICA if replica else names.SCOPE_POOL,
        names.L_SOURCE: names.SOURCE_BURN_RATE,
        **spec.alerting.get("labels", {}), **spec.alerting.get(severity, {}).get("labels", {}),
    }


def alert_group(spec: SloSpec, prof: Profile | None = None) -> dict | None:
    rules = []
    page, ticket = spec_pairs(spec)
    for severity, pairs, replica in ((names.SEVERITY_PAGE, page, False), (names.SEVERITY_TICKET, ticket, False),
                                     (names.SEVERITY_PAGE, page, True)):
        if spec.alerting.get(severity, {}).get("disable") or (replica and spec.kind == "query"):
            continue
        rules.append({
            "alert": alert_name(spec, replica),
            "expr": Literal(mwmb_expr(spec, pairs, replica=replica, prof=prof)),
            "labels": alert_labels(spec, severity, replica),
            "annotations": alert_annotations(spec, severity, replica),
        })
    return {"name": f"sloth-slo-alerts-{spec.sloth_id}", "rules": rules} if rules else None


def slo_rule_file(spec: SloSpec, prof: Profile) -> dict:
    groups = [sli_group(spec, prof), replica_group(spec, prof), meta_group(spec), alert_group(spec, prof)]
    return {"groups": [g for g in groups if g is not None]}


# -- static rules ---------------------------------------------------------------------------------
#: LlmslaForecasterDrifted: live recall this far below the serving model's validation recall ...
DRIFT_RECALL_MARGIN = 0.15
#: ... over at least this many judged breaches in the forecaster's rolling window (fewer cannot
#: tell drift from chance: at a validation recall of 0.23, 20 breaches with at most one warned
#: happen by chance about 4 % of the time) ...
DRIFT_MIN_BREACHES = 20
#: ... for this long (the window itself is a day: a drift that lasts an hour is not noise).
DRIFT_FOR_S = 3600
@dataclass(frozen=True)
class StaticRule:
    alert: str
    expr: str
    for_s: int
    summary: str
    severity: str = names.SEVERITY_TICKET


def static_rules(prof: Profile) -> list[StaticRule]:
    r = prof.range
    err = f'{names.REQUESTS}_total{{{names.L_STATUS}=~"{names.STATUS_ERROR}|{names.STATUS_TIMEOUT}"}}'
    return [
        StaticRule("LlmslaGpuMemoryHigh",
                   f"{names.GPU_MEMORY_USED_BYTES} / {names.GPU_MEMORY_TOTAL_BYTES} > 0.95", 300,
                   "GPU {{ $labels.node }}/{{ $labels.gpu }} memory above 95 % for 5 minutes"),
        StaticRule("LlmslaTargetDown", "up == 0", 120,
                   "scrape target {{ $labels.job }}/{{ $labels.instance }} has not answered for 2 minutes"),
        StaticRule("LlmslaDeadLetters",
                   f"sum by (source) (rate({names.DEAD_LETTERS}_total[{r(600)}])) > 0.1", 600,
                   "{{ $labels.source }}: more than 0.1 dead letters/s for 10 minutes (bad records upstream)"),
        StaticRule("LlmslaSpoolDropping",
                   f"sum by (kind, reason) (increase({names.SPOOL_DROPPED}_total[{r(300)}])) > 0", 60,
                   "spool {{ $labels.kind }}: events dropped ({{ $labels.reason }}) in the last 5 minutes; the "
                   "streaming job and the store miss them (disk full or read-only, or the consumer behind): see llmsla doctor"),
        # the forecaster scores its own alarms against the stored breaches (docs/forecaster.md)
        StaticRule("LlmslaForecasterDrifted",
                   f"max by ({names.L_HORIZON}) ({names.FORECAST_RECALL})\n"
                   f"< max by ({names.L_HORIZON}) ({names.FORECAST_VALIDATION_RECALL}) - {num(DRIFT_RECALL_MARGIN)}\n"
                   f"and max by ({names.L_HORIZON}) ({names.FORECAST_BREACHES}) >= {DRIFT_MIN_BREACHES}", DRIFT_FOR_S,
                   "the forecaster has drifted: at the {{ $labels.horizon }} s horizon it warned of "
                   "{{ $value | humanizePercentage }} of the breaches in its window, "
                   f"more than {num(DRIFT_RECALL_MARGIN)} below its validation recall: retrain it "
                   "(llmsla forecast train) on recent data"),
        StaticRule("LlmslaForecasterSilent", f"absent_over_time({names.FORECAST_RISK}[{r(900)}])", 300,
                   "no forecaster risk sample for 15 minutes: the forecaster is down or not scraped"),
        # the gateway is the instrument of the SLA: when it is the bottleneck, requests wait before
        # it can time them and the SLO pages may stay quiet, so this one pages
        StaticRule("LlmslaGatewaySaturated",
                   f"histogram_quantile(0.99, sum by (instance, le) (rate({names.GATEWAY_LOOP_LAG_SECONDS}_bucket"
                   f"[{r(300)}]))) > 0.05", 300,
                   "gateway {{ $labels.instance }}: its event loop runs p99 more than 50 ms late for 5 minutes: "
                   "it is the bottleneck (add gateway.workers or replicas of it; see llmsla_gateway_accept_backlog)",
                   severity=names.SEVERITY_PAGE),
        # a source that keeps failing leaves the gateway routing to its last set (none, when it
        # never answered: a missing RoleBinding, a wrong selector), which no request-side SLO shows;
        # by process, not by the series' source label (one source per process; the rule's own
        # source label, static, would replace it)
        StaticRule("LlmslaDiscoveryFailing",
                   f"sum by (job, instance) (increase({names.DISCOVERY_FAILURES}_total[{r(600)}])) > 0\n"
                   f"unless sum by (job, instance) (increase({names.DISCOVERY_REFRESHES}_total[{r(600)}])) > 0",
                   300,
                   "{{ $labels.job }} {{ $labels.instance }}: its replica discovery has failed for 10 minutes "
                   "without one answer applied; it routes to its last set of replicas (none if it never had one): "
                   "see llmsla_discovery_failures_total's reason and run llmsla doctor where it runs"),
        StaticRule("LlmslaGateway5xx",
                   f"sum by (model, pool) (rate({err}[{r(300)}]))\n/\n"
                   f"sum by (model, pool) (rate({names.REQUESTS}_total[{r(300)}])) > 0.05", 300,
                   "{{ $labels.model }}/{{ $labels.pool }}: more than 5 % of requests end in a gateway 5xx (error/timeout)"),
    ]


def static_rule_file(prof: Profile) -> dict:
    return {"groups": [{"name": "llmsla-static", "rules": [{
        "alert": s.alert,
        "expr": Literal(s.expr) if "\n" in s.expr else s.expr,
        "for": prof.range(s.for_s),
        "labels": {names.L_SEVERITY: s.severity, names.L_SOURCE: names.SOURCE_STATIC},
        "annotations": {"summary": s.summary},
    } for s in static_rules(prof)]}]}


def check_windows(prof: Profile, scrape_interval_s: float | None = None) -> None:
    """The shortest window must hold a few scrapes, or rate() returns nothing."""
    if not math.isfinite(prof.window_scale) or prof.window_scale <= 0:
        raise ValueError(f"window scale must be > 0, got {prof.window_scale}")
    shortest = 300 * prof.window_scale
    if scrape_interval_s and shortest < 4 * scrape_interval_s:
        raise ValueError(f"window scale {prof.window_scale:g} makes the 5m window {shortest:g} s, "
                         f"less than 4 scrapes of {scrape_interval_s:g} s")
