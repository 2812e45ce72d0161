"""A single-process gateway saturated on purpose reads the TTFT its clients feel (within 10 % at
p99): every request's clock starts when the kernel had its head, so the time it waited for the
busy event loop to read it and run its handler is in its TTFT (and its queue time), and the
loop's lag is exported.

Three real processes: a fast streaming upstream (a thread here), ``llmsla gateway`` and a raw
socket client that opens every connection first, then sends every request within a millisecond
or two and stamps the first SSE bytes of each response with epoll, so its own cost per event
is microseconds (the gateway's TTFT can only be below the client's: it starts later and stops
earlier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from llmsla import names
from llmsla.httpkit import BackgroundServer
from llmsla.services import free_port
from llmsla.spool import published_segments, read_segment

N = 400  # requests sent at once: a few hundred ms of one core's gateway work


def _runnable_ms(pid: int) -> float:
    """Time the gateway's loop thread has spent runnable but not running (``/proc/<pid>/schedstat``,
    the run-queue delay): the CPU was given to other processes while its bytes waited."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e6


CLIENT = textwrap.dedent('''
    import json, select, socket, sys, time
    port, n = int(sys.argv[1]), int(sys.argv[2])
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(1.0)  # every connection accepted before the burst
    ep = select.epoll()
    for i, s in enumerate(socks):
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
    fd = {s.fileno(): i for i, s in enumerate(socks)}
    heads = [(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
              b"Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(body)) + body for _ in socks]
    sent, first, buf, done = [0.0] * n, [None] * n, [b""] * n, 0
    for i, s in enumerate(socks):
        sent[i] = time.perf_counter()
        s.sendall(heads[i])
    while done < n:
        for f, _ in ep.poll(30):
            i = fd[f]
            now = time.perf_counter()
            data = socks[i].recv(65536)
            if data:
                buf[i] += data
                if first[i] is None and b"\\r\\n\\r\\n" in buf[i] and b"data: " in buf[i].split(b"\\r\\n\\r\\n", 1)[1]:
                    first[i] = now
            if not data:  # Connection: close: the response ends with the connection
                ep.unregister(f)
                done += 1
    out = []
    for i in range(n):
        head = buf[i].split(b"\\r\\n\\r\\n", 1)[0].decode("latin-1")
        rid = next((h.split(":", 1)[1].strip() for h in head.split("\\r\\n") if h.lower().startswith("x-request-id:")), None)
        out.append({"request_id": rid, "status": head.split(" ", 2)[1],
                    "ttft_ms": None if first[i] is None else (first[i] - sent[i]) * 1000.0})
    print(json.dumps({"burst_ms": (sent[-1] - sent[0]) * 1000.0, "requests": out}))
''')


async def _stream(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(3):
        chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


@pytest.mark.exclusive  # the gateway's clock against its client's, to a millisecond, on these cores
def test_a_saturated_gateway_reads_the_ttft_its_clients_feel(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _stream)
    spool = tmp_path / "spool"
    with BackgroundServer() as bg:
        upstream = bg.serve(app, "127.0.0.1", 0)
        port = free_port()
        env = {**os.environ, "LLMSLA_SPOOL_DIR": str(spool), "LLMSLA_GATEWAY_UPSTREAMS": upstream.url,
               "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin", "LLMSLA_GATEWAY_CLIENT_SHARE": "1",
               "LLMSLA_GATEWAY_MAX_CONCURRENCY": str(N), "LLMSLA_GATEWAY_REQUEST_USAGE": "false"}
        log = tmp_path / "gateway.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gateway", "--host", "127.0.0.1",
                                     "--port", str(port)], env=env, stdout=fh, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc, log)
            # the burst must be one: a client descheduled while sending (a busy runner) spreads it
            # out, and then nothing queued. Such a run measures nothing, so it is sent again.
            sent_ids: set[str] = set()
            for _attempt in range(3):
                waited_before = _runnable_ms(proc.pid)
                res = subprocess.run([sys.executable, "-c", CLIENT, str(port), str(N)], capture_output=True,
                                     text=True, timeout=120)
                assert res.returncode == 0, res.stderr[-3000:]
                client = json.loads(res.stdout)
                client["gateway_waited_ms"] = _runnable_ms(proc.pid) - waited_before
                sent_ids |= {r["request_id"] for r in client["requests"]}
                if client["burst_ms"] < 50:
                    break
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                exposition = r.read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)  # SIGTERM: the spool is flushed
    got = {r["request_id"]: r for r in client["requests"]}
    bad = [r for r in got.values() if r["status"] != "200" or r["ttft_ms"] is None]
    assert not bad, (len(bad), bad[:3])
    events = {e.trace_id: e for seg in published_segments(spool, names.SPOOL_REQUESTS)
              for e in read_segment(seg, names.SPOOL_REQUESTS)}
    assert set(events) == sent_ids and len(got) == N  # every request of every burst has its event
    gw = np.array([events[k].ttft_ms for k in got])
    cl = np.array([got[k]["ttft_ms"] for k in got])
    queue = np.array([events[k].queue_ms for k in got])
    under = cl - gw  # what the client felt that the gateway did not count
    # the burst saturated the gateway: the last requests waited in it (its own queue time)
    assert client["burst_ms"] < 50 and np.percentile(queue, 99) > 20, (client["burst_ms"], np.percentile(queue, 99))
    # and it counted that wait, with the time its bytes sat in the kernel while the loop ran other
    # handlers (llmsla.tcpinfo: to within two kernel ticks). Both scale with how slow the machine
    # is (a busy CI runner took 3x longer for the same burst), so the bounds are shares of the
    # client's TTFT p99: a clock started by the handler missed 57-96 ms at the median, a third of
    # that p99, and read 0.58-0.66 of it (its queue p99 was 0.2 ms); a clock started at the read
    # missed up to 52-58 ms at p99 and read 0.81-0.98; started at the kernel's arrival it misses
    # 5-10 ms at p99 (a tick or two, and the client's own epoll) and reads 0.96-0.99, also
    # beside two CPU burners
    print(f"under-read ms p50/p95/p99 {np.percentile(under, [50, 95, 99]).round(1)}, TTFT p99 gateway "
          f"{np.percentile(gw, 99):.1f} client {np.percentile(cl, 99):.1f}, queue p99 {np.percentile(queue, 99):.1f}")
    assert under.min() > -1.0, under.min()  # its clock starts after the client's send, ends before
    assert np.percentile(under, 50) < 0.1 * np.percentile(cl, 99), (np.percentile(under, [50, 95, 99]),
                                                                  np.percentile(cl, 99))
    assert np.percentile(gw, 99) / np.percentile(cl, 99) > 0.9, (  # with what the run-queue took from it
        np.percentile(gw, 99), np.percentile(cl, 99), client["gateway_waited_ms"])
    # the loop's lag is exported for the saturation page
    assert f"{names.GATEWAY_LOOP_LAG_SECONDS}_count" in exposition
    assert f"\n{names.GATEWAY_ACCEPT_BACKLOG_MAX} " in exposition
