"""Engine samples through the real job (mini-cluster, real PostgreSQL): ``engine_windows`` equals
a pandas reference computed from the same spooled lines, on the Java path and on the pure-SQL
fallback (the engine's TTFT histogram spread onto the layout included), and its 1 m and 1 h
roll-ups equal those of the stored 5 s rows; bad lines (each a contract violation, the histogram and list checks of the Java format
included) and a late sample become dead letters with the contract's reason."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from test_store_engine_rollups import assert_rollup, stored

from llmsla import names
from llmsla.events import EngineSample
from llmsla.store import schema
from llmsla.streaming import synth

from . import reference as ref
from .conftest import publish, start_stream

DELAY_MS = 2000


def _with(line: str, **changes: object) -> str:
    d = json.loads(line)
    d.update(changes)
    return ref.dumps(d)


def _hist(line: str, **changes: object) -> str:
    d = json.loads(line)
    d["ttft"] = {**d["ttft"], **changes}
    return ref.dumps(d)


def _engine(start: int, *, java: bool) -> tuple[list[str], list[str]]:
    """Samples of three replicas (one restart, one engine without counters), and the bad lines
    put in place of some of them (a line replaced is no sample: the replica's next increase spans
    the gap, as when a scrape fails). The pure-SQL fallback reads a histogram's sum and count
    only and no string list, so a line whose only fault is in a histogram's bounds or counts or in
    the list passes there (docs/streaming.md, the fallback), like an unknown field: those are
    Java-path cases only."""
    lines = synth.engine_lines(start_ms=start, span_ms=90_000, seed=11, reset_at=40)
    for line in lines[:20]:
        EngineSample.from_json(line)
    r0 = [i for i, line in enumerate(lines) if '"replica":"r0"' in line]
    bad_at = {
        r0[10]: _with(lines[r0[10]], kv_usage=1.5),
        r0[12]: _hist(lines[r0[12]], le=[0.5, 0.1, *json.loads(lines[r0[12]])["ttft"]["le"][2:]]),
        r0[14]: _hist(lines[r0[14]], counts=[5, 1, *json.loads(lines[r0[14]])["ttft"]["counts"][2:]]),
        r0[16]: _hist(lines[r0[16]], count=-1),
        r0[18]: _hist(lines[r0[18]], p99=1.0),
        r0[20]: _with(lines[r0[20]], lora_adapters=["ok", 3]),
        r0[22]: _with(lines[r0[22]], lora_adapters=[""]),
        r0[24]: _with(lines[r0[24]], engine="ollama"),
        r0[26]: _with(lines[r0[26]], counter_reset=2),
        r0[28]: _with(lines[r0[28]], kv_blocks_total=-4),
        r0[30]: "not json",
    }
    if not java:
        for i in (r0[12], r0[14], r0[18], r0[20], r0[22]):  # and an unknown field, as for every kind
            del bad_at[i]
    out = [bad_at.get(i, line) for i, line in enumerate(lines)]
    late_ts = json.loads(lines[100])["ts_ms"] - 20_000
    out.insert(101, _with(lines[100], ts_ms=late_ts, replica="r1"))
    return out, sorted(bad_at.values())


@pytest.mark.parametrize("java", [True, False], ids=["java", "sql-fallback"])
def test_engine_windows_match_reference(cfg, spool_dirs, tmp_path: Path, java: bool) -> None:
    now = int(time.time() * 1000)
    start = now - 600_000
    engine_dir = cfg.spool_dir() / names.SPOOL_ENGINE
    engine_dir.mkdir(parents=True, exist_ok=True)
    lines, bad = _engine(start, java=java)
    publish(engine_dir, "0000000000001-test.jsonl", lines)

    judged = ref.judge(names.SPOOL_ENGINE, lines, delay_ms=DELAY_MS, now_ms=now,
                       max_future_ms=int(cfg.stream.max_future_s * 1000),
                       max_past_ms=int(cfg.stream.max_past_s * 1000))
    want = ref.engine_windows(judged.usable)
    hist = names.C_ENGINE_TTFT_HIST
    # the engine's TTFT histogram: the Java path spreads its native buckets onto the layout (a
    # restart and a replica without a histogram included); the fallback has none, as for requests
    assert want[hist].notna().sum() > 10 and want[hist].isna().any()
    if not java:
        want[hist] = None
    cats = sorted(c for _, c in judged.dead)
    assert cats == sorted(["parse"] + ["schema"] * (len(bad) - 1) + ["late"]), judged.dead
    # the reference exercises what the windows must handle: a restart, and null counters
    assert want.counter_resets.sum() == 1 and want.preemptions.isna().any() and want.preemptions.notna().any()

    log = tmp_path / "stream.log"
    proc = start_stream(cfg, "--once", "--fresh", "--kinds", names.SPOOL_ENGINE, log=log,
                        watermark_delay_s=DELAY_MS / 1000, java_parser=str(java).lower())
    assert proc.wait(timeout=240) == 0, log.read_text()[-4000:]

    with psycopg.connect(cfg.store.dsn) as conn:
        ref.assert_frames_equal(ref.fetch(conn, names.T_ENGINE_WINDOWS), want, names.T_ENGINE_WINDOWS)
        # the roll-ups of what the job wrote: sums, maxima, weighted means and histograms of the 5 s rows
        cols = schema.ENGINE_COLUMNS
        rows = [dict(zip(cols, r, strict=True)) for r in conn.execute(
            f"SELECT {', '.join(f'{c}::text' if c == hist else c for c in cols)} FROM {names.T_ENGINE_WINDOWS}")]
        assert_rollup(stored(conn, names.T_ENGINE_WINDOWS_1M), rows, 60)
        assert_rollup(stored(conn, names.T_ENGINE_WINDOWS_1H), rows, 3600)
        dead = ref.dead_letters(conn)
        reasons = dict(conn.execute("SELECT raw, reason FROM dead_letters WHERE source = 'engine'").fetchall())
    want_dead = sorted((names.SPOOL_ENGINE, "0000000000001-test.jsonl", c, raw) for raw, c in judged.dead)
    assert dead == want_dead
    kv = next(b for b in bad if '"kv_usage":1.5' in b)
    assert reasons[kv].startswith("schema: EngineSample.kv_usage: must be <= 1"), reasons[kv]
    if java:
        le = next(b for b in bad if '"le":[0.5,0.1' in b)
        assert "EngineSample.ttft.le[1]: bounds must increase strictly" in reasons[le], reasons[le]
