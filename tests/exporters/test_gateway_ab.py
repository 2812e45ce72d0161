"""A/B arms through the real gateway: each unit's arm (response header, RequestEvent, metrics)
is the rollout's consistent-hash assignment, computed independently here; each arm's strategy
(pool, student share, temperature schedule) reaches its traffic; a rollback through the control
API moves only that arm's units and is audited in the store's action_log. Real workers, gateway,
control API and PostgreSQL."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import aiohttp
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import experiments as E
from llmsla import names
from llmsla.app import wiring
from llmsla.config import ConfigError
from llmsla.control import api
from llmsla.control.audit import AuditLog
from llmsla.control.rollout import Rollout
from llmsla.exporters import gateway as gw_mod
from llmsla.spool import BadLine, published_segments, read_segment
from llmsla.store import connect
from llmsla.store.migrate import migrate
from llmsla.worker.server import WorkerThread

TOKEN = "ab-token-gateway-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
N = 240
EXPERIMENTS = {"exp": {
    "seed": 99, "coverage": 0.75,
    "arms": {
        "base": {"weight": 1},
        "stud": {"weight": 1, "student_share_pct": 100},
        "canary": {"weight": 1, "pool": "canary", "version": "2", "route_policy": "least_outstanding",
                   "schedule": {"name": "cosine", "params": {"t_min": 0.2, "t_max": 0.9, "horizon": 4}}},
    },
    "forced": {"qa-user": "canary"},
}}


def _requests(spool: Path) -> list:
    out = []
    for seg in published_segments(spool, names.SPOOL_REQUESTS):
        for ev in read_segment(seg, names.SPOOL_REQUESTS):
            assert not isinstance(ev, BadLine), str(ev)
            out.append(ev)
    return out


def test_arms_label_route_and_roll_back(tmp_path: Path, pg_dsn: str) -> None:
    cfg = config_mod.load(env={"LLMSLA_AB_EXPERIMENTS": __import__("json").dumps(EXPERIMENTS)})
    cfg.store.dsn = pg_dsn
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.spool.segment_max_age_s = 0.2
    cfg.control.route_policy = "round_robin"
    cfg.worker.max_tokens = 4
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
    reference = Rollout(E.parse(EXPERIMENTS))  # the test's own assignment, from the same spec
    registry = CollectorRegistry()
    audit = AuditLog(pg_dsn)
    with WorkerThread(cfg) as teacher, WorkerThread(cfg) as student, WorkerThread(cfg) as canary:
        cfg.gateway.upstreams, cfg.gateway.student_upstreams = [teacher.url], [student.url]
        cfg.gateway.pools = [f"canary={canary.url}"]

        async def main() -> tuple[dict, dict, str]:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry, audit=audit) as gw:
                g = gw.gateway
                control = await api.start(api.make_app(g.router, g.distill, token=TOKEN, rollout=g.rollout))
                seen: dict[str, dict[str, tuple[str, str, str | None]]] = {}
                try:
                    async with aiohttp.ClientSession() as s:
                        async def phase(name: str, units: list[str]) -> None:
                            sem = asyncio.Semaphore(16)

                            async def one(u: str) -> tuple[str, tuple[str, str, str | None]]:
                                # half the units by the OpenAI "user" field, half by the session header
                                by_user = sum(map(ord, u)) % 2 == 0
                                req = {"model": cfg.worker.model, "prompt": "hi", "max_tokens": 2,
                                       **({"user": u} if by_user else {})}
                                headers = {} if by_user else {names.UNIT_HEADER: u}
                                async with sem, s.post(gw.url + "/v1/completions", json=req, headers=headers) as r:
                                    await r.read()
                                    assert r.status == 200
                                    return u, (r.headers[names.ARM_HEADER], r.headers[gw_mod.REPLICA_HEADER],
                                               r.headers.get(names.ARM_VERSION_HEADER))

                            seen[name] = dict(await asyncio.gather(*(one(u) for u in units)))

                        units = [f"user-{i}" for i in range(N)] + ["qa-user"]
                        await phase("before", units)
                        async with s.post(control.url + "/v1/experiments/exp/arms/canary/weight",
                                          json={"weight": 0, "reason": "p95 regression"}, headers=AUTH) as r:
                            assert r.status == 200, await r.text()
                        async with s.post(control.url + "/v1/experiments/exp/arms/base/weight",
                                          json={"weight": 3}, headers=AUTH) as r:
                            assert r.status == 409 and "configured weight" in (await r.json())["error"]["message"]
                        async with s.post(control.url + "/v1/experiments/nope/coverage", json={"coverage": 0.5},
                                          headers=AUTH) as r:
                            assert r.status == 404
                        await phase("after", units)
                        async with s.get(control.url + "/v1/experiments") as r:
                            state = (await r.json())["experiments"]
                        async with s.get(gw.url + "/metrics") as r:
                            metrics = await r.text()
                finally:
                    await control.stop()
                return seen, state, metrics

        seen, state, metrics = asyncio.run(main())
    assert audit.flush(10)
    replica_of = {"base": "r0", "stud": "r1", "canary": "r2", None: "r0"}
    arms = collections.Counter()
    for u, (label, replica, version) in seen["before"].items():
        a = reference.assign("default", u)
        assert label == a.label, u
        assert replica == replica_of[a.arm], (u, a.arm, replica)  # the arm's pool / student share
        assert version == ("2" if a.arm == "canary" else None)
        arms[a.arm] += 1
    assert seen["before"]["qa-user"][0] == "exp:canary:forced"
    assert min(arms[a] for a in ("base", "stud", "canary")) > N / 8 and arms[None] > 0  # all kinds present
    # the rollback: canary units leave the experiment (the pool's own strategy), nobody else moves
    for u, (label, replica, _) in seen["after"].items():
        before = seen["before"][u][0]
        if before == "exp:canary":
            assert (label, replica) == (names.DEFAULT_ARM, "r0")
        else:
            assert label == before, u
    assert state["exp"]["arms"]["canary"]["weight"] == 0 and state["exp"]["arms"]["canary"]["configured_weight"] == 1
    assert f'{names.ROLLOUT_ARM_WEIGHT}{{arm="canary",experiment="exp"}} 0.0' in metrics
    # RequestEvents carry the arm label, the serving pool and the arm's schedule
    events = _requests(Path(cfg.spool.dir))
    assert len(events) == 2 * len(seen["before"])
    canary_events = [e for e in events if e.arm in ("exp:canary", "exp:canary:forced")]
    assert canary_events and {e.pool for e in canary_events} == {"canary"}
    assert {e.policy for e in canary_events} == {"cosine"}  # the worker ran the arm's schedule
    assert {e.pool for e in events if e.arm not in ("exp:canary", "exp:canary:forced")} == {"default"}
    by_arm = collections.Counter(e.arm for e in events)
    assert (f'{names.REQUESTS}_total{{arm="exp:stud",class="{names.DEFAULT_CLASS}",model="{cfg.worker.model}",'
            f'pool="default",replica="r1",status="ok",tenant="{names.DEFAULT_TENANT}"}} {float(by_arm["exp:stud"])}') in metrics
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT action, target, outcome, reason, params FROM {names.T_ACTION_LOG} ORDER BY id").fetchall()
    assert ("set_arm_weight", "exp/canary", "applied", "p95 regression") in [r[:4] for r in rows]
    assert ("set_arm_weight", "exp/base", "refused") in [r[:3] for r in rows]
    applied = next(r for r in rows if r[2] == "applied")
    assert applied[4]["before"] == 1 and applied[4]["after"] == 0


def test_an_arm_pool_without_replicas_is_a_config_error() -> None:
    spec = {"exp": {"arms": {"a": {}, "b": {"pool": "nowhere"}}}}
    cfg = config_mod.load(env={"LLMSLA_AB_EXPERIMENTS": __import__("json").dumps(spec)})
    cfg.gateway.upstreams = ["http://127.0.0.1:1"]
    with pytest.raises(ConfigError, match=r"ab\.experiments\.exp\.arms\.b\.pool: pool 'nowhere' has no replicas here"):
        wiring.gateway(cfg, registry=CollectorRegistry())
    cfg.gateway.pools = ["nowhere-http://x"]
    with pytest.raises(ConfigError, match=r"gateway\.pools.*expected pool=http"):
        wiring.gateway(cfg, registry=CollectorRegistry())
