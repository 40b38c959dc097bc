"""Page: feature maps of a dumped step, one section at a time (``?fm_section=``). Opens on the
first convolution's output; every channel of one sample (a page of 64 at a time); one channel
over the input image (keract's heatmap), in every kept sample group by group, and the samples
that activate it most; for ICNN layers pre-mask | mask | post-mask side by side with mu, per
filter, positive and negative.
Channel and filter pickers mark dead ICNN filters "(dead)" and channels zero in every kept sample
"(all zero)"; the per-sample localization of a filter over the input is on Masks & templates.

Example (what the page computes, without Streamlit)::

    cat = run.tensors; keys = set(run.dump_keys(step))
    maps = map_tensors(cat, keys); name = maps[default_map(cat, maps)]   # conv1/Conv2D:0
    order, values = top_samples(run.tensor(name, step)[..., 5], "max")  # channel 5's best samples
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis

from .. import data
from ..dumped_maps import (CONV_OP_TYPES, is_input, map_tensors, model_input, sample_label,
                           why_no_input)
from ..dumps import dump_step_picker
from ..ui import Ctx, need, plain, plots, show_cached_figure

#: Channels per page of the channel grid
PAGE_CHANNELS = 64
#: Samples drawn in the top-activating figure (the table ranks every kept sample)
TOP_K = 8
#: How a sample's activation of one channel is scored for the ranking: the peak (the strongest
#: response anywhere in the map, as "top-activating" examples are usually chosen) or the mean
RANK_STATS = {"max": "peak value over H x W", "mean": "mean over H x W"}
#: The page's sections; one is drawn at a time (the picker under the heading): a visit renders
#: one section's figures, not all five (the browser's time to draw a page grows with its elements)
SECTIONS = ("Every channel of one sample", "One channel", "ICNN mask layers")


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


def default_map(cat: pd.DataFrame, maps: list[str]) -> int:
    """Index in ``maps`` the page opens on: the first convolution's output (op type in
    :data:`CONV_OP_TYPES`, graph order), else the first map that is not a model input, else 0.

    >>> cat = pd.DataFrame({"op_type": ["IteratorGetNext", "Conv2D"]}, index=["x:0", "c/Conv2D:0"])
    >>> default_map(cat, ["x:0", "c/Conv2D:0"])
    1
    """
    conv = [i for i, n in enumerate(maps) if str(cat.loc[n, "op_type"]) in CONV_OP_TYPES]
    other = [i for i, n in enumerate(maps) if not is_input(cat, n)]
    return (conv or other or [0])[0]


def channel_scores(x: np.ndarray, stat: str) -> np.ndarray:
    """Per sample, the score of one channel's maps ``x [N, H, W]`` (:data:`RANK_STATS`); NaN/Inf
    values are left out (NaN if a map has no finite value)."""
    v = np.where(np.isfinite(x), x, np.nan).reshape(len(x), -1)
    with warnings.catch_warnings():  # an all-NaN map: NaN, without numpy's warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(v, axis=1) if stat == "max" else np.nanmean(v, axis=1)


def top_samples(x: np.ndarray, stat: str) -> tuple[np.ndarray, np.ndarray]:
    """(sample rows from the most to the least activating, their scores) for one channel's maps
    ``x [N, H, W]``; ties keep sample order, NaN scores last.

    >>> top_samples(np.array([[[1.0]], [[3.0]], [[2.0]]]), "max")[0].tolist()
    [1, 2, 0]
    """
    scores = channel_scores(x, stat)
    order = np.argsort(-scores, kind="stable")
    return order, scores[order]


def group_order(groups: list[str], present: list[str]) -> list[str]:
    """The run's groups (``run.groups`` without ``all``) that hold samples, then any others."""
    return [g for g in groups if g in present and g != "all"] \
        + [g for g in present if g not in groups]


def render(ctx: Ctx) -> None:
    st.header("Feature maps")
    run = data.get_run(ctx.path, ctx.sig)
    if not need(len(run.steps) > 0, "No full dumps in this run: feature maps need a dump step "
                                    "(the hook dumps every dump_every_n_steps)."):
        return
    section = st.radio("Show", SECTIONS, horizontal=True, key="fm_section", bind="query-params",
                       label_visibility="collapsed")
    icnn = section == SECTIONS[2]
    c = st.columns(3)
    step = dump_step_picker(ctx, "Dump step", "fm_step", container=c[0])
    if icnn:
        icnn_section(ctx, step, c[1:])
        return
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    cat = run.tensors
    maps = map_tensors(cat, keys)
    if need(bool(maps), f"The dump of step {step} holds no 4-D (N, H, W, C) tensors."):
        tensor = c[1].selectbox("Layer", maps, index=default_map(cat, maps), key="fm_tensor",
                                bind="query-params")
        kind = c[2].radio("Kind", [k for k in ("forward", "gradient") if f"{k}/{tensor}" in keys],
                          horizontal=True, key="fm_kind", bind="query-params")
        channel_views(ctx, run, cat, maps, data.samples(ctx.path, ctx.sig, step, tensor), step,
                      tensor, kind, section == SECTIONS[0])


def channel_views(ctx: Ctx, run, cat: pd.DataFrame, maps: list[str], samples: pd.DataFrame,
                  step: int, tensor: str, kind: str, every: bool) -> None:
    """``every``: every channel of one sample; else one channel: over the input, per group, top
    samples."""
    x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
    if not need(len(samples) > 0 and len(x) == len(samples),
                f"The dump of step {step} keeps {len(samples)} samples for {plain(tensor)}, which "
                f"has {len(x)} rows: they do not match, so no sample is labelled; choose another "
                "layer."):
        return
    n_ch, sym = x.shape[-1], kind == "gradient"
    c = st.columns(3)
    sample = c[0].selectbox("Sample", range(len(samples)),
                            format_func=lambda i: sample_label(samples, i), key="fm_sample",
                            bind="query-params")
    ident = (ctx.path, ctx.sig, tensor, kind, step)  # what every figure below is drawn from
    if every:
        pages = list(range(int(np.ceil(n_ch / PAGE_CHANNELS))))
        page = c[1].selectbox(f"Channels ({n_ch} in all)", pages, key="fm_page",
                              bind="query-params",
                              format_func=lambda p: f"{p * PAGE_CHANNELS}-"
                                                    f"{min((p + 1) * PAGE_CHANNELS, n_ch) - 1}")
        first = (page if page in pages else 0) * PAGE_CHANNELS
        show_cached_figure(lambda: plots.channel_grid(x[sample], f"{tensor} {kind}, step {step}, "
                                                      f"{sample_label(samples, sample)}",
                                                      symmetric=sym, first=first,
                                                      max_channels=PAGE_CHANNELS),
                           ("grid", *ident, sample, first),
                           f"channels_{tensor}_{kind}_{step}_{sample}_{first}", key="fm_grid")
        st.caption(f"shape {plain(list(x.shape))} (samples, H, W, C); sample {sample}: "
                   f"min {float(np.nanmin(x[sample])):.4g}, max {float(np.nanmax(x[sample])):.4g}")
        return
    marks = channel_marks(ctx, tensor, step, x)
    ch = c[1].selectbox("Channel", range(n_ch), key="fm_channel", bind="query-params",
                        format_func=lambda k: f"{k} ({marks[k]})" if k in marks else str(k),
                        help="(dead): an ICNN filter zero in every dumped sample; (all zero): a "
                             "channel zero in every kept sample of this dump")
    ch = ch if ch is not None and ch < n_ch else 0
    stat = c[2].radio("Rank samples by the channel's", list(RANK_STATS), horizontal=True,
                      key="fm_rank", bind="query-params",
                      format_func=lambda s: f"{s} ({RANK_STATS[s]})")
    xc = x[..., ch]
    overlay(ctx, cat, maps, step, tensor, kind, samples, sample, ch, xc[sample])
    by_group(samples, xc, f"{tensor} {kind}, channel {ch}, step {step}: every kept sample", sym,
             f"groups_{tensor}_{kind}_{step}_ch{ch}", run.groups, ("groups", *ident, ch))
    ranking(samples, xc, stat, f"{tensor} {kind}, channel {ch}, step {step}", sym,
            f"top_{tensor}_{kind}_{step}_ch{ch}_{stat}", ("top", *ident, ch, stat))


def channel_marks(ctx: Ctx, tensor: str, step: int, x: np.ndarray) -> dict[int, str]:
    """Channel -> its mark in the channel picker: 'dead' for a dead filter of the ICNN layer whose
    map ``tensor`` is (:func:`viewer.data.dead_filters`), 'all zero' for any other channel that is
    zero in every kept sample of ``x`` [N, H, W, C]."""
    layers = data.icnn_layers(ctx.path, ctx.sig)
    dead: list[int] = []
    for layer, roles in layers.iterrows():
        if tensor in {roles.get(r) for r in ("pre_mask", "mask", "post_mask")}:
            dead = data.dead_filters(ctx.path, ctx.sig, step).get(str(layer), [])
    zero = np.flatnonzero(~(np.asarray(x) != 0).any(axis=(0, 1, 2))) if np.ndim(x) == 4 and len(x) \
        else []
    return {**{int(k): "all zero" for k in zero}, **{int(k): "dead" for k in dead}}


def overlay(ctx: Ctx, cat: pd.DataFrame, maps: list[str], step: int, tensor: str, kind: str,
            samples: pd.DataFrame, sample: int, ch: int, heat: np.ndarray) -> None:
    """keract's heatmap: channel ``ch`` of ``sample`` upsampled over that sample's input image."""
    st.markdown("**On the input image**")
    name = model_input(cat, maps)
    if not need(name is not None, why_no_input(cat, step)):
        return
    image = data.dumped(ctx.path, ctx.sig, name, step)
    if not need(len(image) == len(samples), f"The model input {plain(name)} has {len(image)} rows "
                                            f"in the dump of step {step}, not the {len(samples)} "
                                            "kept samples: no overlay."):
        return
    show_cached_figure(lambda: plots.channel_overlay(image[sample], heat,
                                                     f"{tensor} {kind} channel {ch} over "
                                                     f"{name}, {sample_label(samples, sample)}",
                                                     symmetric=kind == "gradient"),
                       ("overlay", ctx.path, ctx.sig, tensor, kind, step, sample, ch, name),
                       f"overlay_{tensor}_{kind}_{step}_{sample}_ch{ch}", key="fm_overlay")
    st.caption(f"The channel ({heat.shape[0]}x{heat.shape[1]}) is enlarged to the input's "
               f"{image.shape[1]}x{image.shape[2]} by bilinear interpolation (pixel centres "
               f"aligned) and drawn over the input {plain(name)} of the same sample with alpha "
               "0.5; the input is min-max scaled.")


def by_group(samples: pd.DataFrame, xc: np.ndarray, title: str, sym: bool, name: str,
             groups: list[str], ident: tuple) -> None:
    """Channel maps of every kept sample, one block per group (positive | negative ...)."""
    st.markdown("**Every kept sample, by group**")
    labels = data.sample_groups(samples, "kept").astype(str)
    order = group_order(list(groups), list(dict.fromkeys(labels)))
    panels = {g: [(f"#{i}", xc[i]) for i in np.flatnonzero(labels == g)] for g in order}
    show_cached_figure(lambda: plots.sample_grid(panels, title, symmetric=sym), ident, name,
                       key="fm_groups")
    st.caption("Groups from the dump's samples/group; one colour scale for every sample.")


def ranking(samples: pd.DataFrame, xc: np.ndarray, stat: str, title: str, sym: bool, name: str,
            ident: tuple) -> None:
    """The kept samples ranked by the channel's ``stat``: the top ones drawn, all in a table."""
    st.markdown("**Top-activating kept samples**")
    order, scores = top_samples(xc, stat)
    groups = data.sample_groups(samples, "").astype(str)
    k = min(TOP_K, len(order))
    panels = {f"top {k} by {stat}": [(f"#{i} {groups[i]}\n{stat} {v:.3g}", xc[i])
                                     for i, v in zip(order[:k], scores[:k])]}
    show_cached_figure(lambda: plots.sample_grid(panels, title, cols=k, symmetric=sym, lines=2),
                       ident, name, key="fm_top")
    table = pd.DataFrame({"rank": np.arange(1, len(order) + 1), "sample": order,
                          "batch index": samples["index"].to_numpy()[order] if "index" in samples
                                         else order,
                          "group": groups[order], stat: scores})
    st.dataframe(table, hide_index=True, key="fm_top_table")


def icnn_section(ctx: Ctx, step: int, top: list) -> None:
    """ICNN mask layers: pre-mask | mask | post-mask of one filter, a positive and a negative
    sample; the layer picker in ``top[0]`` (a column of the step picker's row)."""
    layers = data.icnn_layers(ctx.path, ctx.sig)
    if not need(not layers.empty, "This run has no ICNN mask layer (no tensor has an ICNN role)."):
        return
    c = st.columns(3)
    layer = top[0].selectbox("ICNN layer", list(layers.index), key="fm_icnn_layer",
                             bind="query-params")
    m = icnn_maps(ctx, layers.loc[layer], step)
    if not need({"pre_mask", "post_mask", "mask", "mu"} <= set(m),
                f"The dump of step {step} lacks some of {plain(layer)}'s maps (have: "
                f"{plain(sorted(m))})."):
        return
    samples = data.samples(ctx.path, ctx.sig, step, layers.loc[layer, "pre_mask"])
    if not need(len(samples) > 0 and "group" in samples,
                f"The dump of step {step} holds no samples with groups."):
        return
    n_filters = m["pre_mask"].shape[-1]
    dead = set(data.dead_filters(ctx.path, ctx.sig, step).get(str(layer), []))
    filt = c[0].selectbox("Filter", range(n_filters), key="fm_filter", bind="query-params",
                          format_func=lambda f: f"{f} (dead)" if f in dead else str(f),
                          help="(dead): zero in every dumped sample of this step")
    groups = samples["group"].to_numpy()
    pos = [i for i in range(len(samples)) if groups[i] == "positive"]
    neg = [i for i in range(len(samples)) if groups[i] == "negative"]
    label = functools.partial(sample_label, samples)
    ip = c[1].selectbox("Positive sample", pos, format_func=label, key="fm_pos",
                        bind="query-params") if pos else None
    ineg = c[2].selectbox("Negative sample", neg, format_func=label, key="fm_neg",
                          bind="query-params") if neg else None
    h, w = m["pre_mask"].shape[1:3]
    rows, notes = [], []
    for label, i in (("positive", ip), ("negative", ineg)):
        if i is None:
            continue
        mu = m["mu"][i, filt]
        rows.append({"label": f"{label} #{i}", "pre": m["pre_mask"][i, ..., filt],
                     "mask": m["mask"][i, ..., filt], "post": m["post_mask"][i, ..., filt],
                     "mu_cell": analysis.mu_to_cell(mu, h, w)})
        notes.append(f"{label} sample #{i}: mu = ({mu[0]:+.3f}, {mu[1]:+.3f}) (row, col in "
                     f"[-1, 1]), pre-mask sum {float(m['pre_mask'][i, ..., filt].sum()):.4g}, "
                     f"post-mask sum {float(m['post_mask'][i, ..., filt].sum()):.4g}")
    show_cached_figure(lambda: plots.icnn_filter(rows,
                                                 f"{layer}, filter {filt}, step {step} (+ = mu)"),
                       ("icnn", ctx.path, ctx.sig, layer, filt, step, ip, ineg),
                       f"icnn_{layer}_f{filt}_{step}", key="fm_icnn")
    st.caption("; ".join(notes) + (". " if notes else "")
               + "Masks & templates shows this filter's map over the input image of every kept "
               "positive and negative sample, side by side, with mu marked: whether it fires on "
               "the same part in each.")
