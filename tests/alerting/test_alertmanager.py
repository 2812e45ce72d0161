"""The committed Alertmanager config: amtool accepts it, and a real Alertmanager running it (only
URLs, token file and timings changed) delivers to the receiver with the bearer token, inhibits the
ticket by the page and the pool alert by its replica's page, and sends resolves."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import time
import urllib.request
from pathlib import Path

from llmsla import services
from llmsla.alerting import amconfig

from .harness import RECEIVER_TOKEN, harness, migrated

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy/alertmanager/alertmanager.yml"


def test_amtool_accepts_the_committed_config() -> None:
    amtool = services.find_binary("amtool")
    res = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_config(receiver_url: str, token_file: Path, *, fast: bool = True) -> str:
    """The committed config pointed at ``receiver_url``; timings shortened for tests."""
    return amconfig.pointed_at(CONFIG.read_text(), receiver_url, token_file, group_wait_s=0.2 if fast else None)


test_config.__test__ = False  # a helper (the e2e test imports it), not a test


def _post_alerts(am_url: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(am_url + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def _alert(now: dt.datetime, *, ends: dt.datetime | None = None, **labels: str) -> dict:
    out = {"labels": {"model": "llmsla-tiny", "pool": "default", "source": "burn_rate", **labels},
           "annotations": {"summary": "test"}, "startsAt": now.isoformat(), "generatorURL": "http://prom/x"}
    if ends is not None:
        out["endsAt"] = ends.isoformat()
    return out


def test_alertmanager_delivers_with_token_groups_and_inhibits(pg_dsn: str, tmp_path: Path, start_alertmanager) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(RECEIVER_TOKEN + "\n")

    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            am = await asyncio.to_thread(start_alertmanager, test_config(h.url, token_file))
            now = dt.datetime.now(dt.UTC)
            rep_page = _alert(now, alertname="TtftReplicaErrorBudgetBurn", severity="page", slo="ttft",
                              scope="replica", replica="r1")
            pool_page_ttft = _alert(now, alertname="TtftErrorBudgetBurn", severity="page", slo="ttft", scope="pool")
            e2e_page = _alert(now, alertname="E2eErrorBudgetBurn", severity="page", slo="e2e", scope="pool")
            e2e_ticket = _alert(now, alertname="E2eErrorBudgetBurn", severity="ticket", slo="e2e", scope="pool")
            await asyncio.to_thread(_post_alerts, am.url, [rep_page, pool_page_ttft, e2e_page, e2e_ticket])

            async def received(pred, timeout_s: float = 15.0) -> list[dict]:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    rows = [r for r in h.rows() if r["action"] == "alert"]
                    if pred(rows):
                        return rows
                    await asyncio.sleep(0.1)
                raise AssertionError(f"receiver got {[(r['alertname'], r['params']['labels']) for r in rows]}")

            rows = await received(lambda rows: len(rows) >= 2)
            await asyncio.sleep(1.5)  # a few group intervals: anything inhibited would have come by now
            rows = [r for r in h.rows() if r["action"] == "alert"]
            got = sorted((r["params"]["labels"]["alertname"], r["params"]["labels"]["severity"],
                          r["params"]["labels"].get("replica", "")) for r in rows)
            # the e2e ticket is inhibited by the e2e page; the ttft pool page by r1's replica page
            assert got == [("E2eErrorBudgetBurn", "page", ""), ("TtftReplicaErrorBudgetBurn", "page", "r1")]
            assert h.weight("r1") == 0.25  # Alertmanager's bearer token was accepted, the receiver acted
            assert {r["params"]["groupKey"] for r in rows} == {
                '{}/{source=~"burn_rate|forecaster|static"}:{model="llmsla-tiny", pool="default", replica="r1", slo="ttft"}',
                '{}/{source=~"burn_rate|forecaster|static"}:{model="llmsla-tiny", pool="default", slo="e2e"}'}
            # the replica's page resolves: Alertmanager sends the resolve
            end = dt.datetime.now(dt.UTC)
            await asyncio.to_thread(_post_alerts, am.url, [{**rep_page, "endsAt": end.isoformat()}])
            rows = await received(lambda rows: any(r["alert_status"] == "resolved" for r in rows))
            resolved = [r for r in rows if r["alert_status"] == "resolved"]
            assert [r["decision"] for r in resolved] == ["resolved"]
            firing_r1 = [r for r in rows if r["alert_status"] == "firing" and r["params"]["labels"].get("replica") == "r1"]
            assert resolved[0]["fingerprint"] == firing_r1[0]["fingerprint"]

    asyncio.run(main())
