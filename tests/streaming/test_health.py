"""``llmsla stream`` serves what it has done from the store it writes: the dead-letter counter the
static rule LlmslaDeadLetters reads, and the newest window end per table (the job's lag). The
reference is the input: the lines published, not the table the collector reads."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.streaming import synth

from .conftest import kill_group, publish, start_stream


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_stream_serves_dead_letters_and_window_lag(cfg: config_mod.Config, spool_dirs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    now = int(time.time() * 1000) // 5000 * 5000
    lines = list(synth.request_lines(synth.request_columns(300, start_ms=now - 60_000, span_ms=20_000)))
    poison = json.loads(lines[0])
    poison["model"] = "x\u0000y"  # storable nowhere: a dead letter with the contract's reason
    bad = [json.dumps(poison), "{not json"]
    port = _free_port()
    log = tmp_path / "stream.log"
    proc = start_stream(cfg, "--kinds", "requests", log=log, monitor_interval_s=0.2, sink_flush_s=0.1,
                        watermark_delay_s=0, idle_timeout_s=0.5, metrics_port=port)
    try:
        last_ts = max(json.loads(x)["ts_ms"] for x in lines)
        expected_end = (last_ts // 5000 + 1) * 5
        # the stream moving on: a later event lets the watermark pass the last window of `lines`
        # (its own window stays open until more data comes, as in any continuous stream)
        later = json.loads(lines[-1])
        later["ts_ms"] = last_ts + 30_000
        publish(spool_dirs[names.SPOOL_REQUESTS], "0000000000001-h-1-a-000000.jsonl",
                [*lines, *bad, json.dumps(later)])
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                got = _scrape(port)
            except OSError:
                got = {}
            dead = got.get((f"{names.DEAD_LETTERS}_total", ((names.L_SOURCE, names.SPOOL_REQUESTS),)))
            newest = got.get((names.STREAM_NEWEST_WINDOW, (("table", names.T_REQUEST_WINDOWS),)))
            if dead == len(bad) and newest == expected_end:
                break
            assert time.monotonic() < deadline, (dead, newest, expected_end, log.read_text()[-3000:])
            time.sleep(0.5)
        # no policy or GPU windows were written: no sample rather than a made-up zero
        assert not any(k[0] == names.STREAM_NEWEST_WINDOW and k[1] != (("table", names.T_REQUEST_WINDOWS),)
                       for k in got)
    finally:
        kill_group(proc)


def test_a_taken_metrics_port_is_a_clear_error(cfg: config_mod.Config, spool_dirs: dict[str, Path],
                                              tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "stream.log"
        proc = start_stream(cfg, "--once", "--kinds", "requests", log=log, metrics_port=port)
        rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == 2, text[-2000:]
    assert f"stream.metrics_port (from environment variable LLMSLA_STREAM_METRICS_PORT): cannot listen on 127.0.0.1:{port}" in text and "address already in use" in text.lower(), text[-2000:]
