"""The store sink operator's flush policy, driven with a fake Flink runtime (timers fire in time
order, state is per key); the database is replaced by a recorder. The real operator runs in every
job test; this checks when it flushes, which those cannot see: a whole window's element at once,
other elements (policy rows, dead letters) buffered."""

from __future__ import annotations

import heapq
from typing import Any

import pytest
from pyflink.datastream import TimeDomain

from llmsla import names
from llmsla.streaming import flink_sink
from llmsla.streaming.sql import ROW_SEPARATOR

FLUSH_MS, MAX_WAIT_MS, BATCH_ROWS = 1000, 5000, 10
BUFFERED = names.T_POLICY_WINDOWS  # one row per element: buffered


class _Value:
    def __init__(self) -> None:
        self.v: Any = None

    def value(self) -> Any:
        return self.v

    def update(self, v: Any) -> None:
        self.v = v

    def clear(self) -> None:
        self.v = None


class _List:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, v: str) -> None:
        self.items.append(v)

    def get(self) -> list[str]:
        return list(self.items)

    def clear(self) -> None:
        self.items = []


class _Metrics:
    def add_group(self, *_: Any) -> _Metrics:
        return self

    def counter(self, _: str) -> Any:
        return type("C", (), {"inc": lambda self, n=1: None})()


class _Runtime:
    def get_metrics_group(self) -> _Metrics:
        return _Metrics()

    def get_list_state(self, _: Any) -> _List:
        return _List()

    def get_state(self, _: Any) -> _Value:
        return _Value()


class _Clock:
    """Processing time, the registered timers, and a context for the operator's callbacks."""

    def __init__(self) -> None:
        self.now = 0
        self.timers: list[tuple[int, int, str]] = []  # (time, domain order, domain)

    # timer service
    def current_processing_time(self) -> int:
        return self.now

    def register_processing_time_timer(self, t: int) -> None:
        heapq.heappush(self.timers, (t, 0, "processing"))

    def register_event_time_timer(self, t: int) -> None:
        heapq.heappush(self.timers, (t, 1, "event"))

    # context
    def timer_service(self) -> _Clock:
        return self

    key = BUFFERED

    def get_current_key(self) -> str:
        return self.key

    def time_domain(self) -> TimeDomain:
        return self._domain


class _Recorder:
    """Stands in for StoreWriter: when each flush happened and what it held."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.flushes: list[tuple[int, int]] = []  # (time, payloads)
        self.kinds: list[str] = []

    def write(self, kind: str, payloads: list[str]) -> int:
        self.flushes.append((self.clock.now, len(payloads)))
        self.kinds.append(kind)
        return sum(1 + p.count(ROW_SEPARATOR) for p in payloads)

    def close(self) -> None:
        pass


@pytest.fixture
def sink(monkeypatch, request) -> tuple[flink_sink.StoreSinkFunction, _Clock, _Recorder]:
    clock = _Clock()
    recorder = _Recorder(clock)
    monkeypatch.setattr(flink_sink, "StoreWriter", lambda *a, **k: recorder)
    fn = flink_sink.StoreSinkFunction("postgresql://unused", batch_rows=BATCH_ROWS, flush_s=FLUSH_MS / 1000,
                                      max_wait_s=MAX_WAIT_MS / 1000, retry_s=1, max_future_s=300, max_past_s=86400,
                                      windows_at_once=getattr(request, "param", True))
    fn.open(_Runtime())
    return fn, clock, recorder


def _run(fn: flink_sink.StoreSinkFunction, clock: _Clock, arrivals: list[tuple[int, int]], until: int) -> None:
    """Elements (time, rows) in order, firing the processing-time timers due up to ``until`` in
    between (the end-of-input timer, at the end of time, is :func:`_end_of_input`)."""
    events = list(arrivals)
    while True:
        next_el = events[0][0] if events else None
        due = [t for t in clock.timers if t[2] == "processing"]
        next_timer = min(due)[0] if due else None
        if next_timer is not None and next_timer <= until and (next_el is None or next_timer < next_el):
            clock.timers.remove(min(due))
            heapq.heapify(clock.timers)
            clock.now, clock._domain = next_timer, TimeDomain.PROCESSING_TIME
            fn.on_timer(next_timer, clock)
        elif next_el is not None:
            t, rows = events.pop(0)
            clock.now = t
            fn.process_element((BUFFERED, ROW_SEPARATOR.join(["[1]"] * rows)), clock)
        else:
            clock.now = max(clock.now, until)  # time goes on to the end of the span
            return


def _end_of_input(fn: flink_sink.StoreSinkFunction, clock: _Clock) -> None:
    clock._domain = TimeDomain.EVENT_TIME
    fn.on_timer(flink_sink.END_OF_TIME, clock)


def test_a_live_window_is_flushed_after_flush_s(sink) -> None:
    fn, clock, rec = sink
    _run(fn, clock, [(0, 3), (5000, 3), (10_000, 3)], until=20_000)
    assert rec.flushes == [(1000, 1), (6000, 1), (11_000, 1)]


def test_a_backlog_flushes_in_batches_and_a_trickle_waits_at_most_max_wait(sink) -> None:
    fn, clock, rec = sink
    # back to back (a backlog): one flush per batch_rows, none on the way
    _run(fn, clock, [(i * 100, 2) for i in range(10)], until=950)
    assert rec.flushes == [(400, 5), (900, 5)]
    # a trickle faster than flush_s never goes quiet: flushed max_wait after its first element
    _run(fn, clock, [(20_000 + i * 900, 1) for i in range(8)], until=40_000)
    assert rec.flushes[2:] == [(25_000, 6), (27_300, 2)]  # then the last two, flush_s after the last


def test_superseded_and_stale_timers_do_not_flush_and_end_of_input_does(sink) -> None:
    fn, clock, rec = sink
    _run(fn, clock, [(0, 1), (500, 1)], until=1200)  # the 1000 timer is superseded by 1500
    assert rec.flushes == []
    _run(fn, clock, [(1300, BATCH_ROWS)], until=1400)  # batch full: flushed at once
    assert rec.flushes == [(1300, 3)]
    _run(fn, clock, [(1400, 1)], until=1450)  # a new buffer; the old 1500/2300 timers must not flush it early
    _run(fn, clock, [], until=2399)
    assert rec.flushes == [(1300, 3)]
    _end_of_input(fn, clock)
    assert rec.flushes == [(1300, 3), (2399, 1)]


def test_a_whole_window_is_written_when_it_arrives_and_keeps_no_state(sink) -> None:
    fn, clock, rec = sink
    _run(fn, clock, [(0, 1)], until=100)  # a policy row waits in the buffer
    assert rec.flushes == []
    for t, table in ((200, names.T_REQUEST_WINDOWS), (300, names.T_REQUEST_WINDOWS_1M), (400, names.T_GPU_WINDOWS)):
        clock.now, clock.key = t, table
        timers = len(clock.timers)
        fn.process_element((table, ROW_SEPARATOR.join(["[1]"] * 256)), clock)
        assert rec.flushes[-1] == (t, 1) and rec.kinds[-1] == table  # one element, one write, now
        assert len(clock.timers) == timers  # no timer: nothing of it is left to flush
    clock.key = BUFFERED
    _run(fn, clock, [], until=1000)  # the policy row's own flush_s timer still fires
    assert rec.flushes[3:] == [(1000, 1)] and rec.kinds[3:] == [BUFFERED]


@pytest.mark.parametrize("sink", [False], indirect=True)
def test_without_windows_at_once_a_window_is_buffered_like_any_element(sink) -> None:
    fn, clock, rec = sink  # the fallback path: its 5 s flushes feed the store's roll-up trigger
    clock.key = names.T_REQUEST_WINDOWS
    fn.process_element((names.T_REQUEST_WINDOWS, ROW_SEPARATOR.join(["[1]"] * 3)), clock)
    assert rec.flushes == []
    _run(fn, clock, [], until=FLUSH_MS)
    assert rec.flushes == [(FLUSH_MS, 1)] and rec.kinds == [names.T_REQUEST_WINDOWS]
