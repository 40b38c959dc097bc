"""Page: distributions of one tensor: positive vs negative histograms at a step (in-graph and
from dumped samples) and across steps (ridge plot)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from inspector import analysis, plots

from . import data
from .ui import Ctx, need, plain, show_figure


def kinds_of(run, tensor: str) -> list[str]:
    return ["forward"] + (["gradient"] if bool(run.tensors.loc[tensor, "has_gradient"]) else [])


def pick_groups(hists: dict) -> dict:
    """Positive and negative where the tensor has them, else 'all'."""
    pn = {g: h for g, h in hists.items() if g in ("positive", "negative")}
    return pn or hists


def evenly(values: np.ndarray, n: int) -> list[int]:
    """``n`` values spread evenly over sorted ``values`` (first and last included)."""
    if len(values) <= n:
        return [int(v) for v in values]
    return [int(values[i]) for i in np.unique(np.linspace(0, len(values) - 1, n).round().astype(int))]


def render(ctx: Ctx) -> None:
    st.header("Distributions")
    run = data.get_run(ctx.path, ctx.sig)
    steps = data.stats_steps(ctx.path, ctx.sig)
    if not need(len(steps) > 0 and not run.tensors.empty, "This run has no statistics yet."):
        return
    names = list(run.tensors["name"])
    c1, c2 = st.columns([2, 3])
    tensor = c1.selectbox("Tensor", names, index=next((i for i, n in enumerate(names) if "Relu" in n), 0),
                          key="di_tensor")
    step = c2.select_slider("Step", options=[int(s) for s in steps], value=int(steps[-1]), key="di_step")
    kinds = kinds_of(run, tensor)
    log = st.toggle("Log density", key="di_log")

    st.subheader(f"In-graph histograms at step {step}")
    panels = {}
    for kind in kinds:
        h = data.histograms(ctx.path, ctx.sig, tensor, (step,), kind).get(step, {})
        panels[kind] = pick_groups(h)
    show_figure(plots.histograms(panels, title=f"{tensor} @ step {step}", log=log), f"hist_{tensor}_{step}",
                key="di_hist")
    desc = []
    for kind, groups in panels.items():
        for g, (edges, counts) in groups.items():
            mids = (edges[:-1] + edges[1:]) / 2
            mean = float((mids * counts).sum() / max(counts.sum(), 1))
            desc.append(f"{kind} {plain(g)}: n={int(counts.sum())}, histogram mean≈{mean:.4g}")
    st.caption("; ".join(desc))

    st.subheader("From dumped samples")
    if need(len(run.steps) > 0, "No full dumps in this run (the hook dumps every dump_every_n_steps)."):
        dstep = int(min(run.steps, key=lambda s: (abs(s - step), s)))
        dstep = st.selectbox("Dump step", run.steps, index=run.steps.index(dstep), key="di_dump_step",
                             help="defaults to the dump nearest the chosen step")
        sample_hist(ctx, run, tensor, dstep, kinds, log)

    st.subheader("Across steps")
    c1, c2 = st.columns(2)
    rkind = c1.radio("Kind", kinds, key="di_ridge_kind", horizontal=True)
    n = c2.slider("Number of steps", 3, 24, 10, key="di_ridge_n")
    chosen = tuple(evenly(steps, n))
    rows = {s: pick_groups(g) for s, g in data.histograms(ctx.path, ctx.sig, tensor, chosen, rkind).items()}
    show_figure(plots.ridge(rows, title=f"{tensor} {rkind}: histograms over steps"), f"ridge_{tensor}_{rkind}",
                key="di_ridge")


def sample_hist(ctx: Ctx, run, tensor: str, step: int, kinds: list[str], log: bool) -> None:
    if not bool(run.tensors.loc[tensor, "batched"]):
        st.caption(f"{plain(tensor)} has no batch dimension: no per-sample split.")
    groups = data.samples(ctx.path, ctx.sig, step)["group"].to_numpy()
    panels = {}
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    for kind in kinds:
        if f"{kind}/{tensor}" not in keys:
            continue
        x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
        if bool(run.tensors.loc[tensor, "batched"]) and len(x) == len(groups):
            split = analysis.split_by_group(x, groups == "positive")
        else:
            split = {"all": x}
        edges = analysis.common_bins(*split.values())
        panels[kind] = {g: plots.hist_from_values(v, edges) for g, v in split.items() if v.size}
    if need(bool(panels), f"The dump of step {step} holds no values of {plain(tensor)}."):
        show_figure(plots.histograms(panels, title=f"{tensor} @ dump step {step} (dumped samples)", log=log),
                    f"samples_hist_{tensor}_{step}", key="di_samples")
