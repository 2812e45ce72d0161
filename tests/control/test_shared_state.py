"""Router stats shared through a real redis-server, and graceful degradation when it stops."""

from __future__ import annotations

import random
import time

from prometheus_client import CollectorRegistry

from llmsla import names, services
from llmsla.control.distill import DistillControls
from llmsla.control.router import Replica, Router
from llmsla.control.shared_state import RedisSharedState


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> float:
        return self.ms / 1000.0


def _replicas() -> list[Replica]:
    return [Replica("r0", "default"), Replica("r1", "default")]


def test_two_routers_share_stats(redis_service):
    url = redis_service.extra["url"]
    ca, cb = Clock(), Clock()
    with RedisSharedState(url, gateway_id="gw-a") as sa, RedisSharedState(url, gateway_id="gw-b") as sb:
        a = Router(_replicas(), "ladr", clock=ca, shared=sa, theta=0.0, rng=random.Random(1))
        b = Router(_replicas(), "ladr", clock=cb, shared=sb, theta=0.0, rng=random.Random(2))
        # gateway A saw r0 slow and busy, r1 fast; gateway B saw nothing at all
        a.end("r0", 1000.0)
        a.end("r1", 100.0)
        for _ in range(5):
            a.begin("r0")
        a.refresh()
        assert sa.sync_once() and sa.healthy
        assert sb.sync_once()  # what start() does: connect before the first refresh
        b.refresh()
        assert sb.sync_once()
        cb.ms += 5000  # B's own knowledge is stale now; only A's reports keep the replicas fresh
        b.refresh()
        snap = {x["id"]: x for x in b.snapshot()["pools"]["default"]}
        assert snap["r0"]["queue"] == 5 and snap["r0"]["avg_latency_ms"] == 1000.0
        assert snap["r1"]["queue"] == 0 and snap["r1"]["avg_latency_ms"] == 100.0
        assert snap["r0"]["fresh"] and snap["r1"]["fresh"]
        # independent expectation (docs/control.md): scores 1 * 100/1000 - 1 * 5/2.5 = -1.9 and
        # 1 * 100/100 - 0 = 1; exp(8 * -1.9) is far below the 1 % floor -> r1 gets 1 / 1.01
        picks = [b.pick("default").id for _ in range(4000)]
        assert abs(picks.count("r1") / 4000 - 1 / 1.01) < 0.005
        assert sb.describe()["peers"] == ["gw-a"]
        # B's own outstanding adds to A's: the queue is the fleet-wide total
        b.begin("r1")
        b.begin("r1")
        cb.ms += 200
        b.refresh()
        sa.sync_once()
        sb.sync_once()  # writes B's outstanding=2 for r1
        a.refresh()
        sa.sync_once()
        ca.ms += 200
        a.refresh()
        assert {x["id"]: x["queue"] for x in a.snapshot()["pools"]["default"]} == {"r0": 5.0, "r1": 2.0}
        assert b.metrics.fallback._value.get() == 0


def test_operator_actions_reach_every_gateway(redis_service):
    url = redis_service.extra["url"]
    reps3 = lambda: [Replica("r0", "default"), Replica("r1", "default"), Replica("r2", "default")]  # noqa: E731
    with RedisSharedState(url, gateway_id="gw-a") as sa, RedisSharedState(url, gateway_id="gw-b") as sb:
        a = Router(reps3(), "ladr", shared=sa)
        b = Router(reps3(), "ladr", shared=sb)
        a.drain("r0")
        a.set_weight("r1", 3.0)
        a.set_params(alpha=2.5, policy="p2c")
        assert sa.sync_once() and sb.sync_once()
        assert b.pick("default").id != "r0"  # the pick applies the actions first
        assert b.is_drained("r0") and b.replica("r1").weight == 3.0
        assert b.policy == "p2c" and b.params["alpha"] == 2.5
        # the other direction, and the last-healthy rule still holds per gateway
        b.undrain("r0")
        b.drain("r2")
        assert sb.sync_once() and sa.sync_once()
        a.pick("default")
        assert not a.is_drained("r0") and a.is_drained("r2")
        # a gateway started later replays the log and ends in the same state
        with RedisSharedState(url, gateway_id="gw-c") as sc:
            c = Router(reps3(), "ladr", shared=sc)
            assert sc.sync_once()
            snap = c.snapshot()
        state = {x["id"]: (x["drained"], x["weight"]) for x in snap["pools"]["default"]}
        assert state == {"r0": (False, 1.0), "r1": (False, 3.0), "r2": (True, 1.0)}
        assert snap["policy"] == "p2c" and snap["params"]["alpha"] == 2.5
        assert snap["shared_ops_skipped"] == 0 and snap["shared_ops_applied"] == 5
        # distillation changes ride the same log
        da = DistillControls(["default"], max_share_step_pct=10, router=a)
        db = DistillControls(["default"], router=b)
        da.set_student_share("default", 30, actor="alice")  # clamped to 10 on A ...
        da.set_schedule("default", "cosine", {"t_max": 1.3}, actor="alice")
        assert sa.sync_once() and sb.sync_once()
        b.pick("default")
        assert db.student_share_pct("default") == 10  # ... and B gets the applied value, not the ask
        assert db.schedule("default").name == "cosine" and db.schedule("default").params["t_max"] == 1.3
        assert db.audit.recent() == []  # audited once, where the action was taken
        # an op for a replica this gateway does not have is skipped, not fatal
        a.add_replica(Replica("only-a", "default"))
        a.drain("only-a")
        assert sa.sync_once() and sb.sync_once()
        b.pick("default")
        assert b.snapshot()["shared_ops_skipped"] == 1


def _pick_for(router: Router, seconds: float) -> int:
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        assert router.pick("default").id in ("r0", "r1")
        n += 1
        time.sleep(0.002)
    return n


def test_redis_down_falls_back_and_recovers(redis_service, tmp_path):
    url = redis_service.extra["url"]
    reg = CollectorRegistry()
    sa = RedisSharedState(url, gateway_id="gw-a", interval_s=0.05, timeout_s=0.1).start()
    sb = RedisSharedState(url, gateway_id="gw-b", interval_s=0.05, timeout_s=0.1).start()
    restarted = None
    try:
        a = Router(_replicas(), "ladr", shared=sa, registry=reg, refresh_s=0.05)
        b = Router(_replicas(), "ladr", shared=sb, refresh_s=0.05)
        for r in (a, b):
            r.end("r0", 100.0)
            r.end("r1", 120.0)
        _pick_for(a, 0.3)
        _pick_for(b, 0.3)
        assert sa.healthy and sb.describe()["peers"] == ["gw-a"]
        fallback = names.ROUTER_FALLBACK + "_total"
        assert reg.get_sample_value(fallback) == 0

        redis_service.stop()
        for r in (a, b):  # keep replicas fresh through probes while Redis is away
            r.observe("r0")
            r.observe("r1")
        a.set_weight("r1", 4.0)  # an operator action while Redis is away: applies locally now
        assert a.replica("r1").weight == 4.0
        picked = _pick_for(a, 0.6)  # every pick must still succeed
        assert picked > 50
        assert not sa.healthy and sa.failures > 0 and "Error" in sa.last_error
        n_fallback = reg.get_sample_value(fallback)
        assert n_fallback is not None and n_fallback > 0 and a.fallbacks == n_fallback

        restarted = services.start_redis(tmp_path / "redis2", port=redis_service.port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (sa.healthy and sb.healthy and "gw-a" in sb.describe()["peers"]):
            a.observe("r0")
            _pick_for(a, 0.05)
            _pick_for(b, 0.05)
        assert sa.healthy and sb.healthy
        assert sb.describe()["peers"] == ["gw-a"]  # stats flow again after the restart
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b.replica("r1").weight != 4.0:
            _pick_for(b, 0.05)
        assert b.replica("r1").weight == 4.0  # ... and the action taken during the outage arrives
        after = reg.get_sample_value(fallback)
        _pick_for(a, 0.3)
        assert reg.get_sample_value(fallback) == after  # no more fallbacks once recovered
    finally:
        sa.close()
        sb.close()
        if restarted is not None:
            restarted.stop()


def test_hung_redis_never_slows_a_pick(redis_service):
    """SIGSTOP redis: syncs time out (100 ms each), yet picks stay microseconds-fast."""
    import os
    import signal

    sa = RedisSharedState(redis_service.extra["url"], gateway_id="gw-a", interval_s=0.05, timeout_s=0.1).start()
    try:
        a = Router(_replicas(), "ladr", shared=sa, refresh_s=0.05)
        a.end("r0", 100.0)
        a.end("r1", 100.0)
        os.kill(redis_service.proc.pid, signal.SIGSTOP)
        try:
            worst, n, end = 0.0, 0, time.monotonic() + 0.8
            while time.monotonic() < end:
                a.observe("r0")
                t0 = time.perf_counter()
                a.pick("default")
                worst = max(worst, time.perf_counter() - t0)
                n += 1
                time.sleep(0.001)
            assert not sa.healthy and "Timeout" in sa.last_error
            assert a.fallbacks > 0
            # a pick that waited on Redis would take >= the 100 ms socket timeout
            assert worst < 0.03, worst
        finally:
            os.kill(redis_service.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not sa.healthy:
            time.sleep(0.02)
        assert sa.healthy
    finally:
        sa.close()
