"""Where the run-time defaults under ``deploy/`` come from: one resolver for every command.

``deploy/`` in the checkout is the only copy in git; the wheel maps it into the package as
``llmsla/deploy`` (pyproject ``package-dir``), so an installed llmsla finds the SLO specs, the
Alertmanager config, the k8s base and the dashboard sources without a checkout. A ``deploy/``
in the working directory wins, so a user's edited copy is what the commands read.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

#: ``deploy/`` relative to the working directory: the user's (or the checkout's) editable copy
LOCAL = Path("deploy")


def _roots() -> tuple[Path, Path]:
    """The installed package's ``deploy`` and, for an editable install, the checkout's."""
    return (Path(str(importlib.resources.files("llmsla"))) / "deploy",
            Path(__file__).resolve().parent.parent / "deploy")


def deploy(rel: str) -> Path:
    """``deploy/<rel>`` from the working directory, else the installed package, else the checkout."""
    local = LOCAL / rel
    if local.exists():
        return local
    for root in _roots():
        if (root / rel).exists():
            return root / rel
    return local


def shown(path: str | Path) -> str:
    """``path`` as ``deploy/<rel>`` when it is a resolved default, so generated headers do not
    depend on where llmsla is installed."""
    resolved = Path(path).resolve()
    for root in _roots():
        if resolved.is_relative_to(root.resolve()):
            return str(LOCAL / resolved.relative_to(root.resolve()))
    return str(path)
