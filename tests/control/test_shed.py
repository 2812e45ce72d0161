"""Load shedding over the real control API on 127.0.0.1: validation with reasons, the protected
class, the deterministic share, audit rows in the store, and the change reaching a second
router through a real redis-server."""

from __future__ import annotations

import asyncio

import aiohttp
import psycopg

from llmsla import config as config_mod
from llmsla import names
from llmsla.control import api
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.router import Replica, Router
from llmsla.control.shared_state import RedisSharedState
from llmsla.control.shed import ShedControls
from llmsla.store.connection import connect
from llmsla.store.migrate import migrate

TOKEN = "s3cret-token-shed-api-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLASSES = ("interactive", "batch", "sheddable")


def test_shares_are_exact_over_any_run_of_requests() -> None:
    shed = ShedControls(CLASSES, ["p"])
    shed.set_shares("p", {"batch": 0.5, "sheddable": 0.3}, actor="t")
    for n in (1, 2, 7, 10, 99, 1000):
        got = [shed.sheds("p", "batch") for _ in range(n)]
        assert abs(sum(got) - n * 0.5) <= 1, (n, sum(got))
    got = [shed.sheds("p", "sheddable") for _ in range(1000)]
    assert sum(got) == 300  # not a coin flip: exactly the share
    assert all(sum(got[i:i + 10]) == 3 for i in range(0, 1000, 10))  # spread evenly, not in bursts
    assert not any(shed.sheds("p", "interactive") for _ in range(100))
    assert not any(shed.sheds("other-pool", "batch") for _ in range(100))
    shed.set_shares("p", {"batch": 0}, actor="t")
    assert not any(shed.sheds("p", "batch") for _ in range(100)) and shed.active  # sheddable still shed
    shed.set_shares("p", {"sheddable": 0.0}, actor="t")
    assert not shed.active


def _app(dsn: str = "") -> tuple[ShedControls, aiohttp.web.Application]:
    router = Router([Replica("r0", "default"), Replica("b0", "solo")], "round_robin")
    audit = AuditLog(dsn)
    distill = DistillControls(router.pools(), audit=audit)
    shed = ShedControls(CLASSES, router.pools(), audit=audit, router=router)
    return shed, api.make_app(router, distill, token=TOKEN, shed=shed)


def test_bad_requests_are_refused_with_a_reason_and_change_nothing(pg_dsn: str) -> None:
    with connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, config_mod.load(env={}))

    async def main() -> None:
        shed, app = _app(pg_dsn)
        served = await api.start(app, "127.0.0.1", 0)
        url = served.url + "/v1/pools/default/shed"
        try:
            async with aiohttp.ClientSession() as s:
                async def put(body: object, status: int, headers: dict[str, str] | None = None,
                              path: str = url) -> dict:
                    async with s.put(path, json=body, headers=AUTH if headers is None else headers) as r:
                        payload = await r.json()
                        assert r.status == status, (body, payload)
                        return payload

                for headers in ({}, {"Authorization": "Bearer wrong-token-for-shedding"}):
                    await put({"classes": {"batch": 1.0}}, 401, headers)
                cases = [
                    ({"classes": {"gold": 0.5}}, 400, "unknown class 'gold'"),
                    ({"classes": {"batch": 1.5}}, 400, "classes.batch: expected a share in [0, 1], got 1.5"),
                    ({"classes": {"batch": -0.1}}, 400, "expected a share in [0, 1]"),
                    ({"classes": {"batch": "half"}}, 400, "expected a share in [0, 1], got 'half'"),
                    ({"classes": {"batch": True}}, 400, "expected a share in [0, 1], got True"),
                    ({"classes": ["batch"]}, 400, "expected an object of class -> share"),
                    ({}, 400, "missing field 'classes'"),
                    ({"classes": {"batch": 0.5}, "pool": "x"}, 400, "unknown field(s) ['pool']"),
                    ({"classes": {"interactive": 0.5, "batch": 0.5}}, 409, "most protected class"),
                ]
                for body, status, reason in cases:
                    err = await put(body, status)
                    assert reason in err["error"]["message"], (body, err)
                err = await put({"classes": {"batch": 0.5}}, 404, path=served.url + "/v1/pools/nope/shed")
                assert "unknown pool 'nope'" in err["error"]["message"]
                assert not shed.active  # nothing changed by any of them

                ok = await put({"classes": {"batch": 0.5, "sheddable": 1.0}, "actor": "sre", "reason": "drill"}, 200)
                assert ok["classes"] == {"batch": 0.5, "sheddable": 1.0} and ok["protected"] == "interactive"
                await put({"classes": {"interactive": 0}}, 200)  # 0 for the protected class is a no-op
                async with s.get(url) as r:  # reads are open
                    view = await r.json()
                assert view == {"pool": "default", "classes": {"batch": 0.5, "sheddable": 1.0},
                                "order": list(CLASSES), "protected": "interactive"}
                async with s.get(served.url + "/v1/pools/nope/shed") as r:
                    assert r.status == 404
                async with s.get(served.url + "/v1/state") as r:
                    state = await r.json()
                assert state["shed"]["pools"]["default"] == {"batch": 0.5, "sheddable": 1.0}
                assert state["shed"]["classes"] == list(CLASSES)
                async with s.get(served.url + "/metrics") as r:
                    metrics = await r.text()
                assert f'{names.SHED_SHARE_RATIO}{{class="batch",pool="default"}} 0.5' in metrics
        finally:
            await served.stop()
        assert shed.audit.flush(10)

    asyncio.run(main())
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT actor, action, target, outcome, reason, params FROM {names.T_ACTION_LOG} "
                            "WHERE action = 'set_shed' ORDER BY id").fetchall()
    assert [(a, act, t, o) for a, act, t, o, _r, _p in rows] == [
        ("api", "set_shed", "default", "refused"),  # the protected class, audited
        ("sre", "set_shed", "default", "applied"),
        ("api", "set_shed", "default", "applied"),
    ]
    assert rows[1][4] == "drill"
    assert rows[1][5]["before"] == {} and rows[1][5]["after"] == {"batch": 0.5, "sheddable": 1.0}


def test_a_change_on_one_gateway_reaches_another_through_redis(redis_service) -> None:
    url = redis_service.extra["url"]
    with RedisSharedState(url, gateway_id="gw-a") as sa, RedisSharedState(url, gateway_id="gw-b") as sb:
        a = Router([Replica("r0", "default")], "round_robin", shared=sa)
        b = Router([Replica("r0", "default")], "round_robin", shared=sb)
        shed_a = ShedControls(CLASSES, ["default"], router=a)
        shed_b = ShedControls(CLASSES, ["default"], router=b)
        shed_a.set_shares("default", {"batch": 0.25, "sheddable": 1.0}, actor="t")
        assert sa.sync_once() and sb.sync_once()
        b.apply_shared_ops()  # what the gateway does before its shedding check
        assert shed_b.snapshot()["pools"]["default"] == {"batch": 0.25, "sheddable": 1.0}
        assert [shed_b.sheds("default", "batch") for _ in range(8)].count(True) == 2
        assert shed_b.audit.recent() == []  # audited once, where the change was made
        shed_b.set_shares("default", {"batch": 0.0}, actor="t")  # and back the other way
        assert sb.sync_once() and sa.sync_once()
        a.apply_shared_ops()
        assert shed_a.snapshot()["pools"]["default"] == {"sheddable": 1.0}
        assert not any(shed_a.sheds("default", "batch") for _ in range(10))
        with RedisSharedState(url, gateway_id="gw-c") as sc:  # started later: replays the log
            c = Router([Replica("r0", "default")], "round_robin", shared=sc)
            shed_c = ShedControls(CLASSES, ["default"], router=c)
            assert sc.sync_once()
            c.apply_shared_ops()
            assert shed_c.snapshot()["pools"]["default"] == {"sheddable": 1.0}
        # a gateway configured with other classes skips what it cannot apply, and keeps working
        with RedisSharedState(url, gateway_id="gw-d") as sd:
            d = Router([Replica("r0", "default")], "round_robin", shared=sd)
            shed_d = ShedControls(("gold", "bronze"), ["default"], router=d)
            assert sd.sync_once()
            d.apply_shared_ops()
            assert shed_d.snapshot()["pools"]["default"] == {} and d.snapshot()["shared_ops_skipped"] == 2
