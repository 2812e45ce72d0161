"""The store's goodput column holds each request to the objectives of its own tenant and class
(SLO specs that target them, docs/alerting.md#slos-per-class-and-per-tenant), on both stream-job
paths: the real job on a spool of several tenants and classes, against the Python rule
(``GoodputBounds.request_met``) summed per (tenant, class) over the same usable events."""

from __future__ import annotations

import collections
import shutil
import time
from pathlib import Path

import psycopg

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.goodput import GoodputBounds
from llmsla.resources import deploy
from llmsla.streaming import synth

from . import reference as ref
from .conftest import publish, start_stream
from .test_windows import DELAY_MS

TENANCY = synth.Keys(tenancy=(("acme", "interactive"), ("acme", "batch"), ("globex", "batch"),
                              ("other", "sheddable"), None))


def _config(tmp_path: Path) -> Path:
    slo = tmp_path / "slo"
    shutil.copytree(deploy("slo"), slo, ignore=shutil.ignore_patterns("examples"))
    for f in ("ttft-interactive.yaml", "ttft-acme.yaml", "e2e-batch.yaml"):
        shutil.copy(deploy("slo") / "examples" / f, slo / f)
    path = tmp_path / "llmsla.toml"
    path.write_text(f'[tenants]\nheader = "X-Tenant"\ndeclared = {{ acme = "interactive", globex = "batch" }}\n'
                    f'[gateway]\ntrusted_proxies = ["10.0.0.0/8"]\n[slo]\ndir = "{slo}"\n')
    return path


def _goodput(dsn: str) -> dict[tuple[str, str], int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT tenant, class, SUM(goodput)::int FROM {names.T_REQUEST_WINDOWS} "
                            "GROUP BY 1, 2").fetchall()
    return {(t, c): n for t, c, n in rows}


def test_goodput_per_tenant_and_class_on_both_paths(cfg, spool_dirs, tmp_path: Path) -> None:
    conf = _config(tmp_path)
    good = GoodputBounds.from_catalog(slo_catalog.load(config_mod.load(conf, env={})))
    assert good.tenants == {"acme"} and good.classes == {"interactive", "batch"}
    now = int(time.time() * 1000)
    cols = synth.request_columns(2000, start_ms=now - 300_000, span_ms=60_000, seed=11, keys=TENANCY)
    lines = list(synth.request_lines(cols, TENANCY))
    publish(spool_dirs[names.SPOOL_REQUESTS], "0000000000001-test.jsonl", lines)
    usable = ref.judge(names.SPOOL_REQUESTS, lines, delay_ms=DELAY_MS, now_ms=now,
                       max_future_ms=int(cfg.stream.max_future_s * 1000),
                       max_past_ms=int(cfg.stream.max_past_s * 1000)).usable
    want: collections.Counter[tuple[str, str]] = collections.Counter()
    fleet: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in usable:
        want[(e.tenant, e.class_)] += good.request_met(e.status, e.ttft_ms, e.e2e_ms, e.output_tokens,
                                                       tenant=e.tenant, class_=e.class_)
        fleet[(e.tenant, e.class_)] += good.request_met(e.status, e.ttft_ms, e.e2e_ms, e.output_tokens)
    assert want != fleet  # the scoped objectives judge some requests otherwise on this spool
    for path, extra in (("java", {}), ("sql", {"java_parser": "false"})):
        log = tmp_path / f"{path}.log"
        proc = start_stream(cfg, "--once", "--fresh", log=log, watermark_delay_s=DELAY_MS / 1000,
                            extra_env={config_mod.ENV_CONFIG_FILE: str(conf)}, **extra)
        assert proc.wait(timeout=240) == 0, log.read_text()[-4000:]
        got = _goodput(cfg.store.dsn)
        assert got == {k: v for k, v in want.items()}, (path, got, dict(want))
        with psycopg.connect(cfg.store.dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {names.T_REQUEST_WINDOWS}, {names.T_DEAD_LETTERS}")
