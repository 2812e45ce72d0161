"""The Flink operator that writes job output into the store from inside the job.

A batched window element is written when it arrives and keeps no state: PyFlink finishes the
bundle before a checkpoint barrier passes, so every window that reached the sink is committed
when the checkpoint is taken (buffering them in state measurably slowed the store path). Every
other element is buffered in keyed ``ListState``, never a Python list: the window operator emits
a row once, so a row buffered at a checkpoint must be part of it. See docs/streaming.md#sink.
"""

from __future__ import annotations

from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext, TimeDomain
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from llmsla.streaming.sql import ROW_SEPARATOR, WINDOW_BATCH_TABLES
from llmsla.streaming.store_sink import REASONS, StoreWriter

END_OF_TIME = 2**62


class StoreSinkFunction(KeyedProcessFunction):
    def __init__(self, dsn: str, *, batch_rows: int, flush_s: float, max_wait_s: float, retry_s: float,
                 max_future_s: float, max_past_s: float, job_minutes: bool = False,
                 windows_at_once: bool = False) -> None:
        self.dsn = dsn
        self.job_minutes = job_minutes
        self.windows_at_once = windows_at_once
        self.batch_rows = batch_rows
        self.flush_ms = max(1, int(flush_s * 1000))
        self.max_wait_ms = max(1, int(max_wait_s * 1000))
        self.retry_s = retry_s
        self.max_future_s = max_future_s
        self.max_past_s = max_past_s
        self.writer: StoreWriter | None = None

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group().add_group("llmsla")
        counters = {r: group.add_group("reason", r).counter("dead_letters") for r in REASONS}
        self.rows_counter = group.counter("rows_written")

        def count(reason: str) -> None:
            c = counters.get(reason)
            if c is not None:
                c.inc()

        self.writer = StoreWriter(self.dsn, retry_s=self.retry_s, max_future_s=self.max_future_s,
                                  max_past_s=self.max_past_s, on_dead_letter=count,
                                  job_minutes=self.job_minutes)
        self.buffer = runtime_context.get_list_state(ListStateDescriptor("buffer", Types.STRING()))
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.first_ms = runtime_context.get_state(ValueStateDescriptor("first_ms", Types.LONG()))
        self.deadline = runtime_context.get_state(ValueStateDescriptor("deadline", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> tuple:
        if self.windows_at_once and value[0] in WINDOW_BATCH_TABLES:  # a whole window (docstring)
            assert self.writer is not None
            self.rows_counter.inc(self.writer.write(value[0], [value[1]]))
            return ()
        self.buffer.add(value[1])
        before = self.count.value() or 0
        n = before + 1 + value[1].count(ROW_SEPARATOR)  # rows: a window kind's payload is a batch
        now = ctx.timer_service().current_processing_time()
        if before == 0:
            self.first_ms.update(now)
            ctx.timer_service().register_event_time_timer(END_OF_TIME)
        if n >= self.batch_rows:
            self._flush(ctx.get_current_key())
            return ()
        self.count.update(n)
        # quiet for flush_ms, or max_wait_ms after the first row; an earlier timer is superseded
        deadline = min(now + self.flush_ms, (self.first_ms.value() or now) + self.max_wait_ms)
        self.deadline.update(deadline)
        ctx.timer_service().register_processing_time_timer(deadline)
        return ()  # this operator emits nothing; PyFlink iterates the result

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> tuple:
        if ctx.time_domain() == TimeDomain.PROCESSING_TIME:
            deadline = self.deadline.value()
            if deadline is None or timestamp < deadline:  # flushed since, or superseded
                return ()
        self._flush(ctx.get_current_key())
        return ()

    def _flush(self, kind: str) -> None:
        rows = list(self.buffer.get() or [])
        if rows:
            assert self.writer is not None
            self.rows_counter.inc(self.writer.write(kind, rows))
        self.buffer.clear()
        self.count.clear()
        self.first_ms.clear()
        self.deadline.clear()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
