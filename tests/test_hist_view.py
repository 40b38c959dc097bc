"""inspector.analysis.hist_view: where each bucket is drawn, which axis a histogram gets, the linear
re-binning and the read-off that compares groups, against numbers computed by hand or numpy."""
from __future__ import annotations

import re

import numpy as np
import pytest

from inspector.analysis import hist_view
from inspector.analysis.hist_view import FLOOR_BAR, GAP, ZERO_HALF, Axis, choose_axis, panel_frame
from inspector.format.loghist import LogHistogram


def test_signed_log_axis_puts_each_bucket_at_its_log2_and_zero_apart():
    """x = sign(v) * (log2|v| - F + GAP), F the floor of log2 of the smallest magnitude shown;
    zeros a bar centred at 0, values below 2**-126 a narrow bar between it and the rest."""
    h = LogHistogram.of(np.array([0.0, 0.0, 1.0, 1.05, -4.0, 2.0 ** -130, 3.0]))
    axis = choose_axis([h], kind="gradient")
    assert axis.scale == "log" and axis.floor == 0                      # smallest normal magnitude: 1.0
    f = hist_view.bars(h, axis)
    at = {lo: row for lo, row in zip(f["lo"], f[["x0", "x1", "count"]].to_numpy()) if lo != 0}
    np.testing.assert_allclose(at[1.0], [GAP, GAP + np.log2(1.125), 2])
    np.testing.assert_allclose(at[-4.5], [-(np.log2(4.5) + GAP), -(2 + GAP), 1])
    np.testing.assert_allclose(at[3.0], [np.log2(3.0) + GAP, np.log2(3.25) + GAP, 1])
    zero, floor = f[f["zero"]], f[(f["lo"] == 0) & ~f["zero"]]
    assert zero[["x0", "x1", "count"]].values.tolist() == [[-ZERO_HALF, ZERO_HALF, 2]]
    assert floor[["x0", "x1", "count"]].values.tolist() == [[*FLOOR_BAR, 1]]
    np.testing.assert_allclose(f["fraction"], f["count"] / 7)
    assert (np.diff(f["x0"]) > 0).all()                                 # value order is x order


def test_the_smallest_magnitude_of_any_group_sets_the_floor():
    a, b = LogHistogram.of(np.array([1e-3, 2e-3])), LogHistogram.of(np.array([-1e-6]))
    axis = choose_axis([a, b], kind="gradient")
    assert axis.floor == int(np.floor(np.log2(1e-6)))
    f = panel_frame({"": {"positive": a, "negative": b}}, axis)
    neg = f[f["group"] == "negative"]
    assert -GAP - 1 < neg["x1"].item() <= -GAP                          # just left of the gap around 0
    assert f[f["group"] == "positive"]["x0"].min() > GAP + 9            # 1e-3 is ~10 powers of two above 1e-6


def test_linear_rebinning_matches_numpy_within_a_bucket():
    """40 equal bins over the exact min..max, each bucket's count spread over the bins it
    overlaps: within a bucket's share of numpy's own histogram; zeros their own bar."""
    rng = np.random.default_rng(0)
    x = np.r_[rng.normal(1.0, 1.0, 50_000), np.zeros(5_000)]
    h = LogHistogram.of(x)
    axis = choose_axis([h], kind="forward", extent=(x.min(), x.max()))
    assert axis.scale == "linear" and (axis.lo, axis.hi) == (x.min(), x.max())
    f = hist_view.bars(h, axis)
    bins, zero = f[~f["zero"]], f[f["zero"]]
    want = np.histogram(x[x != 0], axis.edges)[0]
    assert np.isclose(bins["count"].sum(), want.sum()) and zero["count"].item() == 5_000
    assert np.abs(bins["count"].to_numpy() - want).max() < 0.1 * want.max()
    assert np.isclose(f["fraction"].sum(), 1.0)


@pytest.mark.parametrize("values, kind, want", [
    (lambda r: r.normal(0, 1, 20_000), "forward", "linear"),
    (lambda r: np.maximum(r.normal(0, 1, 20_000), 0), "forward", "linear"),          # a ReLU: zeros apart
    (lambda r: r.normal(0, 1, 20_000) ** 5, "forward", "log"),                       # a long tail
    (lambda r: 10.0 ** r.uniform(-6, 0, 20_000), "forward", "log"),                  # six decades
    (lambda r: r.normal(0, 1, 20_000), "gradient", "log"),
])
def test_auto_axis(values, kind, want):
    x = values(np.random.default_rng(1))
    assert choose_axis([LogHistogram.of(x)], kind=kind, extent=(x.min(), x.max())).scale == want


def test_groups_of_very_different_scales_get_the_log_axis():
    rng = np.random.default_rng(2)
    pos, neg = rng.normal(0, 1, 10_000), rng.normal(0, 0.01, 10_000)
    assert choose_axis([LogHistogram.of(pos)], "forward").scale == "linear"
    assert choose_axis([LogHistogram.of(pos), LogHistogram.of(neg)], "forward").scale == "log"


def test_equal_width_histograms_stay_linear_with_their_own_bins():
    edges, counts = np.linspace(-1, 1, 31), np.arange(30)
    axis = choose_axis([(edges, counts)], kind="gradient", scale="log")
    assert axis.scale == "linear"
    f = hist_view.bars((edges, counts), axis)
    np.testing.assert_array_equal(f["x0"], edges[:-1])
    np.testing.assert_allclose(f["fraction"], counts / counts.sum())
    with pytest.raises(ValueError, match="equal-width.*linear axis"):
        hist_view.bars((edges, counts), Axis("log"))
    with pytest.raises(ValueError, match="scale must be one of"):
        choose_axis([(edges, counts)], scale="symlog")


def test_ticks_are_round_signed_values_at_their_positions():
    axis = Axis("log", floor=int(np.floor(np.log2(1e-7))))
    xs, labels = hist_view.ticks(axis, float(-axis.x(2e-2)), float(axis.x(5e-2)))
    assert labels[0] == "0" and xs[0] == 0.0
    pos = dict(zip(labels, xs))
    assert {"1e-6", "1e-4", "0.01", "-1e-6", "-0.01"} <= set(labels) and "0.1" not in labels
    for lb, x in pos.items():
        if lb != "0":
            v = float(lb)
            assert np.isclose(x, np.sign(v) * (np.log2(abs(v)) - axis.floor + GAP))
    assert hist_view.ticks(Axis("linear"), 0, 1) == ([], [])
    assert [hist_view.tick_label(v) for v in (1e-6, -0.002, 1000, 5e7, -1)] == ["1e-6", "-0.002", "1000", "5e7", "-1"]


def test_readoff_says_negative_gradients_are_ten_times_smaller():
    """The median non-zero |x| per group from the |x| histogram (bucket b and -b merged), and
    the ratio a reader can quote."""
    rng = np.random.default_rng(3)
    pos, neg = rng.laplace(0, 1e-3, 40_000), rng.laplace(0, 1e-4, 40_000)
    pos[:4_000] = 0.0
    summary = hist_view.magnitude_summary({"positive": LogHistogram.of(pos), "negative": LogHistogram.of(neg)})
    for g, v in (("positive", pos), ("negative", neg)):
        m = summary.set_index("group").loc[g, "median_abs"]
        assert abs(m / np.median(np.abs(v[v != 0])) - 1) < 1 / 17
    text = hist_view.ratio_text(summary, "gradient")
    ratio = float(re.search(r"negative / positive: ([\d.]+)x", text).group(1))
    assert abs(ratio / 0.1 - 1) < 0.13, text
    assert "exact zeros: positive 10.0%, negative 0.0%" in text
    assert hist_view.magnitude_summary({"all": (np.linspace(0, 1, 3), np.ones(2))}).empty   # no bound: none


def test_zeros_bar_taller_than_the_rest_tops_the_y_axis():
    x = np.r_[np.zeros(6_000), np.random.default_rng(4).exponential(1, 4_000)]
    h = LogHistogram.of(x)
    for scale in ("log", "linear"):
        f = hist_view.bars(h, choose_axis([h], scale=scale, extent=(0, x.max())))
        top = hist_view.y_top(f["fraction"], f["zero"])
        assert f[f["zero"]]["fraction"].item() == 0.6 and top == 1.15 * f[~f["zero"]]["fraction"].max() < 0.6
    assert hist_view.y_top(np.array([0.1, 0.5]), np.array([True, False])) is None


def test_ridge_rows_scale_to_each_steps_largest_bar():
    h1, h2 = LogHistogram.from_lists([1010, 1011], [1, 3]), LogHistogram.from_lists([1010, 1011], [4, 4])
    axis = choose_axis([h1, h2], kind="gradient")
    df = hist_view.ridge_frame({10: {"all": h1}, 20: {"all": h2}}, axis, overlap=1.0)
    first, last = df[df["step"] == 10], df[df["step"] == 20]
    assert first["base"].tolist() == [1, 1] and last["base"].tolist() == [0, 0]     # top = first step
    np.testing.assert_allclose(first["top"] - first["base"], [1 / 3, 1])
    np.testing.assert_allclose(last["top"] - last["base"], [1, 1])
    log = hist_view.ridge_frame({10: {"all": h1}}, axis, overlap=1.0, log=True, decades=1)
    np.testing.assert_allclose(log["top"] - log["base"], [1 + np.log10(1 / 3), 1])


def test_steps_join_bars_into_one_outline():
    edges, values = hist_view.steps(np.array([3.0, 0, 1]), np.array([4.0, 1, 2]), np.array([0.3, 0.1, 0.2]))
    assert edges.tolist() == [0, 1, 2, 3, 4] and values.tolist() == [0.1, 0.2, 0.0, 0.3]   # the gap at 0


def test_group_colours_never_repeat():
    groups = ["positive", "negative", "all"] + [f"class_{k}" for k in range(30)]
    colors = hist_view.group_colors(groups)
    assert len(set(colors.values())) == len(groups)
    assert (colors["positive"], colors["negative"]) == ("#b2182b", "#67a9cf")
    assert abs(lightness(colors["positive"]) - lightness(colors["negative"])) > 20     # not one hue's shades


def test_row_quantiles_equal_each_histograms_own():
    """One pass over every row (a page's bands over thousands of steps) gives what each
    histogram's quantiles give, empty rows NaN."""
    rng = np.random.default_rng(5)
    hists = [LogHistogram.of(rng.laplace(0, 10.0 ** rng.uniform(-8, 0), rng.integers(1, 300))) for _ in range(60)]
    hists[7] = hists[30] = LogHistogram.of(np.zeros(0))
    q = [0, 0.07, 0.16, 0.5, 0.84, 0.93, 1]
    got = hist_view.row_quantiles(hists, q)
    want = np.stack([h.quantiles(q) for h in hists])
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[[7, 30]]).all() and np.isfinite(np.delete(got, [7, 30], 0)).all()
    with pytest.raises(ValueError, match=r"quantiles must lie in \[0, 1\], got \[1.5\]"):
        hist_view.row_quantiles(hists, [1.5])


def test_band_percentiles_without_extremes_end_at_the_outer_bucket_edges():
    from viewer.charts import bands
    x = np.array([-3.0, 0.5, 1.0, 1.0, 2.0])
    frame = bands.percentile_frame({7: {"all": LogHistogram.of(x)}})
    assert (frame["p0"].item(), frame["p100"].item()) == (-3.25, 2.25)            # buckets [-3.25, -3], [2, 2.25)
    assert frame["p50"].item() == LogHistogram.of(x).quantiles([0.5])[0]


def lightness(hex_colour: str) -> float:
    """CIE L* of a CSS colour (0 black .. 100 white)."""
    lin = [(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
           for c in (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))]
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return 116 * y ** (1 / 3) - 16 if y > 0.008856 else 903.3 * y
