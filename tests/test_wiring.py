"""The composition root's control plane: one replica numbering for every command, one audit
log handed to every collaborator at construction (never patched on afterwards)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.app import wiring
from llmsla.control.audit import AuditLog
from llmsla.exporters.asgi import InstrumentedASGI
from llmsla.replicas import replicas_from_config


def _cfg() -> config_mod.Config:
    cfg = config_mod.load(env={})
    cfg.gateway.upstreams = ["http://127.0.0.1:9001", "http://127.0.0.1:9002/"]
    cfg.gateway.student_upstreams = ["http://127.0.0.1:9003"]
    cfg.gateway.pools = ["canary=http://127.0.0.1:9004"]
    return cfg


def test_control_serve_and_the_gateway_number_the_same_replicas() -> None:
    cfg = _cfg()
    audit = AuditLog()
    plane = wiring.control_plane(cfg, replicas_from_config(cfg), audit=audit, shared=None)  # control serve
    gw = wiring.gateway(cfg, registry=CollectorRegistry(), audit=audit)
    try:
        ids = [(r.id, r.pool, r.url, r.role) for r in plane.router.replicas()]
        assert ids == [(r.id, r.pool, r.url, r.role) for r in gw.router.replicas()]
        assert ids == [("r0", "default", "http://127.0.0.1:9001", "teacher"),
                       ("r1", "default", "http://127.0.0.1:9002", "teacher"),
                       ("r2", "default", "http://127.0.0.1:9003", "student"),
                       ("r3", "canary", "http://127.0.0.1:9004", "")]
        for p in (plane, gw.plane):  # one audit log, given at construction
            assert p.audit is audit and p.distill.audit is audit and p.rollout.audit is audit
        assert gw.prober is gw.plane.prober and gw.prober.router is gw.router
    finally:
        plane.close()
        gw.plane.close()


def test_the_old_asgi_spelling_still_builds_its_recorder_with_a_warning() -> None:
    cfg = config_mod.load(env={})
    reg = CollectorRegistry()

    async def app(scope, receive, send) -> None:  # pragma: no cover - never called
        pass

    with pytest.warns(DeprecationWarning, match="from_config"):
        mw = InstrumentedASGI(app, cfg, registry=reg, replica="pod-9")
    assert mw.recorder.metrics is InstrumentedASGI.from_config(app, cfg, registry=reg).recorder.metrics
    assert mw.replica == "pod-9"
    with pytest.raises(TypeError, match="nope"), pytest.warns(DeprecationWarning):
        InstrumentedASGI(app, cfg, nope=1)
