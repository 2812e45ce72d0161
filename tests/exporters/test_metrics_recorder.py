"""RequestRecorder/GpuRecorder: metrics and spool agree, the cardinality guard bounds labels."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.events import EventError, GpuSample, ItlSummary, RequestEvent
from llmsla.exporters.metrics import GoodputBounds
from llmsla.exporters.recorder import GpuRecorder, RequestRecorder
from llmsla.resources import deploy
from llmsla.spool import SpoolWriter, published_segments, read_segment

#: The tenant and class of an event that names none (tenants off).
TENANCY = {names.L_TENANT: names.DEFAULT_TENANT, names.L_CLASS: names.DEFAULT_CLASS}


def _cfg(tmp_path: Path) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    return c


def _event(**kw) -> RequestEvent:
    base = dict(ts_ms=1_700_000_000_000, trace_id="a" * 32, model="m", pool="p", replica="r0",
                arm=names.DEFAULT_ARM, policy="constant", prompt_tokens=5, output_tokens=3,
                queue_ms=1.0, ttft_ms=30.0, itl_ms=ItlSummary.from_gaps([10.0, 20.0]), e2e_ms=60.0,
                status=names.STATUS_OK)
    base.update(kw)
    return RequestEvent(**base)


def _read(root: Path, kind: str) -> list:
    out = []
    for seg in published_segments(root, kind):
        out += list(read_segment(seg, kind))
    return out


def test_record_metrics_and_spool_agree(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    rec = RequestRecorder(cfg, registry=reg, spool=spool)
    rec.record(_event(), itl_gaps_ms=[10.0, 20.0])
    rec.record(_event(status=names.STATUS_ERROR, ttft_ms=None, output_tokens=0, itl_ms=ItlSummary.from_gaps([])))
    rec.record(_event(replica="r1", itl_ms=ItlSummary.from_gaps([5.0, 5.0, 50.0])))  # summary path
    spool.close()
    lbl = {"model": "m", "pool": "p", "replica": "r0", "arm": names.DEFAULT_ARM, **TENANCY}
    g = reg.get_sample_value
    assert g("llmsla_requests_total", {**lbl, "status": "ok"}) == 1
    assert g("llmsla_requests_total", {**lbl, "status": "error"}) == 1
    assert g("llmsla_request_ttft_seconds_count", lbl) == 1
    assert g("llmsla_request_e2e_seconds_count", lbl) == 2
    assert g("llmsla_request_queue_seconds_count", lbl) == 2
    assert g("llmsla_request_inter_chunk_seconds_count", lbl) == 2
    assert math.isclose(g("llmsla_request_inter_chunk_seconds_sum", lbl), 0.030)
    assert g("llmsla_tokens_total", {**lbl, "kind": "prompt"}) == 10
    assert g("llmsla_tokens_total", {**lbl, "kind": "output"}) == 3
    # simulator path: the summary keeps _sum and _count exact
    r1 = {**lbl, "replica": "r1"}
    assert g("llmsla_request_inter_chunk_seconds_count", r1) == 3
    assert math.isclose(g("llmsla_request_inter_chunk_seconds_sum", r1), 0.060)
    events = _read(tmp_path / "spool", names.SPOOL_REQUESTS)
    assert [e.status for e in events] == ["ok", "error", "ok"]
    assert events[0] == _event()


def test_invalid_event_counts_nowhere(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    rec = RequestRecorder(cfg, registry=reg, spool=spool)
    with pytest.raises(EventError, match="ttft_ms"):
        rec.record(_event(ttft_ms=100.0, e2e_ms=50.0))
    spool.close()
    assert reg.get_sample_value("llmsla_requests_total", {"model": "m", "pool": "p", "replica": "r0",
                                                         "arm": "default", "status": "ok", **TENANCY}) is None
    assert _read(tmp_path / "spool", names.SPOOL_REQUESTS) == []


def test_cardinality_guard_folds_and_counts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.metrics.label_top_n = 3
    cfg.metrics.allowed_arms = ["default", "b"]
    reg = CollectorRegistry()
    rec = RequestRecorder(cfg, registry=reg)
    for i in range(10):
        rec.record(_event(model=f"m{i}"))
    rec.record(_event(arm="evil"))
    rec.record(_event(arm="b"))
    samples = [s for m in reg.collect() if m.name == "llmsla_requests" for s in m.samples
               if s.name == "llmsla_requests_total"]
    models = {s.labels["model"] for s in samples}
    assert models == {"m0", "m1", "m2", names.LABEL_OVERFLOW_VALUE}
    assert sum(s.value for s in samples) == 12  # nothing lost, only folded
    g = reg.get_sample_value
    assert g("llmsla_label_overflow_total", {"label": "model"}) == 9  # m3..m9, then model "m" twice
    assert g("llmsla_label_overflow_total", {"label": "arm"}) == 1
    arms = {s.labels["arm"] for s in samples}
    assert arms == {"default", "b", names.LABEL_OVERFLOW_VALUE}


def test_shared_registry_two_recorders(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    RequestRecorder(cfg, registry=reg).record(_event())
    RequestRecorder(cfg, registry=reg).record(_event())
    assert reg.get_sample_value("llmsla_requests_total", {"model": "m", "pool": "p", "replica": "r0",
                                                         "arm": "default", "status": "ok", **TENANCY}) == 2


def test_gpu_recorder(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_GPU, background=False)
    s = GpuSample(ts_ms=1_700_000_000_000, node="n", gpu=0, uuid="GPU-x", mem_used_bytes=3, mem_total_bytes=10,
                  util=0.5, temp_c=60.0, power_w=200.0)
    GpuRecorder(cfg, registry=reg, spool=spool).record(s, model_name="H200")
    spool.close()
    lbl = {"gpu": "0", "uuid": "GPU-x", "model_name": "H200"}
    assert reg.get_sample_value("llmsla_gpu_memory_free_bytes", lbl) == 7
    assert reg.get_sample_value("llmsla_gpu_utilization_ratio", lbl) == 0.5
    assert _read(tmp_path / "spool", names.SPOOL_GPU) == [s]


def _sse(obj) -> bytes:
    import json

    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_stream_timer_against_json_reference() -> None:
    """The fast per-chunk classification agrees with decoding every chunk as JSON."""
    import json

    from llmsla.exporters.recorder import StreamTimer, _token_count

    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},  # vLLM role chunk: no token
        {"choices": [{"index": 0, "delta": {"content": "He"}}], "usage": None},
        {"choices": [{"index": 0, "delta": {"content": '"quoted"'}}]},
        {"choices": [{"index": 0, "delta": {"content": 'text "usage": {'}}]},  # keys inside a string
        {"choices": [{"index": 0, "text": ""}]},  # partial UTF-8 byte from the byte-level worker
        {"choices": [{"index": 0, "text": "\\"}]},
        {"choices": [{"index": 0, "text": "!", "finish_reason": "length"}],
         "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
         "llmsla": {"worker_ttft_ms": 1.5, "worker_queue_ms": 0.1, "prompt_tokens": 9, "output_tokens": 6}},
    ]
    raw = b"".join(_sse(c) for c in chunks) + b"data: [DONE]\n\n"
    reference = [bool(_token_count(c)) for c in chunks]
    events = [_sse(c) for c in chunks] + [b"data: [DONE]\n\n"]
    for cut in (0, 1, 7, 33, len(raw)):  # arbitrary network splits, even inside "data:"
        t = StreamTimer(0.0, streaming=True)
        stamps = []
        # cut 0: one event per chunk, as upstreams usually flush (the single-event fast path)
        pieces = events if cut == 0 else [raw[i:i + cut] for i in range(0, len(raw), cut)]
        for i, piece in enumerate(pieces):
            now = 1.0 + i
            t.feed(piece, now)
            stamps.append(now)
        assert t.chunks_with_tokens == sum(reference) == 5
        assert t.usage == chunks[-1]["usage"] and t.ext == chunks[-1]["llmsla"]
        assert t.tokens(prompt_estimate=99) == (9, 6)  # usage wins over counting
        assert len(t.gaps_ms) == 4 and all(g >= 0 for g in t.gaps_ms)
    ev = t.event(end=2.0, ts_ms=1, trace_id="b" * 32, model="m", pool="p", replica="r", arm="a", policy="x",
                 status="ok", prompt_estimate=3)
    assert ev.ttft_ms == 1000.0 and ev.e2e_ms == 2000.0 and ev.output_tokens == 6
    json.loads(ev.to_json())
    # no usage: counted tokens and the prompt estimate
    t = StreamTimer(0.0, streaming=True)
    t.feed(_sse({"choices": [{"text": "a"}]}) + _sse({"choices": [{"text": "b"}]}), 0.5)
    assert t.tokens(prompt_estimate=3) == (3, 2)


def test_stream_timer_keeps_what_a_genai_span_reports() -> None:
    """Response model, id and finish reasons, also when (as vLLM with include_usage sends it) the
    finish reason has its own chunk and usage comes after it with no choices; a quoted
    '"finish_reason": "' inside the text is not mistaken for one, and the counts do not move."""
    import json

    from llmsla.exporters.recorder import StreamTimer

    def chunk(**kw):  # type: ignore[no-untyped-def]
        return {"id": "cmpl-7", "model": "served-model", **kw}

    chunks = [
        chunk(choices=[{"index": 0, "text": "a", "finish_reason": None}]),
        chunk(choices=[{"index": 0, "text": '"finish_reason": "x', "finish_reason": None}]),
        chunk(choices=[{"index": 0, "text": "b", "finish_reason": "stop"}]),
        chunk(choices=[], usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}),
    ]
    for cut in (0, 5, 64):
        raw = b"".join(_sse(c) for c in chunks) + b"data: [DONE]\n\n"
        pieces = [_sse(c) for c in chunks] if cut == 0 else [raw[i:i + cut] for i in range(0, len(raw), cut)]
        t = StreamTimer(0.0, streaming=True)
        for i, piece in enumerate(pieces):
            t.feed(piece, 1.0 + i)
        assert t.finish_reasons == ["stop"] and t.model == "served-model" and t.response_id == "cmpl-7"
        assert t.chunks_with_tokens == 3 and t.tokens(prompt_estimate=99) == (4, 3)
    body = {"id": "cmpl-8", "model": "m2", "choices": [{"index": 0, "text": "x", "finish_reason": "length"},
                                                      {"index": 1, "text": "y", "finish_reason": "stop"}]}
    t = StreamTimer(0.0, streaming=False)
    t.feed(json.dumps(body).encode(), 0.5)
    t.finish_body(0.5)
    assert (t.finish_reasons, t.model, t.response_id) == (["length", "stop"], "m2", "cmpl-8")


def test_bulk_histogram_observation_equals_observe() -> None:
    """observe_many / observe_n (bucket-grouped fast path) vs prometheus-client's own observe."""
    import random

    from prometheus_client import Histogram

    from llmsla.exporters.metrics import _observe1, observe_many, observe_n

    bounds = list(names.ITL_BUCKETS)
    rng = random.Random(3)
    values = [rng.choice([rng.uniform(0, 3.0), rng.choice(bounds), 0.0, 1e6]) for _ in range(2000)]
    reg = CollectorRegistry()
    fast = Histogram("fast", "", ["k"], buckets=bounds, registry=reg)
    ref = Histogram("ref", "", ["k"], buckets=bounds, registry=reg)
    observe_many(fast.labels("a"), values)
    observe_n(fast.labels("b"), 0.03, 37)  # exactly on a bound
    observe_n(fast.labels("b"), 0.031, 5)
    for v in [*values, -1.0]:  # one at a time, as queue/E2E/TTFT are observed
        _observe1(fast.labels("c"), v)
        ref.labels("c").observe(v)
    for v in values:
        ref.labels("a").observe(v)
    for _ in range(37):
        ref.labels("b").observe(0.03)
    for _ in range(5):
        ref.labels("b").observe(0.031)

    def samples(name: str) -> dict:
        return {(s.name.replace(name, ""), tuple(sorted(s.labels.items()))): s.value
                for m in reg.collect() if m.name == name for s in m.samples if not s.name.endswith("_created")}

    got, want = samples("fast"), samples("ref")
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-9), k


def test_only_served_models_claim_label_slots_and_unrenderable_values_never_do() -> None:
    from llmsla.exporters.metrics import LabelGuard

    guard = LabelGuard(top_n=2)
    other = names.LABEL_OVERFLOW_VALUE
    for i in range(1000):  # a flood the upstream refused
        assert guard.fold(names.L_MODEL, f"junk-{i}", admit=False) == (other, True)
    assert guard.fold(names.L_MODEL, "real", admit=True) == ("real", False)
    assert guard.fold(names.L_MODEL, "real", admit=False) == ("real", False)  # once admitted, kept
    for bad in ("x\x00y", "\ud800"):
        assert guard.fold(names.L_MODEL, bad, admit=True) == (other, True)
    assert guard.fold(names.L_MODEL, "second", admit=True) == ("second", False)
    assert guard.fold(names.L_MODEL, "third", admit=True) == (other, True)  # top_n reached


def test_goodput_counts_requests_within_every_objective_at_once(tmp_path: Path) -> None:
    """AIPerf's --goodput rule on the SLO catalog's bounds (TTFT 800 ms, E2E 10 s as shipped, plus
    a TPOT objective here): ok and every bound met at once; TTFT is E2E without a first token."""
    d = tmp_path / "slo"
    shutil.copytree(deploy("slo"), d)
    (d / "tpot.yaml").write_text((d / "ttft.yaml").read_text().replace("name: ttft\n", "name: tpot\n")
                                 .replace("llmsla_request_ttft_seconds", names.REQUEST_TPOT_SECONDS)
                                 .replace("value: slo.ttft_ms", "value: slo.itl_ms"))
    cfg = _cfg(tmp_path)
    cfg.slo.dir = str(d)
    reg = CollectorRegistry()
    rec = RequestRecorder(cfg, registry=reg)
    cases = [  # (ttft_ms, e2e_ms, output tokens, status, first token, counts)
        (100.0, 1000.0, 11, "ok", True, True),  # TPOT 90 ms
        (900.0, 1000.0, 2, "ok", True, False),  # TTFT over 800 ms
        (100.0, 11000.0, 2, "ok", True, False),  # E2E over 10 s
        (100.0, 2100.0, 11, "ok", True, False),  # TPOT 200 ms over 100 ms
        (800.0, 10000.0, 1, "ok", True, True),  # on every bound (le), one token: no TPOT
        (700.0, 700.0, 5, "ok", False, True),  # not streamed: TTFT is its E2E
        (900.0, 900.0, 5, "ok", False, False),  # not streamed, E2E over the TTFT bound
        (100.0, 200.0, 3, "error", True, False),  # fast, but failed
    ]
    for ttft, e2e, out, status, first, _ in cases:
        rec.record(_event(ttft_ms=ttft, e2e_ms=e2e, output_tokens=out, status=status), first_token=first)
    got = reg.get_sample_value("llmsla_request_goodput_total", {"model": "m", "pool": "p", "replica": "r0",
                                                                "arm": "default", **TENANCY})
    assert got == sum(c[-1] for c in cases) == 3


def test_goodput_holds_each_request_to_the_objectives_of_its_tenant_and_class(tmp_path: Path) -> None:
    """With the shipped examples (TTFT 0.5 s for interactive, 0.3 s for tenant acme, E2E 60 s for
    batch) beside the fleet's (TTFT 0.8 s, E2E 10 s): each request meets the most specific
    objective of its tenant and class per SLI, and the fleet's where no spec targets it."""
    d = tmp_path / "slo"
    shutil.copytree(deploy("slo"), d, ignore=shutil.ignore_patterns("examples"))
    for f in ("ttft-interactive.yaml", "ttft-acme.yaml", "e2e-batch.yaml"):
        shutil.copy(deploy("slo") / "examples" / f, d / f)
    cfg = _cfg(tmp_path)
    cfg.slo.dir = str(d)
    cfg.tenants.header = "X-Tenant"
    cfg.tenants.declared = {"acme": "interactive", "globex": "batch"}
    reg = CollectorRegistry()
    rec = RequestRecorder(cfg, registry=reg)
    cases = [  # (tenant, class, ttft_ms, e2e_ms, counts)
        ("globex", "interactive", 400.0, 1000.0, True),  # interactive: TTFT <= 0.5 s
        ("globex", "interactive", 700.0, 1000.0, False),  # within the fleet's 0.8 s, not interactive's 0.5 s
        ("globex", "batch", 700.0, 30000.0, True),  # batch: fleet TTFT 0.8 s, E2E 60 s (not the fleet's 10 s)
        ("globex", "batch", 900.0, 30000.0, False),  # over the fleet's TTFT: batch has no TTFT spec of its own
        ("globex", "batch", 700.0, 61000.0, False),  # over batch's E2E
        ("acme", "interactive", 250.0, 1000.0, True),  # acme: TTFT <= 0.3 s
        ("acme", "interactive", 400.0, 1000.0, False),  # within interactive's 0.5 s, not acme's 0.3 s
        ("acme", "batch", 250.0, 30000.0, True),  # acme's TTFT, batch's E2E
        ("acme", "batch", 250.0, 11000.0, True),
        ("other", "sheddable", 700.0, 9000.0, True),  # no spec targets it: the fleet's
        ("other", "sheddable", 700.0, 11000.0, False),
    ]
    for tenant, cls, ttft, e2e, _ in cases:
        rec.record(_event(tenant=tenant, class_=cls, ttft_ms=ttft, e2e_ms=e2e, output_tokens=1))
    for tenant, cls in {(c[0], c[1]) for c in cases}:
        got = reg.get_sample_value("llmsla_request_goodput_total", {
            "model": "m", "pool": "p", "replica": "r0", "arm": "default", names.L_TENANT: tenant, names.L_CLASS: cls})
        assert got == sum(c[-1] for c in cases if (c[0], c[1]) == (tenant, cls)), (tenant, cls)
    # the predicate itself, as other readers call it: without tenant/class, the fleet's bounds
    bounds = GoodputBounds.from_catalog(slo_catalog.load(cfg))
    assert bounds.met(0.7, None, 1.0) and not bounds.met(0.7, None, 1.0, class_="interactive")
    assert bounds.met(0.25, None, 11.0, tenant="acme", class_="batch")
    assert not bounds.met(0.25, None, 11.0, tenant="acme", class_="interactive")
