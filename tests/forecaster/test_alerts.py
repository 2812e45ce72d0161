"""Forecast alerts: hysteresis, and real POSTs to a strict webhook v4 server on loopback."""

from __future__ import annotations

from llmsla import names
from llmsla.forecaster import alerts

from .webhook_server import WebhookServer

LABELS = alerts.alert_labels("default", "r1", "6b", names.SLO_TTFT, 25)
T0 = 1_790_000_000_000  # a real epoch (the receiver refuses a 1970 startsAt)


def _hyst() -> alerts.Hysteresis:
    return alerts.Hysteresis(0.6, fire_steps=2, resolve_steps=3, resolve_ratio=0.5, repeat_s=60, horizon_s=25)


def test_hysteresis_fires_after_n_and_resolves_below_the_band() -> None:
    h = _hyst()
    seq = [0.1, 0.7, 0.2, 0.7, 0.8, 0.9, 0.55, 0.4, 0.29, 0.2, 0.1, 0.1]
    events = []
    for i, r in enumerate(seq):
        for status, alert in h.update("default/r1", r, 1_000_000 + i * 5000, LABELS):
            events.append((i, status, alert["annotations"][names.ANN_RISK]))
    # one step above is not enough; the band (0.3..0.6) neither fires nor resolves
    assert events == [(4, "firing", "0.8000"), (10, "resolved", "0.1000")]


def test_repeat_interval_resends_firing() -> None:
    h = _hyst()
    sent = [s for i in range(40) for s, _ in h.update("k", 0.9, i * 5000, LABELS)]
    assert sent == ["firing"] * 4  # at 5 s, then every 60 s


def test_posts_valid_webhook_v4_with_token_and_retries() -> None:
    h = _hyst()
    with WebhookServer(token="s3cret-webhook-token", fail_first=1) as srv:
        poster = alerts.WebhookPoster(srv.url, token="s3cret-webhook-token")
        bodies = []
        for i, r in enumerate([0.9, 0.9, 0.1, 0.1, 0.1]):
            bodies += [alerts.payload(s, a, "http://127.0.0.1:9465")
                       for s, a in h.update("default/r1", r, T0 + i * 5000, LABELS)]
        out = poster.send(bodies[:1])
        assert [o for _, o in out] == ["failed"] and len(poster.pending) == 1  # 503: kept for the next step
        out = poster.send(bodies[1:])
        assert [o for _, o in out] == ["sent", "sent"] and not poster.pending
        assert srv.errors == []
        assert [b["status"] for b in srv.received] == ["firing", "resolved"]
        fire, res = srv.received
        assert fire["alerts"][0]["fingerprint"] == res["alerts"][0]["fingerprint"]
        assert fire["groupLabels"] == {"alertname": names.FORECAST_ALERTNAME, "pool": "default", "replica": "r1"}
        assert fire["commonLabels"]["slo"] == names.SLO_TTFT and fire["commonLabels"]["replica"] == "r1"
        # a refused notification (4xx) is dropped, not retried forever
        bad = alerts.WebhookPoster(srv.url, token="wrong")
        assert [o for _, o in bad.send([bodies[0]])] == ["refused 400"] and not bad.pending


def test_pool_target_has_pool_scope_and_no_replica_label() -> None:
    lab = alerts.alert_labels("chat", "", "70b", names.SLO_AVAILABILITY, 300)
    h = alerts.Hysteresis(0.5, fire_steps=1, resolve_steps=1, resolve_ratio=1.0, repeat_s=60, horizon_s=300)
    (_, alert), = h.update("chat/*", 0.9, T0, lab)
    from .webhook_server import validate

    validate(alerts.payload("firing", alert, ""))
    assert "replica" not in alert["labels"] and alert["labels"][names.L_SCOPE] == names.SCOPE_POOL
    assert "the pool" in alert["annotations"]["summary"]
