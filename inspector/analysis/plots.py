"""Matplotlib figures shared by the viewer and by exports. Each function returns a new Figure.

Figures are built with ``matplotlib.figure.Figure`` directly, never ``pyplot``: no global
figure registry to leak memory in a long-running app, no backend switching, thread-safe
enough for Streamlit's script threads. :func:`to_png` renders one to PNG bytes (Agg).

Example::

    from inspector.analysis import plots
    fig = plots.time_series(df, title="conv1/Relu:0 mean")    # df: index step, columns groups
    open("fig.png", "wb").write(plots.to_png(fig))
"""
from __future__ import annotations

import io
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

try:
    from matplotlib.colors import LogNorm, Normalize, TwoSlopeNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
except ModuleNotFoundError as e:  # the core install (a training node) has no matplotlib
    raise ModuleNotFoundError(f"inspector.analysis.plots needs matplotlib ({e}): pip install "
                              "'tf-inspector[viewer]'", name=e.name) from e

from inspector.analysis import (  # noqa: E402  (after the matplotlib check: its message first)
    hist_view)

#: One colour per sample group, used by every figure (positive warm, negative cool).
GROUP_COLORS = dict(hist_view.GROUP_COLORS)
#: The smallest text of any figure, in points: 12.5 px at 100 dpi, above the viewer's 11-px floor
SMALL_PT = 9
Hist = tuple[np.ndarray, np.ndarray]          # (edges [B+1], counts [B])
Source = hist_view.Source                     # Hist, or a log-magnitude histogram


def to_png(fig: Figure, dpi: int = 100, max_width_px: int | None = None) -> bytes:
    """PNG bytes of ``fig`` (rendered with Agg; the figure is not kept anywhere), narrowed first
    to ``max_width_px`` by :func:`fit_width` where given."""
    if max_width_px is not None:
        fit_width(fig, max_width_px, dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def fit_width(fig: Figure, max_px: int, dpi: int = 100) -> None:
    """Narrow ``fig`` until its tight PNG is at most ``max_px`` wide at ``dpi``: its texts keep
    their point size and its images shrink, so a page that would otherwise shrink the whole PNG
    to its column (texts with it) shows every label at its size. Long titles wrap
    (``wrap=True``) at the narrower width."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    for _ in range(4):
        fig.set_dpi(dpi)
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)                       # lays the figure out at its current size
        pad = 2 * float(matplotlib.rcParams["savefig.pad_inches"])   # savefig's tight margin
        over = fig.get_tightbbox(renderer).width + pad - max_px / dpi
        if over <= 0:
            return
        w, h = fig.get_size_inches()
        fig.set_size_inches(max(w - over - 0.05, 1.0), h)


def drawn_texts(fig: Figure) -> list:
    """The texts ``fig`` draws (non-empty and visible, and not inside a hidden axis or an axes
    whose axis lines are off): what a reader sees, for checks of their size."""
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.text import Text

    out: list = []

    def walk(artist, hidden: bool) -> None:
        if not artist.get_visible():
            return
        if isinstance(artist, Text):
            if not hidden and artist.get_text().strip():
                out.append(artist)
            return
        axis_off = isinstance(artist, Axes) and not artist.axison
        for child in artist.get_children():
            walk(child, hidden or (axis_off and isinstance(child, Axis)))
    walk(fig, False)
    return out


def _color(label: str, i: int) -> str:
    return GROUP_COLORS.get(label, f"C{i}")


def empty(message: str, figsize=(6, 2)) -> Figure:
    """A figure that only says ``message`` (so a download button always has something)."""
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.subplots()
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


# ---- over steps -------------------------------------------------------------------------------

def heatmap(matrix: np.ndarray, rows: Sequence[str], steps: Sequence[int], title: str = "",
            log: bool = False, cbar_label: str = "", max_labels: int = 40) -> Figure:
    """Rows (tensors, in graph order) x steps image of one statistic; NaN/Inf cells are grey.

    Columns are categorical: one cell per statistics step, in order, labelled with its step
    (steps [10, 20, 30, 1000] get four equal columns), so no step is squeezed or stretched.

    >>> heatmap(np.ones((3, 5)), ["a", "b", "c"], range(5)).axes[0].images[0].get_array().shape
    (3, 5)
    """
    m = np.asarray(matrix, np.float64)
    finite = m[np.isfinite(m)]
    fig = Figure(figsize=(10, max(2.5, min(0.18 * len(rows) + 1.2, 12))), layout="constrained")
    ax = fig.subplots()
    if log:
        pos = finite[finite > 0]
        norm = LogNorm(pos.min(), max(pos.max(), pos.min() * 1.0001)) if pos.size \
            else Normalize(0, 1)
        m = np.where(m > 0, m, np.nan)
    else:
        norm = Normalize(finite.min(), finite.max()) if finite.size else Normalize(0, 1)
    cmap = _cmap("viridis")
    im = ax.imshow(np.ma.masked_invalid(m), aspect="auto", interpolation="nearest",
                   cmap=cmap, norm=norm)
    _step_ticks(ax, np.asarray(steps))
    every = max(1, int(np.ceil(len(rows) / max_labels)))
    ax.set_yticks(range(0, len(rows), every),
                  [rows[i] for i in range(0, len(rows), every)], fontsize=SMALL_PT)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=cbar_label, fraction=0.03, pad=0.01)
    return fig


def _step_ticks(ax, steps: np.ndarray, max_ticks: int = 10) -> None:
    """Label categorical step columns (column k is ``steps[k]``) with their steps; say so when
    the steps are unevenly spaced, since the x axis then is not to scale."""
    if not len(steps):
        return
    at = np.unique(np.linspace(0, len(steps) - 1, min(max_ticks, len(steps))).round().astype(int))
    ax.set_xticks(at, [str(int(steps[k])) for k in at])
    even = len(steps) < 3 or len(np.unique(np.diff(steps))) == 1
    ax.set_xlabel("step" if even else "step (one column per statistics step; spacing not to scale)")


def _cmap(name: str):
    from matplotlib import colormaps
    return colormaps[name].with_extremes(bad="0.75")


def time_series(df: pd.DataFrame, title: str = "", ylabel: str = "", log: bool = False,
                marks: Mapping[str, int] | None = None) -> Figure:
    """One line per column of ``df`` (index = step); group columns get the group colours.
    ``marks`` draws labelled vertical lines (e.g. {"first NaN": 120})."""
    fig = Figure(figsize=(8, 3), layout="constrained")
    ax = fig.subplots()
    for i, col in enumerate(df.columns):
        ax.plot(df.index, df[col], label=str(col), color=_color(str(col), i), lw=1.4)
    if log and (df.to_numpy(dtype=float) > 0).any():
        ax.set_yscale("log")
    for label, step in (marks or {}).items():
        ax.axvline(step, color="k", ls="--", lw=0.8)
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), fontsize=SMALL_PT,
                    va="top")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(df.columns):
        ax.legend(fontsize=SMALL_PT)
    ax.grid(alpha=0.3)
    return fig


def channel_lines(panels: Mapping[str, tuple[Sequence[int], np.ndarray]],
                  highlight: int | None = None, title: str = "",
                  channels: Sequence[int] | None = None) -> Figure:
    """Small multiples, one axis per panel: per-channel values [S, C] over steps, column
    ``highlight`` drawn bold (used for ICNN beta and filter loss); ``channels`` names the
    columns' filters (default 0, 1, ...)."""
    fig = Figure(figsize=(5 * max(len(panels), 1), 3), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, max(len(panels), 1)))
    for ax, (name, (steps, values)) in zip(axes, panels.items()):
        v = np.asarray(values, np.float64).reshape(len(steps), -1)
        for c in range(v.shape[1]):
            bold = c == highlight
            ax.plot(steps, v[:, c], color="C3" if bold else "0.6", lw=2.2 if bold else 0.8,
                    zorder=3 if bold else 2,
                    label=f"filter {channels[c] if channels is not None else c}" if bold else None)
        ax.plot(steps, np.nanmean(v, 1), color="k", ls="--", lw=1, label="mean")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.legend(fontsize=SMALL_PT)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


# ---- distributions ----------------------------------------------------------------------------

def hist_from_values(values: np.ndarray, edges: np.ndarray) -> Hist:
    """(edges, counts) of the finite values of ``values`` on ``edges``."""
    v = np.ravel(np.asarray(values, np.float64))
    return edges, np.histogram(v[np.isfinite(v)], edges)[0]


def _draw_bars(ax, frame: pd.DataFrame, axis: hist_view.Axis, log: bool,
               density: bool = False) -> None:
    """A chart's bars (:func:`inspector.analysis.hist_view.panel_frame`) on ``ax``: each group an
    outline over a light fill in its colour (a second side dashed), the zeros' bar apart (clipped,
    and marked, where it would flatten the others: :func:`inspector.analysis.hist_view.y_top`), the
    log axis's ticks; y the fraction per bar (``density``: per unit of x, for equal-width bins)."""
    y = frame["fraction"].to_numpy(np.float64)
    if density:
        y = y / np.where(frame["x1"] > frame["x0"], frame["x1"] - frame["x0"], 1.0)
    floor = hist_view.log_floor_of(y) if log else 0.0
    colors = hist_view.group_colors(frame["group"])
    sides = list(dict.fromkeys(frame["side"]))
    for (side, g), part in frame.assign(y=np.where(y > 0, y, floor)).groupby(["side", "group"],
                                                                             sort=False):
        ls = "--" if sides.index(side) else "-"
        rest, zero = part[~part["zero"]], part[part["zero"]]
        edges, values = hist_view.steps(rest["x0"], rest["x1"], rest["y"], floor)
        ax.stairs(values, edges, baseline=floor, fill=True, color=colors[g], alpha=0.2, lw=0)
        ax.stairs(values, edges, baseline=floor, color=colors[g], lw=1.5, ls=ls,
                  label=part["label"].iloc[0] if side == "" else f"{side}: {g}")
        for r in zero.itertuples():
            ax.add_patch(Rectangle((r.x0, floor), r.x1 - r.x0, r.y - floor, fc=colors[g],
                                   alpha=0.2, lw=0))
            ax.add_patch(Rectangle((r.x0, floor), r.x1 - r.x0, r.y - floor, fill=False,
                                   ec=colors[g], lw=1.5, ls=ls))
    top = None if log else hist_view.y_top(y, frame["zero"])
    if top is not None:
        ax.set_ylim(0, top)
        ax.annotate("zeros (clipped)", (0, top), xytext=(4, -2), textcoords="offset points",
                    ha="left", va="top", fontsize=SMALL_PT)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor)
    _log_ticks(ax, frame, axis)
    ax.set_ylabel("density" if density else y_title(axis))


def _log_ticks(ax, frame: pd.DataFrame, axis: hist_view.Axis) -> None:
    """The signed log axis's ticks (powers of ten labelled with their value) and title."""
    if len(frame):
        xs, labels = hist_view.ticks(axis, float(frame["x0"].min()), float(frame["x1"].max()))
        if xs:
            ax.set_xticks(xs, labels, fontsize=SMALL_PT)
    ax.set_xlabel(axis.title())


def y_title(axis: hist_view.Axis) -> str:
    return f"fraction of values per {'bucket' if axis.scale == 'log' else 'bin'}"


def histograms(panels: Mapping[str, Mapping[str, Source]], density: bool = False, title: str = "",
               log: bool = False, totals: Mapping[str, Mapping[str, int]] | None = None,
               xscale: Mapping[str, float] | None = None,
               axes: Mapping[str, hist_view.Axis] | None = None) -> Figure:
    """Side-by-side axes, one per panel (e.g. forward | gradient), each overlaying one
    histogram per group (log-magnitude buckets or equal-width ``(edges, counts)``) on the
    panel's axis (``axes``; else :func:`inspector.analysis.hist_view.choose_axis` with the panel's
    name as the kind): y the fraction of each group's values per bar (``density``: per unit of x).
    ``log``: a log y axis (empty bins at its floor). ``totals`` ({panel: {group: n}}): the real
    element counts, stated in the legend beside the counted ones where they differ.
    ``xscale`` ({panel: linthresh}): equal-width-input bins that are symmetric-log
    (:mod:`inspector.analysis.binning`), drawn on a symlog x axis."""
    fig = Figure(figsize=(5.5 * max(len(panels), 1), 3.2), layout="constrained")
    for ax, (name, groups) in zip(np.atleast_1d(fig.subplots(1, max(len(panels), 1))),
                                  panels.items()):
        axis = (axes or {}).get(name) or hist_view.choose_axis(groups.values(), kind=name)
        frame = hist_view.panel_frame({"": groups}, axis, {"": (totals or {}).get(name, {})})
        _draw_bars(ax, frame, axis, log, density)
        linthresh = (xscale or {}).get(name)
        if linthresh is not None:
            ax.set_xscale("symlog", linthresh=linthresh)
        ax.set_title(name)
        _legend_or_empty(ax, bool(groups))
    fig.suptitle(title)
    return fig


def overlay(sides: Mapping[str, Mapping[str, Source]], axis: hist_view.Axis, title: str = "",
            log: bool = False) -> Figure:
    """Two histogram sets on one axis (Compare), ``{"A: step 10": {group: h}, "B: step 90":
    {group: h}}``: the same colour per group, the first side solid, the second dashed."""
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    frame = hist_view.panel_frame(sides, axis)
    _draw_bars(ax, frame, axis, log)
    _legend_or_empty(ax, len(frame) > 0)
    ax.set_title(title)
    return fig


def _legend_or_empty(ax, any_data: bool) -> None:
    if any_data:
        ax.legend(fontsize=SMALL_PT)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)


def ridge(rows: Mapping[int, Mapping[str, Source]], title: str = "", overlap: float = 0.9,
          log: bool = False, decades: float = 4.0, axis: hist_view.Axis | None = None) -> Figure:
    """Ridge plot across steps (:func:`inspector.analysis.hist_view.ridge_frame`): one baseline per
    step (top = first), each group's bars on the step's row, outlined over a light fill, scaled to
    the step's largest bar; on ``axis`` (else chosen over every row, as a gradient's). ``log``:
    each row's height is log10 of the bar's fraction over ``decades`` below the row's peak."""
    steps = list(rows)
    axis = axis or hist_view.choose_axis([h for g in rows.values() for h in g.values()],
                                         kind="gradient")
    frame = hist_view.ridge_frame(rows, axis, overlap, log, decades)
    fig = Figure(figsize=(7, max(2.5, 0.45 * len(steps) + 1)), layout="constrained")
    ax = fig.subplots()
    colors = hist_view.group_colors(frame["group"])
    for (s, g), part in frame.groupby(["step", "group"], sort=False):
        base = float(part["base"].iloc[0])
        rest = part[~part["zero"]]
        # the zeros' bar apart: it may overlap a bin
        for p, lw in ((rest, 1.2), (part[part["zero"]], 1.0)):
            if p.empty:
                continue
            edges, values = hist_view.steps(p["x0"], p["x1"], p["top"], base)
            ax.stairs(values, edges, baseline=base, fill=True, alpha=0.2, color=colors[g], lw=0)
            first = s == steps[0] and p is rest
            ax.stairs(values, edges, baseline=base, color=colors[g], lw=lw,
                      label=g if first else None)
    ax.set_yticks(range(len(steps)), [str(s) for s in reversed(steps)], fontsize=SMALL_PT)
    ax.set_ylabel("step")
    _log_ticks(ax, frame, axis)
    ax.set_title(title + (f" (row height: log10 fraction, {decades:g} decades)" if log else ""))
    if steps:
        ax.legend(fontsize=SMALL_PT, loc="upper right")
    return fig


# ---- feature maps and ICNN --------------------------------------------------------------------

def _map_norm(m: np.ndarray, symmetric: bool | None) -> tuple[Normalize, str]:
    """One colour scale for feature maps: diverging around 0 (RdBu_r) if ``symmetric``, or if
    None and the values have both signs; else magma from min to max."""
    finite = m[np.isfinite(m)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if symmetric if symmetric is not None else (lo < 0 < hi):
        a = max(abs(lo), abs(hi)) or 1.0
        return Normalize(-a, a), "RdBu_r"
    return Normalize(lo, hi if hi > lo else lo + 1), "magma"


def mosaic(maps: Sequence[np.ndarray], cols: int, lines: int = 1) -> np.ndarray:
    """Equal-shape 2-D ``maps`` tiled in rows of ``cols`` into one array, NaN between tiles: one
    image draws many maps far faster than one axes per map. Tile k's top-left corner is at row
    ``(k // cols) * (H + gap)``, column ``(k % cols) * (W + 1)``; the gap above each row leaves
    room for ``lines`` lines of label (about H/4 each, at least 1).

    >>> mosaic([np.ones((2, 2)), 2 * np.ones((2, 2))], cols=2)
    array([[ 1.,  1., nan,  2.,  2.],
           [ 1.,  1., nan,  2.,  2.]])
    """
    h, w = np.shape(maps[0])
    gap = _row_gap(h, lines)
    rows = int(np.ceil(len(maps) / cols))
    out = np.full((rows * (h + gap) - gap, cols * (w + 1) - 1), np.nan)
    for k, m in enumerate(maps):
        r, q = divmod(k, cols)
        out[r * (h + gap):r * (h + gap) + h, q * (w + 1):q * (w + 1) + w] = m
    return out


def _row_gap(h: int, lines: int) -> int:
    return max(1, int(np.ceil(h * 0.25 * lines)))


def _tiles(ax, maps: Sequence[np.ndarray], labels: Sequence[str], cols: int, norm: Normalize,
           cmap: str, lines: int = 1):
    """Draw ``maps`` as one :func:`mosaic` image on ``ax``, each labelled above; NaN/Inf values
    grey, the space between tiles empty. Returns the image (``ax.images[0]``: the mosaic)."""
    h, w = np.shape(maps[0])
    m = mosaic([np.asarray(x, np.float64) for x in maps], cols, lines)
    # between tiles, not NaN values
    gap = np.isnan(mosaic([np.zeros((h, w))] * len(maps), cols, lines))
    bad = ~gap & ~np.isfinite(m)
    im = ax.imshow(np.ma.masked_invalid(m), cmap=_cmap(cmap).with_extremes(bad=(0, 0, 0, 0)),
                   norm=norm, interpolation="nearest")
    if bad.any():
        ax.imshow(np.ma.masked_where(~bad, np.ones_like(m)), cmap="gray", vmin=0, vmax=2,
                  interpolation="nearest")
    for k, label in enumerate(labels):
        r, q = divmod(k, cols)
        ax.text(q * (w + 1) + (w - 1) / 2, r * (h + _row_gap(h, lines)) - 0.6, label, ha="center",
                va="bottom", fontsize=SMALL_PT)
    ax.set_axis_off()
    ax.set_ylim(m.shape[0] - 0.5, -0.5 - _row_gap(h, lines))  # room for the first row's labels
    return im


def channel_grid(maps: np.ndarray, title: str = "", symmetric: bool | None = None,
                 max_channels: int = 64, cols: int = 8, first: int = 0) -> Figure:
    """Grid of one sample's channels ``first .. first + max_channels - 1`` of ``maps [H, W, C]``
    (a page of them), labelled with their channel numbers, on one colour scale (that page's;
    see :func:`_map_norm`): one :func:`mosaic` image, ``fig.axes[0].images[0]``.

    >>> [t.get_text() for t in channel_grid(np.zeros((4, 4, 70)), first=64).axes[0].texts][-1]
    'ch 69'
    """
    m = np.asarray(maps, np.float64)
    if m.ndim == 2:
        m = m[..., None]
    total = m.shape[-1]
    if not 0 <= first < total:
        raise ValueError(f"first channel {first} is outside the map's channels 0..{total - 1}")
    m = m[..., first:first + max_channels]
    c = m.shape[-1]
    cols = min(cols, c)
    nrows = int(np.ceil(c / cols))
    fig = Figure(figsize=(1.4 * cols + 1, 1.6 * nrows + 0.6), layout="constrained")
    ax = fig.subplots()
    norm, cmap = _map_norm(m, symmetric)
    im = _tiles(ax, [m[..., k] for k in range(c)], [f"ch {first + k}" for k in range(c)],
                cols, norm, cmap)
    fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)
    fig.suptitle(title + (f" (channels {first}-{first + c - 1} of {total})" if c < total else ""))
    return fig


def upsample(m: np.ndarray, h: int, w: int) -> np.ndarray:
    """A 2-D map resized to ``(h, w)`` by bilinear interpolation with pixel centres aligned
    (output pixel i samples the input at ``(i + 0.5) * in / out - 0.5``, clamped to the edge):
    what PIL's BILINEAR, OpenCV's INTER_LINEAR and ``tf.image.resize`` do when enlarging.

    >>> upsample(np.array([[0.0, 1.0]]), 1, 4).tolist()
    [[0.0, 0.25, 0.75, 1.0]]
    """
    m = np.asarray(m, np.float64)
    if m.ndim != 2 or not m.size or h < 1 or w < 1:
        raise ValueError(f"upsample needs a non-empty 2-D map and a positive size, got {m.shape} "
                         f"-> ({h}, {w})")

    def axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        i0 = np.floor(x).astype(np.int64)
        return i0, np.minimum(i0 + 1, n_in - 1), x - i0

    r0, r1, fr = axis(m.shape[0], h)
    c0, c1, fc = axis(m.shape[1], w)
    top = m[r0][:, c0] * (1 - fc) + m[r0][:, c1] * fc
    bottom = m[r1][:, c0] * (1 - fc) + m[r1][:, c1] * fc
    return top * (1 - fr)[:, None] + bottom * fr[:, None]


def display_image(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(array for imshow, cmap) of a model input ``[H, W, C]``, min-max scaled to [0, 1] (inputs
    may be standardized or 0..255): RGB for 3 channels (the first 3 of 4), grey for 1, else the
    channels' mean in grey."""
    x = np.asarray(image, np.float64)
    x = x[..., None] if x.ndim == 2 else x
    x = x[..., :3] if x.shape[-1] in (3, 4) else x.mean(axis=-1, keepdims=True)
    finite = x[np.isfinite(x)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    x = np.clip((np.nan_to_num(x, nan=lo) - lo) / (hi - lo if hi > lo else 1.0), 0, 1)
    return (x, None) if x.shape[-1] == 3 else (x[..., 0], "gray")


def channel_overlay(image: np.ndarray, heat: np.ndarray, title: str = "", alpha: float = 0.5,
                    symmetric: bool | None = None) -> Figure:
    """keract-style heatmap: the input image ``[H, W, C]`` | one channel ``heat [h, w]`` as
    stored | that channel upsampled to H x W (:func:`upsample`) drawn over the image with
    ``alpha``. The overlay's top image (``fig.axes[2].images[1]``) holds the upsampled map."""
    h, w = np.shape(image)[:2]
    up = upsample(heat, h, w)
    img, img_cmap = display_image(image)
    norm, cmap = _map_norm(np.asarray(heat, np.float64), symmetric)
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax_in, ax_map, ax_over = fig.subplots(1, 3)
    ax_in.imshow(img, cmap=img_cmap, vmin=0, vmax=1, interpolation="nearest")
    ax_in.set_title(f"input {h}x{w} (min-max scaled)", fontsize=9)
    ax_map.imshow(np.asarray(heat, np.float64), cmap=cmap, norm=norm, interpolation="nearest")
    ax_map.set_title(f"channel {np.shape(heat)[0]}x{np.shape(heat)[1]}", fontsize=9)
    ax_over.imshow(img, cmap=img_cmap, vmin=0, vmax=1, interpolation="nearest")
    im = ax_over.imshow(up, cmap=cmap, norm=norm, alpha=alpha, interpolation="nearest")
    ax_over.set_title(f"overlay (bilinear to {h}x{w}, alpha {alpha:g})", fontsize=9)
    for ax in (ax_in, ax_map, ax_over):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=[ax_map, ax_over], fraction=0.03, pad=0.01)
    fig.suptitle(title)
    return fig


def sample_grid(groups: Mapping[str, Sequence[tuple[str, np.ndarray]]], title: str = "",
                cols: int = 4, symmetric: bool | None = None, lines: int = 1) -> Figure:
    """One channel's maps of many samples, ``{group: [(label, map [H, W]), ...]}``: each group
    one axes titled with the group and its size, its maps a :func:`mosaic` of ``cols`` columns
    (labels of ``lines`` lines), the groups side by side, every map on one colour scale so
    samples and groups compare.

    >>> [ax.get_title()
    ...  for ax in sample_grid({"positive": [("#0", np.ones((2, 2)))], "negative": []}).axes[:2]]
    ['positive (1)', 'negative (0)']
    """
    items = {g: list(v) for g, v in groups.items()}
    every = [np.asarray(m, np.float64).ravel() for v in items.values() for _, m in v]
    norm, cmap = _map_norm(np.concatenate(every) if every else np.zeros(1), symmetric)
    ncols = {g: max(1, min(cols, len(v))) for g, v in items.items()}
    nrows = max([int(np.ceil(len(v) / ncols[g])) for g, v in items.items()] + [1])
    fig = Figure(figsize=(1.5 * sum(ncols.values()) + 0.6 * len(items) + 1,
                          (1.5 + 0.35 * lines) * nrows + 0.9),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, max(len(items), 1),
                                      width_ratios=list(ncols.values()) or None))
    im = None
    for i, (ax, (g, v)) in enumerate(zip(axes, items.items())):
        ax.set_axis_off()
        ax.set_title(f"{g} ({len(v)})", color=_color(g, i), fontsize=9)
        if v:
            im = _tiles(ax, [m for _, m in v], [lb for lb, _ in v], ncols[g], norm, cmap, lines)
    if im is not None:  # one scale for all
        fig.colorbar(im, ax=list(axes), fraction=0.02, pad=0.01)
    fig.suptitle(title)
    return fig


def _mu_marker(ax, mu_cell: Sequence[int] | None, color: str = "cyan") -> None:
    if mu_cell is not None:
        ax.plot(mu_cell[1], mu_cell[0], marker="+", ms=14, mew=2.5, color=color)


def icnn_filter(rows: Sequence[Mapping], title: str = "") -> Figure:
    """ICNN pre-mask | mask | post-mask side by side, one row per sample. Each row dict holds
    ``label``, ``pre``, ``mask``, ``post`` ([H, W]) and ``mu_cell`` (row, col) of mu, drawn as +
    on all three. Pre and post share a colour scale per row, so the mask's effect is visible."""
    fig = Figure(figsize=(9, 2.8 * max(len(rows), 1)), layout="constrained")
    axes = fig.subplots(max(len(rows), 1), 3, squeeze=False)
    for r, row in enumerate(rows):
        vmax = float(max(np.nanmax(row["pre"]), np.nanmax(row["post"]), 1e-12))
        for ax, key, cmap, norm in ((axes[r, 0], "pre", "magma", Normalize(0, vmax)),
                                    (axes[r, 1], "mask", "RdBu_r", TwoSlopeNorm(0, -1, 1)),
                                    (axes[r, 2], "post", "magma", Normalize(0, vmax))):
            im = ax.imshow(row[key], cmap=cmap, norm=norm, interpolation="nearest")
            _mu_marker(ax, row.get("mu_cell"))
            ax.set_title(f"{row.get('label', '')}: {key}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(title)
    return fig


def localization_grid(groups: Mapping[str, Sequence[Mapping]], title: str = "", cols: int = 4,
                      alpha: float = 0.85) -> Figure:
    """Where one filter fires in every sample: ``{group: [{"label", "image" ([H, W, C], or None),
    "map" ([h, w]), "mu_cell" ((row, col) of mu on the map)}, ...]}``, the groups side by side.

    Each tile is the sample's input image in grey (min-max scaled, :func:`display_image`, then
    dimmed so colour stands out) with the map enlarged to it (:func:`upsample`) and blended on top
    in ``turbo``, its opacity ``alpha * value / max``: the image shows through where the filter is
    silent. Every map shares one scale, 0 to the largest
    value of any sample, so a weak response looks weak. mu is a + at its cell's centre; without
    an image the tile is the map alone. A group is one RGB mosaic (``fig.axes[k].images[0]``), its
    + markers ``fig.axes[k].lines``, one per sample in order.

    >>> fig = localization_grid({"positive": [{"label": "#0", "image": np.zeros((8, 8, 3)),
    ...                                         "map": np.eye(4), "mu_cell": (1, 2)}]})
    >>> [round(float(v), 2)
    ...  for v in fig.axes[0].lines[0].get_xydata()[0]]   # x = col, y = row, pixels
    [4.5, 2.5]
    """
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    items = {g: list(v) for g, v in groups.items()}
    every = [np.asarray(t["map"], np.float64) for v in items.values() for t in v]
    finite = np.concatenate([m[np.isfinite(m)] for m in every]) if every else np.zeros(0)
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cmap = colormaps["turbo"]
    ncols = {g: max(1, min(cols, len(v))) for g, v in items.items()}
    nrows = max([int(np.ceil(len(v) / ncols[g])) for g, v in items.items()] + [1])
    fig = Figure(figsize=(1.9 * sum(ncols.values()) + 0.6 * len(items) + 1, 2.1 * nrows + 0.9),
                 layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, max(len(items), 1),
                                      width_ratios=list(ncols.values()) or None))
    for i, (ax, (g, tiles)) in enumerate(zip(axes, items.items())):
        ax.set_axis_off()
        ax.set_title(f"{g} (n={len(tiles)})", color=_color(g, i), fontsize=10)
        if tiles:
            _localization_tiles(ax, tiles, ncols[g], vmax, cmap, alpha)
    fig.colorbar(ScalarMappable(Normalize(0, vmax), cmap), ax=list(axes), fraction=0.02, pad=0.01,
                 label="map value (opaque where high)")
    fig.suptitle(title)
    return fig


def _localization_tiles(ax, tiles: Sequence[Mapping], cols: int, vmax: float, cmap,
                        alpha: float) -> None:
    def base(t: Mapping) -> np.ndarray:
        if t.get("image") is None:
            return np.zeros((*np.shape(t["map"]), 3))
        img, grey = display_image(t["image"])
        lum = img if grey else img @ np.array([0.299, 0.587, 0.114])
        return np.repeat(0.15 + 0.6 * lum[..., None], 3, axis=2)

    imgs = [base(t) for t in tiles]
    h, w = imgs[0].shape[:2]
    gap = _row_gap(h, 1)
    rows = int(np.ceil(len(tiles) / cols))
    out = np.ones((rows * (h + gap) - gap, cols * (w + 1) - 1, 3))
    for k, (t, img) in enumerate(zip(tiles, imgs)):
        m = np.nan_to_num(np.asarray(t["map"], np.float64), nan=0.0, posinf=vmax, neginf=0.0)
        v = np.clip(upsample(m, h, w) / vmax, 0, 1)
        a = (alpha * v if t.get("image") is not None else np.ones_like(v))[..., None]
        r, q = divmod(k, cols)
        y, x = r * (h + gap), q * (w + 1)
        out[y:y + h, x:x + w] = img[:h, :w] * (1 - a) + cmap(v)[..., :3] * a
        mh, mw = np.shape(t["map"])
        i, j = t["mu_cell"]
        ax.plot(x + (j + 0.5) * w / mw - 0.5, y + (i + 0.5) * h / mh - 0.5, marker="+", ms=12,
                mew=2.5, color="white", markeredgecolor="white")
        ax.text(x + (w - 1) / 2, y - 0.6, t.get("label", ""), ha="center", va="bottom",
                fontsize=SMALL_PT)
    ax.imshow(out, interpolation="nearest")
    ax.set_ylim(out.shape[0] - 0.5, -0.5 - gap)


def templates_grid(templates: np.ndarray, negative: np.ndarray,
                   highlight: Mapping[str, Sequence[int]] | None = None,
                   tau: float | None = None, title: str = "") -> Figure:
    """Mosaic of all positive templates ``T_mu`` ([H, W, H, W]: tile (i, j) is the template
    for mu at cell (i, j)) with the cells in ``highlight`` ({label: (i, j)}) outlined; beside
    it the first highlighted template enlarged (mu marked +) and the negative template T-.
    ``tau`` (the paper's scale) is stated, not applied."""
    h, w = templates.shape[:2]
    mosaic = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
    for i in range(h):
        for j in range(w):
            mosaic[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w] = templates[i, j]
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    ax, axc, axn = fig.subplots(1, 3, width_ratios=[2.2, 1, 1])
    norm = TwoSlopeNorm(0, -1, 1)
    ax.imshow(np.ma.masked_invalid(mosaic), cmap=_cmap("RdBu_r"), norm=norm,
              interpolation="nearest")
    for k, (label, (i, j)) in enumerate((highlight or {}).items()):
        ax.add_patch(Rectangle((j * (w + 1) - 0.9, i * (h + 1) - 0.9), w + 0.8, h + 0.8, fill=False,
                               lw=2.5, ec=("lime", "orange", "magenta", "cyan")[k % 4],
                               label=label))
    ax.set_title(f"positive templates T_mu ({h}x{w} positions of mu)")
    first = next(iter((highlight or {}).items()), None)
    if first:
        label, (i, j) = first
        axc.imshow(templates[i, j], cmap="RdBu_r", norm=norm, interpolation="nearest")
        _mu_marker(axc, (i, j), color="lime")
        axc.set_title(f"T_mu at cell ({i}, {j})\n{label}", fontsize=9)
    else:
        axc.set_axis_off()
    im = axn.imshow(negative, cmap="RdBu_r", norm=norm, interpolation="nearest")
    axn.set_title("negative template T-")
    for a in (ax, axc, axn):
        a.set_xticks([])
        a.set_yticks([])
    fig.colorbar(im, ax=[axc, axn], fraction=0.046, shrink=0.6)
    scale = f"shown unscaled; the paper scales by tau = 0.5/(H*W) = {tau:.4g}" if tau else ""
    fig.suptitle("; ".join(t for t in (title, scale) if t), fontsize=10)
    return fig


def mu_scatter(groups: Mapping[str, np.ndarray], title: str = "", jitter: float = 0.0,
               seed: int = 0) -> Figure:
    """mu of one filter per sample, ``{group: [n, 2] (row, col) in [-1, 1]}``, drawn in map
    orientation (row 0 at the top). ``jitter`` spreads samples that share a grid cell."""
    fig = Figure(figsize=(4.5, 4.5), layout="constrained")
    ax = fig.subplots()
    rng = np.random.default_rng(seed)
    for i, (g, mu) in enumerate(groups.items()):
        mu = np.asarray(mu, np.float64).reshape(-1, 2)
        j = rng.normal(0, jitter, mu.shape) if jitter else np.zeros_like(mu)
        ax.scatter(mu[:, 1] + j[:, 1], mu[:, 0] + j[:, 0],
                   color=_color(g, i), label=f"{g} (n={len(mu)})", alpha=0.75,
                   edgecolor="k", lw=0.5)
    ax.set_xlim(-1.1, 1.1)
    ax.set_ylim(1.1, -1.1)
    ax.set_aspect("equal")
    ax.set_xlabel("mu col")
    ax.set_ylabel("mu row")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL_PT)
    ax.set_title(title)
    return fig
