"""Histograms and ridge plots as interactive Vega-Lite (Altair) charts: the same bars, axes and
legends as :func:`inspector.plots.histograms` / :func:`inspector.plots.ridge` (which stay for
the PNG downloads), drawn in the browser, so changing the tensor costs no Matplotlib drawing
(~0.3 s a figure). No Streamlit here (tested without a page).

Example::

    chart = histogram_chart({"forward": {"positive": (edges, counts)}}, title="x @ 10", log=True,
                            totals={"forward": {"positive": 70000}})
"""
from __future__ import annotations

from typing import Mapping

import altair as alt
import numpy as np
import pandas as pd

from inspector import plots

Hist = plots.Hist
#: plots.GROUP_COLORS in CSS form ("0.35" is Matplotlib's grey level)
COLORS = {"all": "#595959", "positive": "#d62728", "negative": "#1f77b4"}
#: Matplotlib's default cycle (C0, C1, ...): other groups (classes, named groups)
CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf"]


def color(group: str, i: int) -> str:
    return COLORS.get(group, CYCLE[i % len(CYCLE)])


def hist_frame(groups: Mapping[str, Hist], log: bool = False, totals: Mapping[str, int] | None = None,
               per_bin: bool = False) -> pd.DataFrame:
    """One record per bin: ``group``, ``label`` (the legend: real element count and, where it
    differs, the histogram's), bin ``x0``..``x1``, ``y`` (density, or fraction per bin if
    ``per_bin``) and ``floor`` (0, or on a log axis the floor empty bins are drawn at)."""
    ys = {g: plots._hist_y(e, c, True, per_bin) for g, (e, c) in groups.items()}
    floor = plots._log_floor(*ys.values()) if log else 0.0
    parts = []
    for g, (edges, counts) in groups.items():
        label = plots._legend_label(g, int(np.sum(counts)), (totals or {}).get(g))
        y = np.where(ys[g] > 0, ys[g], floor) if log else ys[g]
        parts.append(pd.DataFrame({"group": g, "label": label, "x0": edges[:-1], "x1": edges[1:], "y": y,
                                   "count": np.asarray(counts, np.int64), "floor": floor}))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["group", "label", "x0", "x1", "y", "count", "floor"])
    # object, not pandas 3's string dtype (Arrow large_string: Streamlit's Vega-Lite cannot read it)
    return df.astype({"group": object, "label": object})


def _legend_scale(groups: Mapping[str, Hist], labels: list[str]) -> alt.Scale:
    return alt.Scale(domain=labels, range=[color(g, i) for i, g in enumerate(groups)])


def panel_chart(name: str, groups: Mapping[str, Hist], log: bool = False, totals: Mapping[str, int] | None = None,
                xlim: tuple[float, float] | None = None, linthresh: float | None = None) -> alt.Chart:
    """One panel: every group's histogram overlaid (bars from the floor; positive filled, the
    others outlined), a real log y axis if ``log``, a symlog x axis if ``linthresh`` (the bins
    are symmetric-log; y is then the fraction per bin)."""
    df = hist_frame(groups, log, totals, per_bin=linthresh is not None)
    labels = list(dict.fromkeys(df["label"]))
    ytitle = "fraction per bin" if linthresh is not None else "density"
    xscale = alt.Scale(zero=False, nice=False)
    if linthresh is not None:
        xscale = alt.Scale(type="symlog", constant=linthresh)
    elif xlim is not None:
        xscale = alt.Scale(domain=list(xlim), zero=False, nice=False, clamp=True)
    yscale = alt.Scale(type="log", domainMin=float(df["floor"].iloc[0])) if log and len(df) else alt.Scale()
    fill = alt.condition(alt.datum.group == "positive", alt.Color("label:N", scale=_legend_scale(groups, labels),
                                                                   title=None, legend=alt.Legend(orient="top",
                                                                                                 labelLimit=400)),
                         alt.value("transparent"))
    return alt.Chart(df, title=name).mark_rect(opacity=0.6, strokeWidth=1.5).encode(
        x=alt.X("x0:Q", title="value", scale=xscale), x2="x1:Q",
        y=alt.Y("y:Q", title=ytitle, scale=yscale), y2="floor:Q",
        stroke=alt.Stroke("label:N", scale=_legend_scale(groups, labels), title=None, legend=None),
        fill=fill,
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("x0:Q", title="from", format=".4g"),
                 alt.Tooltip("x1:Q", title="to", format=".4g"), alt.Tooltip("y:Q", title=ytitle, format=".4g"),
                 alt.Tooltip("count:Q", title="values counted")],
    ).properties(width=340, height=220).add_params(
        alt.selection_interval(bind="scales", encodings=["x"], name=f"zoom_{_safe(name)}"))


def _safe(name: str) -> str:
    """A Vega parameter name from a panel name ("forward" -> "forward")."""
    return "".join(c if c.isalnum() else "_" for c in name)


def histogram_chart(panels: Mapping[str, Mapping[str, Hist]], title: str = "", log: bool = False,
                    xlim: Mapping[str, tuple[float, float]] | None = None,
                    totals: Mapping[str, Mapping[str, int]] | None = None,
                    xscale: Mapping[str, float] | None = None) -> alt.HConcatChart:
    """:func:`inspector.plots.histograms` (density) as side-by-side Vega-Lite panels (one per
    kind); every panel's legend names its groups with their element counts."""
    charts = [panel_chart(name, groups, log, (totals or {}).get(name), (xlim or {}).get(name),
                          (xscale or {}).get(name)) for name, groups in panels.items()]
    return alt.hconcat(*charts, title=title).resolve_scale(fill="independent", stroke="independent", y="independent")


def ridge_frame(rows: Mapping[int, Mapping[str, Hist]], overlap: float = 0.9, log: bool = False,
                decades: float = 4.0) -> pd.DataFrame:
    """Records of :func:`inspector.plots.ridge`: per step and group, each bin from ``base`` (the
    step's row, top = first step) to ``top`` = base + overlap * height, height scaled to the
    step's tallest group (log10 over ``decades`` if ``log``)."""
    steps = list(rows)
    parts = []
    for k, s in enumerate(steps):
        base = len(steps) - 1 - k
        dens = {g: (e, plots._hist_y(e, c, True, False)) for g, (e, c) in rows[s].items()}
        peak = max((float(np.nanmax(d)) for _, d in dens.values() if d.size), default=0.0) or 1.0
        for g, (e, d) in dens.items():
            parts.append(pd.DataFrame({"step": int(s), "group": g, "x0": e[:-1], "x1": e[1:], "density": d,
                                       "base": float(base),
                                       "top": base + overlap * plots._ridge_height(d, peak, log, decades)}))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["step", "group", "x0", "x1", "density", "base", "top"])
    return df.astype({"group": object})


def ridge_chart(rows: Mapping[int, Mapping[str, Hist]], title: str = "", log: bool = False,
                decades: float = 4.0) -> alt.Chart:
    """:func:`inspector.plots.ridge` as a Vega-Lite chart: one row per step labelled with its
    step, groups overlaid in their colours, tooltips with step, group, bin and density."""
    df = ridge_frame(rows, log=log, decades=decades)
    steps = list(rows)
    groups = list(dict.fromkeys(df["group"]))
    n = len(steps)
    # the row at base b shows step steps[n - 1 - b]: Vega's label expression maps the tick
    names = "{" + ",".join(f"'{n - 1 - k}':'{s}'" for k, s in enumerate(steps)) + "}"
    suffix = f" (row height: log10 density, {decades:g} decades)" if log else ""
    return alt.Chart(df, title=title + suffix).mark_rect(opacity=0.35).encode(
        x=alt.X("x0:Q", title="value", scale=alt.Scale(zero=False, nice=False)), x2="x1:Q",
        y=alt.Y("base:Q", title="step", scale=alt.Scale(domain=[0, max(n, 1)], nice=False),
                axis=alt.Axis(values=list(range(n)), labelExpr=f"{names}[datum.value + '']")),
        y2="top:Q",
        color=alt.Color("group:N", scale=alt.Scale(domain=groups, range=[color(g, i) for i, g in enumerate(groups)]),
                        legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("group:N"), alt.Tooltip("x0:Q", title="from", format=".4g"),
                 alt.Tooltip("x1:Q", title="to", format=".4g"), alt.Tooltip("density:Q", format=".4g")],
    ).properties(height=ridge_height(n)).interactive(bind_y=False)


def ridge_height(steps: int) -> int:
    """Pixels of a ridge plot's rows: 26 a step, at least 160. Streamlit stretches a chart's
    width but not its height: the page passes this (plus the title, legend and axis) too."""
    return max(160, 26 * steps + 40)
