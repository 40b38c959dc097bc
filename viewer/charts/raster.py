"""A layer x step heatmap as one raster: a statistic's matrix aggregated on the server to the
pixels a chart has (at most :data:`MAX_COLUMNS` step columns and :data:`MAX_ROWS` rows),
coloured here, and drawn in the browser as one image with the aggregated values for hover
(:mod:`viewer.charts.heatmap`): one mark per cell is far too slow for the browser at tens of
thousands of cells. No Streamlit here.

Each cell has a *state*: ``FINITE`` (coloured by its value, viridis), ``NONFINITE`` (a NaN/Inf
among its values: :data:`NAN_RGBA`, never averaged away), ``NONPOSITIVE`` (on a log scale, a
value <= 0 among them, e.g. the zero gradient of a dead ReLU: :data:`ZERO_RGBA`) or
``MISSING`` (no statistics at those steps: a gap, transparent). A cell aggregating several
rows or columns takes the first of NONFINITE, NONPOSITIVE, FINITE that any of its values has
(a sick tensor is never hidden by its neighbours), its value the mean of its finite values
(geometric on a log scale), or, columns aggregated with ``agg`` 'max' / 'min', their extreme
(a spike one step long stays visible in a column of many).

Colours: viridis, or for a ratio of two groups :data:`DIVERGING` (purple, white, orange: no red,
which is NaN/Inf's), centred on 1 on a log scale (:func:`centred`), so a ratio and its inverse
are equally far from neutral.

The step axis is linear and complete: each column of the matrix spans its bin (or, one
statistics step per column, the stride to its neighbours), and a step range without
statistics (a crash, steps the writer dropped, the end of a run that turned NaN) stays empty.

Example::

    r = raster(ov.matrix[rows], ov.present[rows], ov.first_steps, ov.steps, ov.width, log=True)
    r.rgba.shape, r.first, r.last        # [rows, columns, 4]; each column's statistics steps
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FINITE, NONFINITE, NONPOSITIVE, MISSING = 0, 1, 2, 3
#: NaN/Inf cells: a red that viridis (purple, blue, green, yellow) never takes
NAN_RGBA = (228, 26, 28, 255)
#: <= 0 on a log scale: a mid grey, apart from viridis and from both themes' backgrounds
ZERO_RGBA = (150, 150, 150, 255)
#: Step columns sent at most (about a wide chart's pixels); more are aggregated
MAX_COLUMNS = 1000
#: Rows drawn at most (2 pixels each: a 2400-pixel chart); more are aggregated, k rows a row
MAX_ROWS = 1200
#: How a pixel column aggregates the statistics columns it holds
AGGREGATES = ("mean", "max", "min")
#: The colour maps a raster draws with: a sequential one for a statistic, a diverging one for
#: a ratio of two groups (neutral at 1)
SEQUENTIAL, DIVERGING = "viridis", "PuOr_r"


@dataclass
class Raster:
    """The drawn cells: ``values[i, j]`` (NaN unless ``state`` is FINITE) of row i over the
    statistics steps ``first[j]``..``last[j]`` (-1 in a gap) of pixel column j, which spans
    steps ``x0 + j * step_px`` to ``x0 + (j + 1) * step_px``; ``rows[i]``: the indices (into the
    rows given) a drawn row aggregates; ``domain[i]``: the (low, high) its colours span (the
    shared scale, or its own where ``own[i]``)."""
    values: np.ndarray
    state: np.ndarray
    first: np.ndarray
    last: np.ndarray
    x0: float
    step_px: float
    rows: list[range]
    domain: np.ndarray
    own: np.ndarray
    log: bool
    rgba: np.ndarray
    cmap: str = SEQUENTIAL

    @property
    def x1(self) -> float:
        return self.x0 + self.step_px * self.values.shape[1]


def column_extents(first: np.ndarray, last: np.ndarray,
                   width: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) steps each column spans: from its statistics step where each column holds
    one (bins of 4 steps over statistics every 5 would otherwise alternate 4 and 8 apart), else
    from its bin's start (``width`` steps, aligned on multiples of it); to the local stride (the
    smaller distance to a neighbour; at either end, the median distance if smaller), at least
    the bin, never into the next column. A column further from its next one than its stride is
    followed by a gap.

    >>> [x.tolist() for x in column_extents(np.array([0, 5, 10, 20]), np.array([0, 5, 10, 20]), 4)]
    [[0, 5, 10, 20], [5, 10, 15, 25]]
    """
    first = np.asarray(first, np.int64)
    per_step = np.array_equal(first, last)
    start, least = (first, 1) if per_step else ((first // width) * width, width)
    if len(start) < 2:
        return start, start + least
    gap = np.diff(start)
    med = int(np.median(gap))
    stride = np.minimum(np.r_[min(gap[0], med), gap], np.r_[gap, min(gap[-1], med)])
    end = start + np.maximum(stride, least)
    end[:-1] = np.minimum(end[:-1], start[1:])
    return start, end


def pixel_columns(start: np.ndarray, end: np.ndarray, most: int = MAX_COLUMNS
                  ) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(x0, steps per pixel, each pixel's first column, its column count) laying the columns out
    on at most ``most`` pixels of equal width: one pixel per narrowest column when that fits. A
    pixel holds the columns starting in it, else repeats the column still covering it (count
    -1), else is a gap (count 0).

    >>> x0, w, col, n = pixel_columns(np.array([0, 1, 4]), np.array([1, 2, 5]))
    >>> x0, w, col.tolist(), n.tolist()
    (0.0, 1.0, [0, 1, 1, 1, 2], [1, 1, 0, 0, 1])
    """
    x0, span = float(start[0]), float(end[-1] - start[0])
    unit = float(max(np.min(end - start), 1))
    px = int(np.ceil(span / unit))
    w = unit if px <= most else span / most
    px = min(px, most)
    # the pixel each column starts in
    at = np.minimum(((start - x0) / w).astype(np.int64), px - 1)
    count = np.bincount(at, minlength=px)
    # first column starting at or after
    col = np.searchsorted(at, np.arange(px), side="left")
    # last column starting at or before
    prev = np.searchsorted(at, np.arange(px), side="right") - 1
    held = count > 0
    covers = (prev >= 0) & (end[np.maximum(prev, 0)] > x0 + np.arange(px) * w + 1e-9)
    col = np.where(held, col, np.maximum(prev, 0))
    n = np.where(held, count, np.where(covers, -1, 0))                    # -1: repeats a column
    return x0, w, col, n


def _parts(m: np.ndarray, present: np.ndarray, log: bool) -> dict[str, np.ndarray]:
    """Per cell: how many finite (and, on a log scale, positive) values, their sum and the sum
    of their logs, how many NaN/Inf and <= 0 values, how many values at all."""
    m = np.asarray(m, np.float64)
    present = np.asarray(present, bool)
    finite = present & np.isfinite(m)
    ok = finite & (m > 0) if log else finite
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(ok, np.log(np.where(ok, m, 1.0)), 0.0) if log else np.zeros(m.shape)
    return {"n": ok.astype(np.int64), "sum": np.where(ok, m, 0.0), "logs": logs,
            "bad": (present & ~finite).astype(np.int64), "zero": (finite & ~ok).astype(np.int64),
            "max": np.where(ok, m, -np.inf), "min": np.where(ok, m, np.inf)}


def _reduce(parts: dict[str, np.ndarray], starts: np.ndarray, axis: int) -> dict[str, np.ndarray]:
    """``parts`` summed (max / min: their extremes) over the contiguous runs beginning at
    ``starts`` along ``axis``."""
    ufunc = {"max": np.maximum, "min": np.minimum}
    return {k: ufunc.get(k, np.add).reduceat(v, starts, axis=axis) for k, v in parts.items()}


def _cells(parts: dict[str, np.ndarray], log: bool,
           agg: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """(value, state) of aggregated cells: NaN/Inf first, then <= 0, then the mean or the
    ``agg`` extreme (a single value as it is: the hover shows the statistic itself)."""
    state = np.where(parts["bad"] > 0, NONFINITE, np.where(parts["zero"] > 0, NONPOSITIVE,
                                                          np.where(parts["n"] > 0, FINITE,
                                                                   MISSING)))
    n = parts["n"]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        value = parts["sum"] / np.where(n > 0, n, 1)
        if log:
            value = np.where(n > 1, np.exp(parts["logs"] / np.where(n > 0, n, 1)), value)
    if agg != "mean":
        value = parts[agg]
    return np.where(state == FINITE, value, np.nan), state.astype(np.uint8)


def raster(m: np.ndarray, present: np.ndarray, first: np.ndarray, last: np.ndarray, width: int,
           log: bool, own: np.ndarray | None = None, apart: np.ndarray | None = None,
           max_columns: int = MAX_COLUMNS, max_rows: int = MAX_ROWS, agg: str = "mean",
           shared: tuple[float, float] | None = None, cmap: str = SEQUENTIAL) -> Raster:
    """The raster of ``m`` [rows, columns] (``present``: cells with statistics; ``first``/``last``:
    each column's statistics steps; ``width``: its bin). ``own``: rows coloured on their own
    scale (their min to max), the others on one scale shared by them; ``apart``: rows drawn on
    the shared scale (clipped to its ends) without setting it. ``agg``: what a pixel holding
    several columns shows (:data:`AGGREGATES`); ``shared``: the shared scale's (low, high) set
    from outside (e.g. over both groups, so their heatmaps compare); ``cmap``: SEQUENTIAL, or
    DIVERGING (log scale: centred on 1, :func:`centred`)."""
    if agg not in AGGREGATES:
        raise ValueError(f"agg={agg!r} must be one of {AGGREGATES}")
    if cmap not in (SEQUENTIAL, DIVERGING):
        raise ValueError(f"cmap={cmap!r} must be {SEQUENTIAL!r} or {DIVERGING!r}")
    m = np.asarray(m, np.float64)
    n_rows = m.shape[0]
    own = np.zeros(n_rows, bool) if own is None else np.asarray(own, bool)
    apart = np.zeros(n_rows, bool) if apart is None else np.asarray(apart, bool)
    k = max(1, int(np.ceil(n_rows / max_rows)))
    row_starts = np.arange(0, n_rows, k)
    parts = _parts(m, present, log)
    if k > 1:
        parts = _reduce(parts, row_starts, 0)
        own = np.logical_or.reduceat(own, row_starts) if n_rows else own
        apart = np.logical_and.reduceat(apart, row_starts) if n_rows else apart
    start, end = column_extents(first, last, width)
    x0, w, col, n = pixel_columns(start, end, max_columns)
    held = n > 0
    reduced = _reduce(parts, col[held], 1) if held.any() \
        else {key: v[:, :0] for key, v in parts.items()}
    values, state = _cells(reduced, log, agg)
    # each pixel: its own columns' cells, the column it repeats, or a gap
    src = np.cumsum(held) - 1
    values = values[:, np.maximum(src, 0)] if held.any() \
        else np.full((len(row_starts), len(n)), np.nan)
    state = state[:, np.maximum(src, 0)] if held.any() \
        else np.full((len(row_starts), len(n)), MISSING, np.uint8)
    gap = n == 0
    values[:, gap] = np.nan
    state[:, gap] = MISSING
    last_col = np.where(held, col + np.maximum(n, 1) - 1, col)
    firsts = np.where(gap, -1, np.asarray(first, np.int64)[col])
    lasts = np.where(gap, -1, np.asarray(last, np.int64)[last_col])
    domain = domains(values, state, own, log, apart)
    if shared is not None:
        domain[~own] = shared
    if cmap == DIVERGING:
        domain[:] = centred(domain)
    rows = [range(s, min(s + k, n_rows)) for s in row_starts]
    return Raster(values, state, firsts, lasts, x0, w, rows, domain, own, log,
                  colours(values, state, domain, log, cmap), cmap)


def centred(domain: np.ndarray) -> tuple[float, float]:
    """A ratio's (low, high) on a log scale centred on 1: (1/r, r), r the largest factor from 1
    in ``domain`` (at least 10**0.5, so equal groups do not fill the scale with noise).

    >>> centred(np.array([[0.5, 4.0]]))
    (0.25, 4.0)
    """
    d = np.asarray(domain, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.abs(np.log10(d[np.isfinite(d) & (d > 0)]))
    r = 10 ** max(float(f.max()) if f.size else 0.0, 0.5)
    return 1 / r, r


def domains(values: np.ndarray, state: np.ndarray, own: np.ndarray, log: bool,
            apart: np.ndarray | None = None) -> np.ndarray:
    """[rows, 2]: the (low, high) each row's colours span: the finite values of every row on
    the shared scale but not ``apart``, or of the row itself where ``own``; (1, 1) where there
    are none."""
    fin = state == FINITE
    with np.errstate(invalid="ignore"):
        lo = np.where(fin, values, np.inf).min(axis=1) if values.size \
            else np.full(len(values), np.inf)
        hi = np.where(fin, values, -np.inf).max(axis=1) if values.size \
            else np.full(len(values), -np.inf)
    shared = ~own & np.isfinite(lo) & (True if apart is None else ~apart)
    out = np.stack([lo, hi], axis=1)
    if shared.any():
        out[~own] = (lo[shared].min(), hi[shared].max())
    out[~np.isfinite(out).all(axis=1)] = (1.0, 1.0)
    return out


def colours(values: np.ndarray, state: np.ndarray, domain: np.ndarray, log: bool,
            cmap: str = SEQUENTIAL) -> np.ndarray:
    """RGBA [rows, columns, 4] uint8: ``cmap`` over each row's domain (the middle colour where
    the domain is one value), NaN/Inf and <= 0 in their colours, gaps transparent."""
    lo, hi = domain[:, :1], domain[:, 1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        if log:
            lo, hi, v = np.log(lo), np.log(hi), np.log(values)
        else:
            v = values
        t = np.where(hi > lo, (v - lo) / np.where(hi > lo, hi - lo, 1.0), 0.5)
    idx = np.clip(np.nan_to_num(t * 255, nan=0.0), 0, 255).astype(np.uint8)
    out = _lut(cmap)[idx]
    out[state == NONFINITE] = NAN_RGBA
    out[state == NONPOSITIVE] = ZERO_RGBA
    out[state == MISSING] = (0, 0, 0, 0)
    return out


def _lut(cmap: str = SEQUENTIAL) -> np.ndarray:
    """Matplotlib's ``cmap`` as a 256 x 4 uint8 lookup table."""
    from matplotlib import colormaps
    return (colormaps[cmap](np.linspace(0, 1, 256)) * 255).round().astype(np.uint8)


def colour_stops(cmap: str = SEQUENTIAL, n: int = 11) -> list[str]:
    """``n`` evenly spaced colours of ``cmap`` as CSS hex (the colour bar's gradient)."""
    lut = _lut(cmap)[np.linspace(0, 255, n).round().astype(int)]
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b, _ in lut]


def bar_ticks(lo: float, hi: float, log: bool, most: int = 6) -> list[tuple[float, float]]:
    """(position 0..1 along the colour bar, value) of its ticks over (``lo``, ``hi``): on a log
    scale each decade (every k-th where there are many), else round steps; the ends always.

    >>> [round(v, 6) for _, v in bar_ticks(1e-3, 1.0, log=True)]
    [0.001, 0.01, 0.1, 1.0]
    >>> [v for _, v in bar_ticks(0.0, 1.0, log=False)]
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo or (log and lo <= 0):
        return [(0.5, float(lo))]
    if log:
        a, b = np.log10(lo), np.log10(hi)
        decades = np.arange(np.ceil(a - 1e-9), np.floor(b + 1e-9) + 1)
        decades = decades[::max(1, int(np.ceil(len(decades) / most)))]
        inner = [(float((d - a) / (b - a)), float(10 ** d)) for d in decades]
    else:
        raw = (hi - lo) / (most - 1)
        mag = 10 ** np.floor(np.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        vals = np.arange(np.ceil(lo / step) * step, hi + step * 1e-9, step)
        inner = [(float((v - lo) / (hi - lo)), float(f"{v:.12g}")) for v in vals]
    ends = [(0.0, float(lo)), (1.0, float(hi))]
    # an end and an inner tick closer than 8% of the bar would overprint: the end wins
    inner = [t for t in inner if min(abs(t[0]), abs(1 - t[0])) > 0.08]
    return sorted(ends + inner)
