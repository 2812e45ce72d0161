"""The dashboards, in the order the provisioning folder lists them."""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla.config import Config
from llmsla.dashboards import ab, fleet, forecast, instances, policy, slo

#: file stem -> builder
DASHBOARDS: dict[str, Callable[[Config], dash_m.Dashboard]] = {
    "fleet": fleet.build,
    "instances": instances.build,
    "slo": slo.build,
    "policy": policy.build,
    "ab": ab.build,
    "forecast": forecast.build,
}


def build_all(cfg: Config) -> dict[str, dash_m.Dashboard]:
    return {stem: build(cfg) for stem, build in DASHBOARDS.items()}
