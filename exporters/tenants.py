"""Who a request is for (its tenant) and how it is served (its class), before its body is read.

The tenant comes from an API key the configuration maps to it (``Authorization: Bearer``), else
from ``tenants.header`` when the peer is a trusted proxy (the user's auth proxy sets it; any other
peer's header is ignored, as for the per-client slots). Cardinality is bounded by the
configuration, never by clients: a declared tenant keeps its name, any other name (made up,
10 KB long, with a NUL or a newline, not UTF-8) is ``other``, so a flood of invented tenants can
never take a declared tenant's series. The class is the tenant's default or a later (less
protected) class the request names in ``tenants.class_header``; anything else leaves the default.
See docs/gateway.md#tenants-and-classes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from llmsla import names
from llmsla.config import Config, check_tenants, read_api_keys_file
from llmsla.exporters.clients import ClientIdentity

#: Longest header value looked at; a longer one names no tenant or class (and is not hashed).
MAX_VALUE_CHARS = 256
_BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Tenancy:
    """A request's tenant and class, as its series and its RequestEvent carry them."""

    tenant: str
    class_: str
    #: the request asked for a tenant or class it does not get (counted, never refused)
    folded_tenant: bool = False
    folded_class: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class TenantResolver:
    """``TenantResolver(cfg, clients).resolve(peer, headers)``: the request's :class:`Tenancy`.

    API keys are kept only as SHA-256 digests, and a presented key is found by its digest: the
    lookup's time depends on the digest, never on how many leading characters of a real key a
    guess got right, which is what a character-by-character comparison would leak."""

    def __init__(self, cfg: Config, clients: ClientIdentity) -> None:
        check_tenants(cfg)
        t = cfg.tenants
        self.clients = clients
        self.enabled = t.enabled()
        self.header = t.header
        self.class_header = t.class_header
        self.classes = tuple(t.classes)
        self._rank = {c: i for i, c in enumerate(self.classes)}
        default_class = t.default_class or self.classes[0]
        #: a request that names no declared tenant: ``other`` while tenants are on, else ``default``
        self.default = Tenancy(names.LABEL_OVERFLOW_VALUE if self.enabled else names.DEFAULT_TENANT, default_class)
        #: tenant -> its default Tenancy (the declared set: the only tenant labels besides other/default)
        self.declared = {tenant: Tenancy(tenant, cls) for tenant, cls in t.declared.items()}
        keys = dict(t.api_keys)
        if t.api_keys_file:
            keys.update(read_api_keys_file(t.api_keys_file))
        self._keys = {_digest(k): tenant for k, tenant in keys.items()}
        #: (tenant, class, folded tenant, folded class) -> Tenancy: the hot path allocates nothing
        self._cache: dict[tuple[str, str, bool, bool], Tenancy] = {}

    def tenants(self) -> frozenset[str]:
        """Every tenant label a request can get: the declared ones, ``other`` and ``default``."""
        return frozenset((*self.declared, names.LABEL_OVERFLOW_VALUE, names.DEFAULT_TENANT))

    def _from_key(self, headers: Mapping[str, str]) -> str | None:
        auth = headers.get("Authorization")
        if not auth or len(auth) > MAX_VALUE_CHARS + len(_BEARER) or auth[:len(_BEARER)].lower() != _BEARER:
            return None
        return self._keys.get(_digest(auth[len(_BEARER):].strip()))

    def _tenant(self, peer: str | None, headers: Mapping[str, str]) -> tuple[Tenancy, bool]:
        """The request's tenant (with its default class), and whether it named another one."""
        if not self.enabled:
            return self.default, False
        tenant = self._from_key(headers) if self._keys else None
        if tenant is not None:
            return self.declared[tenant], False  # check_tenants: every key's tenant is declared
        if not self.header or peer is None or not self.clients.trusted(peer):
            return self.default, False
        value = headers.get(self.header)
        if value is None:
            return self.default, False
        found = self.declared.get(value.strip()) if len(value) <= MAX_VALUE_CHARS else None
        return (found, False) if found is not None else (self.default, True)

    def resolve(self, peer: str | None, headers: Mapping[str, str]) -> Tenancy:
        """The request's tenant and class; never raises for what a client sends."""
        base, folded_tenant = self._tenant(peer, headers)
        cls, folded_class = base.class_, False
        asked = headers.get(self.class_header) if self.class_header else None
        if asked is not None:
            rank = self._rank.get(asked.strip()) if len(asked) <= MAX_VALUE_CHARS else None
            if rank is None or rank < self._rank[cls]:  # unknown, or more protected than its tenant's
                folded_class = True
            else:
                cls = self.classes[rank]
        if not (folded_tenant or folded_class) and cls == base.class_:
            return base
        key = (base.tenant, cls, folded_tenant, folded_class)
        found = self._cache.get(key)
        if found is None:  # bounded: declared tenants x classes x 4
            found = self._cache[key] = Tenancy(*key)
        return found
