"""The receiver against a real control API and the real store: what it does, in what order, and
what the audit log says about it. The clock is the test's, so hold-downs take no wall time."""

from __future__ import annotations

import asyncio

from llmsla.alerting.journal import PgJournal

from .harness import CONTROL_TOKEN, POLICY, POOL, Clock, alert, harness, migrated, note


def _decisions(h) -> list[tuple[str, str, str]]:
    return [(r["action"], r["decision"], r["outcome"]) for r in h.rows()]


def test_replica_page_deweights_drains_and_restores_gradually(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            page = alert("firing")
            status, body = await h.post(note(page))
            assert status == 200, body
            (res,) = body["results"]
            assert (res["decision"], res["target"]) == ("act", "replica:default/r1")
            assert [a["action"] for a in res["actions"]] == ["set_weight"]
            assert h.weight("r1") == 0.25 and not h.router.is_drained("r1")
            assert await h.tick(4.9) == 0  # drain_after_s = 5
            assert await h.tick(0.2) == 1
            assert h.router.is_drained("r1") and not h.router.is_drained("r0")
            # repeat notifications (repeat_interval, HA peer) change nothing
            status, body = await h.post(note(page))
            assert body["results"][0]["decision"] == "duplicate"
            # resolved: hold-down 10 s (hysteresis), then back at 0.25, 0.5, 1.0 every 5 s
            status, body = await h.post(note(alert("resolved")))
            assert body["results"][0]["decision"] == "resolved"
            assert await h.tick(9.0) == 0 and h.router.is_drained("r1")
            assert await h.tick(1.5) == 1  # undrain (the weight was already 0.25)
            assert not h.router.is_drained("r1") and h.weight("r1") == 0.25
            assert await h.tick(2.0) == 0
            assert await h.tick(3.1) == 1 and h.weight("r1") == 0.5
            assert await h.tick(5.1) == 1 and h.weight("r1") == 1.0
            assert await h.tick(60) == 0
            states = await h.engine.journal.states()
            assert states["replica:default/r1"]["stage"] == "normal"
            assert _decisions(h) == [
                ("alert", "act", "received"), ("set_weight", "deweight", "applied"),
                ("drain", "drain", "applied"),
                ("alert", "duplicate", "received"),
                ("alert", "resolved", "received"),
                ("undrain", "restore", "applied"), ("set_weight", "restore", "applied"),
                ("set_weight", "restore", "applied"),
            ]
            rows = h.rows()
            assert all(r["latency_ms"] is not None and r["latency_ms"] >= 0 for r in rows)
            assert rows[0]["fingerprint"] == page["fingerprint"] and rows[0]["alert_status"] == "firing"
            assert rows[0]["params"]["labels"]["replica"] == "r1" and rows[0]["params"]["rule"] == "replica-page"
            assert rows[1]["params"]["request"] == {"replica": "r1", "weight": 0.25}
            assert "TtftReplicaErrorBudgetBurn/page" in rows[1]["reason"]
        # the control API audited the same changes, with the receiver as actor
        ctl = h.rows("source = 'control_api'")
        assert [(r["action"], r["actor"]) for r in ctl] == [
            ("set_weight", "alert-receiver"), ("drain", "alert-receiver"), ("undrain", "alert-receiver"),
            ("set_weight", "alert-receiver"), ("set_weight", "alert-receiver")]

    asyncio.run(main())


def test_replays_and_reordering_never_act_twice(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            a1, r1 = alert("firing", starts_min=0), alert("resolved", starts_min=0)
            # resolved arrives before its firing (reordered): the late firing is stale
            assert (await h.post(note(r1)))[1]["results"][0]["decision"] == "stale"
            assert (await h.post(note(a1)))[1]["results"][0]["decision"] == "stale"
            assert h.weight("r1") == 1.0
            # a new episode (later startsAt) acts; its replays and an old episode's replays do not
            a2 = alert("firing", starts_min=10)
            assert (await h.post(note(a2)))[1]["results"][0]["decision"] == "act"
            for body in (note(a2), note(a1), note(r1), note(a2, a2)):
                _, resp = await h.post(body)
                assert {r["decision"] for r in resp["results"]} <= {"duplicate", "stale"}, resp
            # two deliveries racing (Alertmanager HA pair): exactly one acts
            a3 = alert("firing", replica="r0", starts_min=20)
            results = await asyncio.gather(*(h.post(note(a3)) for _ in range(6)))
            decisions = sorted(b["results"][0]["decision"] for _, b in results)
            assert decisions == ["act"] + ["duplicate"] * 5
            assert h.weight("r0") == 0.25
            # resolve a2, then replay the resolve: one "resolved", then a duplicate
            r2 = alert("resolved", starts_min=10)
            assert (await h.post(note(r2)))[1]["results"][0]["decision"] == "resolved"
            assert (await h.post(note(r2)))[1]["results"][0]["decision"] == "duplicate"
            rows = h.rows()
            actions = [r for r in rows if r["action"] != "alert"]
            assert [(r["target"], r["action"]) for r in actions] == [
                ("replica:default/r1", "set_weight"), ("replica:default/r0", "set_weight")]
            # the audit log is consistent: one alert row per delivery, each with its idempotency key,
            # and every key that led to an action exactly once among the non-duplicate rows
            alert_rows = [r for r in rows if r["action"] == "alert"]
            assert len(alert_rows) == 2 + 1 + 5 + 6 + 2
            firsts = [r["dedupe_key"] for r in alert_rows if r["decision"] != "duplicate"]
            assert len(firsts) == len(set(firsts))

    asyncio.run(main())


def test_never_drains_the_last_healthy_replica(pg_dsn: str) -> None:
    async def main() -> None:
        # a pool of one: never drained (deweighted, then the drain is refused and audited once)
        async with harness(migrated(pg_dsn), replicas=("solo",)) as h:
            await h.post(note(alert("firing", replica="solo")))
            assert h.weight("solo") == 0.25
            await h.tick(6)
            await h.tick(6)
            assert not h.router.is_drained("solo")
            refused = [r for r in h.rows() if r["action"] == "drain"]
            assert len(refused) == 1 and refused[0]["outcome"] == "refused"
            assert "last healthy replica" in refused[0]["reason"]

    asyncio.run(main())


def test_drained_fraction_is_capped(pg_dsn: str) -> None:
    async def cap() -> None:
        # four replicas, max_drained_fraction 0.5: the third page only deweights
        async with harness(migrated(pg_dsn), replicas=("a", "b", "c", "d")) as h:
            for i, rid in enumerate(("a", "b", "c")):
                await h.post(note(alert("firing", replica=rid, starts_min=i)))
            await h.tick(6)
            assert [h.router.is_drained(r) for r in "abcd"] == [True, True, False, False]
            assert h.weight("c") == 0.25
            blocked = [r for r in h.rows() if r["decision"] == "blocked"]
            assert len(blocked) == 1 and "max_drained_fraction = 0.5" in blocked[0]["reason"]

    asyncio.run(cap())


def test_actions_per_target_are_rate_limited(pg_dsn: str) -> None:
    async def rate() -> None:
        tight = POLICY.replace(
            "rate_limit: {actions: 20, per_s: 60}", "rate_limit: {actions: 2, per_s: 60}")
        async with harness(migrated(pg_dsn), policy_text=tight) as h:
            await h.post(note(alert("firing")))  # deweight: 1st write
            await h.tick(6)  # drain: 2nd write
            await h.post(note(alert("resolved")))
            await h.tick(10.5)  # hold-down over, but the undrain would be the 3rd write within 60 s
            await h.tick(1)
            assert h.router.is_drained("r1")
            limited = [r for r in h.rows() if r["decision"] == "rate_limited"]
            assert len(limited) == 1 and limited[0]["outcome"] == "refused"
            applied = [r for r in h.rows() if r["action"] != "alert" and r["outcome"] == "applied"]
            assert len(applied) == 2
            await h.tick(61)  # the window has passed: the restore proceeds
            assert h.weight("r1") == 0.25 and not h.router.is_drained("r1")

    asyncio.run(rate())


def test_pool_burn_shifts_to_the_student_within_bounds_and_back(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            burn = alert("firing", replica=None, scope="pool", severity="ticket")
            _, body = await h.post(note(burn))
            assert body["results"][0]["decision"] == "act"
            assert h.distill.schedule(POOL).name == "exponential"
            assert h.distill.student_share_pct(POOL) == 10
            await h.tick(4)
            assert h.distill.student_share_pct(POOL) == 10  # step_s = 5
            await h.tick(1.1)
            assert h.distill.student_share_pct(POOL) == 20  # max_pct
            await h.tick(10)
            assert h.distill.student_share_pct(POOL) == 20
            # the forecaster's alert on the same pool joins the cause set
            fc = alert("firing", replica=None, scope="pool", severity="ticket", source="forecaster", slo="ttft",
                       alertname="TtftForecastBreach")
            assert (await h.post(note(fc)))[1]["results"][0]["decision"] == "joined"
            await h.post(note(alert("resolved", replica=None, scope="pool", severity="ticket")))
            await h.tick(20)
            assert h.distill.student_share_pct(POOL) == 20  # one cause still fires
            await h.post(note({**fc, "status": "resolved"}))
            await h.tick(9)
            assert h.distill.student_share_pct(POOL) == 20 and h.distill.schedule(POOL).name == "exponential"
            await h.tick(1.5)  # hold-down over: schedule restored, share one step down
            assert h.distill.schedule(POOL).name == "constant" and h.distill.student_share_pct(POOL) == 10
            await h.tick(5.1)
            assert h.distill.student_share_pct(POOL) == 0
            assert (await h.engine.journal.states())["pool:default"]["stage"] == "normal"
            seq = [(r["action"], r["decision"], r["outcome"]) for r in h.rows() if r["action"] != "alert"]
            assert seq == [
                ("set_temperature_schedule", "schedule", "applied"), ("set_student_share", "shift", "applied"),
                ("set_student_share", "shift", "applied"),
                ("set_temperature_schedule", "schedule_restore", "applied"),
                ("set_student_share", "unshift", "applied"), ("set_student_share", "unshift", "applied")]

    asyncio.run(main())


def test_pool_action_waits_while_a_replica_explains_the_burn(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            await h.post(note(alert("firing", replica="r1")))
            _, body = await h.post(note(alert("firing", replica=None, scope="pool")))
            assert body["results"][0]["decision"] == "deferred"
            assert h.distill.student_share_pct(POOL) == 0
            await h.post(note(alert("resolved", replica="r1")))
            await h.tick(11)
            await h.tick(5.1)
            await h.tick(5.1)  # r1 fully restored: the pool alert, still firing, is now acted on
            assert h.weight("r1") == 1.0 and h.distill.student_share_pct(POOL) == 10

    asyncio.run(main())


def test_control_api_down_is_audited_and_retried(pg_dsn: str) -> None:
    async def main() -> None:
        dead = "http://127.0.0.1:9"  # discard port: connection refused
        async with harness(migrated(pg_dsn)) as h:
            h.engine.control.urls = [dead]
            status, body = await h.post(note(alert("firing")))
            assert status == 200  # never an HTTP error for Alertmanager: the receiver owns the retry
            assert body["results"][0]["decision"] == "act"
            failed = [r for r in h.rows() if r["outcome"] == "failed"]
            assert len(failed) == 1 and "control API state unavailable" in failed[0]["reason"]
            assert await h.tick(0.5) == 0  # backoff: 1 s after the first failure
            h.engine.control.urls = [dead, h.control_url]  # failover to the second control API
            await h.tick(1.0)
            assert h.weight("r1") == 0.25
            ok = [r for r in h.rows() if r["outcome"] == "applied"]
            assert len(ok) == 1 and ok[0]["params"]["response"]["attempts"] == 2

    asyncio.run(main())


def test_state_survives_a_receiver_restart(pg_dsn: str) -> None:
    dsn = migrated(pg_dsn)

    async def main() -> None:
        clock = Clock()
        async with harness(dsn, clock=clock) as h:
            await h.post(note(alert("firing")))
            await h.tick(6)
            assert h.router.is_drained("r1")
            router = h.router
        # a new receiver process: same store, fresh memory; the control API state is what it was
        async with harness(dsn, clock=clock) as h2:
            # the new harness has a fresh router: give it the state the control API kept
            h2.router.set_weight("r1", 0.25)
            h2.router.drain("r1")
            assert (await h2.post(note(alert("firing"))))[1]["results"][0]["decision"] == "duplicate"
            await h2.post(note(alert("resolved")))
            await h2.tick(10.5)
            assert not h2.router.is_drained("r1") and h2.weight("r1") == 0.25
            await h2.tick(5.1)
            assert h2.weight("r1") == 0.5
        assert router is not None

    asyncio.run(main())


def test_store_down_answers_503_so_alertmanager_retries(pg_dsn: str) -> None:
    async def main() -> None:
        bad = PgJournal("postgresql://nobody@127.0.0.1:9/none", connect_timeout_s=1)
        async with harness(migrated(pg_dsn), journal=bad) as h:
            status, body = await h.post(note(alert("firing")))
            assert status == 503 and "store unreachable" in body["error"]["message"]
            assert h.weight("r1") == 1.0

    asyncio.run(main())


def test_control_token_is_sent(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            h.engine.control.token = CONTROL_TOKEN + "x"
            await h.post(note(alert("firing")))
            refused = [r for r in h.rows() if r["action"] == "set_weight"]
            assert refused[0]["outcome"] == "refused" and "invalid bearer token" in refused[0]["reason"]

    asyncio.run(main())


def test_concurrent_drains_respect_the_cap(pg_dsn: str) -> None:
    """Pages for three replicas of one pool at once: the drain decisions are serialised per pool."""
    drain_now = POLICY.replace("    deweight_to: 0.25\n    drain_after_s: 5\n", "    drain_after_s: 0\n")

    async def main() -> None:
        async with harness(migrated(pg_dsn), replicas=("a", "b", "c", "d"), policy_text=drain_now) as h:
            results = await asyncio.gather(*(h.post(note(alert("firing", replica=r))) for r in "abc"))
            assert all(status == 200 for status, _ in results)
            assert sum(h.router.is_drained(r) for r in "abcd") == 2
            outcomes = sorted(r["outcome"] for r in h.rows() if r["action"] == "drain")
            assert outcomes == ["applied", "applied", "refused"]

    asyncio.run(main())


def test_default_policy_answers_a_long_forecast_slowly_and_a_short_one_by_routing(pg_dsn: str) -> None:
    """The built-in policy: a forecaster warning minutes ahead moves a share of the pool to the
    student; one seconds ahead deweights the replica (docs/alerting.md, forecaster horizons)."""
    from importlib import resources

    text = (resources.files("llmsla.alerting") / "policy.default.yaml").read_text()

    async def main() -> None:
        async with harness(migrated(pg_dsn), policy_text=text) as h:
            long = alert("firing", replica="r1", severity="ticket", source="forecaster",
                         alertname="LLMSLAForecastDegradation", horizon="5m")
            _, body = await h.post(note(long))
            assert body["results"][0]["decision"] == "act", body
            assert h.distill.student_share_pct(POOL) == 10 and h.weight("r1") == 1.0  # not re-routed
            short = alert("firing", replica="r0", severity="ticket", source="forecaster",
                          alertname="LLMSLAForecastDegradation", horizon="30s", fp="short")
            _, body = await h.post(note(short))
            assert body["results"][0]["decision"] == "act", body
            assert h.weight("r0") == 0.5 and h.distill.student_share_pct(POOL) == 10

    asyncio.run(main())
