"""Discovery sources and membership: replicas join after a healthy probe, leave after draining,
and a source that cannot answer keeps the last set. Real files, the system resolver, a real DNS
server for SRV (dnspython on a loopback UDP socket) and real HTTP health endpoints."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from llmsla import config as config_mod
from llmsla import discovery, names
from llmsla.control.membership import Membership
from llmsla.control.probe import HealthProber
from llmsla.control.router import NoReplicaAvailable, Replica, Router
from llmsla.discovery import (
    DiscoveryError,
    DnsSource,
    FileSource,
    Found,
    parse_dns_target,
    replica_id,
)
from llmsla.discovery_metrics import DiscoveryMetrics

from .test_probe import _replica_server


def write(path: Path, text: str) -> None:
    """Atomically, as the docs ask (a temporary file renamed over the old one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- ids -------------------------------------------------------------------------------------------
def test_ids_come_from_the_address_and_never_carry_a_password():
    assert replica_id("default", "http://10.0.0.7:8000", "default") == "10.0.0.7:8000"
    assert replica_id("canary", "http://10.0.0.7:8000", "default") == "canary@10.0.0.7:8000"
    assert replica_id("default", "http://[fd00::7]:8000", "default") == "[fd00::7]:8000"
    assert replica_id("default", "https://u:secret@w.example/v1/", "default") == "w.example:443_v1"


# -- the file source -------------------------------------------------------------------------------
def test_file_source_skips_a_bad_line_with_file_and_line(tmp_path, caplog):
    f = tmp_path / "replicas"
    write(f, "# the fleet\nhttp://127.0.0.1:9001\n\ncanary=http://127.0.0.1:9002  # new build\n"
             "ftp://127.0.0.1:9003\n=http://127.0.0.1:9004\nhttp://127.0.0.1:9001\n")
    src = FileSource(f, "default")
    with caplog.at_level(logging.WARNING, logger="llmsla.discovery"):
        found = asyncio.run(src.resolve())
    assert found == [Found("default", "http://127.0.0.1:9001"), Found("canary", "http://127.0.0.1:9002")]
    msgs = [r.getMessage() for r in caplog.records]
    assert any(f"{f}:5: 'ftp://127.0.0.1:9003': must start with" in m for m in msgs), msgs
    assert any(f"{f}:6: pool name" in m for m in msgs), msgs
    # unchanged file: not read again (polled by mtime/size/inode)
    assert asyncio.run(src.resolve()) == found and src.reads == 1


def test_file_source_missing_file_is_a_discovery_error(tmp_path):
    src = FileSource(tmp_path / "nope", "default")
    with pytest.raises(DiscoveryError, match="No such file"):
        asyncio.run(src.resolve())


# -- the DNS source --------------------------------------------------------------------------------
def test_dns_target_forms():
    assert parse_dns_target("workers.ns.svc.cluster.local:8000") == discovery.DnsTarget(
        "http", "workers.ns.svc.cluster.local", 8000)
    assert parse_dns_target("https://_http._tcp.workers.ns").srv
    for bad, why in [("workers", "expected name:port"), ("workers:0", "port must be"),
                     ("_http._tcp.w:80", "takes no port"), ("ftp://w:1", "scheme"), ("w/x:1", "expected")]:
        assert why in (discovery.dns_target_problem(bad) or ""), bad
    with pytest.raises(config_mod.ConfigError, match="gateway.discovery_dns"):
        config_mod.load(env={"LLMSLA_GATEWAY_DISCOVERY_DNS": "workers"})


def test_dns_source_resolves_a_and_aaaa_of_localhost():
    found = asyncio.run(DnsSource(parse_dns_target("localhost:9009"), "default").resolve())
    urls = {f.url for f in found}
    assert "http://127.0.0.1:9009" in urls, urls
    assert urls <= {"http://127.0.0.1:9009", "http://[::1]:9009"}


def test_dns_source_unresolvable_name_is_a_discovery_error():
    with pytest.raises(DiscoveryError, match="no-such-host.invalid"):
        asyncio.run(DnsSource(parse_dns_target("no-such-host.invalid:80"), "default").resolve())


class SrvServer:
    """A real DNS server on loopback UDP answering SRV for one name (dnspython's wire format)."""

    def __init__(self, name: str, records: list[tuple[str, int]]) -> None:
        self.name, self.records = name, records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import dns.message
        import dns.rcode
        import dns.rrset

        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            q = dns.message.from_wire(data)
            r = dns.message.make_response(q)
            qname = q.question[0].name.to_text().rstrip(".")
            if qname == self.name and self.records:
                rrs = [f"0 10 {port} {target}." for target, port in self.records]
                r.answer.append(dns.rrset.from_text(q.question[0].name, 5, "IN", "SRV", *rrs))
            else:
                r.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(r.to_wire(), peer)

    def close(self) -> None:
        self.sock.close()


def test_dns_source_srv_gives_targets_and_ports():
    srv = SrvServer("_http._tcp.workers.test", [("localhost", 9011), ("127.0.0.1", 9012)])
    try:
        src = DnsSource(parse_dns_target("_http._tcp.workers.test"), "default",
                        nameservers=[f"127.0.0.1:{srv.port}"])
        urls = {f.url for f in asyncio.run(src.resolve())}
        assert {"http://127.0.0.1:9011", "http://127.0.0.1:9012"} <= urls, urls
        gone = DnsSource(parse_dns_target("_http._tcp.other.test"), "default", nameservers=[f"127.0.0.1:{srv.port}"])
        with pytest.raises(DiscoveryError, match="_http._tcp.other.test SRV"):
            asyncio.run(gone.resolve())
    finally:
        srv.close()


# -- the router: join, leave, drain ----------------------------------------------------------------
def test_pending_replica_gets_no_traffic_until_healthy_and_leaving_one_drains():
    reg = CollectorRegistry()
    r = Router([Replica("a", "default", url="http://a")], "round_robin", registry=reg)
    r.add_replica(Replica("b", "default", url="http://b"), pending=True)
    assert {r.pick("default").id for _ in range(10)} == {"a"}
    assert r.mark_healthy("b") and not r.mark_healthy("b")
    assert {r.pick("default").id for _ in range(10)} == {"a", "b"}
    r.begin("b")  # one request in flight on b when it leaves
    assert r.retire("b") is False and r.is_leaving("b")
    assert {r.pick("default").id for _ in range(10)} == {"a"}
    assert 'replica="b"' in generate_latest(reg).decode()  # still there while draining
    r.end("b", 12.0)  # its last request finishes: forgotten, gauges gone (stale, not 0)
    assert [x.id for x in r.replicas()] == ["a"]
    assert 'replica="b"' not in generate_latest(reg).decode()
    assert r.retire("a") is True  # the fleet may take the last one: the pool answers 503
    with pytest.raises(NoReplicaAvailable):
        r.pick("default")


def test_rejoin_keeps_state_and_drain_refusal_counts_only_serving_replicas():
    r = Router([Replica("a", "default"), Replica("b", "default")], "round_robin")
    r.set_weight("b", 3.0)
    r.begin("b")
    r.retire("b")
    r.rejoin("b")
    assert r.replica("b").weight == 3.0 and not r.is_leaving("b") and r.outstanding("b") == 1
    r.add_replica(Replica("c", "default"), pending=True)
    r.drain("a")
    with pytest.raises(Exception, match="last healthy"):  # c is not serving yet
        r.drain("b")


# -- membership over real HTTP ---------------------------------------------------------------------
async def _health_server(status: int) -> tuple[web.AppRunner, str]:
    return await _replica_server(status, {"status": "ok"})


def test_membership_follows_the_file_and_keeps_the_last_set_on_trouble(tmp_path, caplog):
    f = tmp_path / "replicas"

    async def main() -> None:
        ok1, u1 = await _health_server(200)
        ok2, u2 = await _health_server(200)
        sick, u3 = await _health_server(503)
        reg = CollectorRegistry()
        router = Router([Replica("r0", "canary", url=u2)], "round_robin", registry=reg)  # a static one
        m = Membership(router, FileSource(f, "default"), default_pool="default", interval_s=0.05,
                       prober=HealthProber(router), metrics=DiscoveryMetrics("file", registry=reg))
        i1, i2, i3 = (replica_id("default", u, "default") for u in (u1, u2, u3))

        def known(pool: str, state: str) -> float | None:
            return reg.get_sample_value(names.DISCOVERY_REPLICAS, {"pool": pool, "state": state})

        def failures(reason: str) -> float | None:
            return reg.get_sample_value(names.DISCOVERY_FAILURES + "_total", {"source": "file", "reason": reason})
        try:
            async with aiohttp.ClientSession() as s:
                write(f, f"{u1}\n{u2}\n{u3}\n")
                ch = await m.sync_once(s)
                assert sorted(ch.joined) == sorted([i1, i2, i3])
                # probed at once: the healthy two serve, the sick one waits
                assert {router.pick("default").id for _ in range(20)} == {i1, i2}
                snap = {x["id"]: x for x in router.snapshot()["pools"]["default"]}
                assert snap[i3]["pending"] and not snap[i1]["pending"]
                assert (known("default", "serving"), known("default", "probing"), known("default", "draining"),
                        known("canary", "serving")) == (2, 1, 0, 1)
                assert reg.get_sample_value(names.DISCOVERY_REFRESHES + "_total", {"source": "file"}) == 1
                assert reg.get_sample_value(names.DISCOVERY_LAST_SUCCESS, {"source": "file"}) > 0
                router.set_weight(i1, 2.0)  # operator state on a discovered replica
                f.unlink()  # missing file: keep the set, warn once
                with caplog.at_level(logging.WARNING, logger="llmsla.control.membership"):
                    assert (await m.sync_once(s)).kept and (await m.sync_once(s)).kept
                assert sum("keeping the last 3" in r.getMessage() for r in caplog.records) == 1
                assert failures(names.DISCOVERY_FAIL_MISSING) == 2
                write(f, "# emptied by mistake\n")  # no replica at all: keep the set too
                assert (await m.sync_once(s)).kept
                assert failures(names.DISCOVERY_FAIL_EMPTY) == 1 and failures(names.DISCOVERY_FAIL_READ) == 0
                assert known("default", "serving") == 2  # the set kept, and so the count
                write(f, f"{u1}\ncanary={u1}\n")  # i2, i3 leave; i1 stays with its weight
                ch = await m.sync_once(s)
                assert sorted(ch.left) == sorted([i2, i3]) and ch.joined == [f"canary@{i1}"]
                assert router.replica(i1).weight == 2.0
                assert {x.id for x in router.replicas()} == {"r0", i1, f"canary@{i1}"}
                assert (known("default", "serving"), known("default", "probing"), known("canary", "serving")) == (1, 0, 2)
                text = generate_latest(reg).decode()
                assert f'replica="{i2}"' not in text and f'replica="{i1}"' in text
                assert f'{names.ROUTER_WEIGHT}{{pool="canary",replica="r0"}}' in text  # static: untouched
        finally:
            for run in (ok1, ok2, sick):
                await run.cleanup()

    asyncio.run(main())


def test_a_replica_in_a_pool_no_request_reaches_is_said_once_per_pool(tmp_path, caplog):
    """A pod labelled into a pool the configuration does not name gets no request: the operator
    is told once per such pool, naming the key that fixes it; a declared pool is not reported."""
    f = tmp_path / "replicas"
    write(f, "http://127.0.0.1:9001\nshadow=http://127.0.0.1:9002\nshadow=http://127.0.0.1:9003\n")

    def warnings(pools: list[str]) -> list[str]:
        router = Router([], "round_robin", registry=CollectorRegistry())
        m = Membership(router, FileSource(f, "default"), default_pool="default", interval_s=1, pools=pools)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="llmsla.control.membership"):
            asyncio.run(m.sync_once())
            write(f, f.read_text() + "shadow=http://127.0.0.1:9004\n")  # one more joins later
            asyncio.run(m.sync_once())
        assert {r.pool for r in router.replicas()} == {"default", "shadow"}  # routed all the same
        return [r.getMessage() for r in caplog.records]

    said = warnings(["default"])
    assert len(said) == 1 and "pool 'shadow', which the configuration does not name" in said[0]
    assert "gateway.pools" in said[0]
    write(f, "http://127.0.0.1:9001\nshadow=http://127.0.0.1:9002\n")
    assert warnings(["default", "shadow"]) == []
    # a declared pool without a replica reads 0, not no series: an arm's empty pool shows on a panel
    reg = CollectorRegistry()
    write(f, "http://127.0.0.1:9001\nshadow=http://127.0.0.1:9002\n")
    m = Membership(Router([], "round_robin", registry=reg), FileSource(f, "default"), default_pool="default",
                   interval_s=1, pools=["default", "shadow", "blue"], metrics=DiscoveryMetrics("file", registry=reg))
    asyncio.run(m.sync_once())
    probing = {p: reg.get_sample_value(names.DISCOVERY_REPLICAS, {"pool": p, "state": "probing"})
               for p in ("default", "shadow", "blue")}
    assert probing == {"default": 1, "shadow": 1, "blue": 0}
    assert reg.get_sample_value(names.DISCOVERY_REPLICAS, {"pool": "blue", "state": "serving"}) == 0


def test_membership_over_dns_serves_only_the_address_that_answers_its_probe():
    """localhost:PORT resolves to 127.0.0.1 (a health server listens) and often ::1 (nothing
    listens there): the first serves, the second stays pending without ever taking a request."""

    async def main() -> None:
        runner, url = await _health_server(200)
        port = int(url.rsplit(":", 1)[1])
        router = Router([], "round_robin")
        m = Membership(router, DnsSource(parse_dns_target(f"localhost:{port}"), "default"), default_pool="default",
                       interval_s=0.05, prober=HealthProber(router, timeout_s=1.0))
        try:
            async with aiohttp.ClientSession() as s:
                ch = await m.sync_once(s)
                assert f"127.0.0.1:{port}" in ch.joined
                assert {router.pick("default").id for _ in range(10)} == {f"127.0.0.1:{port}"}
                pending = {x["id"] for x in router.snapshot()["pools"]["default"] if x["pending"]}
                assert pending == ({f"[::1]:{port}"} if f"[::1]:{port}" in ch.joined else set())
                m.source = DnsSource(parse_dns_target(f"no-such-host.invalid:{port}"), "default")
                assert (await m.sync_once(s)).kept  # unresolvable: the last set stays
                assert f"127.0.0.1:{port}" in {x.id for x in router.replicas()}
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_discovery_keys_are_checked_together():
    def cfg_of(**env: str) -> config_mod.Config:
        return config_mod.load(env={f"LLMSLA_GATEWAY_{k.upper()}": v for k, v in env.items()})

    with pytest.raises(config_mod.ConfigError, match="needs gateway.discovery_file"):
        config_mod.check_startup(cfg_of(discovery="file"))
    with pytest.raises(config_mod.ConfigError, match="needs gateway.discovery_dns"):
        config_mod.check_startup(cfg_of(discovery="dns"))
    with pytest.raises(config_mod.ConfigError, match="leave gateway.upstreams"):
        config_mod.check_startup(cfg_of(discovery="dns", discovery_dns="w:80", upstreams="http://127.0.0.1:9"))
    with pytest.raises(config_mod.ConfigError, match="gateway.discovery"):
        cfg_of(discovery="consul")
    config_mod.check_startup(cfg_of(discovery="dns", discovery_dns="w:80", pools="canary=http://127.0.0.1:9"))
