"""Page: tensor browser: search the catalog (its table on demand: ``?tb_catalog=true``), inspect raw
dumped values (a histogram, or a table of one slice on demand: ``?tb_values=table``), download
.npz / PNG."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import streamlit as st

from inspector.analysis import source_text
from inspector.format.provenance import gradient_meaning
from inspector.analysis.binning import value_bins

from .. import data
from ..dumps import dump_step_picker
from ..hist_choices import bins_caption, bins_choice
from ..ui import Ctx, need, plain, plots, show_cached_figure, slug
from ..uncaptured import show_uncaptured

#: How the dumped values are shown: one at a time (the histogram by default; a table is a grid
#: the browser draws on a canvas, costly for a first paint)
VALUE_VIEWS = ("histogram", "table")


def search(catalog: pd.DataFrame, text: str, op_types: list[str]) -> pd.DataFrame:
    """Rows whose name, scope or op type contains ``text`` (case-insensitive), of ``op_types``.

    >>> cat = pd.DataFrame({"name": ["a/Relu:0"], "scope": ["a"], "op_type": ["Relu"]})
    >>> len(search(cat, "relu", []))
    1
    """
    df = catalog
    if op_types:
        df = df[df["op_type"].isin(op_types)]
    if text:
        t = text.lower()
        hit = np.zeros(len(df), bool)
        for col in ("name", "scope", "op_type"):
            hit |= df[col].astype(str).str.lower().str.contains(t, regex=False).to_numpy()
        df = df[hit]
    return df


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed .npz of plain numeric arrays (readable with ``np.load``, no pickle)."""
    buf = io.BytesIO()
    np.savez(buf, **{k.replace("/", "__"): np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def value_slice(x: np.ndarray, sample: int, channel: int) -> np.ndarray:
    """A 2-D view of ``x`` for a table: [H, W] of one sample and channel for 4-D tensors,
    otherwise the array reshaped to rows x last axis."""
    if x.ndim == 4:
        return x[sample, :, :, channel]
    if x.ndim <= 1:
        return np.atleast_1d(x)[None, :]
    return x.reshape(-1, x.shape[-1])


def icnn_gradient_note(cat: pd.DataFrame, tensor: str) -> str | None:
    """What a stored gradient means in a run with ICNN layers (None: nothing to say).

    The conv-mask layer adds its filter-loss term to the gradient at its pre-mask map, so that
    map's gradient and every gradient below it (the layers before the mask) are not pure
    d loss / d tensor; beta's gradient is the release's pseudo-gradient, not a derivative.
    """
    if "icnn_role" not in cat or not cat["icnn_role"].notna().any():
        return None
    row = cat.loc[tensor] if tensor in cat.index else None
    role = row["icnn_role"] if row is not None and isinstance(row["icnn_role"], str) else None
    is_beta = role == "beta" or (row is not None and isinstance(row.get("variable"), str)
                                 and str(row["variable"]).rsplit("/", 1)[-1] == "beta")
    if is_beta:
        return ("ICNN beta: its stored gradient is the release's pseudo-gradient "
                "(beta - target) * 1e4 * beta_lr_mult (/ N with a mean loss), not d loss / d beta; "
                "with beta_update='stable' it is 0 and the layer moves beta itself.")
    layers = ", ".join(sorted(cat["icnn_layer"].dropna().astype(str).unique()))
    return (f"This run has ICNN layer(s) {layers}: the gradient stored at each pre-mask map, and "
            "at every tensor below it (the layers before the mask), includes the ICNN filter-loss "
            "term: it is not a pure d loss / d tensor. Gradients above the mask are pure.")


def show_source(cat: pd.DataFrame, tensor: str) -> None:
    """Where the user's code created the tensor's op (catalog ``source_*``) and the user frames
    above it; the paths are shown, never opened."""
    made = source_text(cat, tensor)
    if made is None:
        st.caption("Created at: unknown (no frame of your code built this op: made by a library, "
                   "e.g. a built-in Keras layer, or a run written before source locations were "
                   "recorded)")
        return
    st.markdown(f"Created at **{plain(made)}**")
    stack = cat.loc[tensor].get("source_stack")
    if isinstance(stack, list) and len(stack) > 1:
        with st.expander(f"Call stack in your code ({len(stack)} frames, innermost last)"):
            st.text("\n".join(f"{f}:{line} in {fn}" for f, line, fn in stack))


def render(ctx: Ctx) -> None:
    st.header("Tensor browser")
    run = data.get_run(ctx.path, ctx.sig)
    cat = run.tensors
    if not need(not cat.empty, "The catalog of this run is empty."):
        return
    c1, c2 = st.columns([2, 2])
    text = c1.text_input("Search name, scope or op type", key="tb_search",
                         bind="query-params", placeholder="e.g. conv2 or Relu")
    ops = c2.multiselect("Op types", sorted(cat["op_type"].dropna().unique()), key="tb_ops")
    found = search(cat, text, ops)
    c1, c2 = st.columns([2, 2])
    c1.caption(f"{len(found)} of {len(cat)} tensors (the Tensor picker below lists them)")
    # a grid is the costliest element a page draws: the catalog's columns when asked for
    if c2.toggle("Catalog table", key="tb_catalog", bind="query-params",
                 help="every column of the matching tensors' catalog rows"):
        # lists: shown as text
        listed = [c for c in ("shape", "feeds", "reads", "source_stack") if c in found]
        st.dataframe(found.astype({c: str for c in listed}), hide_index=True, width="stretch",
                     height=260)
    if text:
        show_uncaptured(run, text, expanded=found.empty)
    if not need(len(found) > 0, "No tensor matches the search."):
        return
    tensor = st.selectbox("Tensor", list(found["name"]), key="tb_tensor", bind="query-params")
    row = cat.loc[tensor]
    st.markdown(f"**{plain(tensor)}**: op {plain(row['op'])} ({plain(row['op_type'])}), dtype "
                f"{plain(row['dtype'])}, static shape {plain(row['shape'])}, scope "
                f"{plain(row['scope']) if row['scope'] else '(top level)'}, gradient: "
                f"{'yes' if row['has_gradient'] else 'no'}, batched: "
                f"{'yes' if row['batched'] else 'no'}"
                + (f", ICNN {plain(row['icnn_role'])} of {plain(row['icnn_layer'])}"
                   if isinstance(row["icnn_role"], str) else "")
                + (f", variable {plain(row['variable'])}" if isinstance(row.get("variable"), str)
                   else "")
                + (f", read by {plain(', '.join(row['reads']))}"
                   if isinstance(row.get("reads"), list) else ""))
    show_source(cat, tensor)

    if not need(len(run.steps) > 0, "No full dumps in this run: raw values need a dump step."):
        return
    c = st.columns(4)
    step = dump_step_picker(ctx, "Dump step", "tb_step", container=c[0])
    if step is None:
        return
    keys = set(data.dump_keys(ctx.path, ctx.sig, step))
    kinds = [k for k in ("forward", "gradient", "update") if f"{k}/{tensor}" in keys]
    if not need(bool(kinds), f"The dump of step {step} holds no values of {plain(tensor)}."):
        return
    kind = c[1].radio("Kind", kinds, key="tb_kind", bind="query-params", horizontal=True)
    note = icnn_gradient_note(cat, tensor) if kind == "gradient" else None
    if note:
        st.info(note)
    probe = gradient_meaning(cat.loc[tensor, "captured_on"]) if kind in ("gradient", "update") \
        else None
    if probe:   # a Keras probe's: not the gradient the step's update came from
        st.info(probe)
    x = data.dumped(ctx.path, ctx.sig, tensor, step, kind)
    finite = x[np.isfinite(x)] if x.size else x
    st.markdown(f"Values: shape **{plain(list(x.shape))}**, dtype {x.dtype}; "
                + (f"min {finite.min():.5g}, mean {finite.mean():.5g}, max {finite.max():.5g}, "
                   f"{x.size - finite.size} non-finite" if finite.size else "no finite values"))
    view = st.radio("Values as", VALUE_VIEWS, horizontal=True, key="tb_values",
                    bind="query-params", label_visibility="collapsed")
    if view == "table":
        # the slice's pickers only where they choose something: the histogram is of every value
        c = st.columns(4)
        sample = c[0].number_input("Sample", 0, max(x.shape[0] - 1, 0) if x.ndim == 4 else 0, 0,
                                   key="tb_sample", bind="query-params")
        channel = c[1].number_input("Channel", 0, max(x.shape[-1] - 1, 0) if x.ndim == 4 else 0,
                                    0, key="tb_channel", bind="query-params")
        st.dataframe(pd.DataFrame(value_slice(x, int(sample), int(channel))), width="stretch",
                     height=240)
        st.caption("table: sample × rows × columns of one channel for 4-D tensors, else rows × "
                   "last axis")

    def bundle() -> bytes:
        arrays = {f"{k}/{tensor}": data.dumped(ctx.path, ctx.sig, tensor, step, k) for k in kinds}
        s = data.samples(ctx.path, ctx.sig, step, tensor)
        arrays.update({f"samples/{c}": s[c].to_numpy() for c in ("index", "label") if c in s})
        if "group" in s:  # the group names (unicode: np.load reads them without pickle)
            arrays["samples/group"] = s["group"].to_numpy().astype(str)
        return npz_bytes(arrays)

    st.download_button("Download .npz (forward, gradient, update, samples)", bundle,
                       file_name=f"{slug(tensor)}_step{step}.npz", mime="application/octet-stream",
                       key="tb_npz")
    if view == "table":
        return
    choice = bins_choice("tb_bins")
    bins = value_bins(x, scale=choice)
    show_cached_figure(lambda: plots.histograms(
        {kind: {"all": plots.hist_from_values(x, bins.edges)}}, density=False,
        title=f"{tensor} {kind} @ step {step}: every dumped value",
        xscale={kind: bins.linthresh} if bins.scale == "symlog" else None),
        ("tb_hist", ctx.path, ctx.sig, tensor, kind, step, choice),
        f"values_{tensor}_{kind}_{step}", key="tb_fig", caption=bins_caption(bins))
