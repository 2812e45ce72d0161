"""Alert receiver: webhook-to-action latency and sustained posts/s with dedupe (targets: p99 <=
20 ms, >= 500 posts/s).

Servers run in a child process (one event loop, as ``llmsla receiver`` does): the receiver with
the store journal (embedded PostgreSQL, migrated), the same receiver on the memory journal, the
control API over a real router, and the anchor - a bare aiohttp handler that reads the body and
answers 200. The client runs in this process. Both are measured in the same run.

* **webhook -> action**: each post carries one firing replica page for a replica in normal state;
  the receiver claims the idempotency key, reads the control API state (safety bounds), sets the
  replica's weight through the control API, commits state and three audit rows, and answers.
  Sequential posts, client-measured round trip. Between rounds (not timed) the receiver state and
  the weights are reset so the next round acts again.
* **sustained posts/s with dedupe**: ``--concurrency`` clients post Alertmanager-like
  notifications for ``--distinct`` alerts over and over for ``--seconds`` (the first post of each
  is new, every later one a duplicate the store's key rejects); every post is audited.

    python bench/receiver.py [--rounds 8] [--replicas 64] [--seconds 8] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

RECEIVER_TOKEN = "bench-receiver-token"
CONTROL_TOKEN = "bench-control-token"
POLICY = """\
apiVersion: llmsla/v1
kind: ReceiverPolicy
timing: {hold_down_s: 3600}
safety: {max_drained_fraction: 0.5, rate_limit: {actions: 1000, per_s: 1}}
rules:
  - name: replica-page
    match: {scope: replica, severity: page}
    target: replica
    deweight_to: 0.25
    drain_after_s: 3600
"""
TARGET_P99_MS = 20.0
TARGET_POSTS_S = 500.0


def _serve(q: Any, dsn: str, replicas: int) -> None:
    from aiohttp import web

    from llmsla.alerting import policy as policy_mod
    from llmsla.alerting.control_client import ControlClient
    from llmsla.alerting.engine import Engine
    from llmsla.alerting.journal import MemoryJournal, PgJournal
    from llmsla.alerting.receiver import make_app
    from llmsla.alerting.yamlsrc import load_docs
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.control.distill import DistillControls
    from llmsla.control.router import Replica, Router
    from llmsla.httpkit import serve as start

    async def main() -> None:
        pools = [f"p{i}" for i in range(replicas // 2)]
        router = Router([Replica(f"{p}-r{j}", p) for p in pools for j in range(2)], "round_robin")
        distill = DistillControls(pools, audit=AuditLog(""))
        cport = (await api.start(api.make_app(router, distill, token=CONTROL_TOKEN))).port
        pol = policy_mod.parse(next(load_docs(POLICY, "bench-policy")))

        def receiver(journal: Any) -> Any:
            control = ControlClient([f"http://127.0.0.1:{cport}"], CONTROL_TOKEN)
            return make_app(Engine(pol, control, journal), token=RECEIVER_TOKEN, tick_s=None)

        pg = PgJournal(dsn, size=8)
        await pg.check()
        pg_port = (await start(receiver(pg), "127.0.0.1", 0)).port
        mem = MemoryJournal()
        mem_port = (await start(receiver(mem), "127.0.0.1", 0)).port

        async def bare(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"ok": True})

        bare_app = web.Application(client_max_size=1 << 20)
        bare_app.router.add_post("/v1/alerts", bare)
        bare_port = (await start(bare_app, "127.0.0.1", 0)).port

        async def reset(request: web.Request) -> web.Response:  # between latency rounds, not timed
            for rep in router.replicas():
                router.set_weight(rep.id, 1.0)
            async with pg._conn() as conn:
                await conn.execute("DELETE FROM receiver_state")
            mem._states.clear()
            return web.json_response({"ok": True})

        admin = web.Application()
        admin.router.add_post("/reset", reset)
        admin_port = (await start(admin, "127.0.0.1", 0)).port
        q.put({"pg": pg_port, "mem": mem_port, "bare": bare_port, "admin": admin_port, "control": cport})
        await asyncio.Event().wait()

    asyncio.run(main())


def _alert(i: int, *, replica: str, pool: str, starts: dt.datetime, fp: str) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "TtftReplicaErrorBudgetBurn", "severity": "page",
                                           "scope": "replica", "source": "burn_rate", "slo": "ttft",
                                           "model": "m", "pool": pool, "replica": replica},
            "annotations": {"summary": "bench"}, "startsAt": starts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/x", "fingerprint": fp}


def _note(alerts: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": "4", "groupKey": "{}:{slo=\"ttft\"}", "truncatedAlerts": 0, "status": "firing",
                       "receiver": "llmsla", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                       "externalURL": "http://am", "alerts": alerts}).encode()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def _latency(ports: dict[str, int], rounds: int, replicas: int) -> dict[str, dict[str, float]]:
    import aiohttp

    out: dict[str, dict[str, float]] = {}
    headers = {"Authorization": f"Bearer {RECEIVER_TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s:
        for name in ("bare", "mem", "pg"):
            lat: list[float] = []
            t_base = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
            for r in range(rounds + 1):  # round 0 warms up connections and caches
                async with s.post(f"http://127.0.0.1:{ports['admin']}/reset") as resp:
                    await resp.read()
                for i in range(replicas // 2):
                    starts = t_base + dt.timedelta(seconds=r * 10_000 + i)
                    body = _note([_alert(i, replica=f"p{i}-r1", pool=f"p{i}", starts=starts,
                                         fp=f"{name}{r:03d}{i:05d}")])
                    t0 = time.perf_counter()
                    async with s.post(f"http://127.0.0.1:{ports[name]}/v1/alerts", data=body, headers=headers) as resp:
                        data = await resp.json()
                    dt_ms = (time.perf_counter() - t0) * 1000
                    assert resp.status == 200, data
                    if name != "bare":
                        assert data["results"][0]["decision"] == "act", data
                        assert data["results"][0]["actions"][0]["outcome"] == "applied", data
                    if r:
                        lat.append(dt_ms)
            out[name] = {"n": len(lat), "p50_ms": statistics.median(lat), "p99_ms": _pct(lat, 0.99),
                         "max_ms": max(lat)}
    return out


async def _sustain(url: str, bodies: list[bytes], seconds: float, concurrency: int) -> dict[str, float]:
    """``concurrency`` clients posting ``bodies`` round robin for ``seconds``."""
    import aiohttp

    headers = {"Authorization": f"Bearer {RECEIVER_TOKEN}", "Content-Type": "application/json"}
    done = 0
    lat: list[float] = []
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def client(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                async with s.post(url, data=bodies[i % len(bodies)], headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200
                lat.append((time.perf_counter() - t0) * 1000)
                done += 1
                i += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"posts": done, "posts_s": done / wall, "p50_ms": statistics.median(lat), "p99_ms": _pct(lat, 0.99)}


async def _throughput(ports: dict[str, int], seconds: float, concurrency: int, distinct: int) -> dict[str, dict]:
    starts = dt.datetime(2025, 2, 1, tzinfo=dt.UTC)
    out: dict[str, dict] = {}
    for name in ("bare", "mem", "pg"):
        bodies = [_note([{**_alert(i, replica="r", pool="dedupe", starts=starts, fp=f"d{name}{i:06d}"),
                          "labels": {"alertname": "LlmslaGpuMemoryHigh", "severity": "ticket", "source": "static",
                                     "node": f"n{i}", "gpu": "0"}}]) for i in range(distinct)]
        out[name] = await _sustain(f"http://127.0.0.1:{ports[name]}/v1/alerts", bodies, seconds, concurrency)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--distinct", type=int, default=200)
    args = ap.parse_args()

    from llmsla import config as config_mod
    from llmsla.store.connection import connect, start_embedded
    from llmsla.store.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="llmsla-bench-receiver-"))
    dsn, server = start_embedded(root / "pg", keep_running=False)
    ctx = mp.get_context("spawn")
    proc = None
    try:
        with connect(dsn) as conn:
            migrate(conn, config_mod.load(env={}))
        q = ctx.Queue()
        proc = ctx.Process(target=_serve, args=(q, dsn, args.replicas), daemon=True)
        proc.start()
        ports = q.get(timeout=60)
        lat = asyncio.run(_latency(ports, args.rounds, args.replicas))
        thr = asyncio.run(_throughput(ports, args.seconds, args.concurrency, args.distinct))
    finally:
        if proc is not None:
            proc.terminate()
            proc.join(10)
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)

    names = {"bare": "bare 200 handler (anchor)", "mem": "receiver, memory journal", "pg": "receiver, store journal"}
    rows = []
    for k in ("bare", "mem", "pg"):
        rows.append({
            "server": names[k],
            "action p50 ms": lat[k]["p50_ms"], "action p99 ms": lat[k]["p99_ms"],
            "p99 / anchor": lat[k]["p99_ms"] / lat["bare"]["p99_ms"],
            "posts/s": thr[k]["posts_s"], "posts/s / anchor": thr[k]["posts_s"] / thr["bare"]["posts_s"],
            "sustained p99 ms": thr[k]["p99_ms"],
        })
    print_table(rows, f"webhook -> action ({args.rounds} x {args.replicas // 2} posts, sequential) and sustained posts "
                      f"with dedupe ({args.concurrency} clients, {args.seconds:g} s, {args.distinct} distinct alerts)")
    ok_p99 = lat["pg"]["p99_ms"] <= TARGET_P99_MS
    ok_rate = thr["pg"]["posts_s"] >= TARGET_POSTS_S
    print(f"\ntargets (store journal): p99 {lat['pg']['p99_ms']:.1f} ms <= {TARGET_P99_MS:g}: {'met' if ok_p99 else 'MISSED'}; "
          f"{thr['pg']['posts_s']:.0f} posts/s >= {TARGET_POSTS_S:g}: {'met' if ok_rate else 'MISSED'}")
    write_result("receiver", {
        "inputs": vars(args), "anchor": "bare aiohttp handler that reads the body and answers 200",
        "latency": lat, "throughput": thr, "table": rows,
        "targets": {"p99_ms": TARGET_P99_MS, "posts_s": TARGET_POSTS_S, "p99_met": ok_p99, "posts_s_met": ok_rate},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
