"""The viewer's chart building blocks without a page: the heatmap raster
(viewer.charts.raster), its rows in network order (viewer.layers) and the line charts
(viewer.charts.lines)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("altair")  # first: the imports below (noqa: E402) need the viewer's packages

from inspector.graph.graphdef import Node, OpGraph# noqa: E402
from viewer import layers  # noqa: E402
from viewer.charts import lines, raster  # noqa: E402
from viewer.charts.raster import FINITE, MISSING, NAN_RGBA, NONFINITE, NONPOSITIVE, ZERO_RGBA  # noqa: E402


def ones(shape) -> np.ndarray:
    return np.ones(shape, bool)


# ---- raster --------------------------------------------------------------------------------

def test_raster_colours_nan_and_zero_and_leaves_missing_steps_blank():
    """Statistics at steps 0-2 and 5-6: the axis runs 0..6 with a gap at 3-4; a NaN cell is red,
    a zero under a log scale grey, the rest viridis."""
    steps = np.array([0, 1, 2, 5, 6])
    m = np.array([[1.0, np.nan, 2.0, 4.0, 8.0], [0.0, 1.0, 1.0, 1.0, np.inf]])
    r = raster.raster(m, ones(m.shape), steps, steps, 1, log=True)
    assert (r.x0, r.step_px, r.x1) == (0.0, 1.0, 7.0)
    assert r.first.tolist() == [0, 1, 2, -1, -1, 5, 6] == r.last.tolist()
    assert r.state.tolist() == [[FINITE, NONFINITE, FINITE, MISSING, MISSING, FINITE, FINITE],
                                [NONPOSITIVE, FINITE, FINITE, MISSING, MISSING, FINITE, NONFINITE]]
    assert (r.rgba[r.state == NONFINITE] == NAN_RGBA).all() and (r.rgba[r.state == NONPOSITIVE] == ZERO_RGBA).all()
    assert (r.rgba[r.state == MISSING][:, 3] == 0).all() and (r.rgba[r.state == FINITE][:, 3] == 255).all()
    assert r.domain[0].tolist() == [1.0, 8.0]                          # finite positive values only
    np.testing.assert_array_equal(r.values[0, [0, 2, 5, 6]], [1, 2, 4, 8])


def test_a_cell_without_statistics_is_blank_not_nan():
    m = np.array([[np.nan, 1.0]])
    r = raster.raster(m, np.array([[False, True]]), np.array([0, 1]), np.array([0, 1]), 1, log=False)
    assert r.state.tolist() == [[MISSING, FINITE]]


def test_columns_of_sparse_statistics_span_their_stride():
    """Statistics every 100 steps (bins of 2): each column spans its 100 steps, no gap between,
    so the axis is not striped; a step missing from the schedule leaves a gap."""
    steps = np.array([0, 100, 200, 400, 500])
    start, end = raster.column_extents(steps, steps, 2)
    assert start.tolist() == [0, 100, 200, 400, 500] and end.tolist() == [100, 200, 300, 500, 600]
    r = raster.raster(np.ones((1, 5)), ones((1, 5)), steps, steps, 2, log=False)
    assert r.step_px == 100 and (r.state[0] == MISSING).tolist() == [False, False, False, True, False, False]


def test_columns_beyond_the_pixels_are_aggregated():
    """2,000 statistics steps on at most 500 columns: each column the mean of its 4 steps and
    their first and last step; one NaN among them makes the column NaN (never averaged away)."""
    steps = np.arange(2000)
    m = np.tile(np.arange(2000, dtype=float), (2, 1))
    m[1, 1001] = np.nan
    r = raster.raster(m, ones(m.shape), steps, steps, 1, log=False, max_columns=500)
    assert r.values.shape == (2, 500) and r.step_px == 4
    assert r.first[:2].tolist() == [0, 4] and r.last[:2].tolist() == [3, 7]
    np.testing.assert_allclose(r.values[0], steps.reshape(500, 4).mean(axis=1))
    assert r.state[1].tolist().count(NONFINITE) == 1 and r.state[1, 250] == NONFINITE


def test_rows_beyond_the_height_are_aggregated_keeping_sick_rows_visible():
    """Six rows drawn as three: each cell the geometric mean of its rows on a log scale, NaN/Inf
    if one is, <= 0 (a dead tensor) if one is: a sick tensor is never hidden by its neighbour."""
    m = np.array([[1.0, 1.0], [4.0, 100.0], [np.nan, 1.0], [1.0, 1.0], [0.0, 2.0], [2.0, 2.0]])
    r = raster.raster(m, ones(m.shape), np.array([0, 1]), np.array([0, 1]), 1, log=True, max_rows=3)
    assert [list(g) for g in r.rows] == [[0, 1], [2, 3], [4, 5]]
    assert r.state.tolist() == [[FINITE, FINITE], [NONFINITE, FINITE], [NONPOSITIVE, FINITE]]
    np.testing.assert_allclose(r.values[0], [2.0, 10.0])
    np.testing.assert_allclose(r.values[2, 1], 2.0)


def test_rows_apart_or_on_their_own_scale_leave_the_shared_scale_alone():
    """The loss's gradient (1 at every step) kept apart: the shared scale spans the layers'
    gradients only (they are not all drawn in the lowest colours) and the loss is drawn at its
    top; a row on its own scale spans its own min to max."""
    m = np.array([[1e-3, 2e-3], [1e-2, 5e-3], [1.0, 1.0]])
    steps = np.array([0, 1])
    r = raster.raster(m, ones(m.shape), steps, steps, 1, log=True, apart=np.array([False, False, True]))
    np.testing.assert_allclose(r.domain, [[1e-3, 1e-2]] * 3)
    assert (r.rgba[1, 0] == r.rgba[2, 0]).all() and (r.rgba[2, 0] != r.rgba[0, 0]).any()   # the top colour
    assert r.values[2].tolist() == [1.0, 1.0]                          # its hover: the real value
    per_row = raster.raster(m, ones(m.shape), steps, steps, 1, log=False, own=np.ones(3, bool))
    np.testing.assert_allclose(per_row.domain, [[1e-3, 2e-3], [5e-3, 1e-2], [1.0, 1.0]])
    assert (per_row.rgba[0, 0] == per_row.rgba[1, 1]).all()           # each row's min: the same colour


# ---- layers and network order --------------------------------------------------------------

def catalog(rows: list[tuple]) -> pd.DataFrame:
    """(name, scope[, icnn_layer, icnn_role, kind]) rows as a run's catalog."""
    full = [(r + (None, None, "tensor"))[:5] for r in rows]
    cat = pd.DataFrame(full, columns=["name", "scope", "icnn_layer", "icnn_role", "kind"])
    return cat.assign(op=cat["name"].str.replace(r":\d+$", "", regex=True)).set_index("name", drop=False)


def test_unscoped_ops_are_layers_of_their_own():
    """A pooling op, the loss's ops and weight decay outside every scope: each its own row,
    never folded together into the loss's row; a read opened under L2Loss_1 belongs to it."""
    cat = catalog([("conv1/Relu:0", "conv1"), ("pool1:0", ""), ("L2Loss_1/ReadVariableOp:0", "L2Loss_1"),
                   ("L2Loss_1:0", ""), ("xent:0", ""), ("loss:0", "")])
    rows = layers.layer_rows(cat, list(cat.index))
    assert rows["layer"].tolist() == ["conv1", "pool1", "L2Loss_1", "L2Loss_1", "xent", "loss"]
    assert layers.shown_rows(rows)["label"].tolist() == ["conv1/Relu:0", "pool1:0", "L2Loss_1:0 (+1 ops of L2Loss_1)",
                                                        "xent:0", "loss:0"]


def icnn_graph() -> tuple[pd.DataFrame, OpGraph]:
    """conv3 -> icnn (its roles listed last, as the hook lists them) -> conv4 -> loss."""
    cat = catalog([("conv3/Conv2D:0", "conv3"), ("conv3/Relu:0", "conv3"), ("conv4/Conv2D:0", "conv4"),
                   ("conv4/Relu:0", "conv4"), ("loss:0", ""), ("icnn/helper/sub:0", "icnn/helper"),
                   ("icnn/pre_mask:0", "icnn", "icnn", "pre_mask"), ("icnn/post_mask:0", "icnn", "icnn", "post_mask"),
                   ("conv3/w", "conv3", None, None, "variable")])
    nodes = [Node("images", "Placeholder"), Node("conv3/w", "VarHandleOp"),
             Node("conv3/Conv2D", "Conv2D", ("images", "conv3/w")), Node("conv3/Relu", "Relu", ("conv3/Conv2D",)),
             Node("icnn/pre_mask", "Identity", ("conv3/Relu",)), Node("icnn/helper/sub", "Sub", ("icnn/pre_mask",)),
             Node("icnn/post_mask", "Identity", ("icnn/helper/sub",)),
             Node("conv4/Conv2D", "Conv2D", ("icnn/post_mask",)), Node("conv4/Relu", "Relu", ("conv4/Conv2D",)),
             Node("loss", "Mean", ("conv4/Relu",))]
    return cat, OpGraph(reversed(nodes))          # GraphDef order reversed: only the edges give the order


def test_rows_follow_the_network_not_the_catalog():
    cat, graph = icnn_graph()
    order = layers.network_order(graph)
    rows = layers.layer_rows(cat, list(cat.index), order)
    assert layers.shown_rows(rows)["tensor"].tolist() == ["conv3/Relu:0", "icnn/post_mask:0", "conv4/Relu:0",
                                                         "loss:0"]
    assert rows["tensor"].tolist() == ["conv3/Conv2D:0", "conv3/Relu:0", "conv3/w", "icnn/pre_mask:0",
                                       "icnn/helper/sub:0", "icnn/post_mask:0", "conv4/Conv2D:0", "conv4/Relu:0",
                                       "loss:0"]                       # a layer's variables after its ops
    assert layers.shown_rows(layers.layer_rows(cat, list(cat.index)))["tensor"].iloc[-1] == "icnn/post_mask:0"


def test_network_order_survives_a_loop_and_unknown_inputs():
    """A TF1 while loop's back edge (NextIteration) and an input the graph lacks: every op
    still gets a place, after its other inputs."""
    graph = OpGraph([Node("x", "Placeholder"), Node("merge", "Merge", ("x", "next")), Node("body", "Mul", ("merge",)),
                     Node("next", "NextIteration", ("body",)), Node("out", "Identity", ("body", "ghost:0"))])
    order = layers.network_order(graph)
    assert sorted(order) == sorted(graph.nodes) and order["x"] < order["merge"] < order["body"] < order["out"]


def test_a_keras_layer_groups_its_ops():
    cat = catalog([("model/dense/MatMul:0", "model/dense"), ("model/dense/BiasAdd:0", "model/dense")]).assign(
        keras_layer=["model/dense", "model/dense"])
    assert layers.layer_rows(cat, list(cat.index))["layer"].tolist() == ["model/dense", "model/dense"]


# ---- line charts ---------------------------------------------------------------------------

def test_series_colours_never_repeat():
    groups = lines.group_colors(["all", "positive", "negative", "cat", "dog"])
    assert groups[:3] == [lines.GROUPS["all"], lines.GROUPS["positive"], lines.GROUPS["negative"]]
    many = lines.distinct_colors([f"v{i}" for i in range(60)], {"v3": lines.PALETTE[0]})
    assert len(set(groups)) == 5 and len(set(c.lower() for c in many)) == 60 and many[3] == lines.PALETTE[0]
    with pytest.raises(ValueError, match="repeat"):
        lines.line_chart(pd.DataFrame({"a": [1.0], "b": [2.0]}), "y", colors=["#111111", "#111111"])


def test_lines_break_at_missing_steps_and_nan():
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0, np.nan, 5.0, 6.0, 7.0]}, index=[0, 10, 20, 30, 40, 70, 80])
    long = lines.long_frame(df, log=False, weight=0.0)
    assert long["segment"].tolist() == [0, 0, 0, 1, 2, 3, 3]      # NaN at 30; steps 50 and 60 missing
    spec = lines.line_chart(df, "y").to_dict()
    assert spec["layer"][0]["encoding"]["detail"]["field"] == "segment"


def test_pointer_picks_the_nearest_step_with_every_series_in_one_tooltip():
    df = pd.DataFrame({"all": [1.0, 2.0], "a.b[0]": [3.0, 4.0]}, index=[5, 6])
    spec = lines.line_chart(df, "mean", colors=lines.group_colors(df.columns)).to_dict()
    (param,) = spec["params"]
    assert param["select"]["nearest"] and param["select"]["on"] == "pointermove"
    assert param["select"]["fields"] == ["step"]
    rule = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "rule")
    assert [t["title"] for t in rule["encoding"]["tooltip"]] == ["step", "all", "a.b[0]"]   # names are no field paths
    wide = pd.DataFrame(spec["datasets"][rule["data"]["name"]])
    assert wide[["s0", "s1"]].to_numpy().tolist() == [[1.0, 3.0], [2.0, 4.0]]
    json.dumps(spec)


def test_smoothing_is_debiased_and_skips_nan():
    v = np.array([2.0, np.nan, 2.0, 4.0])
    s = lines.smooth(v, 0.9)
    assert s[0] == 2.0 and np.isnan(s[1]) and s[2] == pytest.approx(2.0) and 2.0 < s[3] < 4.0


def test_an_axis_has_one_number_notation():
    """d3's ``g`` writes 1e-6 as 0.000001 and 1e-7 as 1e-7: an axis spanning both mixed them."""
    from viewer.charts import bands

    def y_format(spec: dict) -> str:
        layer = next(la for la in spec["layer"] if "axis" in la["encoding"]["y"])
        return layer["encoding"]["y"]["axis"]["format"]
    tiny = pd.DataFrame({"a": [1e-7, 5e-7, 3e-6]}, index=[0, 1, 2])
    assert y_format(lines.line_chart(tiny, "L2").to_dict()).endswith("e")
    assert y_format(lines.line_chart(tiny * 1e7, "L2", log=True).to_dict()).endswith("e")
    assert not y_format(lines.line_chart(tiny * 1e6, "L2").to_dict()).endswith("e")   # 0.1..3: decimals
    frame = pd.DataFrame({"step": [1, 2], "group": ["all", "all"],
                          **{f"p{q}": [q * 1e-8, q * 2e-8] for q in (0, 7, 16, 50, 84, 93, 100)}})
    assert y_format(bands.bands_chart(frame, "t").to_dict()).endswith("e")


def test_a_highlighted_series_is_bold_and_the_others_faint():
    df = pd.DataFrame({f"v{i}": [1.0, 2.0] for i in range(11)}, index=[0, 1])
    plain = lines.line_chart(df, "r").to_dict()
    assert all("opacity" not in la["encoding"] for la in plain["layer"] if la["mark"]["type"] == "line")
    spec = lines.line_chart(df, "r", highlight="v3").to_dict()
    line = next(la for la in spec["layer"] if la["mark"]["type"] == "line")
    opacity, width = line["encoding"]["opacity"], line["encoding"]["strokeWidth"]
    assert opacity["condition"]["test"] == width["condition"]["test"] == 'datum.series === "v3"'
    assert opacity["condition"]["value"] == 1.0 and opacity["value"] < 0.3 < 2 < width["condition"]["value"]
