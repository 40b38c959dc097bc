"""Page: distributions of one tensor: histograms per sample group (positive/negative, classes, named
groups) at a step (in-graph, and from dumped samples in a tab of their own), across steps (ridge
plot) and as percentile bands, drawn as interactive Vega-Lite charts
(:mod:`viewer.charts.hist_charts`; the Matplotlib figure is drawn only for its PNG download) on
the axes of :mod:`inspector.analysis.hist_view`: a signed log-magnitude axis for gradients, a
linear one for forward values where it shows them (the "x axis" choice)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from inspector import analysis
from inspector.analysis import hist_view
from inspector.analysis.binning import value_histograms
from inspector.format import histogram_sample
from inspector.analysis.hist_view import Axis

from .. import data
from ..charts import bands, hist_charts
from ..dumps import dump_step_picker
from ..hist_choices import NOUNS, axis_choice, kinds_of, pick_groups, rebinned
from ..ui import Ctx, default_tensor, download_figure, need, plain, plots, show_chart


def evenly(values: np.ndarray, n: int) -> list[int]:
    """``n`` values spread evenly over sorted ``values`` (first and last included)."""
    if len(values) <= n:
        return [int(v) for v in values]
    return [int(values[i])
            for i in np.unique(np.linspace(0, len(values) - 1, n).round().astype(int))]


def totals_of(path: str, sig: tuple, tensor: str, step: int, kinds: list[str],
              column: str = "count") -> dict:
    """{kind: {group: real element count}} at ``step`` (legends state it beside the histogram's);
    ``column="mean"``: the exact means."""
    return {k: data.histogram_totals(path, sig, tensor, (step,), k, column).get(step, {})
            for k in kinds}


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
    step = c2.select_slider("Step", options=[int(s) for s in steps], value=int(steps[-1]),
                            key="di_step", bind="query-params")
    kinds = kinds_of(run, tensor)
    c1, c2 = st.columns([2, 3])
    scale = axis_choice("di_xaxis", c1)
    log = c2.toggle("Log y", key="di_log",
                    help="a log y axis (empty bins at its floor); the ridge plot: log10 "
                         "fraction per row")

    # only the open tab is drawn: the browser renders one chart, not four (its first Vega-Lite
    # chart is most of a page's cost); a link naming a tab's own choice opens on that tab
    now, dumped, over, spread = st.tabs(TABS, key="di_tab", default=opening_tab(st.query_params),
                                        on_change="rerun")
    if now.open:
        with now:
            at_step(ctx, run, tensor, step, kinds, scale, log)
    if dumped.open:
        with dumped:
            dumped_samples(ctx, run, tensor, step, kinds, scale, log)
    if over.open or spread.open:
        with over if over.open else spread:
            c1, c2 = st.columns(2)
            rkind = c1.radio("Kind", kinds, key="di_ridge_kind", bind="query-params",
                             horizontal=True)
            if over.open:
                n = c2.slider("Number of steps", 3, 24, 10, key="di_ridge_n")
                ridge(ctx, tensor, rkind, steps, n, step_axes(ctx, tensor, step, kinds, scale),
                      scale, log)
            else:
                percentile_bands(ctx, tensor, rkind, steps)


#: The page's tabs: the in-graph histograms at the step, the dumped samples' nearest it, the
#: ridge plot, the percentile bands
TABS = ("At the step", "Dumped samples", "Across steps", "Percentile bands")


def opening_tab(query) -> str | None:
    """The tab a link opens on: the one whose own choice it names (None: the first).

    >>> opening_tab({"di_dump_step": "20"}), opening_tab({"di_ridge_kind": "gradient"})
    ('Dumped samples', 'Across steps')
    """
    if "di_ridge_kind" in query:
        return TABS[2]
    return TABS[1] if "di_dump_step" in query else None


def step_panels(ctx: Ctx, tensor: str, step: int, kinds: list[str]) -> dict:
    """{kind: {group: in-graph histogram}} at ``step``."""
    return {kind: pick_groups(
                data.histograms(ctx.path, ctx.sig, tensor, (step,), kind).get(step, {}))
            for kind in kinds}


def step_axes(ctx: Ctx, tensor: str, step: int, kinds: list[str], scale: str) -> dict[str, Axis]:
    """The in-graph panels' axes at ``step`` (``scale``: the x axis choice; auto decides here)."""
    return {kind: hist_view.choose_axis(groups.values(), kind, scale,
                                        data.extent(ctx.path, ctx.sig, tensor, (step,), kind,
                                                    groups))
            for kind, groups in step_panels(ctx, tensor, step, kinds).items()}


def at_step(ctx: Ctx, run, tensor: str, step: int, kinds: list[str], scale: str,
            log: bool) -> None:
    """The in-graph histograms at ``step``."""
    st.subheader(f"In-graph histograms at step {step}")
    panels = step_panels(ctx, tensor, step, kinds)
    axes = step_axes(ctx, tensor, step, kinds, scale)
    totals = totals_of(ctx.path, ctx.sig, tensor, step, kinds)
    title = f"{tensor} @ step {step}"
    draw_panels(panels, axes, title, log, totals, f"hist_{tensor}_{step}", "di_hist",
                ("in-graph", ctx.path, ctx.sig, tensor, step, scale))
    st.caption(hist_caption(panels, totals,
                            totals_of(ctx.path, ctx.sig, tensor, step, kinds, "mean"),
                            sample_of_step(ctx, run, tensor, step, kinds)))


def dumped_samples(ctx: Ctx, run, tensor: str, step: int, kinds: list[str], scale: str,
                   log: bool) -> None:
    """The dumped samples' histograms of the dump nearest ``step``, on the in-graph panels' kind
    of axis (``auto`` decided there), so a tensor's histograms read alike."""
    st.subheader("From dumped samples")
    if not need(len(run.steps) > 0,
                "No full dumps in this run (the hook dumps every dump_every_n_steps)."):
        return
    dstep = dump_step_picker(ctx, "Dump step", "di_dump_step", near=step,
                             container=st.columns([2, 3])[0],
                             help="defaults to the readable dump nearest the chosen step")
    axes = step_axes(ctx, tensor, step, kinds, scale)
    scales = {k: scale if scale != "auto" else axes[k].scale for k in kinds}
    sample_hist(ctx, run, tensor, dstep, kinds, log, scales)


def ridge(ctx: Ctx, tensor: str, rkind: str, steps: np.ndarray, n: int, axes: dict[str, Axis],
          scale: str, log: bool) -> None:
    """Histograms of ``n`` steps spread over the run, one row each, on the step panel's kind of
    axis (auto decided there), over every row shown."""
    chosen = tuple(evenly(steps, n))
    rows = {s: pick_groups(g)
            for s, g in data.histograms(ctx.path, ctx.sig, tensor, chosen, rkind).items()}
    every = [h for g in rows.values() for h in g.values()]
    groups = {g for r in rows.values() for g in r}
    axis = hist_view.choose_axis(every, rkind, axes[rkind].scale if rkind in axes else scale,
                                 data.extent(ctx.path, ctx.sig, tensor, chosen, rkind, groups))
    title = f"{tensor} {rkind}: histograms over steps"
    show_chart(lambda: hist_charts.ridge_chart(hist_view.ridge_frame(rows, axis, log=log), axis,
                                               list(rows), title=title, log=log),
               ("ridge", ctx.path, ctx.sig, tensor, rkind, chosen, repr(axis), log),
               width="stretch",
               height=hist_charts.ridge_height(len(rows)) + 110)  # + title, legend and axis
    download_figure(lambda: plots.ridge(rows, title=title, log=log, axis=axis),
                    f"ridge_{tensor}_{rkind}", key="di_ridge")
    st.caption(hist_view.axis_caption(axis, rebinned=rebinned(every)))


def draw_panels(panels: dict, axes: dict[str, Axis], title: str, log: bool, totals: dict | None,
                name: str, key: str, ident: tuple) -> None:
    """The panels (one per kind) as one interactive chart, its PNG on download, and a caption
    saying what the bars are and reading off the groups' sizes (:func:`readoff`); ``ident``
    names what the panels show (:func:`viewer.ui.show_chart`). A kind whose histograms count no
    value (every value NaN/Inf at that step) gets a line saying so, not an empty panel: Vega-Lite
    lays out a panel without data and an empty colour domain as a collapsed chart, and the
    other panels with it."""
    empty = [kind for kind, groups in panels.items()
             if not any(hist_view.counted(h) for h in groups.values())]
    for kind in empty:
        st.warning(f"**{kind}**: no histogram: no finite value counted at this step (every value "
                   "NaN or Inf; the statistics' nan and inf counts say which)")
    panels = {kind: groups for kind, groups in panels.items() if kind not in empty}
    if not panels:
        return
    frames = {kind: (hist_view.panel_frame({"": groups}, axes[kind],
                                           {"": (totals or {}).get(kind, {})}), axes[kind])
              for kind, groups in panels.items()}
    show_chart(lambda: hist_charts.histogram_chart(frames, title=title, log=log),
               ("panels", *ident, log), width="stretch")
    download_figure(lambda: plots.histograms(panels, title=title, log=log, totals=totals,
                                             axes=axes), name, key=key)
    st.caption("; ".join(
        f"{kind}: {hist_view.axis_caption(axes[kind], rebinned=rebinned(groups.values()))}"
        for kind, groups in panels.items()))
    lines = {kind: readoff(kind, groups) for kind, groups in panels.items()}
    if any(lines.values()):
        st.markdown("  \n".join(f"**{kind}**: {plain(text)}"
                                for kind, text in lines.items() if text))


def readoff(kind: str, groups: dict) -> str:
    """'median non-zero |gradient|: positive 0.0021, negative 0.00021 (negative / positive:
    0.1x ...)': what lets a reader say one group's values are 10x smaller ("" for equal-width
    histograms)."""
    return hist_view.ratio_text(hist_view.magnitude_summary(groups), NOUNS.get(kind, kind))


def percentile_bands(ctx: Ctx, tensor: str, kind: str, steps: np.ndarray) -> None:
    """TensorBoard-style bands over every statistics step, the groups overlaid, medians as lines."""
    st.subheader("Percentile bands over steps")
    chosen = tuple(int(s) for s in steps)
    hists = data.histograms(ctx.path, ctx.sig, tensor, chosen, kind)
    low, high = (data.histogram_totals(ctx.path, ctx.sig, tensor, chosen, kind, c)
                 for c in ("min", "max"))
    extremes = {s: {g: (low[s][g], high.get(s, {}).get(g, np.nan)) for g in low[s]} for s in low}
    frame = bands.percentile_frame({s: pick_groups(g) for s, g in hists.items()}, extremes=extremes)
    if not need(not frame.empty, f"No {kind} histograms of {plain(tensor)}."):
        return
    symlog = st.toggle("Symmetric-log y", key="di_bands_symlog", value=False,
                       help="a symmetric-log value axis over every band (linear near 0): for "
                            "gradients whose steps span decades")
    show_chart(lambda: bands.bands_chart(frame, f"{tensor} {kind}", symlog=symlog),
               ("bands", ctx.path, ctx.sig, tensor, kind, symlog), width="stretch")
    buckets = rebinned(h for g in hists.values() for h in g.values())
    _, _, clipped = bands.y_range(frame)
    how = ("the stored log-magnitude histograms' quantiles (each within "
           f"{hist_view.RELATIVE_ERROR:.1%} of the exact percentile of the values a histogram "
           "counts)" if buckets else
           "the stored equal-width histograms (a run before format version 4), linear within a bin "
           "(exact to one bin width)")
    note = (" The y range is the 7th-93rd percentiles' (padded): the 0-100 band runs past it, "
            "clipped at the chart's edges (hover for its values, or switch on symmetric-log y)."
            if clipped and not symlog else "")
    st.caption("bands: percentiles 0-100, 7-93, 16-84 (lighter outside), the median as a line, per "
               "group. 0 and 100 are the statistics' exact min and max of the finite values; the "
               f"others are from {how} (for a tensor over the histogram's sample size, of the "
               "values it sampled). Scroll to zoom the steps."
               + note)


def hist_caption(panels: dict, totals: dict, means: dict, sample: int) -> str:
    """Per kind and group: the real element count, the values the histogram counts, and the
    exact mean from the statistics (a histogram's bin centres would give one bin's centre for
    every group whose mass falls in one bin: equal where the groups differ). ``sample``: the
    run's histogram subsample size (``format.histogram_sample``)."""
    desc = []
    # the subsample rule reads the 'all' row's count (FORMAT.md), also for the groups
    sampled = any(t.get("all", max(t.values(), default=0)) > sample for t in totals.values())
    for kind, groups in panels.items():
        for g, h in groups.items():
            n, mean = totals.get(kind, {}).get(g), means.get(kind, {}).get(g)
            desc.append(f"{kind} {plain(g)}: n={hist_view.counted(h) if n is None else n:,}"
                        + (f", mean={mean:.4g}" if mean is not None else ""))
    note = (f" (tensors over {sample:,} elements: the histogram counts a subsample of about "
            f"{sample:,} values; n is every element)") if sampled else ""
    return "; ".join(desc) + note


def sample_hist(ctx: Ctx, run, tensor: str, step: int, kinds: list[str], log: bool,
                scales: dict[str, str]) -> None:
    """The dumped values of ``step`` per group, counted in the statistics' log-magnitude buckets
    and drawn on ``scales[kind]`` axes (the in-graph histograms' kind of axis)."""
    if not bool(run.tensors.loc[tensor, "batched"]):
        st.caption(f"{plain(tensor)} has no batch dimension: no per-sample split.")
    groups = data.sample_groups(data.samples(ctx.path, ctx.sig, step, tensor))
    panels, axes = {}, {}
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    for kind in kinds:
        if f"{kind}/{tensor}" not in keys:
            continue
        x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
        if groups is not None and bool(run.tensors.loc[tensor, "batched"]) \
                and len(x) == len(groups):
            split = analysis.split_by_group(x, groups, run.groups)
        else:
            split = {"all": x}
        hists, ext = value_histograms(split)
        if hists:
            panels[kind] = hists
            axes[kind] = hist_view.choose_axis(hists.values(), kind, scales[kind], ext)
    if need(bool(panels), f"The dump of step {step} holds no values of {plain(tensor)}."):
        draw_panels(panels, axes, f"{tensor} @ dump step {step} (dumped samples)", log, None,
                    f"samples_hist_{tensor}_{step}", "di_samples",
                    ("samples", ctx.path, ctx.sig, tensor, step, tuple(sorted(scales.items()))))
