"""The static rules as generated (deploy/prometheus/rules/llmsla-static.yml), run by
``promtool test rules``: LlmslaSpoolDropping fires on any increase of the spool's drop counter,
per kind and reason, and not on a flat counter or a writer's restart (a counter reset)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from llmsla import names, services
from llmsla.alerting import generate as G
from llmsla.alerting import rule_tests
from llmsla.alerting import rules as R

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = ROOT / G.RULES_DIR / G.STATIC_FILE


def _rule(alert: str) -> R.StaticRule:
    (rule,) = [r for r in R.static_rules(R.Profile()) if r.alert == alert]
    return rule


def _promtool_test(path: Path, test: dict) -> str:
    """``promtool test rules`` on ``test`` written to ``path``: passes, returns its output."""
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    res = subprocess.run([services.find_binary("promtool"), "test", "rules", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def test_spool_dropping_fires_on_a_drop_and_only_then(tmp_path: Path) -> None:
    rule = _rule("LlmslaSpoolDropping")
    dropped = f"{names.SPOOL_DROPPED}_total"
    firing_labels = {names.L_KIND: names.SPOOL_REQUESTS, names.L_REASON: names.SPOOL_DROP_NO_SPACE,
                     names.L_SEVERITY: names.SEVERITY_TICKET, names.L_SOURCE: names.SOURCE_STATIC}
    test = {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [
                # 5 minutes at 0, then 40 events dropped at 5m15s, then flat
                {"series": f'{dropped}{{kind="requests",reason="no_space",instance="gw-1"}}', "values": "0x20 40x40"},
                # never a drop
                {"series": f'{dropped}{{kind="gpu",reason="no_space",instance="gw-1"}}', "values": "0x61"},
                # a writer that restarted: its counter starts again at 0 (a reset, not a drop)
                {"series": f'{dropped}{{kind="policy",reason="io_error",instance="w-1"}}', "values": "12x20 0x40"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": rule.alert, "exp_alerts": []},
                {"eval_time": "5m45s", "alertname": rule.alert, "exp_alerts": []},  # pending (for: 1m)
                {"eval_time": "6m30s", "alertname": rule.alert, "exp_alerts": [{
                    "exp_labels": firing_labels,
                    "exp_annotations": {"summary": rule_tests._render(rule.summary, firing_labels)}}]},
                {"eval_time": "10m", "alertname": rule.alert, "exp_alerts": [{
                    "exp_labels": firing_labels,
                    "exp_annotations": {"summary": rule_tests._render(rule.summary, firing_labels)}}]},
                {"eval_time": "11m", "alertname": rule.alert, "exp_alerts": []},  # 5 m without a drop
            ],
        }],
    }
    out = _promtool_test(tmp_path / "spool-dropping.test.yml", test)
    assert "SUCCESS" in out


def test_gateway_saturated_pages_for_a_late_loop_only(tmp_path: Path) -> None:
    """A gateway whose loop runs its 100 ms timer 200 ms late from minute 5 pages after 5 more
    minutes; one whose loop stays within 1 ms never does."""
    from llmsla.exporters.saturation import LAG_BUCKETS

    rule = _rule("LlmslaGatewaySaturated")
    per_step = 150  # 10 samples a second, 15 s apart

    def buckets(instance: str, late_from: int | None) -> list[dict]:
        """Cumulative bucket series: every sample at 0.5 ms, or at 200 ms from step ``late_from``."""
        out = []
        for le in (*LAG_BUCKETS, float("inf")):
            vals, total = [], 0
            for step in range(81):
                lag = 0.2 if late_from is not None and step > late_from else 0.0005
                total += per_step if lag <= le else 0
                vals.append(str(total))
            name = f'{names.GATEWAY_LOOP_LAG_SECONDS}_bucket{{instance="{instance}",le="{"+Inf" if le == float("inf") else le}"}}'
            out.append({"series": name, "values": " ".join(vals)})
        return out

    labels = {"instance": "gw-2", names.L_SEVERITY: names.SEVERITY_PAGE, names.L_SOURCE: names.SOURCE_STATIC}
    firing = [{"exp_labels": labels, "exp_annotations": {"summary": rule_tests._render(rule.summary, labels)}}]
    test = {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": buckets("gw-1", None) + buckets("gw-2", 20),
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": rule.alert, "exp_alerts": []},
                {"eval_time": "9m", "alertname": rule.alert, "exp_alerts": []},  # pending (for: 5m)
                {"eval_time": "11m", "alertname": rule.alert, "exp_alerts": firing},
                {"eval_time": "20m", "alertname": rule.alert, "exp_alerts": firing},
            ],
        }],
    }
    _promtool_test(tmp_path / "gateway-saturated.test.yml", test)


def test_forecaster_drifted_fires_when_recall_falls_below_validation_with_enough_breaches(tmp_path: Path) -> None:
    """Recall 0.25 against a validation recall of 0.227 for 30 minutes, then 0.05: at the 25 s
    horizon, over 30 judged breaches, the ticket fires an hour later; at the 120 s horizon the
    recall is 0 but rests on 5 breaches (the low-traffic guard), and at 600 s it is 0.1, inside
    the margin of its validation recall of 0.2: neither fires."""
    rule = _rule("LlmslaForecasterDrifted")
    h = names.L_HORIZON

    def series(name: str, horizon: str, values: str, **extra: str) -> dict:
        labels = ",".join(f'{k}="{v}"' for k, v in {h: horizon, "instance": "fc-1", **extra}.items())
        return {"series": f"{name}{{{labels}}}", "values": values}

    labels = {h: "25", names.L_SEVERITY: names.SEVERITY_TICKET, names.L_SOURCE: names.SOURCE_STATIC}
    summary = rule_tests._render(rule.summary, labels).replace("{{ $value | humanizePercentage }}", "5%")
    firing = [{"exp_labels": labels, "exp_annotations": {"summary": summary}}]
    test = {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                series(names.FORECAST_RECALL, "25", "0.25x30 0.05x150"),
                series(names.FORECAST_VALIDATION_RECALL, "25", "0.227x180", model="lstm-a"),
                series(names.FORECAST_BREACHES, "25", "30x180"),
                series(names.FORECAST_RECALL, "120", "0x180"),
                series(names.FORECAST_VALIDATION_RECALL, "120", "0.3x180", model="lstm-a"),
                series(names.FORECAST_BREACHES, "120", "5x180"),
                series(names.FORECAST_RECALL, "600", "0.1x180"),
                series(names.FORECAST_VALIDATION_RECALL, "600", "0.2x180", model="lstm-a"),
                series(names.FORECAST_BREACHES, "600", "40x180"),
            ],
            "alert_rule_test": [
                {"eval_time": "25m", "alertname": rule.alert, "exp_alerts": []},
                {"eval_time": "80m", "alertname": rule.alert, "exp_alerts": []},  # pending (for: 1h)
                {"eval_time": "95m", "alertname": rule.alert, "exp_alerts": firing},
                {"eval_time": "170m", "alertname": rule.alert, "exp_alerts": firing},
            ],
        }],
    }
    _promtool_test(tmp_path / "forecaster-drifted.test.yml", test)


def test_promtool_accepts_the_static_rule_file() -> None:
    res = subprocess.run([services.find_binary("promtool"), "check", "rules", str(RULE_FILE)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout and "LlmslaSpoolDropping" in RULE_FILE.read_text()


def test_discovery_failing_fires_only_when_nothing_succeeded_for_ten_minutes(tmp_path: Path) -> None:
    """gw-1 never gets an answer (a missing RoleBinding: failures from the start, no refresh);
    gw-2 fails now and then between answers; gw-3 answers for 10 minutes, then only fails. The
    rule fires for gw-1 after its 5 minutes pending and for gw-3 once 10 minutes pass with no
    answer (plus the 5), never for gw-2."""
    rule = _rule("LlmslaDiscoveryFailing")
    failures, refreshes = f"{names.DISCOVERY_FAILURES}_total", f"{names.DISCOVERY_REFRESHES}_total"

    def firing(instance: str) -> dict:
        labels = {"job": "llmsla-gateway", "instance": instance,
                  names.L_SEVERITY: names.SEVERITY_TICKET, names.L_SOURCE: names.SOURCE_STATIC}
        return {"exp_labels": labels, "exp_annotations": {"summary": rule_tests._render(rule.summary, labels)}}

    def series(name: str, instance: str, reason: str | None, values: str) -> dict:
        extra = f',reason="{reason}"' if reason else ""
        return {"series": f'{name}{{job="llmsla-gateway",instance="{instance}",source="kubernetes"{extra}}}',
                "values": values}

    test = {
        "rule_files": [str(RULE_FILE)],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [  # 30 minutes, a sample every 15 s; the gateway tries every 5 s
                series(refreshes, "gw-1", None, "0x120"),
                series(failures, "gw-1", "denied", "0+3x120"),
                series(failures, "gw-1", "api", "0x120"),
                series(refreshes, "gw-2", None, "0+2x120"),
                series(failures, "gw-2", "timeout", "0+1x120"),
                series(refreshes, "gw-3", None, "0+3x40 120x80"),
                series(failures, "gw-3", "api", "0x40 0+3x80"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": rule.alert, "exp_alerts": []},  # gw-1 pending
                {"eval_time": "6m", "alertname": rule.alert, "exp_alerts": [firing("gw-1")]},
                {"eval_time": "24m", "alertname": rule.alert, "exp_alerts": [firing("gw-1")]},  # gw-3 pending
                {"eval_time": "26m", "alertname": rule.alert, "exp_alerts": [firing("gw-1"), firing("gw-3")]},
            ],
        }],
    }
    out = _promtool_test(tmp_path / "discovery-failing.test.yml", test)
    assert "SUCCESS" in out
