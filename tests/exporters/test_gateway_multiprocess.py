"""``llmsla gateway --workers 2``: two processes on one port (SO_REUSEPORT) whose /metrics, from
whichever process answers, is the exact merge of both (prometheus_client multiprocess mode)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from llmsla import config as config_mod
from llmsla import names
from llmsla.services import free_port
from llmsla.spool import published_segments, read_segment
from llmsla.worker.server import WorkerThread

N = 200


def _total(text: str, metric: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(metric + "{") or line.startswith(metric + " "))


def test_two_processes_one_port_merged_metrics(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    port = free_port()
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    spool = tmp_path / "spool"
    with WorkerThread(cfg) as worker:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir), "LLMSLA_SPOOL_DIR": str(spool),
               "LLMSLA_SPOOL_SEGMENT_MAX_AGE_S": "0.2", "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin"}
        log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gateway", "--workers", "2", "--host",
                                 "127.0.0.1", "--port", str(port), "--upstream", worker.url],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            async def main() -> tuple[set[int], list[str]]:
                pids: set[int] = set()
                # fresh connection per request, so the kernel spreads them over both processes
                conn = aiohttp.TCPConnector(force_close=True)
                async with aiohttp.ClientSession(connector=conn) as s:
                    deadline = time.monotonic() + 60
                    while len(pids) < 2:
                        assert time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()
                        assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
                        try:
                            async with s.get(url + "/healthz") as r:
                                pids.add((await r.json())["pid"])
                        except aiohttp.ClientError:
                            await asyncio.sleep(0.2)
                    sem = asyncio.Semaphore(8)

                    async def one(i: int) -> None:
                        body = {"model": cfg.worker.model, "prompt": f"hi {i}", "max_tokens": 2, "stream": i % 2 == 0}
                        async with sem, s.post(url + "/v1/completions", json=body) as r:
                            await r.read()
                            assert r.status == 200

                    await asyncio.gather(*(one(i) for i in range(N)))
                    scrapes = []
                    for _ in range(6):
                        async with s.get(url + "/metrics") as r:
                            scrapes.append(await r.text())
                return pids, scrapes

            pids, scrapes = asyncio.run(main())
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            log.close()
    assert rc == 0, (tmp_path / "gateway.log").read_text()
    assert len(pids) == 2
    for text in scrapes:  # every scrape, whichever process served it, sees all requests
        assert _total(text, f"{names.REQUESTS}_total") == N
        assert _total(text, f"{names.REQUEST_E2E_SECONDS}_count") == N
        assert _total(text, names.REQUESTS_IN_FLIGHT) == 0
        assert _total(text, f"{names.ROUTER_PICKS}_total") == N  # the routers' metrics, merged too
        assert f'{names.DISTILL_STUDENT_SHARE_RATIO}{{pool="default"}} 0.0' in text
    segments = published_segments(spool, names.SPOOL_REQUESTS)
    events = [e for seg in segments for e in read_segment(seg, names.SPOOL_REQUESTS)]
    assert len(events) == N and all(e.status == "ok" for e in events)
    writer_pids = {int(seg.name.split("-")[-3]) for seg in segments}
    assert writer_pids == pids  # both processes served (and spooled) requests
