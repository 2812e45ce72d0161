"""The committed Alertmanager config (deploy/alertmanager/alertmanager.yml) pointed at a running
receiver: one source of routing for production, the demo and the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import yaml


def pointed_at(base_yaml: str, receiver_url: str, token_file: Path, *, group_wait_s: float | None = None) -> str:
    """``base_yaml`` with the llmsla-receiver webhook sent to ``receiver_url`` (its base URL) and
    its bearer token read from ``token_file``; ``group_wait_s`` shortens every route's batching
    (group_wait, and group_interval at 2.5x) for runs whose windows are scaled down."""
    cfg = yaml.safe_load(base_yaml)
    (hook,) = next(r for r in cfg["receivers"] if r["name"] == "llmsla-receiver")["webhook_configs"]
    hook["url"] = receiver_url.rstrip("/") + "/v1/alerts"
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    if group_wait_s is not None:
        for route in (cfg["route"], *cfg["route"]["routes"]):
            route.update(group_wait=_ms(group_wait_s), group_interval=_ms(2.5 * group_wait_s))
    return yaml.safe_dump(cfg, sort_keys=False)


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"
