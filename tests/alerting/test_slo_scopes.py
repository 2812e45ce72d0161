"""Per-tenant and per-class SLOs in the burn-rate rules: promtool runs the generated rules of the
shipped examples, a tenant's burn pages for that tenant only, and dropping a spec's tenant filter
fails the generated tests (docs/alerting.md#slos-per-class-and-per-tenant)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import names, services
from llmsla.alerting import generate as G
from llmsla.alerting import rules as R
from llmsla.resources import deploy

EXAMPLES = deploy("slo") / "examples"


@pytest.fixture(scope="module")
def promtool() -> str:
    return services.find_binary("promtool")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet-wide specs, the examples and a globex twin of ttft-acme, generated as `llmsla slo
    generate` would with the examples' tenants.toml."""
    root = tmp_path_factory.mktemp("scoped")
    d = root / "slo"
    shutil.copytree(deploy("slo"), d, ignore=shutil.ignore_patterns("examples"))
    for f in EXAMPLES.glob("*.yaml"):
        shutil.copy(f, d / f.name)
    (d / "ttft-globex.yaml").write_text((EXAMPLES / "ttft-acme.yaml").read_text().replace("acme", "globex"))
    cfg = config_mod.load(EXAMPLES / "tenants.toml", env={})
    for path, text in G.generate(cfg, specs_dir=d, rules_dir=root / "rules", tests_dir=root / "tests").files.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    return root


def _run(promtool: str, *files: Path) -> list[tuple[Path, int, str]]:
    procs = [(f, subprocess.Popen([promtool, "test", "rules", str(f)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)) for f in files]
    return [(f, p.wait(timeout=300), p.stdout.read() if p.stdout else "") for f, p in procs]


def test_scoped_rules_filter_and_label_by_tenant_and_class(generated: Path) -> None:
    acme = (generated / "rules" / "slo-ttft-acme.yml").read_text()
    assert 'sum by (model, pool, tenant) (rate(llmsla_request_ttft_seconds_bucket{tenant="acme", le="0.3"}[5m]))' in acme
    assert "and on (model, pool, tenant)\n" in acme  # the low-traffic guard, per tenant
    assert 'increase(llmsla_request_ttft_seconds_count{tenant="acme"}[1h])) >= 20' in acme
    assert "> on(sloth_id, model, pool, tenant) group_left()" in acme  # the replica page's pool, per tenant
    batch = (generated / "rules" / "slo-e2e-batch.yml").read_text()
    assert 'sum by (model, pool, class) (rate(llmsla_request_e2e_seconds_bucket{class="batch", le="60.0"}[5m]))' in batch
    avail = (generated / "rules" / "slo-availability-acme.yml").read_text()
    assert 'llmsla_requests_total{status=~"error|timeout", tenant="acme"}' in avail
    # the fleet-wide rules are the shipped ones, unchanged by the scoped specs beside them
    assert (generated / "rules" / "slo-ttft.yml").read_text().split("\n", 1)[1] == \
        (deploy("prometheus") / "rules" / "slo-ttft.yml").read_text().split("\n", 1)[1]


def test_the_page_labels_contract() -> None:
    """What budget-driven shedding matches on: severity, source, scope, slo, and per series
    model, pool and the spec's tenant and/or class."""
    from llmsla.slo_specs import load_specs, spec_files

    cfg = config_mod.load(EXAMPLES / "tenants.toml", env={})
    for spec in load_specs(spec_files(EXAMPLES), cfg):
        page = R.alert_group(spec, R.Profile())["rules"][0]  # type: ignore[index]
        assert page["labels"] == {names.L_SEVERITY: "page", names.L_SLOTH_SEVERITY: "page", names.L_SLO: spec.name,
                                  names.L_SCOPE: names.SCOPE_POOL, names.L_SOURCE: names.SOURCE_BURN_RATE}
        assert R.scope_by(spec) == (names.L_MODEL, names.L_POOL, *spec.scope)


def test_generated_scoped_rule_tests_pass(promtool: str, generated: Path) -> None:
    """Each scoped spec's scenarios run beside traffic outside its scope: its own burn pages (with
    its tenant/class), its neighbour's never does, a trickle never pages."""
    files = sorted((generated / "tests").glob("*.test.yml"))
    scoped = [f for f in files if f.name not in {"slo-ttft.test.yml", "slo-e2e.test.yml", "slo-availability.test.yml"}]
    assert len(scoped) == 5
    for f in scoped:
        text = f.read_text()
        assert "neighbour burn: every request outside" in text and "low traffic:" in text
    for f, rc, out in _run(promtool, *scoped):
        assert rc == 0, f"{f}:\n{out}"


def test_dropping_the_tenant_filter_fails_the_generated_tests(promtool: str, generated: Path, tmp_path: Path) -> None:
    """The mutation: the same rules without their tenant="acme" matcher page for the neighbour's
    burn, and the generated tests say so."""
    rules = (generated / "rules" / "slo-ttft-acme.yml").read_text()
    mutated = rules.replace('{tenant="acme", ', "{").replace('{tenant="acme"}', "")
    assert mutated != rules and 'tenant="acme"' not in mutated
    (tmp_path / "slo-ttft-acme.yml").write_text(mutated)
    test = tmp_path / "t.test.yml"
    test.write_text((generated / "tests" / "slo-ttft-acme.test.yml").read_text()
                    .replace("../rules/slo-ttft-acme.yml", str(tmp_path / "slo-ttft-acme.yml")))
    [(_, rc, out)] = _run(promtool, test)
    assert rc != 0 and "name: neighbour burn: every request outside tenant acme bad" in out, out


def _series(name: str, tenant: str, cls: str, values: str) -> str:
    labels = f'model="llmsla-tiny", pool="default", replica="r0", arm="default", tenant="{tenant}", class="{cls}"'
    return f"      - series: '{name}{{{labels}}}'\n        values: '{values}'\n"


def test_a_tenant_that_breaks_pages_for_itself_not_the_fleet_or_another(promtool: str, generated: Path,
                                                                         tmp_path: Path) -> None:
    """acme (200 requests a minute) turns all slow at minute 120 while globex (200 a minute) and
    everyone else (40,000 a minute) stay fast: acme's TTFT page fires, with tenant="acme"; the
    fleet-wide TTFT SLO (0.5 % slow, half its 1 % budget) and globex's fire nothing."""
    ttft = names.REQUEST_TTFT_SECONDS
    series = ""
    for tenant, cls, per_min in (("acme", "interactive", 200), ("globex", "batch", 200), ("other", "sheddable", 40000)):
        count = f"0+{per_min}x240"
        # good at the fleet's 0.8 s and each tenant's 0.3 s bound: all fast, acme none from minute 121
        good = f"0+{per_min}x120 {120 * per_min}+0x120" if tenant == "acme" else count
        for le in ("0.3", "0.8"):
            series += _series(f"{ttft}_bucket", tenant, cls, good).replace("}'", f', le="{le}"}}\'')
        series += _series(f"{ttft}_count", tenant, cls, count)
    rule_files = ", ".join(f'"{generated / "rules" / f}"' for f in ("slo-ttft.yml", "slo-ttft-acme.yml", "slo-ttft-globex.yml"))
    checks = ""
    for t in (120, 200, 240):
        for alert in ("TtftErrorBudgetBurn", "TtftGlobexErrorBudgetBurn", "TtftReplicaErrorBudgetBurn"):
            checks += f"      - eval_time: {t}m\n        alertname: {alert}\n        exp_alerts: []\n"
    pages = 'count by (alertname, slo, severity, source, scope, model, pool, tenant) (ALERTS{alertstate="firing", severity="page"})'
    test = tmp_path / "tenants.test.yml"
    test.write_text(f"""rule_files: [{rule_files}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}    alert_rule_test:
{checks}    promql_expr_test:
      - expr: '{pages}'
        eval_time: 120m
        exp_samples: []
      - expr: '{pages}'
        eval_time: 200m
        exp_samples:
          - labels: '{{alertname="TtftAcmeErrorBudgetBurn", slo="ttft-acme", severity="page", source="burn_rate", scope="pool", model="llmsla-tiny", pool="default", tenant="acme"}}'
            value: 1
""")
    [(_, rc, out)] = _run(promtool, test)
    assert rc == 0, out
