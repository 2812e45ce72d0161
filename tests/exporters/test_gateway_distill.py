"""The control plane reaches traffic: a pool's student share moves the student fraction of the
gateway's requests (deterministically per unit), and a pool's temperature schedule is applied
by the worker (RequestEvents and PolicyEvents name it). Real workers, gateway and control API."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.control import api
from llmsla.exporters import gateway as gw_mod
from llmsla.spool import BadLine, published_segments, read_segment
from llmsla.worker.server import WorkerThread

TOKEN = "distill-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
N = 300  # requests per phase, each from its own unit (the OpenAI "user" field)


def _events(spool: Path, kind: str) -> list:
    out = []
    for seg in published_segments(spool, kind):
        for ev in read_segment(seg, kind):
            assert not isinstance(ev, BadLine), str(ev)
            out.append(ev)
    return out


def test_student_share_and_schedule_reach_traffic(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.spool.segment_max_age_s = 0.2
    cfg.control.route_policy = "round_robin"
    cfg.control.max_share_step_pct = 20
    cfg.worker.max_tokens = 8
    registry = CollectorRegistry()
    with WorkerThread(cfg) as teacher, WorkerThread(cfg) as student:
        cfg.gateway.upstreams, cfg.gateway.student_upstreams = [teacher.url], [student.url]

        async def main() -> tuple[dict[str, dict[str, str]], str]:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw:
                g = gw.gateway
                control = await api.start(api.make_app(g.router, g.distill, token=TOKEN))
                sides: dict[str, dict[str, str]] = {}
                try:
                    async with aiohttp.ClientSession() as s:
                        async def phase(name: str, users: range, body: dict | None = None) -> None:
                            sem = asyncio.Semaphore(16)

                            async def one(u: int) -> tuple[str, str]:
                                req = {"model": cfg.worker.model, "prompt": "hi", "max_tokens": 4,
                                       "user": f"user-{u}", **(body or {})}
                                async with sem, s.post(gw.url + "/v1/completions", json=req) as r:
                                    await r.read()
                                    assert r.status == 200
                                    return f"user-{u}", r.headers[gw_mod.REPLICA_HEADER]

                            sides[name] = dict(await asyncio.gather(*(one(u) for u in users)))

                        async def control_post(path: str, body: dict) -> None:
                            async with s.post(control.url + path, json=body, headers=AUTH) as r:
                                assert r.status == 200, await r.text()

                        await phase("share0", range(N))
                        await control_post("/v1/pools/default/student_share", {"pct": 20})
                        await phase("share20", range(N))
                        await phase("share20-again", range(N))  # the same units: the same sides
                        await control_post("/v1/pools/default/student_share", {"pct": 40})
                        await phase("share40", range(N))
                        await control_post("/v1/pools/default/temperature_schedule",
                                           {"name": "cosine", "params": {"t_min": 0.2, "t_max": 0.9, "horizon": 4}})
                        await phase("cosine", range(N, N + 40), {"llmsla_policy": "entropy"})
                        async with s.get(gw.url + "/metrics") as r:
                            metrics = await r.text()
                finally:
                    await control.stop()
                return sides, metrics

        sides, metrics = asyncio.run(main())
    teacher_id, student_id = "r0", "r1"
    assert set(sides["share0"].values()) == {teacher_id}  # share 0: every request to the teacher
    for phase, pct in (("share20", 20), ("share40", 40)):
        k = sum(r == student_id for r in sides[phase].values())
        p = pct / 100
        sd = math.sqrt(N * p * (1 - p))
        assert abs(k - N * p) <= 4 * sd, (phase, k)  # binomial: hashed units behave like coin flips
    assert sides["share20-again"] == sides["share20"]  # deterministic per unit
    moved_back = [u for u, r in sides["share20"].items() if r == student_id and sides["share40"][u] != student_id]
    assert moved_back == []  # raising the share only moves units teacher -> student
    assert f'{names.DISTILL_STUDENT_SHARE_RATIO}{{pool="default"}} 0.4' in metrics
    assert f'{names.ROUTER_PICKS}_total{{pool="default",replica="{student_id}"}}' in metrics

    spool = Path(cfg.spool.dir)
    requests = _events(spool, names.SPOOL_REQUESTS)
    assert len(requests) == 4 * N + 40
    cosine_reqs = [e for e in requests if e.policy == "cosine"]
    assert len(cosine_reqs) == 40  # the pool's schedule beat the request's own llmsla_policy
    decisions = [e for e in _events(spool, names.SPOOL_POLICY) if e.trace_id in {r.trace_id for r in cosine_reqs}]
    assert decisions and {d.policy_id for d in decisions} == {"cosine"}
    for d in decisions:  # cosine from t_max 0.9 down to t_min 0.2 over a 4-step horizon
        expected = 0.2 + (0.9 - 0.2) * (1 + math.cos(math.pi * min(d.step, 4) / 4)) / 2
        assert math.isclose(d.temperature, expected, rel_tol=1e-9, abs_tol=1e-12), d
