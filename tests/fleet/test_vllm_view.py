"""Each simulated replica read as a vLLM replica by the vLLM adapter: queue, batch and KV usage
mid-burst, preemptions under memory pressure, one TTFT / E2E / queue observation per request and
one inter-token observation per gap the model counted; served per replica in a paced run."""

from __future__ import annotations

import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

from llmsla import names
from llmsla.app import cli
from llmsla.engines.adapt import from_text
from llmsla.engines.record import EngineSnapshot
from llmsla.fleet import engine, faults, vllm_view, workload

N = 40


def _setup() -> tuple[engine.Simulator, dict, list[workload.Arrival], list[faults.Fault]]:
    arrivals = workload.burst(N, workload.TokenDist(300), workload.TokenDist(400), random.Random(1), spread_s=1.0)
    cfg = engine.SimConfig([engine.ReplicaConfig("r0", "6b")], gpu_interval_s=0, probe_s=0)
    sim = engine.Simulator(cfg)
    return sim, vllm_view.attach(sim), arrivals, [faults.Fault(0.0, 60.0, "memory", "r0", 0.05)]


def _read(reg) -> EngineSnapshot:
    return from_text(generate_latest(reg).decode(), "text/plain; version=0.0.4", names.ENGINE_AUTO,
                     replica="r0", pool=names.DEFAULT_POOL, ts=0.0)


def test_mid_burst_the_adapter_sees_the_queue_the_batch_and_the_kv_pressure() -> None:
    sim, regs, arrivals, storm = _setup()
    sim.run(arrivals, faults=storm, start_ms=0, until_s=1.5)
    rep = sim.reps["r0"]
    snap = _read(regs["r0"])
    assert snap.engine == "vllm"
    assert snap.waiting == sum(1 for r in rep.waiting if not r.dead) > 0
    assert snap.running == len(rep.running) > 0
    assert snap.kv_usage is not None and snap.kv_usage == rep.kv_at(sim.now) / rep.kv_cap
    assert 0.5 < snap.kv_usage <= 1.0  # 40 long sequences in 5 % of the memory
    assert (snap.kv_block_size, snap.kv_blocks_total) == (16, rep.spec.kv_capacity_tokens // 16)


def test_after_the_run_every_request_and_gap_is_observed_once() -> None:
    sim, regs, arrivals, storm = _setup()
    res = sim.run(arrivals, faults=storm, start_ms=0)
    snap = _read(regs["r0"])
    st = res.replicas["r0"]
    assert all(r.status == names.STATUS_OK for r in res.rows) and len(res.rows) == N
    assert (snap.waiting, snap.running, snap.kv_usage) == (0, 0, 0)
    assert snap.preemptions_total == st["preemptions"] > 20
    h = snap.histograms
    assert h["ttft"] is not None and h["e2e"] is not None and h["queue"] is not None and h["itl"] is not None
    assert h["ttft"].count == h["e2e"].count == h["queue"].count == N
    assert h["itl"].count == sum(r.itl_n for r in res.rows)
    assert abs(h["itl"].sum - sum(r.itl_sum_ms for r in res.rows) / 1000.0) < 1e-6
    assert h["queue"].sum > 0  # the storm keeps requests waiting for blocks
    # the engine's TTFT starts when the request reaches it and ends when the token leaves it: the
    # gateway's adds the way there and back (here 2 x net_delay_s, nothing queues at the gateway)
    gateway = sum(r.ttft_ms for r in res.rows if r.ttft_ms is not None) / 1000.0
    assert abs(gateway - h["ttft"].sum - N * 2 * sim.cfg.net_delay_s) < N * 2e-6
    # every admission queries the cache with what it prefills (recomputes again); no prefix sharing
    prompts = sum(r.prompt for r in res.rows)
    assert snap.prefix_cache_queries_total is not None and snap.prefix_cache_queries_total > prompts
    assert snap.prefix_cache_hits_total == 0


def test_a_paced_run_serves_each_replicas_vllm_series(tmp_path: Path) -> None:
    from llmsla.services import free_port

    port = free_port()
    rc: list[int] = []
    argv = ["simulate", "--load", "poisson", "--rate", "20", "--duration", "6", "--fleet", "6b:2",
            "--realtime", "4", "--metrics-port", str(port), "--spool", str(tmp_path / "s")]
    th = threading.Thread(target=lambda: rc.append(cli.main(argv)))
    th.start()
    seen: dict[str, EngineSnapshot] = {}
    missing = None
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):  # bounded: 300 x 10 ms
        try:
            for rid in ("r0", "r1"):
                with urllib.request.urlopen(f"{base}/replicas/{rid}/metrics", timeout=1) as resp:
                    body = resp.read().decode()
                    assert "llmsla_" not in body  # the replica's own series only
                    seen[rid] = from_text(body, resp.headers.get("Content-Type"), names.ENGINE_AUTO,
                                          replica=rid, pool=names.DEFAULT_POOL, ts=time.time())
            if missing is None:
                try:
                    urllib.request.urlopen(f"{base}/replicas/r9/metrics", timeout=1)
                except urllib.error.HTTPError as exc:
                    missing = exc.code
            if all((s.histograms["ttft"] or _empty()).count > 0 for s in seen.values()) and len(seen) == 2:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.01)
    th.join(timeout=30)
    assert rc == [0]
    assert missing == 404
    assert len(seen) == 2 and all(s.engine == "vllm" for s in seen.values())
    assert all((s.histograms["ttft"] or _empty()).count > 0 for s in seen.values()), seen


def _empty():
    from llmsla.engines.parse import Histogram

    return Histogram((), (), 0.0, 0)
