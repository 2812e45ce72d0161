"""The store writer on its own (real PostgreSQL, no Flink): idempotent upserts, dead-letter
fingerprints, reconnect after a dropped connection, and a clear failure when the store stays down."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time

import psycopg
import pytest

from llmsla import names, services
from llmsla.store import open_store
from llmsla.streaming import sql
from llmsla.streaming.store_sink import StoreUnavailable, StoreWriter


def _gpu_payload(bucket_ms: int, samples: int, node: str = "node0") -> str:
    """A gpu window row as the job encodes it: a line of COPY text (sql.GPU_COLUMNS)."""
    bucket = dt.datetime.fromtimestamp(bucket_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "+00"
    return "\t".join([bucket, node, "0", str(samples), "100", "50.0", "200", "0.5", "1.0E-4", "300.0"])


def _dead(verdict: str, raw: bytes, *, file: str = "/spool/requests/x.jsonl", problem: str | None = None) -> str:
    """A dead-letter payload as the job encodes it (sql.DEAD_COLUMNS)."""
    return json.dumps(["requests", file, verdict, problem, base64.b64encode(raw).decode()])


@pytest.fixture()
def store_dsn(cfg) -> str:
    return open_store(cfg).dsn


def test_upsert_replaces_and_dead_letters_are_not_doubled(store_dsn: str) -> None:
    reasons: list[str] = []
    w = StoreWriter(store_dsn, on_dead_letter=reasons.append)
    b = 1_700_000_000_000
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(b, 3), _gpu_payload(b + 5000, 4)])
    # a replay, then a newer value, beside a new window: the straight COPY meets the old key and
    # rolls back; the whole batch takes the staging upsert (replace the old row, add the new one)
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(b, 3), _gpu_payload(b, 9), _gpu_payload(b + 10_000, 5)])
    dead = _dead("invalid", b"not json", problem="parse")
    late = _dead("late", b'{"v":1}')
    w.write(sql.DEAD_LETTERS, [dead, late, dead])
    w.write(sql.DEAD_LETTERS, [dead])
    w.close()
    with psycopg.connect(store_dsn) as conn:
        rows = conn.execute("SELECT samples FROM gpu_windows ORDER BY bucket").fetchall()
        dl = conn.execute("SELECT reason, file, raw FROM dead_letters ORDER BY reason").fetchall()
    assert rows == [(9,), (4,), (5,)]
    assert [r[0].split(":")[0] for r in dl] == ["late", "parse"]
    assert dl[1][0].startswith("parse: RequestEvent.<record>: not valid JSON")
    assert dl[1][1] == "/spool/requests/x.jsonl"
    assert sorted(reasons) == ["late", "parse", "parse"]  # counted once per batch, replays included


def test_a_batched_payload_is_its_rows_even_with_newlines_in_labels(store_dsn: str) -> None:
    """A window kind's payload carries a window's rows joined by ``sql.ROW_SEPARATOR``
    (``sql.batched_query``); a label holding that character (or a tab or backslash) is escaped
    in its COPY line and stays one row (the whole path: tests/streaming/test_strings_property.py)."""
    w = StoreWriter(store_dsn)
    b = 1_700_000_000_000
    hostile = _gpu_payload(b, 2, node="node\\nwith\\r\\nbreaks\\tand \\\\N")
    assert sql.ROW_SEPARATOR not in hostile
    batch = sql.ROW_SEPARATOR.join([_gpu_payload(b, 3), hostile, _gpu_payload(b + 5000, 4)])
    assert w.write(names.T_GPU_WINDOWS, [batch]) == 3
    # a replayed window is the same batch again; a newer value of a row replaces it
    assert w.write(names.T_GPU_WINDOWS, [batch, sql.ROW_SEPARATOR.join([_gpu_payload(b, 9)])]) == 3
    w.close()
    with psycopg.connect(store_dsn) as conn:
        rows = conn.execute("SELECT node, samples, temp_max_c, power_mean_w FROM gpu_windows "
                            "ORDER BY bucket, node").fetchall()
        bucket = conn.execute("SELECT DISTINCT bucket FROM gpu_windows WHERE samples = 9").fetchone()[0]
    assert rows == [("node\nwith\r\nbreaks\tand \\N", 2, 1e-4, 300.0), ("node0", 9, 1e-4, 300.0),
                    ("node0", 4, 1e-4, 300.0)]
    assert bucket == dt.datetime.fromtimestamp(b / 1000, dt.UTC)


def test_reconnects_after_the_connection_is_killed(store_dsn: str) -> None:
    w = StoreWriter(store_dsn, retry_s=10)
    w.write(names.T_GPU_WINDOWS, [_gpu_payload(1_700_000_000_000, 1)])
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'llmsla-stream' AND datname = current_database()").fetchone()[0]
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
    got = line_numbers(str(seg), {b'{"bad"', b"not json", "naïve ✓".encode(), b"absent"})
    assert got == {b'{"bad"': 2, b"not json": 3, "naïve ✓".encode(): 5}  # CRLF stripped like the reader does
    assert line_numbers(seg.as_uri(), {b"not json"}) == {b"not json": 3}  # a file: URI works too
    with caplog.at_level("WARNING"):
        assert line_numbers(str(tmp_path / "pruned.jsonl"), {b"x"}) == {}
    assert "no line numbers" in caplog.text


def test_unstorable_dead_letters_are_stored_with_a_named_reason(store_dsn: str, tmp_path) -> None:
    """A dead letter's raw line is stored whatever its bytes (NUL escaped as \\u0000, invalid UTF-8 as
    U+FFFD), its reason comes from the contract on the exact bytes, and it is numbered in its file."""
    import hashlib

    from llmsla.streaming import synth
    from llmsla.streaming.store_sink import fingerprint

    good = next(iter(synth.request_lines(synth.request_columns(1, start_ms=1_700_000_000_000, span_ms=1))))
    lines = {
        "nul": good.replace('"model":"', '"model":"x\\u0000', 1).encode(),
        "surrogate": good.replace('"model":"', '"model":"\\ud800', 1).encode(),
        "utf8": good.encode().replace(b'"model":"', b'"model":"\xc1\x81', 1),
        "raw_nul": b'{"v":1,\x00}',
        "bom": b"\xef\xbb\xbf" + good.encode(),
        "dup": good[:-1].encode() + b',"model":"again"}',
        "huge": json.dumps({**json.loads(good), "queue_ms": 10**400}).encode(),
        "truncated": good.encode(),
    }
    seg = tmp_path / "0000000000001-h-1-ab-000000.jsonl"
    seg.write_bytes(b"\n".join(v for k, v in lines.items() if k != "truncated") + b"\n" + lines["truncated"])
    w = StoreWriter(store_dsn)
    w.write(sql.DEAD_LETTERS, [_dead("invalid", raw, file=str(seg), problem="truncated" if k == "truncated" else None)
                               for k, raw in lines.items()])
    w.close()
    with psycopg.connect(store_dsn) as conn:
        rows = {raw: (reason, line, fp) for raw, reason, line, fp in
                conn.execute("SELECT raw, reason, line, fingerprint FROM dead_letters").fetchall()}
    assert len(rows) == len(lines)
    shown = {k: raw.decode("utf-8", "replace").replace("\x00", "\\u0000") for k, raw in lines.items()}
    reason = {k: rows[shown[k]][0] for k in lines}
    assert "RequestEvent.model: contains NUL" in reason["nul"]
    assert "RequestEvent.model: contains a lone surrogate U+D800" in reason["surrogate"]
    assert reason["utf8"].startswith("parse: RequestEvent.<record>: not valid UTF-8 at byte")
    assert reason["raw_nul"].startswith("parse: RequestEvent.<record>: not valid JSON")
    assert "byte-order mark" in reason["bom"]
    assert "RequestEvent.model: duplicate field" in reason["dup"]
    assert reason["huge"].startswith("schema: RequestEvent.") and "queue_ms" in reason["huge"]
    assert reason["truncated"] == "parse: RequestEvent.<record>: truncated line (no newline at end)"
    assert [rows[shown[k]][1] for k in lines] == list(range(1, len(lines) + 1))  # line numbers, bytes and all
    # the fingerprint of a UTF-8 line is what earlier releases computed from its text
    old = hashlib.sha256()
    for part in ("requests", str(seg), "invalid", shown["dup"]):
        old.update(part.encode() + b"\x00")
    assert rows[shown["dup"]][2] == old.hexdigest()[:32] == fingerprint("requests", str(seg), "invalid", lines["dup"])
