"""Churn end to end under a replayed trace: real worker processes behind a real gateway whose
replicas come from a watched file, while the Azure LLM 2023 conversation trace is replayed
(open loop, four times its speed, prompts and outputs capped for a CPU worker). The file goes
2 -> 4 -> 1 and one replica is killed outright (SIGKILL) 5 ms after the router sent it a
request that is still in flight.

What must hold: no request fails except those in flight on the killed replica (each failure is
on that replica and started before the kill, at most the router's count of them at the kill;
one of those may still succeed if the worker had written its last byte before dying); a
replica that refuses connections is skipped at once (the request goes to another one); a new
replica takes its first request, and a removed one its last, within two discovery intervals;
the discovery series say what the router knows. The figures are printed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.discovery import replica_id
from llmsla.exporters.gateway import REPLICA_HEADER
from llmsla.fleet.traces import load

INTERVAL_S = 0.5
SPEEDUP = 4.0
REPLAY_S = 15.0
MAX_PROMPT_CHARS = 512
MAX_OUTPUT = 24
T_UP, T_KILL, T_DOWN = 3.0, 7.0, 10.5  # seconds into the replay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(u + "\n" for u in urls))
    os.replace(tmp, path)  # atomically, as docs/gateway.md#discovery asks


def _spawn(tmp: Path, i: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "LLMSLA_WORKER_MAX_TOKENS": str(MAX_OUTPUT), "LLMSLA_SPOOL_DIR": str(tmp / f"spool{i}")}
    env.pop("LLMSLA_CONFIG", None)
    with open(tmp / f"worker{i}.log", "wb") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "llmsla", "worker", "--port", str(port), "--max-batch", "16"],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    return proc, f"http://127.0.0.1:{port}"


async def _ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            assert proc.poll() is None, f"worker {url} exited with {proc.returncode}"
            try:
                async with s.get(url + "/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"worker {url} not ready in {timeout_s} s")


async def _one(s: aiohttp.ClientSession, url: str, model: str, prompt: int, output: int, log: list[dict]) -> None:
    text = ("the fleet changes while the trace plays " * 40)[:max(8, min(prompt, MAX_PROMPT_CHARS))]
    body = {"model": model, "prompt": text, "max_tokens": max(2, min(output, MAX_OUTPUT)), "stream": True}
    t0 = time.monotonic()
    try:
        async with s.post(url + "/v1/completions", json=body) as r:
            raw = await r.read()
            status, rid = r.status, r.headers.get(REPLICA_HEADER)
    except aiohttp.ClientError as exc:
        raw, status, rid = repr(exc).encode(), 0, None
    if rid is None and (named := re.search(rb"upstream (\S+) failed", raw)):  # an error answer names the replica
        rid = named.group(1).decode()
    log.append({"t0": t0, "t1": time.monotonic(), "status": status, "replica": rid,
                "done": raw.rstrip().endswith(b"data: [DONE]") and b"event: error" not in raw, "body": raw[-200:]})


@pytest.mark.slow
def test_trace_replay_through_2_4_1_and_a_sigkill(tmp_path: Path) -> None:
    arrivals, _ = load("azure_conv")
    plan = [a for a in arrivals if a.t / SPEEDUP < REPLAY_S]
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.control.route_policy = "round_robin"  # even shares: what "the share follows" means here
    f = tmp_path / "replicas"
    cfg.gateway.discovery, cfg.gateway.discovery_file = "file", str(f)
    cfg.gateway.discovery_interval_s = INTERVAL_S
    procs = [_spawn(tmp_path, i) for i in range(4)]
    urls = [u for _, u in procs]
    ids = [replica_id("default", u, "default") for u in urls]
    killed = ids[1]
    try:
        async def main() -> dict:
            await asyncio.gather(*(_ready(u, p) for p, u in procs))
            _write(f, urls[:2])
            reg = CollectorRegistry()
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, spool=None) as gw:
                router = gw.gateway.plane.router
                picks: dict[str, list[tuple[float, int]]] = {rid: [] for rid in ids}  # (time, picks) on change
                marks: dict[str, float] = {}
                log: list[dict] = []
                stop = asyncio.Event()

                async def watch() -> None:
                    while not stop.is_set():
                        now = time.monotonic()
                        for row in router.snapshot()["pools"].get("default", []):
                            seen = picks.setdefault(row["id"], [])
                            if not seen or seen[-1][1] != row["picks"]:
                                seen.append((now, row["picks"]))
                        await asyncio.sleep(0.005)

                async def churn(start: float) -> None:
                    await asyncio.sleep(max(0.0, start + T_UP - time.monotonic()))
                    _write(f, urls)  # 2 -> 4
                    marks["up"] = time.monotonic()
                    await asyncio.sleep(max(0.0, start + T_KILL - time.monotonic()))
                    # kill it while it serves: 5 ms after the router sent it a request (connected
                    # by then, on loopback: a request killed before its connection would just go
                    # to another replica), if that one is still in flight. Most requests of this
                    # replay end within 30 ms, so a longer wait rarely finds one still in flight
                    def picked() -> int:
                        return next(x["picks"] for x in router.snapshot()["pools"]["default"] if x["id"] == killed)

                    while time.monotonic() < start + T_DOWN - 0.3:
                        before = picked()
                        while picked() == before and time.monotonic() < start + T_DOWN - 0.3:
                            await asyncio.sleep(0.001)
                        await asyncio.sleep(0.005)
                        if router.outstanding(killed) >= 1:
                            break
                    # the router's count and the kill in one step: the gateway (this loop) cannot
                    # finish a request of that replica in between
                    marks["in_flight_at_kill"] = router.outstanding(killed)
                    os.kill(procs[1][0].pid, signal.SIGKILL)
                    marks["kill"] = time.monotonic()
                    await asyncio.sleep(max(0.0, start + T_DOWN - time.monotonic()))
                    _write(f, urls[2:3])  # 4 -> 1: ids 0, 1 (killed) and 3 leave
                    marks["down"] = time.monotonic()

                watcher = asyncio.create_task(watch())
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
                    start = time.monotonic()
                    churner = asyncio.create_task(churn(start))
                    reqs = []
                    for a in plan:
                        await asyncio.sleep(max(0.0, start + a.t / SPEEDUP - time.monotonic()))
                        reqs.append(asyncio.create_task(_one(s, gw.url, cfg.worker.model, a.prompt, a.output, log)))
                    await churner
                    await asyncio.gather(*reqs)
                await asyncio.sleep(2 * INTERVAL_S)  # a round after the last drain: the gauge is final
                stop.set()
                await watcher
                async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
                    metrics = await r.text()
                return {"log": log, "picks": picks, "marks": marks, "metrics": metrics,
                        "left": sorted(r.id for r in router.replicas())}

        out = asyncio.run(main())
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    log, picks, m = out["log"], out["picks"], out["marks"]
    assert len(log) == len(plan) and len(plan) > 60, (len(log), len(plan))
    failed = [x for x in log if x["status"] != 200 or not x["done"]]
    (tmp_path / "outcome.json").write_text(json.dumps(  # for a post-mortem: the urls, the marks, the failures
        {"urls": urls, "killed": killed, "marks": m,
         "failed": [{**x, "body": x["body"].decode("utf-8", "replace")} for x in failed]}, indent=1))
    # only requests in flight on the killed replica failed: each is on it and started before the
    # kill, there are at most as many as the router had in flight there, and each of those that
    # did not fail ended right after the kill (the worker had written all of it before dying)
    assert m["in_flight_at_kill"] >= 1, "nothing was in flight on the killed replica: the kill went untested"
    assert failed, "the kill failed no request: the in-flight ones went untested"
    assert all(x["replica"] == killed and x["t0"] < m["kill"] for x in failed), (m, failed[:3])
    assert len(failed) <= m["in_flight_at_kill"], (len(failed), m["in_flight_at_kill"])
    spanning = [x for x in log if x["replica"] == killed and x["t0"] < m["kill"] < x["t1"]]
    finished = [x for x in spanning if x not in failed]
    assert all(x["t1"] - m["kill"] < 0.25 for x in finished), finished
    # (the router's count may also hold a request whose client already has all of it: the
    # gateway's bookkeeping runs after its last write, so no lower bound beyond one failure)

    def first_after(rid: str, t: float) -> float | None:
        times = [ts for ts, n in picks[rid] if ts > t and n > 0]
        return times[0] - t if times else None

    def last_after(rid: str, t: float) -> float:
        times = [ts for ts, _ in picks[rid] if ts > t]
        return (times[-1] - t) if times else 0.0

    join_s = {rid: first_after(rid, m["up"]) for rid in ids[2:]}
    leave_s = {rid: last_after(rid, m["down"]) for rid in (ids[0], ids[3])}
    killed_last_pick_s = last_after(killed, m["kill"])
    lag = 2 * INTERVAL_S
    assert all(v is not None and v < lag for v in join_s.values()), join_s
    assert all(v < lag for v in leave_s.values()), leave_s
    assert killed_last_pick_s < lag, killed_last_pick_s
    # the share followed: round robin over four before the kill, then over the three alive
    steady4 = [x["replica"] for x in log if m["up"] + lag < x["t0"] < m["kill"] and x["replica"]]
    share4 = {rid: steady4.count(rid) / len(steady4) for rid in ids}
    assert all(0.1 < v < 0.4 for v in share4.values()), share4
    steady3 = [x["replica"] for x in log if m["kill"] + lag < x["t0"] < m["down"] and x["replica"]]
    share3 = {rid: steady3.count(rid) / len(steady3) for rid in ids}
    assert share3[killed] == 0 and all(0.15 < share3[r] < 0.55 for r in (ids[0], ids[2], ids[3])), share3
    late = [x for x in log if x["t0"] > m["down"] + lag and x["replica"] != ids[2]]
    assert not late, late[:3]
    assert out["left"] == [ids[2]]
    text = out["metrics"]
    assert f'{names.DISCOVERY_REPLICAS}{{pool="default",state="serving"}} 1.0' in text
    assert f'{names.DISCOVERY_REPLICAS}{{pool="default",state="draining"}} 0.0' in text
    assert f'{names.DISCOVERY_REFRESHES}_total{{source="file"}}' in text
    print(json.dumps({"requests": len(log), "failed": len(failed), "in_flight_at_kill": m["in_flight_at_kill"],
                      "finished_right_after_kill": len(finished),
                      "join_s": join_s, "leave_s": leave_s, "killed_last_pick_s": killed_last_pick_s,
                      "share_at_4": share4, "share_after_kill": share3}, indent=1))
