"""The scraper against real loopback HTTP servers: a healthy engine keeps its 1-per-interval
cadence while others answer garbage, hang, stream forever or refuse connections; those back off
and are marked down, and come back when they recover."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import choose_encoder

from llmsla import config as config_mod
from llmsla import names
from llmsla.engines.record import EngineSnapshot
from llmsla.engines.recorder import EngineRecorder
from llmsla.engines.scrape import (
    TICKS_PER_INTERVAL,
    ScrapeError,
    Scraper,
    Target,
    backoff_s,
    next_due,
    on_tick,
)

from . import expositions as ex

INTERVAL = 0.2


def _cfg() -> config_mod.Config:
    cfg = config_mod.Config()
    cfg.engine.scrape_interval_s = INTERVAL
    cfg.engine.timeout_s = 0.15
    cfg.engine.backoff_max_s = 0.8
    cfg.engine.max_bytes = 256 * 1024
    return cfg


class Engines:
    """One aiohttp server with a route per behaviour; ``mode`` switches the flaky one."""

    def __init__(self) -> None:
        self.vllm = ex.vllm()
        self.flaky_mode = "html"
        self.hits: dict[str, int] = {}
        self.ctypes: set[str] = set()

    async def healthy(self, request: web.Request) -> web.StreamResponse:
        self.hits["healthy"] = self.hits.get("healthy", 0) + 1
        # content negotiation as a prometheus-client engine does it, on the scraper's Accept header
        encoder, ctype = choose_encoder(request.headers.get("Accept", ""))
        self.ctypes.add(ctype)
        return web.Response(body=encoder(self.vllm.registry), headers={"Content-Type": ctype})

    async def flaky(self, request: web.Request) -> web.StreamResponse:
        self.hits["flaky"] = self.hits.get("flaky", 0) + 1
        mode = self.flaky_mode
        if mode == "500":
            return web.Response(status=500, text="internal error")
        if mode == "html":
            return web.Response(text="<html><body>oops</body></html>", content_type="text/html")
        if mode == "truncated":
            body = self.vllm.openmetrics.encode()[:-200]
            return web.Response(body=body, headers={"Content-Type": "application/openmetrics-text; version=1.0.0"})
        if mode in ("text", "text_as_om"):  # the text format, then the same bytes labelled OpenMetrics
            om = "application/openmetrics-text; version=1.0.0"
            return web.Response(body=generate_latest(self.vllm.registry),
                                headers={"Content-Type": om if mode == "text_as_om" else "text/plain; version=0.0.4"})
        if mode == "no_eof":  # every family whole, cut just before the end marker
            encoder, ctype = choose_encoder(request.headers.get("Accept", ""))
            body = encoder(self.vllm.registry)
            assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
            return web.Response(body=body[:-len(b"# EOF\n")], headers={"Content-Type": ctype})
        return await self.healthy(request)

    async def hang(self, request: web.Request) -> web.StreamResponse:
        self.hits["hang"] = self.hits.get("hang", 0) + 1
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self.hits["stream"] = self.hits.get("stream", 0) + 1
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
        await resp.prepare(request)
        line = b"# HELP vllm:x " + b"x" * 1000 + b"\n"
        while True:  # an endless /metrics, fast
            await resp.write(line * 64)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[str, Engines]]:
    eng = Engines()
    app = web.Application()
    app.router.add_get("/healthy/metrics", eng.healthy)
    app.router.add_get("/flaky/metrics", eng.flaky)
    app.router.add_get("/hang/metrics", eng.hang)
    app.router.add_get("/stream/metrics", eng.stream)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", eng
    finally:
        await runner.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(n, 1.0, 30.0) for n in (1, 2, 3, 4, 5, 6, 7, 100)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_healthy_replica_keeps_its_cadence_while_others_fail() -> None:
    asyncio.run(_cadence())


async def _cadence() -> None:
      async with serving() as (base, eng):
        targets = [
            Target("r0", "p", f"{base}/healthy/metrics"),
            Target("r1", "p", f"{base}/flaky/metrics", names.ENGINE_VLLM),
            Target("r2", "p", f"{base}/hang/metrics"),
            Target("r3", "p", f"{base}/stream/metrics"),
            Target("r4", "p", f"http://127.0.0.1:{_free_port()}/metrics"),  # nothing listens
        ]
        samples: dict[str, list[tuple[float, EngineSnapshot]]] = {t.replica: [] for t in targets}
        failures: dict[str, list[str]] = {t.replica: [] for t in targets}
        registry = CollectorRegistry()
        recorder = EngineRecorder(registry=registry)

        def on_sample(t: Target, snap: EngineSnapshot, preempted: float, seconds: float) -> None:
            samples[t.replica].append((time.monotonic(), snap))
            recorder.sample(t, snap, preempted, seconds)

        def on_failure(t: Target, err: ScrapeError, seconds: float) -> None:
            failures[t.replica].append(err.reason)
            recorder.failure(t, err, seconds)

        scraper = Scraper(_cfg(), targets, on_sample=on_sample, on_failure=on_failure)
        stop = asyncio.Event()
        task = asyncio.create_task(scraper.run(stop))
        await asyncio.sleep(3.0)
        # the flaky replica recovers: it is scraped again within its (capped) backoff and comes back up
        eng.flaky_mode = "ok"
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.wait_for(task, 2.0)

        ok = [t for t, _ in samples["r0"]]
        assert len(ok) >= int(4.5 / INTERVAL) - 3, len(ok)  # ~22 in 4.5 s
        gaps = [b - a for a, b in zip(ok, ok[1:], strict=False)]
        assert max(gaps) < INTERVAL + 0.15, gaps  # never held up by the hanging or streaming replicas
        assert samples["r0"][-1][1].engine == "vllm" and samples["r0"][-1][1].waiting == 5.0
        assert eng.ctypes == {"application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"}

        assert set(failures["r1"]) <= {names.ENGINE_FAIL_PARSE} and failures["r1"]
        assert set(failures["r2"]) == {names.ENGINE_FAIL_TIMEOUT}
        assert set(failures["r3"]) <= {names.ENGINE_FAIL_TOO_LARGE, names.ENGINE_FAIL_TIMEOUT} and failures["r3"]
        assert set(failures["r4"]) == {names.ENGINE_FAIL_CONNECT}
        # backed off: in 4.5 s at 0.2 s a healthy replica gets ~22 tries; 0.2+0.4+0.8+0.8+... gives ~7
        for rid in ("r2", "r3", "r4"):
            assert 3 <= len(failures[rid]) <= 9, (rid, failures[rid])
            assert not scraper.status[rid].up and scraper.status[rid].failures == len(failures[rid])
        assert scraper.status["r1"].up and samples["r1"], "the flaky replica came back"
        assert scraper.status["r0"].up

        text = generate_latest(registry).decode()
        assert 'llmsla_engine_up{engine="vllm",pool="p",replica="r0"} 1.0' in text
        assert 'llmsla_engine_up{engine="auto",pool="p",replica="r2"} 0.0' in text
        assert 'llmsla_engine_requests_waiting{engine="vllm",pool="p",replica="r0"} 5.0' in text
        assert 'replica="r2"' not in text.split("llmsla_engine_requests_waiting")[1].split("# HELP")[0]
        assert 'llmsla_engine_scrape_failures_total{pool="p",reason="timeout",replica="r2"}' in text


def test_500_and_html_and_truncated_are_failures() -> None:
    asyncio.run(_failures())


async def _failures() -> None:
    async with serving() as (base, eng):
        scraper = Scraper(_cfg(), [Target("r1", "p", f"{base}/flaky/metrics")])
        for mode, reason in (("500", names.ENGINE_FAIL_HTTP), ("html", names.ENGINE_FAIL_PARSE),
                             ("truncated", names.ENGINE_FAIL_PARSE)):
            eng.flaky_mode = mode
            result = (await scraper.scrape_all_once())["r1"]
            assert isinstance(result, ScrapeError) and result.reason == reason, (mode, result)
        eng.flaky_mode = "ok"
        snap, _ = (await scraper.scrape_all_once())["r1"]  # type: ignore[misc]
        assert snap.engine == "vllm" and snap.kv_blocks_total == 2000


def test_content_length_over_the_limit_is_refused_before_reading() -> None:
    asyncio.run(_too_large())


async def _too_large() -> None:
    big = b"#" * (300 * 1024)

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=big, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        r: Any = (await Scraper(_cfg(), [Target("r0", "p", f"http://127.0.0.1:{port}/metrics")]).scrape_all_once())["r0"]
        assert isinstance(r, ScrapeError) and r.reason == names.ENGINE_FAIL_TOO_LARGE
    finally:
        await runner.cleanup()


def test_a_late_loop_keeps_each_replica_on_its_tick() -> None:
    """The next scrape is due an interval after the tick the last one was due at: a loop that
    starts every scrape 30 ms late (more than half a 50 ms tick) keeps the replica on its tick,
    where counting from the late start moved it one tick later each interval until the replicas
    bunched on a few ticks (CI, a busy machine: 5 of 10 ticks left). A stall longer than the
    interval skips the slots it missed but the latest, taken at once and still on the tick."""
    interval, tick = 0.5, 0.05
    due = 10.15  # this replica's tick: 3 of 10
    for _ in range(50):
        due = next_due(due, interval, now=due + 0.03 + 0.01, tick_s=tick)  # started 30 ms late, ran 10 ms
        assert round(due / tick) % TICKS_PER_INTERVAL == 3, due
    stalled = next_due(due, interval, now=due + 2.3 * interval, tick_s=tick)
    assert stalled == pytest.approx(due + 2 * interval)  # the latest missed slot: due at once
    assert next_due(stalled, interval, now=stalled + 0.01, tick_s=tick) == pytest.approx(due + 3 * interval)
    backoff = next_due(due, 4 * interval, now=due + 0.01, tick_s=tick)  # a failing replica's longer delay
    assert backoff == pytest.approx(due + 4 * interval)


def test_scrapes_start_together_on_the_tick_grid_and_keep_their_cadence() -> None:
    """The replicas due at one tick start together (one wake-up of the process for them all),
    spread over the ticks of one interval; each keeps its 1-per-interval cadence."""
    assert on_tick(1.26, 0.1) == pytest.approx(1.3) and on_tick(1.24, 0.1) == pytest.approx(1.2)
    cfg = _cfg()
    cfg.engine.scrape_interval_s = interval = 0.5  # 80 scrapes a second: the loop has time to idle
    tick = interval / TICKS_PER_INTERVAL

    async def run() -> None:
        body = ex.vllm().text.encode()  # one body, not encoded per request: the scraper's timing is tested

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            n = 4 * TICKS_PER_INTERVAL
            starts: dict[str, list[float]] = {f"r{i}": [] for i in range(n)}
            loop = asyncio.get_running_loop()
            scraper = Scraper(cfg, [Target(f"r{i}", "p", f"{base}/metrics") for i in range(n)],
                              on_sample=lambda t, s, p, secs: starts[t.replica].append(loop.time() - secs))
            stop = asyncio.Event()
            task = asyncio.create_task(scraper.run(stop))
            await asyncio.sleep(6 * interval)
            stop.set()
            await asyncio.wait_for(task, 2.0)
        finally:
            await runner.cleanup()
        every = sorted(t for ts in starts.values() for t in ts[1:])  # after each one's first scrape
        assert len(every) >= n * 4
        # the starts come in clusters, one a tick (a wake-up): spread one by one, 40 replicas
        # over an interval would start 12.5 ms apart, each its own wake-up
        clusters = 1 + sum(1 for x, y in zip(every, every[1:], strict=False) if y - x > tick / 8)
        assert clusters <= len(every) / 2, (clusters, len(every))
        per_interval = {round(t / tick) % TICKS_PER_INTERVAL for t in every}
        assert len(per_interval) >= TICKS_PER_INTERVAL - 1  # still spread over the interval
        for ts in starts.values():
            gaps = [b - a for a, b in zip(ts[1:], ts[2:], strict=False)]
            assert len(gaps) >= 3 and max(gaps) < interval + 0.15, gaps
            # the grid neither drifts nor skips: each start is its slot's, k intervals after the
            # others' common phase (their median), to within half a tick. One start may be late:
            # a busy machine that wakes the loop late delays that scrape, and the grid puts the
            # next one back on its slot (a start late by 120 ms under a full test run made the
            # mean gap miss by 30 ms though every later start was on time)
            seq = ts[1:]
            phase = statistics.median(t - k * interval for k, t in enumerate(seq))
            off = [t - k * interval - phase for k, t in enumerate(seq)]
            assert sum(abs(o) < tick / 2 for o in off) >= len(off) - 1, (off, gaps)

    asyncio.run(run())


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list the scraper's every parse of a body appends to."""
    import llmsla.engines.scrape as scrape_mod

    parsed: list[int] = []
    real = scrape_mod.parse

    def counting(*a: Any, **kw: Any) -> Any:
        parsed.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(scrape_mod, "parse", counting)
    return parsed


def test_an_unchanged_body_is_not_parsed_again_and_a_changed_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle replica answers the same text scrape after scrape: the scraper gives the last
    record at the new time without parsing or adapting it again; a moved gauge, or the same
    text read as another engine, is parsed again."""
    parsed = _count_parses(monkeypatch)

    async def main() -> list[Any]:
        async with serving() as (base, eng):
            scraper = Scraper(_cfg(), [Target("r1", "p", f"{base}/healthy/metrics", names.ENGINE_VLLM)])
            out = [(await scraper.scrape_all_once())["r1"] for _ in range(2)]
            eng.vllm = ex.vllm(usage={"0": 0.9, "1": 0.9})  # the KV usage moved
            out.append((await scraper.scrape_all_once())["r1"])
            scraper.targets[0] = Target("r1", "p", f"{base}/healthy/metrics", names.ENGINE_AUTO)
            out.append((await scraper.scrape_all_once())["r1"])
            return out

    first, again, moved, auto = (r[0] for r in asyncio.run(main()))
    assert len(parsed) == 3  # the first, the moved gauge and the other engine setting; not the repeat
    assert again.ts > first.ts
    assert again == dataclasses.replace(first, ts=again.ts)  # the same record, at this scrape's time
    assert first.kv_usage == pytest.approx(0.5) and moved.kv_usage == pytest.approx(0.9)
    assert auto.engine == names.ENGINE_VLLM and auto.kv_usage == moved.kv_usage


def test_an_idle_replica_is_not_parsed_again_while_its_other_families_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle engine's own families stay the same while its server's collectors move (CPU
    seconds, memory, GC counts): the scraper gives the last record at the new time without
    parsing it again. A moved engine family is parsed again, and the same families in an
    OpenMetrics body cut before ``# EOF`` are still refused."""
    parsed = _count_parses(monkeypatch)

    async def main() -> list[Any]:
        async with serving() as (base, eng):
            eng.flaky_mode = "ok"  # served as the healthy route until told otherwise
            cpu = Counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.",
                          registry=eng.vllm.registry)
            scraper = Scraper(_cfg(), [Target("r1", "p", f"{base}/flaky/metrics", names.ENGINE_VLLM)])
            out = [(await scraper.scrape_all_once())["r1"]]
            for _ in range(2):
                cpu.inc(0.25)  # the server's CPU seconds moved: the body is not the same text
                out.append((await scraper.scrape_all_once())["r1"])
            eng.flaky_mode = "no_eof"
            out.append((await scraper.scrape_all_once())["r1"])
            eng.flaky_mode = "ok"
            eng.vllm = ex.vllm(usage={"0": 0.9, "1": 0.9})  # an engine family moved: the KV usage
            out.append((await scraper.scrape_all_once())["r1"])
            for mode in ("text", "text", "text_as_om"):  # the same text twice; then the same bytes as OpenMetrics
                eng.flaky_mode = mode
                out.append((await scraper.scrape_all_once())["r1"])
            return out

    first, again, more, cut, moved, text, text_again, as_om = asyncio.run(main())
    assert isinstance(cut, ScrapeError) and cut.reason == names.ENGINE_FAIL_PARSE  # refused, not the last record
    assert not isinstance(text_again, ScrapeError) and text_again[0] == dataclasses.replace(text[0], ts=text_again[0].ts)
    assert isinstance(as_om, ScrapeError) and as_om.reason == names.ENGINE_FAIL_PARSE  # no # EOF: refused
    first_snap, again_snap, more_snap, moved_snap = first[0], again[0], more[0], moved[0]
    # the first, the cut body (refused), the moved gauge, the text format and the text as OpenMetrics;
    # not the idle repeats, nor the same text again
    assert len(parsed) == 5
    assert again_snap.ts > first_snap.ts
    assert again_snap == dataclasses.replace(first_snap, ts=again_snap.ts)  # the same record, at its time
    assert more_snap == dataclasses.replace(first_snap, ts=more_snap.ts)
    assert first_snap.kv_usage == pytest.approx(0.5) and moved_snap.kv_usage == pytest.approx(0.9)


def test_only_a_replica_that_repeats_is_compared_byte_wise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte-wise comparison with the last body (``same_kept``) is for replicas whose engine
    families repeat; one whose families move every scrape (busy) is spared it, and one that goes
    idle is compared again from its second repeat on."""
    import llmsla.engines.scrape as scrape_mod

    compared: list[bool] = []
    real = scrape_mod.same_kept

    def counting(*a: Any, **kw: Any) -> bool:
        compared.append(real(*a, **kw))
        return compared[-1]

    monkeypatch.setattr(scrape_mod, "same_kept", counting)

    async def main() -> list[int]:
        async with serving() as (base, eng):
            scraper = Scraper(_cfg(), [Target("r1", "p", f"{base}/healthy/metrics", names.ENGINE_VLLM)])
            seen = []
            for i in range(4):  # busy: the KV usage moves every scrape
                eng.vllm = ex.vllm(usage={"0": i / 10, "1": i / 10})
                assert not isinstance((await scraper.scrape_all_once())["r1"], ScrapeError)
            seen.append(len(compared))
            for _ in range(4):  # idle from here on
                assert not isinstance((await scraper.scrape_all_once())["r1"], ScrapeError)
            seen.append(len(compared))
            return seen

    busy, idle = asyncio.run(main())
    assert busy == 0
    assert idle == 3 and all(compared)  # the first repeat is found by its runs; the next three byte-wise
