"""The SLO catalog is the one definition every component reads: the shipped specs as read
independently, an edited spec changing each consumer, and a bad catalog refused with the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.alerting import generate
from llmsla.config import ConfigError
from llmsla.control import ab_report
from llmsla.dashboards import fleet, instances
from llmsla.forecaster import slo as forecaster_slo
from llmsla.resources import deploy
from llmsla.streaming import sql as stream_sql

ALL = frozenset(names.STATUSES)


@pytest.mark.parametrize(("selector", "want"), [
    ('llmsla_requests_total{status=~"error|timeout"}', {"error", "timeout"}),
    ('llmsla_requests_total{status!="cancelled"}', ALL - {"cancelled"}),
    ('llmsla_requests_total{status="ok"}', {"ok"}),
    ('llmsla_requests_total{status!~"ok|cancel.*"}', {"error", "timeout", "rejected"}),
    ('llmsla_requests_total{status=~"err"}', set()),  # anchored, as Prometheus matches
    ('llmsla_requests_total{model="m", pool="p"}', ALL),  # no status matcher: every status
    ('llmsla_requests_total{status!="cancelled", status!="rejected"}', ALL - {"cancelled", "rejected"}),
])
def test_status_matchers_select_as_prometheus_does(selector: str, want: set[str]) -> None:
    assert slo_catalog.statuses(selector) == want


def test_the_shipped_specs_as_read_independently() -> None:
    cfg = config_mod.load(env={})
    cat = slo_catalog.load(cfg)
    for path in sorted(deploy("slo").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        obj = doc["spec"]["objectives"][0]
        o = next(o for o in cat.objectives if o.name == doc["metadata"]["name"])
        assert o.target == obj["target"] and o.window_days == int(doc["spec"]["timeWindow"][0]["duration"][:-1])
        if "value" in obj:
            value = obj["value"]
            ms = getattr(cfg.slo, value.split(".")[1]) if isinstance(value, str) else value * 1000
            assert o.threshold_ms == ms
    avail = cat.availability
    assert avail.failed == {"error", "timeout"} and avail.counted == ALL - {"cancelled"}
    assert names.STATUS_REJECTED not in avail.failed  # the gateway's own 429s are served, as the spec says


def _edited(tmp_path: Path) -> config_mod.Config:
    """The shipped specs with TTFT 0.5 s at 95 %, E2E at 90 %, and rejections counted as failures."""
    d = tmp_path / "slo"
    shutil.copytree(deploy("slo"), d)
    ttft = (d / "ttft.yaml").read_text()
    (d / "ttft.yaml").write_text(ttft.replace("value: slo.ttft_ms", "value: 0.5").replace("target: 0.99", "target: 0.95"))
    e2e = (d / "e2e.yaml").read_text()
    (d / "e2e.yaml").write_text(e2e.replace("target: 0.95", "target: 0.9"))
    av = (d / "availability.yaml").read_text()
    (d / "availability.yaml").write_text(av.replace('status=~"error|timeout"', 'status=~"error|timeout|rejected"'))
    cfg = config_mod.load(env={})
    cfg.slo.dir = str(d)
    return cfg


def test_editing_a_spec_changes_every_consumer(tmp_path: Path) -> None:
    cfg = _edited(tmp_path)
    cat = slo_catalog.load(cfg)
    assert (cat.ttft_ms, cat.required("ttft").target, cat.required("e2e").target) == (500.0, 0.95, 0.9)

    # the burn-rate rules
    out = generate.generate(cfg, specs_dir=slo_catalog.specs_dir(cfg), tests_dir=None)
    rules = next(text for path, text in out.files.items() if path.name == "slo-ttft.yml")
    assert 'le="0.5"' in rules and 'le="0.8"' not in rules
    assert "expr: vector(0.95)" in rules and "expr: vector(1-0.95)" in rules  # objective and budget
    avail_rules = next(text for path, text in out.files.items() if path.name == "slo-availability.yml")
    assert 'status=~"error|timeout|rejected"' in avail_rules
    # the stream job's within-SLO counts
    q = stream_sql.request_stats_query(cfg)
    assert "<= 500.0" in q and "<= 800.0" not in q
    # the forecaster's labels
    targets = {t.sli: t for t in forecaster_slo.from_config(cfg)}
    assert (targets["ttft"].threshold, targets["ttft"].objective, targets["e2e"].objective) == (500.0, 0.95, 0.9)
    assert targets["availability"].failed == {"error", "timeout", "rejected"}
    # the A/B report
    s = ab_report.Settings.from_config(cfg)
    assert (s.slo_ttft_ms, s.ttft_target, s.e2e_target) == (500.0, 0.95, 0.9)
    assert s.failed == {"error", "timeout", "rejected"}
    # the dashboards
    fleet_json = json.dumps(fleet.build(cfg), default=lambda o: o.__dict__)
    assert "ttft 95 % within 500 ms" in fleet_json and "e2e 90 % within 10000 ms" in fleet_json
    inst_json = json.dumps(instances.build(cfg), default=lambda o: o.__dict__)
    assert '"value": 0.5' in inst_json
    # the reports and the demo print the same summary
    assert cat.summary() == ("availability 99.95 % without error or rejected or timeout, e2e 90 % within 10000 ms, "
                             "ttft 95 % within 500 ms")


def test_the_delegated_threshold_follows_the_config(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.slo.ttft_ms = 300.0  # a bucket bound; the shipped ttft spec says value: slo.ttft_ms
    assert slo_catalog.load(cfg).ttft_ms == 300.0
    assert "<= 300.0" in stream_sql.request_stats_query(cfg)


def test_a_bad_catalog_is_refused_naming_the_file(tmp_path: Path) -> None:
    cfg = _edited(tmp_path)
    d = Path(cfg.slo.dir)
    (d / "ttft.yaml").write_text((d / "ttft.yaml").read_text().replace("value: 0.5", "value: 0.45"))
    with pytest.raises(ConfigError, match=r"ttft\.yaml:\d+: .*0\.45 s is not a bucket bound"):
        slo_catalog.load(cfg)
    with pytest.raises(ConfigError, match=r"ttft\.yaml:\d+"):
        config_mod.check_startup(cfg)  # what `llmsla config check` runs
    (d / "ttft.yaml").unlink()
    with pytest.raises(ConfigError, match="no fleet-wide ttft SLO"):
        slo_catalog.load(cfg)
    shutil.copy(deploy("slo") / "ttft.yaml", d / "ttft.yaml")
    twin = (d / "ttft.yaml").read_text().replace("name: ttft\n", "name: ttft-again\n")
    (d / "ttft-again.yaml").write_text(twin)
    with pytest.raises(ConfigError, match="'ttft-again' is a second fleet-wide ttft objective"):
        slo_catalog.load(cfg)
    # a spec restricted to one pool is not a second fleet-wide one
    (d / "ttft-again.yaml").write_text(twin.replace("  displayName: Time to first token\n",
                                                    "  displayName: Time to first token\n  labels:\n    pool: canary\n"))
    assert slo_catalog.load(cfg).ttft_ms == 800.0
    cfg.slo.dir = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="no \\*.yaml SLO specs found"):
        slo_catalog.load(cfg)
