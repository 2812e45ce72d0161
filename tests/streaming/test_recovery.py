"""Kill the continuous job (SIGKILL, whole process group) mid-stream, publish the rest of the
stream while it is down, restart it, and the final tables still equal the reference: nothing lost,
nothing doubled. (Until the llmsla-spool source, segments found in one scan were read in no set
order, so this test had to publish the rest one by one after the restart.)

On TimescaleDB the columnstore works on the same chunk throughout: the kill lands while a
conversion of the chunk the job writes into is in flight, and conversions keep running while the
restarted job replays into the converted chunk. Plain PostgreSQL has no columnstore (asserted)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psycopg

from llmsla import names
from llmsla.store.migrate import recorded_flavor
from llmsla.streaming import synth

from . import reference as ref
from .conftest import kill_group, publish, start_stream

DELAY_MS = 8000
SEG_MS = 2000
SEGMENTS = 20


def _segments(start: int) -> list[list[str]]:
    cols = synth.request_columns(SEGMENTS * 100, start_ms=start, span_ms=SEGMENTS * SEG_MS, seed=11, jitter_ms=500)
    lines = list(synth.request_lines(cols))
    segs = [lines[i * 100:(i + 1) * 100] for i in range(SEGMENTS)]
    segs[5].insert(50, '{"v":1,"ts_ms":"soon"}')
    d = json.loads(segs[8][60])
    d.update(ts_ms=d["ts_ms"] - 30_000, trace_id="e" * 32)
    segs[8].insert(61, ref.dumps(d))
    last = json.loads(segs[-1][-1])
    last.update(ts_ms=last["ts_ms"] + 40_000, trace_id="c" * 32)  # closes every earlier window
    segs.append([ref.dumps(last)])
    return segs


def _wait(pred, timeout: float, what: str, log: Path, state=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (have {state()}); job log tail:\n{log.read_text()[-3000:]}")


def _count(dsn: str, sql_text: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql_text).fetchone()[0]


class Converter(threading.Thread):
    """What the columnstore policy job does to a chunk past its age, done again and again to
    every chunk of the 5 s request windows (the one being written included: TimescaleDB 2.25
    converts a partly converted chunk again). :meth:`hold` parks the next conversion inside its
    transaction, its locks taken, until :meth:`release`: a conversion in flight on demand."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.runs, self.errors = dsn, 0, []
        self._done, self._hold, self._holding, self._release = (threading.Event() for _ in range(4))

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._done.is_set():
                try:
                    with conn.transaction():
                        conn.execute("SELECT count(compress_chunk(c, if_not_compressed => true)) FROM show_chunks(%s) c",
                                     (names.T_REQUEST_WINDOWS,))
                        if self._hold.is_set():
                            self._hold.clear()
                            self._holding.set()
                            self._release.wait(60)
                    self.runs += 1
                except psycopg.Error as e:  # a conversion that fails loses nothing, but say so
                    self.errors.append(f"{type(e).__name__}: {e}")
                self._done.wait(0.2)

    def hold(self, timeout: float = 60) -> None:
        self._hold.set()
        assert self._holding.wait(timeout), f"no conversion started in {timeout} s; errors: {self.errors}"

    def release(self) -> None:
        self._release.set()

    def stop(self) -> None:
        self._release.set()
        self._done.set()
        if self.is_alive():
            self.join(60)


def test_kill_and_resume_from_checkpoint(cfg, spool_dirs, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    segs = _segments(now - 300_000)
    names_ = [f"{i:013d}-seg.jsonl" for i in range(len(segs))]
    judged = ref.judge(names.SPOOL_REQUESTS, [ln for s in segs for ln in s], delay_ms=DELAY_MS, now_ms=now,
                       max_future_ms=300_000, max_past_ms=7 * 86_400_000)
    closing = judged.usable[-1]
    assert closing.trace_id == "c" * 32
    want = ref.request_windows(judged.usable[:-1], ttft_slo=cfg.slo.ttft_ms, e2e_slo=cfg.slo.e2e_ms)
    file_of = {ln: names_[i] for i, s in enumerate(segs) for ln in s}
    want_dead = sorted((names.SPOOL_REQUESTS, file_of[raw], cat, raw) for raw, cat in judged.dead)
    assert sorted(c for _, _, c, _ in want_dead) == ["late", "schema"]

    knobs = dict(watermark_delay_s=DELAY_MS / 1000, checkpoint_interval_s=1.0, monitor_interval_s=0.2,
                 sink_flush_s=0.2, idle_timeout_s=60)
    log = tmp_path / "stream.log"
    req = spool_dirs[names.SPOOL_REQUESTS]
    ckpt = cfg.checkpoint_dir()
    dsn = cfg.store.dsn

    proc = start_stream(cfg, "--kinds", "requests", log=log, **knobs)
    try:
        _wait(lambda: any(ckpt.glob("*/chk-*/_metadata")), 120, "the job to run", log)
        for i in range(10):
            publish(req, names_[i], segs[i])
            time.sleep(0.4)
        _wait(lambda: _count(dsn, "SELECT count(*) FROM request_windows") > 0, 120, "first windows", log)
        first = {p for p in ckpt.glob("*/chk-*/_metadata")}
        _wait(lambda: len(set(ckpt.glob("*/chk-*/_metadata")) - first) >= 1, 60, "a checkpoint", log)
        before = _count(dsn, "SELECT count(*) FROM request_windows")
        with psycopg.connect(dsn) as conn:
            timescale = recorded_flavor(conn) == "timescale"
            if not timescale:  # no columnstore to run beside the job
                assert conn.execute("SELECT to_regproc('compress_chunk')").fetchone()[0] is None
        converter = Converter(dsn)
        if timescale:
            converter.start()
            converter.hold()  # the kill below lands while this conversion holds its chunk
    finally:
        kill_group(proc)
    converter.release()
    assert 0 < before < len(want)

    for i in range(10, len(segs)):  # all of the rest arrives while the job is down
        publish(req, names_[i], segs[i])
    proc = start_stream(cfg, "--kinds", "requests", log=log, **knobs)
    try:
        _wait(lambda: _count(dsn, "SELECT count(*) FROM request_windows") >= len(want)
              and _count(dsn, "SELECT count(*) FROM dead_letters") >= len(want_dead), 240,
              f"{len(want)} windows and {len(want_dead)} dead letters", log,
              lambda: (_count(dsn, "SELECT count(*) FROM request_windows"), _count(dsn, "SELECT count(*) FROM dead_letters")))
        time.sleep(1.0)  # a double write, if any, would land now
    finally:
        kill_group(proc)
        converter.stop()

    assert "resuming from checkpoint" in log.read_text()
    if timescale:
        assert converter.runs >= 3 and not converter.errors, (converter.runs, converter.errors)
    with psycopg.connect(dsn) as conn:
        if timescale:  # the answers below are read from converted chunks
            assert conn.execute("SELECT bool_and(is_compressed) FROM timescaledb_information.chunks "
                                "WHERE hypertable_name = %s", (names.T_REQUEST_WINDOWS,)).fetchone()[0]
        ref.assert_frames_equal(ref.fetch(conn, names.T_REQUEST_WINDOWS), want, names.T_REQUEST_WINDOWS)
        assert ref.dead_letters(conn) == want_dead
