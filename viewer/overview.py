"""Page: training overview: interactive layer x step heatmaps (:mod:`viewer.layers`) and
per-tensor time series by group."""
from __future__ import annotations

import re

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from inspector import plots

from . import data, layers
from .ui import Ctx, default_tensor, download_figure, figure_theme, need, plain

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


def heatmap_rows(ctx: Ctx, kind: str, group: str, stat: str, pattern: str, unfold: list[str],
                 all_ops: bool) -> tuple[list[str], np.ndarray, np.ndarray, pd.DataFrame]:
    """(tensors, steps, matrix, the rows to draw) of one statistic, filtered and folded."""
    tensors, steps, m = data.stats_matrix(ctx.path, ctx.sig, kind, group, stat)
    keep = filter_tensors(tensors, pattern)
    rows = layers.layer_rows(data.get_run(ctx.path, ctx.sig).tensors, keep)
    return tensors, steps, m, layers.shown_rows(rows, unfold, all_ops)


def column_width(ov) -> int:
    """The overview's bin width where some column holds more than one statistics step, else 1
    (bins wider than the statistics stride aggregate nothing: saying so would mislead)."""
    return int(ov.width) if np.any(np.asarray(ov.first_steps) != np.asarray(ov.steps)) else 1


def binned_note(width: int) -> str:
    """The caption's words for columns that aggregate ``width`` steps ('' for one step each).

    >>> binned_note(1)
    ''
    """
    if width <= 1:
        return ""
    return (f"; each column aggregates a bin of {width} steps: the mean of its statistics steps' values "
            f"(grey if any is NaN/Inf), placed at the bin's last statistics step")


def heatmap_block(ctx: Ctx, title: str, kind: str, default_stat: str, key: str, pattern: str, group: str,
                  unfold: list[str], all_ops: bool) -> None:
    """The interactive layer x step heatmap of one statistic (PNG of the same rows on demand)."""
    stat = st.selectbox(f"{title}: statistic", STATS, index=STATS.index(default_stat), key=f"{key}_stat",
                        bind="query-params")
    tensors, steps, m, shown = heatmap_rows(ctx, kind, group, stat, pattern, unfold, all_ops)
    if not need(len(shown) > 0 and len(steps) > 0, f"No {kind} statistics match this filter."):
        return
    log = stat in LOG_STATS
    frame = layers.heatmap_frame(tensors, steps, m, shown, log)
    st.altair_chart(layers.heatmap_chart(frame, stat, log, f"{kind} {stat} (group {group})"), width="stretch",
                    height=layers.chart_height(len(shown)) + layers.FRAME_PX)
    n_steps = frame["step"].nunique()
    folded = int(sum(1 for lb in shown["label"] if "(+" in lb))
    st.caption(f"{len(shown)} rows x {len(steps)} steps"
               + (f" ({n_steps} evenly chosen columns drawn; zoom in, or narrow the filter)"
                  if n_steps < len(steps) else "")
               + binned_note(column_width(data.overview(ctx.path, ctx.sig, kind, group, stat)))
               + (f"; {folded} layers folded into their output row (unfold them above)" if folded else "")
               + f"; grey = NaN/Inf{' or <= 0 (log scale)' if log else ''}; scroll to zoom the steps, hover for values")
    rows = [tensors.index(t) for t in shown["tensor"]]

    def figure():
        with figure_theme():
            return plots.heatmap(m[rows], list(shown["label"]), steps, title=f"{kind} {stat} (group {group})",
                                 log=log, cbar_label=f"{stat}{' (log scale)' if log else ''}")
    download_figure(figure, f"heatmap_{kind}_{stat}_{group}", key=key)


def render(ctx: Ctx) -> None:
    st.header("Training overview")
    run = data.get_run(ctx.path, ctx.sig)
    steps = data.overview(ctx.path, ctx.sig, "forward", "all", "mean").steps  # (the default tab's matrix)
    if not need(len(steps) > 0, "This run has no statistics yet; nothing to plot. Press Refresh while it trains."):
        return
    c1, c2 = st.columns([3, 1])
    pattern = c1.text_input("Filter tensors (regex or substring on the name)", key="ov_filter", bind="query-params",
                            placeholder="e.g. Relu|icnn")
    group = c2.selectbox("Group", run.groups, key="ov_group", bind="query-params")
    unfold, all_ops = fold_controls(run.tensors, pattern)
    tab_g, tab_a = st.tabs(["Gradients", "Activations"])
    with tab_g:
        heatmap_block(ctx, "Gradient", "gradient", "l2", "ov_hm_grad", pattern, group, unfold, all_ops)
    with tab_a:
        heatmap_block(ctx, "Activation", "forward", "mean", "ov_hm_fwd", pattern, group, unfold, all_ops)

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


def fold_controls(catalog: pd.DataFrame, pattern: str) -> tuple[list[str], bool]:
    """Which layers to unfold (every op of them drawn), or every op of every layer."""
    rows = layers.layer_rows(catalog, filter_tensors(list(catalog["name"]), pattern))
    sizes = rows.groupby("layer", sort=False).size()
    multi = [str(ly) for ly, n in sizes.items() if n > 1]
    c1, c2 = st.columns([3, 1])
    unfold = c1.multiselect("Unfold layers (folded: one row, the layer's output)", multi, key="ov_unfold",
                            bind="query-params", help="a layer's internal ops (e.g. an ICNN layer's helper ops) "
                            "are folded into its output row by default")
    all_ops = c2.toggle("Every op", key="ov_all_ops", bind="query-params", help="unfold every layer")
    return unfold, all_ops


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
    st.caption(f"L2 of the step's update over L2 of the variable {weights_when(data.get_run(ctx.path, ctx.sig))} "
               "(around 1e-3 is typical for SGD); the tensor filter above applies")


def weights_when(run) -> str:
    """Which weights a variable record's ``forward`` holds, the ratio's denominator: the value
    before the step, except in a Keras probe run, whose probe runs after the step's update
    (FORMAT.md, ``keras_layer``).

    >>> class R: manifests = {("chief", 1): {"probe": {"source": "probe"}}}
    >>> weights_when(R())
    'after it (a Keras probe run: the probe reads the weights after the update)'
    """
    # a Keras run from before source="train_batch" existed has no probe.source: a probe (FORMAT.md)
    if any(isinstance(m.get("probe"), dict) and m["probe"].get("source", "probe") == "probe"
           for m in run.manifests.values()):
        return "after it (a Keras probe run: the probe reads the weights after the update)"
    return "before it"
