"""Alerts and positive/negative helpers of inspector.analysis, and the synthetic run they run on."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import inspector
from inspector import analysis
from inspector.analysis import Thresholds
from inspector.format import HIST_MAX_ELEMENTS
from inspector.testing import SyntheticRun, make_synthetic_run


def stats_frame(rows):
    cols = ["step", "tensor", "kind", "group", "l2", "zero_fraction", "mean", "std"]
    return pd.DataFrame(rows, columns=cols)


def test_gradient_alerts_vanishing_exploding_and_ratio():
    rows = [(s, t, "gradient", "all", l2, 0.0, 0.0, 1.0) for s in range(20)
            for t, l2 in (("a:0", 1e-9), ("b:0", 1.0), ("c:0", 5e3))]
    kinds = {a.kind: a for a in analysis.gradient_alerts(stats_frame(rows))}
    assert kinds["vanishing_gradient"].tensor == "a:0"
    assert kinds["exploding_gradient"].tensor == "c:0" and kinds["exploding_gradient"].severity == "error"
    assert kinds["gradient_ratio"].step == 19
    # thresholds are parameters: loosen them and the alerts go away
    loose = Thresholds(vanishing_l2=1e-12, exploding_l2=1e4, layer_ratio=1e13)
    assert analysis.gradient_alerts(stats_frame(rows), loose) == []


def test_gradient_alerts_use_the_window_median():
    # one huge spike long ago, healthy recently: no alert
    rows = [(s, "a:0", "gradient", "all", 1e6 if s == 0 else 1.0, 0.0, 0.0, 1.0) for s in range(30)]
    assert analysis.gradient_alerts(stats_frame(rows)) == []


def test_dead_relu_only_for_relu_ops_and_whole_window():
    cat = pd.DataFrame({"name": ["r:0", "c:0", "r2:0"], "op_type": ["Relu", "Conv2D", "Relu"]})
    rows = [(s, t, "forward", "all", 1.0, zf, 0.0, 1.0) for s in range(20)
            for t, zf in (("r:0", 1.0), ("c:0", 1.0), ("r2:0", 1.0 if s < 15 else 0.5))]
    dead = analysis.dead_relus(stats_frame(rows), cat)
    assert [a.tensor for a in dead] == ["r:0"]


def test_split_and_common_bins():
    groups = np.array([1, 0, 1, 0])
    x = np.arange(8.0).reshape(4, 2)
    s = analysis.split_by_group(x, groups)
    assert s["positive"].tolist() == [[0, 1], [4, 5]] and s["negative"].shape == (2, 2)
    edges = analysis.common_bins(np.array([1.0, np.nan]), np.array([3.0, np.inf]), bins=4)
    assert edges[0] == 1.0 and edges[-1] == 3.0 and len(edges) == 5


def test_icnn_mu_and_mask_follow_icnn_md():
    x = np.zeros((1, 5, 5, 2))
    x[0, 4, 0, 0] = 1.0                    # bottom-left
    mu, sqrtvar = analysis.icnn_mu(x)
    assert mu[0, 0].tolist() == [1.0, -1.0]
    assert mu[0, 1].tolist() == [-1.0, -1.0]          # all-zero map: mu = (1, 1) in pixels
    assert sqrtvar[0, 0] == 0
    m = analysis.icnn_mask(mu, np.array([2.0, 2.0]), 5, 5)
    assert m[0, 4, 0, 0] == 1.0 and m[0, 0, 4, 0] == -1.0
    assert analysis.mu_to_cell(mu[0, 0], 5, 5).tolist() == [4, 0]


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    return inspector.open_run(make_synthetic_run(tmp_path_factory.mktemp("r") / "bad", steps=30, tensors=20,
                                                 dump_every=10, nonfinite_at=12, dropped_steps=(20,)))


def test_run_alerts_on_synthetic_run(bad_run):
    alerts = analysis.run_alerts(bad_run)
    assert alerts[0].severity == "error" and alerts[0].kind == "nonfinite"
    assert alerts[0].step == 12 and alerts[0].tensor == "conv2/Relu:0"
    kinds = [a.kind for a in alerts]
    assert "dead_relu" in kinds and "dropped_dumps" in kinds
    frame = analysis.alerts_frame(alerts)
    assert list(frame.columns) == ["severity", "kind", "message", "step", "tensor"] and len(frame) == len(alerts)


def test_dropped_statistics_steps_are_not_counted_as_dumps(tmp_path):
    """Statistics steps lost to a full disk are counted as statistics steps, not as dumps, and
    the alert is not called "dropped dumps" (nor its reasons "stats statistics ...")."""
    run = SyntheticRun(tmp_path / "r", tensors=10, steps_hint=30, dump_every=10, dropped_steps=(20,))
    run.write_steps(0, 30)
    for step in range(21, 25):
        run.writer.record_drop(step, "write error: OSError: [Errno 28] No space left on device", what="stats")
    run.close()
    dropped = inspector.open_run(tmp_path / "r").dropped
    assert analysis.dropped_text(dropped) == "1 dump(s), 4 statistics step(s)"
    (alert,) = analysis.dropped_alerts(dropped)
    assert alert.message.startswith("1 dump(s), 4 statistics step(s) dropped: ") and alert.step == 20
    assert alert.kind == "dropped_data" and "stats " not in alert.message
    assert "No space left on device (4 statistics step(s), steps 21..24)" in alert.message
    only = dropped[dropped["what"] == "stats"]
    assert analysis.dropped_alerts(only)[0].kind == "dropped_statistics"


def test_clean_synthetic_run_has_no_alerts(tmp_path):
    run = inspector.open_run(make_synthetic_run(tmp_path / "ok", steps=20, tensors=15, dump_every=10,
                                                dead_relu=False))
    assert analysis.run_alerts(run) == []


def test_group_contrast_and_series(bad_run):
    fwd = bad_run.query_stats(kinds=["forward"], steps=(0, 11))
    c = analysis.group_contrast(fwd, "mean")
    row = c[(c["tensor"] == "icnn/post_mask:0") & (c["step"] == 11)].iloc[0]
    assert row["diff"] == pytest.approx(row["positive"] - row["negative"]) and row["effect"] > 0
    top = analysis.top_separating(fwd, n=3)
    assert len(top) == 3 and top["effect"].abs().is_monotonic_decreasing
    s = analysis.group_series(fwd, "conv1/Relu:0", "mean")
    assert list(s.columns) == ["all", "positive", "negative"] and s.index.tolist() == list(range(12))
    # a group with no row at all (no sample of it in any batch read): NaN, not a KeyError
    only_pos = fwd[fwd["group"] != "negative"]
    c = analysis.group_contrast(only_pos, "mean")
    assert len(c) and c["negative"].isna().all() and c["diff"].isna().all()
    assert len(analysis.top_separating(only_pos, n=3)) == 3


def test_synthetic_run_is_consistent(bad_run):
    st = bad_run.query_stats(["conv1/Relu:0"], steps=(5, 5), kinds=["forward"])
    row = st.set_index(st["group"].astype(str))
    assert row.loc["all", "count"] == row.loc["positive", "count"] + row.loc["negative", "count"]
    edges, counts = bad_run.histogram("conv1/Relu:0", 5)
    # the histogram counts a subsample of at most HIST_MAX_ELEMENTS values, as the hook's (rounding only)
    assert abs(counts.sum() - min(row.loc["all", "count"], HIST_MAX_ELEMENTS)) <= len(counts)
    samples = bad_run.samples(10)
    x = bad_run.tensor("conv1/Relu:0", 10)
    assert x.shape[0] == len(samples) and (x >= 0).all()
    pre, mask, post = (bad_run.tensor(f"icnn/{r}:0", 10) for r in ("pre_mask", "mask", "post_mask"))
    np.testing.assert_allclose(post, np.maximum(pre * mask, 0), rtol=1e-6)
    assert bad_run.steps == [0, 10]                                             # 20 was dropped


def test_alerts_on_fewer_steps_than_the_window():
    # a real short run has fewer statistics steps than the window: still alerts, no IndexError
    rows = [(s, "a:0", "gradient", "all", 1e-9, 0.0, 0.0, 1.0) for s in (100, 200, 300)]
    kinds = [a.kind for a in analysis.gradient_alerts(stats_frame(rows), Thresholds(window=10))]
    assert kinds == ["vanishing_gradient"]


def test_gradient_alerts_compare_layer_outputs_only():
    """With the catalog, reads, BN statistics, variable records and biases that feed batch norm
    (zero gradient by construction) are not judged; a layer output still is."""
    cat = pd.DataFrame({
        "name": ["c/Conv2D:0", "c/relu:0", "c/b/read:0", "bn:1", "c/w", "d/MatMul:0", "c/BiasAdd:0"],
        "op_type": ["Conv2D", "Relu", "ReadVariableOp", "FusedBatchNormV3", "VarHandleOp", "MatMul", "BiasAdd"],
        "batched": [True, True, False, False, False, True, True],
        "kind": ["tensor"] * 4 + ["variable"] + ["tensor"] * 2,
        "zero_gradient_expected": [False] * 6 + [True],
    })
    l2 = {"c/Conv2D:0": 0.3, "c/relu:0": 0.2, "c/b/read:0": 1e-11, "bn:1": 1e-12, "c/w": 1e-9, "d/MatMul:0": 0.5,
          "c/BiasAdd:0": 1e-10}
    rows = [(s, t, "gradient", "all", v, 0.0, 0.0, 1.0) for s in range(12) for t, v in l2.items()]
    assert analysis.layer_outputs(cat) == {"c/Conv2D:0", "c/relu:0", "d/MatMul:0"}
    assert analysis.gradient_alerts(stats_frame(rows), catalog=cat) == []
    assert {a.kind for a in analysis.gradient_alerts(stats_frame(rows))} == {"vanishing_gradient", "gradient_ratio"}
    rows += [(s, t, "gradient", "all", 1e-9 if t == "c/relu:0" else v, 0.0, 0.0, 1.0)
             for s in range(12, 24) for t, v in l2.items()]
    found = analysis.gradient_alerts(stats_frame(rows), catalog=cat)
    assert [(a.kind, a.tensor) for a in found] == [("vanishing_gradient", "c/relu:0"), ("gradient_ratio", "c/relu:0")]


def test_layer_outputs_of_an_old_catalog_use_op_types():
    cat = pd.DataFrame({"name": ["a/Relu:0", "a/ReadVariableOp:0"], "op_type": ["Relu", "ReadVariableOp"]})
    assert analysis.layer_outputs(cat) == {"a/Relu:0"}


def test_update_ratios():
    cat = pd.DataFrame({"name": ["w", "x:0"], "kind": ["variable", "tensor"]})
    stats = pd.DataFrame({"step": [1, 1, 2, 2, 1], "tensor": ["w", "w", "w", "w", "x:0"],
                          "kind": ["forward", "update", "forward", "update", "forward"], "group": "all",
                          "l2": [2.0, 0.002, 4.0, 0.0, 1.0]})
    r = analysis.update_ratios(stats, cat)
    assert list(r.columns) == ["w"] and r["w"].tolist() == [0.001, 0.0]
    assert analysis.update_ratios(stats[stats["kind"] == "forward"], cat).empty
    assert analysis.update_ratios(stats, pd.DataFrame({"name": ["w"]})).empty
