"""Kill the continuous job (SIGKILL, whole process group) mid-stream, publish the rest of the
stream while it is down, restart it, and the final tables still equal the reference: nothing lost,
nothing doubled. (Until the llmsla-spool source, segments found in one scan were read in no set
order, so this test had to publish the rest one by one after the restart.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from llmsla import names
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
    finally:
        kill_group(proc)
    assert 0 < before < len(want)

    for i in range(10, len(segs)):  # all of the rest arrives while the job is down
        publish(req, names_[i], segs[i])
    proc = start_stream(cfg, "--kinds", "requests", log=log, **knobs)
    try:
        _wait(lambda: _count(dsn, "SELECT count(*) FROM request_windows") >= len(want)
              and _count(dsn, "SELECT count(*) FROM dead_letters") >= len(want_dead), 60,
              f"{len(want)} windows and {len(want_dead)} dead letters", log,
              lambda: (_count(dsn, "SELECT count(*) FROM request_windows"), _count(dsn, "SELECT count(*) FROM dead_letters")))
        time.sleep(1.0)  # a double write, if any, would land now
    finally:
        kill_group(proc)

    assert "resuming from checkpoint" in log.read_text()
    with psycopg.connect(dsn) as conn:
        ref.assert_frames_equal(ref.fetch(conn, names.T_REQUEST_WINDOWS), want, names.T_REQUEST_WINDOWS)
        assert ref.dead_letters(conn) == want_dead
