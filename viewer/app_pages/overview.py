"""Page: training overview: layer x step heatmaps of gradients and activations (one raster
each, :mod:`viewer.charts.raster` / :mod:`viewer.charts.heatmap`; rows in network order,
:mod:`viewer.layers`) and per-tensor line charts by group (:mod:`viewer.charts.lines`)."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import streamlit as st

from inspector.stats.summary import Overview

from .. import data, layers
from ..charts import heatmap, lines, raster
from ..ui import (Ctx, default_tensor, download_figure, figure_theme, need, plain, plots,
                  show_chart)

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


def heatmap_rows(ctx: Ctx, ov: Overview, pattern: str, unfold: list[str],
                 all_ops: bool, plumbing: bool = True) -> pd.DataFrame:
    """The rows to draw of ``ov``: its tensors with statistics, filtered, in network order,
    folded; without ``plumbing``, the model's layers only (no loss or label ops)."""
    have = ov.present.any(axis=1) if ov.present is not None and ov.present.size \
        else np.zeros(len(ov.tensors), bool)
    keep = filter_tensors([t for t, h in zip(ov.tensors, have) if h], pattern)
    rows = data.layer_table(ctx.path, ctx.sig, tuple(keep))
    if not plumbing:
        rows = rows[rows["part"] == "model"].reset_index(drop=True)
    return layers.shown_rows(rows, unfold, all_ops)


def hidden_note(ctx: Ctx, ov: Overview, pattern: str, plumbing: bool) -> str:
    """The caption's words for the loss and label ops left out ('' if none are)."""
    if plumbing:
        return ""
    have = [t for t, h in zip(ov.tensors, ov.present.any(axis=1)) if h] \
        if ov.present is not None and ov.present.size else []
    rows = data.layer_table(ctx.path, ctx.sig, tuple(filter_tensors(have, pattern)))
    n = int((rows["part"] != "model").sum())
    return (f"; {n} loss and label op(s) left out (not the model's layers: turn on \"Loss and "
            "label ops\" to draw them)" if n else "")


#: The tabs of the one-tensor series and of the update ratios
SERIES, RATIOS = "One tensor over steps", "Update / weight ratio"
#: The group choice that draws negative / positive of the statistic (a diverging log scale)
RATIO = "negative / positive"
#: The groups whose heatmaps share one colour scale: switching between them keeps the colours
PAIR = ("positive", "negative")


def group_choices(groups: list[str]) -> list[str]:
    """The overview's group choices: the run's groups, and their ratio where it has both.

    >>> group_choices(["all", "positive", "negative"])
    ['all', 'positive', 'negative', 'negative / positive']
    >>> group_choices(["all"])
    ['all']
    """
    return list(groups) + ([RATIO] if set(PAIR) <= set(groups) else [])


def binned_note(binned: bool, width: float, agg: str) -> str:
    """The caption's words for columns that aggregate several statistics steps ('' for one step
    each).

    >>> binned_note(False, 1, "mean")
    ''
    >>> binned_note(True, 16, "max")
    '; each column is a bin of 16 steps (the run has more statistics steps than fit): its max'
    """
    if not binned:
        return ""
    what = {"mean": "the mean of its statistics steps' values (NaN/Inf if any is; pick max or "
                    "min above to see a bin's extreme)",
            "max": "its max", "min": "its min"}[agg]
    return (f"; each column is a bin of {width:.4g} steps (the run has more statistics steps than "
            f"fit): {what}")


def row_texts(shown: pd.DataFrame, groups: list[range], constant: np.ndarray | None = None
              ) -> tuple[list[str], list[str]]:
    """(label, tooltip head) of each drawn row: a shown row, or a run of them drawn as one;
    ``constant``: rows that never change (said in their tooltip).

    >>> shown = pd.DataFrame({"tensor": ["a:0", "b:0"], "label": ["a:0", "b:0"],
    ...                       "layer": ["a", "b"]})
    >>> row_texts(shown, [range(0, 2)])
    (['a:0 (+1 rows)'], ['rows 1-2 of 2, each cell their mean: a:0 ... b:0'])
    """
    tensor, label, layer = (shown[c].astype(str).tolist() for c in ("tensor", "label", "layer"))
    same = np.zeros(len(tensor), bool) if constant is None else constant
    labels, tips = [], []
    for g in groups:
        a, b = g.start, g.stop - 1
        if a == b:
            labels.append(label[a])
            tips.append(f"{label[a]}\nlayer: {layer[a]}"
                        + ("\nthe same at every step: drawn on the colour scale, not setting it"
                           if same[a] else ""))
        else:
            labels.append(f"{label[a]} (+{b - a} rows)")
            tips.append(f"rows {a + 1}-{b + 1} of {len(tensor)}, each cell their mean: {tensor[a]} "
                        f"... {tensor[b]}")
    return labels, tips


def heatmap_block(ctx: Ctx, title: str, kind: str, default_stat: str, key: str, pattern: str,
                  group: str, unfold: list[str], all_ops: bool, own_default: bool,
                  plumbing: bool) -> None:
    """The layer x step heatmap of one statistic (PNG of the same rows on demand)."""
    binned = data.binned(ctx.path, ctx.sig)
    c = st.columns([3, 1, 1] if binned else [3, 1])
    stat = c[0].selectbox(f"{title}: statistic", STATS, index=STATS.index(default_stat),
                          key=f"{key}_stat", bind="query-params")
    own_scale = c[1].toggle("Scale each row on its own", value=own_default, key=f"{key}_rows",
                            disabled=group == RATIO,
                            help="colour each row from its own min to its max (hover for the "
                            "values): one wide row no longer turns every other row one flat colour")
    agg = c[2].selectbox("A bin shows its", raster.AGGREGATES, key=f"{key}_agg",
                         help="mean: from the statistics' summaries (fast); max / min: every "
                         "step read, the bin's extreme drawn") if binned else "mean"
    ov = matrix(ctx.path, ctx.sig, kind, group, stat, agg != "mean")
    shown = heatmap_rows(ctx, ov, pattern, unfold, all_ops, plumbing)
    if not need(len(shown) > 0 and len(ov.steps) > 0, f"No {kind} statistics match this filter."):
        return
    name = f"{kind} {stat} ({'negative / positive' if group == RATIO else f'group {group}'})"
    drawn, caption = heatmap_view(ctx.path, ctx.sig, kind, group, stat, tuple(shown["tensor"]),
                                  tuple(shown["label"]), tuple(shown["layer"]),
                                  own_scale and group != RATIO, agg)
    heatmap.show(drawn, key=f"{key}_map")
    st.caption(caption + hidden_note(ctx, ov, pattern, plumbing))
    index = {t: i for i, t in enumerate(ov.tensors)}
    rows = [index[t] for t in shown["tensor"]]

    def figure():
        log = stat in LOG_STATS or group == RATIO
        with figure_theme():
            return plots.heatmap(ov.matrix[rows], list(shown["label"]), ov.steps, title=name,
                                 log=log, cbar_label=f"{stat}{' (log scale)' if log else ''}")
    download_figure(figure, f"heatmap_{kind}_{stat}_{group.replace(' / ', '_over_')}", key=key)


def matrix(path: str, sig: tuple, kind: str, group: str, stat: str, exact: bool):
    """The overview of ``group`` (or of the groups' ratio)."""
    if group == RATIO:
        return data.group_ratio(path, sig, kind, stat, exact=exact)
    return data.overview(path, sig, kind, group, stat, exact)


def shared_scale(path: str, sig: tuple, kind: str, group: str, stat: str,
                 tensors: tuple[str, ...], log: bool, agg: str) -> tuple[float, float] | None:
    """The colour scale both groups of :data:`PAIR` share on these rows (their union), so the
    positive and negative heatmaps compare colour for colour; None for any other group."""
    if group not in PAIR:
        return None
    lo, hi = np.inf, -np.inf
    for g in PAIR:
        ov = data.overview(path, sig, kind, g, stat, agg != "mean")
        index = {t: i for i, t in enumerate(ov.tensors)}
        idx = [index[t] for t in tensors if t in index]
        if not idx:
            continue
        m, present = ov.matrix[idx], ov.present[idx]
        r = raster.raster(m, present, ov.first_steps, ov.steps, ov.width, log,
                          apart=constant_rows(m, present), agg=agg, max_columns=data.MAX_COLUMNS)
        if r.values.size and np.isfinite(r.values).any():
            lo, hi = min(lo, float(r.domain[0, 0])), max(hi, float(r.domain[0, 1]))
    return (lo, hi) if lo <= hi else None


@st.cache_data(max_entries=16, show_spinner=False)
def heatmap_view(path: str, sig: tuple, kind: str, group: str, stat: str, tensors: tuple[str, ...],
                 labels: tuple[str, ...], layer_names: tuple[str, ...],
                 own_scale: bool, agg: str = "mean") -> tuple[dict, str]:
    """(what the heatmap component draws, the caption) of the rows ``tensors``: computed once per
    choice, so a rerun for another widget sends the same image without drawing it again."""
    ov = matrix(path, sig, kind, group, stat, agg != "mean")
    shown = pd.DataFrame({"tensor": tensors, "label": labels, "layer": layer_names})
    ratio = group == RATIO
    log = stat in LOG_STATS or ratio
    index = {t: i for i, t in enumerate(ov.tensors)}
    idx = [index[t] for t in tensors]
    m, present = ov.matrix[idx], ov.present[idx]
    # a row that never changes (d loss / d loss, 1 at every step; d loss / d xent where the loss
    # adds terms; a weight-decay term's coefficient) would set an end of the shared scale: it is
    # drawn on it, clipped, without setting it
    constant = constant_rows(m, present) if not ratio else np.zeros(len(idx), bool)
    shared = None if own_scale else shared_scale(path, sig, kind, group, stat, tensors, log, agg)
    r = raster.raster(m, present, ov.first_steps, ov.steps, ov.width, log,
                      np.full(len(idx), own_scale), constant, agg=agg, shared=shared,
                      cmap=raster.DIVERGING if ratio else raster.SEQUENTIAL,
                      max_columns=data.MAX_COLUMNS)
    texts = row_texts(shown, r.rows, constant)
    note = ("negative / positive: orange where negatives' is larger, purple where positives' is, "
            "white equal" if ratio else
            "one scale for positive and negative" if shared is not None else "")
    drawn = heatmap.payload(r, *texts, stat, f"{kind} {stat} "
                            + ("(negative / positive)" if ratio else f"(group {group})"), note)
    ordered = data.network_order(path, sig) is not None
    return drawn, heatmap_caption(shown, ov, r, log, own_scale, int(constant.sum()), ordered,
                                  data.binned(path, sig), agg, ratio, shared is not None)


def constant_rows(m: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Rows whose finite values are all one value (to 1e-9 relative).

    >>> constant_rows(np.array([[1.0, 1.0, np.nan], [1.0, 2.0, 3.0]]),
    ...               np.ones((2, 3), bool)).tolist()
    [True, False]
    """
    fin = present & np.isfinite(m)
    lo = np.where(fin, m, np.inf).min(axis=1)
    hi = np.where(fin, m, -np.inf).max(axis=1)
    return fin.any(axis=1) & (hi - lo <= 1e-9 * np.maximum(np.abs(hi), np.abs(lo)))


def heatmap_caption(shown: pd.DataFrame, ov: Overview, r: raster.Raster, log: bool,
                    own_scale: bool, constant: int, ordered: bool, binned: bool = False,
                    agg: str = "mean", ratio: bool = False, pair: bool = False) -> str:
    """What the heatmap shows: rows, steps, aggregation, folding, colours."""
    folded = int(sum(1 for lb in shown["label"] if "(+" in lb))
    drawn = r.values.shape
    merged = len(shown) > drawn[0]
    width = ov.width if agg == "mean" else r.step_px
    out = (f"{len(shown)} rows x {len(ov.steps)} statistics columns (steps "
           f"{int(ov.first_steps[0])} to {int(ov.steps[-1])}), rows in "
           + ("network order" if ordered else "the catalog's order (the run has no readable graph)")
           + (f"; drawn as {drawn[0]} rows of {len(r.rows[0])} (each cell their mean, NaN/Inf or "
              "<= 0 if any is)"
              if merged else "")
           + binned_note(binned, width, agg)
           + (f"; {folded} layers folded into their output row (unfold them above)" if folded
              else ""))
    if ratio:
        scale = ("each cell: the negative group's value over the positive's at that step, on a "
                 "log scale centred on 1 (white: equal)")
    else:
        scale = "each row on its own scale" if own_scale else "one colour scale" + (
            " shared by the positive and negative groups (switch group: the colours compare)"
            if pair else "") + (
            f" ({constant} row(s) the same at every step, such as the loss's gradient, drawn on "
            "it without setting it)"
            if constant else "")
    return (out + f"; {scale}; red = NaN/Inf"
            + ("; grey = <= 0, which a log scale cannot place" if log else "")
            + "; blank = no statistics at those steps; hover for values")


def render(ctx: Ctx) -> None:
    st.header("Training overview")
    run = data.get_run(ctx.path, ctx.sig)
    if not need(len(data.stats_steps(ctx.path, ctx.sig)) > 0,
                "This run has no statistics yet; nothing to plot. Press Refresh while it trains."):
        return
    c1, c2 = st.columns([3, 1])
    pattern = c1.text_input("Filter tensors (regex or substring on the name)", key="ov_filter",
                            bind="query-params", placeholder="e.g. Relu|icnn")
    group = c2.selectbox("Group", group_choices(run.groups), key="ov_group", bind="query-params",
                         help="positive and negative share one colour scale; negative / positive "
                         "draws their ratio per layer and step (log scale, white = equal)")
    unfold, all_ops, plumbing = fold_controls(ctx, pattern)
    # only the open tab is drawn (each reads its own matrix; the browser renders one view)
    ratios = not data.update_ratios(ctx.path, ctx.sig).empty
    # a link naming the series' tensor opens on the series
    tabs = st.tabs(["Gradients", "Activations", SERIES] + ([RATIOS] if ratios else []),
                   default=SERIES if "ov_tensor" in st.query_params else None, key="ov_tab",
                   on_change="rerun")
    if tabs[0].open:
        with tabs[0]:
            heatmap_block(ctx, "Gradient", "gradient", "l2", "ov_hm_grad", pattern, group, unfold,
                          all_ops, False, plumbing)
    if tabs[1].open:
        with tabs[1]:
            heatmap_block(ctx, "Activation", "forward", "mean", "ov_hm_fwd", pattern, group, unfold,
                          all_ops, False, plumbing)
    if tabs[2].open:
        with tabs[2]:
            series_block(ctx, pattern)
    if ratios and tabs[3].open:
        with tabs[3]:
            update_ratio_block(ctx, pattern)


def series_block(ctx: Ctx, pattern: str) -> None:
    """One tensor's statistic over steps, one line per group (positive vs negative)."""
    run = data.get_run(ctx.path, ctx.sig)
    st.subheader("One tensor over steps, positive vs negative")
    names = filter_tensors(list(run.tensors["name"]), pattern) or list(run.tensors["name"])
    c = st.columns([3, 1, 1, 1, 1])
    tensor = c[0].selectbox("Tensor", names, index=default_tensor(names), key="ov_tensor",
                            bind="query-params")
    row = run.tensors.loc[tensor]
    kinds = ["forward"] + (["gradient"] if bool(row["has_gradient"]) else []) + (
        ["update"] if bool(row["has_update"]) else [])
    kind = c[1].radio("Kind", kinds, key="ov_kind", bind="query-params", horizontal=True)
    stat = c[2].selectbox("Statistic", STATS, index=STATS.index("mean"), key="ov_series_stat",
                          bind="query-params")
    logy = c[3].toggle("Log y", value=stat in LOG_STATS, key="ov_logy")
    smoothing = smoothing_slider(c[4], "ov_smooth")
    df = data.series(ctx.path, ctx.sig, tensor, kind, stat)
    if not need(not df.empty, f"No {kind} statistics for {plain(tensor)}."):
        return
    show_chart(lambda: lines.line_chart(df, stat, colors=lines.group_colors(list(df.columns)),
                                        log=logy, smoothing=smoothing, legend_title="group"),
               ("series", ctx.path, ctx.sig, tensor, kind, stat, logy, smoothing), width="stretch")
    if logy and (df <= 0).any().any():
        st.caption("log axis: zero and negative values are not drawn")
    last = df.iloc[-1]
    st.caption(f"{plain(tensor)} {kind} {stat} at step {int(df.index[-1])}: "
               + ", ".join(f"{plain(g)} {v:.4g}" for g, v in last.items()))
    download_figure(lambda: plots.time_series(df, f"{tensor} {kind} {stat}", stat, log=logy),
                    f"series_{tensor}_{kind}_{stat}", key="ov_series")


def smoothing_slider(where, key: str) -> float:
    """TensorBoard's smoothing weight (0: none): an exponential moving average of each line."""
    return float(where.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key=key,
                              help="exponential moving average, debiased (as TensorBoard); the raw "
                                   "line stays faint"))


def fold_controls(ctx: Ctx, pattern: str) -> tuple[list[str], bool, bool]:
    """Which layers to unfold (every op of them drawn), or every op of every layer; whether the
    loss's and the labels' ops are drawn too (off: the model's layers only)."""
    catalog = data.get_run(ctx.path, ctx.sig).tensors
    rows = data.layer_table(ctx.path, ctx.sig,
                            tuple(filter_tensors(list(catalog["name"]), pattern)))
    sizes = rows.groupby("layer", sort=False).size()
    multi = [str(ly) for ly, n in sizes.items() if n > 1]
    c1, c2, c3 = st.columns([3, 1, 1])
    unfold = c1.multiselect("Unfold layers (folded: one row, the layer's output)", multi,
                            key="ov_unfold", bind="query-params",
                            help="a layer's internal ops (e.g. an ICNN layer's helper ops) "
                            "are folded into its output row by default")
    all_ops = c2.toggle("Every op", key="ov_all_ops", bind="query-params",
                        help="unfold every layer")
    plumbing = c3.toggle("Loss and label ops", key="ov_plumbing", bind="query-params",
                         help="also draw the ops of the loss (cross-entropy, weight decay, their "
                         "sum) and of the labels (a cast): they are not the model's layers")
    return unfold, all_ops, plumbing


def update_ratio_block(ctx: Ctx, pattern: str) -> None:
    """|update| / |weights| per variable over steps, log axis (runs with variable records only)."""
    ratios = data.update_ratios(ctx.path, ctx.sig)
    if ratios.empty:
        return
    st.subheader("Update / weight ratio per variable")
    shown = ratios[filter_tensors(list(ratios.columns), pattern) or list(ratios.columns)]
    c = st.columns([3, 1])
    picked = c[0].selectbox("Highlight", ["(none)", *map(str, shown.columns)], key="ov_ratio_pick",
                            help="draw one variable bold and the others faint")
    smoothing = smoothing_slider(c[1], "ov_ratio_smooth")
    show_chart(lambda: lines.line_chart(shown, "L2 update / L2 weights", log=True,
                                        smoothing=smoothing, legend_title="variable",
                                        highlight=None if picked == "(none)" else picked),
               ("ratios", ctx.path, ctx.sig, tuple(shown.columns), smoothing, picked),
               width="stretch")
    st.caption("L2 of the step's update over L2 of the variable "
               f"{weights_when(data.get_run(ctx.path, ctx.sig))} (around 1e-3 is typical for SGD); "
               "the tensor filter above applies")


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
