"""Page: distributions of one tensor: histograms per sample group (positive/negative, classes, named
groups) at a step (in-graph and from dumped samples) and across steps (ridge plot), drawn as
interactive Vega-Lite charts (:mod:`viewer.hist_charts`; the Matplotlib figure is drawn only for
its PNG download)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from inspector import analysis, plots
from inspector.binning import Bins, value_bins
from inspector.format import histogram_sample

from . import bands, data, hist_charts
from .dumps import dump_step_picker
from .ui import Ctx, default_tensor, download_figure, need, plain


def kinds_of(run, tensor: str) -> list[str]:
    return ["forward"] + (["gradient"] if bool(run.tensors.loc[tensor, "has_gradient"]) else [])


def pick_groups(hists: dict) -> dict:
    """The named groups (positive/negative, classes, a function's) where the tensor has them, else 'all'."""
    named = {g: h for g, h in hists.items() if g != "all"}
    return named or hists


def evenly(values: np.ndarray, n: int) -> list[int]:
    """``n`` values spread evenly over sorted ``values`` (first and last included)."""
    if len(values) <= n:
        return [int(v) for v in values]
    return [int(values[i]) for i in np.unique(np.linspace(0, len(values) - 1, n).round().astype(int))]


BIN_LABELS = {"auto": "auto", "linear": "linear", "symlog": "symmetric log"}


def bins_choice(key: str, container=st) -> str:
    """How to re-bin dumped values: 'auto' (symmetric log for long-tailed values), 'linear'
    or 'symlog' (:mod:`inspector.binning`)."""
    return container.radio("Bins of dumped values", list(BIN_LABELS), format_func=BIN_LABELS.get, key=key,
                           horizontal=True, help="symmetric log: bins spaced geometrically in |x| on both "
                           "sides of a small linear zone around 0 (like TensorBoard's exponential buckets), "
                           "so a long-tailed gradient is not one spike")


def bins_caption(bins: Bins) -> str:
    """What the bins are, for the figure's caption."""
    if bins.scale == "symlog":
        return (f"{len(bins.edges) - 1} symmetric-log bins (linear within ±{bins.linthresh:.2g}); "
                f"y = fraction of values per bin")
    return f"{len(bins.edges) - 1} equal bins"


def totals_of(path: str, sig: tuple, tensor: str, step: int, kinds: list[str], column: str = "count") -> dict:
    """{kind: {group: real element count}} at ``step`` (legends state it beside the histogram's);
    ``column="mean"``: the exact means."""
    return {k: data.histogram_totals(path, sig, tensor, (step,), k, column).get(step, {}) for k in kinds}


def sample_of_step(ctx: Ctx, run, tensor: str, step: int, kinds: list[str]) -> int:
    """The histogram subsample size of the writer session whose rows of ``tensor`` hold ``step``
    (a run resumed by another version mixes 65,536 and 16,384); the run's latest otherwise."""
    for kind in kinds:
        df = data.tensor_histograms(ctx.path, ctx.sig, tensor, kind)
        rows = df[df["step"] == step]
        if not rows.empty and {"worker", "session"} <= set(rows.columns):
            m = run.manifests.get((str(rows["worker"].iloc[-1]), int(rows["session"].iloc[-1])))
            if m is not None:
                return histogram_sample(m.get("config", {}))
    return histogram_sample(run.config)


def render(ctx: Ctx) -> None:
    st.header("Distributions")
    run = data.get_run(ctx.path, ctx.sig)
    steps = data.stats_steps(ctx.path, ctx.sig)
    if not need(len(steps) > 0 and not run.tensors.empty, "This run has no statistics yet."):
        return
    names = list(run.tensors["name"])
    c1, c2 = st.columns([2, 3])
    tensor = c1.selectbox("Tensor", names, index=default_tensor(names),
                          key="di_tensor", bind="query-params")
    step = c2.select_slider("Step", options=[int(s) for s in steps], value=int(steps[-1]), key="di_step",
                            bind="query-params")
    kinds = kinds_of(run, tensor)
    log = st.toggle("Log density", key="di_log", help="a log y axis (empty bins at its floor); the ridge plot: "
                    "log10 density per row")

    st.subheader(f"In-graph histograms at step {step}")
    panels = {kind: pick_groups(data.histograms(ctx.path, ctx.sig, tensor, (step,), kind).get(step, {}))
              for kind in kinds}
    totals = totals_of(ctx.path, ctx.sig, tensor, step, kinds)
    title = f"{tensor} @ step {step}"
    st.altair_chart(hist_charts.histogram_chart(panels, title=title, log=log, totals=totals), width="stretch")
    download_figure(lambda: plots.histograms(panels, title=title, log=log, totals=totals), f"hist_{tensor}_{step}",
                    key="di_hist")
    st.caption(hist_caption(panels, totals, totals_of(ctx.path, ctx.sig, tensor, step, kinds, "mean"),
                            sample_of_step(ctx, run, tensor, step, kinds)))

    st.subheader("From dumped samples")
    if len(run.steps) > 0:
        c1, c2 = st.columns([2, 3])
        dstep = dump_step_picker(ctx, "Dump step", "di_dump_step", near=step, container=c1,
                                 help="defaults to the readable dump nearest the chosen step")
        sample_hist(ctx, run, tensor, dstep, kinds, log, bins_choice("di_bins", c2))
    else:
        need(False, "No full dumps in this run (the hook dumps every dump_every_n_steps).")

    st.subheader("Across steps")
    c1, c2 = st.columns(2)
    rkind = c1.radio("Kind", kinds, key="di_ridge_kind", bind="query-params", horizontal=True)
    n = c2.slider("Number of steps", 3, 24, 10, key="di_ridge_n")
    chosen = tuple(evenly(steps, n))
    rows = {s: pick_groups(g) for s, g in data.histograms(ctx.path, ctx.sig, tensor, chosen, rkind).items()}
    title = f"{tensor} {rkind}: histograms over steps"
    st.altair_chart(hist_charts.ridge_chart(rows, title=title, log=log), width="stretch",
                    height=hist_charts.ridge_height(len(rows)) + 110)  # + title, legend and axis
    download_figure(lambda: plots.ridge(rows, title=title, log=log), f"ridge_{tensor}_{rkind}", key="di_ridge")
    percentile_bands(ctx, tensor, rkind, steps)


def percentile_bands(ctx: Ctx, tensor: str, kind: str, steps: np.ndarray) -> None:
    """TensorBoard-style bands over every statistics step, positive and negative overlaid."""
    st.subheader("Percentile bands over steps")
    chosen = tuple(int(s) for s in steps)
    hists = data.histograms(ctx.path, ctx.sig, tensor, chosen, kind)
    low, high = (data.histogram_totals(ctx.path, ctx.sig, tensor, chosen, kind, c) for c in ("min", "max"))
    extremes = {s: {g: (low[s][g], high.get(s, {}).get(g, np.nan)) for g in low[s]} for s in low}
    frame = bands.percentile_frame({s: pick_groups(g) for s, g in hists.items()}, extremes=extremes)
    if not need(not frame.empty, f"No {kind} histograms of {plain(tensor)}."):
        return
    st.altair_chart(bands.bands_chart(frame, plots.GROUP_COLORS, f"{tensor} {kind}"), width="stretch")
    st.caption("bands: percentiles 0-100, 7-93, 16-84 (lighter outside; the median in the tooltip), per group. "
               "0 and 100 are the statistics' exact min and max of the finite values. The statistics hold no "
               "other percentiles: these are derived from the stored in-graph histograms, linear within a bin "
               "(exact to one bin width; for a tensor over the histogram's sample size, of the values it "
               "sampled, as the histograms above). Scroll to zoom the steps.")


def hist_caption(panels: dict, totals: dict, means: dict, sample: int) -> str:
    """Per kind and group: the real element count, the values the histogram counts, and the
    exact mean from the statistics (a histogram's bin centres would give one bin's centre for
    every group whose mass falls in one bin: equal where the groups differ). ``sample``: the
    run's histogram subsample size (``format.histogram_sample``)."""
    desc = []
    # the subsample rule reads the 'all' row's count (FORMAT.md), also for the groups
    sampled = any(t.get("all", max(t.values(), default=0)) > sample for t in totals.values())
    for kind, groups in panels.items():
        for g, (_, counts) in groups.items():
            n, mean = totals.get(kind, {}).get(g), means.get(kind, {}).get(g)
            desc.append(f"{kind} {plain(g)}: n={int(counts.sum()) if n is None else n:,}"
                        + (f", mean={mean:.4g}" if mean is not None else ""))
    note = (f" (tensors over {sample:,} elements: the histogram counts a subsample of about "
            f"{sample:,} values; n is every element)") if sampled else ""
    return "; ".join(desc) + note


def sample_hist(ctx: Ctx, run, tensor: str, step: int, kinds: list[str], log: bool, scale: str) -> None:
    if not bool(run.tensors.loc[tensor, "batched"]):
        st.caption(f"{plain(tensor)} has no batch dimension: no per-sample split.")
    groups = data.sample_groups(data.samples(ctx.path, ctx.sig, step, tensor))
    panels, xscale, shown = {}, {}, []
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    for kind in kinds:
        if f"{kind}/{tensor}" not in keys:
            continue
        x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
        if groups is not None and bool(run.tensors.loc[tensor, "batched"]) and len(x) == len(groups):
            split = analysis.split_by_group(x, groups, run.groups)
        else:
            split = {"all": x}
        bins = value_bins(*split.values(), scale=scale)
        panels[kind] = {g: plots.hist_from_values(v, bins.edges) for g, v in split.items() if v.size}
        if bins.scale == "symlog":
            xscale[kind] = bins.linthresh
        shown.append(f"{kind}: {bins_caption(bins)}")
    if need(bool(panels), f"The dump of step {step} holds no values of {plain(tensor)}."):
        title = f"{tensor} @ dump step {step} (dumped samples)"
        st.altair_chart(hist_charts.histogram_chart(panels, title=title, log=log, xscale=xscale), width="stretch")
        st.caption("; ".join(shown))
        download_figure(lambda: plots.histograms(panels, title=title, log=log, xscale=xscale),
                        f"samples_hist_{tensor}_{step}", key="di_samples")
