"""Who a request comes from, for the gateway's per-client bound on in-flight slots.

The peer address, or, when the peer is a trusted proxy, the client its header names. Only hops
the operator runs are believed: in ``X-Forwarded-For`` everything left of the first untrusted
address is whatever the client chose to send, and an untrusted peer's header is ignored, so
spoofing buys nothing. Parsed answers are cached (bounded) so the hot path pays a dict lookup.
See docs/gateway.md#one-client-cannot-lock-out-the-rest.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

#: The standard proxy header; any other name is read as an opaque client id.
XFF = "x-forwarded-for"
#: Longest client id taken from a non-XFF header; a longer one is not believed.
MAX_CLIENT_ID_CHARS = 256
#: At most this many X-Forwarded-For entries are examined, from the right.
MAX_XFF_HOPS = 32
_CACHE_MAX = 4096

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(specs: Iterable[str]) -> list[IPNetwork]:
    """``gateway.trusted_proxies`` as networks (a bare address is a /32 or /128); ValueError for
    an entry that is neither (the key's declared check refuses it at load)."""
    return [ipaddress.ip_network(s.strip(), strict=True) for s in specs]


def _bare(entry: str) -> str:
    """An X-Forwarded-For entry without a port or brackets (``1.2.3.4:80``, ``[::1]:80``)."""
    s = entry.strip()
    if s.startswith("["):
        end = s.find("]")
        return s[1:end] if end > 0 else s
    if s.count(":") == 1:  # IPv4 with a port; an IPv6 address has at least two colons
        return s.partition(":")[0]
    return s


class ClientIdentity:
    """``ClientIdentity(cfg.gateway.trusted_proxies, cfg.gateway.client_header).key(peer, headers)``."""

    def __init__(self, trusted_proxies: Iterable[str] = (), header: str = "X-Forwarded-For") -> None:
        self.networks = parse_networks(trusted_proxies)
        self.header = header
        self.xff = header.lower() == XFF
        #: address text -> (canonical address, trusted?), or None when it is not an address
        self._seen: dict[str, tuple[str, bool] | None] = {}

    def _lookup(self, text: str) -> tuple[str, bool] | None:
        try:
            return self._seen[text]
        except KeyError:
            pass
        try:
            ip = ipaddress.ip_address(_bare(text))
        except ValueError:
            found = None
        else:
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped  # a dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d
            found = (str(ip), any(ip in net for net in self.networks))
        if len(self._seen) >= _CACHE_MAX:
            self._seen.clear()
        self._seen[text] = found
        return found

    def trusted(self, peer: str) -> bool:
        found = self._lookup(peer)
        return found is not None and found[1]

    def key(self, peer: str | None, headers: Mapping[str, str]) -> str:
        """The client a request counts against. ``peer`` is the transport's address (None on a
        transport without one, e.g. a Unix socket: every such request is one client)."""
        if peer is None:
            return ""
        if not self.networks:
            return peer
        found = self._lookup(peer)
        if found is None or not found[1]:
            return peer
        if self.xff:
            getall = getattr(headers, "getall", None)
            values = getall(self.header, ()) if getall is not None else [v for v in [headers.get(self.header)] if v]
            if not values:
                return peer
            nearest = found[0]  # the nearest trusted hop so far
            entries = (values[0] if len(values) == 1 else ",".join(values)).split(",")
            for entry in reversed(entries[-MAX_XFF_HOPS:]):
                hop = self._lookup(entry.strip())
                if hop is None:  # not an address where a proxy would have put one: not believed
                    return nearest
                if not hop[1]:
                    return hop[0]
                nearest = hop[0]
            return nearest
        value = headers.get(self.header)
        if value is None:
            return peer
        value = value.strip()
        if not value or len(value) > MAX_CLIENT_ID_CHARS or not value.isprintable():
            return peer
        return f"{self.header}={value}"
