"""TensorBoard-style distributions over steps: percentile bands of a tensor per step and group,
derived from the stored in-graph histograms (the statistics hold no percentiles). No Streamlit
here.

Example::

    hists = data.histograms(path, sig, "conv1/Relu:0", tuple(steps), "forward")
    chart = bands_chart(percentile_frame(hists), plots.GROUP_COLORS, "conv1/Relu:0 forward")
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

#: TensorBoard's distribution bands: min, ~-1.5σ, -1σ, median, +1σ, ~+1.5σ, max (of a normal)
PERCENTILES = (0, 7, 16, 50, 84, 93, 100)


def hist_percentiles(edges: np.ndarray, counts: np.ndarray, qs=PERCENTILES) -> np.ndarray:
    """Percentiles ``qs`` of the values a histogram counts, linear within a bin (exact to a
    bin's width); 0 and 100 are the outer edges of the first and last non-empty bins. NaN
    for an empty histogram.

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


def percentile_frame(hists: dict, groups: tuple[str, ...] | None = None,
                     extremes: dict | None = None) -> pd.DataFrame:
    """One row per (step, group) with a ``p<q>`` column per percentile, from ``{step: {group:
    (edges, counts)}}`` (``viewer.data.histograms``); ``groups``: which to keep (default all).
    ``extremes`` (``{step: {group: (min, max)}}``, the statistics' exact finite min and max):
    p0 and p100 are those, and the other percentiles are clipped into them. A histogram of a
    tensor over the subsample size counts a subsample, whose extremes lie bins inside the
    tensor's (3.7 bin widths on a 19,200-value ReLU): the band labelled 0-100 missed the max."""
    rows = []
    for step, by_group in sorted(hists.items()):
        for g, (edges, counts) in by_group.items():
            if groups is None or g in groups:
                p = hist_percentiles(np.asarray(edges), np.asarray(counts))
                lo, hi = (extremes or {}).get(step, {}).get(g, (np.nan, np.nan))
                if np.isfinite(lo) and np.isfinite(hi) and np.isfinite(p).all():
                    p = np.clip(p, lo, hi)
                    p[0], p[-1] = lo, hi
                rows.append({"step": int(step), "group": str(g), **{f"p{q}": v for q, v in zip(PERCENTILES, p)}})
    cols = ["step", "group"] + [f"p{q}" for q in PERCENTILES]
    return pd.DataFrame(rows, columns=cols).astype({"group": object})


def bands_chart(frame: pd.DataFrame, colors: dict[str, str], title: str = "") -> alt.Chart:
    """Nested bands (0-100, 7-93, 16-84: more opaque inside) per group, groups overlaid in their
    colours; tooltips give the band and the median. One (not layered) chart: Streamlit 1.60's
    frontend drew layered charts of this data empty in Chromium."""
    groups = list(dict.fromkeys(frame["group"]))
    long = pd.concat([frame.assign(band=f"{lo}-{hi}", lo=frame[f"p{lo}"], hi=frame[f"p{hi}"])
                      for lo, hi in ((0, 100), (7, 93), (16, 84))], ignore_index=True)
    long = long[["step", "group", "band", "lo", "hi", "p50"]].astype({"group": object, "band": object})
    return alt.Chart(long).mark_area().encode(
        x=alt.X("step:Q", scale=alt.Scale(zero=False, nice=False)),
        y=alt.Y("lo:Q", title="value"), y2="hi:Q",
        color=alt.Color("group:N", scale=alt.Scale(domain=groups, range=[colors.get(g, "#7f7f7f") for g in groups])),
        opacity=alt.Opacity("band:N", scale=alt.Scale(domain=["0-100", "7-93", "16-84"], range=[0.15, 0.25, 0.4])),
        detail=["group:N", "band:N"],
        tooltip=["step:Q", "group:N", "band:N", alt.Tooltip("lo:Q", format=".4g"), alt.Tooltip("hi:Q", format=".4g"),
                 alt.Tooltip("p50:Q", title="median", format=".4g")],
    ).properties(title=title, height=320).interactive(bind_y=False)
