"""Distillation controls: bounded steps, deterministic student/teacher split, audit trail."""

from __future__ import annotations

import hashlib
import math

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls, StepTooLarge, UnknownPool
from llmsla.control.router import Replica, Router
from llmsla.store.connection import connect
from llmsla.store.migrate import migrate


def test_share_moves_in_bounded_steps_and_every_change_is_audited():
    reg = CollectorRegistry()
    d = DistillControls(["p"], max_share_step_pct=10, registry=reg)
    rec = d.set_student_share("p", 35, actor="alice", reason="canary")
    assert rec["outcome"] == "clamped" and rec["before"] == 0 and rec["after"] == 10
    assert rec["extra"]["requested"] == 35
    trail = [d.set_student_share("p", 35, actor="bot", reason="step")["after"] for _ in range(3)]
    assert trail == [20, 30, 35]
    assert d.set_student_share("p", 30, actor="bob")["outcome"] == "applied"
    with pytest.raises(StepTooLarge, match="max_share_step_pct"):
        d.set_student_share("p", 90, actor="bob", clamp=False)
    assert d.student_share_pct("p") == 30
    for bad in (-1, 101, math.nan, "50", True):
        with pytest.raises(ValueError, match="student_share_pct"):
            d.set_student_share("p", bad, actor="x")
    with pytest.raises(UnknownPool):
        d.set_student_share("q", 5, actor="x")
    recs = d.audit.recent()
    assert [r["actor"] for r in recs] == ["alice", "bot", "bot", "bot", "bob", "bob"]
    assert recs[-1]["outcome"] == "refused" and recs[-1]["after"] == 30
    assert all(r["action"] == "set_student_share" and r["target"] == "p" and r["ts"] for r in recs)
    assert reg.get_sample_value(names.DISTILL_STUDENT_SHARE_RATIO, {names.L_POOL: "p"}) == 0.30


def test_student_choice_is_deterministic_proportional_and_monotone():
    d = DistillControls(["p"], max_share_step_pct=100)
    keys = [f"conv-{i}" for i in range(20_000)]
    students = {}
    for pct in (0, 12.5, 30, 70, 100):
        d.set_student_share("p", pct, actor="t")
        chosen = {k for k in keys if d.role_for("p", k) == "student"}
        n, p = len(keys), pct / 100
        assert abs(len(chosen) / n - p) <= 4 * math.sqrt(max(p * (1 - p), 1e-12) / n) + 1e-12, pct
        # independent reference: the same blake2b point computed here
        ref = {k for k in keys
               if int.from_bytes(hashlib.blake2b(f"p:{k}".encode(), digest_size=8).digest(), "big") % 10_000
               < round(pct * 100)}
        assert chosen == ref
        students[pct] = chosen
    assert students[12.5] <= students[30] <= students[70]  # raising the share never moves a key back


def test_pick_routes_by_role_and_falls_back_when_a_role_is_missing():
    d = DistillControls(["p", "q"], max_share_step_pct=100)
    r = Router([Replica("t", "p", role="teacher"), Replica("s", "p", role="student"),
                Replica("x", "q")], "round_robin")
    d.set_student_share("p", 50, actor="t")
    for k in ("a", "b", "c", "d", "e", "f"):
        assert d.pick(r, "p", k).role == d.role_for("p", k)
    d.set_student_share("q", 50, actor="t")
    assert {d.pick(r, "q", k).id for k in "abcdef"} == {"x"}  # q has no roles: any replica


def test_temperature_schedule_validation_and_bounded_step():
    d = DistillControls(["p"], max_temperature_step=0.5)
    rec = d.set_schedule("p", "linear", {"t_max": 1.4, "t_min": 0.2, "horizon": 128}, actor="ops", reason="warmer")
    assert rec["before"]["name"] == "constant" and rec["after"]["params"]["t_max"] == 1.4
    assert d.schedule("p").name == "linear" and d.schedule("p").params["horizon"] == 128
    with pytest.raises(StepTooLarge, match="t_max"):
        d.set_schedule("p", "linear", {"t_max": 2.0, "t_min": 0.2}, actor="ops")
    assert d.audit.recent()[-1]["outcome"] == "refused"
    for name, params, match in (
        ("warp", {}, "schedule.name"),
        ("linear", {"t_hot": 1}, "unknown key"),
        ("linear", {"t_max": "hot"}, "t_max"),
        ("linear", {"t_min": 1.3, "t_max": 1.2}, "t_min"),
        ("cosine", {"horizon": 1.5}, "horizon"),
        ("cosine", [1, 2], "expected an object"),
    ):
        with pytest.raises(ValueError, match=match):
            d.set_schedule("p", name, params, actor="ops")
    assert d.schedule("p").params["t_max"] == 1.4  # nothing bad was applied


def test_audit_rows_land_in_the_store(pg_dsn):
    cfg = config_mod.load(env={})
    with connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, cfg)
    audit = AuditLog(pg_dsn)
    d = DistillControls(["p"], audit=audit)
    d.set_student_share("p", 5, actor="alice", reason="canary 5%")
    d.set_schedule("p", "cosine", {}, actor="bob", reason="smoother")
    assert audit.flush(10)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            f"SELECT source, actor, action, target, params, reason, outcome FROM {names.T_ACTION_LOG} ORDER BY id"
        ).fetchall()
    assert [(r[1], r[2], r[3], r[5], r[6]) for r in rows] == [
        ("alice", "set_student_share", "p", "canary 5%", "applied"),
        ("bob", "set_temperature_schedule", "p", "smoother", "applied"),
    ]
    assert rows[0][4]["before"] == 0 and rows[0][4]["after"] == 5
    assert rows[1][4]["after"]["name"] == "cosine" and rows[0][0] == "control_api"
    assert all(r["stored"] is True for r in audit.recent())


def test_audit_keeps_changes_when_the_store_is_down():
    audit = AuditLog("postgresql://nobody@127.0.0.1:1/nowhere", connect_timeout_s=1)
    d = DistillControls(["p"], audit=audit)
    d.set_student_share("p", 5, actor="alice")
    assert audit.flush(15)
    assert d.student_share_pct("p") == 5  # the control action itself still applied
    rec = audit.recent()[-1]
    assert rec["stored"] is False and audit.store_failures == 1
