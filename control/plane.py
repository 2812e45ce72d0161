"""The control plane of one process: the router, the pools' distillation controls, the A/B
rollout, the load shedding, their audit log and the health prober, as one value.

Why one value: the gateway, ``llmsla control serve`` and the control API all need the same four
objects wired to each other (the distillation controls and the rollout ride the router's shared
stream, and both audit to the same log). The composition root (``llmsla.app.wiring``) builds it
once per process; components take it and never build it. See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.membership import Membership
from llmsla.control.probe import HealthProber
from llmsla.control.rollout import Rollout
from llmsla.control.router import Router
from llmsla.control.shed import ShedControls


@dataclass
class ControlPlane:
    """Built by ``llmsla.app.wiring.control_plane``; closed by whoever built it."""

    router: Router
    distill: DistillControls
    rollout: Rollout
    audit: AuditLog
    #: keeps LADR's per-replica stats fresh between requests (an idle replica must not go stale
    #: and drop out; a dead one must); started by the server that owns an HTTP session
    prober: HealthProber
    #: keeps the router's replicas equal to a discovery source's answer (``gateway.discovery``
    #: file, dns or kubernetes); None for a static list. Started by the server that owns an HTTP session
    membership: Membership | None = None
    #: the share of each request class each pool refuses (load shedding), set over the control
    #: API and shared like the distillation controls
    shed: ShedControls = field(default_factory=ShedControls)

    def close(self) -> None:
        """Stop the router's shared-state syncer (Redis), when it has one."""
        if self.router.shared is not None:
            self.router.shared.close()
