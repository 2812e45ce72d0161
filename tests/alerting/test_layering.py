"""alerting reaches control only over the control API: no module of it imports another component."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("llmsla.control", "llmsla.exporters", "llmsla.fleet", "llmsla.streaming", "llmsla.forecaster",
             "llmsla.dashboards", "llmsla.worker")


def test_alerting_imports_only_core_and_itself() -> None:
    found = []
    for path in sorted((ROOT / "alerting").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            # by package, not by prefix: core's llmsla.control_client is not the control component
            found += [f"{path.name}:{node.lineno}: {m}" for m in mods
                      if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert found == []
