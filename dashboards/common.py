"""Building blocks every dashboard shares: datasources, variables, links, annotations, panels.

Panels take their queries from :mod:`~llmsla.dashboards.promql` / :mod:`~llmsla.dashboards.storesql`
(never inline text), so the JSON, the report and the tests cannot disagree about a query.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statushistory,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

from llmsla import names
from llmsla.dashboards import postgres, promql, storesql
from llmsla.dashboards.query import PromQuery, Query, SqlQuery

TAG = "llmsla"
PROM = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
STORE = dash_m.DataSourceRef(type_val=names.GRAFANA_POSTGRES_TYPE, uid="${store}")
REFS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

UID_FLEET = "llmsla-fleet"
UID_INSTANCES = "llmsla-instances"
UID_SLO = "llmsla-slo"
UID_POLICY = "llmsla-policy"
UID_AB = "llmsla-ab"
UID_FORECAST = "llmsla-forecast"


def new_dashboard(uid: str, title: str, description: str, *, time_from: str = "now-6h") -> dash.Dashboard:
    """A dashboard with the shared tags, time picker, refresh and the dropdown of its siblings."""
    return (
        dash.Dashboard(title).uid(uid).description(description).tags([TAG])
        .time(time_from, "now").refresh("30s").timezone("utc").editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .link(dash.DashboardLink("llmsla dashboards").type(dash_m.DashboardLinkType.DASHBOARDS).tags([TAG])
              .as_dropdown(True).keep_time(True).include_vars(True))
    )


# -- variables ------------------------------------------------------------------------------------
#: Variable options containing ``$__`` are dropped: Grafana's backend expands macros *after* the
#: frontend substituted the (quoted) values, so such a label value (a client can choose a model
#: name) would be rewritten inside its SQL literal and end it early.
SAFE_VALUES = "/^(?!.*\\$__).*$/"
def prometheus_datasource() -> dash.DatasourceVariable:
    return (dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
            .current(dash_m.VariableOption(text=names.GRAFANA_PROMETHEUS_UID, value=names.GRAFANA_PROMETHEUS_UID)))


def store_datasource() -> dash.DatasourceVariable:
    return (dash.DatasourceVariable("store").label("Store (PostgreSQL/TimescaleDB)").type(names.GRAFANA_POSTGRES_TYPE)
            .current(dash_m.VariableOption(text=names.GRAFANA_STORE_UID, value=names.GRAFANA_STORE_UID)))


def query_variable(name: str, q: Query, label: str) -> dash.QueryVariable:
    """Multi-value, include-all, no custom all value: "All" expands to the listed values, which
    both PromQL (regex alternation) and SQL (a quoted list for IN) accept."""
    v = (dash.QueryVariable(name).label(label).multi(True).include_all(True).regex(SAFE_VALUES)
         .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC)
         .current(dash_m.VariableOption(text=["All"], value=["$__all"])))
    if isinstance(q, PromQuery):
        return v.datasource(PROM).query(q.expr)
    return v.datasource(STORE).query(q.sql)


def request_variables() -> list[dash.QueryVariable]:
    """model, pool, replica, arm from the Prometheus request counter."""
    return [
        query_variable(names.L_MODEL, promql.VAR_MODEL, "Model"),
        query_variable(names.L_POOL, promql.VAR_POOL, "Pool"),
        query_variable(names.L_REPLICA, promql.VAR_REPLICA, "Replica"),
        query_variable(names.L_ARM, promql.VAR_ARM, "Arm"),
    ]


# -- annotations ----------------------------------------------------------------------------------
def action_annotations() -> list[dash.AnnotationQuery]:
    """Alert-driven and other control actions from ``action_log``, on every time axis.

    The SDK types an annotation's ``target`` as Grafana's built-in annotation target; a
    PostgreSQL annotation carries its SQL query there (Grafana's ``AnnotationQuery<TQuery>``),
    so the target is the PostgreSQL data-query builder."""
    out = []
    for name, q, color in (("Alert actions", storesql.ALERT_ANNOTATIONS, "red"),
                           ("Other control actions", storesql.ACTION_ANNOTATIONS, "blue")):
        target = postgres.DataqueryBuilder().raw_sql(q.sql).format(q.fmt).ref_id("Anno").datasource(STORE)
        out.append(dash.AnnotationQuery().name(name).datasource(STORE).enable(True).icon_color(color)
                   .target(target))  # type: ignore[arg-type]  # our Postgres dataquery variant (postgres.py)
    return out


# -- targets --------------------------------------------------------------------------------------
def prom_target(q: PromQuery, ref: str) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(q.expr).ref_id(ref).editor_mode(QueryEditorMode.CODE)
    if q.legend:
        t = t.legend_format(q.legend)
    if q.fmt != "time_series":
        t = t.format(PromQueryFormat(q.fmt))
    return t.instant() if q.instant else t.range()


def sql_target(q: SqlQuery, ref: str) -> postgres.DataqueryBuilder:
    return postgres.DataqueryBuilder().raw_sql(q.sql).format(q.fmt).ref_id(ref)


def with_targets(panel, queries: Sequence[Query]):  # noqa: ANN001, ANN201 - any SDK panel builder
    """Targets A, B, ... and the panel datasource (all queries of a panel share one)."""
    kinds = {type(q) for q in queries}
    if len(kinds) != 1:
        raise ValueError("a panel's queries come from one datasource")
    panel = panel.datasource(PROM if PromQuery in kinds else STORE)
    for ref, q in zip(REFS, queries, strict=False):
        panel = panel.with_target(prom_target(q, ref) if isinstance(q, PromQuery) else sql_target(q, ref))
    return panel


def thresholds(steps: Sequence[tuple[float | None, str]]) -> dash.ThresholdsConfig:
    return dash.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
        [dash_m.Threshold(value=v, color=c) for v, c in steps])


def slo_line(objective: float, *, below_is_good: bool = True) -> dash.ThresholdsConfig:
    """Green on the good side of ``objective``, red past it (drawn as a dashed line)."""
    if below_is_good:
        return thresholds([(None, "green"), (objective, "red")])
    return thresholds([(None, "red"), (objective, "green")])


# -- panels ---------------------------------------------------------------------------------------
def timeseries_panel(title: str, queries: Sequence[Query], *, unit: str, description: str,
                     slo: dash.ThresholdsConfig | None = None, w: int = 12, h: int = 8,
                     log_y: bool = False, min_val: float | None = None, max_val: float | None = None,
                     links: Sequence[dash.DashboardLink] = ()) -> timeseries.Panel:
    p = with_targets(timeseries.Panel().title(title).description(description).unit(unit).span(w).height(h), queries)
    p = p.line_width(1).fill_opacity(10)
    p = p.legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.TABLE)
                 .placement(common_m.LegendPlacement.BOTTOM).show_legend(True).calcs(["mean", "max"]))
    p = p.tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI).sort(common_m.SortOrder.DESCENDING))
    if slo is not None:
        p = p.thresholds(slo).thresholds_style(common_b.GraphThresholdsStyleConfig().mode(common_m.GraphThresholdsStyleMode.DASHED))
    if log_y:
        p = p.scale_distribution(common_b.ScaleDistributionConfig().type(common_m.ScaleDistribution.LOG).log(10))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if links:
        p = p.links(list(links))
    return p


def heatmap_panel(title: str, q: PromQuery, *, unit: str, description: str, w: int = 12, h: int = 9) -> heatmap.Panel:
    """Pre-bucketed heatmap (``calculate`` off): one row per histogram bucket, colour = count."""
    p = heatmap.Panel().title(title).description(description).span(w).height(h).calculate(False)
    p = with_targets(p, [q])
    return (p.y_axis(heatmap.YAxisConfig().unit(unit))
            .color(heatmap.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME).scheme("Spectral")
                   .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64).reverse(True))
            .cell_gap(1).show_value(common_m.VisibilityMode.NEVER)
            .mode(common_m.TooltipDisplayMode.SINGLE).show_y_histogram().show_color_scale(True))


def log_steps(bounds: Sequence[float], objective: float) -> dash.ThresholdsConfig:
    """Colour steps at the histogram's (log-spaced, SLO-aligned) bounds: greens up to the
    objective, then oranges to reds. A status history coloured by these steps has a log colour
    scale whose one hard edge is the SLO."""
    below = [b for b in bounds if b < objective]
    above = [b for b in bounds if b >= objective]
    steps: list[tuple[float | None, str]] = [(None, "#1a9850")]
    steps += [(b, _mix("#1a9850", "#d9ef8b", (i + 1) / max(len(below), 1))) for i, b in enumerate(below)]
    steps += [(b, _mix("#fdae61", "#67000d", i / max(len(above) - 1, 1))) for i, b in enumerate(above)]
    return thresholds(steps)


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i:i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def status_history_panel(title: str, q: Query, *, steps: dash.ThresholdsConfig, description: str,
                         w: int = 24, h: int = 12) -> statushistory.Panel:
    """x = time, y = one row per series (replica), colour = value through ``steps``."""
    p = statushistory.Panel().title(title).description(description).span(w).height(h).unit("s")
    p = with_targets(p, [q]).thresholds(steps).color_scheme(
        dash.FieldColor().mode(dash_m.FieldColorModeId.THRESHOLDS))
    return p.show_value(common_m.VisibilityMode.NEVER).row_height(0.9).col_width(1).fill_opacity(90).legend(
        common_b.VizLegendOptions().show_legend(True).display_mode(common_m.LegendDisplayMode.LIST)
        .placement(common_m.LegendPlacement.BOTTOM))


def stat_panel(title: str, queries: Sequence[Query], *, unit: str, description: str,
               steps: dash.ThresholdsConfig | None = None, w: int = 6, h: int = 5) -> stat.Panel:
    p = with_targets(stat.Panel().title(title).description(description).unit(unit).span(w).height(h), queries)
    p = p.reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    p = p.graph_mode(common_m.BigValueGraphMode.AREA).color_mode(common_m.BigValueColorMode.VALUE)
    return p.thresholds(steps) if steps is not None else p


def table_panel(title: str, queries: Sequence[Query], *, description: str, w: int = 24, h: int = 8,
                unit: str | None = None) -> table.Panel:
    p = with_targets(table.Panel().title(title).description(description).span(w).height(h), queries)
    p = p.cell_height(common_m.TableCellHeight.SM).filterable(True).cell_options(common_m.TableAutoCellOptions())
    return p.unit(unit) if unit else p


def bargauge_panel(title: str, queries: Sequence[Query], *, unit: str, description: str,
                   steps: dash.ThresholdsConfig | None = None, w: int = 12, h: int = 8,
                   min_val: float | None = None, max_val: float | None = None) -> bargauge.Panel:
    p = with_targets(bargauge.Panel().title(title).description(description).unit(unit).span(w).height(h), queries)
    p = p.display_mode(common_m.BarGaugeDisplayMode.GRADIENT).orientation(common_m.VizOrientation.HORIZONTAL)
    p = p.reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(True))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return p.thresholds(steps) if steps is not None else p


def link_to(uid: str, title: str) -> dash.DashboardLink:
    """A panel link to another llmsla dashboard, keeping the time range and the variables."""
    return (dash.DashboardLink(title).type(dash_m.DashboardLinkType.LINK)
            .url(f"/d/{uid}?${{__url_time_range}}&${{__all_variables}}").keep_time(False).include_vars(False))


def number_panels(d: dash_m.Dashboard) -> dash_m.Dashboard:
    """Stable panel ids 1..n in layout order (Grafana needs them unique; links and the report
    refer to panels by title, so the order is the only input)."""
    n = 0
    for p in d.panels or []:
        n += 1
        p.id_val = n
        for child in getattr(p, "panels", None) or []:
            n += 1
            child.id_val = n
    return d
