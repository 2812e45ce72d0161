"""The worker's fault-injection endpoint over real HTTP on 127.0.0.1 (worker/fault.py): refused
without the token, 400 naming the field on a bad body, and the faults do what they say - a
slowdown makes the same request take about that many times longer, ``down`` cuts the streams in
flight, refuses new requests and fails the health check until it is lifted."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from llmsla import names, services
from llmsla.worker.server import WorkerThread

from ._worker_util import MODEL, metric_samples, worker_cfg

TOKEN = "fault-token-for-tests"


@pytest.fixture()
def worker(tmp_path: Path) -> Iterator[WorkerThread]:
    wt = WorkerThread(worker_cfg(tmp_path, admin_port=services.free_port(), admin_token=TOKEN))
    wt.start()
    yield wt
    wt.stop()


def _admin(worker: WorkerThread) -> str:
    assert worker.running is not None and worker.running.admin_url
    return worker.running.admin_url + "/admin/fault"


async def _post(s: aiohttp.ClientSession, url: str, body: object, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    kw = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with s.post(url, headers=headers, **kw) as r:
        return r.status, await r.json()


def test_admin_endpoint_needs_the_token_and_a_valid_body(worker: WorkerThread) -> None:
    url = _admin(worker)
    assert url.startswith("http://127.0.0.1:")

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as r:
                assert r.status == 200 and await r.json() == {"slowdown": 1.0, "down": False}
            for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
                st, err = await _post(s, url, {"slowdown": 2}, token)
                assert st == 401 and err["error"]["code"] == "unauthorized", (token, err)
            bad = [({}, "slowdown"), ({"slowdown": 0.5}, "slowdown"), ({"slowdown": "2"}, "slowdown"),
                   ({"slowdown": True}, "slowdown"), ({"slowdown": 1e9}, "slowdown"), ({"down": "yes"}, "down"),
                   ({"down": 1}, "down"), ({"crash": True}, "crash"), (b"{nope", "JSON"), (b"[1]", "object")]
            for body, reason in bad:
                st, err = await _post(s, url, body)
                assert st == 400 and reason in err["error"]["message"], (body, err)
            async with s.get(url) as r:  # nothing above changed anything
                assert await r.json() == {"slowdown": 1.0, "down": False}

    asyncio.run(go())


def test_empty_token_refuses_every_fault(tmp_path: Path) -> None:
    with WorkerThread(worker_cfg(tmp_path, admin_port=services.free_port())) as wt:
        async def go() -> None:
            async with aiohttp.ClientSession() as s:
                st, err = await _post(s, _admin(wt), {"down": True}, "anything")
                assert st == 503 and "worker.admin_token" in err["error"]["message"]

        asyncio.run(go())


def test_no_admin_port_no_endpoint(tmp_path: Path) -> None:
    with WorkerThread(worker_cfg(tmp_path, admin_token=TOKEN)) as wt:
        assert wt.running is not None and wt.running.admin_url is None

        async def go() -> None:
            async with aiohttp.ClientSession() as s, s.post(wt.url + "/admin/fault", json={"down": True},
                                                            headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status in (404, 405)  # not on the serving address

        asyncio.run(go())


def test_slowdown_makes_requests_that_many_times_slower(worker: WorkerThread) -> None:
    url = worker.url
    body = {"model": MODEL, "prompt": "x" * 200, "max_tokens": 48, "ignore_eos": True, "temperature": 0}

    async def e2e(s: aiohttp.ClientSession) -> float:
        t0 = time.perf_counter()
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["completion_tokens"] == 48
        return time.perf_counter() - t0

    async def go() -> tuple[float, float, str]:
        async with aiohttp.ClientSession() as s:
            await e2e(s)  # warm
            base = statistics.median([await e2e(s) for _ in range(5)])
            st, out = await _post(s, _admin(worker), {"slowdown": 6})
            assert st == 200 and out == {"ok": True, "fault": {"slowdown": 6.0, "down": False}}
            slow = statistics.median([await e2e(s) for _ in range(3)])
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
            await _post(s, _admin(worker), {"slowdown": 1})
            return base, slow, metrics

    base, slow, metrics = asyncio.run(go())
    # compute is slowed 6x; HTTP and the event loop are not, so the ratio sits a little under 6
    assert slow > 3 * base, (base, slow)
    assert metric_samples(metrics, names.WORKER_FAULT_SLOWDOWN) == {f'{{model="{MODEL}"}}': 6.0}


def test_down_cuts_streams_refuses_requests_and_comes_back(worker: WorkerThread) -> None:
    url = worker.url
    long = {"model": MODEL, "prompt": "go", "max_tokens": 64, "ignore_eos": True, "stream": True}

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            await _post(s, _admin(worker), {"slowdown": 20})  # keep the stream in flight a while
            async with s.post(url + "/v1/completions", json=long) as r:
                assert r.status == 200
                await r.content.readline()  # the first token has come
                st, out = await _post(s, _admin(worker), {"down": True})
                assert st == 200 and out["fault"]["down"] is True
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()  # cut off: no [DONE], the connection dropped
            async with s.post(url + "/v1/completions", json={**long, "stream": False}) as r:
                assert r.status == 503 and "injected fault" in (await r.json())["error"]["message"]
            async with s.get(url + "/healthz") as r:
                assert r.status == 503
            async with s.get(url + "/metrics") as r:
                assert metric_samples(await r.text(), names.WORKER_FAULT_DOWN) == {f'{{model="{MODEL}"}}': 1.0}
            await _post(s, _admin(worker), {"down": False, "slowdown": 1})
            async with s.get(url + "/healthz") as r:
                assert r.status == 200 and (await r.json())["running"] == 0
            async with s.post(url + "/v1/completions", json={**long, "stream": False}) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 64

    asyncio.run(go())
