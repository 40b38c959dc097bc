"""Figures of inspector.analysis.plots: the artists they must hold, PNG output, no pyplot state."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle, StepPatch

from inspector.analysis import hist_view, plots
from inspector.format.loghist import LogHistogram
from inspector.icnn import templates


def test_png_bytes_and_no_pyplot():
    png = plots.to_png(plots.empty("nothing"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "matplotlib.pyplot" not in sys.modules or not __import__("matplotlib.pyplot").pyplot.get_fignums()


def test_heatmap_image_and_labels():
    m = np.arange(12.0).reshape(3, 4)
    m[1, 2] = np.nan
    fig = plots.heatmap(m, ["a", "b", "c"], [10, 20, 30, 40], log=True, title="t")
    ax = fig.axes[0]
    img = ax.images[0]
    assert img.get_array().shape == (3, 4) and img.get_array().mask[1, 2]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert img.norm.__class__.__name__ == "LogNorm"
    assert len(fig.axes) == 2                          # + colorbar


def test_time_series_group_colours_and_marks():
    df = pd.DataFrame({"positive": [1, 2, 3], "negative": [3, 2, 1]}, index=[0, 10, 20])
    fig = plots.time_series(df, marks={"first NaN": 10})
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines[:2]] == ["positive", "negative"]
    assert lines[0].get_color() == plots.GROUP_COLORS["positive"]
    assert lines[2].get_xdata()[0] == 10               # the vertical mark


def outlines(ax) -> list[StepPatch]:
    """The groups' outlines (their light fills are the unfilled-alpha twins)."""
    return [p for p in ax.patches if isinstance(p, StepPatch) and not p.get_fill()]


def test_histograms_outline_every_group_over_a_light_fill_on_the_log_axis():
    rng = np.random.default_rng(0)
    hists = {"positive": LogHistogram.of(rng.laplace(0, 1e-3, 5000)),
             "negative": LogHistogram.of(rng.laplace(0, 1e-4, 5000))}
    fig = plots.histograms({"gradient": hists, "forward": {"all": (np.linspace(0, 1, 5), np.array([1, 2, 3, 4]))}})
    grad, fwd = fig.axes
    lines, fills = outlines(grad), [p for p in grad.patches if isinstance(p, StepPatch) and p.get_fill()]
    assert len(lines) == len(fills) == 2 and all(f.get_alpha() == 0.2 for f in fills)
    assert [p.get_edgecolor()[:3] for p in lines] == [to_rgb("#b2182b"), to_rgb("#67a9cf")]
    for p, h in zip(lines, hists.values()):     # every bucket's fraction, the gaps between them at 0
        assert np.isclose(p.get_data().values.sum(), 1.0) and (p.get_data().values > 0).sum() == len(h.index)
    labels = [t.get_text() for t in grad.get_xticklabels()]
    assert "1e-4" in labels and "-1e-4" in labels and "0" in labels
    assert grad.get_ylabel() == "fraction of values per bucket" and "signed log" in grad.get_xlabel()
    # equal-width bins (a run before format version 4): as stored, y the fraction per bin
    assert np.allclose(outlines(fwd)[0].get_data().values, [0.1, 0.2, 0.3, 0.4])
    assert fwd.get_ylabel() == "fraction of values per bin"
    assert [t.get_text() for t in grad.get_legend().get_texts()] == ["positive (n=5,000)", "negative (n=5,000)"]


def test_overlay_draws_the_second_side_dashed():
    h = {"positive": LogHistogram.of(np.array([1.0, 2.0])), "negative": LogHistogram.of(np.array([-1.0]))}
    axis = hist_view.choose_axis(h.values(), "gradient")
    ax = plots.overlay({"A: step 1": h, "B: step 9": h}, axis).axes[0]
    styles = {t.get_text(): p.get_linestyle() for t, p in zip(ax.get_legend().get_texts(), outlines(ax))}
    assert styles == {"A: step 1: positive": "-", "A: step 1: negative": "-",
                      "B: step 9: positive": "--", "B: step 9: negative": "--"}


def test_ridge_one_baseline_per_step():
    edges = np.linspace(0, 1, 4)
    rows = {s: {"positive": (edges, np.array([1, 2, 3])), "negative": (edges, np.array([3, 2, 1]))}
            for s in (0, 50, 100)}
    fig = plots.ridge(rows)
    ax = fig.axes[0]
    assert len(outlines(ax)) == 6
    assert [t.get_text() for t in ax.get_yticklabels()] == ["100", "50", "0"]


def test_channel_grid_and_icnn_filter():
    maps = np.random.default_rng(0).normal(size=(6, 6, 10))
    fig = plots.channel_grid(maps, "x", cols=4)
    ax = fig.axes[0]                                               # one mosaic image: 3 rows of 4 tiles
    assert [t.get_text() for t in ax.texts] == [f"ch {c}" for c in range(10)]
    shown = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    gap = plots._row_gap(6, 1)
    for c in range(10):
        r, q = divmod(c, 4)
        np.testing.assert_array_equal(shown[r * (6 + gap):r * (6 + gap) + 6, q * 7:q * 7 + 6], maps[..., c])
    assert np.isnan(shown[:, 6]).all() and np.isnan(shown[6:6 + gap]).all()   # nothing drawn between tiles
    assert ax.images[0].get_cmap().name.startswith("RdBu_r")      # signed values: diverging
    assert len(ax.images) == 1                                     # no NaN/Inf value: no grey layer
    maps[2, 3, 1] = np.nan
    nan_layer = plots.channel_grid(maps, "x", cols=4).axes[0].images[1].get_array()
    assert (~np.ma.getmaskarray(nan_layer)).sum() == 1 and not np.ma.getmaskarray(nan_layer)[2, 7 + 3]
    row = {"label": "pos", "pre": np.ones((4, 4)), "mask": -np.ones((4, 4)), "post": np.zeros((4, 4)),
           "mu_cell": (1, 2)}
    fig = plots.icnn_filter([row, {**row, "label": "neg"}])
    img_axes = [a for a in fig.axes if a.images and a.get_title()]
    assert len(img_axes) == 6
    assert [a.get_title() for a in img_axes[:3]] == ["pos: pre", "pos: mask", "pos: post"]
    marker = img_axes[0].get_lines()[0]
    assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (2, 1)


def test_templates_grid_highlights_the_chosen_mu():
    h = w = 4
    grid = templates.positive_templates(h, w, 2.0).reshape(h, w, h, w)
    fig = plots.templates_grid(grid, templates.negative_template(h, w), {"sample 0": (1, 3)}, tau=0.5 / 16)
    mosaic_ax, chosen_ax, neg_ax = fig.axes[:3]
    rects = [p for p in mosaic_ax.patches if isinstance(p, Rectangle)]
    assert len(rects) == 1 and rects[0].get_xy() == (3 * (w + 1) - 0.9, 1 * (h + 1) - 0.9)
    chosen = chosen_ax.images[0].get_array()
    assert np.unravel_index(np.argmax(chosen), chosen.shape) == (1, 3)
    assert (neg_ax.images[0].get_array() == -1).all()
    assert "tau" in fig.get_suptitle()


def test_mu_scatter_and_channel_lines():
    fig = plots.mu_scatter({"positive": np.zeros((5, 2)), "negative": np.ones((3, 2))})
    cols = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in cols] == [5, 3]
    assert fig.axes[0].get_ylim()[0] > fig.axes[0].get_ylim()[1]      # rows grow downwards, like the map
    fig = plots.channel_lines({"beta": ([0, 10, 20], np.ones((3, 4)))}, highlight=2)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 5 and lines[2].get_linewidth() > lines[0].get_linewidth()


def test_heatmap_columns_are_the_recorded_steps():
    """Steps [10, 20, 30, 1000]: four equal columns labelled with their steps (not step 30 at a
    third of a linear 10..1000 axis)."""
    fig = plots.heatmap(np.arange(8.0).reshape(2, 4), ["a", "b"], [10, 20, 30, 1000])
    ax = fig.axes[0]
    img = ax.images[0]
    assert img.get_extent() == [-0.5, 3.5, 1.5, -0.5]            # one unit per recorded step
    ticks = {float(t): lab.get_text() for t, lab in zip(ax.get_xticks(), ax.get_xticklabels())}
    assert ticks == {0.0: "10", 1.0: "20", 2.0: "30", 3.0: "1000"}
    assert "not to scale" in ax.get_xlabel()
    even = plots.heatmap(np.ones((1, 3)), ["a"], [5, 10, 15]).axes[0]
    assert even.get_xlabel() == "step"


def test_log_y_is_a_log_axis_even_below_2():
    """Fractions below 2 (where symlog is linear) still get a log axis; empty bins sit at its floor."""
    edges = np.linspace(0, 10, 6)
    counts = np.array([1000, 100, 10, 0, 1])
    lin, log = (plots.histograms({"forward": {"all": (edges, counts)}}, log=v).axes[0] for v in (False, True))
    assert lin.get_yscale() == "linear" and log.get_yscale() == "log"
    y = outlines(log)[0].get_data().values
    assert (y > 0).all() and y[3] == log.get_ylim()[0] < y[4]    # the empty bin at the floor
    assert np.isclose(y[0], 1000 / 1111)                         # fractions, unchanged


def test_ridge_log_changes_the_rows():
    edges = np.linspace(0, 1, 4)
    rows = {s: {"all": (edges, np.array([1000, 10, 1]))} for s in (0, 10)}
    heights = [outlines(plots.ridge(rows, log=v).axes[0])[0].get_data().values for v in (False, True)]
    base = 1                                                     # the first step is the top row
    lin, log = heights[0] - base, heights[1] - base
    assert lin[2] < 0.001 and log[2] > 0.1                       # the small bin shows on the log scale
    assert "log10 fraction" in plots.ridge(rows, log=True).axes[0].get_title()


def test_legend_states_real_count_and_subsample():
    edges = np.linspace(0, 1, 3)
    fig = plots.histograms({"forward": {"positive": (edges, np.array([30000, 35536])),
                                        "negative": (edges, np.array([5, 5]))}},
                           totals={"forward": {"positive": 200_000, "negative": 10}})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["positive (n=200,000; histogram of 65,536)", "negative (n=10)"]


def test_symlog_bins_for_long_tailed_values():
    from inspector.analysis.binning import long_tailed, value_bins
    rng = np.random.default_rng(0)
    grad = rng.laplace(0, 1e-6, 50_000) * np.exp(rng.normal(0, 3, 50_000))   # heavy tails, both signs
    grad[:1000] = 0.0
    lin = value_bins(grad, scale="linear")
    assert lin.scale == "linear" and np.histogram(grad, lin.edges)[0].max() > 0.9 * grad.size  # one spike
    b = value_bins(grad)
    assert long_tailed(grad) and b.scale == "symlog" and np.all(np.diff(b.edges) > 0)
    counts = np.histogram(grad, b.edges)[0]
    assert counts.max() < 0.5 * grad.size and counts.sum() == grad.size
    assert b.edges[0] <= grad.min() and b.edges[-1] >= grad.max()
    zero_bin = np.searchsorted(b.edges, 0.0) - 1
    assert b.edges[zero_bin] == -b.linthresh and counts[zero_bin] >= 1000
    assert value_bins(np.linspace(-1, 1, 100)).scale == "linear"             # not long-tailed: linear
    assert value_bins(np.abs(grad), scale="symlog").edges[0] == -value_bins(np.abs(grad), scale="symlog").linthresh
    fig = plots.histograms({"gradient": {"all": plots.hist_from_values(grad, b.edges)}}, density=False,
                           xscale={"gradient": b.linthresh})
    assert fig.axes[0].get_xscale() == "symlog" and fig.axes[0].get_ylabel() == "fraction of values per bin"


def test_dead_filters():
    x = np.random.default_rng(0).uniform(0, 1, (4, 5, 5, 3))
    x[..., 1] = 0.0
    x[0, 2, 2, 2] = np.nan                                       # NaN is not "never fires"
    x[1:, ..., 2] = 0.0
    assert templates.dead_filters(pre_mask=x).tolist() == [False, True, False]
    mu = np.zeros((4, 3, 2))
    mu[:, 1] = -1.0
    mu[0, 2] = -1.0                                              # once at the corner: alive
    assert templates.dead_filters(mu=mu).tolist() == [False, True, False]
