"""OTLP GenAI metrics beside Prometheus: a real OTLP/HTTP receiver on loopback decodes what the
gateway exports; the points carry the bounds the conventions advise and equal the Prometheus
histograms' counts and sums for the same traffic and the RequestEvents of the spool (TTFT and TPOT
once per successful streamed request, token usage as the replica reported it); ``--workers 2``
does not double count."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.exporters import genai
from llmsla.services import free_port
from llmsla.worker.server import WorkerThread
from tests.exporters.otlp_receiver import OtlpReceiver, attributes
from tests.exporters.test_genai_tracing import request_events
from tests.worker._worker_util import MODEL, worker_cfg

#: OTLP metric -> its Prometheus twin: the same observations (in this traffic no stream fails
#: after its first token), bucketed by different bounds (advised vs SLO-aligned)
TWINS = {
    genai.TIME_TO_FIRST_TOKEN[0]: names.REQUEST_TTFT_SECONDS,
    genai.TIME_PER_OUTPUT_TOKEN[0]: names.REQUEST_TPOT_SECONDS,
    genai.REQUEST_DURATION[0]: names.REQUEST_E2E_SECONDS,
}
#: the explicit bounds the conventions advise (semantic conventions v1.41.1, gen-ai-metrics.md)
ADVISED = {
    "gen_ai.server.time_to_first_token": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                          2.5, 5.0, 7.5, 10.0],
    "gen_ai.server.time_per_output_token": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
    "gen_ai.server.request.duration": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                                       40.96, 81.92],
    "gen_ai.client.operation.duration": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                                         40.96, 81.92],
    "gen_ai.client.token.usage": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                                  67108864],
}
LABELS = (genai.REQUEST_MODEL, names.OTEL_ATTR_POOL, names.OTEL_ATTR_REPLICA, names.OTEL_ATTR_ARM)


def prometheus(text: str) -> dict[tuple[str, tuple], Any]:
    """``{(family, (model, pool, replica, arm)): {count, sum, buckets: [cumulative...]}}`` for the
    request histograms, and ``{(tokens, labels + kind): value}`` for the token counter."""
    out: dict[tuple[str, tuple], Any] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = tuple(s.labels.get(lbl) for lbl in names.REQUEST_LABELS)
            if fam.type == "histogram":
                h = out.setdefault((fam.name, key), {"count": 0, "sum": 0.0, "buckets": {}})
                if s.name.endswith("_count"):
                    h["count"] = int(s.value)
                elif s.name.endswith("_sum"):
                    h["sum"] = s.value
                elif s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                    h["buckets"][float(s.labels["le"])] = int(s.value)
            elif fam.name == names.TOKENS and s.name.endswith("_total"):
                out[(fam.name, (*key, s.labels[names.L_KIND]))] = s.value
    return out


def otlp(points: list[tuple[dict, str, Any]]) -> tuple[dict, dict, list[dict]]:
    """The latest cumulative point of every (instance, metric, attribute set), summed over
    instances and over the attributes Prometheus has no label for (operation, error.type,
    server, response model), keyed like :func:`prometheus`."""
    latest: dict[tuple, tuple[dict, str, Any]] = {}
    for res, name, p in points:
        attrs = attributes(p.attributes)
        k = (res["service.instance.id"], name, tuple(sorted(attrs.items())))
        if k not in latest or p.time_unix_nano >= latest[k][2].time_unix_nano:
            latest[k] = (attrs, name, p)
    hists: dict[tuple[str, tuple], Any] = {}
    tokens: dict[tuple, float] = defaultdict(float)
    for attrs, name, p in latest.values():
        key = tuple(attrs[a] for a in LABELS)
        if name == genai.TOKEN_USAGE[0]:
            kind = names.TOKEN_KIND_PROMPT if attrs[genai.TOKEN_TYPE] == genai.TOKEN_INPUT else names.TOKEN_KIND_OUTPUT
            tokens[(names.TOKENS, (*key, kind))] += p.sum
            continue
        h = hists.setdefault((name, key), {"count": 0, "sum": 0.0, "counts": [0] * len(p.bucket_counts),
                                           "bounds": list(p.explicit_bounds)})
        assert h["bounds"] == list(p.explicit_bounds)
        h["count"] += p.count
        h["sum"] += p.sum
        h["counts"] = [a + b for a, b in zip(h["counts"], p.bucket_counts, strict=True)]
    return hists, dict(tokens), [a for a, _, _ in latest.values()]


def assert_equal_to_prometheus(prom: dict, hists: dict) -> None:
    for otlp_name, prom_name in TWINS.items():
        mine = {k: v for (n, k), v in hists.items() if n == otlp_name}
        theirs = {k: v for (n, k), v in prom.items() if n == prom_name and v["count"]}
        assert set(mine) == set(theirs), (otlp_name, set(mine), set(theirs))
        for key, h in mine.items():
            p = theirs[key]
            assert h["bounds"] == ADVISED[otlp_name]
            assert h["count"] == p["count"] == sum(h["counts"]), (otlp_name, key)
            assert math.isclose(h["sum"], p["sum"], rel_tol=1e-9, abs_tol=1e-12)


class _DyingReplica:
    """A replica that is down but still accepts: every connection is closed at once, unanswered
    (a process that crashes on each request). The gateway has sent the request, so it cannot try
    another replica: the request ends in error on this one. (A port with nothing listening would
    not do: a refused connection goes to another replica, tests/exporters/test_gateway_failover.py.)"""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)  # the request arrived; then the process "dies"

    def close(self) -> None:
        self.sock.close()


def test_otlp_points_equal_prometheus_histograms_and_the_spool(tmp_path: Path) -> None:
    """Mixed traffic: chat and completions, streamed and not, an upstream that refuses the model
    (rejected, the model folded to 'other'), a replica that is down (error)."""
    dying = _DyingReplica()
    with OtlpReceiver() as rx:
        cfg = worker_cfg(tmp_path)
        with WorkerThread(cfg) as wt:
            g = config_mod.load(env={})
            g.spool.dir, g.spool.segment_max_age_s = str(tmp_path / "gw-spool"), 0.05
            dead = dying.url
            g.gateway.upstreams = [wt.url, dead]
            g.control.route_policy = "round_robin"
            g.otel.metrics_endpoint = rx.metrics_url
            g.otel.metrics_interval_s = 3600.0  # exported by force_flush only: one consistent cut
            reg = CollectorRegistry()

            async def main() -> tuple[str, list[int], dict[str, bool]]:
                statuses = []
                streamed: dict[str, bool] = {}  # X-Request-Id (the trace id) -> the request streamed
                async with wiring.serve_gateway(g, "127.0.0.1", 0, registry=reg) as gw, aiohttp.ClientSession() as s:
                    for i in range(24):
                        chat = i % 2 == 0
                        body: dict[str, Any] = {"model": "no-such-model" if i % 7 == 3 else MODEL,
                                                "stream": i % 3 != 0, "max_tokens": 1 + i % 9, "ignore_eos": True}
                        if chat:
                            body["messages"] = [{"role": "user", "content": f"request {i}"}]
                        else:
                            body["prompt"] = f"request {i}"
                        path = "/v1/chat/completions" if chat else "/v1/completions"
                        async with s.post(gw.url + path, json=body) as r:
                            await r.read()
                            statuses.append(r.status)
                            streamed[r.headers["X-Request-Id"]] = body["stream"]
                    assert gw.gateway.telemetry.force_flush()
                    async with s.get(gw.url + "/metrics") as r:
                        return await r.text(), statuses, streamed

            text, statuses, streamed = asyncio.run(main())
        points = rx.histogram_points()
    dying.close()
    events = request_events(g)
    assert len(events) == 24
    by_status = Counter(e.status for e in events)
    assert by_status[names.STATUS_OK] >= 10 and by_status[names.STATUS_ERROR] >= 5 and by_status[names.STATUS_REJECTED] >= 1
    hists, tokens, attr_sets = otlp(points)
    assert_equal_to_prometheus(prometheus(text), hists)
    assert {e.trace_id for e in events} == set(streamed)

    # the independent reference: the RequestEvents themselves
    def fold(model: str) -> str:
        return model if model == MODEL else names.LABEL_OVERFLOW_VALUE

    expect_count: Counter = Counter()
    expect_ttft: Counter = Counter()
    expect_tpot: Counter = Counter()
    expect_tokens: Counter = Counter()
    expect_client: Counter = Counter()
    expect_client_s: dict[tuple, float] = defaultdict(float)
    for e in events:
        key = (fold(e.model), e.pool, e.replica, e.arm)
        if e.replica != names.NO_REPLICA:  # the gateway called a replica: its CLIENT span's duration
            expect_client[key] += 1
            expect_client_s[key] += (e.e2e_ms - e.queue_ms) / 1000.0
        ok_stream = e.status == names.STATUS_OK and streamed[e.trace_id]
        expect_count[key] += 1
        expect_ttft[key] += ok_stream
        expect_tpot[key] += ok_stream and e.output_tokens >= 2
        if e.status == names.STATUS_OK:  # only a replica's answer reports usage
            expect_tokens[(names.TOKENS, (*key, names.TOKEN_KIND_PROMPT))] += e.prompt_tokens
            expect_tokens[(names.TOKENS, (*key, names.TOKEN_KIND_OUTPUT))] += e.output_tokens
    assert sum(expect_ttft.values()) >= 5 and sum(expect_tpot.values()) >= 3
    assert {k: v["count"] for (n, k), v in hists.items() if n == genai.REQUEST_DURATION[0]} == dict(expect_count)
    assert {k: v["count"] for (n, k), v in hists.items() if n == genai.TIME_TO_FIRST_TOKEN[0]} == \
        {k: v for k, v in expect_ttft.items() if v}
    assert {k: v["count"] for (n, k), v in hists.items() if n == genai.TIME_PER_OUTPUT_TOKEN[0]} == \
        {k: v for k, v in expect_tpot.items() if v}
    assert tokens == {k: v for k, v in expect_tokens.items() if v}
    client = {k: v for (n, k), v in hists.items() if n == genai.CLIENT_DURATION[0]}
    assert {k: v["count"] for k, v in client.items()} == dict(expect_client) and sum(expect_client.values()) >= 20
    for k, v in client.items():
        assert v["bounds"] == ADVISED[genai.CLIENT_DURATION[0]] and sum(v["counts"]) == v["count"]
        assert math.isclose(v["sum"], expect_client_s[k], rel_tol=1e-9)

    # the conventions' attributes: error.type exactly on the requests that did not end ok,
    # server.address/port of the replica that served, both operations
    worker_host, worker_port = genai.server_of(wt.url)
    dead_host, dead_port = genai.server_of(dead)
    for a in attr_sets:
        assert a[genai.PROVIDER_NAME] == names.GENAI_PROVIDER
        if a[names.OTEL_ATTR_REPLICA] == "r0":
            assert (a[genai.SERVER_ADDRESS], a[genai.SERVER_PORT]) == (worker_host, worker_port)
        else:
            assert (a[genai.SERVER_ADDRESS], a[genai.SERVER_PORT]) == (dead_host, dead_port)
            assert a[genai.ERROR_TYPE] == names.STATUS_ERROR
        if a[genai.REQUEST_MODEL] == names.LABEL_OVERFLOW_VALUE and a[names.OTEL_ATTR_REPLICA] == "r0":
            assert a[genai.ERROR_TYPE] == names.STATUS_REJECTED  # the worker refused the unknown model
        if genai.ERROR_TYPE not in a:
            assert a[genai.RESPONSE_MODEL] == MODEL
    assert {a[genai.OPERATION_NAME] for a in attr_sets} == {genai.CHAT, genai.TEXT_COMPLETION}
    assert {(a.get(genai.ERROR_TYPE)) for a in attr_sets} == {None, names.STATUS_ERROR, names.STATUS_REJECTED}


def test_two_gateway_processes_export_two_streams_that_sum_to_the_traffic(tmp_path: Path) -> None:
    """``--workers 2``: each process exports its own requests under its own service.instance.id
    (periodically and once more at shutdown); their sum equals the merged Prometheus counts."""
    n = 60
    with OtlpReceiver() as rx:
        cfg = worker_cfg(tmp_path)
        with WorkerThread(cfg) as worker:
            port = free_port()
            mp_dir = tmp_path / "prom"
            mp_dir.mkdir()
            env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir), "LLMSLA_SPOOL_DIR": str(tmp_path / "spool"),
                   "LLMSLA_OTEL_METRICS_ENDPOINT": rx.metrics_url, "LLMSLA_OTEL_METRICS_INTERVAL_S": "0.5"}
            log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gateway", "--workers", "2", "--host", "127.0.0.1",
                                     "--port", str(port), "--upstream", worker.url],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            try:
                async def main() -> tuple[set[int], str]:
                    pids: set[int] = set()
                    conn = aiohttp.TCPConnector(force_close=True)  # the kernel spreads new connections
                    async with aiohttp.ClientSession(connector=conn) as s:
                        deadline = time.monotonic() + 60
                        while len(pids) < 2:
                            assert time.monotonic() < deadline and proc.poll() is None, \
                                (tmp_path / "gateway.log").read_text()
                            try:
                                async with s.get(url + "/healthz") as r:
                                    pids.add((await r.json())["pid"])
                            except aiohttp.ClientError:
                                await asyncio.sleep(0.2)
                        sem = asyncio.Semaphore(8)

                        async def one(i: int) -> None:
                            body = {"model": MODEL, "prompt": f"hi {i}", "max_tokens": 3, "stream": i % 2 == 0}
                            async with sem, s.post(url + "/v1/completions", json=body) as r:
                                await r.read()
                                assert r.status == 200

                        await asyncio.gather(*(one(i) for i in range(n)))
                        async with s.get(url + "/metrics") as r:
                            return pids, await r.text()

                pids, text = asyncio.run(main())
            finally:
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(timeout=30)
                log.close()
        points = rx.histogram_points()
    assert rc == 0, (tmp_path / "gateway.log").read_text()
    assert len(pids) == 2
    instances = {res["service.instance.id"] for res, _, _ in points}
    assert len(instances) == 2
    hists, tokens, _ = otlp(points)
    prom = prometheus(text)
    assert_equal_to_prometheus(prom, hists)
    assert tokens == {(n, k): v for (n, k), v in prom.items() if n == names.TOKENS and v}  # every request ok
    assert sum(v["count"] for (name, _), v in hists.items() if name == genai.REQUEST_DURATION[0]) == n
    per_instance = Counter()
    for res, name, p in points:
        if name == genai.REQUEST_DURATION[0]:
            per_instance[res["service.instance.id"]] = max(per_instance[res["service.instance.id"]], p.count)
    assert all(0 < c < n for c in per_instance.values())  # both served, neither counted the other's


def test_an_unreachable_collector_does_not_hold_up_the_gateways_stop() -> None:
    """Spans and metric points pending, nothing listening at either endpoint: the telemetry's
    shutdown gives up after SHUTDOWN_S (the exporters alone would retry ~10 s each, in turn)."""
    from llmsla.events import ItlSummary, RequestEvent
    from llmsla.exporters.gateway_telemetry import SHUTDOWN_S, GatewayTelemetry
    from llmsla.exporters.metrics import LabelGuard
    from llmsla.exporters.openai import parse_request
    from llmsla.exporters.recorder import StreamTimer

    cfg = config_mod.load(env={})
    dead = free_port()
    cfg.otel.endpoint = f"http://127.0.0.1:{dead}/v1/traces"
    cfg.otel.metrics_endpoint = f"http://127.0.0.1:{dead}/v1/metrics"
    tel = GatewayTelemetry(cfg, LabelGuard(10))
    req = parse_request(b'{"model": "m", "prompt": "hi"}', "/v1/completions", max_prompt_chars=100)
    for _ in range(20):
        t = tel.begin({}, "POST", "/v1/completions", req, time.perf_counter())
        tel.hop(t, "http://127.0.0.1:9001", req, {}, time.perf_counter())
        ev = RequestEvent(ts_ms=1_700_000_000_000, trace_id=t.trace_id, model="m", pool="p", replica="r0", arm="a",
                          policy="constant", prompt_tokens=2, output_tokens=1, queue_ms=0.1, ttft_ms=1.0,
                          itl_ms=ItlSummary.from_gaps([]), e2e_ms=2.0, status="ok")
        tel.end(t, ev, StreamTimer(0.0, streaming=False), "http://127.0.0.1:9001", admit=True)
        tel.finish(t, 200)
    t0 = time.monotonic()
    tel.shutdown()
    assert time.monotonic() - t0 < SHUTDOWN_S + 2.0
