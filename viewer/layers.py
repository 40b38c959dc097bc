"""Layer x step heatmaps as interactive Vega-Lite (Altair) charts: rows grouped by layer, a
layer's internal ops folded into its output row by default, tooltips (tensor, layer, step,
value) and zoom/pan along the steps. No Streamlit here (tested without a page).

A *layer* is the ICNN layer a tensor belongs to (its ``icnn_layer``, or an ICNN layer whose
scope its scope lies under: the layer's helper ops), else the tensor's name scope (a scope TF
opened under an op's name, e.g. ``conv1/Conv2D/ReadVariableOp``, counts as that op's). Folded,
a layer shows one row: its ICNN ``post_mask`` output, else its last op output in graph order.

Example::

    rows = layer_rows(run.tensors, tensors)                 # tensor, layer, output
    shown = shown_rows(rows, unfold={"icnn"})
    chart = heatmap_chart(heatmap_frame(tensors, steps, m, shown), "l2", log=True)
"""
from __future__ import annotations

from typing import Collection, Mapping

import altair as alt
import numpy as np
import pandas as pd

#: Pixels of a heatmap chart outside its rows (title, step axis and its title): Streamlit's
#: height is the whole chart's, so without them the rows shrink below a readable label
FRAME_PX = 130
#: Most step columns a chart sends to the browser (evenly chosen beyond it; the caption says so)
MAX_STEPS = 300


def layer_of(scope: str, icnn_layer: object, icnn_layers: Collection[str]) -> str:
    """The layer a tensor belongs to.

    >>> layer_of("icnn/helper/sub", None, ["icnn"]), layer_of("conv1", None, ["icnn"])
    ('icnn', 'conv1')
    """
    if isinstance(icnn_layer, str) and icnn_layer:
        return icnn_layer
    under = [L for L in icnn_layers if scope == L or scope.startswith(L + "/")]
    return max(under, key=len) if under else (scope or "(no scope)")


def op_scope(scope: str, ops: Mapping[str, str]) -> str:
    """``scope`` with the scopes TF opens under an op's own name (``conv1/Conv2D/ReadVariableOp``
    reads the kernel *for* ``conv1/Conv2D``) replaced by that op's scope; ``ops``: op name -> scope.

    >>> op_scope("conv1/Conv2D", {"conv1/Conv2D": "conv1"}), op_scope("conv1", {"conv1/Conv2D": "conv1"})
    ('conv1', 'conv1')
    """
    seen = set()
    while scope in ops and scope not in seen:
        seen.add(scope)
        scope = ops[scope]
    return scope


def layer_rows(catalog: pd.DataFrame, tensors: list[str]) -> pd.DataFrame:
    """One row per tensor of ``tensors`` (graph order): its ``layer`` and whether it is the
    layer's ``output`` (the row a folded layer shows): the ICNN ``post_mask``, else the layer's
    last op output (not a variable, which the catalog lists after the ops), else its last row."""
    if not len(tensors):   # no statistics of this kind (a run without gradients): no rows, not a KeyError
        return pd.DataFrame({"tensor": [], "layer": [], "output": []}, dtype=object)
    cat = catalog.loc[tensors]
    icnn = sorted({str(v) for v in catalog["icnn_layer"].dropna()})
    ops = dict(zip(catalog["op"], catalog["scope"].fillna(""))) if "op" in catalog else {}
    layers = [layer_of(op_scope(str(s), ops), ly, icnn) for s, ly in zip(cat["scope"].fillna(""), cat["icnn_layer"])]
    kind = cat["kind"] if "kind" in cat else pd.Series("tensor", index=cat.index)
    df = pd.DataFrame({"tensor": tensors, "layer": layers, "role": list(cat["icnn_role"]),
                       "op_output": list(kind.fillna("tensor") != "variable")})
    post = df[df["role"] == "post_mask"].groupby("layer")["tensor"].first()
    last = df.groupby("layer")["tensor"].last()
    last_op = df[df["op_output"]].groupby("layer")["tensor"].last()
    out_of = {**last.to_dict(), **last_op.to_dict(), **post.to_dict()}
    df["output"] = [out_of[ly] == t for t, ly in zip(df["tensor"], df["layer"])]
    return df.drop(columns=["role", "op_output"])


def shown_rows(rows: pd.DataFrame, unfold: Collection[str] = (), all_ops: bool = False) -> pd.DataFrame:
    """The rows to draw: every op of the layers in ``unfold`` (all if ``all_ops``), the output
    row of the others, with ``label``: the tensor, and '(+N ops)' on a folded layer's row."""
    size = rows.groupby("layer")["tensor"].transform("size")
    open_ = rows["layer"].isin(set(unfold)) | all_ops
    keep = rows[open_ | rows["output"]].copy()
    hidden = (size - 1)[keep.index]
    folded = ~open_[keep.index] & (hidden > 0)
    keep["label"] = [f"{t} (+{h} ops of {ly})" if f else t
                     for t, h, ly, f in zip(keep["tensor"], hidden, keep["layer"], folded)]
    return keep.reset_index(drop=True)


def even_columns(n: int, most: int = MAX_STEPS) -> np.ndarray:
    """Indices of at most ``most`` of ``n`` columns, evenly spread, first and last kept.

    >>> even_columns(5, 3).tolist()
    [0, 2, 4]
    """
    if n <= most:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, most).round().astype(int))


def heatmap_frame(tensors: list[str], steps: np.ndarray, m: np.ndarray, shown: pd.DataFrame,
                  log: bool = False) -> pd.DataFrame:
    """Long form of the matrix ``m`` [tensor, step] for the ``shown`` rows: one record per cell
    with ``tensor``, ``label``, ``layer``, ``step``, the cell's extent ``x0``..``x1`` (centred on
    its step, halfway to its neighbours, so steps sit at their place on a zoomable axis),
    ``value`` (None where NaN/Inf, or <= 0 on a log scale) and ``state`` (``finite``,
    ``non-finite`` or ``<= 0``)."""
    cols = even_columns(len(steps))
    s = np.asarray(steps, np.float64)[cols]
    mids = (s[1:] + s[:-1]) / 2 if len(s) > 1 else np.array([])
    half = (mids[0] - s[0]) if len(mids) else 0.5
    x0 = np.concatenate([[s[0] - half], mids]) if len(s) else s
    x1 = np.concatenate([mids, [s[-1] + ((s[-1] - mids[-1]) if len(mids) else 0.5)]]) if len(s) else s
    index = {t: i for i, t in enumerate(tensors)}
    rows = [index[t] for t in shown["tensor"]]
    vals = np.asarray(m, np.float64)[rows][:, cols]
    finite = np.isfinite(vals)
    ok = finite & (vals > 0) if log else finite
    n_rows, n_cols = vals.shape
    state = np.where(ok, "finite", np.where(finite, "<= 0", "non-finite"))
    # object, not pandas 3's default string dtype: Arrow writes that as large_string, which
    # Streamlit's Vega-Lite frontend cannot read (the chart comes out empty)
    return pd.DataFrame({
        "tensor": np.repeat(shown["tensor"].to_numpy(), n_cols),
        "label": np.repeat(shown["label"].to_numpy(), n_cols),
        "layer": np.repeat(shown["layer"].to_numpy(), n_cols),
        "step": np.tile(s.astype(np.int64), n_rows),
        "x0": np.tile(x0, n_rows), "x1": np.tile(x1, n_rows),
        "value": np.where(ok, vals, np.nan).ravel(),
        "state": state.ravel()}).astype({c: object for c in ("tensor", "label", "layer", "state")})


def heatmap_chart(frame: pd.DataFrame, stat: str, log: bool = False, title: str = "") -> alt.Chart:
    """Rows x steps rectangles coloured by ``value`` (log colour scale if ``log``); grey where
    the value is missing (NaN/Inf, or <= 0 on a log scale); tooltips name tensor, layer, step,
    value; the mouse wheel zooms and dragging pans the step axis."""
    labels = list(dict.fromkeys(frame["label"]))
    color = alt.Color("value:Q", title=f"{stat}{' (log)' if log else ''}",
                      scale=alt.Scale(type="log" if log else "linear", scheme="viridis"),
                      legend=alt.Legend(format=".3~g"))  # a log scale's raw end value is 17 digits long
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("x0:Q", title="step (cells centred on their statistics step; scroll to zoom)",
                scale=alt.Scale(nice=False, zero=False)),
        x2="x1:Q",
        y=alt.Y("label:N", sort=labels, title=None, axis=alt.Axis(labelLimit=360, labelOverlap=False)),
        color=alt.condition(alt.datum.state == "finite", color, alt.value("#b0b0b0")),
        tooltip=[alt.Tooltip("tensor:N"), alt.Tooltip("layer:N"), alt.Tooltip("step:Q"),
                 alt.Tooltip("value:Q", title=stat, format=".4g"), alt.Tooltip("state:N")],
    ).properties(height=chart_height(len(labels)), title=title).interactive(bind_y=False)


def chart_height(rows: int) -> int:
    """Pixels for ``rows`` heatmap rows: 22 each (labels readable), within 160..2400."""
    return max(160, min(22 * rows, 2400))
