"""TensorBoard-style distributions over steps: percentile bands of a tensor per step and group
(0-100, 7-93, 16-84, and the median as a line), from the stored histograms' quantiles, with a
y range that the extremes do not flatten. No Streamlit here.

Log-magnitude histograms (format version 4) give each percentile within
``inspector.format.loghist.RELATIVE_ERROR`` (5.9%) of the exact one of the values they count; the
equal-width bins of older runs give it linear within a bin (exact to one bin width). 0 and 100
are the statistics' exact min and max where known.

Example::

    hists = data.histograms(path, sig, "conv1/Relu:0", tuple(steps), "forward")
    chart = bands_chart(percentile_frame(hists), "conv1/Relu:0 forward")
"""
from __future__ import annotations

from typing import Mapping

import altair as alt
import numpy as np
import pandas as pd

from inspector.analysis import hist_view
from inspector.format.loghist import LogHistogram, bucket_edges

from .lines import axis_format

#: TensorBoard's distribution bands: min, ~-1.5σ, -1σ, median, +1σ, ~+1.5σ, max (of a normal)
PERCENTILES = (0, 7, 16, 50, 84, 93, 100)
BANDS = ((0, 100), (7, 93), (16, 84))
#: The robust y range: the 7th-93rd percentiles padded by this share of their span each side...
PAD = 0.15
#: ...unless the 0-100 band fits in this many times that range: then it is shown whole.
FITS = 3.0


def hist_percentiles(edges: np.ndarray, counts: np.ndarray, qs=PERCENTILES) -> np.ndarray:
    """Percentiles ``qs`` of the values an equal-width histogram counts, linear within a bin
    (exact to a bin's width); 0 and 100 are the outer edges of the first and last non-empty
    bins. NaN for an empty histogram.

    >>> hist_percentiles(np.array([0., 1., 2.]), np.array([1, 1]), (0, 50, 100)).tolist()
    [0.0, 1.0, 2.0]
    """
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    if total <= 0:
        return np.full(len(qs), np.nan)
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    nonempty = np.flatnonzero(counts)
    out = []
    for q in qs:
        if q <= 0:
            out.append(edges[nonempty[0]])
            continue
        if q >= 100:
            out.append(edges[nonempty[-1] + 1])
            continue
        target = q / 100 * total
        i = int(np.clip(np.searchsorted(cum, target, side="left") - 1, 0, len(counts) - 1))
        frac = (target - cum[i]) / counts[i] if counts[i] else 0.0
        out.append(edges[i] + frac * (edges[i + 1] - edges[i]))
    return np.asarray(out, np.float64)


def percentile_frame(hists: Mapping[int, Mapping[str, hist_view.Source]],
                     groups: tuple[str, ...] | None = None,
                     extremes: dict | None = None) -> pd.DataFrame:
    """One row per (step, group) with a ``p<q>`` column per percentile, from ``{step: {group:
    histogram}}`` (``viewer.data.histograms``): a log-magnitude histogram's quantiles
    (:func:`inspector.analysis.hist_view.row_quantiles`; 0 and 100 the outer edges of its extreme
    buckets), an equal-width one's :func:`hist_percentiles`; ``groups``: which to keep
    (default all). ``extremes`` (``{step: {group: (min, max)}}``, the statistics' exact finite
    min and max): p0 and p100 are those, and the other percentiles are clipped into them. A
    histogram of a tensor over the subsample size counts a subsample, whose extremes lie inside
    the tensor's: the band labelled 0-100 would miss the max."""
    keys = [(int(step), str(g), h) for step, by_group in sorted(hists.items())
            for g, h in by_group.items()
            if groups is None or g in groups]
    is_log = np.array([isinstance(h, LogHistogram) for _, _, h in keys], bool)
    p = np.full((len(keys), len(PERCENTILES)), np.nan)
    p[is_log] = hist_view.row_quantiles([h for (_, _, h), b in zip(keys, is_log) if b],
                                        [q / 100 for q in PERCENTILES])
    for k in np.flatnonzero(~is_log):
        p[k] = hist_percentiles(np.asarray(keys[k][2][0]), np.asarray(keys[k][2][1]))
    lo, hi = np.array([(extremes or {}).get(s, {}).get(g, (np.nan, np.nan)) for s, g, _ in keys],
                      np.float64).reshape(-1, 2).T
    exact = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(p).all(1)
    p[exact] = np.clip(p[exact], lo[exact, None], hi[exact, None])
    p[exact, 0], p[exact, -1] = lo[exact], hi[exact]
    # no exact extremes: the outer bucket edges
    edge = np.flatnonzero(~exact & is_log & np.isfinite(p).all(1))
    if edge.size:
        first, _ = bucket_edges(np.array([keys[k][2].index[0] for k in edge]))
        _, last = bucket_edges(np.array([keys[k][2].index[-1] for k in edge]))
        p[edge, 0], p[edge, -1] = first, np.minimum(last, 2.0 ** 129)
    out = pd.DataFrame({"step": [s for s, _, _ in keys], "group": [g for _, g, _ in keys],
                        **{f"p{q}": p[:, j] for j, q in enumerate(PERCENTILES)}})
    return out.astype({"step": np.int64, "group": object})


def y_range(frame: pd.DataFrame) -> tuple[float, float, bool]:
    """(low, high, clipped): the 7th-93rd percentiles over every step and group, padded by
    :data:`PAD` of their span; the 0-100 band's whole range instead where it fits in
    :data:`FITS` times that (clipped: False)."""
    inner = frame[["p7", "p93"]].to_numpy(np.float64)
    outer = frame[["p0", "p100"]].to_numpy(np.float64)
    inner, outer = inner[np.isfinite(inner)], outer[np.isfinite(outer)]
    if not inner.size:
        return 0.0, 1.0, False
    lo, hi = float(inner.min()), float(inner.max())
    span = hi - lo or max(abs(hi), 1e-30)
    lo, hi = lo - PAD * span, hi + PAD * span
    if outer.size and outer.max() - outer.min() <= FITS * (hi - lo):
        return min(lo, float(outer.min())), max(hi, float(outer.max())), False
    return lo, hi, bool(outer.size and (outer.min() < lo or outer.max() > hi))


def symlog_constant(frame: pd.DataFrame) -> float:
    """The linear zone of a symmetric-log y axis: the 10th percentile of the non-zero
    magnitudes of the inner percentiles (7 to 93), so a gradient's small values are not one line."""
    v = np.abs(frame[[f"p{q}" for q in PERCENTILES[1:-1]]].to_numpy(np.float64))
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.percentile(v, 10)) if v.size else 1.0


def bands_chart(frame: pd.DataFrame, title: str = "", symlog: bool = False) -> alt.LayerChart:
    """Nested bands (0-100, 7-93, 16-84: more opaque inside) per group and the median as a line,
    groups overlaid in their colours; tooltips give the band and the median. y: the robust
    :func:`y_range` (bands clipped at its edges), or with ``symlog`` a symmetric-log axis
    over every band (:func:`symlog_constant`)."""
    groups = list(dict.fromkeys(frame["group"]))
    colors = hist_view.group_colors(groups)
    long = pd.concat([frame.assign(band=f"{lo}-{hi}", lo=frame[f"p{lo}"], hi=frame[f"p{hi}"])
                      for lo, hi in BANDS],
                     ignore_index=True)
    long = long[["step", "group", "band", "lo", "hi", "p50"]].astype(
        {"group": object, "band": object})
    if symlog:
        yscale = alt.Scale(type="symlog", constant=symlog_constant(frame))
    else:
        lo, hi, _ = y_range(frame)
        yscale = alt.Scale(domain=[lo, hi], nice=False, zero=False)
    color = alt.Color("group:N", scale=alt.Scale(domain=groups, range=[colors[g] for g in groups]))
    x = alt.X("step:Q", scale=alt.Scale(zero=False, nice=False))
    axis = alt.Axis(format=axis_format(long[["lo", "hi"]], bool(symlog)))
    area = alt.Chart(long).mark_area(clip=True).encode(
        x=x, y=alt.Y("lo:Q", title="value", scale=yscale, axis=axis),
        y2="hi:Q", color=color,
        opacity=alt.Opacity("band:N", scale=alt.Scale(domain=[f"{a}-{b}" for a, b in BANDS],
                                                      range=[0.08, 0.2, 0.36])),
        detail=["group:N", "band:N"],
        tooltip=["step:Q", "group:N", "band:N", alt.Tooltip("lo:Q", format=".4g"),
                 alt.Tooltip("hi:Q", format=".4g"),
                 alt.Tooltip("p50:Q", title="median", format=".4g")],
    ).add_params(alt.selection_interval(bind="scales", encodings=["x"], name="zoom_bands"))
    median = alt.Chart(frame[["step", "group", "p50"]]).mark_line(
        strokeWidth=1.8, clip=True).encode(
            x=x, y=alt.Y("p50:Q", scale=yscale), color=color,
            tooltip=["step:Q", "group:N", alt.Tooltip("p50:Q", title="median", format=".4g")])
    return alt.layer(area, median, title=title).properties(height=320)
