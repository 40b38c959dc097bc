"""Line charts over steps, as TensorBoard draws scalars: the pointer picks the nearest step
(a rule there, each series' point, one tooltip with every series' value), optional smoothing
(TensorBoard's debiased exponential moving average, the raw line kept faint behind it), a gap
where steps are missing or a value is NaN/Inf (never a line bridging it), and one colour per
series that no other series of the chart shares. No Streamlit here.

Example::

    chart = line_chart(df, "mean", colors=group_colors(df.columns), smoothing=0.6)
    st.altair_chart(chart, width="stretch")       # df: index step, one column per series
"""
from __future__ import annotations

import colorsys
import itertools
import json
from typing import Iterator, Mapping, Sequence

import altair as alt
import numpy as np
import pandas as pd

#: Tableau's 20 colours, the 10 strong ones first (Vega's ``tableau20`` reordered)
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
           "#9d755d", "#bab0ac", "#9ecae9", "#ffbf79", "#88d27a", "#ff9d98", "#b7d6d3", "#f2cf5b",
           "#d6a5c9", "#fcbfd2", "#d8b5a5", "#79706e")
#: The sample groups' colours (inspector.analysis.plots.GROUP_COLORS in CSS form)
GROUPS = {"all": "#595959", "positive": "#b2182b", "negative": "#67a9cf"}
#: The two runs of Compare, A and B: a dark purple and a light orange (apart in hue and in
#: lightness, and from the groups' red and blue)
RUNS = ("#5e3c99", "#f1a340")
#: Steps drawn per series at most (about a chart's width in pixels, as TensorBoard); a longer
#: series is thinned to evenly spaced steps, keeping where a run of NaN/Inf starts and ends
MAX_POINTS = 1000


def axis_format(values, log: bool = False) -> str:
    """The d3 number format of an axis over ``values``: one notation for every tick, so an axis
    never mixes ``0.000001`` with ``1e-7`` (d3's ``g`` switches notation below 1e-6 and at the
    precision's exponent). Exponents (``1e-7``, ``2.5e-3``) on a log axis or where the values
    leave [0.001, 10000); plain decimals otherwise.

    >>> axis_format([1e-7, 3e-6]), axis_format([0.5, 20.0]), axis_format([0.5, 20.0], log=True)
    ('.2~e', ',.4~g', '.2~e')
    """
    v = np.abs(np.asarray(values, np.float64).ravel())
    v = v[np.isfinite(v) & (v > 0)]
    if log or (v.size and (v.min() < 1e-3 or v.max() >= 1e4)):
        return ".2~e"
    return ",.4~g"


def distinct_colors(names: Sequence[str], fixed: Mapping[str, str] | None = None) -> list[str]:
    """One colour per name, none repeated: ``fixed``'s where given, then :data:`PALETTE`'s in
    order (skipping those taken), then evenly spaced hues.

    >>> distinct_colors(["all", "x"], GROUPS)
    ['#595959', '#4c78a8']
    >>> len(set(distinct_colors([str(i) for i in range(45)]))) == 45
    True
    """
    fixed = fixed or {}
    taken = {fixed[n].lower() for n in names if n in fixed}
    spare = (c for c in itertools.chain(PALETTE, _hues()) if c.lower() not in taken)
    return [fixed[n] if n in fixed else next(spare) for n in names]


def _hues() -> Iterator[str]:
    """Colours of evenly spread hues, endless and never repeated (after the palette's 20)."""
    seen = set(PALETTE)
    k = 0
    while True:
        # golden-ratio steps: consecutive hues far apart
        h = (k * 0.618033988749895) % 1.0
        light, sat = (0.42, 0.65) if k % 2 else (0.55, 0.75)
        c = "#{:02x}{:02x}{:02x}".format(
            *(round(x * 255) for x in colorsys.hls_to_rgb(h, light, sat)))
        if c not in seen:
            seen.add(c)
            yield c
        k += 1


def group_colors(names: Sequence[str]) -> list[str]:
    """Colours of sample-group series: the group colours, any other group a palette colour."""
    return distinct_colors([str(n) for n in names], GROUPS)


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased (the first points are
    not pulled towards 0), over the finite values (a NaN/Inf stays NaN and is skipped).

    >>> smooth(np.array([1.0, 1.0, 3.0]), 0.5).tolist()
    [1.0, 1.0, 2.142857142857143]
    """
    out = np.full(len(values), np.nan)
    last, n = 0.0, 0
    for i, v in enumerate(np.asarray(values, np.float64)):
        if not np.isfinite(v):
            continue
        last, n = last * weight + (1 - weight) * v, n + 1
        out[i] = last / (1 - weight ** n) if weight > 0 else v
    return out


def segments(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A segment number per point: a new segment after a missing step (a gap over 1.5 times the
    series' usual stride, its median) or a NaN/Inf value, so the line breaks there.

    >>> segments(np.array([0, 1, 2, 5, 6, 7]), np.array([1, 1, 1, 1, np.nan, 1.0])).tolist()
    [0, 0, 0, 1, 2, 3]
    """
    steps = np.asarray(steps, np.float64)
    bad = ~np.isfinite(np.asarray(values, np.float64))
    gap = np.diff(steps)
    stride = np.median(gap) if len(gap) else 1.0
    new = np.r_[False, gap > 1.5 * stride] | bad | np.r_[False, bad[:-1]]
    return np.cumsum(new)


def thinned(values: np.ndarray, most: int) -> np.ndarray:
    """Indices of about ``most`` evenly spaced points of ``values``, first and last kept, and
    where each run of NaN/Inf starts and ends (so the line's gaps stay where they are).

    >>> thinned(np.array([1, 2, np.nan, np.nan, np.nan, 6, 7, 8, 9.0]), 3).tolist()
    [0, 2, 4, 8]
    """
    bad = ~np.isfinite(np.asarray(values, np.float64))
    edges = np.flatnonzero(bad & ~np.r_[False, bad[:-1]]), \
        np.flatnonzero(bad & ~np.r_[bad[1:], False])
    even = np.linspace(0, len(values) - 1, most).round().astype(int)
    return np.unique(np.concatenate([even, *edges]))


def long_frame(df: pd.DataFrame, log: bool, weight: float) -> pd.DataFrame:
    """One record per (series, step): ``value`` (NaN/Inf, and <= 0 on a log axis, as missing),
    ``smoothed``, ``segment`` and ``series`` (the column's name)."""
    parts = []
    for col in df.columns:
        s = df[col]
        steps, v = s.index.to_numpy(np.int64), s.to_numpy(np.float64)
        if len(steps) > MAX_POINTS:
            keep = thinned(v, MAX_POINTS)
            steps, v = steps[keep], v[keep]
        v = np.where(np.isfinite(v) & ((v > 0) if log else True), v, np.nan)
        parts.append(pd.DataFrame({"step": steps, "series": str(col), "value": v,
                                   "smoothed": smooth(v, weight) if weight > 0 else v,
                                   "segment": segments(steps, v)}))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"step": [], "series": [], "value": [], "smoothed": [], "segment": []})
    # not pandas 3's Arrow strings: Vega-Lite cannot read large_string
    return out.astype({"series": object})


def line_chart(df: pd.DataFrame, y_title: str, *, colors: Sequence[str] | None = None,
               log: bool = False, smoothing: float = 0.0, height: int = 300, title: str = "",
               legend_title: str = "series", highlight: str | None = None
               ) -> alt.LayerChart:
    """The chart of ``df`` (index: step; one column per series) with ``colors`` (one per
    column; default :func:`distinct_colors`), a log y axis if ``log`` (values <= 0 left out),
    smoothed by ``smoothing`` (0..1, 0: none). ``highlight``: that series drawn bold and every
    other faint (many series in one chart are told apart by picking one, not by colour alone)."""
    names = [str(c) for c in df.columns]
    colors = list(colors) if colors is not None else distinct_colors(names)
    if len(set(c.lower() for c in colors)) < len(colors):
        raise ValueError(f"colours {colors} repeat: every series of a chart needs its own")
    long = long_frame(df, log, smoothing)
    shown = "smoothed" if smoothing > 0 else "value"
    color = alt.Color("series:N", scale=alt.Scale(domain=names, range=colors), sort=names,
                      legend=alt.Legend(title=legend_title, labelLimit=320))
    x = alt.X("step:Q", title="step", scale=alt.Scale(zero=False, nice=False))
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    y = alt.Y(f"{shown}:Q", title=f"{y_title} (log scale)" if log else y_title, scale=scale,
              axis=alt.Axis(format=axis_format(long["value"], log)))
    base = alt.Chart(long).encode(x=x)
    layers = []
    if smoothing > 0:  # the raw values, faint, behind the smoothed line (as TensorBoard)
        layers.append(base.mark_line(opacity=0.25, strokeWidth=1).encode(
            y=alt.Y("value:Q", scale=scale), color=color, detail="segment:N"))
    emphasis = {}
    if highlight is not None:
        chosen = f"datum.series === {json.dumps(str(highlight))}"
        emphasis = {"opacity": alt.condition(chosen, alt.value(1.0), alt.value(0.18)),
                    "strokeWidth": alt.condition(chosen, alt.value(3.0), alt.value(1.2))}
    layers.append(base.mark_line(strokeWidth=1.6).encode(y=y, color=color, detail="segment:N",
                                                         **emphasis))
    hover = alt.selection_point(name="near", nearest=True, on="pointermove", fields=["step"],
                                empty=False, clear="pointerout")
    layers.append(
        base.mark_point(filled=True, size=45).encode(y=y, color=color).transform_filter(hover))
    layers.append(_rules(long, names, shown, x, hover))
    return alt.layer(*layers).properties(height=height, title=title)


def _rules(long: pd.DataFrame, names: list[str], shown: str, x: alt.X, hover) -> alt.Chart:
    """One invisible rule per step carrying the pointer's nearest-step selection and a tooltip
    with every series' value there (fields ``s0``, ``s1``...: series names are not field names)."""
    wide = long.pivot_table(index="step", columns="series", values=shown, aggfunc="last",
                            dropna=False)
    wide = wide.reindex(columns=names).rename(
        columns={n: f"s{i}" for i, n in enumerate(names)}).reset_index()
    tips = [alt.Tooltip("step:Q", title="step")] + [alt.Tooltip(f"s{i}:Q", title=n, format=".4~g")
                                                    for i, n in enumerate(names)]
    return alt.Chart(wide).mark_rule(color="#888888").encode(
        x=x, opacity=alt.condition(hover, alt.value(0.7), alt.value(0)),
        tooltip=tips).add_params(hover)
