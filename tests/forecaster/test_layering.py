"""The forecaster imports core only (ARCHITECTURE.md, layer 2): it reaches the fleet simulator
only through the composition root and alerting only over webhook v4."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Not core (docs/architecture.md): the components and the composition root. Everything else under
#: ``llmsla.`` is core - config, names, events, store, the HTTP kit, the exposition, ...
NOT_CORE = ("exporters", "worker", "control", "streaming", "fleet", "alerting", "dashboards", "app", "__main__")


def _is_core(mod: str) -> bool:
    parts = mod.split(".")
    return parts[0] == "llmsla" and (len(parts) == 1 or parts[1] not in NOT_CORE)


def test_forecaster_imports_core_only() -> None:
    bad = []
    for path in sorted((ROOT / "forecaster").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for mod in mods:
                if mod.startswith("llmsla.") and not (mod.startswith("llmsla.forecaster") or _is_core(mod)):
                    bad.append(f"{path.name}: {mod}")
                if mod == "llmsla":
                    names = [a.name for a in node.names]  # type: ignore[attr-defined]
                    bad += [f"{path.name}: llmsla.{n}" for n in names if not _is_core(f"llmsla.{n}")]
    assert not bad, bad
