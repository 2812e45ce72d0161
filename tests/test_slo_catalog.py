"""The SLO catalog is the one definition every component reads: the shipped specs as read
independently, an edited spec changing each consumer, and a bad catalog refused with the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.alerting import generate
from llmsla.app.cli import main
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


EXAMPLES = ("ttft-interactive.yaml", "e2e-batch.yaml", "ttft-acme.yaml", "availability-acme.yaml")


def _scoped(tmp_path: Path, *examples: str, declare: bool = True) -> config_mod.Config:
    """The shipped fleet-wide specs plus ``examples`` from deploy/slo/examples, with acme and
    globex declared (as the examples' tenants.toml does) unless ``declare`` is False."""
    d = tmp_path / "slo"
    shutil.copytree(deploy("slo"), d, ignore=shutil.ignore_patterns("examples"))
    for f in examples:
        shutil.copy(deploy("slo") / "examples" / f, d / f)
    cfg = config_mod.load(deploy("slo") / "examples" / "tenants.toml", env={}) if declare else config_mod.load(env={})
    cfg.slo.dir = str(d)
    return cfg


def test_the_most_specific_objective_holds_a_request(tmp_path: Path) -> None:
    cfg = _scoped(tmp_path, *EXAMPLES)
    d = Path(cfg.slo.dir)
    # a tenant and class spec, the narrowest: acme's batch requests within 30 s end to end
    (d / "e2e-acme-batch.yaml").write_text((d / "e2e-batch.yaml").read_text()
                                          .replace("name: e2e-batch", "name: e2e-acme-batch")
                                          .replace("    class: batch\n", "    class: batch\n    tenant: acme\n")
                                          .replace("value: 60", "value: 30"))
    cat = slo_catalog.load(cfg)
    assert [o.name for o in cat.objectives] == ["availability", "e2e", "ttft"]  # the fleet's, as before
    assert [o.name for o in cat.objectives_for("ttft")] == ["ttft", "ttft-interactive", "ttft-acme"]
    assert [o.name for o in cat.objectives_for("e2e")] == ["e2e", "e2e-batch", "e2e-acme-batch"]

    def pick(sli: str, tenant: str, cls: str) -> str:
        o = cat.for_request(sli, tenant, cls)
        assert o is not None
        return o.name

    assert pick("ttft", "acme", "interactive") == "ttft-acme"  # the tenant's beats the class's
    assert pick("ttft", "acme", "batch") == "ttft-acme"
    assert pick("ttft", "globex", "interactive") == "ttft-interactive"
    assert pick("ttft", "globex", "batch") == pick("ttft", "other", "sheddable") == "ttft"
    assert pick("e2e", "acme", "batch") == "e2e-acme-batch" and pick("e2e", "globex", "batch") == "e2e-batch"
    assert pick("e2e", "acme", "interactive") == "e2e"
    assert pick("availability", "acme", "batch") == "availability-acme"
    assert pick("availability", "globex", "batch") == "availability"
    assert cat.for_request("tpot", "acme", "batch") is None
    o = cat.for_request("ttft", "acme", "batch")
    assert o is not None and (o.threshold_ms, o.target, o.tenant, o.class_) == (300.0, 0.995, "acme", "")
    acme = cat.for_request("availability", "acme", "batch")
    assert acme is not None and acme.failed == {"error", "timeout"} and acme.target == 0.999
    # the fleet-wide contract is unchanged: the store, the forecaster, the reports
    assert (cat.ttft_ms, cat.e2e_ms) == (800.0, 10000.0)
    assert cat.summary() == slo_catalog.load(config_mod.load(env={})).summary()


def test_class_examples_are_valid_on_the_default_configuration(tmp_path: Path) -> None:
    """The default configuration declares no tenants but has the default classes: the class
    examples load there, the tenant examples are refused naming their file and line."""
    cfg = _scoped(tmp_path, "ttft-interactive.yaml", "e2e-batch.yaml", declare=False)
    assert {o.name for o in slo_catalog.load(cfg).scoped} == {"ttft-interactive", "e2e-batch"}
    config_mod.check_startup(cfg)
    cfg = _scoped(tmp_path / "t", "ttft-acme.yaml", declare=False)
    with pytest.raises(ConfigError, match=r"ttft-acme\.yaml:10: metadata\.labels\.tenant: tenant 'acme' is not "
                                          r"declared in tenants\.declared \(none: the configuration declares no tenants\)"):
        config_mod.check_startup(cfg)


@pytest.mark.parametrize(("edit", "message"), [
    (("tenant: acme", "tenant: initech"),
     r"ttft-acme\.yaml:10: metadata\.labels\.tenant: tenant 'initech' is not declared in tenants\.declared \(acme, globex\)"),
    (("tenant: acme", "class: premium"),
     r"ttft-acme\.yaml:10: metadata\.labels\.class: class 'premium' is not one of tenants\.classes "
     r"\(interactive, batch, sheddable\)"),
    (("value: 0.3", "value: 0.4"),
     r"ttft-acme\.yaml:30: spec\.objectives\[0\]\.value: 0\.4 s is not a bucket bound of llmsla_request_ttft_seconds "
     r"\(metrics\.ttft_buckets: 0\.025, "),
    (("name: ttft-acme\n", "name: ttft-acme-again\n  labels:\n    tenant: acme\n"),  # a second label block
     r"ttft-acme\.yaml:\d+: metadata\.labels: duplicate key"),
])
def test_a_bad_scoped_spec_is_refused_with_file_and_line(tmp_path: Path, edit: tuple[str, str], message: str,
                                                        capsys) -> None:
    cfg = _scoped(tmp_path, "ttft-acme.yaml")
    f = Path(cfg.slo.dir) / "ttft-acme.yaml"
    assert edit[0] in f.read_text()
    f.write_text(f.read_text().replace(*edit))
    with pytest.raises(ConfigError, match=message):
        config_mod.check_startup(cfg)  # what `llmsla config check` runs
    # `llmsla slo generate` refuses it too: one line, exit 2, nothing written
    out = tmp_path / "rules"
    assert main(["--config", str(deploy("slo") / "examples" / "tenants.toml"), "slo", "generate",
                 "--specs", cfg.slo.dir, "--rules-out", str(out), "--tests-out", str(tmp_path / "tests")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not out.exists()


def test_two_specs_for_one_target_are_refused_naming_both(tmp_path: Path, capsys) -> None:
    cfg = _scoped(tmp_path, "ttft-interactive.yaml")
    d = Path(cfg.slo.dir)
    (d / "ttft-fast.yaml").write_text((d / "ttft-interactive.yaml").read_text()
                                      .replace("name: ttft-interactive", "name: ttft-fast").replace("0.5", "0.3"))
    want = (rf"{re.escape(str(d / 'ttft-interactive.yaml'))}:7: SLO 'ttft-interactive' is a second ttft objective "
            rf"for class interactive \(first: 'ttft-fast' in {re.escape(str(d / 'ttft-fast.yaml'))}:7\); "
            "one spec per SLI and target")
    with pytest.raises(ConfigError, match=want):
        slo_catalog.load(cfg)
    assert main(["--config", str(deploy("slo") / "examples" / "tenants.toml"), "slo", "generate",
                 "--specs", str(d), "--rules-out", str(tmp_path / "r"), "--tests-out", str(tmp_path / "t")]) == 2
    assert re.search(want, capsys.readouterr().err)
    # the same threshold for another class, or a tenant, is another target
    (d / "ttft-fast.yaml").write_text((d / "ttft-fast.yaml").read_text().replace("class: interactive", "class: batch"))
    assert {o.name for o in slo_catalog.load(cfg).scoped} == {"ttft-interactive", "ttft-fast"}
