"""The demo's ``llmsla engines`` against the demo's simulated fleet: both as real processes, the
simulator paced in real time with its metrics port, the engines process given exactly the
upstreams the demo gives it. Every replica of the story's fleet is scraped under the simulator's
own id (r0, r1, ...), so the dashboards' engine row has one live series per replica."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from llmsla import names
from llmsla.app.demo import engine_upstreams
from llmsla.app.demo_story import TRACE
from llmsla.fleet.engine import fleet
from llmsla.fleet.scenarios import TRACES
from llmsla.services import free_port


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def test_demo_engines_scrape_every_simulated_replica(tmp_path: Path) -> None:
    ids = [r.id for r in fleet(TRACES[TRACE].fleet)]
    sim_port, eng_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update({"LLMSLA_SPOOL_DIR": str(tmp_path / "spool"), "LLMSLA_ENGINE_PORT": str(eng_port),
                "LLMSLA_ENGINE_SCRAPE_INTERVAL_S": "0.5", "LLMSLA_ENGINE_BACKOFF_MAX_S": "1"})
    ups = [a for u in engine_upstreams(sim_port) for a in ("--upstream", u)]
    procs = []
    try:
        with open(tmp_path / "engines.log", "wb") as log:  # first: the demo starts it before the simulator
            procs.append(subprocess.Popen([sys.executable, "-m", "llmsla", "engines", *ups], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        with open(tmp_path / "sim.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "llmsla", "simulate", "--trace", TRACE, "--fleet", TRACES[TRACE].fleet,
                 "--duration", "600", "--realtime", "1", "--metrics-port", str(sim_port), "--no-events"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        up: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and up != set(ids):
            for p in procs:
                assert p.poll() is None, (tmp_path / "engines.log").read_text()[-2000:] + (
                    tmp_path / "sim.log").read_text()[-2000:]
            text = _get(f"http://127.0.0.1:{eng_port}/metrics") or ""
            up = {rid for rid in ids
                  if f'{names.ENGINE_UP}{{engine="vllm",pool="{names.DEFAULT_POOL}",replica="{rid}"}} 1.0' in text}
            time.sleep(0.5)
        assert up == set(ids), (sorted(up), (tmp_path / "engines.log").read_text()[-2000:])
        assert f'{names.ENGINE_KV_USAGE_RATIO}{{engine="vllm",pool="{names.DEFAULT_POOL}",replica="r0"}}' in text
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
