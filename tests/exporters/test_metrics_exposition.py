"""The fast ``/metrics`` renderer against prometheus-client's own ``generate_latest``.

Both outputs are parsed by prometheus-client's parser (the reference) and every sample (name,
labels, value) must agree, except the ``_created`` series the fast renderer drops on purpose.
"""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.events import ItlSummary, RequestEvent
from llmsla.exporters.recorder import RequestRecorder
from llmsla.exposition import exposition, render_fast


def _samples(text: str) -> list[tuple[str, tuple, float | str]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            v = "NaN" if math.isnan(s.value) else s.value
            out.append((s.name, tuple(sorted(s.labels.items())), v))
    return sorted(out, key=repr)


def _families(text: str) -> list[tuple[str, str, str]]:
    return [(f.name, f.type, f.documentation) for f in text_string_to_metric_families(text)
            if not f.name.endswith("_created")]


def _assert_equivalent(reg: CollectorRegistry) -> str:
    ref = generate_latest(reg).decode()
    fast = render_fast(reg).decode()
    assert _samples(fast) == _samples(ref)
    assert _families(fast) == _families(ref)
    assert "_created" not in fast
    # same lines, in the same order, once the reference's _created lines are dropped
    assert fast.splitlines() == [ln for ln in ref.splitlines() if "_created" not in ln]
    return fast


def _event(i: int, **kw) -> RequestEvent:
    base = dict(ts_ms=1_700_000_000_000, trace_id="a" * 32, model=f"model-{i % 7}", pool="p",
                replica=f"r{i % 3}", arm=names.DEFAULT_ARM, policy="constant", prompt_tokens=5 + i,
                output_tokens=3, queue_ms=0.5 + i, ttft_ms=30.0 + i, itl_ms=ItlSummary.from_gaps([10.0, 20.0 + i]),
                e2e_ms=60.0 + 3 * i, status=names.STATUSES[i % len(names.STATUSES)])
    base.update(kw)
    return RequestEvent(**base)


def test_request_metrics_render_like_generate_latest(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.metrics.label_top_n = 1000
    reg = CollectorRegistry()
    rec = RequestRecorder(cfg, registry=reg)
    for i in range(60):
        rec.record(_event(i), itl_gaps_ms=[10.0, 20.0 + i, 3000.0 * i])
    # label values that need escaping, and unicode
    for model in ('we"ird', "back\\slash", "new\nline", "modèle-é"):
        rec.record(_event(1, model=model, status=names.STATUS_OK), itl_gaps_ms=[1.0])  # served: admitted
    rec.metrics.bad_request("invalid_json")
    rec.metrics.in_flight_child("p").inc(3)
    _assert_equivalent(reg)
    # the prefix cache must follow value changes and new children
    for i in range(60, 90):
        rec.record(_event(i, model="late", status=names.STATUS_OK), itl_gaps_ms=[5.0] * 40)
    fast = _assert_equivalent(reg)
    assert 'model="late"' in fast
    assert 'model="we\\"ird"' in fast and 'model="new\\nline"' in fast


def test_other_metric_kinds_and_fallbacks() -> None:
    reg = CollectorRegistry()
    c = Counter("plain_events", "Unlabelled counter.", registry=reg)
    c.inc(2_500_000)  # >= 1e6: Go-style exponent formatting
    g = Gauge("plain_level", "Gauge with a \\ backslash\nand newline in help.", ["k"], registry=reg)
    g.labels("a").set(-3.25)
    g.labels("b").set(float("inf"))
    g.labels("c").set(float("nan"))
    g.labels("d").set(1e-9)
    fn = Gauge("fn_gauge", "set_function gauge (fallback path).", registry=reg)
    fn.set_function(lambda: 42.0)
    h = Histogram("neg_hist", "Histogram with a negative bucket: no _sum.", buckets=(-1.0, 0.0, 1.0), registry=reg)
    h.observe(-5)
    h.observe(0.5)
    h2 = Histogram("lbl_hist", "Labelled histogram.", ["a", "b"], buckets=(0.1, 1e7), registry=reg)
    h2.labels("x", "y").observe(2e6)
    h2.labels("x", "z")  # a child with no observations
    Counter("empty_family", "Labelled, no children yet.", ["x"], registry=reg)
    s = Summary("summ", "Summary (fallback path).", ["x"], registry=reg)
    s.labels("1").observe(3)
    Info("build", "Info (fallback path).", registry=reg).info({"version": "1.2"})
    Enum("state", "Enum (fallback path).", states=["up", "down"], registry=reg).state("down")

    class Custom:
        def collect(self):
            f = GaugeMetricFamily("custom_thing", "A custom collector.", labels=["z"])
            f.add_metric(["1"], 7.0)
            yield f

    reg.register(Custom())
    ctr = Counter("removed_children", "Children come and go.", ["x"], registry=reg)
    for x in "abc":
        ctr.labels(x).inc()
    _assert_equivalent(reg)
    ctr.remove("b")
    fast = _assert_equivalent(reg)
    assert 'removed_children_total{x="b"}' not in fast
    assert "plain_events_total 2.5e+06" in fast


def test_exposition_uses_the_fast_renderer() -> None:
    reg = CollectorRegistry()
    Counter("x_events", "x", registry=reg).inc()
    body, ctype = exposition(reg)
    assert body == render_fast(reg)
    assert b"x_events_created" not in body and b"x_events_total 1.0" in body
    assert ctype.startswith("text/plain")
