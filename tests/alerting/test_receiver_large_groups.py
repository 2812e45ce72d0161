"""A 5,000-alert notification (Alertmanager's ``max_alerts: 5000`` in the shipped config) on the
real store: every alert answered and audited, and the alerts that point at no target cost one
transaction together, not one each (one each took 9-12 s for 5,000 on the bench machine, past
Alertmanager's 10 s floor for a notification)."""

from __future__ import annotations

import asyncio
import collections

import psycopg

from llmsla import names
from llmsla.alerting.journal import MemoryJournal

from .harness import alert, harness, migrated, note

N = 5000
EXT = {"k8s.cluster.name": "prod-eu-1"}  # Prometheus external_labels, on every alert


def _group() -> list[dict]:
    static = [alert("firing", replica=None, scope="pool", severity="ticket", source="static",
                    alertname="LlmslaGpuMemoryHigh", node=f"n{i // 8}", gpu=str(i % 8), **EXT)
              for i in range(N - 3)]
    # in the middle of the group: a page that acts, and one without its replica label
    return [*static[:2000], alert("firing", replica="r1", **EXT), alert("firing", replica=None, **EXT),
            *static[2000:], static[0]]  # the last one repeats the first: a duplicate within the group


#: The tables the receiver writes (its journal: the audit log, the receipts, its state).
WRITTEN = (names.T_ACTION_LOG, names.T_ALERT_RECEIPTS, names.T_RECEIVER_STATE)


def _writers(dsn: str) -> set[str]:
    """The transactions that wrote the receiver's rows as they are now (each row's ``xmin``). The
    ones new after a notification are the write transactions it took, counted in this test's
    database only: the server's transaction counter would also count other databases' writes
    (other test processes on a shared server, TimescaleDB's background jobs)."""
    sql = " UNION ".join(f"SELECT xmin::text FROM {t}" for t in WRITTEN)
    with psycopg.connect(dsn) as conn:
        return {str(r[0]) for r in conn.execute(sql).fetchall()}


def _count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def test_five_thousand_alerts_answered_audited_in_few_transactions(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            body = note(*_group())
            before = _writers(pg_dsn)
            status, resp = await h.post(body)
            took = len(_writers(pg_dsn) - before)
            assert status == 200, resp
            assert resp["alerts"] == N and len(resp["results"]) == N and resp["skipped"] == 0
            # the results in the notification's order
            assert [r["fingerprint"] for r in resp["results"]] == [a["fingerprint"] for a in body["alerts"]]
            got = collections.Counter(r["decision"] for r in resp["results"])
            assert got == {"no_rule": N - 3, "act": 1, "unroutable": 1, "duplicate": 1}, got
            assert resp["results"][2000]["decision"] == "act" and h.weight("r1") == 0.25
            assert resp["results"][2001]["decision"] == "unroutable"
            assert resp["results"][-1]["decision"] == "duplicate" and resp["results"][0]["decision"] == "no_rule"
            # one per-alert transaction each was > 5,000 write transactions
            assert 1 <= took <= 50, f"{took} write transactions for one notification"
            alert_rows = (f"SELECT count(*) FROM {names.T_ACTION_LOG} WHERE source = 'alert_receiver' "
                          "AND action = 'alert'")
            assert _count(pg_dsn, alert_rows) == N
            assert _count(pg_dsn, f"SELECT count(*) FROM {names.T_ALERT_RECEIPTS}") == N - 1
            assert _count(pg_dsn, alert_rows + " AND params->'labels'->>'k8s.cluster.name' = 'prod-eu-1'") == N
            # Alertmanager re-sends the group every repeat_interval: every alert a duplicate, audited
            status, resp = await h.post(body)
            assert status == 200 and {r["decision"] for r in resp["results"]} == {"duplicate"}, resp["results"][:3]
            assert _count(pg_dsn, alert_rows) == 2 * N

    asyncio.run(main())


def test_memory_journal_decides_the_same(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), journal=MemoryJournal()) as h:
            status, resp = await h.post(note(*_group()))
            assert status == 200
            got = collections.Counter(r["decision"] for r in resp["results"])
            assert got == {"no_rule": N - 3, "act": 1, "unroutable": 1, "duplicate": 1}, got
            assert sum(1 for r in h.engine.journal.recent if r["action"] == "alert") == N
            status, resp = await h.post(note(*_group()))
            assert {r["decision"] for r in resp["results"]} == {"duplicate"}

    asyncio.run(main())
