"""How histograms are drawn: one x axis for every histogram of a chart (signed log-magnitude or
linear), the bars each histogram becomes on it, the ticks, and the numbers that compare groups.
NumPy and pandas only: the viewer's Vega-Lite charts (``viewer.charts.hist_charts``) and the
Matplotlib figures of :mod:`inspector.analysis.plots` both draw :func:`panel_frame`'s bars, so a PNG
shows what the page shows.

**Signed log axis.** A value ``v`` sits at ``x = sign(v) * (log2|v| - F + GAP)``: ``F`` is the
floor of log2 of the smallest non-zero magnitude any histogram of the chart holds, so the
smallest bucket starts ``GAP`` (one power of two) right of 0 and its negative twin as far left.
One unit of x is a factor of 2. Exact zeros are a bar of their own centred at 0; the bucket of
magnitudes below 2**-126 a narrow bar between it and the smallest normal bucket. Ticks are
powers of ten (or 1-2-5 steps in a short range) labelled with their signed value.

**Linear axis.** A log-magnitude histogram is re-binned into ``bins`` equal bins over the
values' exact [min, max]: each bucket's count is split over the bins it overlaps in proportion
to the overlap (its values taken as uniform within the bucket). Equal-width histograms (runs
written before format version 4) keep their own bins: they cannot go on a log axis.

**auto** (:func:`choose_axis`): gradients and updates get the signed log axis; forward values
the linear one, unless it would put more than :data:`SPIKE` of the non-zero values in one bin
(a long tail, or groups of very different scales), where they get the log axis too.

y is the fraction of a group's counted values in each bar (each group's bars sum to 1).

Example::

    axis = choose_axis(hists.values(), kind="gradient")          # {group: LogHistogram}
    frame = panel_frame({"": hists}, axis)                       # one row per bar
    xs, labels = ticks(axis, frame["x0"].min(), frame["x1"].max())
"""
from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, Union

import numpy as np
import pandas as pd

from inspector.format.loghist import (CEIL, FLOOR, RELATIVE_ERROR, LogHistogram, bucket_edges,
                                      bucket_value, merge)

#: A histogram as a statistics row holds it: log-magnitude buckets, or equal-width (edges, counts).
Source = Union[LogHistogram, tuple]
SCALES = ("auto", "log", "linear")
#: x between 0 and the edge of the smallest bucket shown (in powers of two).
GAP = 1.0
#: The zero bar spans [-ZERO_HALF, ZERO_HALF];
#: the sub-2**-126 bucket's bar FLOOR_BAR (mirrored for negatives).
ZERO_HALF = 0.2
FLOOR_BAR = (0.45, 0.7)
#: Width of the >= 2**128 bucket's bar (one bucket of the top octave).
CEIL_WIDTH = 1 / 8
LINEAR_BINS = 40
#: auto: forward values go on the log axis when one linear bin would hold more
#: than this share of them.
SPIKE = 0.3
#: The columns of :func:`panel_frame`.
COLUMNS = ["side", "group", "label", "x0", "x1", "lo", "hi", "count", "fraction", "zero"]


@dataclass(frozen=True)
class Axis:
    """One chart's x axis: ``scale`` "log" (signed log-magnitude, ``floor`` = F) or "linear"
    (``bins`` equal bins over [``lo``, ``hi``] for log-magnitude histograms)."""
    scale: str
    floor: int = 0
    lo: float = 0.0
    hi: float = 1.0
    bins: int = LINEAR_BINS

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, self.bins + 1)

    def x(self, v: np.ndarray | float) -> np.ndarray:
        """Where values ``v`` sit on the axis (log: 0 at 0; a magnitude at least the FLOOR bar's
        end, so no value crosses to the other sign)."""
        v = np.asarray(v, np.float64)
        if self.scale == "linear":
            return v
        with np.errstate(divide="ignore"):
            m = np.log2(np.abs(v)) - self.floor + GAP
        return np.where(v == 0, 0.0, np.sign(v) * np.maximum(m, FLOOR_BAR[1]))

    def title(self) -> str:
        return "value (signed log scale: one unit = x2)" if self.scale == "log" else "value"


def value_range(h: LogHistogram) -> tuple[float, float]:
    """The smallest bucket's low edge and the largest's high edge (finite: CEIL ends at 2**129)."""
    if not len(h.index):
        return 0.0, 0.0
    lo, hi = bucket_edges(np.array([h.index.min(), h.index.max()]))
    return float(max(lo[0], -2.0 ** 129)), float(min(hi[1], 2.0 ** 129))


def _finite_extent(extent: tuple[float, float] | None) -> tuple[float, float] | None:
    if extent is None or not np.all(np.isfinite(extent)) or extent[0] > extent[1]:
        return None
    return float(extent[0]), float(extent[1])


def linear_axis(lo: float, hi: float, bins: int = LINEAR_BINS) -> Axis:
    """``bins`` equal bins over [lo, hi] (widened by 0.5 each side if equal)."""
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return Axis("linear", lo=lo, hi=hi, bins=bins)


def log_floor(h: LogHistogram) -> int:
    """F: floor(log2) of the smallest non-zero magnitude ``h`` counts (-126 when only values
    below 2**-126 are non-zero; 0 with no non-zero value)."""
    a = np.abs(np.asarray(h.index, np.int64))
    normal = a[a >= 2]
    if normal.size:
        return int((normal.min() - 2) // 8 - 126)
    return -126 if (a == FLOOR).any() else 0


def choose_axis(hists: Iterable[Source], kind: str = "forward", scale: str = "auto",
                extent: tuple[float, float] | None = None, bins: int = LINEAR_BINS) -> Axis:
    """One axis for every histogram of a chart. ``scale``: "auto" (see the module), "log" or
    "linear"; equal-width histograms force "linear". ``extent``: the values' exact (min, max)
    (the statistics'), the linear axis's range; else the buckets' edges."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    hs = list(hists)
    logs = [h for h in hs if isinstance(h, LogHistogram)]
    merged = merge(logs)
    ext = _finite_extent(extent)
    ranges = [value_range(merged)] if merged.total else []
    ranges += [(float(h[0][0]), float(h[0][-1])) for h in hs if not isinstance(h, LogHistogram)]
    lo, hi = ext or ((min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges
                     else (0.0, 1.0))
    if len(logs) == len(hs) and (scale == "log" or (scale == "auto" and (
            kind != "forward" or spike(merged, linear_axis(lo, hi, bins)) > SPIKE))):
        return Axis("log", floor=log_floor(merged))
    return linear_axis(lo, hi, bins)


def spike(h: LogHistogram, axis: Axis) -> float:
    """The largest share of ``h``'s non-zero values that one bin of the linear ``axis`` holds
    (0 without non-zero values)."""
    nonzero = LogHistogram(h.index[h.index != 0], h.count[h.index != 0])
    counts = rebin(nonzero, axis)
    return float(counts.max() / counts.sum()) if counts.sum() > 0 else 0.0


def rebin(h: LogHistogram, axis: Axis) -> np.ndarray:
    """Counts of ``h`` in the linear ``axis``'s bins: each bucket, clipped to [lo, hi], split
    over the bins it overlaps in proportion to the overlap; a bucket that is a point there
    (zeros, or clipped to one value) goes whole to the bin holding it."""
    edges = axis.edges
    lo, hi = bucket_edges(h.index)
    lo, hi = np.clip(lo, axis.lo, axis.hi), np.clip(hi, axis.lo, axis.hi)
    count = np.asarray(h.count, np.float64)
    point = hi <= lo
    width = np.where(point, 1.0, hi - lo)
    # mass of each spread bucket below each inner edge, summed over buckets
    below = np.clip((edges[None, 1:-1] - lo[~point, None]) / width[~point, None], 0, 1) \
        * count[~point, None]
    cum = np.concatenate([[0.0], below.sum(0), [count[~point].sum()]])
    out = np.diff(cum)
    at = np.clip(np.searchsorted(edges, lo[point], side="right") - 1, 0, axis.bins - 1)
    np.add.at(out, at, count[point])
    return out


def bars(h: Source, axis: Axis) -> pd.DataFrame:
    """One histogram's bars on ``axis``: ``x0``, ``x1`` (axis coordinates), the values each
    holds ``lo``..``hi``, ``count`` (estimated where re-binned), ``fraction`` of the
    histogram's counted values and ``zero`` (the bar of exact zeros, centred at 0: on the log
    axis and on the linear one alike, so a ReLU's zeros never hide in the first bin). Log
    axis: one bar per non-empty bucket; linear: every bin, then the zeros' bar if any."""
    return pd.DataFrame(_bars(h, axis))


def _bars(h: Source, axis: Axis) -> dict[str, np.ndarray]:
    if not isinstance(h, LogHistogram):
        if axis.scale == "log":
            raise ValueError("an equal-width histogram (a run before format version 4) has no "
                             "log-magnitude buckets: draw it on a linear axis")
        edges, counts = np.asarray(h[0], np.float64), np.asarray(h[1], np.float64)
        return _frame(edges[:-1], edges[1:], edges[:-1], edges[1:], counts,
                      np.zeros(len(counts), bool))
    idx = np.asarray(h.index, np.int64)
    if axis.scale == "linear":
        e, zeros = axis.edges, float(h.count[idx == 0].sum())
        half = (e[1] - e[0]) / 4
        counts = rebin(LogHistogram(h.index[idx != 0], h.count[idx != 0]), axis)
        n = len(counts)
        if not zeros:
            return _frame(e[:-1], e[1:], e[:-1], e[1:], counts, np.zeros(n, bool))
        return _frame(np.r_[e[:-1], -half], np.r_[e[1:], half], np.r_[e[:-1], 0.0],
                      np.r_[e[1:], 0.0], np.r_[counts, zeros], np.r_[np.zeros(n, bool), True])
    lo, hi = bucket_edges(idx)
    x0, x1 = axis.x(lo), axis.x(np.where(np.isinf(hi), 2.0 ** 128, hi))
    a, neg = np.abs(idx), idx < 0
    top = float(axis.x(2.0 ** 128))
    special = {0: (-ZERO_HALF, ZERO_HALF), FLOOR: FLOOR_BAR, CEIL: (top, top + CEIL_WIDTH)}
    for b, (s0, s1) in special.items():
        x0 = np.where(a == b, np.where(neg, -s1, s0), x0)
        x1 = np.where(a == b, np.where(neg, -s0, s1), x1)
    return _frame(x0, x1, lo, hi, h.count.astype(np.float64), idx == 0)


def _frame(x0, x1, lo, hi, count, zero) -> dict[str, np.ndarray]:
    count = np.asarray(count, np.float64)
    total = float(count.sum())
    return {"x0": np.asarray(x0, np.float64), "x1": np.asarray(x1, np.float64),
            "lo": np.asarray(lo, np.float64), "hi": np.asarray(hi, np.float64),
            "count": np.asarray(count, np.float64),
            "fraction": count / total if total > 0 else np.zeros_like(count),
            "zero": np.asarray(zero, bool)}


def y_top(fraction: np.ndarray, zero: np.ndarray) -> float | None:
    """A linear y axis's top where the zeros' bars would flatten the others (a ReLU's 60% beside
    buckets of 1% each): 1.15 x the tallest other bar, when a zeros' bar is taller than that;
    else None (the bars' own maximum)."""
    f, z = np.asarray(fraction, np.float64), np.asarray(zero, bool)
    if not z.any() or not (f[~z] > 0).any():
        return None
    top = 1.15 * float(f[~z].max())
    return top if f[z].max() > top else None


#: The fixed colours of the sample groups (positive a dark red, negative a light blue, all grey):
#: they differ in lightness as well as hue (CIE L* 38 vs 66), so overlaid translucent bands stay
#: apart, and read apart in greyscale and for red-green colour blindness.
GROUP_COLORS = {"all": "#595959", "positive": "#b2182b", "negative": "#67a9cf"}
#: Colours for other groups (classes, named groups):
#: Matplotlib's tab10 without its red, blue and grey.
PALETTE = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f"]


def group_colors(groups: Iterable[str]) -> dict[str, str]:
    """A colour per group, none repeated within the call: the fixed ones, then :data:`PALETTE`,
    then hues spread by the golden angle.

    >>> group_colors(["positive", "negative", "c0"])
    {'positive': '#b2182b', 'negative': '#67a9cf', 'c0': '#ff7f0e'}
    """
    gs = list(dict.fromkeys(groups))
    out = {g: GROUP_COLORS[g] for g in gs if g in GROUP_COLORS}
    free = [c for c in PALETTE if c not in out.values()]
    k = 0
    for g in gs:
        if g in out:
            continue
        if free:
            out[g] = free.pop(0)
            continue
        r, gr, b = colorsys.hls_to_rgb((0.11 + 0.618034 * k) % 1.0, 0.45, 0.65)
        k += 1
        out[g] = "#{:02x}{:02x}{:02x}".format(*(round(255 * v) for v in (r, gr, b)))
    return out


def legend_label(group: str, shown: int, total: int | None) -> str:
    """'positive (n=70,000; histogram of 16,384)': the real element count and, separately,
    how many values the histogram counts where that differs (a subsample, non-finite values)."""
    if total is None or total == shown:
        return f"{group} (n={shown:,})"
    return f"{group} (n={total:,}; histogram of {shown:,})"


def counted(h: Source) -> int:
    """How many values a histogram counts."""
    return h.total if isinstance(h, LogHistogram) else int(np.sum(h[1]))


def panel_frame(sides: Mapping[str, Mapping[str, Source]], axis: Axis,
                totals: Mapping[str, Mapping[str, int]] | None = None) -> pd.DataFrame:
    """Every bar of a chart, ``{side: {group: histogram}}`` (one side "" for a single
    histogram set; "A"/"B" to overlay two steps or runs): :data:`COLUMNS`, ``label`` the
    legend entry (:func:`legend_label`, ``totals`` ``{side: {group: n}}`` the real element
    counts)."""
    return _table([_panel(sides, axis, totals)], COLUMNS)


def _panel(sides: Mapping[str, Mapping[str, Source]], axis: Axis,
           totals: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, np.ndarray]:
    """:func:`panel_frame`'s columns as arrays (one DataFrame per chart, not per group: a ridge
    plot's dozens of histograms cost pandas' overhead once)."""
    parts = []
    for side, groups in sides.items():
        for g, h in groups.items():
            cols = _bars(h, axis)
            n = len(cols["x0"])
            label = legend_label(g, counted(h), (totals or {}).get(side, {}).get(g))
            parts.append({**cols, "side": np.full(n, side, object), "group": np.full(n, g, object),
                          "label": np.full(n, label, object)})
    return {c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, object)
            for c in COLUMNS}


def _table(parts: list[dict[str, np.ndarray]], columns: list[str]) -> pd.DataFrame:
    """One DataFrame of column arrays; text columns stay object, not pandas 3's string dtype
    (Arrow large_string: Streamlit's Vega-Lite cannot read it)."""
    df = pd.DataFrame({c: np.concatenate([p[c] for p in parts]) for c in columns} if parts else
                      {c: np.zeros(0, object) for c in columns})
    return df.astype({c: object for c in ("side", "group", "label") if c in df.columns})


def steps(x0: np.ndarray, x1: np.ndarray, y: np.ndarray,
          base: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(edges [K + 1], values [K]) of bars ``x0``..``x1`` at heights ``y`` as one contiguous
    step outline: gaps between bars at ``base`` (Matplotlib's ``stairs``; a Vega step line)."""
    order = np.argsort(x0, kind="stable")
    x0, x1, y = (np.asarray(a, np.float64)[order] for a in (x0, x1, y))
    if not len(x0):
        return np.zeros(1), np.zeros(0)
    edges, values = [x0[0]], []
    for a, b, v in zip(x0, x1, y):
        if a > edges[-1]:
            edges.append(a)
            values.append(base)
        edges.append(max(b, edges[-1]))
        values.append(v)
    return np.asarray(edges), np.asarray(values)


def ticks(axis: Axis, x_lo: float, x_hi: float, per_side: int = 4) -> tuple[list[float], list[str]]:
    """Tick positions and labels of a log ``axis`` shown over [x_lo, x_hi]: 0, and on each side
    that has values the same round magnitudes (:func:`nice_magnitudes` of the wider side, at
    most ``per_side``), labelled with their signed value. Empty for a linear axis (the plotting
    library's own ticks)."""
    if axis.scale != "log":
        return [], []
    reach = max(x_hi, -x_lo)
    if reach <= FLOOR_BAR[1]:
        return [0.0], ["0"]
    mags = nice_magnitudes(2.0 ** axis.floor, 2.0 ** (reach - GAP + axis.floor), per_side)
    xs, labels = [0.0], ["0"]
    for sign, side in ((1, x_hi), (-1, -x_lo)):
        for v in mags:
            x = float(axis.x(v))
            if FLOOR_BAR[1] < x <= side + 1e-9:
                xs.append(sign * x)
                labels.append(tick_label(sign * v))
    return xs, labels


def nice_magnitudes(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round magnitudes in [lo, hi]: powers of ten (every k-th, at most ``most``), or 1-2-5
    steps where the range holds fewer than two powers.

    >>> nice_magnitudes(1e-7, 3e-2)
    [1e-07, 1e-06, 1e-05, 0.0001, 0.001, 0.01]
    >>> nice_magnitudes(0.3, 3)
    [0.5, 1.0, 2.0]
    """
    k0, k1 = int(np.ceil(np.log10(lo) - 1e-9)), int(np.floor(np.log10(hi) + 1e-9))
    if k1 - k0 + 1 >= 2:
        stride = int(np.ceil((k1 - k0 + 1) / most))
        return [10.0 ** k for k in range(k0, k1 + 1) if k % stride == 0]
    out = [m * 10.0 ** k for k in range(k0 - 1, k1 + 1) for m in (1, 2, 5)]
    return [v for v in out if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]


def tick_label(v: float) -> str:
    """'0.01', '-2', '1e-6', '-5e7': plain between 1e-3 and 1e3, else mantissa 'e' exponent."""
    if v == 0:
        return "0"
    k = int(np.floor(np.log10(abs(v)) + 1e-9))
    if -3 <= k <= 3:
        return f"{v:g}"
    return f"{round(v / 10.0 ** k)}e{k}"


def row_quantiles(hists: Sequence[LogHistogram], q: Sequence[float]) -> np.ndarray:
    """[len(hists), len(q)]: each histogram's
    :meth:`~inspector.format.loghist.LogHistogram.quantiles` (the same rank rule and stand-in
    values; NaN for an empty one) in one pass over every row, not one call per row: percentile bands
    over thousands of steps.

    >>> row_quantiles([LogHistogram.of(np.array([1.0, 2.0, 4.0])), LogHistogram.of(np.zeros(0))],
    ...               [0.5]).tolist()
    [[2.1176470588235294], [nan]]
    """
    qs = np.asarray(q, np.float64)
    if qs.size and (not np.all(np.isfinite(qs)) or qs.min() < 0 or qs.max() > 1):
        raise ValueError(f"quantiles must lie in [0, 1], got {np.asarray(q).tolist()}")
    if not len(hists):
        return np.zeros((0, qs.size))
    sizes = np.array([len(h.index) for h in hists], np.int64)
    index = np.concatenate([np.asarray(h.index, np.int64) for h in hists])
    cum = np.cumsum(np.concatenate([np.asarray(h.count, np.int64) for h in hists]))
    ends = np.cumsum(sizes)
    before = np.r_[0, cum][ends - sizes]              # values counted by the rows before each
    n = np.r_[0, cum][ends] - before
    rank = np.floor(qs[None, :] * (n[:, None] - 1)).astype(np.int64)
    # each row's buckets ascend, so the first running count past before + rank lies in the row
    at = np.clip(np.searchsorted(cum, before[:, None] + rank, side="right"), 0,
                 max(len(index) - 1, 0))
    out = bucket_value(index[at]) if len(index) else np.zeros(at.shape)
    return np.where((n > 0)[:, None], out, np.nan)


def magnitudes(h: LogHistogram) -> LogHistogram:
    """The histogram of ``|x|``: bucket ``b`` and ``-b`` merged."""
    return LogHistogram.from_lists(np.abs(np.asarray(h.index, np.int64)), h.count)


def magnitude_summary(groups: Mapping[str, Source]) -> pd.DataFrame:
    """Per group of log-magnitude histograms: ``counted`` values, ``zeros`` (the share that is
    exactly 0) and ``median_abs``, the median of the non-zero ``|x|`` (within
    ``RELATIVE_ERROR``; NaN when none). Equal-width histograms are left out: their bins give
    no quantile with a bound."""
    rows = []
    for g, h in groups.items():
        if not isinstance(h, LogHistogram) or not h.total:
            continue
        m = magnitudes(h)
        zeros = int(m.count[m.index == 0].sum())
        nonzero = LogHistogram(m.index[m.index != 0], m.count[m.index != 0])
        median = float(nonzero.quantiles([0.5])[0]) if nonzero.total else np.nan
        rows.append({"group": g, "counted": h.total, "zeros": zeros / h.total,
                     "median_abs": median})
    return pd.DataFrame(rows, columns=["group", "counted", "zeros", "median_abs"])


def ratio_text(summary: pd.DataFrame, noun: str) -> str:
    """One line a reader compares groups by: each group's median non-zero ``|noun|`` and its
    ratio to the first group's ("negative / positive: 0.1x"), and where any, the exact zeros."""
    s = summary[np.isfinite(summary["median_abs"].astype(np.float64))]
    if s.empty:
        return ""
    medians = ", ".join(f"{g} {m:.3g}" for g, m in zip(s["group"], s["median_abs"]))
    text = f"median non-zero |{noun}|: {medians}"
    g0, m0 = s["group"].iloc[0], s["median_abs"].iloc[0]
    ratios = [f"{g} / {g0}: {m / m0:.3g}x" for g, m in zip(s["group"][1:], s["median_abs"][1:])]
    if ratios:
        text += f" ({'; '.join(ratios)}; each median within {RELATIVE_ERROR:.1%})"
    if (summary["zeros"] > 0).any():
        text += "; exact zeros: " \
            + ", ".join(f"{g} {z:.1%}" for g, z in zip(summary["group"], summary["zeros"]))
    return text


def axis_caption(axis: Axis, rebinned: bool = True) -> str:
    """What the bars are, for a chart's caption."""
    if axis.scale == "log":
        return ("x: signed log-magnitude axis, one bar per stored bucket (8 per power of two; "
                "exact zeros the bar at 0, negative values mirrored left); y: fraction of the "
                "group's counted values per bucket")
    if not rebinned:
        return ("x: linear, the stored equal-width bins (a run before format version 4); y: "
                "fraction of values per bin")
    return (f"x: linear, {axis.bins} equal bins over the exact min..max, each stored bucket's "
            "count split over the bins it overlaps (values taken as uniform within a bucket); y: "
            "fraction of values per bin")


def ridge_frame(rows: Mapping[int, Mapping[str, Source]], axis: Axis, overlap: float = 0.9,
                log: bool = False, decades: float = 4.0) -> pd.DataFrame:
    """The bars of a ridge plot, one row per step (``{step: {group: histogram}}``, top row =
    first step): :data:`COLUMNS` (side "") with ``step``, ``base`` (the row) and ``top`` =
    base + overlap * height, height the bar's fraction over the step's largest (log: log10 of
    that ratio over ``decades``, 0 below), so one step's spike does not flatten the others; a
    zeros' bar taller than the others is clipped at the row's height (:func:`y_top`)."""
    parts = []
    for k, (s, groups) in enumerate(rows.items()):
        f = _panel({"": groups}, axis)
        n = len(f["x0"])
        peak = (y_top(f["fraction"], f["zero"]) or float(f["fraction"].max())) if n else 0.0
        height = np.minimum(row_height(f["fraction"], peak or 1.0, log, decades), 1.0)
        base = float(len(rows) - 1 - k)
        parts.append({**f, "step": np.full(n, int(s)), "base": np.full(n, base),
                      "top": base + overlap * height})
    return _table(parts, [*COLUMNS, "step", "base", "top"])


def row_height(y: pd.Series | np.ndarray, peak: float, log: bool, decades: float) -> np.ndarray:
    """Height in [0, 1] of a ridge row's bars: ``y / peak``, or log10 of it over ``decades``."""
    r = np.asarray(y, np.float64) / peak
    if not log:
        return r
    with np.errstate(divide="ignore"):
        return np.clip(1 + np.log10(np.where(r > 0, r, 0.0)) / decades, 0.0, 1.0)


def log_floor_of(y: np.ndarray) -> float:
    """A log y axis's floor: half the smallest positive value (empty bins are drawn there)."""
    y = np.asarray(y, np.float64)
    return float(y[y > 0].min()) / 2 if (y > 0).any() else 1.0
