"""Where the gateway's replicas come from: a static list, a watched file, DNS, or the Kubernetes
API (``llmsla.discovery_k8s``).

Why: a fleet on Kubernetes scales up and down; the gateway must follow it without a restart.
Each source answers one question, "which replicas are there now?", as a list of
:class:`Found` (pool, base URL, engine type where known); ``llmsla.control.membership`` turns the differences between
two answers into router changes (join after a healthy probe, drain on leave). A source that
cannot answer raises :class:`DiscoveryError`; the caller keeps the last good set. A replica's
id comes from its address (:func:`replica_id`), so it means the same replica on every gateway
and across every answer. See docs/gateway.md#discovery.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llmsla import extras, names
from llmsla.errors import UserError

if TYPE_CHECKING:
    from llmsla.config import Config
    from llmsla.discovery_k8s import KubernetesSource

log = logging.getLogger(__name__)

SOURCES: tuple[str, ...] = ("static", "file", "dns", "kubernetes")


class DiscoveryError(UserError):
    """A source could not answer this round (missing file, unresolvable name): keep the last set.
    ``reason`` is one of ``names.DISCOVERY_FAIL_REASONS`` (the label of the failure counter)."""

    def __init__(self, message: str, reason: str = names.DISCOVERY_FAIL_ERROR) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, order=True)
class Found:
    """One replica a source names: its pool, its base URL (no trailing slash) and, where the
    source knows it (a pod's engine-type label), its engine type ("": its pool's ``engine.types``)."""

    pool: str
    url: str
    engine: str = ""


def replica_id(pool: str, url: str, default_pool: str) -> str:
    """The id of a discovered replica: ``host:port`` of its URL (``[v6]:port``), prefixed with
    ``pool@`` outside the gateway's own pool. Derived, not numbered: every gateway and every
    answer give the same replica the same id, so the router's state, the receiver's per-target
    state and the ``replica`` label survive churn. Never carries a URL's user or password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    rid = f"{host}:{port}{parts.path.rstrip('/')}".replace("/", "_")
    return rid if pool == default_pool else f"{pool}@{rid}"


# -- the file source -------------------------------------------------------------------------------
def parse_lines(text: str, where: str, default_pool: str) -> tuple[list[Found], list[str]]:
    """``[pool=]url`` per line (``#`` comments and blank lines ignored) as (found, problems);
    each problem names ``where:line``. One bad line never drops the others."""
    from llmsla.config import label_problem, url_problem
    from llmsla.redaction import redact

    found: dict[Found, None] = {}
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pool, sep, url = line.partition("=")
        if not sep or "://" in pool:  # no pool given (a URL may itself hold '=' in its query)
            pool, url = default_pool, line
        if (p := label_problem(pool)) is not None:
            problems.append(f"{where}:{n}: pool name {p}")
            continue
        if (p := url_problem(url)) is not None:
            problems.append(f"{where}:{n}: {redact(url)!r}: {p}")
            continue
        found[Found(pool, url.rstrip("/"))] = None
    return list(found), problems


class FileSource:
    """A file of ``[pool=]url`` lines, re-read when its mtime, size or inode changes (polled by
    the caller every ``gateway.discovery_interval_s``). Write it atomically (write a temporary
    file, then rename) so a half-written file is never read; a Kubernetes ConfigMap mount does."""

    def __init__(self, path: str | os.PathLike[str], default_pool: str) -> None:
        self.path = Path(path)
        self.default_pool = default_pool
        self._stamp: tuple[int, int, int] | None = None
        self._last: list[Found] = []
        self.reads = 0

    def describe(self) -> str:
        return f"file {self.path}"

    async def resolve(self) -> list[Found]:
        try:
            st = self.path.stat()
        except OSError as exc:
            self._stamp = None  # read it again whenever it comes back
            raise DiscoveryError(f"{self.path}: {exc.strerror or exc}", names.DISCOVERY_FAIL_MISSING) from None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return self._last
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DiscoveryError(f"{self.path}: cannot read: {exc}", names.DISCOVERY_FAIL_READ) from None
        self.reads += 1
        found, problems = parse_lines(text, str(self.path), self.default_pool)
        for p in problems:  # logged once per change of the file, not every poll
            log.warning("discovery: %s (line skipped)", p)
        self._stamp, self._last = stamp, found
        return found


# -- the DNS source --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DnsTarget:
    """``gateway.discovery_dns`` parsed: scheme, name, port (None: SRV gives it)."""

    scheme: str
    name: str
    port: int | None

    @property
    def srv(self) -> bool:
        return self.port is None


def parse_dns_target(value: str) -> DnsTarget:
    """``[http[s]://]name:port`` (A/AAAA) or ``[http[s]://]_service._proto.name`` (SRV, which
    names the port); ValueError says why not."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "http", value
    if scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, got {scheme!r}")
    if not rest or any(c.isspace() for c in rest) or "/" in rest or "@" in rest:
        raise ValueError("expected name:port (A/AAAA) or _service._proto.name (SRV)")
    if rest.startswith("_"):
        if ":" in rest:
            raise ValueError("an SRV name (_service._proto.name) takes no port: its records give it")
        return DnsTarget(scheme, rest, None)
    name, sep, port_s = rest.rpartition(":")
    if not sep or not name:
        raise ValueError("expected name:port, e.g. workers.llmsla.svc.cluster.local:8000, "
                         "or an SRV name _service._proto.name")
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ValueError(f"port must be 1-65535, got {port_s!r}")
    return DnsTarget(scheme, name.strip("[]"), int(port_s))


def dns_target_problem(value: str) -> str | None:
    """The check of ``gateway.discovery_dns`` ("" = not set)."""
    if value == "":
        return None
    try:
        parse_dns_target(value)
    except ValueError as exc:
        return str(exc)
    return None


def address_url(scheme: str, addr: str, port: int) -> str:
    """``scheme://addr:port`` for an IP address, an IPv6 one in brackets (ValueError: not an IP)."""
    host = f"[{addr}]" if ipaddress.ip_address(addr.split("%", 1)[0]).version == 6 else addr
    return f"{scheme}://{host}:{port}"


async def _addresses(name: str, port: int) -> list[str]:
    """A and AAAA answers of ``name`` through the system resolver (``getaddrinfo``)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise DiscoveryError(f"{name}: {exc.strerror or exc}", names.DISCOVERY_FAIL_RESOLVE) from None
    addrs: dict[str, None] = {}
    for family, _t, _p, _c, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addr = str(sockaddr[0])
            if "%" not in addr:  # a link-local address needs an interface a URL cannot carry
                addrs[addr] = None
    return sorted(addrs)


class DnsSource:
    """The addresses of a name, re-resolved by the caller every interval: A/AAAA through the
    system resolver, SRV (``_service._proto.name``, each target then resolved to its addresses)
    through dnspython (the ``dns`` extra). A Kubernetes headless Service answers with one
    address per ready pod. ``nameservers``: ask these (``host`` or ``host:port``) for SRV
    instead of the system's (tests)."""

    def __init__(self, target: DnsTarget, default_pool: str, *, timeout_s: float = 2.0,
                 nameservers: list[str] | None = None) -> None:
        if target.srv:
            extras.require("dns", f"SRV discovery of {target.name}")
        self.target = target
        self.default_pool = default_pool
        self.timeout_s = timeout_s
        self.nameservers = nameservers

    def describe(self) -> str:
        t = self.target
        return f"dns {t.name}" + ("" if t.port is None else f":{t.port}") + (" (SRV)" if t.srv else " (A/AAAA)")

    async def resolve(self) -> list[Found]:
        t = self.target
        try:
            async with asyncio.timeout(self.timeout_s):
                if t.port is not None:
                    pairs = [(a, t.port) for a in await _addresses(t.name, t.port)]
                else:
                    pairs = []
                    for host, port in await self._srv():
                        pairs += [(a, port) for a in await _addresses(host, port)]
        except TimeoutError:
            raise DiscoveryError(f"{t.name}: no answer within {self.timeout_s:g} s", names.DISCOVERY_FAIL_TIMEOUT) from None
        return sorted({Found(self.default_pool, address_url(t.scheme, a, p)) for a, p in pairs})

    async def _srv(self) -> list[tuple[str, int]]:
        import dns.asyncresolver
        import dns.exception
        import dns.resolver

        res = dns.asyncresolver.Resolver(configure=self.nameservers is None)
        if self.nameservers is not None:
            res.nameservers = [s.rpartition(":")[0] if ":" in s else s for s in self.nameservers]
            ports = {int(s.rpartition(":")[2]) for s in self.nameservers if ":" in s}
            if ports:
                res.port = ports.pop()
        try:
            answer = await res.resolve(self.target.name, "SRV", lifetime=self.timeout_s)
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"{self.target.name} SRV: {exc}", names.DISCOVERY_FAIL_RESOLVE) from None
        return sorted({(str(r.target).rstrip("."), int(r.port)) for r in answer})


# -- the static source -----------------------------------------------------------------------------
class StaticSource:
    """A fixed list (tests, and a fleet that never changes); always the same answer."""

    def __init__(self, found: list[Found]) -> None:
        self.found = list(found)

    def describe(self) -> str:
        return f"static ({len(self.found)} replicas)"

    async def resolve(self) -> list[Found]:
        return list(self.found)


def source_from_config(cfg: Config) -> FileSource | DnsSource | KubernetesSource | None:
    """The source ``gateway.discovery`` names; None for ``static`` (the router's replicas are
    then ``replicas_from_config``'s, fixed, numbered r0, r1, ...). :class:`DiscoveryError` when
    a Kubernetes source cannot find its API server."""
    g = cfg.gateway
    if g.discovery == "file":
        return FileSource(g.discovery_file, g.pool)
    if g.discovery == "dns":
        return DnsSource(parse_dns_target(g.discovery_dns), g.pool)
    if g.discovery == "kubernetes":
        from llmsla.discovery_k8s import KubernetesApi, KubernetesSource

        return KubernetesSource(KubernetesApi(g.discovery_kubernetes_api), g.discovery_kubernetes,
                                namespace=g.discovery_kubernetes_namespace, port=g.discovery_kubernetes_port,
                                default_pool=g.pool, pool_label=g.discovery_kubernetes_pool_label)
    return None
