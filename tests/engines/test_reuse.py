"""A replica's unchanged families are not read again (engines/parse.py ``Reuse``): an idle
replica's byte-identical histogram is the previous scrape's object, a changed one is read anew,
a counter reset is still seen, and the reader learns no wrong shape from a line it read once.
The contract's histogram check runs where the parser builds a histogram: one it refuses is
absent (None), never a crash of the replica's scrape."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmsla.engines.adapt import READS, snapshot
from llmsla.engines.parse import Histogram, Reuse, parse
from llmsla.engines.record import CHECKED_FIELDS, ReplicaState
from llmsla.events import EngineSample, EventError

from . import expositions as ex

TEXT = "text/plain; version=0.0.4; charset=utf-8"
TTFT = "vllm:time_to_first_token_seconds"


def body(waiting: int, ttft_count: int, *, extra: str = "") -> str:
    """A small vLLM body: a gauge and a TTFT histogram whose +Inf bucket and count are ``ttft_count``."""
    lab = 'engine="0",model_name="m"'
    return (f"# HELP vllm:num_requests_waiting w\n# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{lab}}} {waiting}.0\n"
            f"# HELP {TTFT} t\n# TYPE {TTFT} histogram\n"
            f'{TTFT}_bucket{{{lab},le="0.1"}} 1.0\n{TTFT}_bucket{{{lab},le="1.0"}} 2.0\n'
            f'{TTFT}_bucket{{{lab},le="+Inf"}} {ttft_count}.0\n'
            f"{TTFT}_count{{{lab}}} {ttft_count}.0\n{TTFT}_sum{{{lab}}} 1.5\n{extra}")


def test_unchanged_histogram_is_reused_and_a_changed_one_read_again() -> None:
    reuse = Reuse()
    first = parse(body(3, 5), TEXT, READS, reuse).histogram(TTFT)
    again = parse(body(7, 5), TEXT, READS, reuse)  # the gauge moved, the histogram did not
    assert again.total("vllm:num_requests_waiting") == 7.0
    assert again.histogram(TTFT) is first
    moved = parse(body(7, 6), TEXT, READS, reuse).histogram(TTFT)
    assert moved is not first and moved is not None
    assert (moved.count, moved.counts) == (6, (1, 2)) and (first is not None and first.count == 5)
    # without a Reuse, or with another replica's, nothing is shared
    assert parse(body(7, 6), TEXT, READS).histogram(TTFT) is not moved
    assert parse(body(7, 6), TEXT, READS, Reuse()).histogram(TTFT) == moved


def test_counter_reset_is_still_seen_with_reuse() -> None:
    state = ReplicaState()
    for count, reset in ((9, False), (9, False), (4, True), (4, False)):
        expo = parse(body(1, count), TEXT, READS, state.reuse)
        snap, _ = state.update(snapshot(expo, "vllm", replica="r0", pool="p", ts=1.0))
        assert snap.counter_reset is reset
        hist = snap.histograms["ttft"]
        assert hist is not None and hist.count == count


def test_every_engines_exposition_reads_the_same_with_reuse() -> None:
    for rendered in (ex.vllm(), ex.sglang(), ex.trtllm()):
        for text in (rendered.text, rendered.openmetrics):
            ctype = TEXT if text is rendered.text else "application/openmetrics-text; version=1.0.0"
            reuse = Reuse()
            cold = snapshot(parse(text, ctype, READS), "auto", replica="r", pool="p", ts=1.0)
            for _ in range(3):
                warm = snapshot(parse(text, ctype, READS, reuse), "auto", replica="r", pool="p", ts=1.0)
                assert warm == cold


def test_a_line_read_once_teaches_no_wrong_shape() -> None:
    reuse = Reuse()
    parse(body(1, 5), TEXT, READS, reuse)
    # the same head with a value the strict shape refuses, a timestamp, and a CR: each is read
    # (or refused) as the full reader would, not as "known head, new value"
    lab = 'engine="0",model_name="m"'
    with_ts = parse(body(1, 5).replace(f"vllm:num_requests_waiting{{{lab}}} 1.0",
                                       f"vllm:num_requests_waiting{{{lab}}} 2.0 1700000000000"), TEXT, READS, reuse)
    assert with_ts.total("vllm:num_requests_waiting") == 2.0
    from llmsla.engines.parse import ParseError
    with pytest.raises(ParseError):
        parse(body(1, 5).replace(f"{{{lab}}} 1.0", f"{{{lab}}} one"), TEXT, READS, reuse)
    crlf = parse(body(1, 5).replace("\n", "\r\n"), TEXT, READS, reuse)  # prometheus-client's reading
    assert crlf.total("vllm:num_requests_waiting") == parse(body(1, 5).replace("\n", "\r\n"), TEXT).total(
        "vllm:num_requests_waiting")


@pytest.mark.parametrize("bad", [
    "negative",  # counts below 0 are cumulative but not counts
    "too_many",  # more bounds than the contract carries
])
def test_a_histogram_the_contract_refuses_is_absent_not_a_crash(bad: str) -> None:
    lab = 'model_name="m"'
    if bad == "negative":
        lines = [f'{TTFT}_bucket{{{lab},le="0.1"}} -3.0', f'{TTFT}_bucket{{{lab},le="+Inf"}} -1.0',
                 f"{TTFT}_count{{{lab}}} -1.0", f"{TTFT}_sum{{{lab}}} 0.0"]
    else:
        lines = [f'{TTFT}_bucket{{{lab},le="{i / 100}"}} {i}.0' for i in range(1, 70)]
        lines += [f'{TTFT}_bucket{{{lab},le="+Inf"}} 70.0', f"{TTFT}_count{{{lab}}} 70.0", f"{TTFT}_sum{{{lab}}} 1.0"]
    text = f"vllm:num_requests_running{{{lab}}} 2.0\n" + "\n".join(lines) + "\n"
    for reuse in (None, Reuse()):
        expo = parse(text, TEXT, READS, reuse)
        assert expo.histogram(TTFT) is None
        snap = snapshot(expo, "vllm", replica="r0", pool="p", ts=1.0)
        event = snap.to_event().validate()  # the whole contract: nothing else is refused
        assert event.ttft is None and event.running == 2.0


def test_the_checked_fields_are_checked_by_the_contract_once() -> None:
    good = Histogram((0.1, 1.0), (1, 2), 1.5, 3)
    assert good.wire("itl") is good.wire("itl") == {"le": [0.1, 1.0], "counts": [1, 2], "sum": 1.5, "count": 3}
    with pytest.raises(EventError, match="itl"):
        Histogram((1.0, 0.1), (1, 2), 1.5, 3).wire("itl")  # bounds not increasing: the contract's rule
    with pytest.raises(EventError, match="queue.count"):
        Histogram((0.1,), (5,), 1.0, 2).wire("queue")
    assert {f.name for f in EngineSample.FIELDS if f.type == "hist"} == CHECKED_FIELDS
    # validate(checked=...) skips only those; every other field is still checked
    snap = snapshot(parse(body(1, 5), TEXT, READS), "vllm", replica="", pool="p", ts=1.0)
    with pytest.raises(EventError, match="replica"):
        snap.to_event().validate(checked=CHECKED_FIELDS)
    with pytest.raises(EventError, match="replica"):  # the names given as a set: the same checks
        snap.to_event().validate(checked=set(CHECKED_FIELDS))


def test_bucket_layouts_read_alike_in_order_or_not() -> None:
    """One label set in order takes the layout shortcut; shuffled, it takes the general path:
    the same histogram. A NaN count or a decrease is None either way."""
    in_order = body(1, 5)
    lines = in_order.split("\n")
    buckets = [i for i, line in enumerate(lines) if "_bucket" in line]
    shuffled = list(lines)
    for i, j in zip(buckets, reversed(buckets), strict=True):
        shuffled[i] = lines[j]
    a = parse(in_order, TEXT, READS).histogram(TTFT)
    b = parse("\n".join(shuffled), TEXT, READS).histogram(TTFT)
    assert a == b == Histogram((0.1, 1.0), (1, 2), 1.5, 5)
    for text in (in_order, "\n".join(shuffled)):
        assert parse(text.replace("} 2.0", "} NaN"), TEXT, READS).histogram(TTFT) is None
        assert parse(text.replace("} 2.0", "} 0.5"), TEXT, READS).histogram(TTFT) is None


def test_a_histograms_json_is_json_dumps_byte_for_byte() -> None:
    """The spool line's histogram text is put together by hand: it must be what ``json.dumps``
    writes for every value the contract lets through (float spellings, the largest counts)."""
    import json
    import random

    rng = random.Random(7)
    layouts = [(), (0.1,), (0.0, 1.0), (-0.0, 1.0), (-2.5, -0.0, 1e-07, 0.3, 1.0, 2560.0, 1e22, 1.7976931348623157e308),
               tuple(sorted({rng.uniform(0, 1) * 10 ** rng.randint(-9, 9) for _ in range(40)}))]
    sums = [0.0, -0.0, 5e-324, 0.1 + 0.2, 1e300, -1234.5, 123456789012345.67]
    for le in layouts:
        for hsum in sums:
            top = rng.choice([0, 1, 10**6, 2**63 - 1])
            counts = tuple(sorted(rng.randint(0, top) for _ in le))
            hist = Histogram(le, counts, hsum, max(counts, default=0) + rng.choice([0, 3]))
            assert hist.wire_json("e2e") == json.dumps(hist.wire("e2e"), separators=(",", ":"), allow_nan=False)
            assert json.loads(hist.wire_json("e2e")) == hist.wire("e2e")


def test_sample_line_is_to_json_byte_for_byte() -> None:
    from llmsla.engines.record import sample_line

    for rendered in (ex.vllm(), ex.sglang(), ex.trtllm()):
        reuse = Reuse()
        for _ in range(2):  # the second time, each histogram's JSON is the kept one
            snap = snapshot(parse(rendered.text, TEXT, READS, reuse), "auto", replica="r\"0é", pool="p", ts=1.5)
            event = snap.to_event().validate(checked=CHECKED_FIELDS)
            assert sample_line(event, snap) == event.to_json()
            assert EngineSample.from_json(sample_line(event, snap)) == event.validate()
    triton = snapshot(parse(ex.TRITON, TEXT, READS), "triton", replica="r0", pool="p", ts=1.0)
    assert sample_line(triton.to_event(), triton) == triton.to_event().to_json()


def test_recorder_sets_an_idle_replicas_gauges_again_after_a_failure() -> None:
    from prometheus_client import CollectorRegistry

    from llmsla import names
    from llmsla.engines.recorder import EngineRecorder
    from llmsla.engines.scrape import ScrapeError, Target

    reg = CollectorRegistry()
    rec = EngineRecorder(registry=reg)
    target = Target("r0", "p", "http://127.0.0.1:1/metrics", "vllm")
    labels = {"replica": "r0", "pool": "p", "engine": "vllm"}
    snap = snapshot(parse(body(4, 5), TEXT, READS), "vllm", replica="r0", pool="p", ts=1.0)

    def waiting() -> float | None:
        return reg.get_sample_value(names.ENGINE_REQUESTS_WAITING, labels)

    rec.sample(target, snap, 0.0, 0.01)
    rec.sample(target, snap, 0.0, 0.01)  # unchanged: not set again, still there
    assert waiting() == 4.0
    rec.failure(target, ScrapeError(names.ENGINE_FAIL_TIMEOUT, "slow"), 0.8)
    assert waiting() is None and reg.get_sample_value(names.ENGINE_UP, labels) == 0.0
    rec.sample(target, snap, 0.0, 0.01)  # the same values as before the failure: set again
    assert waiting() == 4.0 and reg.get_sample_value(names.ENGINE_UP, labels) == 1.0
    rec.sample(target, snapshot(parse(body(6, 5), TEXT, READS), "vllm", replica="r0", pool="p", ts=2.0), 0.0, 0.01)
    assert waiting() == 6.0
    rec.forget(target)
    assert waiting() is None
    rec.sample(target, snap, 0.0, 0.01)
    assert waiting() == 4.0


@pytest.mark.parametrize("value, culprit", [
    ({"le": [0.1, 0.1], "counts": [1, 2], "sum": 1.0, "count": 2}, "ttft.le[1]"),  # not strictly
    ({"le": [0.1, float("nan")], "counts": [1, 2], "sum": 1.0, "count": 2}, "ttft.le[1]"),
    ({"le": [0.1, float("inf")], "counts": [1, 2], "sum": 1.0, "count": 2}, "ttft.le[1]"),
    ({"le": [1e308, 1.7e308], "counts": [1, 2], "sum": 1.0, "count": 2}, None),  # finite, sum past range
    ({"le": [0.1, 0.5], "counts": [1, True], "sum": 1.0, "count": 2}, "ttft.counts[1]"),
    ({"le": [0.1, 0.5], "counts": [1, 2**63], "sum": 1.0, "count": 2**63}, "ttft.counts[1]"),
    ({"le": [0.1, 0.5], "counts": [1.0, 2.0], "sum": 1.0, "count": 2}, None),  # whole floats read as ints
    ({"le": [0.1, 0.5], "counts": [2, 1], "sum": 1.0, "count": 2}, "ttft.counts[1]"),
])
def test_the_histogram_rule_refuses_and_names_each_culprit(value: dict[str, object], culprit: str | None) -> None:
    if culprit is None:
        out = EngineSample.check_field("ttft", value)
        assert out["counts"] == [1, 2] and all(type(c) is int for c in out["counts"])
        return
    with pytest.raises(EventError) as err:
        EngineSample.check_field("ttft", value)
    assert err.value.field == culprit


def test_a_layout_is_known_by_its_label_sets_not_by_ids_freed_and_reused() -> None:
    """The bucket layout cache is keyed by the label sets' ids; label sets made and dropped one
    after another (their ids free for the next ones) still each get their own layout."""
    from llmsla.engines.parse import _Labels, _plan

    def label_sets(bounds: list[str]) -> tuple[_Labels, ...]:
        out = []
        for le in bounds:
            lab = _Labels(model_name="m", le=le)
            lab.group = (("model_name", "m"),)
            out.append(lab)
        return tuple(out)

    for i in range(300):
        if i % 2:
            assert _plan(label_sets(["0.1", "1.0", "+Inf"])) == ((0.1, 1.0), (("model_name", "m"),))
        else:  # bounds out of order: no simple layout
            assert _plan(label_sets(["1.0", "0.1", "+Inf"])) is None


def test_a_snapshot_with_changes_is_what_replace_gives() -> None:
    expo = parse(body(3, 5), TEXT, READS)
    snap = snapshot(expo, "vllm", replica="r0", pool="p", ts=1.0)
    for changes in ({"ts": 2.5}, {"prefix_cache_hit_rate": 0.25, "counter_reset": True}, {}):
        got = snap.with_(**changes)
        assert got == dataclasses.replace(snap, **changes) and got is not snap
        assert got.histograms is snap.histograms  # shared, as replace shares it
    assert snap.ts == 1.0 and not snap.counter_reset  # the original is untouched
    with pytest.raises(TypeError, match="no field 'tss'"):
        snap.with_(tss=3.0)


def test_a_repeated_record_writes_its_line_at_the_new_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle replica's record repeats but for its time: its spool line is the last one at the
    new time, byte for byte what the full path writes; after a failure, or with a moved value,
    it goes the full way again (gauges set, line built)."""
    from prometheus_client import CollectorRegistry

    from llmsla import names, spool
    from llmsla.engines import recorder as recorder_mod
    from llmsla.engines.recorder import EngineRecorder
    from llmsla.engines.scrape import ScrapeError, Target

    built: list[int] = []
    real = recorder_mod.sample_line
    monkeypatch.setattr(recorder_mod, "sample_line", lambda *a: built.append(1) or real(*a))
    reg = CollectorRegistry()
    writer = spool.SpoolWriter(tmp_path, names.SPOOL_ENGINE, registry=reg)
    rec = EngineRecorder(registry=reg, spool=writer)
    target = Target("r\"0é", "p", "http://127.0.0.1:1/metrics", "vllm")
    labels = {"replica": "r\"0é", "pool": "p", "engine": "vllm"}
    idle = snapshot(parse(body(4, 5), TEXT, READS), "vllm", replica="r\"0é", pool="p", ts=1.0)
    moved = snapshot(parse(body(6, 7), TEXT, READS), "vllm", replica="r\"0é", pool="p", ts=1.0)
    sent = []
    for snap in (idle, idle.with_(ts=2.0), idle.with_(ts=1e9 + 0.123), None, idle.with_(ts=3.5), moved.with_(ts=4.0),
                 moved.with_(ts=5.0)):
        if snap is None:
            rec.failure(target, ScrapeError(names.ENGINE_FAIL_TIMEOUT, "slow"), 0.8)
            assert reg.get_sample_value(names.ENGINE_REQUESTS_WAITING, labels) is None
            continue
        rec.sample(target, snap, 0.0, 0.01)
        sent.append(snap.to_event().validate())
        assert reg.get_sample_value(names.ENGINE_REQUESTS_WAITING, labels) == snap.waiting
        assert reg.get_sample_value(names.ENGINE_UP, labels) == 1.0
    writer.close()
    lines = [line for seg in spool.published_segments(tmp_path, names.SPOOL_ENGINE)
             for line in seg.read_text().splitlines()]
    assert lines == [ev.to_json() for ev in sent]
    assert [EngineSample.from_json(line) for line in lines] == sent
    assert len(built) == 3  # idle, idle again after the failure, moved; the four repeats reuse their line
