"""Generated ``promtool test rules`` files: burn scenarios and the alerts each must fire, when.

The expectations come from an independent exact model of the rules, never from Prometheus: if the
model and promtool disagree on any checked minute, the rules (or the model) are wrong. Do not
derive the expectations from a Prometheus run; that would make the tests unable to fail.
See docs/alerting.md#2-llmsla-slo-generate (rule tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from prometheus_client.utils import floatToGoString

from llmsla import names
from llmsla.alerting import rules as R
from llmsla.slo_specs import SloSpec

MODEL = "llmsla-tiny"
POOL = "default"
ARM = names.DEFAULT_ARM
REPLICAS = ("r0", "r1")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Scenario:
    name: str
    minutes: int
    #: (replica, minute) -> (requests, bad) in the minute ending at that sample
    traffic: Callable[[str, int], tuple[int, int]]
    checks: tuple[int, ...] = ()  # extra minutes to check besides the model's transitions
    #: minute -> (requests, bad) of each neighbour series: requests on replica r0 outside the
    #: spec's tenant/class (a spec with a scope only). The rules must never count them, so the
    #: model does not: a rule that drops its tenant/class filter fails these tests.
    neighbour: Callable[[int], tuple[int, int]] | None = None


def per_minute(spec: SloSpec) -> int:
    """Requests per minute and replica so that half the budget is a whole number of requests."""
    n = 200
    while (Fraction(n) * Fraction(spec.error_budget).limit_denominator(10**6) / 2).denominator != 1:
        n += 200
    return n


#: The low-traffic scenario: one request an hour per replica, over this many hours.
LOW_TRAFFIC_HOURS = 8


def scenarios(spec: SloSpec, min_requests: int = 0) -> list[Scenario]:
    n = per_minute(spec)
    budget = Fraction(spec.error_budget).limit_denominator(10**6)
    half = int(n * budget / 2)
    two = int(n * budget * 2)
    slow_start = 121

    def healthy(rep: str, m: int) -> tuple[int, int]:
        return n, half

    def pool_fast(rep: str, m: int) -> tuple[int, int]:
        return n, (n if m > 120 else 0)

    def replica_fault(rep: str, m: int) -> tuple[int, int]:
        return n, (n if m > 120 and rep == "r1" else 0)

    def slow(rep: str, m: int) -> tuple[int, int]:
        if m <= slow_start:
            return n, 0
        # 2x the budget on average; odd minutes one under, even one over (no check on a tie)
        return n, two - 1 if (m - slow_start) % 2 else two + 1

    fleet = [
        Scenario("healthy: errors at half the error budget fire nothing", 240, healthy, (60, 120, 240)),
        Scenario("pool fast burn: every request bad on both replicas fires the pool page, no replica page",
                 200, pool_fast, (120, 200)),
        Scenario("replica fault: every request of r1 bad fires the replica page for r1", 200, replica_fault,
                 (120, 200)),
        Scenario("slow 2x burn: only the ticket, never a page", slow_start + 200, slow, (slow_start + 200,)),
        *([low_traffic(min_requests)] if min_requests > len(REPLICAS) * LOW_TRAFFIC_HOURS else []),
    ]
    if not spec.scope:
        return fleet
    # a scoped spec: the same scenarios with healthy traffic outside its scope beside them (its
    # own breaks while its neighbour is fine), plus the neighbour breaking while it is fine
    scope = ", ".join(f"{k} {v}" for k, v in sorted(spec.scope.items()))
    out = [dataclasses.replace(sc, name=f"{sc.name} (beside healthy traffic outside {scope})",
                               neighbour=lambda m: (n, 0)) for sc in fleet]
    out.append(Scenario(f"neighbour burn: every request outside {scope} bad, its own healthy, fires nothing",
                        200, lambda rep, m: (n, 0), (120, 130, 200), neighbour=lambda m: (n, n if m > 120 else 0)))
    return out


def low_traffic(min_requests: int) -> Scenario:
    """Every request bad, too few of them to page (see the module docstring)."""
    hours = range(1, LOW_TRAFFIC_HOURS + 1)
    return Scenario(f"low traffic: fewer than {min_requests} requests in every window, all bad, fire nothing",
                    60 * LOW_TRAFFIC_HOURS + 10, lambda rep, m: (1, 1) if m % 60 == 0 and m <= 60 * LOW_TRAFFIC_HOURS else (0, 0),
                    tuple(t for h in hours for t in (60 * h, 60 * h + 1, 60 * h + 4)))


# -- the model ------------------------------------------------------------------------------------
class Model:
    """Counters per replica and minute; exact error ratios and alert states."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.req: dict[str, list[int]] = {}
        self.bad: dict[str, list[int]] = {}
        for rep in REPLICAS:
            req, bad = [0], [0]
            for m in range(1, sc.minutes + 1):
                r, b = sc.traffic(rep, m)
                req.append(req[-1] + r)
                bad.append(bad[-1] + b)
            self.req[rep], self.bad[rep] = req, bad

    def ratio(self, reps: tuple[str, ...], window_min: int, t: int) -> Fraction | None:
        lo = max(0, t - window_min)
        if t - lo < 1:
            return None  # rate() needs two samples
        d_req = sum(self.req[r][t] - self.req[r][lo] for r in reps)
        if d_req == 0:
            return None  # 0/0: no series, so no alert
        return Fraction(sum(self.bad[r][t] - self.bad[r][lo] for r in reps), d_req)

    def requests(self, reps: tuple[str, ...], window_min: int, t: int) -> int:
        """Requests counted in ``[t - window, t]`` (what ``increase`` sees, exactly here)."""
        lo = max(0, t - window_min)
        return sum(self.req[r][t] - self.req[r][lo] for r in reps)


def _minutes(seconds: int) -> int:
    return seconds // 60


def untestable(spec: SloSpec) -> str:
    """Why the minute-sampled scenarios cannot test this SLO's windows ('' when they can)."""
    if spec.kind == "query":
        return ("a Sloth query SLI (sli.events/sli.raw) is arbitrary PromQL; the generator builds "
                "test series only for selector and histogram SLIs")
    page, ticket = R.spec_pairs(spec)
    odd = sorted({w for p in (*page, *ticket) for s, w in ((p.short_s, p.short), (p.long_s, p.long))
                  if s % 60 or s < 120}, key=len)
    if odd:
        return (f"the {spec.window_days}d period's burn windows {', '.join(odd)} are not whole minutes of at least 2m; "
                "the rule-test scenarios sample once a minute")
    return ""


def _gt(x: Fraction | None, thr: Fraction, ties: list[str], what: str) -> bool:
    if x is None:
        return False
    if x == thr:
        ties.append(what)
    return x > thr


def firing(model: Model, spec: SloSpec, t: int, ties: list[str], min_requests: int = 0) -> dict[tuple[str, str, str], bool]:
    """(alertname, severity, replica or '') -> firing, at minute ``t``."""
    budget = Fraction(spec.error_budget).limit_denominator(10**6)
    out: dict[tuple[str, str, str], bool] = {}
    pool = REPLICAS
    page, ticket = R.spec_pairs(spec)

    def enough(reps: tuple[str, ...], p: R.BurnPair) -> bool:
        return model.requests(reps, _minutes(p.long_s), t) >= min_requests

    for sev, pairs in ((names.SEVERITY_PAGE, page), (names.SEVERITY_TICKET, ticket)):
        out[(R.alert_name(spec), sev, "")] = any(
            _gt(model.ratio(pool, _minutes(p.short_s), t), Fraction(p.factor).limit_denominator(100) * budget, ties,
                f"pool {p.short} at {t}")
            and _gt(model.ratio(pool, _minutes(p.long_s), t), Fraction(p.factor).limit_denominator(100) * budget, ties,
                    f"pool {p.long} at {t}")
            and enough(pool, p)
            for p in pairs)
    factor = Fraction(R.OUTLIER_FACTOR).limit_denominator(100)
    for rep in REPLICAS:
        hit = False
        for p in page:
            thr = Fraction(p.factor).limit_denominator(100) * budget
            short = model.ratio((rep,), _minutes(p.short_s), t)
            pool_short = model.ratio(pool, _minutes(p.short_s), t)
            if (_gt(short, thr, ties, f"{rep} {p.short} at {t}")
                    and _gt(model.ratio((rep,), _minutes(p.long_s), t), thr, ties, f"{rep} {p.long} at {t}")
                    and pool_short is not None and _gt(short, factor * pool_short, ties, f"{rep} outlier at {t}")
                    and enough((rep,), p)):
                hit = True
        out[(R.alert_name(spec, replica=True), names.SEVERITY_PAGE, rep)] = hit
    return out


# -- promtool file --------------------------------------------------------------------------------
def compress(values: list[int]) -> str:
    """promtool's expanding notation: runs of a constant step become ``start+stepxN``."""
    out, i = [], 0
    while i < len(values):
        if i + 1 == len(values):
            out.append(str(values[i]))
            break
        step = values[i + 1] - values[i]
        j = i + 1
        while j + 1 < len(values) and values[j + 1] - values[j] == step:
            j += 1
        out.append(f"{values[i]}+{step}x{j - i}")
        i = j + 1
    return " ".join(out)


def _matchers(selector: str) -> tuple[str, list[tuple[str, str, str]]]:
    name, _, rest = selector.partition("{")
    rest = rest.rstrip().rstrip("}")
    found = []
    pos = 0
    while pos < len(rest):
        m = _MATCHER.match(rest, pos)
        if not m:
            raise ValueError(f"cannot read the matchers of {selector!r} to generate test series")
        found.append((m.group(1), m.group(2), m.group(3)))
        pos = m.end()
    return name.strip(), found


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for k, op, v in matchers:
        val = labels.get(k, "")
        ok = {"=": val == v, "!=": val != v, "=~": re.fullmatch(v, val) is not None,
              "!~": re.fullmatch(v, val) is None}[op]
        if not ok:
            return False
    return True


def regex_examples(pattern: str) -> list[str]:
    """Strings that fully match ``pattern`` (Prometheus anchors regexes): each top-level
    alternative with ``.``/``\\d`` as ``0``; those that do not match are dropped."""
    body = pattern[1:-1] if pattern.startswith("(") and pattern.endswith(")") else pattern
    out = []
    for alt in body.split("|"):
        cand = re.sub(r"\\d|\.", "0", alt.strip("()^$"))
        try:
            if re.fullmatch(pattern, cand):
                out.append(cand)
        except re.error:
            break
    return out


def _event_labels(spec: SloSpec, base: dict[str, str]) -> dict[str, dict[str, dict[str, str]]]:
    """For a ratio SLI: per event kind (good/bad), the label set per metric family it increments."""
    pos_sel = spec.bad or spec.good
    pos_name, pos_m = _matchers(pos_sel)
    tot_name, tot_m = _matchers(spec.total)
    keys = sorted({k for k, _, _ in pos_m + tot_m} - set(base))
    cands: dict[str, list[str]] = {}
    for k in keys:
        vals: list[str] = []
        for kk, op, v in pos_m + tot_m:
            if kk == k:
                vals += regex_examples(v) if op in ("=~", "!~") else [v]
        cands[k] = sorted(set(vals)) + ["x_other"]

    def find(pred: Callable[[dict[str, str]], bool]) -> dict[str, str]:
        for combo in itertools.product(*(cands[k] for k in keys)):
            lab = {**base, **dict(zip(keys, combo, strict=True))}
            if pred(lab):
                return lab
        raise ValueError(f"{spec.file}: cannot find test series for {pos_sel!r} / {spec.total!r}")

    def positive_is(p: bool) -> Callable[[dict[str, str]], bool]:
        return lambda lab: _matches(lab, tot_m) and _matches(lab, pos_m) == p

    positive = "bad" if spec.bad else "good"
    out: dict[str, dict[str, dict[str, str]]] = {}
    for kind in ("good", "bad"):
        is_pos = kind == positive
        if pos_name == tot_name:
            out[kind] = {pos_name: find(positive_is(is_pos))}
        else:
            fam = {tot_name: find(lambda lab: _matches(lab, tot_m))}
            if is_pos:
                fam[pos_name] = find(lambda lab: _matches(lab, pos_m))
            out[kind] = fam
    return out


#: The tenant/class value of the neighbour series (outside every spec's scope).
NEIGHBOUR = names.LABEL_OVERFLOW_VALUE


def _cumulative(sc: Scenario, f: Callable[[int], tuple[int, int]]) -> tuple[list[int], list[int]]:
    req, bad = [0], [0]
    for m in range(1, sc.minutes + 1):
        r, b = f(m)
        req.append(req[-1] + r)
        bad.append(bad[-1] + b)
    return req, bad


def input_series(spec: SloSpec, model: Model) -> list[dict[str, str]]:
    """The scenario's counters as promtool input series: per replica in the spec's scope, and per
    tenant/class the spec targets a neighbour on r0 that differs in that label only."""
    model_l = spec.filters.get(names.L_MODEL, MODEL)
    pool_l = spec.filters.get(names.L_POOL, POOL)
    runs: list[tuple[dict[str, str], list[int], list[int]]] = []
    for rep in REPLICAS:
        base = {names.L_MODEL: model_l, names.L_POOL: pool_l, names.L_REPLICA: rep, names.L_ARM: ARM, **spec.scope}
        runs.append((base, model.req[rep], model.bad[rep]))
    if model.sc.neighbour is not None:
        req, bad = _cumulative(model.sc, model.sc.neighbour)
        for k in sorted(spec.scope):
            runs.append(({**runs[0][0], k: NEIGHBOUR}, req, bad))
    events = _event_labels(spec, runs[0][0]) if spec.kind != "latency" else {}
    series: list[dict[str, str]] = []
    for base, req, bad in runs:
        good = [a - b for a, b in zip(req, bad, strict=True)]
        if spec.kind == "latency":
            sel = ", ".join(f'{k}="{v}"' for k, v in base.items())
            le = floatToGoString(spec.threshold_s)
            series.append({"series": f'{spec.histogram}_bucket{{{sel}, le="{le}"}}', "values": compress(good)})
            series.append({"series": f"{spec.histogram}_count{{{sel}}}", "values": compress(req)})
            continue
        counts: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
        # the first replica's event labels with this run's model/pool/replica/tenant/class: a
        # neighbour's event would match the selectors but for its scope label
        for kind, values in (("good", good), ("bad", bad)):
            for fam, lab in events[kind].items():
                key = (fam, tuple(sorted({**lab, **base}.items())))
                cur = counts.setdefault(key, [0] * len(values))
                counts[key] = [a + b for a, b in zip(cur, values, strict=True)]
        for (fam, pairs), values in sorted(counts.items()):
            sel = ", ".join(f'{k}="{v}"' for k, v in pairs)
            series.append({"series": f"{fam}{{{sel}}}", "values": compress(values)})
    return series


def _render(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


def expected(spec: SloSpec, key: tuple[str, str, str]) -> dict:
    alertname, severity, replica = key
    is_rep = bool(replica)
    labels = {**R.alert_labels(spec, severity, is_rep), **R.id_labels(spec), **spec.labels, **spec.scope,
              names.L_MODEL: spec.filters.get(names.L_MODEL, MODEL), names.L_POOL: spec.filters.get(names.L_POOL, POOL)}
    if is_rep:
        labels[names.L_REPLICA] = replica
    ann = {k: _render(v, labels) for k, v in R.alert_annotations(spec, severity, is_rep).items()}
    return {"exp_labels": dict(sorted(labels.items())), "exp_annotations": ann}


def test_group(spec: SloSpec, sc: Scenario, min_requests: int = 0) -> tuple[dict, dict[str, int]]:
    """One promtool test group; also the first firing minute of each alert (for the docs)."""
    model = Model(sc)
    ties: list[str] = []
    states = {t: firing(model, spec, t, ties, min_requests) for t in range(0, sc.minutes + 1)}
    checks = set(sc.checks)
    first: dict[str, int] = {}
    for t in range(1, sc.minutes + 1):
        for key, on in states[t].items():
            if on != states[t - 1][key]:
                checks.update((t - 1, t))  # both sides of every transition
                if on:
                    first.setdefault(f"{key[0]}/{key[1]}" + (f"/{key[2]}" if key[2] else ""), t)
    tests = []
    for t in sorted(checks):
        tie = [x for x in ties if x.endswith(f" at {t}")]
        if tie:
            raise AssertionError(f"{spec.name}: {sc.name}: a check at minute {t} sits on a tie ({tie}); change the scenario")
        for alertname in (R.alert_name(spec), R.alert_name(spec, replica=True)):
            exp = [expected(spec, k) for k, on in sorted(states[t].items()) if on and k[0] == alertname]
            tests.append({"eval_time": f"{t}m", "alertname": alertname, "exp_alerts": exp})
    group = {"name": sc.name, "interval": "1m", "input_series": input_series(spec, model), "alert_rule_test": tests}
    return group, first


def test_file(spec: SloSpec, rule_file: str, min_requests: int = 0) -> tuple[dict, dict[str, dict[str, int]]]:
    groups, firsts = [], {}
    for sc in scenarios(spec, min_requests):
        g, first = test_group(spec, sc, min_requests)
        groups.append(g)
        firsts[sc.name] = first
    # recording groups before the alerts at each step, so an alert sees this minute's ratios
    # (without an order promtool evaluates the groups in an unspecified order)
    order = [g["name"] for g in R.slo_rule_file(spec, R.Profile())["groups"]]
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "group_eval_order": order,
            "tests": groups}, firsts
