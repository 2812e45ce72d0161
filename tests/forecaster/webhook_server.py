"""A strict Alertmanager webhook v4 receiver on loopback for tests: every POST is checked against
the v4 shape (field names, types, RFC 3339 times, status values, group labels inside the common
labels) and the forecaster's label contract; a bad one gets 400 and is recorded as an error."""

from __future__ import annotations

import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmsla import names

TOP = {"version": str, "groupKey": str, "truncatedAlerts": int, "status": str, "receiver": str,
       "groupLabels": dict, "commonLabels": dict, "commonAnnotations": dict, "externalURL": str, "alerts": list}
ALERT = {"status": str, "labels": dict, "annotations": dict, "startsAt": str, "endsAt": str,
         "generatorURL": str, "fingerprint": str}
LABELS = {names.L_ALERTNAME, names.L_SEVERITY, names.L_SOURCE, names.L_SLO, names.L_MODEL, names.L_POOL,
          names.L_SCOPE, names.L_HORIZON}
ANNOTATIONS = {names.ANN_RISK, names.ANN_THRESHOLD, names.ANN_HORIZON_S, names.ANN_SUMMARY}
#: a firing alert also says when the breach is expected
FIRING_ANNOTATIONS = ANNOTATIONS | {names.ANN_PREDICTED_BREACH}


def _time(v: str) -> dt.datetime:
    assert v.endswith("Z"), v
    return dt.datetime.fromisoformat(v[:-1] + "+00:00")


def validate(body: dict) -> None:
    assert set(body) == set(TOP), sorted(set(body) ^ set(TOP))
    for k, t in TOP.items():
        assert type(body[k]) is t, (k, type(body[k]))
    assert body["version"] == "4" and body["status"] in ("firing", "resolved") and body["alerts"]
    for k, v in {**body["groupLabels"], **body["commonLabels"], **body["commonAnnotations"]}.items():
        assert isinstance(k, str) and isinstance(v, str), (k, v)
    for k, v in body["groupLabels"].items():
        assert body["commonLabels"][k] == v
    for a in body["alerts"]:
        assert set(a) == set(ALERT), sorted(set(a) ^ set(ALERT))
        for k, t in ALERT.items():
            assert type(a[k]) is t, (k, type(a[k]))
        assert a["status"] in ("firing", "resolved")
        scoped = LABELS | ({names.L_REPLICA} if a["labels"].get(names.L_SCOPE) == names.SCOPE_REPLICA else set())
        want = FIRING_ANNOTATIONS if a["status"] == "firing" else ANNOTATIONS
        assert set(a["labels"]) == scoped and set(a["annotations"]) == want, (a["labels"], a["annotations"])
        assert all(isinstance(v, str) for v in [*a["labels"].values(), *a["annotations"].values()])
        lab = a["labels"]
        assert lab[names.L_ALERTNAME] == names.FORECAST_ALERTNAME and lab[names.L_SOURCE] == names.SOURCE_FORECASTER
        assert lab[names.L_SEVERITY] == names.SEVERITY_TICKET
        float(a["annotations"][names.ANN_RISK]), float(a["annotations"][names.ANN_THRESHOLD])
        horizon_s = int(a["annotations"][names.ANN_HORIZON_S])
        # the label says the annotation's seconds: 30s, 2m, 5m, 1h
        unit = {"s": 1, "m": 60, "h": 3600}[lab[names.L_HORIZON][-1]]
        assert int(lab[names.L_HORIZON][:-1]) * unit == horizon_s, (lab[names.L_HORIZON], horizon_s)
        starts = _time(a["startsAt"])
        if a["status"] == "firing":
            assert a["endsAt"] == "0001-01-01T00:00:00Z"
            assert _time(a["annotations"][names.ANN_PREDICTED_BREACH]) > starts
        else:
            assert _time(a["endsAt"]) >= starts
        assert len(a["fingerprint"]) == 16 and int(a["fingerprint"], 16) >= 0
    if body["status"] == "resolved":
        assert all(a["status"] == "resolved" for a in body["alerts"])
    # and the consumer accepts it: the receiver's own strict webhook v4 parser
    from llmsla.alerting import webhook

    webhook.parse(json.dumps(body).encode())


class WebhookServer:
    def __init__(self, *, token: str = "", fail_first: int = 0) -> None:
        self.received: list[dict] = []
        self.errors: list[str] = []
        self.token = token
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                try:
                    assert self.headers.get("Content-Type") == "application/json"
                    if outer.token:
                        assert self.headers.get("Authorization") == f"Bearer {outer.token}", "bad token"
                    body = json.loads(raw)
                    validate(body)
                except (AssertionError, ValueError, KeyError) as exc:
                    outer.errors.append(f"{type(exc).__name__}: {exc}")
                    self.send_response(400)
                    self.end_headers()
                    return
                outer.received.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/webhook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> WebhookServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
