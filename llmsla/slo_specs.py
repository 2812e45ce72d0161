"""SLO specs: the OpenSLO v1 subset llmsla reads from ``deploy/slo/*.yaml``, plus Sloth's
``prometheus/v1`` and ``openslo/v1alpha`` as Sloth reads them, all into one :class:`SloSpec`.

Anything outside the subset is an error naming file, line and field, so a typo never silently
means a default. A latency threshold must be a bucket bound of its histogram, because PromQL can
only count ``le`` exactly. See docs/alerting.md#1-slo-specs-deploysloyaml.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsla import names
from llmsla.config import Config
from llmsla.yamlsrc import Doc, Reader, SourceError, load_file

API_VERSION = "openslo/v1"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{.*\})?\s*$", re.S)
_DAYS = re.compile(r"^([1-9][0-9]*)d$")
#: Labels of ``metadata.labels`` that filter the selectors instead of labelling the rules.
FILTER_LABELS = (names.L_MODEL, names.L_POOL, names.L_TENANT, names.L_CLASS)
#: Of those, the ones that give a spec a scope of its own: the request's tenant and class. The
#: rules keep them on every series and alert, so a tenant's burn pages for that tenant
#: (docs/alerting.md#slos-per-class-and-per-tenant).
SCOPE_LABELS = (names.L_TENANT, names.L_CLASS)
#: Config keys a threshold may name instead of a number (ms in the config, seconds in rules).
CONFIG_THRESHOLDS = {"slo.ttft_ms": "ttft_ms", "slo.e2e_ms": "e2e_ms", "slo.itl_ms": "itl_ms"}


def histogram_buckets(cfg: Config) -> dict[str, tuple[str, list[float]]]:
    """Histogram family -> (its buckets' config key, bounds in seconds)."""
    m = cfg.metrics
    return {
        names.REQUEST_TTFT_SECONDS: ("metrics.ttft_buckets", list(m.ttft_buckets)),
        names.REQUEST_E2E_SECONDS: ("metrics.e2e_buckets", list(m.e2e_buckets)),
        names.REQUEST_INTER_CHUNK_SECONDS: ("metrics.itl_buckets", list(m.itl_buckets)),
        names.REQUEST_TPOT_SECONDS: ("metrics.itl_buckets", list(m.itl_buckets)),
        names.REQUEST_QUEUE_SECONDS: ("metrics.queue_buckets", list(m.queue_buckets)),
    }


@dataclass(frozen=True)
class SloSpec:
    """One validated SLO; ``kind`` is ``latency`` (histogram threshold) or ``ratio``."""

    name: str
    service: str
    description: str
    display_name: str
    file: str
    kind: str
    target: float
    window_days: int
    # latency
    histogram: str = ""
    threshold_s: float = 0.0
    # ratio: exactly one of good/bad is set
    good: str = ""
    bad: str = ""
    total: str = ""
    filters: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    #: the line of ``metadata.name`` (for errors about the whole spec: a duplicate target)
    line: int = 0
    # query (Sloth prometheus/v1): PromQL with {{.window}}; events (error + total) or raw ratio
    error_query: str = ""
    total_query: str = ""
    error_ratio_query: str = ""
    #: Sloth's alerting block: "name", "labels", "annotations", and per severity (page/ticket)
    #: {"labels", "annotations", "disable"}
    alerting: dict = field(default_factory=dict)
    api_version: str = API_VERSION

    @property
    def error_budget(self) -> float:
        return 1.0 - self.target

    @property
    def scope(self) -> dict[str, str]:
        """The tenant and class this spec targets (empty: every request, the fleet-wide spec)."""
        return {k: v for k, v in self.filters.items() if k in SCOPE_LABELS}

    @property
    def where(self) -> str:
        """``file:line`` of the spec, for errors about the spec as a whole."""
        return f"{self.file}:{self.line}" if self.line else self.file

    @property
    def sloth_id(self) -> str:
        return f"{self.service}-{self.name}"

    @property
    def camel(self) -> str:
        return "".join(p[:1].upper() + p[1:] for p in self.name.split("-"))


def _scope_problem(label: str, value: str, cfg: Config) -> str | None:
    """Why a ``tenant``/``class`` label names no tenant or class of ``[tenants]`` (None: it does).
    A spec for a tenant that is not declared would watch series that never exist (the gateway
    labels an undeclared tenant ``other``), so its pages could never fire."""
    t = cfg.tenants
    if label == names.L_TENANT and value not in t.declared:
        known = ", ".join(sorted(t.declared)) or "none: the configuration declares no tenants"
        return f"tenant {value!r} is not declared in tenants.declared ({known})"
    if label == names.L_CLASS and value not in t.classes:
        return f"class {value!r} is not one of tenants.classes ({', '.join(t.classes)})"
    return None


def _selector(r: Reader, key: str) -> str:
    """``<key>.metricSource`` of a ratioMetric: a Prometheus series selector."""
    src = r.sub(key)
    src.keys({"metricSource"}, {"metricSource"})
    ms = src.sub("metricSource")
    ms.keys({"type", "spec", "metricSourceRef"}, {"type", "spec"})
    if ms.get("type", str) != "Prometheus":
        raise ms.error("type", f"only Prometheus is supported, got {ms.value['type']!r}")
    spec = ms.sub("spec")
    spec.keys({"query"}, {"query"})
    query = spec.get("query", str).strip()
    if not _SELECTOR.match(query):
        raise spec.error("query", f"expected a counter series selector like name{{label=\"v\"}}, got {query!r} "
                                  "(the generator applies rate() and the windows itself)")
    return query


def _restrict(selector: str, filters: dict[str, str]) -> str:
    """Add ``model``/``pool`` matchers to a selector."""
    if not filters:
        return selector
    m = _SELECTOR.match(selector)
    assert m is not None
    inner = (m.group(2) or "{}")[1:-1].strip()
    extra = ", ".join(f'{k}="{v}"' for k, v in sorted(filters.items()))
    return f"{m.group(1)}{{{inner + ', ' if inner else ''}{extra}}}"


def parse(doc: Doc, cfg: Config) -> SloSpec:
    """Validate one document; :class:`SourceError` names file, line and field."""
    r = Reader(doc)
    r.keys({"apiVersion", "kind", "metadata", "spec"}, {"apiVersion", "kind", "metadata", "spec"})
    if r.get("apiVersion", str) != API_VERSION:
        raise r.error("apiVersion", f"expected {API_VERSION!r}, got {r.value['apiVersion']!r}")
    if r.get("kind", str) != "SLO":
        raise r.error("kind", f"only kind SLO is read here, got {r.value['kind']!r}")
    meta = r.sub("metadata")
    meta.keys({"name", "displayName", "labels", "annotations"}, {"name"})
    name = meta.get("name", str)
    if not _NAME.match(name) or len(name) > 63:
        raise meta.error("name", f"must be lowercase letters, digits and '-' (<= 63), got {name!r}")
    filters: dict[str, str] = {}
    labels: dict[str, str] = {}
    if meta.has("labels"):
        lab = meta.sub("labels")
        for k, v in lab.value.items():
            if not _LABEL.match(k):
                raise lab.error(k, "not a valid Prometheus label name")
            if not isinstance(v, str) or not v:
                raise lab.error(k, f"expected a non-empty string, got {v!r}")
            if k.startswith("sloth_") or k in (names.L_SEVERITY, names.L_SLO, names.L_SOURCE, names.L_SCOPE,
                                               names.L_REPLICA):
                raise lab.error(k, "reserved: the generator sets this label")
            if (problem := _scope_problem(k, v, cfg)) is not None:
                raise lab.error(k, problem)
            (filters if k in FILTER_LABELS else labels)[k] = v
    spec = r.sub("spec")
    spec.keys({"description", "service", "indicator", "timeWindow", "budgetingMethod", "objectives"},
              {"service", "indicator", "timeWindow", "budgetingMethod", "objectives"})
    service = spec.get("service", str)
    if not _NAME.match(service):
        raise spec.error("service", f"must be lowercase letters, digits and '-', got {service!r}")
    if spec.get("budgetingMethod", str) != "Occurrences":
        raise spec.error("budgetingMethod", f"only Occurrences is supported, got {spec.value['budgetingMethod']!r}")
    windows = spec.items("timeWindow")
    if len(windows) != 1:
        raise spec.error("timeWindow", f"expected exactly one window, got {len(windows)}")
    tw = Reader(doc, *windows[0])
    tw.keys({"duration", "isRolling", "calendar"}, {"duration", "isRolling"})
    if tw.get("isRolling", bool) is not True or tw.has("calendar"):
        raise tw.error("isRolling", "only rolling windows are supported (isRolling: true)")
    dm = _DAYS.match(tw.get("duration", str))
    if not dm:
        raise tw.error("duration", f"expected whole days like '30d', got {tw.value['duration']!r}")
    window_days = int(dm.group(1))
    objectives = spec.items("objectives")
    if len(objectives) != 1:
        raise spec.error("objectives", f"expected exactly one objective, got {len(objectives)}")
    obj = Reader(doc, *objectives[0])
    obj.keys({"displayName", "target", "op", "value"}, {"target"})
    target = float(obj.get("target", (int, float)))
    if not (0 < target < 1) or not math.isfinite(target):
        raise obj.error("target", f"must be a ratio in (0, 1), e.g. 0.99, got {target!r}")
    ind = spec.sub("indicator")
    ind.keys({"metadata", "spec"}, {"spec"})
    ispec = ind.sub("spec")
    ispec.keys({"ratioMetric", "thresholdMetric"})
    common = dict(name=name, service=service, description=spec.get("description", str, ""),
                  display_name=meta.get("displayName", str, name), file=doc.file, target=target,
                  window_days=window_days, filters=filters, labels=labels, line=doc.line(("metadata", "name")))
    if ispec.has("ratioMetric") == ispec.has("thresholdMetric"):
        raise ispec.error(None, "expected exactly one of ratioMetric or thresholdMetric")
    if ispec.has("ratioMetric"):
        rm = ispec.sub("ratioMetric")
        rm.keys({"counter", "good", "bad", "total"}, {"counter", "total"})
        if rm.get("counter", bool) is not True:
            raise rm.error("counter", "only counters are supported (counter: true)")
        if rm.has("good") == rm.has("bad"):
            raise rm.error(None, "expected exactly one of good or bad (plus total)")
        for k in ("op", "value"):
            if obj.has(k):
                raise obj.error(k, "only a thresholdMetric objective has op/value")
        good = _restrict(_selector(rm, "good"), filters) if rm.has("good") else ""
        bad = _restrict(_selector(rm, "bad"), filters) if rm.has("bad") else ""
        return SloSpec(kind="ratio", good=good, bad=bad, total=_restrict(_selector(rm, "total"), filters), **common)
    tm = ispec.sub("thresholdMetric")
    tm.keys({"metricSource"}, {"metricSource"})
    ms = tm.sub("metricSource")
    ms.keys({"type", "spec", "metricSourceRef"}, {"type", "spec"})
    if ms.get("type", str) != "Prometheus":
        raise ms.error("type", f"only Prometheus is supported, got {ms.value['type']!r}")
    qs = ms.sub("spec")
    qs.keys({"query"}, {"query"})
    hist = qs.get("query", str).strip()
    buckets = histogram_buckets(cfg)
    if hist not in buckets:
        raise qs.error("query", f"expected one of the request histograms {', '.join(buckets)}, got {hist!r}")
    if obj.get("op", str) != "lte":
        raise obj.error("op", f"a histogram threshold counts le (<=): op must be lte, got {obj.value['op']!r}")
    raw = obj.get("value", (int, float, str))
    if isinstance(raw, str):
        if raw not in CONFIG_THRESHOLDS:
            raise obj.error("value", f"expected seconds or one of {', '.join(CONFIG_THRESHOLDS)}, got {raw!r}")
        threshold = getattr(cfg.slo, CONFIG_THRESHOLDS[raw]) / 1000.0
    else:
        threshold = float(raw)
    bkey, bounds = buckets[hist]
    bound = next((b for b in bounds if math.isclose(b, threshold, rel_tol=1e-9)), None)
    if bound is None:
        shown = f"{raw} = {threshold:g} s" if isinstance(raw, str) else f"{threshold:g} s"
        raise obj.error("value", f"{shown} is not a bucket bound of {hist} ({bkey}: "
                                 f"{', '.join(f'{b:g}' for b in bounds)}); use one of them or add {threshold:g} to {bkey}")
    return SloSpec(kind="latency", histogram=hist, threshold_s=bound, **common)


SLOTH_VERSION = "prometheus/v1"
#: Sloth's Kubernetes CRD: the same SLOs under ``spec``, its keys in camelCase.
SLOTH_K8S_VERSION = "sloth.slok.dev/v1"
SLOTH_K8S_KIND = "PrometheusServiceLevel"
_K8S_KEYS = {"error_query": "errorQuery", "total_query": "totalQuery", "error_ratio_query": "errorRatioQuery",
             "page_alert": "pageAlert", "ticket_alert": "ticketAlert"}
_WINDOW_TMPL = "{{.window}}"


def _str_map(r: Reader, key: str) -> dict[str, str]:
    if not r.has(key):
        return {}
    m = r.sub(key)
    for k, v in m.value.items():
        if not _LABEL.match(k) or not isinstance(v, str):
            raise m.error(k, "expected a label name with a string value")
    return dict(m.value)


def is_sloth_k8s(value: Any) -> bool:
    """A YAML document that is Sloth's Kubernetes ``PrometheusServiceLevel``."""
    return isinstance(value, dict) and value.get("apiVersion") == SLOTH_K8S_VERSION \
        and value.get("kind") == SLOTH_K8S_KIND


def parse_sloth(doc: Doc, cfg: Config, period_days: int = 30) -> list[SloSpec]:
    """A Sloth ``prometheus/v1`` document, or Sloth's Kubernetes ``PrometheusServiceLevel``
    (``sloth.slok.dev/v1``: the same fields under ``spec``, camelCase): one SloSpec per
    ``slos[]`` (Sloth's period comes from the command line, ``--default-slo-period``, 30d by
    default)."""
    k8s = is_sloth_k8s(doc.value)

    def key(name: str) -> str:
        return _K8S_KEYS.get(name, name) if k8s else name

    if k8s:
        top = Reader(doc)
        top.keys({"apiVersion", "kind", "metadata", "spec"}, {"apiVersion", "kind", "spec"})
        r = top.sub("spec")
        r.keys({"service", "labels", "slos"}, {"service", "slos"})
    else:
        r = Reader(doc)
        r.keys({"version", "service", "labels", "slos"}, {"version", "service", "slos"})
    service = r.get("service", str)
    if not _NAME.match(service):
        raise r.error("service", f"must be lowercase letters, digits and '-', got {service!r}")
    glob = _str_map(r, "labels")
    out = []
    for path, value in r.items("slos"):
        s = Reader(doc, path, value)
        s.keys({"name", "objective", "description", "labels", "sli", "alerting"}, {"name", "objective", "sli"})
        name = s.get("name", str)
        if not _NAME.match(name):
            raise s.error("name", f"must be lowercase letters, digits and '-', got {name!r}")
        obj = float(s.get("objective", (int, float)))
        if not 0 < obj < 100:
            raise s.error("objective", f"must be a percentage in (0, 100), got {obj!r}")
        sli = s.sub("sli")
        sli.keys({"events", "raw"})
        q: dict[str, Any] = {}  # SloSpec's query fields, passed as keywords
        if sli.has("events") == sli.has("raw"):
            raise sli.error(None, "expected exactly one of events or raw")
        if sli.has("events"):
            ev = sli.sub("events")
            ev.keys({key("error_query"), key("total_query")}, {key("error_query"), key("total_query")})
            q = {"error_query": ev.get(key("error_query"), str).strip(),
                 "total_query": ev.get(key("total_query"), str).strip()}
        else:
            raw = sli.sub("raw")
            raw.keys({key("error_ratio_query")}, {key("error_ratio_query")})
            q = {"error_ratio_query": raw.get(key("error_ratio_query"), str).strip()}
        for v in q.values():
            if _WINDOW_TMPL not in v:
                raise sli.error(None, f"a query must contain {_WINDOW_TMPL} (the generator fills in each window)")
        alerting: dict = {}
        if s.has("alerting"):
            a = s.sub("alerting")
            a.keys({"name", "labels", "annotations", key("page_alert"), key("ticket_alert")})
            alerting = {"name": a.get("name", str, ""), "labels": _str_map(a, "labels"),
                        "annotations": _str_map(a, "annotations")}
            for sev, field_name in ((names.SEVERITY_PAGE, key("page_alert")), (names.SEVERITY_TICKET, key("ticket_alert"))):
                if a.has(field_name):
                    sa = a.sub(field_name)
                    sa.keys({"labels", "annotations", "disable"})
                    alerting[sev] = {"labels": _str_map(sa, "labels"), "annotations": _str_map(sa, "annotations"),
                                     "disable": bool(sa.get("disable", bool, False))}
        out.append(SloSpec(name=name, service=service, description=s.get("description", str, ""),
                           display_name=name, file=doc.file, kind="query", target=obj / 100,
                           window_days=period_days, labels={**glob, **_str_map(s, "labels")},
                           alerting=alerting, api_version=SLOTH_K8S_VERSION if k8s else SLOTH_VERSION, **q))
    return out


V1ALPHA = "openslo/v1alpha"


def parse_v1alpha(doc: Doc) -> list[SloSpec]:
    """``openslo/v1alpha`` as Sloth reads it: one SLO per objective, named ``<name>-<index>``,
    ratioMetrics good/total PromQL with ``{{.window}}``; the period from ``timeWindows`` in days."""
    r = Reader(doc)
    r.keys({"apiVersion", "kind", "metadata", "spec"}, {"apiVersion", "kind", "metadata", "spec"})
    meta = r.sub("metadata")
    meta.keys({"name", "displayName", "labels", "annotations"}, {"name"})
    spec = r.sub("spec")
    spec.keys({"service", "description", "budgetingMethod", "objectives", "timeWindows"},
              {"service", "objectives", "timeWindows"})
    tws = spec.items("timeWindows")
    if len(tws) != 1:
        raise spec.error("timeWindows", f"expected exactly one window, got {len(tws)}")
    tw = Reader(doc, *tws[0])
    tw.keys({"count", "unit", "isRolling", "calendar"}, {"count", "unit"})
    if tw.get("unit", str) != "Day" or tw.get("count", int) < 1:
        raise tw.error("unit", "expected a count of unit Day")
    out = []
    for i, (path, value) in enumerate(spec.items("objectives")):
        o = Reader(doc, path, value)
        o.keys({"ratioMetrics", "target", "displayName", "value", "op"}, {"ratioMetrics", "target"})
        rm = o.sub("ratioMetrics")
        rm.keys({"good", "total", "incremental"}, {"good", "total"})
        q = {}
        for k in ("good", "total"):
            m = rm.sub(k)
            m.keys({"source", "queryType", "query", "metadata"}, {"query"})
            q[k] = m.get("query", str).strip()
            if _WINDOW_TMPL not in q[k]:
                raise m.error("query", f"a query must contain {_WINDOW_TMPL}")
        target = float(o.get("target", (int, float)))
        if not 0 < target < 1:
            raise o.error("target", f"must be a ratio in (0, 1), got {target!r}")
        out.append(SloSpec(name=f"{meta.get('name', str)}-{i}", service=spec.get("service", str),
                           description=spec.get("description", str, ""), display_name=meta.get("displayName", str, ""),
                           file=doc.file, kind="query", target=target, window_days=tw.get("count", int),
                           error_ratio_query=f"1 - (\n  ({q['good']})\n  /\n  ({q['total']})\n)",
                           api_version=V1ALPHA))
    return out


def load_specs(paths: list[Path], cfg: Config, period_days: int = 30) -> list[SloSpec]:
    """Every SLO of every file, sorted by name; names must be unique."""
    specs: list[SloSpec] = []
    seen: dict[str, str] = {}
    for p in sorted(paths):
        for doc in load_file(p):
            sloth = (isinstance(doc.value, dict) and doc.value.get("version") == SLOTH_VERSION) or is_sloth_k8s(doc.value)
            alpha = isinstance(doc.value, dict) and doc.value.get("apiVersion") == V1ALPHA
            parsed = parse_sloth(doc, cfg, period_days) if sloth else parse_v1alpha(doc) if alpha else [parse(doc, cfg)]
            for s in parsed:
                if s.name in seen:
                    raise doc.error(("metadata", "name"), f"SLO {s.name!r} is already defined in {seen[s.name]}")
                seen[s.name] = f"{doc.file}:{doc.line(('metadata', 'name'))}"
                specs.append(s)
    return sorted(specs, key=lambda s: s.name)


def spec_files(directory: Path) -> list[Path]:
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    if not files:
        raise SourceError(f"{directory}: no *.yaml SLO specs found")
    return files
