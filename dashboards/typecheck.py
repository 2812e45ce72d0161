"""Type-check dashboard JSON against Grafana's own TypeScript types (``@grafana/schema``) with tsc.

Each dashboard becomes a ``.ts`` file in which every panel is an object literal typed as a
``Panel`` whose ``options`` and ``fieldConfig.defaults.custom`` are that panel plugin's generated
``Options`` / ``FieldConfig`` (``@grafana/schema/.../panelcfg``), every target a Prometheus or
PostgreSQL query type, every annotation an ``AnnotationQuery<SqlQuery>``, and the rest a
``Dashboard``. Object literals get TypeScript's excess-property check, so ``tsc --noEmit
--strict`` rejects an unknown key, a wrong type or a bad enum value anywhere. Enum-typed fields
are compared by their string values (``Loose<T>``), which is what a JSON file can hold.

The Node packages live in ``.tools/`` (git-ignored), installed at the pinned versions below by
``python -m llmsla.dashboards.typecheck install`` (``scripts/bootstrap.sh`` runs it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: npm packages and exact versions: the Grafana 11.6 schema, matching the pinned SDK build.
NPM_PACKAGES = {"typescript": "5.9.3", "@grafana/schema": "11.6.16"}
TOOLS = Path(".tools")
_COMPOSABLE = "@grafana/schema/dist/esm/raw/composable"
#: panel type -> (module under composable/, has a FieldConfig export)
PANEL_TYPES = {
    "timeseries": ("timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "heatmap": ("heatmap/panelcfg/x/HeatmapPanelCfg_types.gen", True),
    "stat": ("stat/panelcfg/x/StatPanelCfg_types.gen", False),
    "table": ("table/panelcfg/x/TablePanelCfg_types.gen", True),
    "bargauge": ("bargauge/panelcfg/x/BarGaugePanelCfg_types.gen", False),
    "status-history": ("statushistory/panelcfg/x/StatusHistoryPanelCfg_types.gen", True),
}

_PRELUDE = """\
import type {{ AnnotationQuery, Dashboard, DataQuery, FieldConfig, FieldConfigSource, Panel, RowPanel }} from '@grafana/schema';
{imports}

// JSON holds an enum's value, not the enum: compare string enums by their literal values.
type Loose<T> = T extends string ? `${{T}}`
  : T extends number ? number
  : T extends boolean ? boolean
  : T extends Array<infer U> ? Array<Loose<U>>
  : T extends object ? {{ [K in keyof T]: Loose<T[K]> }}
  : T;

// Grafana's Prometheus query (public/app/plugins/datasource/prometheus dataquery) and SQL query.
interface PromQuery extends DataQuery {{
  expr: string;
  instant?: boolean;
  range?: boolean;
  exemplar?: boolean;
  editorMode?: 'code' | 'builder';
  format?: 'time_series' | 'table' | 'heatmap';
  legendFormat?: string;
  intervalFactor?: number;
  interval?: string;
}}
interface SqlQuery extends DataQuery {{
  rawSql: string;
  format: 'time_series' | 'table';
  editorMode?: 'code' | 'builder';
  rawQuery?: boolean;
}}
type Typed<K extends string, O, F> = Omit<Loose<Panel>, 'type' | 'options' | 'fieldConfig' | 'targets'> & {{
  type: K;
  options?: Loose<O>;
  fieldConfig?: {{ defaults: Omit<Loose<FieldConfig>, 'custom'> & {{ custom?: Loose<F> }}; overrides: Loose<FieldConfigSource['overrides']> }};
  targets?: Array<PromQuery | SqlQuery>;
}};
type Row = Omit<Loose<RowPanel>, 'panels'> & {{ panels: unknown[] }};
"""


def _ts_name(panel_type: str) -> str:
    return "P_" + panel_type.replace("-", "_")


def render_ts(dashboard: Mapping[str, Any]) -> str:
    """The TypeScript module that type-checks one dashboard's JSON."""
    imports, aliases = [], []
    for ptype, (module, has_fc) in PANEL_TYPES.items():
        alias = _ts_name(ptype)
        imports.append(f"import type * as {alias}_ from '{_COMPOSABLE}/{module}.js';")
        fc = f"{alias}_.FieldConfig" if has_fc else "Record<string, never>"
        aliases.append(f"type {alias} = Typed<'{ptype}', {alias}_.Options, {fc}>;")
    lines = [_PRELUDE.format(imports="\n".join(imports)), *aliases, ""]
    panel_refs = []
    for i, panel in enumerate(dashboard.get("panels", [])):
        ptype = panel.get("type")
        if ptype == "row":
            typ = "Row"
        elif ptype in PANEL_TYPES:
            typ = _ts_name(ptype)
        else:
            raise ValueError(f"panel {panel.get('title')!r}: no schema type for panel type {ptype!r}")
        lines.append(f"const panel{i}: {typ} = {json.dumps(panel, indent=2)};")
        panel_refs.append(f"panel{i}")
    annos = dashboard.get("annotations", {}).get("list", [])
    for i, a in enumerate(annos):
        lines.append(f"const annotation{i}: Loose<AnnotationQuery<SqlQuery | PromQuery>> = {json.dumps(a, indent=2)};")
    rest = {k: v for k, v in dashboard.items() if k not in ("panels", "annotations")}
    lines.append(f"const rest: Omit<Loose<Dashboard>, 'panels' | 'annotations'> = {json.dumps(rest, indent=2)};")
    lines.append(f"export const dashboard: Dashboard = {{ ...rest, panels: [{', '.join(panel_refs)}] as Panel[],"
                 f" annotations: {{ list: [{', '.join(f'annotation{i}' for i in range(len(annos)))}] as AnnotationQuery[] }} }};")
    return "\n".join(lines) + "\n"


def tool_path(root: Path) -> Path:
    return root / TOOLS / "node_modules" / ".bin" / "tsc"


def installed_versions(root: Path) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in NPM_PACKAGES:
        pj = root / TOOLS / "node_modules" / pkg / "package.json"
        out[pkg] = json.loads(pj.read_text())["version"] if pj.exists() else None
    return out


def install(root: Path) -> None:
    """``npm install`` the pinned packages into ``<root>/.tools`` (no-op when already there)."""
    if installed_versions(root) == NPM_PACKAGES and tool_path(root).exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: the dashboard type-check needs Node.js >= 18 with npm "
                           "(Debian: apt-get install nodejs npm)")
    tools = root / TOOLS
    tools.mkdir(exist_ok=True)
    (tools / "package.json").write_text(json.dumps({"private": True, "name": "llmsla-tools"}) + "\n")
    subprocess.run([npm, "install", "--prefix", str(tools), "--no-audit", "--no-fund", "--save-exact",
                    *(f"{p}@{v}" for p, v in NPM_PACKAGES.items())], check=True)


class TypeCheckError(AssertionError):
    """tsc rejected a dashboard; the message carries tsc's output."""


def errors(dashboards: Mapping[str, Mapping[str, Any]], root: Path) -> dict[str, list[str]]:
    """tsc's error lines per dashboard name (one tsc run for all); empty lists when clean."""
    root = root.resolve()
    tsc = tool_path(root)
    if not tsc.exists() or installed_versions(root) != NPM_PACKAGES:
        raise TypeCheckError(f"{tsc} with {NPM_PACKAGES} is not installed: run `python -m llmsla.dashboards.typecheck install`")
    with tempfile.TemporaryDirectory(dir=root / TOOLS, prefix="check-") as tmp:
        work = Path(tmp)
        files = []
        for stem, d in dashboards.items():
            path = work / f"{stem}.ts"
            path.write_text(render_ts(d))
            files.append(path.name)
        (work / "tsconfig.json").write_text(json.dumps({
            "compilerOptions": {"strict": True, "noEmit": True, "target": "es2022", "module": "esnext",
                                "moduleResolution": "bundler", "skipLibCheck": True, "types": []},
            "files": files,
        }))
        res = subprocess.run([str(tsc), "-p", str(work / "tsconfig.json")], capture_output=True, text=True, cwd=work)
    out: dict[str, list[str]] = {stem: [] for stem in dashboards}
    for line in (res.stdout + res.stderr).splitlines():
        stem = line.split(".ts(", 1)[0]
        if stem in out:
            out[stem].append(line)
        elif line.strip() and not line.startswith(" "):
            raise TypeCheckError(f"tsc failed: {res.stdout}{res.stderr}")
    if res.returncode != 0 and not any(out.values()):
        raise TypeCheckError(f"tsc exited {res.returncode}: {res.stdout}{res.stderr}")
    return out


def check(dashboards: Mapping[str, Mapping[str, Any]], root: Path) -> None:
    """Run ``tsc --noEmit --strict`` over every dashboard; raise :class:`TypeCheckError` on errors."""
    found = errors(dashboards, root)
    if any(found.values()):
        raise TypeCheckError("\n".join(line for lines in found.values() for line in lines))


if __name__ == "__main__":  # python -m llmsla.dashboards.typecheck install [ROOT]
    if len(sys.argv) < 2 or sys.argv[1] != "install":
        sys.exit("usage: python -m llmsla.dashboards.typecheck install [ROOT]")
    install(Path(sys.argv[2]) if len(sys.argv) > 2 else Path.cwd())
