"""Sloth's own fixtures: llmsla's rules from Sloth's ``prometheus/v1`` spec mean what Sloth's do.

Not a text comparison: both rule files are evaluated by ``promtool test rules`` over the same
input series, Sloth's with every series renamed ``golden:<name>``, and for each series Sloth
records the label sets and values must agree at every checked minute; each alert's expression is
recorded on both sides and compared the same way (llmsla adds routing labels to its alerts, so
the static labels are checked separately).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmsla import config as config_mod
from llmsla import services
from llmsla.alerting import rules as R
from llmsla.slo_specs import load_specs
from llmsla.yamlsrc import SourceError

FIX = Path(__file__).parent / "fixtures" / "sloth"
EVAL_MIN = (30, 90, 110, 150, 200, 300)


def _golden(text: str) -> tuple[dict, set[str], dict[str, dict]]:
    """Sloth's file with series renamed; its recorded names; its alert labels per alert key."""
    # the fixture is a Go template: {{ .version }} and quoted literals such as {{"{{$labels.x}}"}}
    data = yaml.safe_load(re.sub(r'\{\{"(.*?)"\}\}', r"\1", text.replace("{{ .version }}", "llmsla")))
    if data.get("kind") == "PrometheusRule":  # from a Kubernetes spec: the rule groups under spec
        data = {"groups": data["spec"]["groups"]}
    recorded: set[str] = set()
    alerts: dict[str, dict] = {}
    for g in data["groups"]:
        g["name"] = "golden-" + g["name"]
        for r in g["rules"]:
            r["expr"] = re.sub(r"(?<![\w:])slo:", "golden:slo:", r["expr"])
            if "record" in r:
                recorded.add(r["record"])
                r["record"] = "golden:" + r["record"]
            else:
                key = f"{g['name'].split('-')[-1]}_{r['labels']['sloth_severity']}"
                alerts[key] = {"alert": r.pop("alert"), **r.pop("labels"), "annotations": r.pop("annotations")}
                r["record"] = f"golden:alert:{key}"
    return data, recorded, alerts


def _ours(period_days: int, spec_file: str = "in-base.yaml") -> tuple[dict, dict[str, dict]]:
    specs = load_specs([FIX / spec_file], config_mod.load(env={}), period_days)
    groups, alerts = [], {}
    for spec in specs:
        for g in R.slo_rule_file(spec, R.Profile())["groups"]:
            for r in g["rules"]:
                r["expr"] = str(r["expr"])
                if "alert" in r:
                    key = f"{spec.name}_{r['labels']['sloth_severity']}"
                    alerts[key] = {"alert": r.pop("alert"), **r.pop("labels"), "annotations": r.pop("annotations")}
                    r["record"] = f"ours:alert:{key}"
            groups.append(g)
    return {"groups": groups}, alerts


def _same(a: str, b: str) -> list[dict]:
    return [{"expr": f"(count({a} unless {b}) or vector(0)) + (count({b} unless {a}) or vector(0))",
             "exp_samples": [{"labels": "{}", "value": 0}]},
            {"expr": f"count(abs({a} - {b}) > 1e-9) or vector(0)", "exp_samples": [{"labels": "{}", "value": 0}]}]


@pytest.mark.parametrize("period_days, spec_file, expected", [
    (30, "in-base.yaml", "out-base.yaml.tpl"), (28, "in-base.yaml", "out-base-28d.yaml.tpl"),
    (30, "in-base-k8s.yaml", "out-base-k8s.yaml.tpl"),  # Sloth's Kubernetes PrometheusServiceLevel
])
def test_rules_from_sloths_spec_mean_what_sloths_do(period_days: int, spec_file: str, expected: str,
                                                    tmp_path: Path) -> None:
    golden, recorded, golden_alerts = _golden((FIX / expected).read_text())
    ours, our_alerts = _ours(period_days, spec_file)
    assert set(our_alerts) == set(golden_alerts) == {"slo1_page", "slo1_ticket"}  # slo02 disables both
    for key, g in golden_alerts.items():
        o = our_alerts[key]
        assert o["alert"] == g["alert"] == "myServiceAlert"
        assert {k: v for k, v in g.items() if k not in ("alert", "annotations")}.items() <= o.items()
        assert {k: v for k, v in g["annotations"].items() if k in ("alert02k1", "title")}.items() <= o["annotations"].items()
    (tmp_path / "ours.yml").write_text(yaml.safe_dump(ours, sort_keys=False))
    (tmp_path / "golden.yml").write_text(yaml.safe_dump(golden, sort_keys=False))
    series = 'http_request_duration_seconds_count{job="myservice", code="%s"}'
    inputs = [{"series": series % "200", "values": "0+600x300"},
              {"series": series % "500", "values": "0+1x100 100+150x200"},
              {"series": series % "429", "values": "0+2x300"}]
    checks = []
    for name in sorted(recorded):
        checks += _same(name, f"golden:{name}")
    for key in sorted(golden_alerts):
        checks += _same(f"ours:alert:{key}", f"golden:alert:{key}")
    tests = [{"interval": "1m", "input_series": inputs,
              "promql_expr_test": [{**c, "eval_time": f"{t}m"} for t in EVAL_MIN for c in checks]},
             # not vacuous: the page fires on both sides by the end
             {"interval": "1m", "input_series": inputs, "promql_expr_test": [
                 {"expr": "count(golden:alert:slo1_page) + count(ours:alert:slo1_page)", "eval_time": "300m",
                  "exp_samples": [{"labels": "{}", "value": 2}]}]}]
    order = [g["name"] for g in ours["groups"] if "alerts" not in g["name"]]
    order += [g["name"] for g in golden["groups"] if "alerts" not in g["name"]]
    order += [g["name"] for g in ours["groups"] + golden["groups"] if "alerts" in g["name"]]
    test = tmp_path / "t.yml"
    test.write_text(yaml.safe_dump({"rule_files": ["ours.yml", "golden.yml"], "evaluation_interval": "1m",
                                    "group_eval_order": order, "tests": tests}, sort_keys=False))
    res = subprocess.run([services.find_binary("promtool"), "test", "rules", str(test)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_cli_reads_sloth_specs_with_a_period_and_skips_their_tests(tmp_path: Path, capsys) -> None:
    from llmsla.app.cli import main

    (tmp_path / "slo").mkdir()
    spec = (FIX / "in-base.yaml").read_text().replace("      ticket_alert:\n        disable: true\n", "")
    (tmp_path / "slo" / "s.yaml").write_text(spec)
    rules = tmp_path / "rules"
    assert main(["slo", "generate", "--specs", str(tmp_path / "slo"), "--rules-out", str(rules),
                 "--tests-out", str(tmp_path / "tests"), "--default-slo-period", "28d"]) == 0
    text = (rules / "slo-slo02.yml").read_text()
    assert "record: slo:sli_error:ratio_rate4w" in text and "vector(28)" in text
    assert "sloth_severity: ticket" in text and "sloth_severity: page" not in text  # page disabled only
    assert "rule tests for SLO slo1 skipped: a Sloth query SLI" in capsys.readouterr().out


def test_openslo_v1alpha_as_sloth_reads_it(tmp_path: Path) -> None:
    """Sloth's OpenSLO fixture: every series it records, llmsla records with the same values."""
    golden, recorded, _ = _golden((FIX / "out-openslo.yaml.tpl").read_text())
    assert {"slo:sli_error:ratio_rate30d", "slo:sli_error:ratio_rate5m", "sloth_slo_info"} <= recorded
    specs = load_specs([FIX / "in-openslo.yaml"], config_mod.load(env={}))
    ours = {"groups": [g for s in specs for g in R.slo_rule_file(s, R.Profile())["groups"] if "alerts" not in g["name"]]}
    for g in ours["groups"]:
        for r in g["rules"]:
            r["expr"] = str(r["expr"])
    (tmp_path / "ours.yml").write_text(yaml.safe_dump(ours, sort_keys=False))
    (tmp_path / "golden.yml").write_text(yaml.safe_dump(golden, sort_keys=False))
    series = 'http_request_duration_seconds_count{job="myservice", code="%s"}'
    inputs = [{"series": series % "200", "values": "0+600x300"},
              {"series": series % "500", "values": "0+1x100 100+150x200"}]
    checks = [c for name in sorted(recorded) for c in _same(name, f"golden:{name}")]
    test = tmp_path / "t.yml"
    test.write_text(yaml.safe_dump({"rule_files": ["ours.yml", "golden.yml"], "evaluation_interval": "1m",
                                    "group_eval_order": [g["name"] for g in ours["groups"] + golden["groups"]],
                                    "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
                                        {**c, "eval_time": f"{t}m"} for t in EVAL_MIN for c in checks]}]},
                                   sort_keys=False))
    res = subprocess.run([services.find_binary("promtool"), "test", "rules", str(test)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_a_kubernetes_spec_is_read_in_its_own_keys(tmp_path: Path) -> None:
    """A PrometheusServiceLevel uses camelCase (errorQuery, pageAlert): the prometheus/v1 spelling
    there is refused with its file, line and the keys allowed, never read half."""
    bad = tmp_path / "k8s.yaml"
    bad.write_text((FIX / "in-base-k8s.yaml").read_text().replace("errorQuery:", "error_query:"))
    with pytest.raises(SourceError) as err:
        load_specs([bad], config_mod.load(env={}))
    assert f"{bad}:18" in str(err.value) and "errorQuery" in str(err.value), str(err.value)
    specs = load_specs([FIX / "in-base-k8s.yaml"], config_mod.load(env={}))
    assert [(s.name, s.service, s.api_version) for s in specs] == [("slo02", "svc01", "sloth.slok.dev/v1"),
                                                                   ("slo1", "svc01", "sloth.slok.dev/v1")]
