"""The store writer on its own (real PostgreSQL, no Flink): idempotent upserts, dead-letter
fingerprints, reconnect after a dropped connection, and a clear failure when the store stays down."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from llmsla import names, services
from llmsla.store import open_store
from llmsla.streaming import sql
from llmsla.streaming.store_sink import StoreUnavailable, StoreWriter


def _gpu_payload(bucket_ms: int, samples: int) -> str:
    return json.dumps([bucket_ms, "node0", 0, samples, 100, 50.0, 200, 0.5, 70.0, 300.0])


@pytest.fixture()
def store_dsn(cfg) -> str:
    return open_store(cfg).dsn


def test_upsert_replaces_and_dead_letters_are_not_doubled(store_dsn: str) -> None:
    reasons: list[str] = []
    w = StoreWriter(store_dsn, on_dead_letter=reasons.append)
    b = 1_700_000_000_000
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(b, 3), _gpu_payload(b + 5000, 4)])
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(b, 3), _gpu_payload(b, 9)])  # replay, then a newer value
    dead = json.dumps(["requests", "/spool/requests/x.jsonl", "invalid", "not json"])
    late = json.dumps(["requests", "/spool/requests/x.jsonl", "late", '{"v":1}'])
    w.write(sql.DEAD_LETTERS, [dead, late, dead])
    w.write(sql.DEAD_LETTERS, [dead])
    w.close()
    with psycopg.connect(store_dsn) as conn:
        rows = conn.execute("SELECT samples FROM gpu_windows ORDER BY bucket").fetchall()
        dl = conn.execute("SELECT reason, file, raw FROM dead_letters ORDER BY reason").fetchall()
    assert rows == [(9,), (4,)]
    assert [r[0].split(":")[0] for r in dl] == ["late", "parse"]
    assert dl[1][0].startswith("parse: RequestEvent.<record>: not valid JSON")
    assert dl[1][1] == "/spool/requests/x.jsonl"
    assert sorted(reasons) == ["late", "parse", "parse"]  # counted once per batch, replays included


def test_reconnects_after_the_connection_is_killed(store_dsn: str) -> None:
    w = StoreWriter(store_dsn, retry_s=10)
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(1_700_000_000_000, 1)])
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'llmsla-stream'").fetchone()[0]
    assert killed == 1
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(1_700_000_005_000, 2)])
    assert w.retries >= 1
    with psycopg.connect(store_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_windows").fetchone()[0] == 2
    w.close()


def test_store_that_stays_down_fails_clearly() -> None:
    port = services.free_port()  # nothing listens there
    dsn = f"postgresql://llmsla:secret@127.0.0.1:{port}/llmsla"
    w = StoreWriter(dsn, retry_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as err:
        w.write(names.T_GPU_WINDOWS, [_gpu_payload(1_700_000_000_000, 1)])
    assert 0.9 <= time.monotonic() - t0 < 10
    msg = str(err.value)
    assert f"127.0.0.1:{port}" in msg and "secret" not in msg and "unavailable for 1 s" in msg
    assert w.retries >= 2


def test_line_numbers_find_the_first_occurrence(tmp_path, caplog) -> None:
    from llmsla.streaming.store_sink import line_numbers

    seg = tmp_path / "0000000000001-a.jsonl"
    seg.write_bytes('{"ok":1}\n{"bad"\r\nnot json\n{"bad"\nnaïve ✓\n'.encode())
    got = line_numbers(str(seg), {'{"bad"', "not json", "naïve ✓", "absent"})
    assert got == {'{"bad"': 2, "not json": 3, "naïve ✓": 5}  # CRLF stripped like Flink does
    assert line_numbers(seg.as_uri(), {"not json"}) == {"not json": 3}  # a file: URI works too
    with caplog.at_level("WARNING"):
        assert line_numbers(str(tmp_path / "pruned.jsonl"), {"x"}) == {}
    assert "no line numbers" in caplog.text
