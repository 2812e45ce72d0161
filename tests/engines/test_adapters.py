"""Each adapter against its engine's exposition (tests/engines/expositions.py): exact values in
both formats, data-parallel ranks summed, unknown metrics ignored, NaN, escaped label values,
counter resets, garbage, auto-detection."""

from __future__ import annotations

import math

import pytest

from llmsla import names
from llmsla.engines.adapt import UnknownEngine, from_text, snapshot
from llmsla.engines.parse import Histogram, ParseError, detect, parse
from llmsla.engines.record import EngineSnapshot, ReplicaState
from llmsla.events import EngineSample

from . import expositions as ex

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _expected_hist(bounds: list[float], obs: dict[str, list[float]], ranks: tuple[str, ...]) -> Histogram:
    values = [v for r in ranks for v in obs.get(r, [])]
    return Histogram(tuple(float(b) for b in bounds), tuple(ex.cumulative(bounds, values)), math.fsum(values), len(values))


def _hist_equal(got: Histogram | None, want: Histogram) -> None:
    assert got is not None
    assert got.le == want.le
    assert got.counts == want.counts
    assert got.count == want.count
    assert got.sum == pytest.approx(want.sum, rel=1e-12)


def _read(text: str, ctype: str, engine: str = names.ENGINE_AUTO) -> EngineSnapshot:
    return from_text(text, ctype, engine, replica="r0", pool="p", ts=1700000000.0)


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_vllm_two_engine_indices_are_summed(fmt: str) -> None:
    r = ex.vllm()
    body = getattr(r, fmt)
    if fmt == "openmetrics":
        assert "_created" in body and body.endswith("# EOF\n")
    else:
        assert "vllm:num_preemptions_created" in body  # prometheus-client's text _created gauges
    s = _read(body, OM if fmt == "openmetrics" else TEXT)
    assert s.engine == "vllm"
    assert (s.waiting, s.running) == (5.0, 5.0)  # 4 + 1, 3 + 2
    assert s.kv_usage == 0.5  # mean of 0.25 and 0.75
    # num_gpu_blocks is the front end's sum, on each engine's series: read once, not summed again
    assert (s.kv_blocks_total, s.kv_block_size, s.kv_capacity_tokens) == (2000, 16, 32000)
    assert s.preemptions_total == 5.0
    assert (s.prefix_cache_hits_total, s.prefix_cache_queries_total) == (500.0, 2000.0)
    assert s.prefix_cache_hit_rate is None  # V1 has counters only; the rate needs an interval
    assert s.lora_adapters is None  # no LoRA configured: no lora_requests_info
    ranks = ("0", "1")
    _hist_equal(s.histograms["ttft"], _expected_hist(ex.VLLM_TTFT, ex.TTFT_OBS, ranks))
    _hist_equal(s.histograms["itl"], _expected_hist(ex.VLLM_TPOT, ex.ITL_OBS, ranks))
    _hist_equal(s.histograms["e2e"], _expected_hist(ex.VLLM_REQUEST, ex.E2E_OBS, ranks))
    _hist_equal(s.histograms["queue"], _expected_hist(ex.VLLM_REQUEST, ex.QUEUE_OBS, ranks))
    ev = s.to_event().validate()
    assert EngineSample.from_json(ev.to_json()) == ev


def test_vllm_single_engine_and_lora_with_escaped_names() -> None:
    weird = 'sql"adapter\\v2\nline-é-日本'
    r = ex.vllm(engines=("0",), model='m"\\\n', lora=(f"{weird},fr-lora", "de-lora"))
    assert '\\"' in r.text and "\\\\" in r.text and "\\n" in r.text
    for body, ctype in ((r.text, TEXT), (r.openmetrics, OM)):
        s = _read(body, ctype, names.ENGINE_VLLM)
        assert s.lora_adapters == tuple(sorted((weird, "fr-lora", "de-lora")))  # most recent series only
        assert (s.waiting, s.running, s.kv_blocks_total, s.kv_capacity_tokens) == (4.0, 3.0, 1000, 16000)
        _hist_equal(s.histograms["ttft"], _expected_hist(ex.VLLM_TTFT, ex.TTFT_OBS, ("0",)))
        assert EngineSample.from_json(s.to_event().to_json()).lora_adapters == sorted((weird, "fr-lora", "de-lora"))


def test_vllm_kv_capacity_from_its_cache_config() -> None:
    """vLLM writes its front end's one cache config under every engine: ``num_gpu_blocks`` is
    already the sum over the data-parallel engines (read once), ``kv_cache_size_tokens`` one
    engine's capacity (counted per engine; for a hybrid-attention model it is not blocks x block
    size); a release that does not publish it gives blocks x block size."""
    hybrid = _read(ex.vllm(kv_size_tokens=9000).text, TEXT)
    assert (hybrid.kv_blocks_total, hybrid.kv_block_size, hybrid.kv_capacity_tokens) == (2000, 16, 18000)
    older = _read(ex.vllm(kv_size_tokens=None).text, TEXT)
    assert (older.kv_blocks_total, older.kv_capacity_tokens) == (2000, 32000)
    one = _read(ex.vllm(engines=("1",), preemptions={"1": 1}, hits={"1": 1}, queries={"1": 2}, usage={"1": 0.5},
                        kv_size_tokens=None).text, TEXT)  # one engine of an external data-parallel deployment
    assert (one.kv_blocks_total, one.kv_capacity_tokens) == (1000, 16000)


SGLANG_LAYOUTS = {
    "one scheduler per rank": {"tp": 1},
    "tensor parallel": {"tp": 2},
    "tensor and pipeline parallel": {"tp": 2, "pp": 2},
    "metrics from all schedulers": {"tp": 4, "all_schedulers": True},
    "priority scheduling": {"tp": 2, "priority": True},
}


@pytest.mark.parametrize("layout", list(SGLANG_LAYOUTS))
@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_sglang(fmt: str, layout: str) -> None:
    """Two data-parallel ranks of SGLang, each served by several schedulers that all report it:
    one scheduler per data-parallel rank is read, the ranks are summed."""
    kw = SGLANG_LAYOUTS[layout]
    r = ex.sglang(**kw)
    body = getattr(r, fmt)
    schedulers = kw.get("tp", 1) * kw.get("pp", 1)
    assert parse(body, OM if fmt == "openmetrics" else TEXT).total(
        "sglang:max_total_num_tokens") == 200000 * schedulers  # what a plain sum would report
    s = _read(body, OM if fmt == "openmetrics" else TEXT)
    assert s.engine == "sglang"
    assert (s.waiting, s.running) == (2.0, 15.0)  # ranks 0+2, 7+8
    assert s.kv_usage == pytest.approx(0.4)  # mean of 0.2 and 0.6
    assert (s.kv_blocks_total, s.kv_block_size) == (12500, 16)  # pages of 16 tokens, 6250 per rank
    assert s.kv_capacity_tokens == 200000
    assert s.preemptions_total == 3.0  # retractions 1 + 2
    assert (s.prefix_cache_hits_total, s.prefix_cache_queries_total) == (500.0, 1800.0)
    assert s.prefix_cache_hit_rate == 0.5  # the gauge, until an interval gives the counters' rate
    assert s.lora_adapters is None
    ranks = ("0", "1")
    _hist_equal(s.histograms["ttft"], _expected_hist(ex.SGLANG_TTFT, ex.TTFT_OBS, ranks))
    _hist_equal(s.histograms["itl"], _expected_hist(ex.SGLANG_ITL, ex.ITL_OBS, ranks))
    _hist_equal(s.histograms["e2e"], _expected_hist(ex.SGLANG_E2E, ex.E2E_OBS, ranks))
    _hist_equal(s.histograms["queue"], _expected_hist(ex.SGLANG_QUEUE, ex.QUEUE_OBS, ranks))
    s.to_event().validate()


def test_sglang_without_pages_or_data_parallelism() -> None:
    """A release without page_size / num_pages leaves blocks None (the capacity stays in tokens);
    one data-parallel rank on tensor-parallel schedulers is read once."""
    s = _read(ex.sglang(ranks=("0",), tp=8, pages=False).text, TEXT)
    assert (s.kv_blocks_total, s.kv_block_size, s.kv_capacity_tokens) == (None, None, 100000)
    assert (s.waiting, s.running, s.preemptions_total) == (0.0, 7.0, 1.0)
    _hist_equal(s.histograms["queue"], _expected_hist(ex.SGLANG_QUEUE, ex.QUEUE_OBS, ("0",)))


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_trtllm(fmt: str) -> None:
    r = ex.trtllm()
    s = _read(getattr(r, fmt), OM if fmt == "openmetrics" else TEXT)
    assert s.engine == "trtllm"
    assert (s.waiting, s.running, s.kv_usage) == (11.0, 6.0, 0.3125)
    assert (s.kv_blocks_total, s.kv_block_size, s.kv_capacity_tokens) == (6400, 32, 204800)
    assert s.preemptions_total is None and s.lora_adapters is None
    assert (s.prefix_cache_hits_total, s.prefix_cache_queries_total) == (450.0, 1800.0)  # prompt tokens: cached, all
    assert s.prefix_cache_hit_rate == 0.4
    blocks = _read(ex.trtllm(prompt_tokens=None).text, TEXT)  # without the per-request counters: blocks
    assert (blocks.prefix_cache_hits_total, blocks.prefix_cache_queries_total) == (30.0, 120.0)  # reused, reused+missed
    _hist_equal(s.histograms["ttft"], _expected_hist(ex.TRT_TTFT, ex.TTFT_OBS, ("0",)))
    _hist_equal(s.histograms["itl"], _expected_hist(ex.TRT_TPOT, ex.ITL_OBS, ("0",)))
    _hist_equal(s.histograms["e2e"], _expected_hist(ex.TRT_REQUEST, ex.E2E_OBS, ("0",)))
    _hist_equal(s.histograms["queue"], _expected_hist(ex.TRT_REQUEST, ex.QUEUE_OBS, ("0",)))
    s.to_event().validate()


def test_triton() -> None:
    s = _read(ex.TRITON, TEXT)
    assert s.engine == "triton"
    assert (s.waiting, s.running, s.kv_usage) == (3.0, 5.0, 0.4875)  # active 8 = waiting 3 + scheduled 5
    assert (s.kv_blocks_total, s.kv_block_size, s.kv_capacity_tokens) == (6240, 64, 399360)
    assert (s.prefix_cache_hits_total, s.prefix_cache_queries_total) == (200.0, None)  # reused blocks; no denominator
    assert s.preemptions_total is None and s.lora_adapters is None and s.prefix_cache_hit_rate is None
    ttft = s.histograms["ttft"]  # the tensorrt_llm model's, not the ensemble's; ms -> s
    _hist_equal(ttft, Histogram((0.1, 0.5, 2.0, 5.0), (12, 32, 39, 40), 8.0, 40))
    assert s.histograms["itl"] is None and s.histograms["e2e"] is None and s.histograms["queue"] is None
    ev = s.to_event().validate()
    assert ev.itl is None and ev.preemptions_total is None  # null, never 0


def test_auto_detection_and_forced_types() -> None:
    assert detect(parse(ex.vllm().text)) == "vllm"
    assert detect(parse(ex.sglang().text)) == "sglang"
    assert detect(parse(ex.trtllm().text)) == "trtllm"
    assert detect(parse(ex.TRITON)) == "triton"
    other = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
    assert detect(parse(other)) is None
    with pytest.raises(UnknownEngine):
        _read(other, TEXT)
    # a forced type reads what it knows and leaves the rest None
    s = _read(ex.sglang().text, TEXT, names.ENGINE_VLLM)
    assert s.engine == "vllm" and s.waiting is None and s.histograms["ttft"] is None


def test_unknown_metrics_are_ignored() -> None:
    base = _read(ex.vllm().text, TEXT)
    extra = ("# TYPE vllm:some_future_gauge gauge\nvllm:some_future_gauge{engine=\"0\"} 42\n"
             "# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total{generation=\"0\"} 9.0\n")
    again = _read(ex.vllm().text + extra, TEXT)
    assert again == base


def test_nan_and_infinite_values_are_absent_not_zero() -> None:
    body = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} NaN
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
vllm:num_requests_waiting{engine="1",model_name="m"} NaN
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} +Inf
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} NaN
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.05
"""
    s = _read(body, TEXT)
    assert s.running is None  # NaN alone: absent
    assert s.waiting == 2.0  # the NaN rank is left out, the finite one kept
    assert s.kv_usage is None
    assert s.histograms["ttft"] is None  # a NaN bucket spoils the histogram
    ev = s.to_event().validate()
    assert ev.running is None and ev.kv_usage is None


@pytest.mark.parametrize("two_ranks", [False, True])
def test_sums_past_the_float_range_and_opposite_infinities_spoil_a_field_not_the_sample(two_ranks: bool) -> None:
    """Finite gauges whose sum overflows, and a histogram with -Inf and +Inf buckets (an exact sum
    of those raises in Python rather than giving a non-finite value): the field is absent and the
    rest of the replica's sample stays, never an exception that fails the whole scrape."""
    rank1 = """\
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 1
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 1
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 2
""" if two_ranks else ""
    body = f"""\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 1.7e308
vllm:num_requests_waiting{{engine="1",model_name="m"}} 1.7e308
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 1.7e308
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 1.7e308
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="1.0",model_name="m"}} -Inf
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} +Inf
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} 1
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} 1
{rank1}"""
    s = _read(body, TEXT)
    assert s.waiting is None and s.kv_usage is None
    assert s.running == 3.0
    assert s.histograms["e2e"] is None
    s.to_event().validate()


def test_counter_reset_never_gives_negative_increases() -> None:
    state = ReplicaState()
    first, pre0 = state.update(_read(ex.vllm(preemptions={"0": 10, "1": 10}, hits={"0": 100, "1": 100},
                                             queries={"0": 400, "1": 400}).text, TEXT))
    assert pre0 == 0.0 and not first.counter_reset and first.prefix_cache_hit_rate is None
    second, pre1 = state.update(_read(ex.vllm(preemptions={"0": 12, "1": 13}, hits={"0": 160, "1": 140},
                                              queries={"0": 500, "1": 500}).text, TEXT))
    assert pre1 == 5.0 and not second.counter_reset
    assert second.prefix_cache_hit_rate == pytest.approx(100 / 200)  # (300-200) / (1000-800)
    # the replica restarted: every counter is smaller than before
    third, pre2 = state.update(_read(ex.vllm(preemptions={"0": 1, "1": 0}, hits={"0": 3, "1": 1},
                                             queries={"0": 8, "1": 8}).text, TEXT))
    assert third.counter_reset and pre2 == 1.0  # the new value is the increase since the restart
    assert third.prefix_cache_hit_rate == pytest.approx(4 / 16)
    assert state.preemptions == 6.0
    assert third.to_event().validate().counter_reset == 1
    fourth, pre3 = state.update(_read(ex.vllm(preemptions={"0": 1, "1": 0}, hits={"0": 3, "1": 1},
                                              queries={"0": 8, "1": 8}).text, TEXT))
    assert not fourth.counter_reset and pre3 == 0.0 and fourth.prefix_cache_hit_rate is None  # idle interval


def test_histogram_going_down_is_a_reset() -> None:
    state = ReplicaState()
    s = _read(ex.trtllm().text, TEXT)
    state.update(s)
    empty = Histogram(s.histograms["ttft"].le, (0,) * len(s.histograms["ttft"].le), 0.0, 0)  # type: ignore[union-attr]
    out, _ = state.update(EngineSnapshot(**{**s.__dict__, "histograms": {**s.histograms, "ttft": empty}}))
    assert out.counter_reset  # the engine restarted and its TTFT histogram started again


@pytest.mark.parametrize("body, ctype", [
    ("<html><body>502 Bad Gateway</body></html>", "text/html"),
    ("<html><body>502 Bad Gateway</body></html>", TEXT),
    ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_na', TEXT),  # cut mid-line
    (ex.vllm().openmetrics[:-6], OM),  # OpenMetrics without its # EOF: truncated
    ("", TEXT),
    ("\x00\x01\x02garbage", TEXT),
])
def test_garbage_is_a_parse_error(body: str, ctype: str) -> None:
    with pytest.raises(ParseError):
        parse(body, ctype)


def test_snapshot_from_a_parsed_exposition() -> None:
    expo = parse(ex.sglang().openmetrics, OM)
    s = snapshot(expo, names.ENGINE_SGLANG, replica="r3", pool="canary", ts=1.5)
    ev = s.to_event()
    assert (ev.replica, ev.pool, ev.engine, ev.ts_ms) == ("r3", "canary", "sglang", 1500)


def test_only_the_families_an_adapter_reads_are_parsed() -> None:
    from llmsla.engines.adapt import READS
    from llmsla.engines.parse import select

    om = select(ex.vllm().openmetrics, READS)
    assert om.endswith("# EOF\n") and "vllm:iteration_tokens_total" not in om and "vllm:prompt_tokens" not in om
    assert "vllm:time_to_first_token_seconds_bucket" in om and "vllm:cache_config_info" in om
    # a body with no engine family is still parsed in full: garbage stays a parse error ...
    with pytest.raises(ParseError):
        parse("<html>502</html>", TEXT, READS)
    # ... and an exposition of something else is an unknown engine, not a parse error
    with pytest.raises(UnknownEngine):
        _read("# TYPE up gauge\nup 1\n", TEXT)
