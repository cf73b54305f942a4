"""Small factories for the panel kinds the dashboards repeat.

Every panel gets the ``$datasource`` variable, a unit, a title and explicit query ref ids;
metric names go through ``inferwatch.alerts.catalog.metric`` so a rename fails the generator.
Panel ids and positions come from ``dashboard()``, so the JSON is stable.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import (
    common as common_b,
    dashboard as dash_b,
    heatmap,
    prometheus,
    stat,
    timeseries,
)
from grafana_foundation_sdk.models import common, dashboard as dash, prometheus as prom_m

from inferwatch.alerts import clusters
from inferwatch.alerts.generate import CONSTANT_RECORDS

warnings.filterwarnings("ignore", category=DeprecationWarning, module="grafana_foundation_sdk")

DATASOURCE = dash.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
TAG = "inferwatch"


def q(expr: str, legend: str = "", ref: str = "A", exemplar: bool = False, heat: bool = False,
      instant: bool = False) -> prometheus.Dataquery:
    """``instant``: the value now only, for a state whose earlier values must not show (a
    stat of the current decision)."""
    query = prometheus.Dataquery().expr(in_cluster(expr)).ref_id(ref).legend_format(legend or "__auto")
    if instant:
        query = query.instant()
    if exemplar:
        query = query.exemplar(True)
    if heat:
        query = query.format(prom_m.PromQueryFormat.HEATMAP)
    return query


def _refs(queries: tuple[prometheus.Dataquery, ...]) -> list[prometheus.Dataquery]:
    """Ref ids A, B, C... in order, so the JSON does not depend on call sites."""
    return [query.ref_id(chr(ord("A") + i)) for i, query in enumerate(queries)]


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dash_b.ThresholdsConfig:
    return dash_b.ThresholdsConfig().mode(dash.ThresholdsMode.ABSOLUTE).steps(
        [dash.Threshold(value=v, color=c) for v, c in steps])


OK = [(None, "green")]


def timeseries_panel(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "",
                     thresholds: Sequence[tuple[float | None, str]] = OK, width: int = 8, height: int = 8,
                     stacked: bool = False, log_scale: bool = False) -> timeseries.Panel:
    """``log_scale``: a log10 axis, for values that matter across decades (p-values against
    alpha = 0.01 would lie on the floor of a linear one)."""
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .span(width).height(height).thresholds(_thresholds(thresholds)).fill_opacity(10).line_width(1)
             .legend(common_b.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM)))
    if thresholds != OK:  # a time series draws its thresholds only when told how
        panel = panel.thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED))
    if log_scale:
        panel = panel.scale_distribution(common_b.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10))
    if stacked:
        panel = panel.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    for query in _refs(queries):
        panel = panel.with_target(query)
    return panel


def stat_panel(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "",
               thresholds: Sequence[tuple[float | None, str]] = OK, width: int = 4, height: int = 4,
               names_only: bool = False) -> stat.Panel:
    """``names_only``: each series shown by its legend alone, for a state a label names (the
    value is a 1 that says nothing)."""
    panel = (stat.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .span(width).height(height).thresholds(_thresholds(thresholds))
             .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
             .color_mode(common.BigValueColorMode.VALUE).graph_mode(common.BigValueGraphMode.AREA))
    if names_only:
        panel = panel.text_mode(common.BigValueTextMode.NAME)
    for query in _refs(queries):
        panel = panel.with_target(query)
    return panel


def heatmap_panel(title: str, bucket_expr: str, y_unit: str, description: str = "", width: int = 8,
                  height: int = 8) -> heatmap.Panel:
    """``bucket_expr`` is a ``sum by (le) (rate(..._bucket[...]))``: one row per bucket, cells in
    observations per second (a rate does not count overlapping windows twice, an increase would)."""
    return (heatmap.Panel().title(title).description(description).unit("reqps").datasource(DATASOURCE)
            .span(width).height(height).calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(y_unit)).cell_values(heatmap.CellValues().unit("reqps"))
            .with_target(q(bucket_expr, "{{le}}", heat=True)))


def quantiles(metric: str, selector: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95, 0.99),
              exemplar: bool = True) -> list[prometheus.Dataquery]:
    """p50/p95/p99 of a histogram, ``sum by (le, ...)`` first so replicas add up."""
    group = ", ".join(["le", *filter(None, [by])])
    by_legend = "".join(f" {{{{{label.strip()}}}}}" for label in by.split(",") if label.strip())
    return [q(f"histogram_quantile({x}, sum by ({group}) (rate({metric}{{{selector}}}[{RATE}])))",
              f"p{round(x * 100)}{by_legend}", exemplar=exemplar) for x in qs]


def server_error_ratio(requests_total: str, selector: str, by: str) -> str:
    """Share of requests answered 5xx, per ``by``; 0 (not "No data") before the first error."""
    total = f"sum by ({by}) (rate({requests_total}{{{selector}}}[{RATE}]))"
    errors = f'sum by ({by}) (rate({requests_total}{{{selector}, status_class="5xx"}}[{RATE}]))'
    return f"({errors} or 0 * {total}) / {total}"


def added_in_window(selector: str, window: str) -> str:
    """How much a counter rose over ``window``, a series that first appeared within it with
    its whole value: an XID counter is born at 1, and ``increase`` (two samples needed) would
    show that first error as nothing. A reset (the exporter restarted) counts as no rise."""
    return f"(clamp_min({selector} - {selector} offset {window}, 0) or ({selector} unless {selector} offset {window}))"


def or_zero(expr: str, label: str) -> str:
    """An error counter has no series until its first error: show a 0 labelled ``none``
    instead of "No data"."""
    return f'{expr} or on () label_replace(vector(0), "{label}", "none", "", "")'


def in_cluster(expr: str) -> str:
    """``expr`` over the clusters chosen in ``$cluster``, but for series of no cluster (records
    of constants, as an SLO's objective)."""
    return clusters.select(expr, f'{clusters.CLUSTER}=~"$cluster"', CONSTANT_RECORDS)


def cluster_variable() -> dash_b.QueryVariable:
    """Every dashboard's first filter: the clusters whose samples this Prometheus holds (a
    central store holds several). With one cluster, whose series carry no ``cluster`` label,
    it lists nothing and "All" (``.*``) matches every series."""
    return _query_variable("cluster", "Cluster", f"label_values(up, {clusters.CLUSTER})", True, ".*")


def query_variable(name: str, label: str, query: str, multi: bool = True,
                   all_value: str | None = ".*") -> dash_b.QueryVariable:
    """``all_value``: what "All" sends. ``.*`` also matches series without the label; None
    sends the listed values, so a value the query leaves out (the ``unknown`` model) stays out.
    ``query`` is a ``label_values(selector, label)``; its values are those of ``$cluster``."""
    found = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
    if found is None:
        raise ValueError(f"not a label_values(selector, label) query: {query}")
    return _query_variable(name, label, f"label_values({in_cluster(found[1])}, {found[2]})", multi, all_value)


def _query_variable(name: str, label: str, query: str, multi: bool, all_value: str | None) -> dash_b.QueryVariable:
    var = (dash_b.QueryVariable(name).label(label).query(query).datasource(DATASOURCE)
           .refresh(dash.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash.VariableSort.ALPHABETICAL_ASC))
    if multi:
        var = var.multi(True).include_all(True)
        if all_value is not None:
            var = var.all_value(all_value)
    return var


def datasource_variable() -> dash_b.DatasourceVariable:
    return dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")


def dashboard(uid: str, title: str, description: str, variables: list[Any],
              rows: list[tuple[str, list[Any]]]) -> dash_b.Dashboard:
    """A dashboard of titled rows; panel ids are assigned in order, links go to the others."""
    board = (dash_b.Dashboard(title).uid(uid).description(description).tags([TAG]).time("now-1h", "now")
             .refresh("30s").timezone("browser").tooltip(dash.DashboardCursorSync.CROSSHAIR)
             # no placement: Grafana 12.3.0's link bar shows only links without one (the SDK's
             # default, the controls menu, learnt to show dashboard links after 12.3.0)
             .link(dash_b.DashboardLink("inferwatch").type(dash.DashboardLinkType.DASHBOARDS).tags([TAG])
                   .as_dropdown(True).include_vars(True).keep_time(True)
                   .placement(None)))  # type: ignore[arg-type]  # the SDK types it str; None leaves it unset
    board = board.with_variable(datasource_variable()).with_variable(cluster_variable())
    for var in variables:
        board = board.with_variable(var)
    panel_id = 0
    for row_title, panels in rows:
        panel_id += 1
        board = board.with_row(dash_b.Row(row_title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    return board
