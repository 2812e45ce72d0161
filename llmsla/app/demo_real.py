"""``llmsla demo --real``: reference workers behind the gateway instead of the fleet simulator.

Two ``llmsla worker`` processes are replicas r0 and r1 behind ``llmsla gateway``, ``llmsla
replay`` sends the Azure trace as real streaming requests, and the fault is injected on r1 over
the worker's admin endpoint at known times, recorded as a label in the simulator's shape.
Everything after that (windows, alerts, actions, reports, dashboards) is the simulated demo's,
so both demos exercise one loop. See docs/demo.md#--real-reference-workers-behind-the-gateway.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsla.app.demo_stack import DemoError, Proc, Stack

log = logging.getLogger("llmsla.demo")

REPLICAS = ("r0", "r1")
ADMIN_TOKEN_ENV = "LLMSLA_WORKER_ADMIN_TOKEN"


@dataclass(frozen=True)
class Replay:
    """The trace as two 1-thread CPU workers on a shared 2-core machine serve it in real time.

    The Azure conversation trace stretched 2x as the simulator's demo replays it (its first
    minutes: ~1.6 requests/s), at ``rate`` times that; prompt tokens become ``prompt_scale``
    characters (the byte-level model's tokens; at most ``max_prompt_chars``) and output tokens
    ``output_scale`` generated tokens (at most ``max_tokens``). Measured here (docs/demo.md):
    healthy, a request's TTFT is tens of ms and its E2E a few hundred; the machine stays far from
    saturation, so the fault, not the load, is what breaks the SLOs."""

    trace: str = "azure_conv"
    time_scale: float = 2.0
    rate: float = 2.0
    sessions: float = 3.0
    prompt_scale: float = 0.25
    output_scale: float = 0.5
    max_prompt_chars: int = 1024
    max_tokens: int = 128

    def args(self, url: str, duration_s: float, start_at_ms: int, seed: int, out: Path) -> list[str]:
        return ["replay", "--url", url, "--trace", self.trace, "--duration", f"{duration_s:g}",
                "--time-scale", f"{self.time_scale:g}", "--rate-mult", f"{self.rate:g}",
                "--sessions", f"{self.sessions:g}", "--prompt-scale", f"{self.prompt_scale:g}",
                "--output-scale", f"{self.output_scale:g}", "--max-prompt-chars", str(self.max_prompt_chars),
                "--max-tokens", str(self.max_tokens), "--start-at-ms", str(start_at_ms), "--seed", str(seed),
                "--timeout-s", "60", "--json", str(out)]


#: The SLO objectives of a --real run (the demo's [slo]): the defaults (TTFT 0.8 s, E2E 10 s) are
#: sized for GPU replicas serving real models; the tiny CPU model answers in tens of ms, so no
#: slowdown short of a stall would ever breach them. These keep the defaults' proportions to
#: what is served (a healthy P99 several times below each), and are bucket bounds of their
#: histograms, as every objective must be.
SLO = {"ttft_ms": 300.0, "e2e_ms": 2000.0}
#: The ramp's end on real workers: iterations this many times slower when r1 crashes. Not the
#: simulator's x4: the simulated fleet runs near capacity, where x4 piles up queues; two CPU
#: workers at this load run far below it, where a slowdown only stretches each request (x8 left
#: r1's TTFT P99 under its objective in a 2-minute run; docs/demo.md).
FACTOR = 16.0


def config_section(worker_ports: list[int]) -> str:
    upstreams = ", ".join(f'"http://127.0.0.1:{p}"' for p in worker_ports)
    return f"""
# llmsla demo --real: two reference workers behind the gateway
[gateway]
upstreams = [{upstreams}]
request_timeout_s = 30.0

[worker]
max_tokens = {Replay().max_tokens}

# Objectives for the tiny CPU model (llmsla/app/demo_real.py: SLO): the defaults are sized for
# GPU replicas and would never breach here.
[slo]
ttft_ms = {SLO['ttft_ms']:g}
e2e_ms = {SLO['e2e_ms']:g}
"""


@dataclass
class Fleet:
    """The started workers and gateway: where they listen."""

    gateway_url: str
    control_port: int
    worker_urls: dict[str, str]
    admin_urls: dict[str, str]

    def scrape_jobs(self, stack: Stack) -> dict[str, list[str]]:
        return {"gateway": [f"127.0.0.1:{stack.port('gateway')}"],
                "worker": [u.removeprefix("http://") for u in self.worker_urls.values()]}


def worker_ports(stack: Stack) -> list[int]:
    return [stack.port(f"worker-{r}") for r in REPLICAS]


def start_fleet(stack: Stack) -> Fleet:
    """The workers (r0, r1 in the gateway's upstream order) and the gateway with its control API."""
    stack.env[ADMIN_TOKEN_ENV] = secrets.token_urlsafe(24)
    workers, admins = {}, {}
    for rid, port in zip(REPLICAS, worker_ports(stack), strict=True):
        admin = stack.port(f"worker-{rid}-admin")
        stack.llmsla(f"worker-{rid}", "worker", "--port", str(port), "--admin-port", str(admin),
                     ready_url=f"http://127.0.0.1:{port}/healthz", timeout_s=120)
        workers[rid], admins[rid] = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        warm_up(workers[rid])
    control = stack.port("control")
    gw = stack.port("gateway")
    stack.llmsla("gateway", "gateway", "--port", str(gw), "--control-port", str(control),
                 ready_url=f"http://127.0.0.1:{control}/healthz", timeout_s=120)
    return Fleet(f"http://127.0.0.1:{gw}", control, workers, admins)


def warm_up(url: str, n: int = 3) -> None:
    """A few requests straight to a new worker (not through the gateway: no events), so torch's
    first-call costs are not the run's first latencies, as an operator warms a replica up."""
    from llmsla import config as config_mod

    body = json.dumps({"model": config_mod.WorkerConfig().model, "max_tokens": 16, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "warm up " * 40}]}).encode()
    for _ in range(n):
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()


@dataclass
class FaultDriver:
    """Drives r1's fault at known times (seconds after ``start``, a time.time() instant): a ramp
    of its slowdown from 1 to ``factor`` over [ramp_s, crash_s), then down over [crash_s, end_s),
    then healthy. Records when each change was applied: the fault label."""

    admin_url: str
    token: str
    start: float
    ramp_s: float
    crash_s: float
    end_s: float
    factor: float
    tick_s: float = 0.5
    applied: dict[str, float] = field(default_factory=dict)  # mark -> time.time() it took effect
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def post(self, body: dict[str, Any]) -> None:
        req = urllib.request.Request(self.admin_url + "/admin/fault", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def _mark(self, name: str, body: dict[str, Any]) -> None:
        try:
            self.post(body)
            self.applied.setdefault(name, time.time())
        except OSError as exc:
            self.errors.append(f"{name} {body}: {exc}")
            log.warning("fault injection failed: %s %s: %s", name, body, exc)

    def run(self) -> None:
        while not self._stop.is_set():
            t = time.time() - self.start
            if t >= self.end_s:
                self._mark("end", {"down": False, "slowdown": 1.0})
                return
            if t >= self.crash_s:
                if "crash" not in self.applied:
                    self._mark("crash", {"down": True, "slowdown": 1.0})
            elif t >= self.ramp_s:
                p = (t - self.ramp_s) / (self.crash_s - self.ramp_s)
                self._mark("ramp", {"slowdown": round(1.0 + (self.factor - 1.0) * p, 3)})
            next_at = min(x for x in (self.ramp_s, self.crash_s, self.end_s, t + self.tick_s) if x > t)
            self._stop.wait(max(0.01, next_at - t))

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="llmsla-demo-fault", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop driving; a worker left slow or down is put back (it may outlive an interrupted run)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if "end" not in self.applied and self.applied:
            self._mark("end", {"down": False, "slowdown": 1.0})

    def labels(self, replica: str) -> list[dict[str, Any]]:
        """The fault label rows, as ``llmsla.fleet.faults.labels`` writes the simulator's (epoch
        ms of what was applied; ``*_s`` after the start of the run)."""
        a = self.applied
        if not {"ramp", "crash", "end"} <= set(a):
            raise DemoError(f"the fault on {replica} was not applied as planned ({sorted(a)} applied; "
                            f"errors: {'; '.join(self.errors) or 'none'})")
        rows = [("ramp", a["ramp"], a["crash"], self.factor), ("crash", a["crash"], a["end"], 0.0)]
        return [{"start_ms": round(s * 1000), "end_ms": round(e * 1000), "kind": kind, "replica": replica,
                 "factor": f, "start_s": round(s - self.start, 3), "end_s": round(e - self.start, 3)}
                for kind, s, e, f in rows]


def write_labels(spool_dir: Path, start_ms: int, rows: list[dict[str, Any]]) -> Path:
    """Next to the events, where the simulator writes its labels (<spool>/labels/)."""
    path = spool_dir / "labels" / f"real-{start_ms}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"faults": rows}, indent=1) + "\n")
    return path


def start_replay(stack: Stack, fleet: Fleet, live_s: float, seed: int, lead_s: float = 5.0) -> tuple[Proc, int, Path]:
    """``llmsla replay`` against the gateway, t = 0 ``lead_s`` from now (the child's start-up)."""
    out = stack.workdir / "replay.json"
    out.unlink(missing_ok=True)
    start_ms = int((time.time() + lead_s) * 1000)
    proc = stack.llmsla("replay", *Replay().args(fleet.gateway_url, live_s, start_ms, seed, out))
    return proc, start_ms, out


def run_summary(start_ms: int, fleet: Fleet, driver: FaultDriver, replica: str, replay_json: Path,
                labels_path: Path) -> dict[str, Any]:
    """The run's facts in the simulator summary's shape where the demo reads them (``start_ms``,
    ``faults``), plus what only a real run has."""
    replay = json.loads(replay_json.read_text()) if replay_json.exists() else None
    return {"mode": "real", "start_ms": start_ms, "faults": driver.labels(replica), "labels": str(labels_path),
            "replicas": fleet.worker_urls, "gateway": fleet.gateway_url, "replay": replay}
