"""``llmsla report``: one self-contained HTML file drawn from the dashboards' own queries, opened
in headless Chromium (every image loads and is not blank).

The slow test is the whole path on a simulated fleet with an injected fault: the simulator runs in
real time with its recorders' metrics scraped by a real Prometheus, a reference worker adds
temperature-policy decisions, a control-API audit record marks an operator action, ``llmsla stream
--once`` windows the spool into the store, and the report must show the fault where the label put
it: the faulty replica has the highest P99 cell, inside the fault window.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import chromium
import numpy as np
import pytest
from matplotlib import image as mpimg

from llmsla import names, services
from llmsla.app.cli import build_parser
from llmsla.control.audit import AuditLog
from llmsla.dashboards.report import ENGINE_GAP_TITLE
from llmsla.store import connect
from llmsla.store.migrate import migrate

from .test_store_queries import Data

ROOT = Path(__file__).resolve().parents[2]
MAIN = "import sys; from llmsla.app.cli import main; sys.exit(main())"
SECTIONS = ("TTFT distribution (heatmap)", "E2E distribution (heatmap)", "TTFT P99 per instance", "E2E P99 per instance",
            "Time before the engine per replica", "Requests per second", "GPU memory used vs total", "SLA attainment per arm", "Temperature jitter",
            "Forecast risk per target", "Control actions (action_log)")


def llmsla(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**base, **(env or {})}, timeout=timeout)


def images(html: str) -> dict[str, np.ndarray]:
    """Every inline PNG, decoded here (independently of the browser)."""
    out = {}
    for alt, b64 in re.findall(r"<img alt='([^']*)' src='data:image/png;base64,([^']+)'>", html):
        out[alt] = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
    return out


def assert_self_contained(html: str) -> None:
    assert not re.search(r"<(script|link|iframe)\b", html)
    assert not re.search(r"""(src|href)=['"](?!data:)""", html), "every resource must be inline"


def assert_browser_shows(page: Path, expected: set[str], *, screenshot: bool = True) -> None:
    got = chromium.image_report(page)
    assert {g["alt"] for g in got} == expected
    for g in got:
        assert g["complete"] and g["width"] > 300 and g["height"] > 150, g
        assert g["colors"] > 20, f"{g['alt']}: looks blank ({g['colors']} colours)"
    if screenshot:
        shot = page.with_suffix(".png")
        chromium.screenshot(page, shot)
        px = mpimg.imread(shot)
        assert px.std() > 0.05  # the page itself renders (not a blank or error page)


def test_report_cli_rejects_bad_times(tmp_path: Path) -> None:
    out = llmsla("report", "--from", "yesterday", "--out", str(tmp_path / "r.html"))
    assert out.returncode == 2 and "--from" in out.stderr and "yesterday" in out.stderr
    out = llmsla("report", "--from", "now-1h", "--to", "2001-01-01T00:00:00Z", "--out", str(tmp_path / "r.html"))
    assert out.returncode == 2 and "--from" in out.stderr and "--to" in out.stderr
    out = llmsla("report", "--from", "now-1h", "--to", "not-a-time", "--out", str(tmp_path / "r.html"))
    assert out.returncode == 2 and "--to" in out.stderr
    assert not (tmp_path / "r.html").exists()


def test_report_from_the_store_alone(pg_dsn: str, cfg, tmp_path: Path) -> None:
    """Without Prometheus: the store panels drawn from a few hours of windows, policy decisions,
    forecasts and actions; the live panels say how to get them; opened in Chromium."""
    data = Data(dt.datetime.now(dt.UTC).replace(second=0, microsecond=0))
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        data.insert(conn)
    out_file = tmp_path / "report.html"
    out = llmsla("--dsn", pg_dsn, "report", "--from", "now-5h", "--to", "now", "--out", str(out_file), "--title", "store only")
    assert out.returncode == 0, out.stderr[-3000:]
    html = out_file.read_text()
    assert_self_contained(html)
    for title in SECTIONS:
        assert f"<h2>{title}</h2>" in html
    assert html.count("pass --prometheus URL") == 3  # two heatmaps and GPU memory
    pics = images(html)
    assert set(pics) == {"TTFT P99 per instance", "E2E P99 per instance", "Time before the engine per replica",
                         "Requests per second", "SLA attainment per arm", "Temperature jitter", "Forecast risk per target"}
    for alt, px in pics.items():
        assert px.shape[0] > 150 and px[..., :3].std() > 0.05, alt
    # both sides' TTFT percentiles per replica beside the gap (histograms in the data's last 90 min)
    row = re.search(r"<tr><td>p/r0</td><td>(\d+) ms</td><td>(\d+) ms</td><td>(\d+) ms</td><td>(\d+) ms</td></tr>", html)
    assert row, html[html.find(ENGINE_GAP_TITLE):][:3000]
    gw50, en50, gw99, en99 = map(int, row.groups())
    assert en50 < gw50 <= gw99 and en50 <= en99
    # the data's slow stretch on r1 (4x P99, see Data) is what the closing note names
    assert re.search(r"Highest: r1 \d+\.\d+ s", html)
    assert "What this shows" in html and "set_weight p/r1" in html
    assert_browser_shows(out_file, set(pics), screenshot=False)


async def _worker_traffic(url: str, model: str, n: int, pause_s: float) -> None:
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            body = {"model": model, "prompt": "the fleet is healthy " * (1 + i % 4), "max_tokens": 8}
            async with s.post(f"{url}/v1/completions", json=body) as r:
                await r.read()
            await asyncio.sleep(pause_s)


@pytest.mark.slow
def test_report_of_a_simulated_fault(pg_dsn: str, cfg, tmp_path: Path) -> None:
    from llmsla.worker.server import WorkerThread

    duration, fault = 24, (8, 16)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
    cfg.spool.segment_max_age_s = 3600  # one in-order segment per kind for the bounded stream run
    port = services.free_port()
    prom = services.start_prometheus(tmp_path / "prom", config_yaml=services.scrape_config(
        {"sim": [f"127.0.0.1:{port}"]}, interval_s=0.5))
    worker = WorkerThread(cfg)
    try:
        wurl = worker.start()
        t0 = dt.datetime.now(dt.UTC)
        args = build_parser().parse_args([
            "simulate", "--load", "poisson", "--rate", "8", "--duration", str(duration), "--fleet", "6b:4",
            "--realtime", "1", "--metrics-port", str(port), "--spool", str(cfg.spool_dir()), "--seed", "3",
            "--fault", f"slowdown:r1:{fault[0]}:{fault[1]}:8", "--json", str(tmp_path / "sim.json")])
        rc: list[int] = []
        sim = threading.Thread(target=lambda: rc.append(args.handler(args, cfg)))
        sim.start()
        traffic = threading.Thread(target=lambda: asyncio.run(_worker_traffic(wurl, cfg.worker.model, 12, duration / 12)))
        traffic.start()
        time.sleep(fault[0] + 2)
        audit = AuditLog(pg_dsn, source="receiver")
        audit.record(actor="sre", action="set_weight", target="default/r1", before=1.0, after=0.25,
                     reason="TTFT P99 above SLO on r1")
        audit.flush()
        sim.join(timeout=duration * 4)
        traffic.join(timeout=60)
        assert rc == [0]
        time.sleep(1.0)  # a last scrape
        t_end = dt.datetime.now(dt.UTC)
    finally:
        worker.stop()
    label = json.loads((tmp_path / "sim.json").read_text())["faults"][0]
    stream = llmsla("stream", "--once", "--fresh", env={
        "LLMSLA_STORE_DSN": pg_dsn, "LLMSLA_SPOOL_DIR": str(cfg.spool_dir()),
        "LLMSLA_STREAM_CHECKPOINT_DIR": str(tmp_path / "chk"),
        "LLMSLA_STREAM_METRICS_PORT": "0"}, timeout=400)  # tests run side by side
    assert stream.returncode == 0, stream.stderr[-3000:]
    with connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.T_DEAD_LETTERS}").fetchone()[0] == 0
        assert conn.execute(f"SELECT count(*) FROM {names.T_POLICY_WINDOWS}").fetchone()[0] > 0

    out_file = tmp_path / "fault.html"
    start = t0.replace(second=0, microsecond=0)  # from the minute: the 60 s policy windows start there
    out = llmsla("--dsn", pg_dsn, "report", "--from", start.isoformat(), "--to", t_end.isoformat(), "--out", str(out_file),
                 "--prometheus", prom.url, "--scrape-interval", "0.5", "--title", "simulated slowdown on r1")
    prom.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    html = out_file.read_text()
    assert_self_contained(html)
    pics = images(html)
    # no engine adapter runs here, so no engine windows: the gap section says it has no data
    assert set(pics) == set(SECTIONS) - {"Forecast risk per target", "Control actions (action_log)",
                                         "Time before the engine per replica"}
    # the fault is where its label says: r1 holds the highest E2E P99 cell, inside the labelled window
    m = re.search(r"E2E P99 per instance: Highest: (\w+) ([\d.]+) s at (\d\d:\d\d:\d\d)", html)
    assert m, html[-3000:]
    peak = dt.datetime.combine(t0.date(), dt.time.fromisoformat(m.group(3)), dt.UTC)
    assert m.group(1) == label["replica"] == "r1"
    assert label["start_ms"] / 1000 - 5 <= peak.timestamp() <= label["end_ms"] / 1000 + 10
    assert "set_weight default/r1" in html
    assert_browser_shows(out_file, set(pics))
    print(re.search(r"<h2>What this shows</h2><ul>(.*?)</ul>", html).group(1))  # shown with -s
