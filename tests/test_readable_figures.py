"""Issue 47: every text of the Matplotlib figures that Feature maps, Masks & templates and the
Tensor browser show is at least 11 CSS px at the drawn scale.

The viewer shows a figure's PNG at its natural size, shrunk only where it is wider than the main
column (``st.image(width="content")``): the drawn scale is ``min(1, column / PNG width)``, and a
text's drawn size its font size in points times dpi / 72 times that scale. The column is
:data:`viewer.ui.FIGURE_WIDTH_PX` (a 1500-px window's main column; tests/test_browser_glance.py
checks in Chromium that the pages' images are drawn unshrunk there)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from inspector.analysis import plots
from viewer.ui import FIGURE_WIDTH_PX

MIN_PX = 11
DPI = 100
#: the page's main column at a 1500-px window (measured in Chromium: 1040 CSS px, 1000 inside
#: st.columns); figures are fitted to FIGURE_WIDTH_PX, which must not exceed it
COLUMN_PX = 1000
LONG = "conv_block_3/conv2d_7/Conv2D:0 forward, step 12000, sample #13 (negative, class 7)"


def _maps(h: int, w: int, c: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(h, w, c))


def figures() -> dict:
    """Each figure the pages show, with its widest realistic content."""
    rng = np.random.default_rng(1)
    tiles = {g: [(f"#{i} 0.{i}7", rng.normal(size=(8, 8))) for i in range(8)]
             for g in ("positive", "negative")}
    loc = {g: [{"label": f"#{i} peak {i + 0.5:.2g}", "image": rng.random((32, 32, 3)),
                "map": rng.random((8, 8)), "mu_cell": (1, 2)} for i in range(6)]
           for g in ("positive", "negative")}
    row = {"pre": rng.random((8, 8)), "mask": rng.normal(size=(8, 8)), "post": rng.random((8, 8)),
           "mu_cell": (2, 3)}
    h = plots.hist_from_values(rng.normal(size=500), np.linspace(-3, 3, 31))
    return {
        "channel_grid": lambda: plots.channel_grid(_maps(16, 16, 70), LONG, first=0),
        "channel_overlay": lambda: plots.channel_overlay(rng.random((32, 32, 3)),
                                                        rng.random((8, 8)), LONG),
        "sample_grid": lambda: plots.sample_grid(tiles, LONG),
        "sample_grid ranking": lambda: plots.sample_grid(tiles, LONG, cols=8, lines=2),
        "icnn_filter": lambda: plots.icnn_filter([{**row, "label": "positive #3"},
                                                  {**row, "label": "negative #9"}], LONG),
        "localization_grid": lambda: plots.localization_grid(loc, LONG),
        "templates_grid": lambda: plots.templates_grid(
            rng.normal(size=(6, 6, 6, 6)), rng.normal(size=(6, 6)),
            {"sample #13 (negative): mu cell (2, 3)": (2, 3)}, tau=0.5 / 36, title=LONG),
        "mu_scatter": lambda: plots.mu_scatter({"positive": rng.uniform(-1, 1, (20, 2)),
                                                "negative": rng.uniform(-1, 1, (20, 2))}, LONG),
        "channel_lines": lambda: plots.channel_lines(
            {"beta (min / mean / max over filters, from statistics)": ([0, 10, 20], rng.random((3, 8))),
             "filter loss (all classes)": ([0, 10, 20], rng.random((3, 8)))}, highlight=2, title=LONG),
        "histograms": lambda: plots.histograms({"forward": {"all": h}}, title=LONG),
    }


def drawn_px(fig) -> tuple[float, int]:
    """(the smallest text's size in CSS px at the drawn scale, the PNG's width) of ``fig`` as the
    viewer renders it."""
    png = plots.to_png(fig, DPI, max_width_px=FIGURE_WIDTH_PX)
    width = Image.open(io.BytesIO(png)).size[0]
    scale = min(1.0, COLUMN_PX / width)
    sizes = [t.get_fontsize() * DPI / 72 for t in plots.drawn_texts(fig)]
    assert sizes, "no text found"
    return min(sizes) * scale, width


def test_the_fitted_width_fits_the_column():
    assert FIGURE_WIDTH_PX <= COLUMN_PX


@pytest.mark.parametrize("name", list(figures()))
def test_every_text_is_at_least_11_px_at_the_drawn_scale(name):
    px, width = drawn_px(figures()[name]())
    assert px >= MIN_PX, f"{name}: smallest text {px:.1f} px (PNG {width} px wide)"


def test_drawn_texts_leave_out_what_is_not_drawn():
    fig = plots.channel_grid(_maps(4, 4, 2), "t")
    plots.to_png(fig)
    drawn = {id(t) for t in plots.drawn_texts(fig)}
    hidden = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]   # its mosaic axes is off
    assert hidden and not drawn & {id(t) for t in hidden}
    assert {"ch 0", "ch 1", "t"} <= {t.get_text() for t in plots.drawn_texts(fig)}
