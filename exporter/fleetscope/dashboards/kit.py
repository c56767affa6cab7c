"""Small helpers over grafana-foundation-sdk that enforce fleetscope's panel rules.

Every panel built here has a unit and thresholds (the helpers take both as
required arguments), queries the ``$datasource`` variable, and gets a refId.
The SDK's classic ``dashboard.Dashboard`` builder warns that it is deprecated
in favour of the v2 resource; fleetscope ships classic JSON on purpose
(file provisioning and the Grafana sidecar load classic JSON on Grafana 10+),
so the warning is silenced at import.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

try:
    import grafana_foundation_sdk  # noqa: F401  (only to name the extra when it is missing)
except ImportError as exc:
    raise ImportError("fleetscope.dashboards builds with grafana-foundation-sdk: "
                      "pip install 'fleetscope[dashboards]'") from exc

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import (
        bargauge,
        dashboard,
        heatmap,
        prometheus,
        stat,
        statetimeline,
        table,
        timeseries,
    )
    from grafana_foundation_sdk.builders.common import ReduceDataOptions, StackingConfig
    from grafana_foundation_sdk.models.common import (
        BarGaugeDisplayMode,
        GraphDrawStyle,
        HeatmapCellLayout,
        StackingMode,
        VizOrientation,
    )
    from grafana_foundation_sdk.models.dashboard import (
        DashboardLinkType,
        DataSourceRef,
        DataTransformerConfig,
        DynamicConfigValue,
        Threshold,
        ThresholdsMode,
        ValueMap,
        ValueMappingResult,
        VariableRefresh,
        VariableSort,
    )
    from grafana_foundation_sdk.models.heatmap import HeatmapColorMode, HeatmapColorScale
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

TAG = "fleetscope"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Stable uids: URLs and the links between dashboards depend on them.
UID_FLEET = "fleetscope-fleet"
UID_NODE = "fleetscope-node"
UID_JOB = "fleetscope-job"
UID_GPU_HEALTH = "fleetscope-gpu-health"
UID_EFA = "fleetscope-efa"

# Carried along on every cross-dashboard link so the target opens on the same data.
_KEEP = "${__url_time_range}&${datasource:queryparam}&${cluster:queryparam}"

Steps = Sequence[tuple[float | None, str]]
P = TypeVar("P")  # a panel builder


def ok(color: str = "green") -> Steps:
    """A single base step: the panel has no bad range, but still declares its colour."""
    return ((None, color),)


def rising(warn: float, crit: float) -> Steps:
    """Higher is worse; ``warn == crit`` means any value from there on is bad (no orange band)."""
    if warn == crit:
        return ((None, "green"), (crit, "red"))
    return ((None, "green"), (warn, "orange"), (crit, "red"))


def falling(crit: float, warn: float) -> Steps:
    """Lower is worse; ``crit == warn`` means below it is bad, from it on good."""
    if crit == warn:
        return ((None, "red"), (warn, "green"))
    return ((None, "red"), (crit, "orange"), (warn, "green"))


def thresholds(steps: Steps) -> dashboard.ThresholdsConfig:
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=value, color=color) for value, color in steps]
    )


@dataclass(frozen=True)
class Q:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


def _targets(queries: Sequence[Q]) -> list[prometheus.Dataquery]:
    out = []
    for index, query in enumerate(queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index))
        if query.legend:
            target = target.legend_format(query.legend)
        target = target.instant() if query.instant or query.table else target.range()
        if query.table:
            target = target.format(PromQueryFormat.TABLE)
        out.append(target)
    return out


def _common(panel: P, title: str, unit: str, steps: Steps, queries: Sequence[Q], description: str,
            width: int, height: int) -> P:
    built: Any = panel  # every panel builder has these setters, but the SDK declares them per class
    built = built.title(title).unit(unit).thresholds(thresholds(steps)).datasource(DATASOURCE)
    built = built.span(width).height(height)
    if description:
        built = built.description(description)
    return cast(P, built.targets(_targets(queries)))


def link(title: str, url: str) -> dashboard.DashboardLink:
    return dashboard.DashboardLink(title).type(DashboardLinkType.LINK).url(url)


def node_url(instance_ref: str) -> str:
    """Node detail for one node; ``instance_ref`` is a Grafana field reference."""
    return f"/d/{UID_NODE}/fleetscope-node-detail?var-instance={instance_ref}&{_KEEP}"


def job_url(job_ref: str) -> str:
    return f"/d/{UID_JOB}/fleetscope-training-job?var-training_job={job_ref}&{_KEEP}"


def mappings(codes: Mapping[int, tuple[str, str]] | Mapping[str, tuple[str, str]]) -> list[ValueMap]:
    """Value -> (text, colour) for a column or stat; keys are numbers or label values."""
    return [ValueMap(options={str(code): ValueMappingResult(text=text, color=color, index=i)
                              for i, (code, (text, color)) in enumerate(sorted(codes.items()))})]


# -- panels ---------------------------------------------------------------------------------------


def timeseries_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 12,
                     height: int = 8, links: Iterable[dashboard.DashboardLink] = (), stacked: bool = False,
                     bars: bool = False, minimum: float | None = None, maximum: float | None = None,
                     ) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), title, unit, steps, queries, description, width, height)
    panel = panel.fill_opacity(10).line_width(1)
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(60)
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    if links:
        panel = panel.data_links(list(links))
    return panel


def stat_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 4,
               height: int = 4, value_mappings: list[ValueMap] | None = None) -> stat.Panel:
    panel = _common(stat.Panel(), title, unit, steps, queries, description, width, height)
    panel = panel.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if value_mappings:
        panel = panel.mappings([*value_mappings])  # a list of the SDK's wider mapping union
    return panel


def bargauge_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 8,
                   height: int = 8, links: Iterable[dashboard.DashboardLink] = ()) -> bargauge.Panel:
    panel = _common(bargauge.Panel(), title, unit, steps, queries, description, width, height)
    panel = panel.display_mode(BarGaugeDisplayMode.GRADIENT).orientation(VizOrientation.HORIZONTAL)
    panel = panel.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if links:
        panel = panel.data_links(list(links))
    return panel


def table_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 12,
                height: int = 8, links: Iterable[dashboard.DashboardLink] = (), rename: dict[str, str] | None = None,
                column_units: dict[str, str] | None = None, value_mappings: dict[str, list[ValueMap]] | None = None,
                sort_by: str = "") -> table.Panel:
    """An instant table: one row per series, labels as columns; several queries are merged on their labels."""
    panel = _common(table.Panel(), title, unit, steps, queries, description, width, height)
    if len(queries) > 1:
        panel = panel.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    panel = panel.with_transformation(DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True, "__name__": True, "job": True, "uuid": True},
        "renameByName": dict(rename or {}),
    }))
    if sort_by:
        panel = panel.with_transformation(DataTransformerConfig(id_val="sortBy", options={
            "sort": [{"field": sort_by, "desc": True}],
        }))
    for column, column_unit in (column_units or {}).items():
        panel = panel.override_by_name(column, [DynamicConfigValue(id_val="unit", value=column_unit)])
    for column, maps in (value_mappings or {}).items():
        panel = panel.override_by_name(column, [DynamicConfigValue(id_val="mappings", value=maps)])
    if links:
        panel = panel.data_links(list(links))
    return panel


def heatmap_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 24,
                  height: int = 10, low: float = 0.0, high: float = 1.0) -> heatmap.Panel:
    """Rows are the query's series (already bucketed), coloured by value between ``low`` and ``high``."""
    panel = _common(heatmap.Panel(), title, unit, steps, queries, description, width, height)
    return panel.calculate(False).color(
        heatmap.HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("RdYlGn").reverse(True)
        .scale(HeatmapColorScale.LINEAR).min(low).max(high).steps(64)
    ).rows_frame(heatmap.RowsHeatmapOptions().layout(HeatmapCellLayout.UNKNOWN)).y_axis(
        heatmap.YAxisConfig().unit("none").axis_label("rank")
    )


def state_timeline_panel(title: str, unit: str, steps: Steps, *queries: Q, description: str = "", width: int = 12,
                         height: int = 8, links: Iterable[dashboard.DashboardLink] = ()) -> statetimeline.Panel:
    panel = _common(statetimeline.Panel(), title, unit, steps, queries, description, width, height)
    if links:
        panel = panel.data_links(list(links))
    return panel


def row(title: str) -> dashboard.Row:
    return dashboard.Row(title)


# -- variables ------------------------------------------------------------------------------------


def datasource_variable() -> dashboard.DatasourceVariable:
    return dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, *, multi: bool, include_all: bool) -> dashboard.QueryVariable:
    variable = (
        dashboard.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi).include_all(include_all)
    )
    if include_all:
        # With "All" selected the regex matches series that lack the label too (a fleet without `cluster`).
        variable = variable.all_value(".*")
    return variable


def xid_annotation(matchers: str) -> dashboard.AnnotationQuery:
    # The timestamp, not the counter: a GPU's first Xid creates its counter, which increase() cannot see.
    return annotation("Xid events", f"time() - fleetscope_gpu_last_xid_timestamp_seconds{{{matchers}}} < 120",
                      "Xid on {{instance}} GPU {{gpu}}", "red")


def alerts_annotation(matchers: str) -> dashboard.AnnotationQuery:
    return annotation("Firing alerts", f'ALERTS{{alertstate="firing", {matchers}}}', "{{alertname}} ({{severity}})",
                      "orange")


def cluster_variable() -> dashboard.QueryVariable:
    # Only present when Prometheus adds a `cluster` external/target label; "All" (.*) then matches everything.
    return query_variable("cluster", "Cluster", "label_values(fleetscope_build_info, cluster)",
                          multi=False, include_all=True)


# -- dashboards -----------------------------------------------------------------------------------


def annotation(name: str, expr: str, title: str, color: str) -> dashboard.AnnotationQuery:
    """Marks on every time-series panel wherever ``expr`` returns a series (a region while it lasts)."""
    return (
        dashboard.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color)
        .expr(expr).title_format(title).step("60s")
    )


def build_dashboard(uid: str, title: str, description: str, variables: Sequence[Any],
                    sections: Sequence[tuple[str, Sequence[Any]]],
                    annotations: Sequence[dashboard.AnnotationQuery] = ()) -> Any:
    """A dashboard with the common frame: tags, time, refresh, variables, cross links, rows of panels."""
    builder = (
        dashboard.Dashboard(title).uid(uid).description(description).tags([TAG])
        .time("now-1h", "now").refresh("30s").timezone("utc").editable()
        .link(dashboard.DashboardLink("fleetscope dashboards").type(DashboardLinkType.DASHBOARDS).tags([TAG])
              .as_dropdown(True).include_vars(False).keep_time(True))
        .with_variable(datasource_variable())
    )
    for variable in variables:
        builder = builder.with_variable(variable)
    for mark in annotations:
        builder = builder.annotation(mark)
    for section_title, panels in sections:
        # Panels follow their (expanded) row at top level: Grafana drops panels nested in an open row.
        builder = builder.with_row(row(section_title))
        for panel in panels:
            builder = builder.with_panel(panel)
    model = builder.build()
    _layout(model)
    return model


def _layout(model: Any) -> None:
    """Stable ids and a packed 24-column grid, in declaration order.

    The SDK's auto-layout lets a panel overflow the grid when the widths of a
    line do not add up to 24, so positions are assigned here instead.
    """
    x = y = line_height = 0
    for panel_id, panel in enumerate(model.panels or [], start=1):
        panel.id_val = panel_id
        grid = panel.grid_pos
        if getattr(panel, "type_val", "") == "row":
            y, x, line_height = y + line_height, 0, 0
            grid.x, grid.y, grid.w, grid.h = 0, y, 24, 1
            y += 1
            continue
        if x + grid.w > 24:
            y, x, line_height = y + line_height, 0, 0
        grid.x, grid.y = x, y
        x += grid.w
        line_height = max(line_height, grid.h)


def encode(model: Any) -> dict[str, Any]:
    """The SDK model as plain JSON data (the SDK's own encoder decides the field names)."""
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    data: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    return data
