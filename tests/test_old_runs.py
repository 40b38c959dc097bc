"""A run written before the log-magnitude histograms (tests/data/old_run: equal-width bins,
format 2) opens with today's reader and renders every viewer page; what needs the new buckets
(quantiles with a bound) says so instead of guessing."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector.errors import InspectorError

OLD = Path(__file__).resolve().parent / "data" / "old_run"


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Path:
    """A copy (the reader may write nothing, but a test must never touch the kept data)."""
    root = tmp_path_factory.mktemp("old") / "runs"
    shutil.copytree(OLD / "icnn", root / "icnn")
    return root


def test_an_old_run_reads_as_before(old):
    run = inspector.open_run(old / "icnn")
    assert run.problems == [] and run.manifest["format_version"] == 2
    assert list(run.stats_steps()) == [2, 4, 6, 8] and run.steps == [8]
    df = run.query_stats(["conv3/Relu:0"], kinds=["gradient"])
    assert {"hist_lo", "hist_hi", "histogram"} <= set(df.columns) and "hist_bucket" not in df.columns
    edges, counts = run.histogram("conv3/Relu:0", 4, "gradient", "positive")
    row = df[(df.step == 4) & (df.group == "positive")].iloc[0]
    np.testing.assert_allclose(edges, np.linspace(row.hist_lo, row.hist_hi, 31))
    assert counts.tolist() == list(row.histogram) and counts.sum() > 0


def test_what_needs_log_buckets_is_refused_by_name(old):
    run = inspector.open_run(old / "icnn")
    with pytest.raises(InspectorError, match=r"quantiles need log-magnitude histograms.*steps 2, 4, 6, 8"):
        run.quantiles("conv3/Relu:0", kind="gradient")
    with pytest.raises(InspectorError, match="equal-width bins.*run.histogram"):
        run.log_histogram("conv3/Relu:0", 4)


def test_a_query_for_the_new_columns_reads_an_old_run(old):
    """A query naming the log-magnitude columns is not a damaged part in an old run: they are
    simply absent (the viewer asks for both schemes' columns)."""
    run = inspector.open_run(old / "icnn")
    df = run.query_stats(["conv3/Relu:0"], columns=["hist_bucket", "hist_count", "mean"])
    assert len(df) and "hist_bucket" not in df.columns and run.problems == []


@pytest.mark.parametrize("page", ["Summary", "Training overview", "Distributions", "Feature maps",
                                  "Masks & templates", "Tensor browser", "Op graph", "Compare"])
def test_every_page_renders_an_old_run(old, page):
    pytest.importorskip("streamlit")
    from test_app import ok, start, vega
    at = ok(start(old, page, query={"run": "icnn"}))
    assert not [e.value for e in at.error], [e.value for e in at.error]
    if page == "Distributions":   # the equal-width histograms drawn as stored: their bins, a linear axis
        bars = [d for _, datasets in vega(at) for d in datasets if {"x0", "x1", "count"} <= set(d.columns)]
        assert bars and max(int(d["count"].sum()) for d in bars) > 0
        run = inspector.open_run(old / "icnn")
        tensor = at.selectbox(key="di_tensor").value
        row = run.query_stats([tensor], steps=(8, 8), kinds=["forward"], groups=["positive"]).iloc[0]
        drawn = bars[0][bars[0]["group"] == "positive"]
        np.testing.assert_allclose(drawn["x0"], np.linspace(row.hist_lo, row.hist_hi, 31)[:-1])
        assert drawn["count"].tolist() == list(row.histogram)
        assert "the stored equal-width bins (a run before format version 4)" in " ".join(c.value for c in at.caption)
