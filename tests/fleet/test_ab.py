"""A/B arms in the simulator: units from sessions, each assigned by the same rollout as the
gateway, each arm's strategy (pool, route policy, student share, schedule) applied, events labelled."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

from llmsla import experiments as E
from llmsla import names
from llmsla.app import cli
from llmsla.control.rollout import Rollout
from llmsla.fleet import engine, workload

from .conftest import read_events, run_to_spool

SPEC = {"exp": {"seed": 5, "coverage": 0.8, "arms": {
    "base": {},
    "stud": {"student_share_pct": 100},
    "canary": {"pool": "canary", "route_policy": "least_outstanding", "schedule": {"name": "linear"}},
}}}


def test_sessions_group_requests_into_units(conv_5min) -> None:
    got = workload.sessions(conv_5min, random.Random(1), mean_turns=5, think_s=20)
    assert [a.t for a in got] == [a.t for a in conv_5min]  # arrival times kept
    per_unit = collections.Counter(a.unit for a in got)
    assert 2.5 < len(got) / len(per_unit) < 6  # sessions cut short at the window's end
    assert max(per_unit.values()) >= 10
    assert workload.window(got, start_s=10)[0].unit  # transforms keep the unit
    by_unit = collections.defaultdict(list)
    for a, orig in zip(got, conv_5min, strict=True):
        by_unit[a.unit].append(a.prompt / orig.prompt)
    spread = [max(v) / min(v) for v in by_unit.values() if len(v) > 3 and min(r for r in v) > 0]
    assert spread and sorted(spread)[len(spread) // 2] < 1.5  # one heaviness per session (rounding aside)


def test_simulator_applies_arms_like_the_gateway(tmp_path: Path, conv_5min, sim_cfg) -> None:
    arrivals = workload.sessions(conv_5min, random.Random(2), mean_turns=4, think_s=15)
    rollout = Rollout(E.parse(SPEC))
    sim = engine.SimConfig(replicas=engine.fleet("70b/teacher:2,1.3b/student:2,canary=6b:2"), policy="round_robin",
                           rollout=rollout, entry_pools=[names.DEFAULT_POOL], seed=4,
                           student_share=0.0)  # the pool's share, as the gateway's default: teachers
    res, _ = run_to_spool(sim_cfg, tmp_path, sim, arrivals)
    events = read_events(tmp_path, names.SPOOL_REQUESTS)
    assert len(events) == len(arrivals) == len(res.rows)
    models = {"base": "70b", "stud": "1.3b", "canary": "6b", None: "70b"}
    arms = collections.Counter()
    for ev in events:
        parsed = E.parse_label(ev.arm)
        arm = parsed[1] if parsed else None
        arms[arm] += 1
        if ev.status == names.STATUS_OK:
            assert ev.model == models[arm], ev  # pool (canary), student share (stud) applied
        assert ev.pool == ("canary" if arm == "canary" else names.DEFAULT_POOL)
        assert ev.policy == ("linear" if arm == "canary" else names.DEFAULT_POLICY)
    # the label of each request is the rollout's assignment of its unit
    units = {a.t: a.unit for a in arrivals}
    for row in res.rows:
        assert row.arm == rollout.assign(names.DEFAULT_POOL, units[row.arrival_s]).label
    assert all(arms[a] > 100 for a in ("base", "stud", "canary", None))


def test_simulate_cli_runs_the_configured_experiment(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LLMSLA_AB_EXPERIMENTS", json.dumps({"exp": {"arms": {"a": {}, "b": {"pool": "canary"}}}}))
    out = tmp_path / "s.json"
    rc = cli.main(["simulate", "--load", "poisson", "--rate", "10", "--duration", "60", "--sessions", "4",
                   "--fleet", "6b:2,canary=6b:2", "--no-events", "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert set(summary["arms"]) == {"exp:a", "exp:b"} and sum(summary["arms"].values()) == summary["requests"]
    assert 0.35 < summary["arms"]["exp:b"] / summary["requests"] < 0.65
    rc = cli.main(["simulate", "--load", "poisson", "--duration", "5", "--sessions", "0.5", "--no-events"])
    assert rc == 2 and "--sessions/--think-s" in capsys.readouterr().err
