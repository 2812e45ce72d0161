"""A replica's identity, and the one list of replicas a configuration names.

Core, because three commands must agree on it: the gateway routes to these replicas, ``llmsla
control serve`` operates a router of them and ``llmsla engines`` scrapes them, and the control
API's replica ids (r0, r1, ...) mean the same replica in all three only if one function numbers
them. Replicas found at run time (``gateway.discovery`` file, dns or kubernetes) are named by their address
instead (``llmsla.discovery.replica_id``), so they too mean the same replica everywhere. See
docs/architecture.md (contracts shared by components).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsla.config import Config


@dataclass
class Replica:
    """One upstream as the router sees it (its live state is the router's ``ReplicaState``)."""

    id: str  # unique within the router, e.g. "r0"
    pool: str  # pool name (names.DEFAULT_POOL if single pool)
    url: str = ""  # base URL for the real gateway; "" in simulation
    role: str = ""  # "teacher" | "student" | ""
    weight: float = 1.0
    engine: str = ""  # engine type its discovery source named (a pod's label); "": its pool's engine.types


def replicas_from_config(cfg: Config) -> list[Replica]:
    """``gateway.upstreams`` (teachers when students are configured) then
    ``gateway.student_upstreams``, then ``gateway.pools`` (other pools' replicas, for A/B arms),
    named r0, r1, ... in that order."""
    from llmsla.config import ConfigError, split_pool_spec
    from llmsla.redaction import redact

    g = cfg.gateway
    teacher = "teacher" if g.student_upstreams else ""
    urls = [(g.pool, u, teacher) for u in g.upstreams] + [(g.pool, u, "student") for u in g.student_upstreams]
    for i, spec in enumerate(g.pools):
        try:  # the check gateway.pools declares (config check runs it); here for a Config built in code
            pool, url = split_pool_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"{cfg.origin('gateway.pools')}: [{i}] {redact(spec)!r}: {exc}") from None
        if url:  # a pool name alone: its replicas come from discovery
            urls.append((pool, url, ""))
    return [Replica(id=f"r{i}", pool=pool, url=u.rstrip("/"), role=role) for i, (pool, u, role) in enumerate(urls)]
