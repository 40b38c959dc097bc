"""Naming the culprit (docs/guide/diagnose.md): the origin of the first NaN/Inf over the graph,
the statistics a non-finite row shows, each detector at its threshold, the ranking, and `info`.
Runs written without TensorFlow (RunWriter, a hand-made graph.pb); the real models of each fault
are bench/bench_diagnosis.py's (tests/test_bench_smoke.py runs its quick set)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import inspector
from inspector import cli
from inspector.analysis import diagnose, diagnosis_text, run_alerts
from inspector.analysis import signals
from inspector.analysis.diagnosis import rank
from inspector.graph.origin import Origin, find_origin
from inspector.analysis.signals import Finding, SignalThresholds
from inspector.format import STAT_COLUMNS
from inspector.format.loghist import ONE, LogHistogram, empty_rows
from inspector.graph.graphdef import Node, OpGraph, encode_graph_def
from inspector.stats.summary import overview
from inspector.writer import RunWriter, StatsLayout

COL = {c: i for i, c in enumerate(STAT_COLUMNS)}

#: x -> fc1/MatMul(x, fc1/kernel read) -> fc1/Relu -> fc2/Log -> loss/Mean
NODES = [Node("x", "Placeholder"), Node("fc1/kernel", "VarHandleOp"),
         Node("fc1/read", "ReadVariableOp", ("fc1/kernel",)), Node("fc1/MatMul", "MatMul", ("x", "fc1/read")),
         Node("fc1/Relu", "Relu", ("fc1/MatMul",)), Node("fc2/Log", "Log", ("fc1/Relu",)),
         Node("loss/Mean", "Mean", ("fc2/Log",))]
TENSORS = ["x:0", "fc1/read:0", "fc1/MatMul:0", "fc1/Relu:0", "fc2/Log:0", "loss/Mean:0"]


def catalog() -> list[dict]:
    out = []
    for t in TENSORS:
        op = t[:-2]
        node = next(n for n in NODES if n.name == op)
        out.append({"name": t, "op": op, "op_type": node.op, "dtype": "float32", "shape": [None, 4],
                    "scope": op.rsplit("/", 1)[0] if "/" in op else "", "has_gradient": True, "batched": True,
                    "icnn_layer": None, "icnn_role": None, "variable": "fc1/kernel" if t == "fc1/read:0" else None,
                    "source_file": "model.py", "source_line": 10 + TENSORS.index(t), "source_function": "build"})
    return out


def write(path: Path, bad: dict[int, dict[tuple[str, str], tuple[int, int]]], steps=(5, 10, 15, 20),
          l2: float = 1.0, mode: str = "train") -> Path:
    """A run of TENSORS (forward and gradient rows, group all) at ``steps``; ``bad[step][(tensor,
    kind)] = (nan, inf)`` makes that row non-finite as the hook stores it: mean/std/min/max NaN
    over no finite value, l2 0, zero_fraction 0."""
    lay = StatsLayout(tuple(t for t in TENSORS for _ in range(2)), ("forward", "gradient") * len(TENSORS),
                      ("all",) * (2 * len(TENSORS)))
    w = RunWriter(path, manifest={"tensors": catalog(), "loss": "loss/Mean:0", "groups": None}, stats_layout=lay,
                  graph_def=encode_graph_def(NODES), mode=mode)
    for s in steps:
        values = np.zeros((len(lay.tensors), len(STAT_COLUMNS)))
        values[:, COL["count"]], values[:, COL["mean"]], values[:, COL["l2"]] = 8, 0.5, l2
        for (tensor, kind), (nan, inf) in bad.get(s, {}).items():
            r = next(i for i, (t, k) in enumerate(zip(lay.tensors, lay.kinds)) if (t, k) == (tensor, kind))
            values[r] = 0.0
            values[r, COL["count"]], values[r, COL["nan"]], values[r, COL["inf"]] = 8, nan, inf
            values[r, [COL["mean"], COL["std"], COL["min"], COL["max"]]] = np.nan
        w.add_stats(s, values, empty_rows(len(lay.tensors)))
    w.close()
    return path


def downstream(tensor: str, kinds=("forward", "gradient")) -> dict:
    """Every row from ``tensor`` on (forward) and every gradient: what a forward NaN leaves."""
    i = TENSORS.index(tensor)
    out = {(t, "forward"): (8, 0) for t in TENSORS[i:] if "forward" in kinds}
    out.update({(t, "gradient"): (8, 0) for t in TENSORS if "gradient" in kinds})
    return out


def test_the_origin_is_the_first_op_made_non_finite_from_finite_inputs(tmp_path):
    run = inspector.open_run(write(tmp_path / "r", {20: downstream("fc2/Log:0")}))
    first = run.first_nonfinite()
    assert (first["step"], first["op"], first["where"], first["layer"]) == (20, "fc2/Log", "forward", "fc2")
    assert first["created_at"] == "model.py:14 in build" and "from finite fc1/Relu:0" in first["text"]
    # the catalog's first non-finite row is the input's gradient: never the answer
    assert run.nonfinite_evidence()[0]["tensor"] == "x:0"


def test_a_gradient_made_non_finite_by_an_op_backward_names_that_op(tmp_path):
    bad = {20: {("fc1/Relu:0", "gradient"): (0, 8), ("fc1/MatMul:0", "gradient"): (8, 0),
                ("fc1/read:0", "gradient"): (8, 0), ("x:0", "gradient"): (8, 0)}}
    first = inspector.open_run(write(tmp_path / "r", bad)).first_nonfinite()
    assert (first["where"], first["op"], first["tensor"], first["kind"]) == ("backward", "fc2/Log", "fc1/Relu:0",
                                                                            "gradient")


def test_weights_already_non_finite_and_the_input_data_are_told_apart(tmp_path):
    weights = {20: {("fc1/read:0", "forward"): (8, 0), **downstream("fc1/MatMul:0")}}
    assert inspector.open_run(write(tmp_path / "w", weights)).first_nonfinite()["where"] == "weights"
    assert inspector.open_run(write(tmp_path / "i", {20: downstream("x:0")})).first_nonfinite()["where"] == "input"


def test_find_origin_over_uncaptured_ops():
    """An op between two captured ones (uncaptured) is walked through: Relu's producer is MatMul."""
    nodes = [*NODES[:4], Node("fc1/BiasAdd", "BiasAdd", ("fc1/MatMul",)), Node("fc1/Relu", "Relu", ("fc1/BiasAdd",))]
    cat = pd.DataFrame(catalog()[:4])
    rows = pd.DataFrame({"tensor": ["fc1/MatMul:0", "fc1/Relu:0"], "kind": "forward", "nan": [0, 4], "inf": 0,
                         "count": 4})
    o = find_origin(rows, cat, OpGraph(nodes), 7)
    assert o is not None and o.op == "fc1/Relu" and o.finite == ["fc1/MatMul:0"] and o.step == 7


def test_a_non_finite_row_never_reads_as_zero_or_healthy(tmp_path):
    run = inspector.open_run(write(tmp_path / "r", {20: downstream("fc2/Log:0")}))
    row = run.query_stats(["fc2/Log:0"], steps=(20, 20), kinds=["forward"]).iloc[0]
    assert np.isnan(row["l2"]) and np.isnan(row["mean"]) and row["nan"] == 8
    stored = run.query_stats(["fc2/Log:0"], steps=(20, 20), kinds=["forward"], finite_part=True).iloc[0]
    assert stored["l2"] == 0.0   # the hook stores the finite part's norm: none here
    only_l2 = run.query_stats(["fc2/Log:0"], steps=(20, 20), kinds=["forward"], columns=["l2"])
    assert np.isnan(only_l2["l2"].iloc[0]) and "nan" not in only_l2
    ov = overview(run, "gradient", "all", "l2")
    col = list(ov.steps).index(20)
    assert np.isnan(ov.matrix[:, col]).all() and not np.isnan(ov.matrix[:, :col]).any()


def frame(values: dict[str, list[float]], kind: str, column: str = "l2", steps=(5, 10, 15)) -> pd.DataFrame:
    return pd.DataFrame([{"step": s, "tensor": t, "kind": kind, "group": "all", column: v[i]}
                         for t, v in values.items() for i, s in enumerate(steps)])


def variables(*names: str) -> pd.DataFrame:
    return pd.DataFrame({"name": list(names), "kind": "variable", "op": list(names), "op_type": "VarHandleOp",
                         "shape": [[4, 4]] * len(names), "scope": [n.split("/")[0] for n in names]})


def test_frozen_weights_and_updates_too_large():
    th = SignalThresholds()
    cat = variables("fc1/kernel", "fc2/kernel", "fc3/kernel")
    value = frame({v: [2.0] * 3 for v in cat["name"]}, "forward")
    grad = frame({v: [0.5] * 3 for v in cat["name"]}, "gradient")
    upd = frame({"fc1/kernel": [0.002] * 3, "fc2/kernel": [0.0] * 3, "fc3/kernel": [0.002, 0.4, 0.002]}, "update")
    found = signals.update_findings(pd.concat([value, grad, upd]), cat, th)
    assert [(f.kind, f.layer, f.step) for f in found] == [("frozen", "fc2", 5), ("update_ratio_high", "fc3", 10)]
    # just under the threshold: silent; most matrices at once: the learning rate
    upd = frame({v: [0.002, th.update_ratio_high * 2 * 0.99, 0.002] for v in cat["name"]}, "update")
    assert not signals.update_findings(pd.concat([value, grad, upd]), cat, th)
    upd = frame({v: [0.002, th.update_ratio_high * 2, 0.002] for v in cat["name"]}, "update")
    assert [(f.kind, f.layer, f.step) for f in signals.update_findings(pd.concat([value, grad, upd]), cat, th)] \
        == [("diverging", None, 10)]


def test_a_bias_ratio_is_not_judged():
    cat = pd.concat([variables("fc1/kernel"), variables("fc1/bias")])
    stats = pd.concat([frame({"fc1/kernel": [2.0] * 3, "fc1/bias": [0.01] * 3}, "forward"),
                       frame({"fc1/kernel": [0.002] * 3, "fc1/bias": [0.01] * 3}, "update")])
    assert not signals.update_findings(stats, cat, SignalThresholds())


def test_loss_diverges_or_stalls():
    th = SignalThresholds()
    assert [f.kind for f in signals.loss_findings(pd.Series([0.7, 0.6, 6.9], index=[5, 10, 15]), th)] == []
    up = signals.loss_findings(pd.Series([0.7, 0.6, 7.1, np.nan], index=[5, 10, 15, 20]), th)
    assert [(f.kind, f.step) for f in up] == [("loss_diverges", 15)]
    flat = pd.Series([0.5] * th.stall_steps, index=range(th.stall_steps))
    assert [f.kind for f in signals.loss_findings(flat, th)] == ["loss_stalls"]
    assert not signals.loss_findings(flat.iloc[:-1], th)   # too few steps to say


def test_a_gradient_that_grows_across_an_identity_is_found():
    nodes = [Node("a", "MatMul"), Node("fc1/scale", "IdentityN", ("a",)), Node("b", "Relu", ("fc1/scale",))]
    cat = pd.DataFrame({"name": ["a:0", "fc1/scale:0", "b:0"], "op": ["a", "fc1/scale", "b"],
                        "op_type": ["MatMul", "IdentityN", "Relu"], "scope": ["", "fc1", ""]})
    th = SignalThresholds()
    grad = frame({"a:0": [th.gradient_jump] * 3, "fc1/scale:0": [1.0] * 3, "b:0": [1.0] * 3}, "gradient")
    found = signals.gradient_jump_findings(grad, cat, OpGraph(nodes), th)
    assert [(f.kind, f.op, f.layer) for f in found] == [("gradient_jump", "fc1/scale", "fc1")]
    assert found[0].numbers["input"] == "a:0"   # the Summary charts both sides of the op
    grad = frame({"a:0": [th.gradient_jump * 0.99] * 3, "fc1/scale:0": [1.0] * 3, "b:0": [1.0] * 3}, "gradient")
    assert not signals.gradient_jump_findings(grad, cat, OpGraph(nodes), th)
    # a second consumer of a on the loss's path: a's gradient sums both, no verdict
    nodes.append(Node("c", "Relu", ("a",)))
    cat2 = pd.concat([cat, pd.DataFrame({"name": ["c:0"], "op": ["c"], "op_type": ["Relu"], "scope": [""]})])
    grad = frame({"a:0": [10.0] * 3, "fc1/scale:0": [1.0] * 3, "b:0": [1.0] * 3, "c:0": [1.0] * 3}, "gradient")
    assert not signals.gradient_jump_findings(grad, cat2, OpGraph(nodes), th)


def hist_rows(values: np.ndarray, tensor: str, steps=(5, 10, 15)) -> pd.DataFrame:
    h = LogHistogram.of(values)
    return pd.DataFrame([{"step": s, "tensor": tensor, "kind": "forward", "group": "all",
                          "hist_bucket": h.index.tolist(), "hist_count": h.count.tolist()} for s in steps])


def test_a_saturated_tanh_is_found_from_its_histogram():
    th = SignalThresholds()
    cat = pd.DataFrame({"name": ["fc1/Tanh:0"], "op": ["fc1/Tanh"], "op_type": ["Tanh"], "scope": ["fc1"]})
    n = 1000
    flat = int(np.ceil(th.saturated_share * n))
    x = np.concatenate([np.full(flat, 0.999), np.full(n - flat, 0.3)])
    assert [(f.kind, f.layer) for f in signals.saturation_findings(hist_rows(x, "fc1/Tanh:0"), cat, th)] == \
        [("saturated", "fc1")]
    x = np.concatenate([np.full(flat - 20, 0.999), np.full(n - flat + 20, 0.3)])
    assert not signals.saturation_findings(hist_rows(x, "fc1/Tanh:0"), cat, th)
    assert 2.0 ** ((ONE - 1 - 1010) / 8) < 1   # the bucket judged is below 1: [0.9375, 1)


def test_an_op_that_zeroes_most_units_is_found():
    th = SignalThresholds()
    nodes = [Node("fc1/Relu", "Relu"), Node("drop1/Select", "SelectV2", ("fc1/Relu",)), Node("w", "VarHandleOp"),
             Node("w/read", "ReadVariableOp", ("w",)), Node("fc2/MatMul", "MatMul", ("drop1/Select", "w/read")),
             Node("loss/sub", "Sub", ("fc1/Relu",))]
    cat = pd.DataFrame({"name": ["fc1/Relu:0", "drop1/Select:0", "loss/sub:0"],
                        "op": ["fc1/Relu", "drop1/Select", "loss/sub"], "op_type": ["Relu", "SelectV2", "Sub"],
                        "scope": ["fc1", "drop1", "loss"], "batched": True, "has_gradient": True})
    zf = frame({"fc1/Relu:0": [0.5] * 3, "drop1/Select:0": [0.95] * 3, "loss/sub:0": [1.0] * 3}, "forward",
               "zero_fraction")
    # the loss's own Sub is all zeros too, but feeds no layer with weights: structural, not judged
    assert [(f.kind, f.layer) for f in signals.dead_unit_findings(zf, cat, OpGraph(nodes), th)] == \
        [("dead_units", "drop1")]
    zf = frame({"fc1/Relu:0": [0.7] * 3, "drop1/Select:0": [0.95] * 3}, "forward", "zero_fraction")
    assert not signals.dead_unit_findings(zf, cat, OpGraph(nodes), th)   # not far above its input's share


def test_a_softmax_whose_rows_peak_at_1_is_saturated():
    """Attention weights one-hot: a softmax over 8 values whose every row's top value is ~1."""
    th = SignalThresholds()
    cat = pd.DataFrame({"name": ["att/Softmax:0"], "op": ["att/Softmax"], "op_type": ["Softmax"],
                        "scope": ["att"], "shape": [[None, 4, 8]]})
    rows = 100
    peaked = np.concatenate([np.full(rows, 0.999), np.full(rows * 7, 1e-4)])
    assert [f.kind for f in signals.saturation_findings(hist_rows(peaked, "att/Softmax:0"), cat, th)] == \
        ["saturated"]
    spread = np.full(rows * 8, 1 / 8)   # every value 0.125: no row peaks
    assert not signals.saturation_findings(hist_rows(spread, "att/Softmax:0"), cat, th)
    # without its class count a softmax is not judged: a share of values alone says nothing
    assert not signals.saturation_findings(hist_rows(peaked, "att/Softmax:0"), cat.assign(shape=[[None]]), th)


def test_a_models_output_probabilities_are_not_saturation():
    """A confident classifier's sigmoid sits at 0 and 1: it feeds no layer, so it is not judged."""
    th = SignalThresholds()
    nodes = [Node("logits", "MatMul"), Node("probability", "Sigmoid", ("logits",))]
    cat = pd.DataFrame({"name": ["probability:0"], "op": ["probability"], "op_type": ["Sigmoid"], "scope": [""],
                        "has_gradient": [True]})
    rows = hist_rows(np.full(100, 0.999), "probability:0")
    assert signals.saturation_findings(rows, cat, th) and not signals.saturation_findings(rows, cat, th,
                                                                                          OpGraph(nodes))


def test_an_empty_or_constant_group_is_found():
    counts = pd.DataFrame({"all": [10, 10], "negative": [10, 10]}, index=[5, 10])
    assert [(f.kind, "positive" in f.evidence) for f in signals.group_findings(counts, ["positive", "negative"])] \
        == [("empty_group", True), ("constant_group", False)]
    counts = pd.DataFrame({"all": [10, 10], "positive": [4, 5], "negative": [6, 5]}, index=[5, 10])
    assert not signals.group_findings(counts, ["positive", "negative"])


def test_the_ranking_puts_what_came_first_before_its_consequences():
    origin = Origin(40, "forward", "logits/MatMul", "MatMul", "logits/MatMul:0", "logits", None, 0, 5, 8)
    diverging = Finding("diverging", "error", "every layer moved", step=20)
    exploding = Finding("exploding_gradient", "error", "fc2 grew", layer="fc2", step=35)
    dead = Finding("dead_relu", "warning", "fc2 dead", layer="fc2", step=35)
    assert [f.kind for f in rank([dead, exploding, diverging], origin)] == \
        ["diverging", "exploding_gradient", "nonfinite_after", "dead_relu"]
    # nothing went wrong before the NaN: its origin is the culprit
    assert rank([dead], origin)[0].kind == "nonfinite"


def test_info_and_the_alerts_name_the_culprit(tmp_path):
    run = inspector.open_run(write(tmp_path / "r", {20: downstream("fc2/Log:0")}))
    text = cli.summary(run)
    assert "anomalies  first NaN/Inf: fc2/Log (Log, layer fc2) made the first non-finite values" in text
    assert "diagnosis  Most likely culprit (nonfinite: layer fc2, op fc2/Log, step 20)" in text
    first = run_alerts(run)[0]
    assert first.kind == "nonfinite" and "fc2/Log" in first.message and first.tensor == "fc2/Log:0"
    assert diagnose(run)[0].op == "fc2/Log" and diagnosis_text(diagnose(run)).startswith("Most likely culprit")


def test_a_healthy_run_has_no_finding(tmp_path):
    run = inspector.open_run(write(tmp_path / "r", {}))
    assert diagnose(run) == [] and diagnosis_text([]) == ""
    assert "diagnosis" not in cli.summary(run)


@pytest.mark.parametrize("frozen", [True, False])
def test_info_counts_only_variables_that_changed_as_updated(tmp_path, frozen):
    lay = StatsLayout(("w", "w", "w"), ("forward", "gradient", "update"), ("all",) * 3)
    cat = [{"name": "w", "op": "w", "op_type": "VarHandleOp", "dtype": "float32", "shape": [4, 4], "scope": "fc",
            "has_gradient": True, "batched": False, "icnn_layer": None, "icnn_role": None, "kind": "variable",
            "variable": "w", "has_update": True}]
    w = RunWriter(tmp_path / "r", manifest={"tensors": cat, "loss": None}, stats_layout=lay)
    for s in (1, 2, 3):
        values = np.zeros((3, len(STAT_COLUMNS)))
        values[:, COL["count"]], values[:, COL["l2"]] = 16, [1.0, 0.5, 0.0 if frozen else 0.001]
        w.add_stats(s, values, empty_rows(3))
    w.close()
    text = cli.summary(inspector.open_run(tmp_path / "r"))
    assert ("(0 with updates, 1 never changed: w)" if frozen else "(1 with updates)") in text


def test_a_view_has_its_own_origin(tmp_path):
    """The origin is remembered per (mode, worker) as asked, None meaning the view's defaults: a
    view with other defaults must not answer from its parent's memory."""
    path = write(tmp_path / "r", {20: downstream("fc2/Log:0")})
    write(path, {10: downstream("fc1/Relu:0")}, mode="eval")
    run = inspector.open_run(path)
    assert run.first_nonfinite()["op"] == "fc2/Log"
    assert run.view(mode="eval").first_nonfinite()["op"] == "fc1/Relu"
    assert run.first_nonfinite()["op"] == "fc2/Log"
