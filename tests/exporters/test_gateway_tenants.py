"""Tenants and classes on the request path (``[tenants]``), against the real gateway and reference
worker over loopback HTTP: the tenant comes from an API key or a trusted proxy's header, the class
from the tenant's default or a lower class the request names; declared tenants keep their series
under a flood of 10,000 made-up tenant names, ``/metrics`` stays bounded, and hostile values
(10 KB, NUL, newline, not UTF-8, unknown class) are ``other`` or the default: the request is still
served and recorded. 127.0.0.2 is an untrusted peer (Linux routes 127/8 to loopback).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.config import ConfigError
from llmsla.events import RequestEvent
from llmsla.exporters.clients import ClientIdentity
from llmsla.exporters.tenants import TenantResolver
from llmsla.spool import published_segments, read_segment
from llmsla.worker import server as worker_mod
from tests.worker._worker_util import MODEL, worker_cfg

PROXY, OUTSIDER = "127.0.0.1", "127.0.0.2"
KEY = "sk-acme-0123456789abcdef"
DECLARED = {"acme": "interactive", "globex": "batch"}
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
OTHER = names.LABEL_OVERFLOW_VALUE


def _cfg(tmp_path: Path, **tenants: Any) -> config_mod.Config:
    c = worker_cfg(tmp_path)
    c.gateway.trusted_proxies = ["127.0.0.1/32"]
    c.gateway.client_share = 1.0
    c.tenants.header = "X-Tenant"
    c.tenants.declared = dict(DECLARED)
    c.tenants.api_keys = {KEY: "acme"}
    for k, v in tenants.items():
        setattr(c.tenants, k, v)
    return c


def _resolver(cfg: config_mod.Config) -> TenantResolver:
    return TenantResolver(cfg, ClientIdentity(cfg.gateway.trusted_proxies, cfg.gateway.client_header))


def _who(r: TenantResolver, peer: str, **headers: str) -> tuple[str, str]:
    t = r.resolve(peer, CIMultiDict({k.replace("_", "-"): v for k, v in headers.items()}))
    return t.tenant, t.class_


# -- the rule, on the resolver the gateway uses ------------------------------------------------------
def test_the_tenant_comes_from_an_api_key_or_a_trusted_proxys_header(tmp_path: Path) -> None:
    r = _resolver(_cfg(tmp_path))
    assert _who(r, OUTSIDER, Authorization=f"Bearer {KEY}") == ("acme", "interactive")  # any peer: the key is proof
    assert _who(r, PROXY, X_Tenant="globex") == ("globex", "batch")
    assert _who(r, OUTSIDER, X_Tenant="globex") == (OTHER, "interactive")  # an untrusted peer's header: ignored
    assert _who(r, PROXY, Authorization=f"Bearer {KEY}", X_Tenant="globex") == ("acme", "interactive")  # key first
    assert _who(r, PROXY, Authorization="Bearer sk-not-a-key-of-anyone-here") == (OTHER, "interactive")
    assert _who(r, PROXY) == (OTHER, "interactive")  # tenants on, none named
    assert _who(r, PROXY, X_Tenant="initech") == (OTHER, "interactive")  # not declared
    off = _resolver(worker_cfg(tmp_path))
    assert _who(off, PROXY, X_Tenant="acme") == (names.DEFAULT_TENANT, names.DEFAULT_CLASS)  # tenants off


def test_a_request_may_lower_its_class_never_raise_it(tmp_path: Path) -> None:
    r = _resolver(_cfg(tmp_path, default_class="sheddable"))
    objective = names.CLASS_HEADER
    h = {objective: "batch", "X-Tenant": "acme"}
    assert r.resolve(PROXY, CIMultiDict(h)).class_ == "batch"  # interactive tenant asks for batch: lower, granted
    h = {objective: "interactive", "X-Tenant": "globex"}
    t = r.resolve(PROXY, CIMultiDict(h))
    assert (t.tenant, t.class_, t.folded_class) == ("globex", "batch", True)  # batch tenant may not raise it
    t = r.resolve(PROXY, CIMultiDict({objective: "platinum", "X-Tenant": "acme"}))
    assert (t.class_, t.folded_class) == ("interactive", True)  # unknown class: the tenant's default
    assert _who(r, PROXY, X_Tenant="initech") == (OTHER, "sheddable")  # tenants.default_class for other


@pytest.mark.parametrize("value", ["a" * 10_240, "acme\x00", "ac\nme", "acme\udcff", "\udcc3\udca9", " ", ""])
def test_hostile_tenant_and_class_values_are_other_or_the_default(tmp_path: Path, value: str) -> None:
    r = _resolver(_cfg(tmp_path))
    t = r.resolve(PROXY, CIMultiDict({"X-Tenant": value, names.CLASS_HEADER: value}))
    assert (t.tenant, t.class_) == (OTHER, "interactive")
    assert t.folded_tenant and t.folded_class
    t = r.resolve(PROXY, CIMultiDict({"Authorization": "Bearer " + value}))
    assert t.tenant == OTHER


@pytest.mark.parametrize(("tenants", "message"), [
    ({"class_header": "", "classes": ["gold", "interactive", "batch"]}, None),
    ({"declared": {"other": "batch"}}, "reserved"),
    ({"declared": {"acme": "gold"}}, "class 'gold' is not one of tenants.classes"),
    ({"api_keys": {KEY: "initech"}}, "tenant 'initech' is not in tenants.declared"),
    ({"api_keys": {"short": "acme"}}, "the API key of tenant 'acme': too short"),
    ({"default_class": "gold"}, "tenants.default_class = 'gold' is not one of tenants.classes"),
    ({"classes": ["a", "a"]}, "listed twice"),
], ids=["header-ok", "reserved", "class", "undeclared-key-tenant", "short-key", "default-class", "dup-class"])
def test_tenant_configuration_is_checked_and_never_shows_a_key(tmp_path: Path, tenants: dict, message: str | None) -> None:
    cfg = _cfg(tmp_path, **tenants)
    if message is None:
        _resolver(cfg)
        return
    with pytest.raises(ConfigError, match=message) as err:
        config_mod.check_key(cfg, "tenants.api_keys")
        config_mod.check_key(cfg, "tenants.declared")
        config_mod.check_key(cfg, "tenants.classes")
        config_mod.check_tenants(cfg)
    assert "short" not in str(err.value).replace("too short", "") and KEY not in str(err.value)


def test_the_header_needs_a_trusted_proxy_and_keys_may_come_from_a_file(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.gateway.trusted_proxies = []
    with pytest.raises(ConfigError, match="believed only from gateway.trusted_proxies"):
        config_mod.check_tenants(cfg)
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-globex-0123456789abcdef": "globex"}))
    cfg = _cfg(tmp_path, api_keys_file=str(keys))
    assert _who(_resolver(cfg), OUTSIDER, Authorization="Bearer sk-globex-0123456789abcdef") == ("globex", "batch")
    keys.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="keys.json: expected a JSON object"):
        _resolver(cfg)
    env = config_mod.load(env={"LLMSLA_TENANTS_API_KEYS": json.dumps({KEY: "acme"}),
                               "LLMSLA_TENANTS_DECLARED": json.dumps(DECLARED)})
    assert config_mod.shown(env)["tenants"]["api_keys"] != {KEY: "acme"} and KEY in config_mod.secrets(env)


# -- the real gateway ------------------------------------------------------------------------------
async def _post(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> int:
    async with session.post(url + "/v1/completions", json=BODY, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _raw(url: str, head: bytes) -> bytes:
    """One request with a hand-written head (header bytes no client library would send)."""
    host, port = url.split("//")[1].split(":")
    r, w = await asyncio.open_connection(host, int(port))
    body = json.dumps(BODY).encode()
    w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await w.drain()
    async with asyncio.timeout(30):
        out = await r.read()
    w.close()
    return out


def _series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name.startswith(names.PREFIX + "request")}


def _events(cfg: config_mod.Config) -> list[RequestEvent]:
    out = [x for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
           for x in read_segment(seg, names.SPOOL_REQUESTS)]
    assert all(isinstance(x, RequestEvent) for x in out), out
    return out


def test_hostile_values_never_lose_the_request(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)

    async def main() -> None:
        registry = CollectorRegistry()
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw:
                heads = [b"X-Tenant: " + b"a" * 8000 + b"\r\n", b"X-Tenant: \xc3\x28\xff\r\n",
                         names.CLASS_HEADER.encode() + b": \xff\xfe\r\n",
                         names.CLASS_HEADER.encode() + b": platinum\r\nX-Tenant: acme\r\n",
                         b"Authorization: Bearer " + b"k" * 8000 + b"\r\n"]
                answers = [await _raw(gw.url, h) for h in heads]
                for a in answers:
                    assert a.startswith(b"HTTP/1.1 200"), a[:200]
                # a NUL or control character in a header, and a 10 KB header (past the HTTP parser's
                # 8190-byte line limit), are refused by the parser itself: a clear 400, never a 500
                for head, says in ((b"X-Tenant: ac\x00me\r\n", b"Invalid header value char"),
                                   (b"X-Tenant: ac\x01me\r\n", b"Invalid header value char"),
                                   (b"X-Tenant: " + b"a" * 10_240 + b"\r\n", b"8190 bytes")):
                    refused = await _raw(gw.url, head)
                    assert refused.startswith(b"HTTP/1.") and b" 400 " in refused[:16] and says in refused, refused[:200]
                g = registry.get_sample_value
                assert g(names.LABEL_OVERFLOW + "_total", {"label": names.L_TENANT}) == 2
                assert g(names.LABEL_OVERFLOW + "_total", {"label": names.L_CLASS}) == 2
        await asyncio.sleep(0)

    asyncio.run(main())
    evs = _events(cfg)
    assert len(evs) == 5 and all(e.status == names.STATUS_OK for e in evs)
    assert [e.tenant for e in evs].count(OTHER) == 4 and ("acme", "interactive") in {(e.tenant, e.class_) for e in evs}


@pytest.mark.slow
def test_a_flood_of_made_up_tenants_leaves_the_declared_series_and_metrics_bounded(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    flood = 10_000

    async def main() -> tuple[str, str, float]:
        registry = CollectorRegistry()
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw, \
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as s:
                for h in ({"Authorization": f"Bearer {KEY}"}, {"X-Tenant": "globex"},
                          {"X-Tenant": "globex", names.CLASS_HEADER: "sheddable"}, {"X-Tenant": "made-up-0"}):
                    assert await _post(s, gw.url, h) == 200
                before = await (await s.get(gw.url + "/metrics")).text()
                t0 = time.perf_counter()
                sem = asyncio.Semaphore(32)

                async def one(i: int) -> int:
                    async with sem:
                        return await _post(s, gw.url, {"X-Tenant": f"made-up-{i}"})

                statuses = await asyncio.gather(*(one(i) for i in range(1, flood + 1)))
                took = time.perf_counter() - t0
                assert set(statuses) == {200}
                after = await (await s.get(gw.url + "/metrics")).text()
                return before, after, took

    before, after, took = asyncio.run(main())
    print(f"\n/metrics: {len(before)} bytes before, {len(after)} bytes after {flood} made-up tenants ({took:.1f} s)")
    assert _series(after) == _series(before)  # not one new series: the flood is all `other`
    assert len(after) < 1.1 * len(before)  # only counter digits grew
    ok = {(s.labels[names.L_TENANT], s.labels[names.L_CLASS]): s.value for fam in text_string_to_metric_families(after)
          for s in fam.samples if s.name == names.REQUESTS + "_total" and s.labels.get(names.L_STATUS) == names.STATUS_OK}
    assert ok == {("acme", "interactive"): 1, ("globex", "batch"): 1, ("globex", "sheddable"): 1,
                  (OTHER, "interactive"): flood + 1}
