"""The receiver's HTTP surface over real loopback HTTP: auth, every malformed input a 4xx with its
reason, 10 MB bodies, and nothing recorded or acted on for a refused post."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from llmsla.alerting import webhook

from .harness import AUTH, alert, harness, migrated, note


def _bad_cases() -> list[tuple[str, object, int, str]]:
    good = note(alert("firing"))
    a = good["alerts"][0]

    def with_(**kw: object) -> dict:
        return {**good, **kw}

    def alert_with(**kw: object) -> dict:
        return {**good, "alerts": [{**a, **kw}]}

    labels_no_name = {k: v for k, v in a["labels"].items() if k != "alertname"}
    return [
        ("not json", b"{'version': 4}", 400, "body is not valid JSON"),
        ("empty", b"", 400, "empty body"),
        ("not utf-8", b'{"version": "4", "x": "\xff"}', 400, "body is not UTF-8"),
        ("array", [good], 400, "body must be a JSON object, got list"),
        ("wrong version", with_(version="3"), 400, 'version: expected "4" (Alertmanager webhook v4), got "3"'),
        ("version as number", with_(version=4), 400, "version: expected \"4\""),
        ("no groupKey", {k: v for k, v in good.items() if k != "groupKey"}, 400, "groupKey: expected a string"),
        ("bad status", with_(status="firin"), 400, "status: expected 'firing' or 'resolved'"),
        ("no alerts", with_(alerts=[]), 400, "alerts: empty"),
        ("alerts not a list", with_(alerts={"a": 1}), 400, "alerts: expected a list"),
        ("alert not an object", with_(alerts=[1]), 400, "alerts[0]: expected an object"),
        ("missing labels", {**good, "alerts": [{k: v for k, v in a.items() if k != "labels"}]}, 400,
         "alerts[0].labels: missing"),
        ("missing alertname", alert_with(labels=labels_no_name), 400, "alerts[0].labels.alertname: missing or empty"),
        ("label not a string", alert_with(labels={**a["labels"], "replica": 1}), 400,
         "alerts[0].labels.replica: expected a string, got 1"),
        ("bad label name", alert_with(labels={**a["labels"], "bad-name": "x"}), 400,
         'alerts[0].labels: "bad-name" is not a valid label name'),
        ("NUL in a label", alert_with(labels={**a["labels"], "pool": "a\x00b"}), 400, "contains NUL"),
        ("lone surrogate", json.dumps(alert_with(labels={**a["labels"], "pool": "x"})).replace('"x"', '"\\ud800"').encode(),
         400, "lone surrogate"),
        ("missing startsAt", {**good, "alerts": [{k: v for k, v in a.items() if k != "startsAt"}]}, 400,
         "alerts[0].startsAt: missing"),
        ("bad startsAt", alert_with(startsAt="yesterday"), 400, "alerts[0].startsAt: expected an RFC 3339 time"),
        ("zero startsAt", alert_with(startsAt="0001-01-01T00:00:00Z"), 400, "is not a real start time"),
        ("no timezone", alert_with(startsAt="2025-05-01T12:00:00"), 400, "expected an RFC 3339 time"),
        ("bad fingerprint", alert_with(fingerprint="../../etc"), 400, "alerts[0].fingerprint: expected 1-64"),
        ("resolved before start", alert_with(status="resolved", endsAt="2020-01-01T00:00:00Z"), 400,
         "alerts[0].endsAt: before startsAt"),
        ("bad alert status", alert_with(status="pending"), 400, "alerts[0].status"),
        ("annotations not an object", alert_with(annotations=["x"]), 400, "alerts[0].annotations: expected an object"),
        ("negative truncatedAlerts", with_(truncatedAlerts=-1), 400, "truncatedAlerts: expected an integer >= 0"),
        ("too many alerts", with_(alerts=[a] * (webhook.MAX_ALERTS + 1)), 413, "at most 1000 per notification"),
    ]


def test_bad_input_is_a_4xx_with_its_reason_and_records_nothing(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            for name, body, status, reason in _bad_cases():
                got, resp = await h.post(body)
                assert (got, name) == (status, name), resp
                assert reason in resp["error"]["message"], (name, resp)
            assert h.rows() == []  # nothing recorded, nothing acted on
            assert h.weight("r1") == 1.0
            # a good post still works afterwards
            status, body = await h.post(note(alert("firing")))
            assert status == 200 and body["results"][0]["decision"] == "act"

    asyncio.run(main())


def test_auth_and_body_limits(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            good = json.dumps(note(alert("firing"))).encode()
            url = h.url + "/v1/alerts"
            async with aiohttp.ClientSession() as s:
                for headers, reason in (({}, "missing bearer token"),
                                        ({"Authorization": "Bearer nope"}, "invalid bearer token"),
                                        ({"Authorization": "Basic eDp5"}, "missing bearer token"),
                                        ({"Authorization": "Bearer "}, "missing bearer token")):
                    async with s.post(url, data=good, headers=headers) as r:
                        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
                        assert reason in (await r.json())["error"]["message"]
                # 10 MB: declared length, and the same streamed in chunks without a length
                big = b'{"version": "4", "pad": "' + b"x" * (10 << 20) + b'"}'
                async with s.post(url, data=big, headers=AUTH) as r:
                    assert r.status == 413 and "exceeds the limit" in (await r.json())["error"]["message"]

                async def chunks():
                    for i in range(0, len(big), 1 << 20):
                        yield big[i:i + (1 << 20)]

                async with s.post(url, data=chunks(), headers=AUTH) as r:
                    assert r.status == 413 and "exceeds the limit" in (await r.json())["error"]["message"]
                # unknown routes and methods are JSON errors too
                async with s.get(h.url + "/nope") as r:
                    assert r.status == 404 and (await r.json())["error"]["message"]
                async with s.get(url) as r:
                    assert r.status == 405 and (await r.json())["error"]["message"]
                async with s.get(h.url + "/v1/audit?n=0") as r:
                    assert r.status == 400 and "n: expected an integer" in (await r.json())["error"]["message"]
                # reads are open on loopback: state, audit tail, metrics, the OpenAPI document
                async with s.get(h.url + "/metrics") as r:
                    text = await r.text()
                    assert 'llmsla_receiver_rejected_total{status="401"} 4.0' in text
                    assert 'llmsla_receiver_rejected_total{status="413"} 2.0' in text
            assert h.rows() == []

    asyncio.run(main())


def test_empty_token_refuses_every_post(pg_dsn: str) -> None:
    from llmsla.alerting.receiver import make_app
    from llmsla.httpkit import serve as start

    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            runner = await start(make_app(h.engine, token="", tick_s=None), "127.0.0.1", 0)
            port = runner.port
            try:
                async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/v1/alerts",
                                                                 json=note(alert()), headers=AUTH) as r:
                    assert r.status == 503 and "receiver.token is empty" in (await r.json())["error"]["message"]
            finally:
                await runner.stop()

    asyncio.run(main())


def test_unrouted_and_unmatched_alerts_are_audited_not_acted_on(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            static = alert("firing", replica=None, scope="pool", severity="ticket", source="static",
                           alertname="LlmslaGpuMemoryHigh")
            no_replica = alert("firing", replica=None)  # a replica rule without a replica label
            no_fp = {**alert("firing", replica="r0"), "fingerprint": ""}
            _, body = await h.post(note(static, no_replica, no_fp))
            assert [r["decision"] for r in body["results"]] == ["no_rule", "unroutable", "act"]
            assert "has no 'replica' label" in body["results"][1]["reason"]
            assert body["results"][2]["fingerprint"] == webhook.fingerprint_of(no_fp["labels"])
            assert [r["decision"] for r in h.rows() if r["action"] == "alert"] == ["no_rule", "unroutable", "act"]

    asyncio.run(main())


@pytest.mark.parametrize(("raw", "fp"), [
    ("2025-05-01T12:00:00.123456789Z", "2025-05-01T12:00:00.123456Z"),
    ("2025-05-01T14:00:00+02:00", "2025-05-01T12:00:00.000000Z"),
])
def test_times_have_one_spelling(raw: str, fp: str) -> None:
    body = note(alert("firing"))
    body["alerts"][0]["startsAt"] = raw
    (a,) = webhook.parse_obj(body).alerts
    assert a.starts_iso == fp and a.dedupe_key.endswith(f":firing:{fp}")
