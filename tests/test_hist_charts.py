"""viewer.hist_charts: the Vega-Lite histograms and ridge plot hold the numbers numpy gives."""
from __future__ import annotations

import numpy as np

from viewer import hist_charts


def test_hist_frame_is_numpy_density_and_legend_states_real_and_counted_sizes():
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1, 1, 500), rng.normal(-1, 2, 300)
    edges = np.linspace(-6, 6, 25)
    groups = {"positive": (edges, np.histogram(pos, edges)[0]), "negative": (edges, np.histogram(neg, edges)[0])}
    df = hist_charts.hist_frame(groups, totals={"positive": 70_000})
    for g, v in (("positive", pos), ("negative", neg)):
        got = df[df["group"] == g]
        inside = v[(v >= -6) & (v <= 6)]
        np.testing.assert_allclose(got["y"], np.histogram(inside, edges, density=True)[0])
        np.testing.assert_array_equal(got["x0"], edges[:-1])
    counted = int(((pos >= -6) & (pos <= 6)).sum())
    assert set(df["label"]) == {f"positive (n=70,000; histogram of {counted:,})",
                                f"negative (n={int(((neg >= -6) & (neg <= 6)).sum()):,})"}


def test_log_axis_floor_and_chart_spec():
    edges = np.array([0.0, 1, 2, 3])
    groups = {"all": (edges, np.array([8, 0, 2]))}
    df = hist_charts.hist_frame(groups, log=True)
    assert df["floor"].iloc[0] == 0.2 / 2 and df["y"].tolist() == [0.8, 0.1, 0.2]   # the empty bin at the floor
    spec = hist_charts.histogram_chart({"forward": groups}, log=True).to_dict()
    assert spec["hconcat"][0]["encoding"]["y"]["scale"] == {"type": "log", "domainMin": 0.1}


def test_ridge_rows_scale_to_each_steps_peak():
    edges = np.array([0.0, 1, 2])
    rows = {10: {"all": (edges, np.array([1, 3]))}, 20: {"all": (edges, np.array([4, 4]))}}
    df = hist_charts.ridge_frame(rows, overlap=1.0)
    first, last = df[df["step"] == 10], df[df["step"] == 20]
    assert first["base"].tolist() == [1, 1] and last["base"].tolist() == [0, 0]     # top = first step
    np.testing.assert_allclose(first["top"] - first["base"], [1 / 3, 1])
    np.testing.assert_allclose(last["top"] - last["base"], [1, 1])
    log = hist_charts.ridge_frame(rows, overlap=1.0, log=True, decades=1)
    np.testing.assert_allclose((log["top"] - log["base"])[:2], [1 + np.log10(1 / 3), 1])
