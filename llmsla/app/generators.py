"""Every generator of committed files, in one list (the composition root may import them all).

``tests/test_generated.py`` checks each one's committed files against its render and runs its
``--check`` on a tampered copy; a new generated artefact is registered here (docs/architecture.md,
"Generated files").
"""

from __future__ import annotations

from llmsla import admin
from llmsla.alerting import generate as slo_generate
from llmsla.alerting import openapi as receiver_openapi
from llmsla.app.k8s import render as k8s_render
from llmsla.control import openapi as control_openapi
from llmsla.generated import Generator
from llmsla.store import migrate


def all_generators() -> tuple[Generator, ...]:
    """The registered generators; the dashboards' one only when the ``dashboards`` extra is
    installed (the Grafana SDK renders them)."""
    out = [admin.SCHEMAS, admin.CONFIG_DOCS, slo_generate.GENERATOR, k8s_render.GENERATOR,
           receiver_openapi.GENERATOR, control_openapi.GENERATOR, migrate.GENERATOR]
    try:
        from llmsla.dashboards import build
    except ImportError:  # pragma: no cover - the extra is missing
        return tuple(out)
    return (*out[:3], build.GENERATOR, *out[3:])
