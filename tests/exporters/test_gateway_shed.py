"""Load shedding at the gateway, against two real gateways sharing one redis-server, the
reference worker and the control API over loopback HTTP: a shed class is answered 429
``shed_by_slo`` with ``Retry-After`` before its body is read, exactly its share of requests is
shed, the protected class never is, the change made on one gateway's control API reaches the
other, and a shed request records no RequestEvent (it is counted in its own counter)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from llmsla import httpkit, names
from llmsla.app import wiring
from llmsla.control import api
from llmsla.spool import published_segments, read_segment
from llmsla.worker import server as worker_mod
from tests.worker._worker_util import MODEL, worker_cfg

TOKEN = "shed-token-for-gateway-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
N = 200


async def _post(s: aiohttp.ClientSession, url: str, cls: str) -> tuple[int, dict, CIMultiDict[str]]:
    async with s.post(url + "/v1/completions", json=BODY, headers={names.CLASS_HEADER: cls}) as r:
        return r.status, json.loads(await r.read()), r.headers.copy()


async def _statuses(s: aiohttp.ClientSession, url: str, cls: str, n: int = N) -> list[int]:
    sem = asyncio.Semaphore(8)

    async def one() -> int:
        async with sem:
            return (await _post(s, url, cls))[0]

    return list(await asyncio.gather(*(one() for _ in range(n))))


def test_shed_classes_get_429_on_every_gateway_with_the_exact_share(tmp_path: Path, redis_service) -> None:
    cfg = worker_cfg(tmp_path)
    cfg.spool.segment_max_age_s = 0.2
    cfg.control.route_policy = "round_robin"
    cfg.control.redis_url = redis_service.extra["url"]
    cfg.control.token = TOKEN
    regs = (CollectorRegistry(), CollectorRegistry())

    async def main() -> dict:
        out: dict = {}
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=regs[0]) as ga, \
                    wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=regs[1], spool=None) as gb:
                plane = ga.gateway.plane
                control = await api.start(api.make_app(plane.router, plane.distill, token=TOKEN,
                                                       rollout=plane.rollout, shed=plane.shed))
                try:
                    async with aiohttp.ClientSession() as s:
                        async with s.put(control.url + "/v1/pools/default/shed", headers=AUTH,
                                         json={"classes": {"batch": 0.5, "sheddable": 1.0}, "reason": "test"}) as r:
                            assert r.status == 200, await r.text()
                        # B learns it through Redis: poll with shed-class requests until B refuses
                        async with asyncio.timeout(5):
                            while (await _post(s, gb.url, "sheddable"))[0] != 429:
                                await asyncio.sleep(0.05)
                        status, err, headers = await _post(s, gb.url, "sheddable")
                        out["shape"] = (status, err, headers)
                        for name, gw in (("a", ga), ("b", gb)):
                            out[name] = {c: await _statuses(s, gw.url, c) for c in ("interactive", "batch", "sheddable")}
                        # refused before the body is read: a head whose body never comes is answered
                        host, port = gb.url.split("//")[1].split(":")
                        rd, wr = await asyncio.open_connection(host, int(port))
                        wr.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 f"{names.CLASS_HEADER}: sheddable\r\nContent-Length: 100000\r\n\r\n{{".encode())
                        await wr.drain()
                        async with asyncio.timeout(httpkit.LINGER_S + 3.0):
                            out["unread"] = await rd.readuntil(b"\r\n\r\n")
                        wr.close()
                        # shedding stops: everyone is served again, on both gateways
                        async with s.put(control.url + "/v1/pools/default/shed", headers=AUTH,
                                         json={"classes": {"batch": 0, "sheddable": 0}}) as r:
                            assert r.status == 200
                        async with asyncio.timeout(5):
                            while (await _post(s, gb.url, "sheddable"))[0] != 200:
                                await asyncio.sleep(0.05)
                        out["after"] = {name: await _statuses(s, gw.url, "batch", 20) for name, gw in (("a", ga), ("b", gb))}
                finally:
                    await control.stop()
        return out

    out = asyncio.run(main())
    status, err, headers = out["shape"]
    assert status == 429 and headers["Retry-After"] == "30"
    assert err["error"]["code"] == names.REASON_SHED_BY_SLO and err["error"]["type"] == "gateway_error"
    assert "class 'sheddable'" in err["error"]["message"] and "pool 'default'" in err["error"]["message"]
    assert "X-Request-Id" in headers
    for name in ("a", "b"):
        got = out[name]
        assert got["interactive"].count(200) == N  # the protected class is never shed
        assert got["batch"].count(429) == N // 2 and got["batch"].count(200) == N // 2  # exactly the share
        assert got["sheddable"].count(429) == N
    assert out["unread"].startswith(b"HTTP/1.1 429")
    assert out["after"] == {"a": [200] * 20, "b": [200] * 20}
    # counted per pool and class on the gateway that refused them
    shed_a = regs[0].get_sample_value(names.GATEWAY_SHED + "_total", {"pool": "default", "class": "batch"})
    assert shed_a == N // 2
    assert regs[0].get_sample_value(names.GATEWAY_SHED + "_total", {"pool": "default", "class": "interactive"}) is None
    # A's spool: only the served requests are events; a shed one never named a model (body unread)
    served_a = sum(s.count(200) for s in out["a"].values()) + 20
    events = [ev for seg in published_segments(Path(cfg.spool.dir), names.SPOOL_REQUESTS)
              for ev in read_segment(seg, names.SPOOL_REQUESTS)]
    assert len(events) == served_a
    assert {ev.status for ev in events} == {names.STATUS_OK}
    assert {ev.class_ for ev in events} == {"interactive", "batch"}
