"""The receiver's HTTP surface over real loopback HTTP: auth, a malformed envelope a 4xx with its
reason (nothing recorded), a bad alert audited and skipped while its group is acted on, UTF-8 label
names, large groups and truncation, bodies over the bound."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from llmsla.alerting import webhook

from .harness import AUTH, alert, harness, migrated, note


def _bad_envelopes() -> list[tuple[str, object, int, str]]:
    good = note(alert("firing"))

    def with_(**kw: object) -> dict:
        return {**good, **kw}

    return [
        ("not json", b"{'version': 4}", 400, "body is not valid JSON"),
        ("empty", b"", 400, "empty body"),
        ("not utf-8", b'{"version": "4", "x": "\xff"}', 400, "body is not UTF-8"),
        ("nested too deeply", b"[" * 100_000, 400, "body is not valid JSON: nested too deeply"),
        ("array", [good], 400, "body must be a JSON object, got list"),
        ("wrong version", with_(version="3"), 400, 'version: expected "4" (Alertmanager webhook v4), got "3"'),
        ("version as number", with_(version=4), 400, "version: expected \"4\""),
        ("no groupKey", {k: v for k, v in good.items() if k != "groupKey"}, 400, "groupKey: expected a string"),
        ("bad status", with_(status="firin"), 400, "status: expected 'firing' or 'resolved'"),
        ("no alerts", with_(alerts=[]), 400, "alerts: empty"),
        ("alerts not a list", with_(alerts={"a": 1}), 400, "alerts: expected a list"),
        ("negative truncatedAlerts", with_(truncatedAlerts=-1), 400, "truncatedAlerts: expected an integer >= 0"),
    ]


def _bad_alerts() -> list[tuple[str, object, str]]:
    """Alerts the receiver cannot act on: each is audited and skipped, never its group refused."""
    a = alert("firing", replica="r0")
    labels_no_name = {k: v for k, v in a["labels"].items() if k != "alertname"}
    return [
        ("alert not an object", 1, "alerts[1]: expected an object"),
        ("missing labels", {k: v for k, v in a.items() if k != "labels"}, "alerts[1].labels: missing"),
        ("missing alertname", {**a, "labels": labels_no_name}, "alerts[1].labels.alertname: missing or empty"),
        ("label not a string", {**a, "labels": {**a["labels"], "replica": 1}},
         "alerts[1].labels.replica: expected a string, got 1"),
        ("empty label name", {**a, "labels": {**a["labels"], "": "x"}}, 'alerts[1].labels: "" is not a usable'),
        ("NUL in a label", {**a, "labels": {**a["labels"], "pool": "a\x00b"}}, "contains NUL"),
        ("NUL in a label name", {**a, "labels": {**a["labels"], "a\x00b": "x"}}, "contains NUL"),
        ("too many labels", {**a, "labels": {**a["labels"], **{f"l{i}": "v" for i in range(webhook.MAX_LABELS)}}},
         f"entries, at most {webhook.MAX_LABELS}"),
        ("long label value", {**a, "labels": {**a["labels"], "x": "v" * (webhook.MAX_LABEL_VALUE + 1)}},
         f"longer than {webhook.MAX_LABEL_VALUE} characters"),
        ("missing startsAt", {k: v for k, v in a.items() if k != "startsAt"}, "alerts[1].startsAt: missing"),
        ("bad startsAt", {**a, "startsAt": "yesterday"}, "alerts[1].startsAt: expected an RFC 3339 time"),
        ("zero startsAt", {**a, "startsAt": "0001-01-01T00:00:00Z"}, "is not a real start time"),
        ("no timezone", {**a, "startsAt": "2025-05-01T12:00:00"}, "expected an RFC 3339 time"),
        ("bad fingerprint", {**a, "fingerprint": "../../etc"}, "alerts[1].fingerprint: expected 1-64"),
        ("resolved before start", {**a, "status": "resolved", "endsAt": "2020-01-01T00:00:00Z"},
         "alerts[1].endsAt: before startsAt"),
        ("bad alert status", {**a, "status": "pending"}, "alerts[1].status"),
    ]


def test_bad_envelope_is_a_4xx_with_its_reason_and_records_nothing(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn)) as h:
            for name, body, status, reason in _bad_envelopes():
                got, resp = await h.post(body)
                assert (got, name) == (status, name), resp
                assert reason in resp["error"]["message"], (name, resp)
            assert h.rows() == []  # nothing recorded, nothing acted on
            assert h.weight("r1") == 1.0
            # a good post still works afterwards
            status, body = await h.post(note(alert("firing")))
            assert status == 200 and body["results"][0]["decision"] == "act"

    asyncio.run(main())


def test_one_bad_alert_is_audited_and_skipped_the_group_is_acted_on(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), replicas=("r0", "r1", "r2")) as h:
            for i, (name, bad, reason) in enumerate(_bad_alerts()):
                # a later episode of r1's page each time: acted on, then joined; never refused
                status, resp = await h.post(note(alert("firing", replica="r1", starts_min=i), bad))
                assert status == 200, (name, resp)
                assert [r["decision"] for r in resp["results"]][-1] == "invalid", (name, resp)
                assert reason in resp["results"][-1]["reason"], (name, resp)
                assert resp["skipped"] == 1 and resp["results"][0]["decision"] != "invalid", (name, resp)
            # a lone surrogate (valid JSON, not storable) is skipped too
            raw = json.dumps(note(alert("firing", replica="r2"), alert("firing", replica="r0", pool="x")))
            status, resp = await h.post(raw.replace('"pool": "x"', '"pool": "\\ud800"').encode())
            assert status == 200 and [r["decision"] for r in resp["results"]] == ["act", "invalid"], resp
            assert "lone surrogate" in resp["results"][1]["reason"]
            assert h.weight("r1") == 0.25 and h.weight("r2") == 0.25 and h.weight("r0") == 1.0
            rows = [r for r in h.rows() if r["decision"] == "invalid"]
            assert len(rows) == len(_bad_alerts()) + 1
            assert all(r["action"] == "alert" and r["outcome"] == "skipped" and r["reason"] for r in rows)
            nul = next(r for r in rows if "a\ufffdb" in r["params"]["labels"].get("pool", ""))
            assert nul["alertname"] == "TtftReplicaErrorBudgetBurn"  # what could be quoted, made storable

    asyncio.run(main())


def test_utf8_label_names_large_groups_and_truncation(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), replicas=("r0", "r1")) as h:
            # what Prometheus 3 with external_labels {k8s.cluster.name: ...} sends through Alertmanager
            dotted = {"k8s.cluster.name": "prod-eu", "service.namespace": "llm", "ünïcode name": "ok"}
            a = alert("firing", replica="r1", **dotted)
            others = [alert("firing", replica=None, scope="pool", severity="ticket", source="static",
                            alertname="LlmslaGpuMemoryHigh", gpu=str(i), **dotted) for i in range(1500)]
            body = {**note(a, *others), "truncatedAlerts": 7,
                    "groupLabels": dotted, "commonLabels": {**dotted, "x-y": "z"}}
            status, resp = await h.post(body)
            assert status == 200, resp
            assert resp["alerts"] == 1501 and resp["skipped"] == 0 and resp["truncated"] == 7
            assert resp["results"][0]["decision"] == "act" and h.weight("r1") == 0.25
            assert {r["decision"] for r in resp["results"][1:]} == {"no_rule"}
            rows = h.rows()
            assert rows[0]["params"]["labels"]["k8s.cluster.name"] == "prod-eu"
            trunc = [r for r in rows if r["action"] == "truncated"]
            assert len(trunc) == 1 and trunc[0]["params"]["truncatedAlerts"] == 7
            assert "left 7 alerts of this group out" in trunc[0]["reason"]
            async with h.session.get(h.url + "/metrics") as r:
                text = await r.text()
            assert "llmsla_receiver_truncated_alerts_total 7.0" in text

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
                # past the 16 MiB bound: declared length, and the same streamed in chunks without a length
                big = b'{"version": "4", "pad": "' + b"x" * (17 << 20) + b'"}'
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
