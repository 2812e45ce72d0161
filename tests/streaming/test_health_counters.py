"""The stream job's store-read metrics on both flavours: llmsla_dead_letters_total is a counter
that retention cannot take back, the newest window end per table is the job's lag, and a store
that does not answer yields no samples. (The running job serving them: test_health.py.)"""

from __future__ import annotations

import datetime as dt

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_store import insert_windows, window_row

from llmsla import names
from llmsla.store import connect
from llmsla.store.connection import StoreHandle
from llmsla.store.maintenance import apply_retention
from llmsla.store.migrate import migrate, recorded_flavor
from llmsla.streaming.health import StreamHealth, registry_for

UTC = dt.UTC


def _dead_letter(conn, at: dt.datetime, source: str, reason: str, n: int) -> None:
    if recorded_flavor(conn) == "plain":  # a day outside the partitions migrate creates
        conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_DEAD_LETTERS}', 'received_at', %s, %s)",
                     (at.date(), at.date()))
    for i in range(n):
        conn.execute(f"INSERT INTO {names.T_DEAD_LETTERS} (received_at, source, file, line, reason, raw, fingerprint) "
                     "VALUES (%s, %s, 'seg-1.jsonl', %s, %s, '{', %s)", (at, source, i, reason, f"{source}/{at}/{i}"))


def _samples(health: StreamHealth) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in health.collect() for s in m.samples}


def test_dead_letters_total_survives_retention(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    old = now - dt.timedelta(days=cfg.store.retention_days + 3)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        _dead_letter(conn, old, "requests", "parse: not JSON", 3)
        _dead_letter(conn, now, "requests", "schema: model", 2)
        _dead_letter(conn, now, "gpu", "schema: gpu", 1)
        conn.commit()
    health = StreamHealth(StoreHandle(pg_dsn, embedded=False), min_interval_s=0)
    total = names.DEAD_LETTERS + "_total"
    want = {(total, (("source", "requests"),)): 5.0, (total, (("source", "gpu"),)): 1.0}
    assert {k: v for k, v in _samples(health).items() if k[0] == total} == want
    with connect(pg_dsn) as conn:  # retention drops the old partition / chunk and its 3 rows
        apply_retention(conn, cfg, flavor=recorded_flavor(conn), now=now)
        conn.commit()
        assert conn.execute(f"SELECT count(*) FROM {names.T_DEAD_LETTERS}").fetchone()[0] == 3
        _dead_letter(conn, now, "requests", "parse: not JSON", 1)
        conn.commit()
    want[(total, (("source", "requests"),))] = 6.0  # never back to 2 + 1
    assert {k: v for k, v in _samples(health).items() if k[0] == total} == want


def test_newest_window_end_per_table(pg_dsn: str, cfg) -> None:
    bucket = dt.datetime(2026, 1, 5, 10, 0, 5, tzinfo=UTC)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "plain":
            conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_REQUEST_WINDOWS}', 'bucket', %s, %s)",
                         (bucket.date(), bucket.date()))
        insert_windows(conn, [window_row(bucket), window_row(bucket - dt.timedelta(seconds=5))])
        conn.commit()
    text = generate_latest(registry_for(StoreHandle(pg_dsn, embedded=False))).decode()
    lag = {s.labels["table"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.name == names.STREAM_NEWEST_WINDOW}
    assert lag == {names.T_REQUEST_WINDOWS: bucket.timestamp() + names.REQUEST_WINDOW_S}  # no other window stored


def test_unreachable_store_yields_no_samples() -> None:
    health = StreamHealth(StoreHandle("postgresql://nobody@127.0.0.1:1/none", embedded=False, timeout_s=1),
                          min_interval_s=0)
    assert list(health.collect()) == []
