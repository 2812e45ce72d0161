"""``llmsla replay``: a trace's arrivals as real streaming chat requests (fleet/replay.py).

The arrival mapping is checked against the simulator's transforms computed here from the same
trace; the pacing against a fake clock (exact send times, open loop) and against a real HTTP
server on 127.0.0.1 (what each request carries, when it came, how each outcome is counted)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from aiohttp import web

from llmsla.app import cli
from llmsla.fleet import replay, traces, workload
from llmsla.httpkit import serve


def test_plan_keeps_times_and_units_and_scales_sizes() -> None:
    arrivals = [workload.Arrival(0.0, 1000, 200, "s0"), workload.Arrival(0.5, 10, 1, "s1"),
                workload.Arrival(2.25, 9000, 5000, "s0"), workload.Arrival(3.0, 1, 3, "")]
    fit = replay.Fit(prompt_scale=0.25, output_scale=0.5, max_prompt_chars=1024, max_tokens=128)
    assert replay.plan(arrivals, fit) == [
        replay.Planned(0.0, 250, 100, "s0"), replay.Planned(0.5, 2, 1, "s1"),  # at least 1 each
        replay.Planned(2.25, 1024, 128, "s0"), replay.Planned(3.0, 1, 2, "")]  # capped
    for bad in ({"prompt_scale": 0}, {"output_scale": -1}, {"max_tokens": 0}, {"max_prompt_chars": 0}):
        with pytest.raises(ValueError):
            replay.Fit(**bad)


def test_trace_plan_is_the_simulators_load() -> None:
    """Window in trace seconds, stretch and rate multiplier with the simulator's seeds, then
    sessions: the same arrivals `llmsla simulate` would replay, sized down."""
    got = replay.trace_plan("azure_conv", replay.Fit(0.25, 0.5, 1024, 128), duration_s=120, start_s=30,
                            time_scale=2.0, rate=2.0, sessions=3.0, seed=7)
    full, _ = traces.load("azure_conv")
    ref = [a._replace(t=a.t - 30) for a in full if 30 <= a.t < 90]  # 120 s stretched = 60 trace s
    ref = workload.scale(ref, time_scale=2.0, rate=2.0, rng=random.Random(107))
    ref = workload.sessions(ref, random.Random(10), mean_turns=3.0)
    assert [p.t for p in got] == [a.t for a in ref] and len(got) > 200
    assert [p.user for p in got] == [a.unit for a in ref]
    assert all(0 <= p.t < 120 for p in got)
    assert [p.max_tokens for p in got] == [min(128, max(1, round(a.output * 0.5))) for a in ref]
    assert len({p.user for p in got}) < len(got) / 2  # sessions of ~3 turns: units repeat


def test_prompt_text_and_body() -> None:
    assert len(replay.prompt_text(777, 3)) == 777
    assert replay.prompt_text(50, 3) == replay.prompt_text(50, 3) != replay.prompt_text(50, 4)
    body = replay.chat_body(replay.Planned(1.0, 40, 9, "s5"), 12, "llmsla-tiny")
    assert body["stream"] is True and body["ignore_eos"] is True and body["user"] == "s5"
    assert body["max_tokens"] == 9 and len(body["messages"][0]["content"]) == 40 and body["seed"] == 12
    assert "user" not in replay.chat_body(replay.Planned(1.0, 40, 9, ""), 0, "m")


def test_pace_sends_on_schedule_without_waiting_for_earlier_requests() -> None:
    """A fake clock: every send happens exactly at its time, and the first request - which does
    not finish until all have been sent - holds none of them back (open loop)."""
    now = [100.0]

    async def sleep(d: float) -> None:  # what was scheduled runs at the start of a sleep
        await asyncio.sleep(0)
        now[0] += d

    plan = [replay.Planned(t, 1, 1, "") for t in (0.0, 0.0, 0.25, 1.0, 4.5)]
    sent: list[tuple[int, float]] = []

    async def go() -> list[replay.Outcome]:
        release = asyncio.Event()

        async def send(i: int, p: replay.Planned) -> replay.Outcome:
            sent.append((i, now[0]))
            out = replay.Outcome(i, now[0] - (100.0 + p.t), 200)
            if i == 0:
                await release.wait()
            if i == len(plan) - 1:
                release.set()
            return out

        return await replay.pace(plan, send, start=100.0, clock=lambda: now[0], sleep=sleep)

    outcomes = asyncio.run(go())
    assert sent == [(0, 100.0), (1, 100.0), (2, 100.25), (3, 101.0), (4, 104.5)]
    assert [o.index for o in outcomes] == [0, 1, 2, 3, 4] and all(o.late_s == 0 for o in outcomes)


def test_replay_over_http_carries_the_plan_and_counts_outcomes() -> None:
    got: list[tuple[float, dict]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        got.append((time.monotonic(), body))
        if body["seed"] == 3:
            return web.json_response({"error": {"message": "no replica"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        if body["seed"] == 4:  # how the gateway ends a stream whose replica failed
            await resp.write(b'event: error\ndata: {"error":{"message":"upstream r1 failed"}}\n\n')
        else:
            await resp.write(b"data: [DONE]\n\n")
        return resp

    plan = [replay.Planned(0.1 * i, 10 + i, 1 + i, f"s{i % 3}") for i in range(8)]

    async def go() -> replay.ReplayResult:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        served = await serve(app, "127.0.0.1", 0)
        try:
            start_ms = int(time.time() * 1000) + 300  # a start in the future is waited for
            res = await replay.replay(served.url, plan, model="m", start_ms=start_ms, timeout_s=10)
            assert res.start_ms == start_ms
            return res
        finally:
            await served.stop()

    t0 = time.monotonic()
    res = asyncio.run(go())
    assert len(got) == 8 and got[0][0] - t0 >= 0.25
    by_seed = {b["seed"]: (t, b) for t, b in got}
    for i, p in enumerate(plan):
        b = by_seed[i][1]
        assert (b["model"], b["user"], b["max_tokens"], len(b["messages"][0]["content"])) == ("m", p.user, p.max_tokens,
                                                                                            p.prompt_chars)
    # the shape of the arrivals is kept (a loaded 2-core machine: tens of ms of slack)
    gaps = [by_seed[i + 1][0] - by_seed[i][0] for i in range(7)]
    assert all(0.03 < g < 0.25 for g in gaps), gaps
    s = res.summary()
    assert s["sent"] == s["planned"] == 8 and s["statuses"] == {"200": 7, "503": 1}
    assert s["completed"] == 6 and s["errors"] == {"stream_error": 1}
    assert s["late_max_s"] < 0.2
    ok = [o for o in res.outcomes if o.status == 200]
    assert all(o.ttft_s is not None and o.e2e_s is not None and o.ttft_s <= o.e2e_s for o in ok)


def test_cli_names_an_empty_load(capsys) -> None:
    rc = cli.main(["replay", "--url", "http://127.0.0.1:9", "--duration", "10", "--start", "999999"])
    assert rc == 2 and "the load is empty" in capsys.readouterr().err


def test_cli_replays_into_its_json(tmp_path: Path, capsys) -> None:
    """The command end to end against a real server: a few seconds of the trace, its summary."""
    n = [0]

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        n[0] += 1
        return web.Response(body=b"data: [DONE]\n\n", content_type="text/event-stream")

    out = tmp_path / "replay.json"

    async def go() -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        served = await serve(app, "127.0.0.1", 0)
        try:
            return await asyncio.to_thread(cli.main, [
                "replay", "--url", served.url, "--duration", "3", "--time-scale", "2", "--rate-mult", "2",
                "--prompt-scale", "0.1", "--max-tokens", "4", "--json", str(out)])
        finally:
            await served.stop()

    assert asyncio.run(go()) == 0
    import json

    s = json.loads(out.read_text())
    assert s["sent"] == s["planned"] == n[0] > 0 and s["statuses"] == {"200": n[0]}
    assert s["fit"]["max_tokens"] == 4 and s["time_scale"] == 2.0
    assert "sent" in capsys.readouterr().out
