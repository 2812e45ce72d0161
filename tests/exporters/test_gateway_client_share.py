"""The per-client bound on in-flight slots (``gateway.client_share``), against the real gateway
and reference worker over loopback HTTP: one client trickling bodies holds at most its share and
the others are still served; behind a trusted proxy clients are told apart by their
``X-Forwarded-For``, and a spoofed one from an untrusted peer buys nothing; every path gives the
slot back. 127.0.0.2 is a second client: Linux routes all of 127/8 to loopback, so a socket bound
to it is another peer address.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import httpkit, names
from llmsla.app import wiring
from llmsla.config import ConfigError
from llmsla.exporters import gateway as gw_mod
from llmsla.exporters.clients import ClientIdentity
from llmsla.worker import server as worker_mod
from tests.worker._worker_util import MODEL, worker_cfg

A, B = "127.0.0.1", "127.0.0.2"
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


def _cfg(tmp_path: Path, **gateway: Any) -> config_mod.Config:
    c = worker_cfg(tmp_path)
    c.control.route_policy = "round_robin"
    c.gateway.max_in_flight = 8
    for k, v in gateway.items():
        setattr(c.gateway, k, v)
    return c


async def _slow(url: str, source: str, headers: str = "") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A complete head, then a body that never ends, from ``source``."""
    host, port = url.split("//")[1].split(":")
    r, w = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    w.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
            "Content-Length: 1000\r\n\r\n{\"model\": ".encode())
    await w.drain()
    return r, w


async def _answer(r: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    """What the server sent until it closed the connection."""
    out = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await r.read(65536):
            out += chunk
    return out


async def _response(r: asyncio.StreamReader, timeout_s: float = 1.0) -> bytes:
    """The head and body of the response, which must come within ``timeout_s`` (the server may
    keep reading the unfinished request body for a while before it closes the connection)."""
    async with asyncio.timeout(timeout_s):
        head = await r.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        return head + await r.readexactly(length)


async def _post(url: str, source: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    async with aiohttp.ClientSession(connector=conn) as s, \
            s.post(url + "/v1/completions", json=BODY, headers=headers or {}) as resp:
        return resp.status, json.loads(await resp.read())


async def _settle(gw: gw_mod.RunningGateway, want: dict[str, int], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while gw.gateway.client_slots != want:
            await asyncio.sleep(0.02)


def _refused(registry: CollectorRegistry) -> float:
    return registry.get_sample_value(names.GATEWAY_BAD_REQUESTS + "_total",
                                     {"reason": names.REASON_CLIENT_OVER_SHARE}) or 0.0


def _is_over_share(raw: bytes) -> bool:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head.lower() \
        and json.loads(body)["error"]["code"] == names.REASON_CLIENT_OVER_SHARE


def test_one_client_cannot_lock_out_the_rest(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)  # cap = floor(0.5 x 8) = 4

    async def main() -> None:
        registry = CollectorRegistry()
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw:
                assert gw.gateway.client_cap == 4
                held = [await _slow(gw.url, A) for _ in range(4)]
                await _settle(gw, {A: 4})
                r5, w5 = await _slow(gw.url, A)  # over the cap: refused before its body is read
                assert _is_over_share(await _response(r5))
                await _answer(r5, httpkit.LINGER_S + 3.0)  # then closed (its body is never read)
                status, payload = await _post(gw.url, A)
                assert status == 429 and payload["error"]["code"] == names.REASON_CLIENT_OVER_SHARE
                message = payload["error"]["message"]
                for words in ("gateway.client_share", "gateway.max_in_flight", "gateway.trusted_proxies", "4"):
                    assert words in message, message
                assert (await _post(gw.url, B))[0] == 200  # another client is served
                assert gw.gateway.client_slots == {A: 4} and _refused(registry) == 2
                # the client hangs up mid-body: its slots come back and it is served again
                for _, w in [*held, (r5, w5)]:
                    w.close()
                await _settle(gw, {})
                assert gw.gateway.in_flight == 0
                assert (await _post(gw.url, A))[0] == 200

    asyncio.run(main())


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_cap(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    # cap = floor(0.25 x 8) = 2; 127.0.0.1 is the proxy, 127.0.0.2 an untrusted peer
    cfg = _cfg(tmp_path, client_share=0.25, trusted_proxies=["127.0.0.1/32"])

    async def main() -> None:
        registry = CollectorRegistry()
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw:
                xff = "X-Forwarded-For: {}\r\n"
                held = [await _slow(gw.url, A, xff.format("10.0.0.1")) for _ in range(2)]
                # an untrusted peer's X-Forwarded-For is ignored: it is one client, whatever it says
                held += [await _slow(gw.url, B, xff.format(f"10.0.0.{i}")) for i in (3, 4)]
                await _settle(gw, {"10.0.0.1": 2, B: 2})
                # 10.0.0.1 is at its cap, also when it prepends an address of its choosing
                for spoof in ("10.0.0.1", "6.6.6.6, 10.0.0.1"):
                    status, payload = await _post(gw.url, A, {"X-Forwarded-For": spoof})
                    assert status == 429 and payload["error"]["code"] == names.REASON_CLIENT_OVER_SHARE, spoof
                status, _ = await _post(gw.url, B, {"X-Forwarded-For": "10.0.0.9"})
                assert status == 429  # keyed by its peer, 127.0.0.2, which is at its cap
                # a peer that forwards for others but is not trusted: the operator is told once
                assert (await _post(gw.url, B, {"X-Forwarded-For": "10.0.0.8"}))[0] == 429
                said = [r.getMessage() for r in caplog.records if "gateway.trusted_proxies" in r.getMessage()]
                assert len(said) == 1 and said[0].startswith(f"{B} forwards requests for other clients"), said
                # another client behind the proxy, and the proxy itself, are served
                assert (await _post(gw.url, A, {"X-Forwarded-For": "10.0.0.2"}))[0] == 200
                assert (await _post(gw.url, A))[0] == 200
                assert _refused(registry) == 4
                for _, w in held:
                    w.close()
                await _settle(gw, {})

    asyncio.run(main())


def test_the_slot_is_given_back_on_408_and_on_upstream_errors(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg.http.body_timeout_s = 0.5

    async def main() -> None:
        registry = CollectorRegistry()
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=registry) as gw:
                held = [await _slow(gw.url, A) for _ in range(4)]
                answers = await asyncio.gather(*(_answer(r) for r, _ in held))  # 408 after 0.5 s
                assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
                await _settle(gw, {})
                assert (await _post(gw.url, A))[0] == 200
                for _, w in held:
                    w.close()
        # a replica that is not there: 502 each time, never 429 (no slot leaks)
        cfg.gateway.upstreams = ["http://127.0.0.1:9"]
        async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw:
            for _ in range(2 * gw.gateway.client_cap + 1):
                status, payload = await _post(gw.url, A)
                assert status == 502, payload
            assert gw.gateway.client_slots == {}
            statuses = await asyncio.gather(*(_post(gw.url, A) for _ in range(4)))
            assert [s for s, _ in statuses] == [502] * 4
            assert gw.gateway.client_slots == {}

    asyncio.run(main())


def test_share_one_turns_the_bound_off(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, client_share=1.0)
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    gw = wiring.gateway(cfg, registry=CollectorRegistry(), spool=None)
    gw.telemetry.shutdown()
    assert gw.client_cap == 0
    cfg.gateway.client_share, cfg.gateway.max_in_flight = 0.01, 8
    gw = wiring.gateway(cfg, registry=CollectorRegistry(), spool=None)
    gw.telemetry.shutdown()
    assert gw.client_cap == 1  # never below one request


@pytest.mark.parametrize(("key", "value", "message"), [
    ("client_share", 0.0, "gateway.client_share: must be > 0"),
    ("client_share", 1.5, "gateway.client_share: must be <= 1"),
    ("client_share", math.nan, "gateway.client_share: expected a finite number"),
    ("trusted_proxies", ["10.0.0.0/33"], r"gateway.trusted_proxies: \[0\] '10.0.0.0/33'"),
    ("trusted_proxies", ["10.0.0.1/8"], "has host bits set"),
    ("client_header", "X Client", "not an HTTP header name"),
])
def test_a_config_built_in_code_is_refused_at_start_up(tmp_path: Path, key: str, value: Any, message: str) -> None:
    cfg = _cfg(tmp_path, **{key: value})
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    with pytest.raises(ConfigError, match=message):
        wiring.gateway(cfg, registry=CollectorRegistry(), spool=None)


# -- the client key, without a server --------------------------------------------------------------
def _h(*pairs: tuple[str, str]) -> CIMultiDict[str]:
    return CIMultiDict(pairs)


def test_forwarded_for_is_read_from_the_right() -> None:
    ids = ClientIdentity(["10.0.0.0/8", "fd00::/8"])
    xff = "X-Forwarded-For"
    assert ids.key("192.0.2.1", _h((xff, "1.1.1.1"))) == "192.0.2.1"  # untrusted peer: header ignored
    assert ids.key("10.0.0.5", _h()) == "10.0.0.5"  # trusted, no header: the proxy itself
    assert ids.key("10.0.0.5", _h((xff, "1.1.1.1"))) == "1.1.1.1"
    # the client prepends what it likes; the rightmost untrusted entry is the one a proxy wrote
    assert ids.key("10.0.0.5", _h((xff, "9.9.9.9, 1.1.1.1, 10.1.1.1"))) == "1.1.1.1"
    assert ids.key("10.0.0.5", _h((xff, "9.9.9.9"), (xff, "1.1.1.1:5555, 10.1.1.1"))) == "1.1.1.1"
    assert ids.key("10.0.0.5", _h((xff, "[2001:db8::1]:443"))) == "2001:db8::1"
    assert ids.key("::ffff:10.0.0.5", _h((xff, "2001:DB8:0::1"))) == "2001:db8::1"  # canonical
    # not an address where a proxy would have put one: counted against the nearest trusted hop
    assert ids.key("10.0.0.5", _h((xff, "1.1.1.1, garbage"))) == "10.0.0.5"
    assert ids.key("10.0.0.5", _h((xff, "unknown, 10.2.2.2"))) == "10.2.2.2"
    assert ids.key("10.0.0.5", _h((xff, "10.3.3.3, 10.2.2.2"))) == "10.3.3.3"  # all trusted: leftmost
    assert ids.key(None, _h()) == ""
    assert ClientIdentity().key("10.0.0.5", _h((xff, "1.1.1.1"))) == "10.0.0.5"  # nothing trusted


def test_another_header_is_an_opaque_bounded_client_id() -> None:
    ids = ClientIdentity(["10.0.0.1"], "X-Client-Id")
    assert ids.key("10.0.0.1", _h(("x-client-id", " team-a "))) == "X-Client-Id=team-a"
    assert ids.key("10.0.0.2", _h(("X-Client-Id", "team-a"))) == "10.0.0.2"  # untrusted peer
    for bad in ("", "   ", "x" * 257, "tab\there", "bad\udcffbyte"):
        assert ids.key("10.0.0.1", _h(("X-Client-Id", bad))) == "10.0.0.1", bad
    assert ids.key("10.0.0.1", _h(("X-Forwarded-For", "1.1.1.1"))) == "10.0.0.1"


def test_the_address_cache_is_bounded() -> None:
    ids = ClientIdentity(["10.0.0.0/8"])
    for i in range(10_000):
        ids.key("10.0.0.5", _h(("X-Forwarded-For", f"junk-{i}, 1.2.{i % 256}.{i // 256}")))
    assert len(ids._seen) <= 4096
