"""Page: feature maps of a dumped step: a channel grid for any conv-like tensor, and for ICNN
layers pre-mask | mask | post-mask side by side with mu, per filter, positive and negative."""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis, plots

from . import data
from .dumps import dump_step_picker
from .ui import Ctx, need, plain, show_figure


def sample_label(samples: pd.DataFrame, i: int) -> str:
    r = samples.iloc[i]
    return f"#{i}: batch index {r.get('index', '?')}, label {r.get('label', '?')}, {r.get('group', '?')}"


def icnn_maps(ctx: Ctx, roles: pd.Series, step: int) -> dict[str, np.ndarray]:
    """pre_mask, mask, post_mask, mu of one ICNN layer at a dump step; the mask is recomputed
    from mu and beta (ICNN.md) if the dump lacks it."""
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    out = {}
    for role in ("pre_mask", "mask", "post_mask", "mu", "beta"):
        name = roles.get(role)
        if isinstance(name, str) and f"forward/{name}" in keys:
            out[role] = data.dumped(ctx.path, ctx.sig, name, step)
    if "mask" not in out and "mu" in out and "beta" in out and "pre_mask" in out:
        h, w = out["pre_mask"].shape[1:3]
        out["mask"] = analysis.icnn_mask(out["mu"], out["beta"], h, w)
    return out


def render(ctx: Ctx) -> None:
    st.header("Feature maps")
    run = data.get_run(ctx.path, ctx.sig)
    if not need(len(run.steps) > 0, "No full dumps in this run: feature maps need a dump step "
                                    "(the hook dumps every dump_every_n_steps)."):
        return
    c = st.columns(3)
    step = dump_step_picker(ctx, "Dump step", "fm_step", container=c[0])
    samples = data.samples(ctx.path, ctx.sig, step)
    if not need(len(samples) > 0, f"The dump of step {step} holds no samples."):
        return
    sample = c[1].selectbox("Sample", range(len(samples)), format_func=lambda i: sample_label(samples, i),
                            key="fm_sample", bind="query-params")
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    cat = run.tensors
    maps = [n for n in cat["name"] if f"forward/{n}" in keys and bool(cat.loc[n, "batched"])
            and len(cat.loc[n, "shape"] or []) == 4]
    if need(bool(maps), f"The dump of step {step} holds no 4-D (N, H, W, C) tensors."):
        tensor = c[2].selectbox("Layer", maps, key="fm_tensor", bind="query-params")
        kind = st.radio("Kind", [k for k in ("forward", "gradient") if f"{k}/{tensor}" in keys], horizontal=True,
                        key="fm_kind", bind="query-params")
        x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
        show_figure(plots.channel_grid(x[sample], f"{tensor} {kind}, step {step}, {sample_label(samples, sample)}",
                                       symmetric=kind == "gradient"),
                    f"channels_{tensor}_{kind}_{step}_{sample}", key="fm_grid")
        st.caption(f"shape {plain(list(x.shape))} (samples, H, W, C); sample {sample}: "
                   f"min {float(np.nanmin(x[sample])):.4g}, max {float(np.nanmax(x[sample])):.4g}")

    layers = data.icnn_layers(ctx.path, ctx.sig)
    st.subheader("ICNN mask layers")
    if not need(not layers.empty, "This run has no ICNN mask layer (no tensor has an ICNN role)."):
        return
    c = st.columns(4)
    layer = c[0].selectbox("ICNN layer", list(layers.index), key="fm_icnn_layer", bind="query-params")
    m = icnn_maps(ctx, layers.loc[layer], step)
    if not need({"pre_mask", "post_mask", "mask", "mu"} <= set(m),
                f"The dump of step {step} lacks some of {plain(layer)}'s maps (have: {plain(sorted(m))})."):
        return
    n_filters = m["pre_mask"].shape[-1]
    filt = c[1].selectbox("Filter", range(n_filters), key="fm_filter", bind="query-params")
    groups = samples["group"].to_numpy()
    pos = [i for i in range(len(samples)) if groups[i] == "positive"]
    neg = [i for i in range(len(samples)) if groups[i] == "negative"]
    label = functools.partial(sample_label, samples)
    ip = c[2].selectbox("Positive sample", pos, format_func=label, key="fm_pos", bind="query-params") if pos else None
    ineg = c[3].selectbox("Negative sample", neg, format_func=label, key="fm_neg", bind="query-params") if neg else None
    h, w = m["pre_mask"].shape[1:3]
    rows = []
    for label, i in (("positive", ip), ("negative", ineg)):
        if i is None:
            continue
        mu = m["mu"][i, filt]
        rows.append({"label": f"{label} #{i}", "pre": m["pre_mask"][i, ..., filt], "mask": m["mask"][i, ..., filt],
                     "post": m["post_mask"][i, ..., filt], "mu_cell": analysis.mu_to_cell(mu, h, w)})
        st.caption(f"{label} sample #{i}: mu = ({mu[0]:+.3f}, {mu[1]:+.3f}) (row, col in [-1, 1]), "
                   f"pre-mask sum {float(m['pre_mask'][i, ..., filt].sum()):.4g}, "
                   f"post-mask sum {float(m['post_mask'][i, ..., filt].sum()):.4g}")
    show_figure(plots.icnn_filter(rows, f"{layer}, filter {filt}, step {step} (+ = mu)"),
                f"icnn_{layer}_f{filt}_{step}", key="fm_icnn")
