"""SLO specs -> rules: golden files current, promtool accepts and tests them, spec errors name
file, line and field."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import generated, names, services
from llmsla.alerting import emit, rule_tests
from llmsla.alerting import generate as G
from llmsla.alerting import rules as R
from llmsla.app.cli import main
from llmsla.slo_specs import load_specs, parse, spec_files
from llmsla.yamlsrc import SourceError, load_docs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def promtool() -> str:
    return services.find_binary("promtool")


def _cfg() -> config_mod.Config:
    return config_mod.load(env={})


def test_generated_files_are_the_specs_rules_and_tests(monkeypatch) -> None:
    """(That they are current is checked with every generator's, tests/test_generated.py.)"""
    monkeypatch.chdir(ROOT)
    out = G.generate(_cfg())
    assert main(["slo", "generate", "--check"]) == 0
    assert {p.name for p in out.files} == {
        "slo-ttft.yml", "slo-e2e.yml", "slo-availability.yml", "llmsla-static.yml",
        "slo-ttft.test.yml", "slo-e2e.test.yml", "slo-availability.test.yml"}


def test_check_reports_stale_and_orphaned_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    rules, tests = tmp_path / "rules", tmp_path / "tests"
    args = ["slo", "generate", "--rules-out", str(rules), "--tests-out", str(tests)]
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    (rules / "slo-ttft.yml").write_text((rules / "slo-ttft.yml").read_text().replace("14.4", "14"))
    (rules / "slo-gone.yml").write_text(f"# {G.MARKER} from deploy/slo/gone.yaml; DO NOT EDIT.\ngroups: []\n")
    out = G.generate(_cfg(), rules_dir=rules, tests_dir=tests)
    problems = generated.stale(out.files, G.generated_on_disk([rules, tests]))
    assert [str(p) for p in problems] == [f"{rules / 'slo-ttft.yml'}: differs from what the generator renders",
                                          f"{rules / 'slo-gone.yml'}: generated file no longer rendered (delete it)"]
    assert main([*args, "--check"]) == 1
    assert main(args) == 0 and not (rules / "slo-gone.yml").exists()


def test_promtool_checks_every_rule_file(promtool: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    scaled = tmp_path / "scaled"
    assert main(["slo", "generate", "--window-scale", "0.004", "--rules-out", str(scaled)]) == 0
    files = sorted(G.RULES_DIR.glob("*.yml")) + sorted(scaled.glob("*.yml"))
    assert len(files) == 8
    res = subprocess.run([promtool, "check", "rules", *map(str, files)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == 8


def test_promtool_rule_tests_pass(promtool: str) -> None:
    """Each burn scenario fires exactly what the independent model expects, at its minute."""
    files = sorted((ROOT / G.TESTS_DIR).glob("*.test.yml"))
    assert len(files) == 3
    procs = [subprocess.Popen([promtool, "test", "rules", str(f)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for f in files]
    for f, p in zip(files, procs, strict=True):
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{f}:\n{out}"


def test_expected_minutes_follow_the_workbook(monkeypatch) -> None:
    """The model behind the tests: a fast burn pages at the workbook's minute, a 2x burn only tickets."""
    monkeypatch.chdir(ROOT)
    out = G.generate(_cfg())
    first = out.first_firing
    fast = "pool fast burn: every request bad on both replicas fires the pool page, no replica page"
    # TTFT (1 % budget), 2 h healthy then all bad: 14.4x over 1h needs 14.4 % of an hour = 8.64 min,
    # but 6x over 6h+30m is met first because only 2 h of history exist: 6 % of 120 + t -> t = 8
    assert first["ttft"][fast]["TtftErrorBudgetBurn/page"] == 120 + 8
    assert "TtftReplicaErrorBudgetBurn/page/r0" not in first["ttft"][fast]
    # 99.95 %: 0.72 % of the hour is bad within the first minute
    assert first["availability"][fast]["AvailabilityErrorBudgetBurn/page"] == 121
    slow = "slow 2x burn: only the ticket, never a page"
    for name, f in first.items():
        assert list(f[slow]) == [f"{G.rule_tests.R.alert_name(s)}/ticket" for s in out.specs if s.name == name]
        assert f["healthy: errors at half the error budget fire nothing"] == {}
    replica = "replica fault: every request of r1 bad fires the replica page for r1"
    assert first["ttft"][replica]["TtftReplicaErrorBudgetBurn/page/r1"] == 128
    assert not any(k.endswith("/r0") for k in first["ttft"][replica])


def test_low_traffic_guard_holds_every_burn_alert(monkeypatch) -> None:
    """Each pair of each burn alert needs slo.min_requests requests in its long window (the SLI's
    own denominator), per model and pool (and replica for the replica page); 0 = Sloth's rules."""
    monkeypatch.chdir(ROOT)
    cfg = _cfg()
    specs = {s.name: s for s in load_specs(spec_files(ROOT / G.SPECS_DIR), cfg)}
    guarded = R.slo_rule_file(specs["ttft"], R.Profile(1.0, 20))["groups"][-1]["rules"]
    pool_page, replica_page = guarded[0]["expr"], guarded[2]["expr"]
    assert pool_page.count("increase(llmsla_request_ttft_seconds_count[1h])) >= 20") == 1
    assert pool_page.count("increase(llmsla_request_ttft_seconds_count[6h])) >= 20") == 1
    assert "and on (model, pool, replica)" in replica_page and "and on (model, pool, replica)" not in pool_page
    avail = R.slo_rule_file(specs["availability"], R.Profile(1 / 60, 5))["groups"][-1]["rules"][0]["expr"]
    assert 'increase(llmsla_requests_total{status!="cancelled"}[1m])) >= 5' in avail  # scaled like the windows
    assert "increase(" not in R.slo_rule_file(specs["ttft"], R.Profile())["groups"][-1]["rules"][0]["expr"]
    # the scenario bites: unguarded, the same traffic pages every hour
    low = rule_tests.low_traffic(20)
    model, ties = rule_tests.Model(low), []
    unguarded = [t for t in range(low.minutes + 1)
                 if rule_tests.firing(model, specs["ttft"], t, ties)[("TtftErrorBudgetBurn", "page", "")]]
    assert unguarded and all(not any(rule_tests.firing(model, specs["ttft"], t, [], 20).values()) for t in unguarded)


def test_rules_use_sloth_names_and_bucket_bounds(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    text = (G.RULES_DIR / "slo-ttft.yml").read_text()
    for name in (names.SLO_OBJECTIVE, names.SLO_ERROR_BUDGET, names.SLO_CURRENT_BURN_RATE,
                 names.SLO_PERIOD_BURN_RATE, names.SLO_PERIOD_ERROR_BUDGET_REMAINING, names.SLO_INFO):
        assert f"record: {name}\n" in text
    for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"):
        assert f"record: {names.SLO_SLI_ERROR[w]}\n" in text
    assert 'llmsla_request_ttft_seconds_bucket{le="0.8"}' in text
    # the E2E threshold comes from slo.e2e_ms (10 s), written as the client library writes le
    assert 'llmsla_request_e2e_seconds_bucket{le="10.0"}' in (G.RULES_DIR / "slo-e2e.yml").read_text()
    cfg = _cfg()
    cfg.slo.e2e_ms = 20000.0
    spec = next(s for s in load_specs(spec_files(G.SPECS_DIR), cfg) if s.name == "e2e")
    assert 'le="20.0"' in R.sli_error_expr(spec, "5m", ("model", "pool"))


def test_window_scale_keeps_names_and_scales_ranges(tmp_path: Path) -> None:
    spec = load_specs(spec_files(ROOT / G.SPECS_DIR), _cfg())[-1]
    prof = R.Profile(1 / 240)
    assert prof.range(3600) == "15s" and prof.range(300) == "1250ms" and prof.range(30 * 86400) == "3h"
    group = R.sli_group(spec, prof)
    assert group["rules"][0]["record"] == "slo:sli_error:ratio_rate5m" and "[1250ms]" in group["rules"][0]["expr"]
    with pytest.raises(ValueError, match="less than 4 scrapes"):
        R.check_windows(R.Profile(0.001), scrape_interval_s=0.25)
    assert main(["slo", "generate", "--window-scale", "0.001", "--scrape-interval-s", "0.25",
                 "--specs", str(ROOT / G.SPECS_DIR), "--rules-out", str(tmp_path / "never-written")]) == 2
    assert not (tmp_path / "never-written").exists()


_GOOD = """\
apiVersion: openslo/v1
kind: SLO
metadata:
  name: ttft
  labels:
    pool: chat
    team: sre
spec:
  service: llmsla
  indicator:
    spec:
      thresholdMetric:
        metricSource:
          type: Prometheus
          spec:
            query: llmsla_request_ttft_seconds
  timeWindow:
    - duration: 30d
      isRolling: true
  budgetingMethod: Occurrences
  objectives:
    - op: lte
      value: 0.8
      target: 0.99
"""


def _parse(text: str):
    return parse(next(load_docs(text, "deploy/slo/x.yaml")), _cfg())


def test_spec_filters_and_labels() -> None:
    s = _parse(_GOOD)
    assert s.filters == {"pool": "chat"} and s.labels == {"team": "sre"}
    expr = R.sli_error_expr(s, "5m", ("model", "pool"))
    assert 'llmsla_request_ttft_seconds_bucket{pool="chat", le="0.8"}' in expr
    assert R.sli_group(s, R.Profile())["rules"][0]["labels"]["team"] == "sre"


@pytest.mark.parametrize(("old", "new", "message"), [
    ("value: 0.8", "value: 0.75", "deploy/slo/x.yaml:23: spec.objectives[0].value: 0.75 s is not a bucket bound "
                                  "of llmsla_request_ttft_seconds (metrics.ttft_buckets: 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, "
                                  "0.8, 1, 1.5, 2, 3, 5, 10, 20, 60); use one of them or add 0.75 to metrics.ttft_buckets"),
    ("value: 0.8", "value: slo.ttft", "x.yaml:23: spec.objectives[0].value: expected seconds or one of slo.ttft_ms"),
    ("target: 0.99", "target: 99", "x.yaml:24: spec.objectives[0].target: must be a ratio in (0, 1)"),
    ("op: lte", "op: gte", "x.yaml:22: spec.objectives[0].op: a histogram threshold counts le"),
    ("duration: 30d", "duration: 4w", "x.yaml:18: spec.timeWindow[0].duration: expected whole days"),
    ("budgetingMethod: Occurrences", "budgetingMethod: Timeslices", "x.yaml:20: spec.budgetingMethod: only Occurrences"),
    ("  service: llmsla", "  service: llmsla\n  servce: typo", "x.yaml:10: spec.servce: unknown field"),
    ("query: llmsla_request_ttft_seconds", "query: llmsla_requests_total",
     "x.yaml:16: spec.indicator.spec.thresholdMetric.metricSource.spec.query: expected one of the request histograms"),
    ("name: ttft", "name: TTFT", "x.yaml:4: metadata.name: must be lowercase"),
    ("    team: sre", "    severity: x", "x.yaml:7: metadata.labels.severity: reserved"),
    ("apiVersion: openslo/v1", "apiVersion: sloth/v1", "x.yaml:1: apiVersion: expected 'openslo/v1'"),
    ("      isRolling: true", "      isRolling: false", "x.yaml:19: spec.timeWindow[0].isRolling: only rolling"),
    ("      target: 0.99", "      target: [1]", "x.yaml:24: spec.objectives[0].target: expected int or float, got a list"),
])
def test_spec_errors_name_file_line_and_field(old: str, new: str, message: str) -> None:
    assert old in _GOOD
    with pytest.raises(SourceError) as exc:
        _parse(_GOOD.replace(old, new))
    assert message in str(exc.value)


def test_ratio_spec_and_file_level_errors(tmp_path: Path) -> None:
    ratio = _GOOD.replace("""      thresholdMetric:
        metricSource:
          type: Prometheus
          spec:
            query: llmsla_request_ttft_seconds""", """      ratioMetric:
        counter: true
        good:
          metricSource:
            type: Prometheus
            spec:
              query: llmsla_requests_total{status="ok"}
        total:
          metricSource:
            type: Prometheus
            spec:
              query: rate(llmsla_requests_total[5m])""").replace("    - op: lte\n      value: 0.8\n", "    - ")
    with pytest.raises(SourceError, match=r"x.yaml:\d+: .*total.metricSource.spec.query: expected a counter series selector"):
        _parse(ratio)
    ok = _parse(ratio.replace("rate(llmsla_requests_total[5m])", "llmsla_requests_total"))
    assert ok.good == 'llmsla_requests_total{status="ok", pool="chat"}' and ok.total == 'llmsla_requests_total{pool="chat"}'
    (tmp_path / "a.yaml").write_text(_GOOD)
    (tmp_path / "b.yaml").write_text(_GOOD)
    with pytest.raises(SourceError, match=r"b.yaml:4: metadata.name: SLO 'ttft' is already defined in .*a.yaml:4"):
        load_specs(spec_files(tmp_path), _cfg())
    (tmp_path / "b.yaml").write_text("apiVersion: [\n")
    with pytest.raises(SourceError, match=r"b.yaml:2: not valid YAML"):
        load_specs(spec_files(tmp_path), _cfg())
    (tmp_path / "b.yaml").write_text(_GOOD.replace("  name: ttft", "  name: x\n  name: y"))
    with pytest.raises(SourceError, match=r"b.yaml:5: metadata.name: duplicate key"):
        load_specs(spec_files(tmp_path), _cfg())
    with pytest.raises(SourceError, match="no \\*.yaml SLO specs"):
        spec_files(tmp_path / "empty")


def test_cli_error_names_the_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.yaml").write_text(_GOOD.replace("value: 0.8", "value: 0.9"))
    assert main(["slo", "generate", "--specs", str(tmp_path), "--rules-out", str(tmp_path / "r"), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'bad.yaml'}:23: spec.objectives[0].value: 0.9 s is not a bucket bound" in err


def test_a_quiet_night_does_not_poison_the_period_budget(promtool: str, tmp_path: Path) -> None:
    """No traffic for 30 min, then 0.5 % errors: the 30-day budget remaining is 0.5 (a number),
    not NaN - a quiet window has no ratio rather than 0/0, which sum_over_time would carry for
    a month."""
    rules = ROOT / "deploy" / "prometheus" / "rules" / "slo-ttft.yml"
    count, good = "0+0x30 0+200x60", "0+0x30 0+199x60"  # per minute: quiet, then 200 requests, 199 fast
    labels = 'model="llmsla-tiny", pool="default", replica="r0", arm="default"'
    test = tmp_path / "quiet.test.yml"
    test.write_text(f"""rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{names.REQUEST_TTFT_SECONDS}_count{{{labels}}}'
        values: '{count}'
      - series: '{names.REQUEST_TTFT_SECONDS}_bucket{{{labels}, le="0.8"}}'
        values: '{good}'
    promql_expr_test:
      - expr: count({names.SLO_PERIOD_ERROR_BUDGET_REMAINING}{{sloth_slo="ttft"}} > 0.499 < 0.501)
        eval_time: 90m
        exp_samples:
          - labels: '{{}}'
            value: 1
      - expr: count({names.SLO_SLI_ERROR['5m']}{{sloth_slo="ttft"}} != {names.SLO_SLI_ERROR['5m']}{{sloth_slo="ttft"}})
        eval_time: 20m
        exp_samples: []
""")
    out = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_objectives_keep_their_precision() -> None:
    """An objective of 99.99995 % is not rounded to 100 % (a zero budget: every burn rate Inf)."""
    spec = _parse(_GOOD.replace("target: 0.99\n", "target: 0.9999995\n"))
    text = emit.dump(R.slo_rule_file(spec, R.Profile()), "")
    assert "vector(0.9999995)" in text and "vector(1-0.9999995)" in text and "sloth_objective: '99.99995'" in text
    assert [R.num(x) for x in (1 - 0.9995, 0.1 * 2419200 / 259200, 6.0, 1e-05)] == ["0.0005", "0.933333333333", "6",
                                                                                      "1e-05"]


@pytest.mark.parametrize("days, factors, windows", [
    (30, (14.4, 6, 3, 1), ("5m", "30m", "1h", "2h", "6h", "1d", "3d")),
    (28, (13.44, 5.6, 2.8, 0.933333333333), ("5m", "30m", "1h", "2h", "6h", "1d", "3d")),
    (7, (14.4, 6, 3, 1), ("70s", "7m", "14m", "28m", "84m", "336m", "1008m")),
    (1, (14.4, 6, 3, 1), ("10s", "1m", "2m", "4m", "12m", "48m", "144m")),
])
def test_any_period_gets_sloth_factors_and_one_rule_per_series(days: int, factors, windows,
                                                               promtool: str, tmp_path: Path) -> None:
    """Sloth's catalog (30d, 28d) scales the factors; other periods scale the windows, and the
    period's own SLI rule never collides with a window's (1d and 3d used to record one series twice)."""
    spec = _parse(_GOOD.replace("duration: 30d", f"duration: {days}d"))
    page, ticket = R.spec_pairs(spec)
    assert [round(p.factor, 9) for p in (*page, *ticket)] == [round(f, 9) for f in factors]
    assert [w for _, w in R.sli_windows(days)] == list(windows)
    text = emit.dump(R.slo_rule_file(spec, R.Profile()), "")
    records = [line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith("- record:")]
    sli = [r for r in records if r.startswith("slo:sli_error")]
    assert len(sli) == len(set(sli)) == len(windows) + 1
    assert f"slo:sli_error:ratio_rate{R.window_name(days * 86400)}" in sli
    # every slo: series a rule reads is one the file records (a scaled period has no 5m SLI: its
    # current burn rate and period SLI read its own quick window)
    read = set(re.findall(r"(?<![\w:])(slo:[a-z_:]+[a-z0-9]+)(?=[{\s)]|$)", text))
    assert read and read <= set(records), read - set(records)
    f = tmp_path / "r.yml"
    f.write_text(text)
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    if days in (30, 28):
        data, _ = rule_tests.test_file(spec, str(f))
        t = tmp_path / "t.yml"
        t.write_text(emit.dump(data, ""))
        res = subprocess.run([promtool, "test", "rules", str(t)], capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
    else:
        assert "not whole minutes" in rule_tests.untestable(spec)


_REGEX = (Path(ROOT / "deploy/slo/availability.yaml").read_text()
          .replace('llmsla_requests_total{status=~"error|timeout"}', 'llmsla_requests_total{code=~"(5..|429)"}')
          .replace('llmsla_requests_total{status!="cancelled"}', "llmsla_requests_total"))


def test_regex_sli_gets_rules_and_tests_from_a_matching_series(promtool: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "slo").mkdir()
    (tmp_path / "slo" / "a.yaml").write_text(_REGEX)
    rules, tests = tmp_path / "rules", tmp_path / "tests"
    assert main(["slo", "generate", "--specs", str(tmp_path / "slo"), "--rules-out", str(rules),
                 "--tests-out", str(tests)]) == 0
    text = (tests / "slo-availability.test.yml").read_text()
    assert 'code="429"' in text  # an example of the regex, not the regex itself
    res = subprocess.run([promtool, "test", "rules", str(tests / "slo-availability.test.yml")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_sli_without_a_buildable_series_skips_only_its_tests(tmp_path: Path, capsys) -> None:
    (tmp_path / "slo").mkdir()
    (tmp_path / "slo" / "a.yaml").write_text(_REGEX.replace("(5..|429)", "[5-9]+"))
    rules, tests = tmp_path / "rules", tmp_path / "tests"
    assert main(["slo", "generate", "--specs", str(tmp_path / "slo"), "--rules-out", str(rules),
                 "--tests-out", str(tests)]) == 0
    assert (rules / "slo-availability.yml").exists() and not (tests / "slo-availability.test.yml").exists()
    assert "rule tests for SLO availability skipped: " in capsys.readouterr().out
