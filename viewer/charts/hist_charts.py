"""Histograms and ridge plots as interactive Vega-Lite (Altair) charts, drawn from the bars of
:mod:`inspector.analysis.hist_view` (the same bars as the PNG downloads of
:mod:`inspector.analysis.plots`), in the browser, so changing the tensor costs no Matplotlib
drawing. No Streamlit here (tested without a page).

Each group is an outline (a step line) over a light fill in its colour, so overlaid groups all
stay visible; hovering a bar gives the values it holds, its count and fraction. On the signed
log axis the ticks are powers of ten labelled with their signed value.

Example::

    axis = hist_view.choose_axis(hists.values(), kind="gradient")
    frame = hist_view.panel_frame({"": hists}, axis)
    chart = histogram_chart({"gradient": (frame, axis)}, title="x @ 10")
"""
from __future__ import annotations

import json
from typing import Mapping

import altair as alt
import numpy as np
import pandas as pd

from inspector.analysis import hist_view
from inspector.analysis.hist_view import Axis

#: Vega-Lite strokeDash of the first and second side of an overlay (solid, dashed).
DASHES = [[1, 0], [6, 3]]


def _safe(name: str) -> str:
    """A Vega parameter name from a panel name ("forward" -> "forward")."""
    return "".join(c if c.isalnum() else "_" for c in name)


def outline_frame(frame: pd.DataFrame, y: str = "fraction", base: float | str = 0.0,
                  by: tuple[str, ...] = ("side", "group")) -> pd.DataFrame:
    """The points of each ``by`` series' step outline (Vega's ``step-after`` line) over the
    non-zero-value bars of ``frame``: from its first edge up, across each bar, down to ``base``
    (a number, or a column of ``frame``) in the gaps and at the end."""
    parts = []
    for key, part in frame[~frame["zero"].astype(bool)].groupby(list(by), sort=False):
        b = float(part[base].iloc[0]) if isinstance(base, str) else base
        edges, values = hist_view.steps(part["x0"], part["x1"], part[y], b)
        parts.append(pd.DataFrame({**dict(zip(by, key)), "label": part["label"].iloc[0],
                                   "x": np.r_[edges[0], edges], "y": np.r_[b, values, b]}))
    if not parts:
        return pd.DataFrame(columns=[*by, "label", "x", "y"])
    return pd.concat(parts, ignore_index=True).astype(
        {c: object for c in (*by, "label") if c != "step"})


def x_encoding(axis: Axis, frame: pd.DataFrame, field: str = "x0") -> alt.X:
    """The x channel: the frame's range exactly; on a log axis the powers of ten as ticks,
    labelled with their signed values (a lookup on the tick's position in thousandths)."""
    lo, hi = (float(frame["x0"].min()), float(frame["x1"].max())) if len(frame) else (0.0, 1.0)
    xs, labels = hist_view.ticks(axis, lo, hi)
    if axis.scale == "log":   # 0 always in view, a little room beyond the outer bars
        domain = [min(lo, -hist_view.ZERO_HALF) - 0.3, max(hi, hist_view.ZERO_HALF) + 0.3]
    else:
        domain = [lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo)]
    scale = alt.Scale(domain=domain, zero=False, nice=False)
    if not xs:
        return alt.X(f"{field}:Q", title=axis.title(), scale=scale)
    lookup = json.dumps({str(round(x * 1000)): lb for x, lb in zip(xs, labels)}).replace('"', "'")
    return alt.X(f"{field}:Q", title=axis.title(), scale=scale,
                 axis=alt.Axis(values=xs,
                               labelExpr=f"{lookup}[round(datum.value * 1000) + ''] || ''"))


def panel_chart(name: str, frame: pd.DataFrame, axis: Axis, log: bool = False,
                width: int = 340) -> alt.LayerChart:
    """One panel: every (side, group) of ``frame``
    (:func:`inspector.analysis.hist_view.panel_frame`) on ``axis``, y the fraction per bar on one
    scale for all (a real log scale if ``log``, empty bins at its floor; else topped by
    :func:`inspector.analysis.hist_view.y_top` where a zeros' bar would flatten the others). A
    second side is dashed. Scroll to zoom the values."""
    sides = list(dict.fromkeys(frame["side"]))
    overlay = len(sides) > 1 or sides not in ([], [""])
    floor = hist_view.log_floor_of(frame["fraction"]) if log else 0.0
    frame = frame.assign(y=np.maximum(frame["fraction"], floor), floor=floor)
    key = "group" if overlay else "label"
    names = list(dict.fromkeys(frame[key]))
    colors = hist_view.group_colors(frame["group"])
    by_key = dict(zip(frame[key], frame["group"]))
    color = alt.Color(f"{key}:N", title=None,
                      scale=alt.Scale(domain=names, range=[colors[by_key[n]] for n in names]),
                      legend=alt.Legend(orient="top", direction="vertical", labelLimit=340))
    top = None if log else hist_view.y_top(frame["fraction"], frame["zero"])
    yscale = alt.Scale(type="log", domainMin=floor) if log \
        else alt.Scale(domain=[0, top]) if top else alt.Scale()
    ytitle = "fraction of values per " + ("bucket" if axis.scale == "log" else "bin")
    y = alt.Y("y:Q", title=ytitle, scale=yscale)
    tips = [*([alt.Tooltip("side:N")] if overlay else []), alt.Tooltip("group:N"),
            alt.Tooltip("lo:Q", title="values from", format=".4g"),
            alt.Tooltip("hi:Q", title="to", format=".4g"),
            alt.Tooltip("count:Q", title="values counted", format=",.0f"),
            alt.Tooltip("fraction:Q", title="fraction", format=".3%")]
    x = x_encoding(axis, frame)
    # an empty bin's bar has no height (at the floor on a log y) and no area to hover: only the
    # bars that hold values are marks (the data keeps every bar: the legend's groups and the
    # counts), the outline still drops to the floor across the others
    fill = alt.Chart(frame).transform_filter("datum.count > 0").mark_rect(
        fillOpacity=0.2, clip=True).encode(
        x=x, x2="x1:Q", y=y, y2="floor:Q", fill=color, tooltip=tips,
        stroke=alt.condition("datum.zero", color, alt.value(None)), strokeWidth=alt.value(1.5),
    ).add_params(alt.selection_interval(bind="scales", encodings=["x"], name=f"zoom_{_safe(name)}"))
    line_enc: dict = {"x": alt.X("x:Q"), "y": alt.Y("y:Q"), "stroke": color,
                      "detail": ["side:N", "group:N"]}
    if overlay:
        line_enc["strokeDash"] = alt.StrokeDash(
            "side:N", title=None, scale=alt.Scale(domain=sides, range=DASHES[:len(sides)]),
            legend=alt.Legend(orient="top", direction="vertical", labelLimit=340))
    line = alt.Chart(outline_frame(frame, "y", floor)).mark_line(
        interpolate="step-after", strokeWidth=1.5, clip=True).encode(**line_enc)
    layers = [fill, line]
    if top:
        note = pd.DataFrame({"x": [0.0], "y": [top], "text": ["zeros (clipped: see the tooltip)"]})
        layers.append(alt.Chart(note).mark_text(align="left", baseline="top", dx=4, dy=2,
                                                fontSize=11).encode(
            x="x:Q", y="y:Q", text="text:N"))
    return alt.layer(*layers, title=name).properties(width=width, height=220)


def histogram_chart(panels: Mapping[str, tuple[pd.DataFrame, Axis]], title: str = "",
                    log: bool = False, width: int = 340) -> alt.HConcatChart:
    """Panels side by side (one per kind: ``{name: (frame, axis)}``, each ``width`` pixels),
    each on its own axes; every legend names its groups with their element counts."""
    charts = [panel_chart(name, frame, axis, log, width) for name, (frame, axis) in panels.items()]
    return alt.hconcat(*charts, title=title).resolve_scale(
        fill="independent", stroke="independent", strokeDash="independent", x="independent",
        y="independent")


def ridge_chart(frame: pd.DataFrame, axis: Axis, steps: list[int], title: str = "",
                log: bool = False, decades: float = 4.0) -> alt.LayerChart:
    """A ridge plot (:func:`inspector.analysis.hist_view.ridge_frame`) as a Vega-Lite chart: one row
    per step labelled with its step, groups outlined over a light fill in their colours, tooltips
    with step, group, the values a bar holds and its fraction."""
    groups = list(dict.fromkeys(frame["group"]))
    colors = hist_view.group_colors(groups)
    n = len(steps)
    # the row at base b shows step steps[n - 1 - b]: Vega's label expression maps the tick
    names = "{" + ",".join(f"'{n - 1 - k}':'{s}'" for k, s in enumerate(steps)) + "}"
    suffix = f" (row height: log10 fraction, {decades:g} decades)" if log else ""
    color = alt.Color("group:N", scale=alt.Scale(domain=groups, range=[colors[g] for g in groups]),
                      legend=alt.Legend(orient="top"))
    y = alt.Y("base:Q", title="step", scale=alt.Scale(domain=[0, max(n, 1)], nice=False),
              # every row labelled: Vega hides overlapping labels, and a row (ridge_height) is
              # taller than the label
              axis=alt.Axis(values=list(range(n)), labelExpr=f"{names}[datum.value + '']",
                            labelOverlap=False, labelFontSize=ROW_LABEL_PX))
    # only the bars that hold values are marks, as in panel_chart
    fill = alt.Chart(frame).transform_filter("datum.count > 0").mark_rect(fillOpacity=0.2).encode(
        x=x_encoding(axis, frame), x2="x1:Q", y=y, y2="top:Q", fill=color,
        stroke=alt.condition("datum.zero", color, alt.value(None)), strokeWidth=alt.value(1.2),
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("group:N"),
                 alt.Tooltip("lo:Q", title="values from", format=".4g"),
                 alt.Tooltip("hi:Q", title="to", format=".4g"),
                 alt.Tooltip("fraction:Q", format=".3%")],
    ).add_params(alt.selection_interval(bind="scales", encodings=["x"], name="zoom_ridge"))
    line = alt.Chart(outline_frame(frame, "top", "base", ("step", "group"))).mark_line(
        interpolate="step-after", strokeWidth=1.2).encode(x="x:Q", y="y:Q", stroke=color,
                                                          detail=["step:Q", "group:N"])
    return alt.layer(fill, line, title=title + suffix).properties(height=ridge_height(n))


#: The ridge plot's step labels, in px (a row is :data:`ROW_PX`)
ROW_LABEL_PX = 11
ROW_PX = 26


def ridge_height(steps: int) -> int:
    """Pixels of a ridge plot's rows: 26 a step, at least 160. Streamlit stretches a chart's
    width but not its height: the page passes this (plus the title, legend and axis) too."""
    return max(160, ROW_PX * steps + 40)
