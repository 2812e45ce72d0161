"""Dashboards as code: SDK round trip, committed files current, tsc against @grafana/schema,
every metric and table named in ``llmsla.names``, provisioning consistent with the dashboards."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from llmsla import config as config_mod
from llmsla import names
from llmsla.dashboards import build, postgres, promql, storesql, typecheck
from llmsla.dashboards.common import PROM, SAFE_VALUES, STORE
from llmsla.dashboards.query import REGISTRY, PromQuery, SqlQuery, base_metric

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "grafana"


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return build.render(config_mod.load(env={}))


@pytest.fixture(scope="module")
def dashboards(rendered: dict[str, str]) -> dict[str, dict]:
    return {Path(rel).stem: json.loads(text) for rel, text in rendered.items() if rel.endswith(".json")}


def targets(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out += p.get("targets", [])
    return out


def test_build_check_cli_names_stale_files(tmp_path: Path) -> None:
    """(The committed deploy/grafana is checked with every generator's, tests/test_generated.py.)
    A dashboard no longer built is stale too, and ``build`` deletes it."""
    run = [sys.executable, "-m", "llmsla", "dashboards", "build", "--out", str(tmp_path)]
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0
    (tmp_path / "dashboards" / "fleet.json").write_text("{}")
    (tmp_path / "dashboards" / "old.json").write_text("{}")
    out = subprocess.run([*run, "--check"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "fleet.json" in out.stdout and "old.json" in out.stdout and "slo.json" not in out.stdout
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.splitlines()[:2] == [
        f"deleted {tmp_path / 'dashboards' / 'old.json'}", f"wrote {tmp_path / 'dashboards' / 'fleet.json'}"]
    assert not (tmp_path / "dashboards" / "old.json").exists()


def test_every_dashboard_round_trips_through_the_sdk_models(dashboards: dict[str, dict]) -> None:
    """JSON -> SDK Dashboard model -> JSON is the identity, query targets included. One documented
    exception: the SDK types an annotation's target as Grafana's built-in target and drops a SQL
    query there, so annotation targets round-trip through the PostgreSQL data-query model."""
    plugins.register_default_plugins()
    postgres.register()
    for stem, data in dashboards.items():
        model = Dashboard.from_json(copy.deepcopy(data))
        for p in model.panels or []:
            for t in getattr(p, "targets", None) or []:
                want = PromQuery if p.datasource.type_val == "prometheus" else SqlQuery
                assert type(t).__module__.endswith("prometheus" if want is PromQuery else "postgres"), (stem, p.title, t)
        again = build.to_dict(model)
        annos, annos_again = data["annotations"].get("list", []), again["annotations"].get("list", [])
        assert len(annos) == len(annos_again)
        for a, b in zip(annos, annos_again, strict=True):
            assert postgres.Dataquery.from_json(a["target"]).to_json() | {"datasource": a["target"]["datasource"]} == a["target"]
            # what the SDK model kept of it: only the built-in target's fields
            assert set(b["target"]) <= {"limit", "matchAny", "tags", "type"}
            a, b = dict(a), dict(b)
            a.pop("target")
            b.pop("target")
            assert a == b
        data, again = dict(data), dict(again)
        data.pop("annotations")
        again.pop("annotations")
        assert again == data, stem


def test_uids_links_and_variables(dashboards: dict[str, dict]) -> None:
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids) == 6
    assert all(u.startswith("llmsla-") for u in uids)
    for stem, d in dashboards.items():
        assert any(link["type"] == "dashboards" and link["tags"] == ["llmsla"] and link["keepTime"]
                   for link in d["links"]), stem
        variables = {v["name"]: v for v in d["templating"]["list"]}
        for v in variables.values():
            if v["type"] == "query":
                # multi-value, include-all, no custom all value: valid in PromQL and in SQL IN (...)
                assert v["multi"] and v["includeAll"] and "allValue" not in v, (stem, v["name"])
                assert v["regex"] == SAFE_VALUES, (stem, v["name"])  # see test_macros
        ds_types = {p["datasource"]["type"] for p in d["panels"] if "datasource" in p}
        if "prometheus" in ds_types:
            assert variables["datasource"]["query"] == "prometheus"
            assert variables["datasource"]["current"]["value"] == names.GRAFANA_PROMETHEUS_UID
        if names.GRAFANA_POSTGRES_TYPE in ds_types:
            assert variables["store"]["current"]["value"] == names.GRAFANA_STORE_UID
        panel_ids = [p["id"] for p in d["panels"]]
        assert panel_ids == list(range(1, len(panel_ids) + 1))
    # every request-labelled dashboard filters on the four request labels
    for stem in ("fleet", "instances"):
        assert {"datasource", "store", *names.REQUEST_LABELS} <= {v["name"] for v in dashboards[stem]["templating"]["list"]}
    # panel links to other dashboards point at existing uids
    for d in dashboards.values():
        for p in d["panels"]:
            for link in p.get("links", []):
                uid = re.match(r"/d/([\w-]+)", link["url"]).group(1)
                assert uid in uids


def test_slo_thresholds_are_drawn(dashboards: dict[str, dict]) -> None:
    cfg = config_mod.load(env={})
    fleet = {p["title"]: p for p in dashboards["fleet"]["panels"]}
    for title, objective in (("TTFT P50 / P95 / P99", cfg.slo.ttft_ms / 1000), ("E2E P50 / P95 / P99", cfg.slo.e2e_ms / 1000)):
        fc = fleet[title]["fieldConfig"]["defaults"]
        assert [s["value"] for s in fc["thresholds"]["steps"]] == [None, objective]
        assert fc["custom"]["thresholdsStyle"]["mode"] == "dashed"
    heat = fleet["TTFT distribution"]
    assert heat["options"]["calculate"] is False
    assert heat["targets"][0]["format"] == "heatmap"
    inst = {p["title"]: p for p in dashboards["instances"]["panels"]}
    steps = [s["value"] for s in inst["TTFT P99 per replica (live)"]["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, *cfg.metrics.ttft_buckets]  # log-spaced, SLO-aligned colour steps


def test_every_target_has_one_definition_and_every_definition_is_used(dashboards: dict[str, dict]) -> None:
    by_text = {(q.expr if isinstance(q, PromQuery) else q.sql): q for q in REGISTRY.values()}
    used = set()
    for stem, d in dashboards.items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                text = t.get("expr", t.get("rawSql"))
                assert text in by_text, (stem, p["title"], text)
                q = by_text[text]
                used.add(q.key)
                if isinstance(q, PromQuery):
                    assert p["datasource"] == PROM.to_json()
                    assert t.get("format", "time_series") == q.fmt and t.get("legendFormat", "") == q.legend
                else:
                    assert p["datasource"] == STORE.to_json() and t["format"] == q.fmt
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["query"] in by_text, (stem, v["name"])
                used.add(by_text[v["query"]].key)
        for a in d["annotations"].get("list", []):
            used.add(by_text[a["target"]["rawSql"]].key)
    assert used == set(REGISTRY), f"defined but unused: {sorted(set(REGISTRY) - used)}"


def _names_values() -> set[str]:
    out: set[str] = set()
    for v in vars(names).values():
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, dict):
            out.update(x for x in v.values() if isinstance(x, str))
    return out


def test_every_metric_and_table_is_defined_in_names() -> None:
    known = _names_values()
    assert REGISTRY
    for q in REGISTRY.values():
        if isinstance(q, PromQuery):
            assert q.metrics, q.key
            for m in q.metrics:
                assert base_metric(m) in known or m in known, (q.key, m)
        else:
            assert q.tables, q.key
            for t in q.tables:
                assert t in known and t in {names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H,
                                            names.T_FORECASTS_1M, names.T_FORECASTS_1H, names.T_ENGINE_WINDOWS_1M,
                                            names.T_ENGINE_WINDOWS_1H, *names.TIME_TABLES}, (q.key, t)
            assert not re.search(r"--|/\*", q.sql), f"{q.key}: no SQL comments (Grafana versions differ on them)"


def test_provisioning_matches_the_dashboards(rendered: dict[str, str], dashboards: dict[str, dict]) -> None:
    ds = yaml.safe_load(rendered["provisioning/datasources/llmsla.yaml"])["datasources"]
    assert {(d["uid"], d["type"]) for d in ds} == {(names.GRAFANA_PROMETHEUS_UID, "prometheus"),
                                                   (names.GRAFANA_STORE_UID, names.GRAFANA_POSTGRES_TYPE)}
    store = next(d for d in ds if d["type"] == names.GRAFANA_POSTGRES_TYPE)
    assert store["secureJsonData"]["password"] == "${LLMSLA_GRAFANA_DB_PASSWORD}"  # never a literal secret
    # Grafana's environment may be llmsla's too: its variables must not be llmsla configuration keys
    env = {v: "x" for v in re.findall(r"\$\{(\w+)\}", rendered["provisioning/datasources/llmsla.yaml"])}
    assert env and all(v.startswith("LLMSLA_GRAFANA_") for v in env)
    config_mod.load(env=env)
    prov = yaml.safe_load(rendered["provisioning/dashboards/llmsla.yaml"])["providers"][0]
    assert prov["type"] == "file" and prov["options"]["path"] == build.CONTAINER_PATH
    kust = yaml.safe_load(rendered["kustomization.yaml"])
    gen = {g["name"]: g for g in kust["configMapGenerator"]}
    assert gen["llmsla-dashboards"]["options"]["labels"] == {"grafana_dashboard": "1"}
    assert sorted(gen["llmsla-dashboards"]["files"]) == sorted(f"dashboards/{s}.json" for s in dashboards)
    for f in gen["llmsla-dashboards"]["files"] + gen["llmsla-datasources"]["files"]:
        assert f in rendered


def test_json_type_checks_against_grafana_schema(dashboards: dict[str, dict]) -> None:
    """tsc --strict over every dashboard typed with @grafana/schema (installed by the test command)."""
    typecheck.check(dashboards, ROOT)


BAD_JSON = {
    "unknown_key": (lambda d: d["panels"][1]["options"].__setitem__("legendd", {}), "legendd"),
    "bad_enum": (lambda d: next(p for p in d["panels"] if p["type"] == "heatmap")["options"]["color"].__setitem__("mode", "rainbow"), "rainbow"),
    "expr_type": (lambda d: next(p for p in d["panels"] if p["type"] == "timeseries")["targets"][0].__setitem__("expr", 5), "number"),
    "refresh_type": (lambda d: d.__setitem__("refresh", 30), "number"),
    "sdk_interval_keys": (lambda d: d["templating"]["list"][0].__setitem__("auto_min", "10s"), "auto_min"),
}


def test_type_check_rejects_bad_json(dashboards: dict[str, dict]) -> None:
    """The check bites: an unknown key, a bad enum value, wrong types and the SDK's interval-variable
    keys (which build.normalise removes) each fail tsc, in the file that has them."""
    bad = {}
    for name, (mutate, _) in BAD_JSON.items():
        bad[name] = copy.deepcopy(dashboards["fleet"])
        mutate(bad[name])
    found = typecheck.errors({"fleet": dashboards["fleet"], **bad}, ROOT)
    assert found["fleet"] == []
    for name, (_, message) in BAD_JSON.items():
        assert any(message in line for line in found[name]), (name, found[name])


def test_queries_are_defined_once_per_panel_query() -> None:
    assert promql.TTFT_HEATMAP.fmt == "heatmap" and "_bucket" in promql.TTFT_HEATMAP.expr
    assert set(storesql.TIERED) <= set(REGISTRY)
    assert len({q.key for q in REGISTRY.values()}) == len(REGISTRY)
