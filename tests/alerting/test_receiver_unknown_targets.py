"""Alerts about a replica or pool the control API does not know: a real control API and
receiver on loopback, the real store. The answer (404, or absent from the state) is permanent:
audited once, then no more control calls for that target until a new episode fires; a 409
refusal is retried but audited once while its reason stays the same."""

from __future__ import annotations

import asyncio

from llmsla.control.router import Replica

from .harness import POLICY, alert, harness, migrated, note


def _receiver_rows(h, target: str) -> list[dict]:
    return [r for r in h.rows() if r["target"] == target and r["action"] is not None and r["decision"] != "act"]


def test_unknown_pool_is_audited_once_and_never_retried(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            status, body = await h.post(note(alert("firing", scope="pool", replica=None, pool="nosuch")))
            assert status == 200, body
            calls = h.engine.control.calls
            for _ in range(20):
                await h.tick(61)
            rows = [r for r in h.rows() if r["target"] == "pool:nosuch" and r["outcome"] != "skipped"
                    and r["decision"] not in ("act",)]
            assert len(rows) == 1, rows
            assert rows[0]["outcome"] == "refused" and "not retried" in rows[0]["reason"]
            assert h.engine.control.calls == calls  # no call at all after the first answer
            assert not [r for r in h.rows() if r["outcome"] == "failed"]

    asyncio.run(main())


def test_unknown_replica_is_audited_once_and_never_retried(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            await h.post(note(alert("firing", replica="ghost")))
            calls = h.engine.control.calls
            for _ in range(20):
                await h.tick(61)
            rows = [r for r in h.rows() if r["target"] == "replica:default/ghost" and r["outcome"] == "refused"]
            assert len(rows) == 1 and "not retried" in rows[0]["reason"], rows
            assert h.engine.control.calls == calls
            # a new episode looks it up again: the replica exists now, and is acted on
            h.router.add_replica(Replica("ghost", "default"))
            await h.post(note(alert("resolved", replica="ghost")))
            await h.post(note(alert("firing", replica="ghost", starts_min=60)))
            assert h.weight("ghost") == 0.25

    asyncio.run(main())


def test_a_404_on_the_write_itself_is_permanent(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            # pool "orphan" has a replica in the router, but the distillation controls do not
            # know it: the state lists it, the schedule write answers 404
            h.router.add_replica(Replica("o1", "orphan"))
            await h.post(note(alert("firing", scope="pool", replica=None, pool="orphan")))
            calls = h.engine.control.calls
            for _ in range(20):
                await h.tick(61)
            writes = [r for r in h.rows() if r["target"] == "pool:orphan" and r["action"] == "set_temperature_schedule"]
            assert len(writes) == 1, writes
            assert writes[0]["outcome"] == "refused" and writes[0]["params"]["response"]["status"] == 404
            assert "not retried" in writes[0]["reason"]
            assert h.engine.control.calls == calls

    asyncio.run(main())


def test_a_409_is_retried_but_audited_once(pg_dsn: str) -> None:
    async def main() -> None:
        # a 20 % share step where the control API allows 10 %: 409 every time
        async with harness(migrated(pg_dsn), policy_text=POLICY.replace("max_pct: 20", "max_pct: 40")
                           .replace("step_pct: 10", "step_pct: 20")) as h:
            await h.post(note(alert("firing", scope="pool", replica=None)))
            calls = h.engine.control.calls
            for _ in range(10):
                await h.tick(61)
            assert h.engine.control.calls > calls  # still retried: the answer may change
            refused = [r for r in h.rows() if r["action"] == "set_student_share"]
            assert len(refused) == 1, refused
            assert refused[0]["outcome"] == "refused" and refused[0]["params"]["response"]["status"] == 409

    asyncio.run(main())
