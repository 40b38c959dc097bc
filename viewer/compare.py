"""Page: compare two steps of one run, or the same tensor in two runs, side by side."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from inspector import plots
from inspector.errors import InspectorError

from . import data, hist_charts
from .distributions import kinds_of, pick_groups, totals_of
from .ui import Ctx, default_tensor, download_figure, need, plain

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


def render(ctx: Ctx) -> None:
    st.header("Compare")
    mode = st.radio("Compare", ["Two steps of this run", "Same tensor in two runs"], horizontal=True, key="cmp_mode",
                    bind="query-params")
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
    tensor = c[0].selectbox("Tensor", names, index=default_tensor(names),
                            key="cmp_tensor", bind="query-params")
    kind = c[1].radio("Kind", kinds_of(run, tensor), key="cmp_kind", bind="query-params", horizontal=True)
    cols = st.columns(2)
    picked = [cols[i].select_slider(f"Step {side}", options=steps, value=default, key=f"cmp_step_{side}",
                                    bind="query-params")
              for i, (side, default) in enumerate((("A", steps[0]), ("B", steps[-1])))]
    hists = [pick_groups(data.histograms(ctx.path, ctx.sig, tensor, (s,), kind).get(s, {})) for s in picked]
    xlim = shared_range(hists)
    for col, side, s, h in zip(cols, "AB", picked, hists):
        with col:
            hist_chart({kind: h}, f"{side}: {tensor} @ step {s}", {kind: xlim},
                       totals_of(ctx.path, ctx.sig, tensor, s, [kind]), f"cmp_{side}_{tensor}_{s}", f"cmp_hist_{side}")
    a, b = (stats_at(ctx.path, ctx.sig, tensor, s, kind) for s in picked)
    table = pd.DataFrame({f"{g} @ {s}": frame.loc[g] for g in a.index for s, frame in zip(picked, (a, b))
                          if g in frame.index})
    st.dataframe(table, width="stretch")
    st.caption(f"{kind} statistics of {plain(tensor)} at step {picked[0]} (A) and {picked[1]} (B), per group")


def shared_range(hists: list[dict]) -> tuple[float, float]:
    """One x range covering every histogram, so two figures compare by eye."""
    edges = [e for h in hists for e, _ in h.values() if np.isfinite(e).all()]
    return (min(float(e[0]) for e in edges), max(float(e[-1]) for e in edges)) if edges else (0.0, 1.0)


def two_runs(ctx: Ctx) -> None:
    others = list(ctx.runs)
    if not need(len(others) >= 2, f"Comparing runs needs two runs: the runs folder (or the folder given in the "
                f"sidebar) holds {len(others)}. Give a folder holding several runs."):
        return
    run_a = data.get_run(ctx.path, ctx.sig)
    c = st.columns(2)
    c[0].markdown(f"**Run A**: {plain(Path(ctx.path).name)} (chosen in the sidebar)")
    others = [r for r in others if r != ctx.path]  # B is another run than A
    path_b = c[1].selectbox("Run B", others, index=0, format_func=lambda p: Path(p).name, key="cmp_run_b",
                            bind="query-params")
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
    tensor = c[0].selectbox("Tensor (in both runs)", common, key="cmp_run_tensor", bind="query-params",
                            index=default_tensor(common))
    kind = c[1].radio("Kind", kinds_of(run_a, tensor), key="cmp_run_kind", bind="query-params", horizontal=True)
    stat = c[2].selectbox("Statistic", TABLE_STATS[1:], index=TABLE_STATS.index("mean") - 1, key="cmp_run_stat",
                          bind="query-params")
    groups = list(dict.fromkeys([*run_a.groups, *run_b.groups]))
    group = c[3].selectbox("Group", groups, key="cmp_run_group", bind="query-params")
    sa = data.series(ctx.path, ctx.sig, tensor, kind, stat)
    sb = data.series(path_b, sig_b, tensor, kind, stat)
    if not need(group in sa and group in sb, f"Both runs need {kind} statistics of group {group}."):
        return
    la, lb = f"A {Path(ctx.path).name}", f"B {Path(path_b).name}"
    both = pd.concat({la: sa[group], lb: sb[group]}, axis=1)
    st.line_chart(both, x_label="step", y_label=f"{stat} ({group})")
    download_figure(lambda: plots.time_series(both, f"{tensor} {kind} {stat} ({group})", stat),
                    f"cmp_runs_{tensor}_{stat}", key="cmp_runs_series")
    steps = sorted(set(sa.index) & set(sb.index))
    if not need(bool(steps), "The runs have no statistics step in common."):
        return
    step = st.select_slider("Step (common to both runs)", options=[int(s) for s in steps], value=int(steps[-1]),
                            key="cmp_run_step", bind="query-params")
    sides = ((la, ctx.path, ctx.sig), (lb, path_b, sig_b))
    hists = [pick_groups(data.histograms(p, s, tensor, (step,), kind).get(step, {})) for _, p, s in sides]
    xlim = shared_range(hists)
    for col, (label, p, s), h in zip(st.columns(2), sides, hists):
        with col:
            hist_chart({kind: h}, f"{label}: {tensor} @ step {step}", {kind: xlim},
                       totals_of(p, s, tensor, step, [kind]), f"cmp_{label}_{tensor}_{step}",
                       f"cmp_run_hist_{label[0]}")


def hist_chart(panels: dict, title: str, xlim: dict, totals: dict, name: str, key: str) -> None:
    """The histograms as an interactive chart, with the same figure drawn as PNG on download."""
    st.altair_chart(hist_charts.histogram_chart(panels, title=title, xlim=xlim, totals=totals), width="stretch")
    download_figure(lambda: plots.histograms(panels, title=title, xlim=xlim, totals=totals), name, key=key)
