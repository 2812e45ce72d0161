"""The real job (mini-cluster, real PostgreSQL) against a pandas/numpy reference on the same lines:
in-order, shuffled within the watermark bound, late and malformed records, all three kinds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from llmsla import names
from llmsla.events import RequestEvent
from llmsla.streaming import synth

from . import reference as ref
from .conftest import publish, start_stream

DELAY_MS = 2000


def _with(line: str, **changes: object) -> str:
    d = json.loads(line)
    d.update(changes)
    return ref.dumps(d)


#: Several tenants and classes, and lines without either (written before tenants: the defaults).
TENANCY = synth.Keys(tenancy=(("acme", "interactive"), ("acme", "batch"), ("globex", "sheddable"), None))


def _requests(now: int, start: int) -> list[str]:
    cols = synth.request_columns(3000, start_ms=start, span_ms=60_000, seed=7, jitter_ms=1500, keys=TENANCY)
    lines = list(synth.request_lines(cols, TENANCY))
    for line in lines[:50]:  # the fast generator writes exactly what the contract accepts
        RequestEvent.from_json(line)
    ts = cols["ts_ms"]
    out: list[str] = []
    late_at = {1000, 2000, 2500}
    bad_at = {
        300: "this is not json",
        400: '{"v":1,"ts_ms":',
        500: "[1,2,3]",
        600: _with(lines[600], status="weird"),
        700: _with(lines[700], queue_ms=-1),
        800: lines[800].replace(f'"queue_ms":{cols["queue_ms"][800]}', '"queue_ms":NaN'),
        900: _with(lines[900], ttft_ms=10.0, e2e_ms=5.0, queue_ms=1.0),
        1100: ref.dumps({k: v for k, v in json.loads(lines[1100]).items() if k != "model"}),
        1200: _with(lines[1200], ts_ms=now + 3_600_000),
        1300: _with(lines[1300], ts_ms=now - 30 * 86_400_000),
        1400: _with(lines[1400], v=2),
    }
    seen_max = 0
    for i, line in enumerate(lines):
        if i in bad_at:
            out.append(bad_at[i])
            continue  # the bad line replaces this event
        out.append(line)
        seen_max = max(seen_max, int(ts[i]))
        if i in late_at:
            out.append(_with(line, ts_ms=seen_max - 20_000, trace_id=f"{i:032x}"))
    return out


def _policy(start: int) -> list[str]:
    lines = synth.policy_lines(600, start_ms=start, span_ms=170_000, seed=3)
    lines.insert(400, _with(lines[399], ts_ms=json.loads(lines[399])["ts_ms"] - 120_000, span_id="f" * 16))
    lines.insert(200, _with(lines[199], temperature=150.0))
    return lines


def _gpu(start: int) -> list[str]:
    lines = synth.gpu_lines(400, start_ms=start, span_ms=60_000, seed=5)
    lines.insert(100, _with(lines[99], util=2.0))
    lines.insert(200, _with(lines[199], mem_used_bytes=(80 << 30) + 1))
    return lines


def _run_once(cfg, tmp_path: Path, *extra: str) -> None:
    proc = start_stream(cfg, "--once", *extra, log=tmp_path / "stream.log", watermark_delay_s=DELAY_MS / 1000)
    rc = proc.wait(timeout=240)
    assert rc == 0, (tmp_path / "stream.log").read_text()[-4000:]


def test_windows_match_reference_and_replay_is_idempotent(cfg, spool_dirs, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    start = now - 600_000
    lines = {
        names.SPOOL_REQUESTS: _requests(now, start),
        names.SPOOL_POLICY: _policy(start),
        names.SPOOL_GPU: _gpu(start),
    }
    for kind, ls in lines.items():
        publish(spool_dirs[kind], "0000000000001-test.jsonl", ls)

    judged = {
        kind: ref.judge(kind, ls, delay_ms=DELAY_MS, now_ms=now, max_future_ms=int(cfg.stream.max_future_s * 1000),
                        max_past_ms=int(cfg.stream.max_past_s * 1000))
        for kind, ls in lines.items()
    }
    # the data exercises every path: 3 late requests, each bad-line category, late policy span
    cats = sorted(c for _, c in judged[names.SPOOL_REQUESTS].dead)
    assert cats == sorted(["late"] * 3 + ["parse"] * 3 + ["schema"] * 6 + ["future", "past"])
    assert [c for _, c in judged[names.SPOOL_POLICY].dead] == ["schema", "late"]
    usable = judged[names.SPOOL_REQUESTS].usable
    assert {(e.tenant, e.class_) for e in usable} == {("acme", "interactive"), ("acme", "batch"),
                                                      ("globex", "sheddable"), (names.DEFAULT_TENANT, names.DEFAULT_CLASS)}

    want = {
        names.T_REQUEST_WINDOWS: ref.request_windows(judged[names.SPOOL_REQUESTS].usable,
                                                     ttft_slo=cfg.slo.ttft_ms, e2e_slo=cfg.slo.e2e_ms),
        names.T_POLICY_WINDOWS: ref.policy_windows(judged[names.SPOOL_POLICY].usable),
        names.T_GPU_WINDOWS: ref.gpu_windows(judged[names.SPOOL_GPU].usable),
    }
    reqs = want[names.T_REQUEST_WINDOWS]  # goodput separates: some ok requests miss an objective
    assert 0 < reqs["goodput"].sum() < reqs["ok"].sum()
    assert reqs.groupby(["tenant", "class"]).size().size == 4
    want_dead = sorted(
        (kind, "0000000000001-test.jsonl", cat, raw) for kind, j in judged.items() for raw, cat in j.dead
    )

    def check() -> None:
        with psycopg.connect(cfg.store.dsn) as conn:
            for table, df in want.items():
                ref.assert_frames_equal(ref.fetch(conn, table), df, table)
            assert ref.dead_letters(conn) == want_dead
            counts = conn.execute(
                f"SELECT source, reason, records FROM {names.T_DEAD_LETTER_COUNTS} ORDER BY 1, 2").fetchall()
            reasons = dict(conn.execute(
                "SELECT raw, reason FROM dead_letters WHERE source = 'requests'").fetchall())
            numbered = conn.execute("SELECT source, raw, line FROM dead_letters").fetchall()
        # each dead letter points at its line of the segment (1-based, first occurrence)
        assert numbered and all(n == lines[kind].index(raw) + 1 for kind, raw, n in numbered), numbered
        want_counts: dict[tuple[str, str], int] = {}
        for source, _, cat, _ in want_dead:
            want_counts[(source, cat)] = want_counts.get((source, cat), 0) + 1
        assert counts == sorted((s, c, n) for (s, c), n in want_counts.items())
        # the reason names the field, from the contract itself
        assert reasons['{"v":1,"ts_ms":'].startswith("parse: RequestEvent.<record>: not valid JSON")
        assert "RequestEvent.status: must be one of" in reasons[lines[names.SPOOL_REQUESTS][600]]
        assert "RequestEvent.queue_ms: not finite" in reasons[lines[names.SPOOL_REQUESTS][800]]

    _run_once(cfg, tmp_path)
    check()
    # Replay everything from scratch: upserts and dead-letter fingerprints must not double count.
    _run_once(cfg, tmp_path, "--fresh")
    check()
