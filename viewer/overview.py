"""Page: training overview: layer x step heatmaps and per-tensor time series by group."""
from __future__ import annotations

import re

import altair as alt
import pandas as pd
import streamlit as st

from inspector import plots

from . import data
from .ui import Ctx, default_tensor, download_figure, figure_theme, need, plain, show_png, theme

STATS = ("l2", "mean", "std", "min", "max", "zero_fraction", "nan", "inf")
LOG_STATS = {"l2", "std"}


def filter_tensors(names: list[str], pattern: str) -> list[str]:
    """Names matching ``pattern`` (a regex, or a plain substring if the regex is invalid).

    >>> filter_tensors(["conv1/Relu:0", "conv1/Conv2D:0"], "relu")
    ['conv1/Relu:0']
    """
    if not pattern:
        return names
    try:
        rx = re.compile(pattern, re.IGNORECASE)
        return [n for n in names if rx.search(n)]
    except re.error:
        return [n for n in names if pattern.lower() in n.lower()]


@st.cache_data(max_entries=32, show_spinner=False)
def heatmap_png(path: str, sig: tuple, kind: str, group: str, stat: str, pattern: str,
                theme: str = "light") -> tuple[bytes | None, str]:
    """The rendered heatmap and its caption, cached: a 300 x 1,000 heatmap takes ~0.5 s to
    draw, and every other widget on the page would otherwise redraw it."""
    tensors, steps, m = data.stats_matrix(path, sig, kind, group, stat)
    keep = filter_tensors(tensors, pattern)
    if not keep or not len(steps):
        return None, f"No {kind} statistics match this filter."
    rows = [tensors.index(t) for t in keep]
    log = stat in LOG_STATS
    with figure_theme(theme):
        fig = plots.heatmap(m[rows], keep, steps, title=f"{kind} {stat} (group {group})", log=log,
                            cbar_label=f"{stat}{' (log scale)' if log else ''}")
        png = plots.to_png(fig)
    return png, f"{len(keep)} tensors x {len(steps)} steps; grey = NaN/Inf or (log scale) zero"


def heatmap_block(ctx: Ctx, title: str, kind: str, default_stat: str, key: str, pattern: str, group: str) -> None:
    stat = st.selectbox(f"{title}: statistic", STATS, index=STATS.index(default_stat), key=f"{key}_stat",
                        bind="query-params")
    png, caption = heatmap_png(ctx.path, ctx.sig, kind, group, stat, pattern, theme())
    if need(png is not None, caption):
        show_png(png, f"heatmap_{kind}_{stat}_{group}", key=key, caption=caption)


def render(ctx: Ctx) -> None:
    st.header("Training overview")
    run = data.get_run(ctx.path, ctx.sig)
    steps = data.stats_steps(ctx.path, ctx.sig)
    if not need(len(steps) > 0, "This run has no statistics yet; nothing to plot. Press Refresh while it trains."):
        return
    c1, c2 = st.columns([3, 1])
    pattern = c1.text_input("Filter tensors (regex or substring on the name)", key="ov_filter", bind="query-params",
                            placeholder="e.g. Relu|icnn")
    group = c2.selectbox("Group", ("all", "positive", "negative"), key="ov_group", bind="query-params")
    tab_g, tab_a = st.tabs(["Gradients", "Activations"])
    with tab_g:
        heatmap_block(ctx, "Gradient", "gradient", "l2", "ov_hm_grad", pattern, group)
    with tab_a:
        heatmap_block(ctx, "Activation", "forward", "mean", "ov_hm_fwd", pattern, group)

    st.subheader("One tensor over steps, positive vs negative")
    names = filter_tensors(list(run.tensors["name"]), pattern) or list(run.tensors["name"])
    c = st.columns([3, 1, 1, 1])
    tensor = c[0].selectbox("Tensor", names, index=default_tensor(names), key="ov_tensor", bind="query-params")
    row = run.tensors.loc[tensor]
    kinds = ["forward"] + (["gradient"] if bool(row["has_gradient"]) else []) + (
        ["update"] if bool(row["has_update"]) else [])
    kind = c[1].radio("Kind", kinds, key="ov_kind", bind="query-params", horizontal=True)
    stat = c[2].selectbox("Statistic", STATS, index=STATS.index("mean"), key="ov_series_stat", bind="query-params")
    logy = c[3].toggle("Log y", value=stat in LOG_STATS, key="ov_logy")
    df = data.series(ctx.path, ctx.sig, tensor, kind, stat)
    if not need(not df.empty, f"No {kind} statistics for {plain(tensor)}."):
        return
    st.altair_chart(series_chart(df, stat, logy), width="stretch")
    if logy and (df <= 0).any().any():
        st.caption("log axis: zero and negative values are not drawn")
    last = df.iloc[-1]
    st.caption(f"{plain(tensor)} {kind} {stat} at step {int(df.index[-1])}: "
               + ", ".join(f"{plain(g)} {v:.4g}" for g, v in last.items()))
    download_figure(lambda: plots.time_series(df, f"{tensor} {kind} {stat}", stat, log=logy),
                    f"series_{tensor}_{kind}_{stat}", key="ov_series")
    update_ratio_block(ctx, pattern)


def series_chart(df: pd.DataFrame, stat: str, logy: bool) -> alt.Chart:
    """One line per group (column of ``df``, index step) in the group colours; ``logy``: a log
    y axis (the values themselves, labelled as such; values <= 0 left out, since a log axis
    cannot place them)."""
    long = df.rename_axis("step").reset_index().melt("step", var_name="group", value_name="value").dropna()
    if logy:
        long = long[long["value"] > 0]
    colors = [plots.GROUP_COLORS[g] if g != "all" else "#7f7f7f" for g in df.columns]
    return alt.Chart(long).mark_line().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("value:Q", title=f"{stat} (log scale)" if logy else stat,
                scale=alt.Scale(type="log") if logy else alt.Scale(zero=False)),
        color=alt.Color("group:N", scale=alt.Scale(domain=list(df.columns), range=colors), sort=list(df.columns)),
        tooltip=["step:Q", "group:N", "value:Q"])


def update_ratio_block(ctx: Ctx, pattern: str) -> None:
    """|update| / |weights| per variable over steps, log axis (runs with variable records only)."""
    ratios = data.update_ratios(ctx.path, ctx.sig)
    if ratios.empty:
        return
    st.subheader("Update / weight ratio per variable")
    shown = ratios[filter_tensors(list(ratios.columns), pattern) or list(ratios.columns)]
    long = shown.rename_axis("step").reset_index().melt("step", var_name="variable", value_name="ratio").dropna()
    chart = alt.Chart(long[long["ratio"] > 0]).mark_line().encode(
        x=alt.X("step:Q"), y=alt.Y("ratio:Q", title="L2 update / L2 weights (log scale)", scale=alt.Scale(type="log")),
        color=alt.Color("variable:N", legend=alt.Legend(title="variable")), tooltip=["step:Q", "variable:N", "ratio:Q"])
    st.altair_chart(chart, width="stretch")
    st.caption("L2 of the step's update over L2 of the variable before it (around 1e-3 is typical for SGD); "
               "the tensor filter above applies")
