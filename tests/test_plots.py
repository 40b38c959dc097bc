"""Figures of inspector.plots: the artists they must hold, PNG output, no pyplot state."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle, StepPatch

from inspector import plots, templates


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
    assert [l.get_label() for l in lines[:2]] == ["positive", "negative"]
    assert lines[0].get_color() == plots.GROUP_COLORS["positive"]
    assert lines[2].get_xdata()[0] == 10               # the vertical mark


def test_histograms_overlay_groups_and_share_xlim():
    edges = np.linspace(0, 1, 5)
    fig = plots.histograms({"forward": {"positive": (edges, np.array([1, 2, 3, 4])),
                                        "negative": (edges, np.array([4, 3, 2, 1]))},
                            "gradient": {"all": (edges, np.array([1, 1, 1, 1]))}}, xlim={"forward": (-1, 2)})
    fwd, grad = fig.axes
    steps = [p for p in fwd.patches if isinstance(p, StepPatch)]
    assert len(steps) == 2
    # density: each group integrates to 1
    assert np.isclose((steps[0].get_data().values * np.diff(edges)).sum(), 1.0)
    assert fwd.get_xlim() == (-1, 2)
    assert [t.get_text() for t in fwd.get_legend().get_texts()] == ["positive (n=10)", "negative (n=10)"]


def test_ridge_one_baseline_per_step():
    edges = np.linspace(0, 1, 4)
    rows = {s: {"positive": (edges, np.array([1, 2, 3])), "negative": (edges, np.array([3, 2, 1]))}
            for s in (0, 50, 100)}
    fig = plots.ridge(rows)
    ax = fig.axes[0]
    assert len([p for p in ax.patches if isinstance(p, StepPatch)]) == 6
    assert [t.get_text() for t in ax.get_yticklabels()] == ["100", "50", "0"]


def test_channel_grid_and_icnn_filter():
    maps = np.random.default_rng(0).normal(size=(6, 6, 10))
    fig = plots.channel_grid(maps, "x", cols=4)
    assert sum(len(a.images) for a in fig.axes) == 10
    assert fig.axes[0].images[0].get_cmap().name == "RdBu_r"      # signed values: diverging
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
