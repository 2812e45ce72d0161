"""Backlogs: many time-ordered segments from several writers, published while the job was down,
found in any order, must land in their windows (the llmsla-spool source's per-writer watermark),
in both modes: ``--once`` and the continuous job restored from a checkpoint mid-backlog with more
segments published while it was down. One writer's clock runs 4 minutes ahead: it only delays its
own windows. Lines carrying unstorable or contract-breaking strings become dead letters with the
contract's reason and the job keeps running. Everything is compared with the pandas reference."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import psycopg

from llmsla import names
from llmsla.store import open_store
from llmsla.streaming import synth
from llmsla.streaming.store_sink import shown_line

from . import reference as ref
from .conftest import kill_group, publish, start_stream

DELAY_MS = 2000
SKEW_MS = 240_000  # one writer's clock: 4 minutes ahead, inside stream.max_future_s (300 s)


def _poison(line: str, k: int) -> list[bytes]:
    """Lines the old job windowed, stored badly or crashed on (and two it must accept)."""
    d = json.loads(line)
    tid = f"{k:02x}" * 16

    def js(**changes: object) -> bytes:
        return json.dumps({**d, "trace_id": tid, **changes}).encode()

    emoji = "\U0001f600"
    return [
        js(model="x\u0000y"),  # NUL: PostgreSQL text cannot hold it (the poison pill)
        js(model="\ud800"),  # lone surrogate (escaped in the JSON)
        b"\xef\xbb\xbf" + js(model="bom"),  # byte-order mark
        js(model="dup")[:-1] + b', "model": "again"}',  # duplicate name
        js(model="ok").replace(b'"ok"', b'"\xc1\x81"'),  # overlong UTF-8 for "A": not UTF-8
        js(model="ok").replace(b'"ok"', b'"\xed\xa0\x80"'),  # an encoded surrogate: not UTF-8
        js(model=emoji * 257),  # 257 code points (514 UTF-16 units)
        js(model=emoji * 200),  # 200 code points (400 UTF-16 units): valid, windowed
        json.dumps({**d, "trace_id": tid, "queue_ms": 10**400}).encode(),  # crashed the contract
        js(v=True),  # not version 1
    ]


def _writers(rng: np.random.Generator, *, count: int, segments: int, per_segment: int, start_ms: int,
             span_ms: int, skewed: int | None = None, poison_at: set[int] = frozenset(), seed: int = 0
             ) -> dict[str, list[tuple[str, list[str | bytes]]]]:
    """Per writer (``<host>-<pid>-<tag>``), its segments in the order it wrote them, named like a
    SpoolWriter's but with a random time prefix, so name order is not time order. Each writer covers
    the whole span: segments of different writers overlap by far more than the delay."""
    out = {}
    for w in range(count):
        cols = synth.request_columns(segments * per_segment, start_ms=start_ms + (SKEW_MS if w == skewed else 0),
                                     span_ms=span_ms, seed=seed * 100 + w, jitter_ms=500)
        lines: list[str | bytes] = list(synth.request_lines(cols))
        writer = f"gw-{w}-east-{4000 + w}-{w:08x}"
        segs = []
        for s in range(segments):
            seg = lines[s * per_segment:(s + 1) * per_segment]
            if s in poison_at and w == 0:
                seg = [*seg[:50], *_poison(str(seg[50]), 16 * seed + s), *seg[50:]]
            segs.append((f"{int(rng.integers(10**12, 10**13)):013d}-{writer}-{s:06d}.jsonl", seg))
        out[writer] = segs
    return out


def _late(writers: dict, start_ms: int, count: int) -> None:
    """Append to the last segment of the first writers one event older than every writer's first
    event by more than delay + window: late by the watermark's definition, whatever the read order."""
    for i, segs in enumerate(list(writers.values())[:count]):
        last = segs[-1][1]
        d = json.loads(last[-1])
        d.update(ts_ms=start_ms - 30_000 - i * 1000, trace_id=f"{0xdead0 + i:032x}")
        last.append(ref.dumps(d))


def _judge(cfg, writers: dict, now: int) -> ref.Judged:
    return ref.judge_writers(
        names.SPOOL_REQUESTS, {w: [ln for _, seg in segs for ln in seg] for w, segs in writers.items()},
        delay_ms=DELAY_MS, now_ms=now, max_future_ms=int(cfg.stream.max_future_s * 1000),
        max_past_ms=int(cfg.stream.max_past_s * 1000))


def _want_dead(writers: dict, judged: ref.Judged) -> list[tuple[str, str, str, str]]:
    file_of = {raw: name for segs in writers.values() for name, seg in segs for raw in seg}
    return sorted((names.SPOOL_REQUESTS, file_of[raw], cat, shown_line(raw if isinstance(raw, bytes) else raw.encode()))
                  for raw, cat in judged.dead)


def _publish_shuffled(rng: np.random.Generator, dir_: Path, segments: list[tuple[str, list]]) -> None:
    for i in rng.permutation(len(segments)):
        publish(dir_, *segments[i])


def _check(dsn: str, want: object, want_dead: list) -> None:
    with psycopg.connect(dsn) as conn:
        ref.assert_frames_equal(ref.fetch(conn, names.T_REQUEST_WINDOWS), want, names.T_REQUEST_WINDOWS)
        got_dead = ref.dead_letters(conn)
        reasons = dict(conn.execute("SELECT raw, reason FROM dead_letters").fetchall())
    assert got_dead == want_dead
    assert not [r for r in reasons.values() if "although the contract accepts it" in r]
    nul = next(r for raw, r in reasons.items() if '"x\\u0000y"' in raw)
    assert "RequestEvent.model: contains NUL" in nul, nul


def test_once_backlog_of_many_writers_lands_in_its_windows(cfg, spool_dirs, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    now = int(time.time() * 1000)
    start = now - 900_000
    writers = _writers(rng, count=5, segments=6, per_segment=250, start_ms=start, span_ms=120_000,
                       skewed=4, poison_at={2})
    _late(writers, start, 2)
    for i, segs in enumerate(writers.values()):  # each writer's very first line is stamped next year
        first = json.loads(segs[0][1][0])
        segs[0][1].insert(0, ref.dumps({**first, "ts_ms": now + 365 * 86_400_000, "trace_id": f"{0xf0 + i:032x}"}))
    judged = _judge(cfg, writers, now)
    assert sum(1 for _, c in judged.dead if c == "late") == 2
    assert sum(1 for _, c in judged.dead if c == "future") == 5
    assert len(judged.usable) == 5 * 6 * 250 + 1  # all but the late ones, plus the 200-emoji model
    want = ref.request_windows(judged.usable, ttft_slo=cfg.slo.ttft_ms, e2e_slo=cfg.slo.e2e_ms)
    want_dead = _want_dead(writers, judged)
    _publish_shuffled(rng, spool_dirs[names.SPOOL_REQUESTS], [s for segs in writers.values() for s in segs])

    for parallelism in (1, 2):  # 2: writers split over two readers; an idle one follows the other
        log = tmp_path / f"stream-{parallelism}.log"
        proc = start_stream(cfg, "--once", "--fresh", "--kinds", "requests", log=log,
                            watermark_delay_s=DELAY_MS / 1000, parallelism=parallelism, restart_attempts=0)
        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
        _check(cfg.store.dsn, want, want_dead)


def _wait(pred, timeout: float, what: str, log: Path, state=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (have {state()}); job log tail:\n{log.read_text()[-3000:]}")


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchone()[0]


def test_continuous_restart_mid_backlog_with_segments_published_while_down(cfg, spool_dirs, tmp_path: Path) -> None:
    """Phase 1 (a backlog, shuffled) is being read when the job is SIGKILLed after a checkpoint;
    phase 2 (every writer's next segments, shuffled) is published while it is down; the restored job
    must window everything. Each writer's last segment carries an event 30 s past the end of all
    others (the skewed writer's included), so every other window closes."""
    rng = np.random.default_rng(2)
    now = int(time.time() * 1000)
    start = now - 400_000
    writers = _writers(rng, count=5, segments=10, per_segment=4000, start_ms=start, span_ms=200_000,
                       skewed=4, poison_at={1, 7}, seed=2)
    _late(writers, start, 1)
    end = max(json.loads(ln)["ts_ms"] for segs in writers.values() for _, seg in segs for ln in seg
              if isinstance(ln, str))
    closer_ids = {f"{0xc105e00 + i:032x}" for i in range(len(writers))}
    for tid, segs in zip(sorted(closer_ids), writers.values(), strict=True):
        d = json.loads(segs[0][1][0])
        d.update(ts_ms=end + 30_000, trace_id=tid)
        segs.append((segs[-1][0].replace("-000009.jsonl", "-000010.jsonl"), [ref.dumps(d)]))
    judged = _judge(cfg, writers, now)
    closers = [ev for ev in judged.usable if ev.trace_id in closer_ids]
    assert len(closers) == 5
    want = ref.request_windows([ev for ev in judged.usable if ev.trace_id not in closer_ids],
                               ttft_slo=cfg.slo.ttft_ms, e2e_slo=cfg.slo.e2e_ms)
    want_dead = _want_dead(writers, judged)
    phase1 = [s for segs in writers.values() for s in segs[:6]]
    phase2 = [s for segs in writers.values() for s in segs[6:]]
    phase1_ids = {json.loads(ln)["trace_id"] for _, seg in phase1 for ln in seg if isinstance(ln, str)}
    phase1_windows = len({(ev.ts_ms - ev.ts_ms % 5000, ev.model, ev.pool, ev.replica, ev.arm)
                          for ev in judged.usable if ev.trace_id in phase1_ids})

    req = spool_dirs[names.SPOOL_REQUESTS]
    knobs = dict(watermark_delay_s=DELAY_MS / 1000, checkpoint_interval_s=0.3, monitor_interval_s=0.2,
                 sink_flush_s=0.2, idle_timeout_s=30, restart_attempts=0)
    log, ckpt, dsn = tmp_path / "stream.log", cfg.checkpoint_dir(), cfg.store.dsn
    open_store(cfg)  # migrated, so the test can count rows from the start
    _publish_shuffled(rng, req, phase1)
    proc = start_stream(cfg, "--kinds", "requests", log=log, **knobs)
    try:
        _wait(lambda: _count(dsn, "SELECT count(*) FROM request_windows") > 0, 180, "first windows", log)
        seen = set(ckpt.glob("*/chk-*/_metadata"))
        _wait(lambda: set(ckpt.glob("*/chk-*/_metadata")) - seen, 60, "a checkpoint", log)
        before = _count(dsn, "SELECT count(*) FROM request_windows")
    finally:
        kill_group(proc)
    # killed mid-backlog: most of phase 1's windows were not written yet
    assert 0 < before < 0.8 * phase1_windows, (before, phase1_windows)

    _publish_shuffled(rng, req, phase2)  # while the job is down
    proc = start_stream(cfg, "--kinds", "requests", log=log, **knobs)
    try:
        _wait(lambda: _count(dsn, "SELECT count(*) FROM request_windows") >= len(want)
              and _count(dsn, "SELECT count(*) FROM dead_letters") >= len(want_dead), 240,
              f"{len(want)} windows and {len(want_dead)} dead letters", log,
              lambda: (_count(dsn, "SELECT count(*) FROM request_windows"), _count(dsn, "SELECT count(*) FROM dead_letters")))
        time.sleep(1.0)  # a double write, if any, would land now
        assert proc.poll() is None, log.read_text()[-3000:]  # still running: no poison pill
    finally:
        kill_group(proc)
    assert "resuming from checkpoint" in log.read_text()
    _check(dsn, want, want_dead)
