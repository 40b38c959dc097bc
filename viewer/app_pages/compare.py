"""Page: compare two steps of one run, or the same tensor in two runs: the histograms of both on
one axis (A solid, B dashed, a colour per group), their statistics side by side."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from inspector.analysis import hist_view
from inspector.errors import InspectorError
from inspector.format.loghist import RELATIVE_ERROR

from .. import data
from ..charts import hist_charts, lines
from ..hist_choices import NOUNS, axis_choice, kinds_of, pick_groups, rebinned
from ..ui import Ctx, default_tensor, download_figure, need, plain, plots, show_chart

TABLE_STATS = ["count", "mean", "std", "min", "max", "l2", "zero_fraction", "nan", "inf"]


def stats_at(path: str, sig: tuple, tensor: str, step: int, kind: str) -> pd.DataFrame:
    """Scalar statistics of ``tensor`` at ``step``, one row per group (cut from
    :func:`tensor_stats`: steps A and B cost one read)."""
    df = tensor_stats(path, sig, tensor, kind)
    df = df[df["step"] == step]
    return df.set_index(df["group"].astype(str))[TABLE_STATS]


@st.cache_data(max_entries=16, show_spinner=False)
def tensor_stats(path: str, sig: tuple, tensor: str, kind: str) -> pd.DataFrame:
    """Every step's :data:`TABLE_STATS` of ``tensor`` / ``kind``: a one-step Parquet read costs
    about as much as an all-steps read (the column chunks are read whole)."""
    return data.get_run(path, sig).query_stats([tensor], kinds=[kind], columns=TABLE_STATS)


def opening_tensor(names: list[str], loss: str | None) -> int:
    """Index of the tensor Compare opens on: the loss (what a comparison of steps or runs asks
    about first), else :func:`viewer.ui.default_tensor`.

    >>> opening_tensor(["c/Relu:0", "loss:0"], "loss:0"), opening_tensor(["c/Relu:0"], "loss:0")
    (1, 0)
    """
    return names.index(loss) if loss in names else default_tensor(names)


def stats_table(a: pd.DataFrame, b: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """Steps A's and B's statistics side by side, one column per group and step, the numbers as
    text (counts whole, the rest 4 significant digits) so a static table stays narrow."""
    table = pd.DataFrame({f"{g} @ {s}": frame.loc[g] for g in a.index
                          for s, frame in zip(steps, (a, b)) if g in frame.index})
    whole = {"count", "nan", "inf"}
    return pd.DataFrame({c: [f"{v:,.0f}" if r in whole and pd.notna(v) else f"{v:.4g}"
                             for r, v in table[c].items()] for c in table.columns},
                        index=table.index)


def render(ctx: Ctx) -> None:
    st.header("Compare")
    mode = st.radio("Compare", ["Two steps of this run", "Same tensor in two runs"],
                    horizontal=True, key="cmp_mode", bind="query-params")
    if mode == "Two steps of this run":
        two_steps(ctx)
    else:
        two_runs(ctx)


def two_steps(ctx: Ctx) -> None:
    run = data.get_run(ctx.path, ctx.sig)
    steps = [int(s) for s in data.stats_steps(ctx.path, ctx.sig)]
    if not need(len(steps) > 0, "This run has no statistics yet."):
        return
    names = list(run.tensors["name"])
    c = st.columns([3, 1])
    tensor = c[0].selectbox("Tensor", names, index=opening_tensor(names, run.manifest.get("loss")),
                            key="cmp_tensor", bind="query-params")
    kind = c[1].radio("Kind", kinds_of(run, tensor), key="cmp_kind", bind="query-params",
                      horizontal=True)
    cols = st.columns(2)
    picked = [cols[i].select_slider(f"Step {side}", options=steps, value=default,
                                    key=f"cmp_step_{side}", bind="query-params")
              for i, (side, default) in enumerate((("A", steps[0]), ("B", steps[-1])))]
    sides = {f"{side}: step {s}": (ctx.path, ctx.sig, s) for side, s in zip("AB", picked)}
    overlay(sides, tensor, kind, f"{tensor} {kind}: step {picked[0]} (A) and {picked[1]} (B)",
            f"cmp_{tensor}_{picked[0]}_{picked[1]}", "cmp_hist", "cmp_xaxis")
    a, b = (stats_at(ctx.path, ctx.sig, tensor, s, kind) for s in picked)
    # a static table: every column and the statistics' names whole, no frame cutting them
    st.table(stats_table(a, b, picked), border="horizontal")
    st.caption(f"{kind} statistics of {plain(tensor)} at step {picked[0]} (A) and {picked[1]} (B), "
               "per group")


def two_runs(ctx: Ctx) -> None:
    others = list(ctx.runs)
    if not need(len(others) >= 2, "Comparing runs needs two runs: the runs folder (or the folder "
                f"given in the sidebar) holds {len(others)}. Give a folder holding several runs."):
        return
    run_a = data.get_run(ctx.path, ctx.sig)
    c = st.columns(2)
    c[0].markdown(f"**Run A**: {plain(Path(ctx.path).name)} (chosen in the sidebar)")
    others = [r for r in others if r != ctx.path]  # B is another run than A
    path_b = c[1].selectbox("Run B", others, index=0, format_func=lambda p: Path(p).name,
                            key="cmp_run_b", bind="query-params")
    sig_b = data.same_view(data.signature(path_b), ctx.sig)   # B in A's mode, eval batch and worker
    try:
        run_b = data.get_run(path_b, sig_b)
    except InspectorError as e:   # e.g. the worker chosen for A wrote nothing in B
        need(False, f"Run B cannot be shown in this view: {plain(e)}")
        return
    common = [n for n in run_a.tensors["name"] if n in set(run_b.tensors["name"])]
    if not need(bool(common), "The two runs share no tensor name."):
        return
    c = st.columns([3, 1, 1, 1])
    tensor = c[0].selectbox("Tensor (in both runs)", common, key="cmp_run_tensor",
                            bind="query-params",
                            index=opening_tensor(common, run_a.manifest.get("loss")))
    kind = c[1].radio("Kind", kinds_of(run_a, tensor), key="cmp_run_kind", bind="query-params",
                      horizontal=True)
    stat = c[2].selectbox("Statistic", TABLE_STATS[1:], index=TABLE_STATS.index("mean") - 1,
                          key="cmp_run_stat", bind="query-params")
    groups = list(dict.fromkeys([*run_a.groups, *run_b.groups]))
    group = c[3].selectbox("Group", groups, key="cmp_run_group", bind="query-params")
    sa = data.series(ctx.path, ctx.sig, tensor, kind, stat)
    sb = data.series(path_b, sig_b, tensor, kind, stat)
    if not need(group in sa and group in sb, f"Both runs need {kind} statistics of group {group}."):
        return
    la, lb = f"A {Path(ctx.path).name}", f"B {Path(path_b).name}"
    both = pd.concat({la: sa[group], lb: sb[group]}, axis=1)
    st.line_chart(both, x_label="step", y_label=f"{stat} ({group})", color=list(lines.RUNS))
    download_figure(lambda: plots.time_series(both, f"{tensor} {kind} {stat} ({group})", stat),
                    f"cmp_runs_{tensor}_{stat}", key="cmp_runs_series")
    steps = sorted(set(sa.index) & set(sb.index))
    if not need(bool(steps), "The runs have no statistics step in common."):
        return
    step = st.select_slider("Step (common to both runs)", options=[int(s) for s in steps],
                            value=int(steps[-1]), key="cmp_run_step", bind="query-params")
    overlay({la: (ctx.path, ctx.sig, step), lb: (path_b, sig_b, step)}, tensor, kind,
            f"{tensor} {kind} @ step {step}: {la} and {lb}", f"cmp_runs_{tensor}_{step}",
            "cmp_run_hist", "cmp_run_xaxis")


def overlay(sides: dict[str, tuple[str, tuple, int]], tensor: str, kind: str, title: str, name: str,
            key: str, axis_key: str) -> None:
    """The histograms of ``tensor`` / ``kind`` of each side (``{label: (run path, signature,
    step)}``) on one axis (:func:`inspector.analysis.hist_view.choose_axis` over both), A solid and
    B dashed, a colour per group; its PNG on download, and per group B's median non-zero |value|
    over A's."""
    scale = axis_choice(axis_key)
    hists = {label: pick_groups(data.histograms(p, sig, tensor, (s,), kind).get(s, {}))
             for label, (p, sig, s) in sides.items()}
    every = [h for g in hists.values() for h in g.values()]
    extents = [data.extent(p, sig, tensor, (s,), kind, hists[label])
               for label, (p, sig, s) in sides.items()]
    known = [e for e in extents if e is not None]
    axis = hist_view.choose_axis(every, kind, scale,
                                 (min(e[0] for e in known), max(e[1] for e in known))
                                 if known else None)
    if not need(any(hist_view.counted(h) for h in every),
                f"No histogram of {plain(tensor)} {kind} on either side: no finite value counted "
                "(every value NaN or Inf there)."):
        return
    show_chart(lambda: hist_charts.histogram_chart(
        {kind: (hist_view.panel_frame(hists, axis), axis)}, title=title, width=720),
        ("overlay", tuple(sides.items()), tensor, kind, repr(axis), title), width="stretch")
    download_figure(lambda: plots.overlay(hists, axis, title=title), name, key=key)
    text = side_ratios(hists, NOUNS.get(kind, kind))
    empty = [label for label, g in hists.items()
             if not any(hist_view.counted(h) for h in g.values())]
    note = "".join(f". {label}: no histogram (no finite value counted)" for label in empty)
    st.caption(hist_view.axis_caption(axis, rebinned=rebinned(every))
               + (f". {text}" if text else "") + note)


def side_ratios(hists: dict[str, dict], noun: str) -> str:
    """'median non-zero |gradient|, B / A: positive 0.5x (0.002 to 0.001), ...' for the first
    two sides (each median within 5.9%); "" without log-magnitude histograms on both."""
    if len(hists) < 2:
        return ""
    sa, sb = (hist_view.magnitude_summary(h).set_index("group")["median_abs"]
              for h in list(hists.values())[:2])
    common = [g for g in sa.index if g in sb.index and sa[g] > 0 and sb[g] > 0]
    if not common:
        return ""
    ratios = ", ".join(f"{g} {sb[g] / sa[g]:.3g}x ({sa[g]:.3g} to {sb[g]:.3g})" for g in common)
    text = f"Median non-zero |{noun}|, B / A: {ratios} (each median within {RELATIVE_ERROR:.1%})"
    # a median is its bucket's stand-in value: groups whose medians share a bucket at A and at B
    # print the same figures, which must not read as the groups being ignored
    pairs = pd.Series({g: (sa[g], sb[g]) for g in common})
    alike = [list(v.index) for _, v in pairs.groupby(pairs.map(str)) if len(v) > 1]
    for groups in alike:
        text += (f"; {' and '.join(groups)} have their medians in the same buckets at A and at B, "
                 "so the same figures")
    return text
