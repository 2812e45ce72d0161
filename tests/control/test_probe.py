"""Health probes over real HTTP keep idle replicas in LADR's choice and push dead ones out."""

from __future__ import annotations

import asyncio
import collections

import aiohttp
from aiohttp import web

from llmsla import services
from llmsla.control.probe import HealthProber
from llmsla.control.router import Replica, Router


async def _replica_server(status: int, body: dict) -> tuple[web.AppRunner, str]:
    """A real HTTP server answering /healthz like the reference worker does."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = services.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_probes_keep_idle_replicas_fresh_and_drop_dead_ones():
    async def main():
        up, up_url = await _replica_server(200, {"status": "ok", "waiting": 3, "running": 2})
        sick, sick_url = await _replica_server(503, {"status": "overloaded"})
        dead_url = f"http://127.0.0.1:{services.free_port()}"  # nothing listens there
        router = Router([Replica("up", "default", url=up_url), Replica("sick", "default", url=sick_url),
                         Replica("dead", "default", url=dead_url), Replica("sim", "default")],
                        "ladr", ttl_s=0.3, refresh_s=0.05)
        prober = HealthProber(router, interval_s=0.05)
        try:
            async with aiohttp.ClientSession() as session:
                assert await prober.probe_once(session) == {"up": True, "sick": False, "dead": False}
                prober.start(session)
                await asyncio.sleep(0.6)  # two TTLs: only the probed replica is still fresh
                picks = collections.Counter(router.pick("default").id for _ in range(300))
                snap = {x["id"]: x for x in router.snapshot()["pools"]["default"]}
                await prober.stop()
        finally:
            await up.cleanup()
            await sick.cleanup()
        return picks, snap, prober

    picks, snap, prober = asyncio.run(main())
    assert picks == {"up": 300}
    assert snap["up"]["fresh"] and snap["up"]["queue"] == 5  # the worker's own waiting + running
    assert not snap["sick"]["fresh"] and not snap["dead"]["fresh"] and not snap["sim"]["fresh"]
    assert prober.ok >= 5 and prober.failed >= 10
