"""Real llmsla processes for the AIPerf benches: reference workers (``llmsla worker``) or the
fast SSE upstream of ``bench/_sse_upstream.py``, and ``llmsla gateway`` in front of them, each its
own process, configured by ``LLMSLA_*`` environment variables; stopped (SIGTERM, so the spool is
flushed) on exit. Also: the gateway's ``/metrics`` as samples, and its RequestEvents by trace id.
See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmsla import names
from llmsla.events import RequestEvent
from llmsla.services import free_port, wait_http
from llmsla.spool import published_segments, read_segment

UPSTREAM = str(Path(__file__).resolve().parent / "_sse_upstream.py")


class Stack:
    """``Stack(tmp, env).worker(...)/.upstream(...)`` then ``.gateway(...)``; a context manager."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.spool = tmp / "spool"
        self.env = {**os.environ, "LLMSLA_SPOOL_DIR": str(self.spool), **(env or {})}
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.procs: list[subprocess.Popen] = []
        self.upstreams: list[str] = []
        self.gateway_proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], cpus: str | None) -> subprocess.Popen:
        if cpus:
            argv = ["taskset", "-c", cpus, *argv]
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def worker(self, *, max_batch: int = 8, train_steps: int = 20, cpus: str | None = None) -> str:
        """One reference worker (the tiny CPU transformer), one torch thread; returns its URL."""
        port = free_port()
        env = {**self.env, "LLMSLA_SPOOL_DIR": str(self.tmp / f"spool-w{port}"), "LLMSLA_WORKER_THREADS": "1"}
        proc = self._spawn(f"worker-{port}", [sys.executable, "-m", "llmsla", "worker", "--port", str(port),
                                              "--max-batch", str(max_batch), "--train-steps", str(train_steps)],
                           env, cpus)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", timeout_s=120, proc=proc, log=self.tmp / f"worker-{port}.log")
        self.upstreams.append(url)
        return url

    def upstream(self, *, tokens: int, gap_s: float, cpus: str | None = None) -> str:
        """The raw-protocol SSE upstream (``bench/_sse_upstream.py``): ``tokens`` completion chunks
        ``gap_s`` apart."""
        port = free_port()
        proc = self._spawn(f"upstream-{port}", [sys.executable, UPSTREAM, str(port), str(tokens), str(gap_s)],
                           self.env, cpus)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", proc=proc)
        self.upstreams.append(url)
        return url

    def gateway(self, env: dict[str, str] | None = None, cpus: str | None = None) -> str:
        """``llmsla gateway --workers 1`` over the upstreams started so far; returns its URL (a
        second call starts another one: ``url``, ``cpu_s`` and ``metrics_text`` follow the last)."""
        port = free_port()
        genv = {**self.env, "LLMSLA_GATEWAY_UPSTREAMS": ",".join(self.upstreams),
                "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin", **(env or {})}
        self.gateway_proc = self._spawn(f"gateway-{port}", [sys.executable, "-m", "llmsla", "gateway", "--host", "127.0.0.1",
                                                    "--port", str(port), "--workers", "1"], genv, cpus)
        self.url = f"http://127.0.0.1:{port}"
        wait_http(self.url + "/healthz", timeout_s=60, proc=self.gateway_proc, log=self.tmp / f"gateway-{port}.log")
        return self.url

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def sample_sum(self, name: str, text: str | None = None) -> float:
        """Sum of one sample name over all its series (e.g. ``llmsla_request_goodput_total``)."""
        total = 0.0
        for fam in text_string_to_metric_families(text if text is not None else self.metrics_text()):
            for s in fam.samples:
                if s.name == name:
                    total += s.value
        return total

    def events(self, wait_s: float = 2.5) -> dict[str, RequestEvent]:
        """The gateway's RequestEvents published so far, by trace id (segments publish within
        ``spool.segment_max_age_s``, 1 s by default: wait a little longer first)."""
        time.sleep(wait_s)
        out: dict[str, RequestEvent] = {}
        for seg in published_segments(self.spool, names.SPOOL_REQUESTS):
            for e in read_segment(seg, names.SPOOL_REQUESTS):
                if isinstance(e, RequestEvent):
                    out[e.trace_id] = e
        return out

    def cpu_s(self, proc: subprocess.Popen | None = None) -> float:
        """CPU seconds (user + system) of a process so far: the gateway's by default."""
        p = proc or self.gateway_proc
        assert p is not None
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
