"""Every PromQL query of the dashboards, run as Grafana runs it, against a real Prometheus that
scraped real exporters after real traffic: the gateway in front of two reference workers (request
histograms, counters, in-flight, router picks and weights, a shed class; worker queue gauges) and a GPU
recorder's gauges and health signals; ``llmsla engines`` (its own process, as deployed) scraping the
workers' own vLLM-named /metrics into ``llmsla_engine_*``; plus one always-firing alert rule so
``ALERTS`` has a firing series.

Each query must return series carrying the labels its panel groups by, with finite values; the
heatmaps' per-bucket values must add up to the request rate (Grafana's de-accumulation) and the
quantiles must be ordered. Queries whose data another issue produces (``Pending``) are run too:
while the producer's artefact is absent they must parse and return nothing, and are listed in a
warning; once it exists (Sloth rule files under deploy/prometheus) they are validated like the
rest, and a forecaster that exports its metric fails this test until the test runs it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.utils import floatToGoString

from llmsla import config as config_mod
from llmsla import names, services
from llmsla.app import wiring
from llmsla.dashboards import promql, runner
from llmsla.dashboards.macros import TimeRange, Variable, calculate_interval_ms, rate_interval_ms
from llmsla.dashboards.query import REGISTRY, SLOTH_RULES, PromQuery
from llmsla.events import GpuSample
from llmsla.exporters.gpu_signals import DeviceSignals, SignalRecorder
from llmsla.exporters.recorder import GpuRecorder
from llmsla.forecaster.accuracy import Accuracy
from llmsla.forecaster.live_accuracy import AccuracyMetrics
from llmsla.forecaster.online import Metrics as ForecastMetrics
from llmsla.services import free_port
from llmsla.worker.server import WorkerThread

ROOT = Path(__file__).resolve().parents[2]
N_REQUESTS = 240
N_SHED = 8  # batch requests while half the class is shed: half served, half refused
SCRAPE_S = 0.5
PROBE_RULES = f"""groups:
  - name: llmsla-dashboard-probe
    rules:
      - alert: LlmslaDashboardProbe
        expr: vector(1)
        labels:
          {names.L_SEVERITY}: ticket
          {names.L_SLO}: probe
"""


def sloth_rule_files() -> dict[str, str]:
    """Rule files the alerting issue generates (any YAML under deploy/prometheus with Sloth SLIs)."""
    base = ROOT / "deploy" / "prometheus"
    found = {}
    for p in sorted(base.rglob("*.y*ml")) if base.is_dir() else []:
        text = p.read_text()
        if "slo:sli_error:ratio_rate" in text and "record:" in text:
            found[f"sloth-{len(found)}-{p.name}"] = text
    return found


async def _traffic(url: str, model: str, waves: int = 3) -> None:
    """N_REQUESTS in waves a few scrapes apart, so every rate() window sees counters move."""
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as s:
        async def one(i: int) -> None:
            body = {"model": model, "prompt": "the quick brown fox " * (1 + i % 7), "max_tokens": 1 + i % 6,
                    "stream": i % 3 != 0}
            async with sem, s.post(f"{url}/v1/completions", json=body) as r:
                await r.read()
                assert r.status == 200

        per = N_REQUESTS // waves
        for w in range(waves):
            await asyncio.gather(*(one(w * per + i) for i in range(per)))
            await asyncio.sleep(3 * SCRAPE_S)


async def _shed_traffic(url: str, model: str, n: int = N_SHED) -> None:
    """Requests of the shed batch class: every second one is refused (429 shed_by_slo)."""
    async with aiohttp.ClientSession() as s:
        statuses = []
        for _ in range(n):
            async with s.post(f"{url}/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1},
                              headers={names.CLASS_HEADER: "batch"}) as r:
                await r.read()
                statuses.append(r.status)
    assert sorted(statuses) == [200] * (n // 2) + [429] * (n // 2), statuses


def test_every_promql_query_returns_what_its_panel_expects(tmp_path: Path, start_prometheus) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    sloth = sloth_rule_files()
    workers = [WorkerThread(cfg) for _ in range(2)]
    gpu_reg = CollectorRegistry()
    gpu = GpuRecorder(cfg, registry=gpu_reg)
    for i, used in enumerate((30 << 30, 70 << 30)):
        gpu.record(GpuSample(ts_ms=int(time.time() * 1000), node="n0", gpu=i, uuid=f"GPU-{i}", mem_used_bytes=used,
                             mem_total_bytes=80 << 30, util=0.5, temp_c=60.0, power_w=300.0), model_name="NVIDIA H200")
    # the collector's health signals, through its own recorder: GPU 1 power-capped, an XID on GPU 0
    signals = SignalRecorder(gpu.metrics)
    for i, mask in enumerate((0x1, 0x4)):
        signals.record((str(i), f"GPU-{i}", "NVIDIA H200"), DeviceSignals(sm_clock_hz=1.98e9, throttle_mask=mask))
    gpu.metrics.xid.labels("0", "GPU-0", "NVIDIA H200", "79").inc()
    # the forecaster's risk gauge (its own metric definition) on the same exporter: a replica
    # target and a pool target at two horizons (seconds), as the online scorer sets them
    risk = ForecastMetrics(gpu_reg).risk
    for horizon_s, scale in (("30", 1.0), ("300", 1.5)):
        risk.labels(names.FORECAST_TARGET_REPLICA, cfg.worker.model, cfg.gateway.pool, "r0", horizon_s).set(0.12 * scale)
        risk.labels(names.FORECAST_TARGET_POOL, cfg.worker.model, cfg.gateway.pool, "", horizon_s).set(0.34 * scale)
    # and its own accuracy, as the online scorer exports it after scoring the stored history
    own = AccuracyMetrics(gpu_reg)
    own.set({25: Accuracy(25, events=4, warned=2, leads_s=[20.0, 45.0], notifications=3, false_alarms=1,
                          healthy_days=0.5)})
    own.validation_recall.labels("lstm-test", "25").set(0.23)
    gpu_port = free_port()
    gpu_server, _ = start_http_server(gpu_port, addr="127.0.0.1", registry=gpu_reg)
    engine_port = free_port()
    engines: subprocess.Popen[str] | None = None
    engines_out = ""
    reg = CollectorRegistry()
    try:
        urls = [w.start() for w in workers]
        cfg.gateway.upstreams = urls
        # the engine adapter on the workers' own /metrics (ids r0, r1 as the gateway gives them)
        engines = subprocess.Popen(
            [sys.executable, "-m", "llmsla", "engines", "--type", names.ENGINE_VLLM, "--host", "127.0.0.1",
             "--port", str(engine_port), *(a for u in urls for a in ("--upstream", u))],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")},
                 "LLMSLA_SPOOL_DIR": str(tmp_path / "engine-spool"), "LLMSLA_ENGINE_SCRAPE_INTERVAL_S": str(SCRAPE_S)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
        services.wait_http(f"http://127.0.0.1:{engine_port}/healthz", proc=engines, timeout_s=60)

        async def main() -> tuple[str, dt.datetime]:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg) as gw:
                targets = [f"127.0.0.1:{gw.port}", *(u.removeprefix("http://") for u in urls), f"127.0.0.1:{gpu_port}",
                           f"127.0.0.1:{engine_port}"]
                prom = start_prometheus({"llmsla": targets}, interval_s=SCRAPE_S,
                                        extra_files={"probe.yml": PROBE_RULES, **sloth})
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:  # every target scraped once before traffic starts
                    up = await asyncio.to_thread(runner._get, f"{prom.url}/api/v1/query?query=sum(up)")
                    if up["result"] and float(up["result"][0]["value"][1]) == len(targets):
                        break
                    await asyncio.sleep(0.1)
                t0 = dt.datetime.now(dt.UTC)
                # load shedding, as the receiver sets it: half of the batch class refused
                gw.gateway.plane.shed.set_shares(cfg.gateway.pool, {"batch": 0.5}, actor="test")
                await _shed_traffic(gw.url, cfg.worker.model)
                await _traffic(gw.url, cfg.worker.model)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:  # every request scraped, and two more scrapes for rate()
                    got = await asyncio.to_thread(runner._get, f"{prom.url}/api/v1/query?query=sum({names.REQUESTS}_total)")
                    if got["result"] and float(got["result"][0]["value"][1]) == N_REQUESTS + N_SHED // 2:
                        break
                    await asyncio.sleep(0.25)
                await asyncio.sleep(4 * SCRAPE_S)
                return prom.url, t0

        prom_url, t0 = asyncio.run(main())
    finally:
        if engines is not None:
            engines.send_signal(signal.SIGTERM)
            engines_out, _ = engines.communicate(timeout=30)
        for w in workers:
            w.stop()
        gpu_server.shutdown()
    assert engines is not None and engines.returncode == 0, engines_out

    rng = TimeRange(t0 - dt.timedelta(seconds=5), dt.datetime.now(dt.UTC))
    interval = calculate_interval_ms(rng, 60, f"{int(SCRAPE_S * 1000)}ms")

    # the variables, chained as Grafana refreshes them; "All" = every value listed
    variables: dict[str, Variable] = {}
    for name, q in ((names.L_MODEL, promql.VAR_MODEL), (names.L_POOL, promql.VAR_POOL),
                    (names.L_REPLICA, promql.VAR_REPLICA), (names.L_ARM, promql.VAR_ARM)):
        values = runner.prom_label_values(prom_url, q, rng, variables)
        variables[name] = Variable(tuple(values))
    assert variables[names.L_MODEL].values == (cfg.worker.model,)
    assert variables[names.L_POOL].values == (cfg.gateway.pool,)
    assert variables[names.L_REPLICA].values == ("r0", "r1")
    assert variables[names.L_ARM].values == (names.DEFAULT_ARM,)

    pending: list[str] = []
    checked = 0
    for q in REGISTRY.values():
        if not isinstance(q, PromQuery) or q.key.startswith("var.") and q is not promql.VAR_SLO:
            continue
        if q is promql.VAR_SLO:
            values = runner.prom_label_values(prom_url, q, rng, variables)
            if sloth:
                assert values, "Sloth rules are loaded: the SLO variable must list them"
                variables[names.L_SLOTH_SLO] = Variable(tuple(values))
            else:
                assert values == []
                pending.append(q.key)
            continue
        series = runner.prom_range(prom_url, q, rng, interval, variables, scrape_interval_s=SCRAPE_S)
        if q.pending is SLOTH_RULES and not sloth:
            assert series == [], (q.key, "no producer yet, so no data expected")
            pending.append(q.key)
            continue
        assert series, f"{q.key}: no data ({q.expr})"
        for s in series:
            for lbl in q.labels:
                assert s.labels.get(lbl), (q.key, lbl, s.labels)
        finite = [v for s in series for v in s.values if math.isfinite(v)]
        assert finite, f"{q.key}: only NaN"
        checked += 1
    assert checked == sum(1 for q in REGISTRY.values() if isinstance(q, PromQuery) and not q.key.startswith("var.")
                          and q.key not in pending)
    qps = runner.prom_range(prom_url, promql.QPS, rng, interval, variables, scrape_interval_s=SCRAPE_S)
    assert max(v for s in qps for v in s.values if math.isfinite(v)) > 0

    # heatmaps: one series per configured bound (+Inf), per-bucket values summing to the rate
    total = runner.prom_range(prom_url, PromQuery("check.rate", f"sum(rate({names.REQUEST_TTFT_SECONDS}_count[$__rate_interval]))"),
                              rng, interval, scrape_interval_s=SCRAPE_S)[0]
    buckets = runner.prom_range(prom_url, promql.TTFT_HEATMAP, rng, interval, variables, scrape_interval_s=SCRAPE_S)
    assert [s.labels["le"] for s in buckets] == [floatToGoString(b) for b in cfg.metrics.ttft_buckets] + ["+Inf"]
    # rate() extrapolates each bucket's series to its window's start on its own (Prometheus'
    # extrapolatedRate): one whose first sample is near 0 by up to 1.1 scrape intervals, its
    # neighbour by half of one. Where a window holds the first requests a de-accumulated bucket
    # can so read below 0, by at most that share of the rate (a CI run once read one below 0); the
    # column still sums to the total exactly
    sampled = rate_interval_ms(interval, SCRAPE_S) / 1000 - 2 * SCRAPE_S  # the least a window's samples span
    skew = 0.6 * SCRAPE_S / sampled * (1 + 1.1 * SCRAPE_S / sampled)
    for i, t in enumerate(total.times):
        col = [s.values[s.times.index(t)] for s in buckets if t in s.times]
        assert all(v >= -skew * total.values[i] - 1e-9 for v in col), (t, col, total.values[i])
        assert math.isclose(sum(col), total.values[i], rel_tol=1e-9, abs_tol=1e-9)
    # quantiles are ordered at every step
    p50, p95, p99 = (runner.prom_range(prom_url, q, rng, interval, variables, scrape_interval_s=SCRAPE_S)[0]
                     for q in promql.TTFT_QUANTILES)
    for a, b, c in zip(p50.values, p95.values, p99.values, strict=True):
        if math.isfinite(a):
            assert a <= b <= c
    # throttling: the power-capped GPU shows, the idle one's benign reason is left out
    throttled = runner.prom_range(prom_url, promql.GPU_THROTTLE, rng, interval, variables, scrape_interval_s=SCRAPE_S)
    active = {(s.labels[names.L_GPU], s.labels[names.L_REASON]) for s in throttled if 1 in s.values}
    assert active == {("1", "sw_power_cap")}
    assert not any(s.labels[names.L_REASON] in names.GPU_THROTTLE_BENIGN for s in throttled)
    # the engine row: one series per replica, the way the gateway names them; values in range
    for q, lo, hi in ((promql.ENGINE_WAITING, 0, math.inf), (promql.ENGINE_RUNNING, 0, math.inf),
                      (promql.ENGINE_KV_USAGE, 0, 1), (promql.ENGINE_PREEMPTIONS, 0, math.inf),
                      (promql.ENGINE_PREFIX_HITS, 0, 1)):
        series = runner.prom_range(prom_url, q, rng, interval, variables, scrape_interval_s=SCRAPE_S)
        assert sorted(s.labels[names.L_REPLICA] for s in series) == ["r0", "r1"], (q.key, series)
        assert all(lo <= v <= hi for s in series for v in s.values if math.isfinite(v)), q.key
    alerts = runner.prom_range(prom_url, promql.FIRING_ALERTS, rng, interval, variables)
    assert any(s.labels[names.L_ALERTNAME] == "LlmslaDashboardProbe" and s.labels[names.L_SLO] == "probe" for s in alerts)

    expected_pending = {q.key for q in REGISTRY.values() if isinstance(q, PromQuery)
                        and q.pending is SLOTH_RULES and not sloth}
    assert set(pending) == expected_pending
    if pending:
        warnings.warn(f"{len(pending)} dashboard queries parse but wait for their data: {', '.join(sorted(pending))} "
                      f"(Sloth rules: {SLOTH_RULES.component})", stacklevel=1)
