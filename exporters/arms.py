"""The A/B arm label of a request, for instrumentation that labels but does not route.

Why apart from the gateway: the ASGI middleware labels its requests with the rollout's arm
without importing the proxy or the rest of the control plane; the gateway asks its
:class:`~llmsla.control.rollout.Rollout` directly, since it also applies the arm's strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmsla import names
from llmsla.exporters.openai import unit_key

if TYPE_CHECKING:
    from llmsla.control.rollout import Rollout


class ArmAssigner:
    """The rollout's assignment of the request's unit; without a rollout, ``default``."""

    def __init__(self, rollout: Rollout | None = None, pool: str = names.DEFAULT_POOL) -> None:
        self.rollout = rollout
        self.pool = pool

    def assign(self, *, trace_id: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
        if self.rollout is None:
            return names.DEFAULT_ARM
        return self.rollout.assign(self.pool, unit_key(dict(body), headers, trace_id)).label
