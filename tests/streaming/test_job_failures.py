"""The job's plan and its failure path: each line is parsed once (the llmsla-json format), or once
per field on the pure-SQL fallback (the planner must not inline JSON parsing into every check); each
kind has one source and one watermark (on the Java path the llmsla-spool source's own, with no
watermark operator), and on the Java path its verdict is computed once for both outputs; a store
that goes away mid-stream stops the job with a clear message instead of dropping windows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from llmsla import config as config_mod
from llmsla import names
from llmsla.store import open_store
from llmsla.store.connection import start_embedded
from llmsla.streaming import sql, synth

from .conftest import kill_group, publish, start_stream


def _job_plan(tmp_path: Path, *, java: bool) -> str:
    """The stream graph of the real job (store sink), with each operator's SQL description."""
    from llmsla.streaming import job

    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.stream.checkpoint_dir = str(tmp_path / "ckpt")
    cfg.stream.java_parser = java
    env, _t_env, _ = job.build(cfg, job.JobOptions(bounded=True, resume=False))
    return env.get_execution_plan()


def _count_nodes(plan: str, prefix: str) -> int:
    return sum(1 for node in json.loads(plan)["nodes"] if node["type"].startswith(prefix))


def test_plan_parses_each_line_once_and_shares_the_verdict(tmp_path: Path) -> None:
    plan = _job_plan(tmp_path, java=True)
    kinds = len(names.SPOOL_ALL_KINDS)
    assert _count_nodes(plan, "Source: spool_") == kinds, plan  # the parse is the source's format
    # the watermark is the llmsla-spool source's own (per writer, see test_backlog), one per kind
    sources = [n["contents"] for n in json.loads(plan)["nodes"] if n["type"].startswith("Source: spool_")]
    assert all("watermark=[SOURCE_WATERMARK()]" in c and "metadata=[file.path]" in c for c in sources), sources
    assert _count_nodes(plan, "WatermarkAssigner") == 0, plan
    assert plan.count("'late'") == kinds, plan  # windows and dead letters read one verdict
    assert "JSON_VALUE(" not in plan and "PERCENTILE(" not in plan


def test_sql_fallback_plan_parses_each_field_once(tmp_path: Path) -> None:
    plan = _job_plan(tmp_path, java=False)
    # (a column the fallback does not parse, like the native buckets it leaves NULL, reads none)
    fields = sum(e.count("JSON_VALUE(") for k in names.SPOOL_ALL_KINDS for _, e in sql.fallback_columns(k))
    # one JSON_VALUE per parsed field, plus one per kind for the watermark's ts_ms
    assert plan.count("JSON_VALUE(") == fields + len(names.SPOOL_ALL_KINDS), plan
    assert _count_nodes(plan, "Source: spool_") == len(names.SPOOL_ALL_KINDS), plan
    # one watermark per kind, so windows and dead letters agree about lateness
    assert _count_nodes(plan, "WatermarkAssigner") == len(names.SPOOL_ALL_KINDS), plan


def test_store_down_mid_stream_fails_the_job_clearly(tmp_path: Path) -> None:
    dsn, server = start_embedded(tmp_path / "pg", keep_running=False)
    cfg = config_mod.load(env={})
    cfg.store.dsn = dsn
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.stream.checkpoint_dir = str(tmp_path / "ckpt")
    open_store(cfg)
    req = cfg.spool_dir() / names.SPOOL_REQUESTS
    req.mkdir(parents=True)
    log = tmp_path / "stream.log"
    now = int(time.time() * 1000)
    proc = start_stream(cfg, "--kinds", "requests", log=log, sink_retry_s=1, restart_attempts=0,
                        monitor_interval_s=0.2, sink_flush_s=0.1, watermark_delay_s=0)
    try:
        deadline = time.monotonic() + 120
        while not any(cfg.checkpoint_dir().glob("*/chk-*/_metadata")):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
        lines = list(synth.request_lines(synth.request_columns(200, start_ms=now - 60_000, span_ms=20_000)))
        publish(req, "0000000000001-a.jsonl", lines)
        while True:
            with psycopg.connect(dsn) as conn:
                if conn.execute("SELECT count(*) FROM request_windows").fetchone()[0]:
                    break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        server.cleanup()  # the store goes away for good
        server = None
        last = json.loads(lines[-1])
        last["ts_ms"] += 30_000
        publish(req, "0000000000002-b.jsonl", [json.dumps(last)])
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            kill_group(proc)
        if server is not None:
            server.cleanup()
    text = log.read_text()
    assert rc == 2, text[-3000:]
    assert "llmsla: error: stream job failed: store sink:" in text and "unavailable for 1 s" in text, text[-3000:]
