"""The op graph page and its TensorFlow-free GraphDef reader, and op source locations shown in
the viewer (tensor browser, Summary's NaN alert), driven with AppTest on synthetic runs."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
from test_app import captions, ok, start, unescape  # noqa: E402

import inspector  # noqa: E402
from inspector.errors import DamagedFileError  # noqa: E402
from inspector.format import graph_name, manifest_name  # noqa: E402
from inspector.graph.scopes import collapse, search  # noqa: E402
from inspector.graph.graphdef import Node, OpGraph, encode_graph_def, input_op, parse_graph_def  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402
from viewer.app_pages import graph as page  # noqa: E402
from viewer.charts import graph_dot, graph_model  # noqa: E402
from viewer.charts.graph_colours import STATES, Scale, legend_items  # noqa: E402

NAN_AT = 25


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "nan", steps=30, tensors=20, dump_every=10, nonfinite_at=NAN_AT)
    return root


# ---- the reader and the neighbourhood ----------------------------------------------------------
#   a -> b -> c -> d -> e        f -> c (second producer of c), c -> g, ^h -> c (control only)
HAND = [Node("a", "Placeholder"), Node("b", "Relu", ("a",)), Node("f", "Const"), Node("h", "NoOp"),
        Node("c", "Add", ("b:0", "f", "^h")), Node("d", "Relu", ("c",)), Node("e", "Mean", ("d:0",)),
        Node("g", "Identity", ("c",)), Node("gradients/c_grad", "ReluGrad", ("c",))]


def test_neighbourhood_of_a_hand_built_graph():
    g = OpGraph(parse_graph_def(encode_graph_def(HAND)))
    one = g.neighbourhood("c", hops=1)
    assert one.nodes == {"c": 0, "b": -1, "f": -1, "d": 1, "g": 1, "gradients/c_grad": 1}   # h: control, not followed
    two = g.neighbourhood("c", hops=2)
    assert set(two.nodes) == {"c", "b", "f", "a", "d", "g", "e", "gradients/c_grad"}
    assert two.nodes["a"] == -2 and two.nodes["e"] == 2 and not two.capped
    assert set(two.edges) == {("a", "b", False), ("b", "c", False), ("f", "c", False), ("c", "d", False),
                              ("d", "e", False), ("c", "g", False), ("c", "gradients/c_grad", False)}
    hidden = g.neighbourhood("c", hops=2, keep=lambda n: not page.HIDDEN.search(n))
    assert "gradients/c_grad" not in hidden.nodes and len(hidden.nodes) == 7
    capped = g.neighbourhood("c", hops=2, max_nodes=4)
    assert capped.capped and capped.total == 8 and set(capped.nodes) == {"c", "b", "d", "f"}  # nearest, then by name
    with_h = OpGraph(HAND + [Node("x", "Relu", ("h",))]).neighbourhood("x", hops=3)
    assert set(with_h.nodes) == {"x", "h"}     # h's only consumers through data edges: x
    with pytest.raises(KeyError):
        g.neighbourhood("nope")
    assert input_op("^init") == ("init", True) and input_op("split:1") == ("split", False)


def test_graph_def_reader_matches_tensorflow():
    tf = pytest.importorskip("tensorflow")
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        with tf.device("/cpu:0"):
            w = tf.compat.v1.get_variable("w", [3, 2])
        y = tf.nn.relu(tf.matmul(x, w), name="y")
        with tf.control_dependencies([y.op]):
            tf.identity(tf.split(y, 2, axis=1)[1], name="z")
    raw = g.as_graph_def(add_shapes=True).SerializeToString()
    ours = parse_graph_def(raw)
    theirs = tf.compat.v1.GraphDef.FromString(raw).node
    assert [(n.name, n.op, n.inputs, n.device) for n in ours] == \
        [(n.name, n.op, tuple(n.input), n.device) for n in theirs]
    assert any(i.startswith("^") for n in ours for i in n.inputs) and any(n.device for n in ours)
    back = tf.compat.v1.GraphDef.FromString(encode_graph_def(ours))
    assert [(n.name, n.op, tuple(n.input)) for n in back.node] == [(n.name, n.op, n.inputs) for n in ours]


@pytest.mark.parametrize("bad", [b"\x0a\xff", b"\x0a\x05\x0a\x03ab", b"\x0b\x00", b"\x0a\x02\x0a\x00",
                                 b"\x0a\x04\x0a\x02\xff\xfe", b"\x80" * 11])
def test_damaged_graph_bytes_are_refused(bad):
    with pytest.raises(DamagedFileError, match="damaged graph"):
        parse_graph_def(bad)


def test_dot_escapes_names():
    evil = 'a"];evil[label="x\\N'
    g = OpGraph([Node(evil, "Relu"), Node("b", "Relu", (evil,))])
    text = page.dot(g.neighbourhood("b", 1), g, {}, Scale.robust([], "rms"))
    for line in text.splitlines():
        unescaped = re.sub(r'\\.', "", line)     # what is left once escapes are dropped
        assert unescaped.count('"') % 2 == 0, line
    assert 'a\\"];evil[label=\\"x\\\\N' in text


# ---- the page ---------------------------------------------------------------------------------
def fill_of(text: str, op: str) -> str:
    """The fillcolor of the DOT node labelled ``op``."""
    m = re.search(r'\[label="' + re.escape(page.escape(op)) + r'\\n[^"]*", fillcolor="(#[0-9a-f]{6})"', text)
    assert m, (op, text)
    return m.group(1)


def chart(at) -> str:
    charts = at.get("graphviz_chart")
    assert len(charts) == 1
    return charts[0].proto.spec


def test_graph_page_colours_nan_and_dead_ops(runs):
    run = inspector.open_run(runs / "nan")
    first = run.first_nonfinite()
    nan_tensor, nan_step = first["tensor"], first["step"]
    at = ok(start(runs / "nan", "Op graph"))
    assert at.selectbox(key="gr_tensor").value == nan_tensor          # opens on the first NaN's tensor
    assert at.select_slider(key="gr_step").value == nan_step == NAN_AT   # ... and its step, not the last
    assert at.radio(key="gr_kind").value == first["kind"]
    text = chart(at)
    shown = re.findall(r'\[label="([^"\\]+)\\n', text)
    # oracle: the statistics at the first NaN's step, group all, forward
    ops = dict(zip(run.tensors["op"], run.tensors["name"]))
    stats = run.query_stats([ops[o] for o in shown if o in ops], steps=(NAN_AT, NAN_AT), kinds=["forward"],
                            groups=["all"], columns=["nan", "inf", "zero_fraction"]).set_index("tensor")
    assert len(stats) >= 4
    for op in shown:
        t = ops.get(op)
        if t is None:
            assert fill_of(text, op) == page.UNCAPTURED and f"{op}\\n" in text, op
        elif t not in stats.index:
            assert fill_of(text, op) == page.NO_STATS, op
        elif stats.loc[t, "nan"] + stats.loc[t, "inf"] > 0:
            assert fill_of(text, op) == page.NONFINITE, op
        else:
            assert fill_of(text, op) not in {f for f, _ in STATES.values()}, op
    assert fill_of(text, nan_tensor.split(":")[0]) == page.NONFINITE
    assert {page.NONFINITE, page.PALETTE[0], page.PALETTE[-1]} <= set(re.findall(r"#[0-9a-f]{6}", text))
    # before the NaN step: nothing red in the graph (the legend keeps its red)
    at.select_slider(key="gr_step").set_value(NAN_AT - 5).run()
    body = chart(ok(at)).split("subgraph cluster_legend")[0]
    assert page.NONFINITE not in body
    # the dead ReLU (zero fraction 1): grey
    dead = list(run.query_stats(steps=(29, 29), kinds=["forward"], groups=["all"], columns=["zero_fraction"])
                .query("zero_fraction == 1.0")["tensor"].astype(str))
    assert dead
    at.selectbox(key="gr_tensor").select(dead[0]).run()
    assert fill_of(chart(ok(at)), dead[0].split(":")[0]) == page.DEAD


def test_graph_slider_opens_at_the_last_step_without_a_nan(tmp_path):
    path = make_synthetic_run(tmp_path / "clean", steps=12, tensors=20, dump_every=None)
    at = ok(start(path, "Op graph"))
    assert at.select_slider(key="gr_step").value == 11 and at.radio(key="gr_kind").value == "forward"
    assert page.default_step([0, 10, 20], {"step": 15}) == 2       # between statistics steps: the next one
    assert page.default_step([0, 10, 20], {"step": 25}) == 2       # after the last: the last


def test_default_colour_is_rms_and_does_not_grow_with_size(runs):
    """RMS from the recorded l2 and count (an independent formula: l2 / sqrt(count)), not l2, which
    grows with the tensor's size."""
    run = inspector.open_run(runs / "nan")
    at = ok(start(runs / "nan", "Op graph", query={"gr_tensor": "icnn/pre_mask:0", "gr_step": "10", "gr_hops": "1"}))
    assert at.selectbox(key="gr_stat").value == "rms"
    text = chart(at)
    shown = dict(re.findall(r'\[label="([^"\\]+)\\n[^"\\]+\\nrms = ([^"\\ ]+)', text))
    ops = dict(zip(run.tensors["op"], run.tensors["name"]))
    df = run.query_stats([ops[o] for o in shown], steps=(10, 10), kinds=["forward"], groups=["all"],
                         columns=["l2", "count"]).set_index("tensor")
    assert len(shown) >= 3 and df["count"].nunique() >= 2               # tensors of different sizes
    for op, value in shown.items():
        t = ops[op]
        assert float(value) == pytest.approx(df.loc[t, "l2"] / np.sqrt(df.loc[t, "count"]), rel=1e-3), op
    assert "log scale from percentile 2 to 98" in text                 # the legend says what the scale is


def test_robust_scale_keeps_near_values_together_and_clips_outliers():
    close = Scale.robust([147.4, 150.5], "rms")               # min-max would draw these at the two ends
    assert abs(close.position(147.4) - close.position(150.5)) < 0.02
    assert close.log and close.hi / close.lo == pytest.approx(10)
    values = [1.0] * 50 + [2.0] * 50 + [1e6]                  # one outlier
    s = Scale.robust(values, "rms")
    assert s.position(1e6) == 1.0 and s.hi < 1e3              # clipped, not stretching the scale
    assert s.fill(1.0) != s.fill(2.0)
    items = [t for t, _ in legend_items(s)]
    assert items[0].startswith("≤ rms") and items[4].startswith("≥ rms")
    signed = Scale.robust([-0.5, 0.0, 0.5], "mean")
    assert not signed.log and signed.fill(-0.5) == page.PALETTE[0] and signed.fill(0.5) == page.PALETTE[-1]
    assert Scale.robust([0.2, 0.3], "zero_fraction").position(0.5) == 0.5   # zero_fraction spans [0, 1]


def test_labels_tell_forward_only_from_not_captured(runs):
    """In the gradient view an op captured without a gradient is 'forward only', not 'not captured';
    in the forward view its value says so."""
    run = inspector.open_run(runs / "nan")
    cat = run.tensors
    fwd_only = cat[~cat["has_gradient"].astype(bool)]["name"].tolist()
    assert "icnn/mask:0" in fwd_only
    q = {"gr_tensor": "icnn/mask:0", "gr_hops": "1", "gr_step": "10"}
    text = chart(ok(start(runs / "nan", "Op graph", query={**q, "gr_kind": "gradient"})))
    assert fill_of(text, "icnn/mask") == page.FORWARD_ONLY
    assert 'icnn/mask\\nMaximum\\ncaptured, forward only (no gradient)"' in text
    assert fill_of(text, "icnn/post_mask") not in {f for f, _ in STATES.values()}     # captured with its gradient
    text = chart(ok(start(runs / "nan", "Op graph", query={**q, "gr_kind": "forward"})))
    assert re.search(r'icnn/mask\\nMaximum\\nrms = [^"]+ \(forward only\)"', text)
    assert "(forward only)" not in text.split("icnn/post_mask\\n")[1].split("]")[0]
    # an op of the graph that the hook did not capture: "not captured"
    text = chart(ok(start(runs / "nan", "Op graph", query={"gr_tensor": "conv2/BiasAdd:0", "gr_hops": "1"})))
    assert 'conv2/b/read\\nReadVariableOp\\nnot captured"' in text and fill_of(text, "conv2/b/read") == page.UNCAPTURED


def test_graph_page_hops_cap_backward_and_open(runs):
    at = ok(start(runs / "nan", "Op graph", query={"gr_tensor": "conv2/Relu:0", "gr_hops": "1"}))
    n1 = len(re.findall(r"^  n\d+ \[", chart(at), re.M))
    assert n1 == 3                                                    # BiasAdd -> Relu -> conv3/Conv2D
    fills = {op: fill_of(chart(at), op) for op in ("conv2/BiasAdd", "conv3/Conv2D")}
    at.number_input(key="gr_hops").set_value(3).run()
    n3 = len(re.findall(r"^  n\d+ \[", chart(ok(at)), re.M))
    assert n3 > n1
    assert {op: fill_of(chart(at), op) for op in fills} == fills      # the scale is the model's, not the view's
    assert "gradients/" not in chart(at)
    at.toggle(key="gr_all").set_value(True).run()
    assert "gradients/conv2/Relu_grad/ReluGrad" in chart(ok(at))
    at.number_input(key="gr_max").set_value(5).run()
    warning = unescape(" ".join(w.value for w in ok(at).warning))
    assert "showing the 5 closest" in warning and len(re.findall(r"^  n\d+ \[", chart(at), re.M)) == 5
    at.selectbox(key="gr_open").select("conv2/BiasAdd:0").run()
    at.button(key="gr_go").click().run()
    assert ok(at).header[0].value == "Tensor browser"
    assert at.selectbox(key="tb_tensor").value == "conv2/BiasAdd:0"


def test_graph_page_without_or_with_a_damaged_graph(runs, tmp_path):
    nograph = shutil.copytree(runs / "nan", tmp_path / "nograph")
    (nograph / graph_name("chief", 1)).unlink()
    at = ok(start(nograph, "Op graph"))
    assert "No op graph to show" in unescape(" ".join(i.value for i in at.info))
    damaged = shutil.copytree(runs / "nan", tmp_path / "damaged")
    (damaged / graph_name("chief", 1)).write_bytes(b"\x0a\xff\xff")
    at = ok(start(damaged, "Op graph"))
    assert "not a GraphDef" in unescape(" ".join(i.value for i in at.info))


def test_graph_file_over_the_limit_is_refused_before_reading(runs, tmp_path, monkeypatch):
    path = shutil.copytree(runs / "nan", tmp_path / "big")
    size = (path / graph_name("chief", 1)).stat().st_size
    assert inspector.open_run(path).graph_def_bytes() == (path / graph_name("chief", 1)).read_bytes()
    monkeypatch.setattr(inspector.graph.graphdef, "MAX_GRAPH_BYTES", size - 1)
    with pytest.raises(DamagedFileError) as e:
        inspector.open_run(path).graph_def_bytes()
    assert graph_name("chief", 1) in str(e.value) and f"{size:,} bytes" in str(e.value) and f"{size - 1:,}" in str(e.value)
    at = ok(start(path, "Op graph"))
    info = unescape(" ".join(i.value for i in at.info))
    assert "No op graph to show" in info and f"{size:,} bytes, more than the {size - 1:,}" in info
    assert not at.get("graphviz_chart")


def test_graph_session_picker_defaults_to_the_newest(tmp_path):
    """A resumed run: each session wrote its own graph; the page opens on the newest and the
    picker shows the other (here session 1's graph holds one more op)."""
    path = make_synthetic_run(tmp_path / "resumed", steps=10, tensors=20, dump_every=5)
    make_synthetic_run(path, steps=10, tensors=20, dump_every=5, seed=1)
    first = path / graph_name("chief", 1)
    first.write_bytes(encode_graph_def(parse_graph_def(first.read_bytes())
                                       + [Node("only_in_session_1", "Identity", ("conv2/Relu",))]))
    consumers = {s: {n.name for n in parse_graph_def((path / graph_name("chief", s)).read_bytes())
                     if "conv2/Relu" in n.inputs} for s in (1, 2)}                        # the oracle
    assert consumers[1] - consumers[2] == {"only_in_session_1"}
    at = ok(start(path, "Op graph", query={"gr_tensor": "conv2/Relu:0", "gr_hops": "1"}))
    assert at.selectbox(key="gr_tensor").value == "conv2/Relu:0"
    picker = at.selectbox(key="gr_session")
    assert picker.options == ["2 (train)", "1 (train)"] and picker.value == 2
    assert "only_in_session_1" not in chart(at)
    picker.select(1).run()
    assert "only_in_session_1" in chart(ok(at))
    single = ok(start(make_synthetic_run(tmp_path / "once", steps=10, tensors=20, dump_every=5), "Op graph"))
    assert not [w for w in single.selectbox if w.key == "gr_session"]      # one session: no picker


# ---- op source locations in the viewer -------------------------------------------------------
def with_source(src: Path, dst: Path, tensor: str) -> Path:
    path = shutil.copytree(src, dst)
    m = path / manifest_name("chief", 1)
    man = json.loads(m.read_text())
    for t in man["tensors"]:
        if t["name"] == tensor:
            t.update(source_file="examples/models.py", source_line=57, source_function="conv_block",
                     source_stack=[["examples/train.py", 12, "main"], ["examples/models.py", 57, "conv_block"]])
    m.write_text(json.dumps(man))
    return path


def test_source_location_in_summary_alert_and_tensor_browser(runs, tmp_path):
    nan_tensor = inspector.open_run(runs / "nan").first_nonfinite()["tensor"]
    path = with_source(runs / "nan", tmp_path / "src", nan_tensor)
    at = ok(start(path))
    # the Summary's run caption ends with the first NaN/Inf
    caption = "First NaN/Inf: " + captions(at).split("First NaN/Inf: ", 1)[1].split("\n")[0]
    assert f"made the first non-finite values: {nan_tensor}" in caption and f"at step {NAN_AT}" in caption
    assert caption.endswith("created at examples/models.py:57 in conv_block.")
    errors = unescape(" ".join(e.value for e in at.error))
    assert "created at examples/models.py:57 in conv_block" in errors
    at = ok(start(path, "Tensor browser", query={"tb_tensor": nan_tensor}))
    md = unescape(" ".join(m.value for m in at.markdown))
    assert "Created at **examples/models.py:57 in conv_block**" in md
    assert "examples/train.py:12 in main\nexamples/models.py:57 in conv_block" in [t.value for t in at.text]
    at = ok(start(path, "Tensor browser", query={"tb_tensor": "conv1/Relu:0"}))     # none recorded
    assert "Created at: unknown" in captions(at)


def test_dot_colours_follow_the_statistic():
    """Fills from the values on the scale (dead and NaN ops keep their own colours); l2 over three
    decades is log-spaced: the geometric middle gets the middle colour."""
    nodes = [Node("a", "Relu"), Node("b", "Relu", ("a",)), Node("c", "Relu", ("b",)), Node("d", "Relu", ("c",)),
             Node("e", "Relu", ("d",)), Node("f", "Relu", ("e",))]
    g = OpGraph(nodes)
    looks = {"a": page.Look("a:0", 1.0, "value"), "b": page.Look("b:0", 1000.0, "value"),
             "c": page.Look("c:0", 10 ** 1.5, "value"), "d": page.Look("d:0", 0.0, "dead"),
             "e": page.Look("e:0", None, "nonfinite")}
    scale = Scale.robust([1.0] * 10 + [1000.0] * 10 + [10 ** 1.5], "l2")
    text = page.dot(g.neighbourhood("a", 5), g, looks, scale, "l2")
    assert fill_of(text, "a") == page.PALETTE[0] and fill_of(text, "b") == page.PALETTE[-1]
    assert fill_of(text, "c") == page.palette(0.5) == page.PALETTE[2]
    assert fill_of(text, "d") == page.DEAD and fill_of(text, "e") == page.NONFINITE
    assert fill_of(text, "f") == page.UNCAPTURED
    assert "≤ l2 1<" in text and "≥ l2 1e+03<" in text and "log scale" in text
    linear = Scale.robust([1.0] * 10 + [1000.0] * 10, "mean")        # mean: a linear scale
    assert fill_of(page.dot(g.neighbourhood("a", 5), g, looks, linear, "mean"), "c") == \
        page.palette((10 ** 1.5 - 1) / 999)
    empty = page.dot(g.neighbourhood("a", 5), g, {}, Scale.robust([], "l2"), "l2")
    assert "≤ l2" not in empty and "not captured" in empty            # no values: no value legend


# ---- the whole-model view ---------------------------------------------------------------------
#   scopes: m/ holds m/a, m/w (an op and a scope: m/w/read), m/sub/ holds m/sub/x, m/sub/y; n/z outside
SCOPED = [Node("in", "Placeholder"), Node("m/w", "VarHandleOp"), Node("m/w/read", "ReadVariableOp", ("m/w",)),
          Node("m/a", "MatMul", ("in", "m/w/read")), Node("m/sub/x", "Relu", ("m/a",)),
          Node("m/sub/y", "Relu", ("m/a", "^in")), Node("n/z", "Add", ("m/sub/x", "m/sub/y"))]


def test_scopes_collapse_into_boxes_with_counted_edges():
    g = OpGraph(SCOPED)
    top = collapse(g)
    assert list(top.units) == [("op", "in"), ("scope", "m"), ("scope", "n")]
    assert top.units[("scope", "m")].ops == ["m/w", "m/w/read", "m/a", "m/sub/x", "m/sub/y"]
    assert top.edges == {(("op", "in"), ("scope", "m")): 1, (("scope", "m"), ("scope", "n")): 2}   # control: left out
    one = collapse(g, {"m"})
    assert set(one.units) == {("op", "in"), ("scope", "m/w"), ("op", "m/a"), ("scope", "m/sub"), ("scope", "n")}
    assert one.units[("scope", "m/w")].ops == ["m/w", "m/w/read"] and one.units[("op", "m/a")].cluster == "m"
    assert one.edges[(("op", "m/a"), ("scope", "m/sub"))] == 2 and one.clusters == ["m"]
    deep = collapse(g, {"m", "m/w", "m/sub"})
    assert deep.units[("op", "m/w")].cluster == "m/w"                  # the op that is its own scope, inside it
    assert deep.where["m/sub/y"] == ("op", "m/sub/y") and deep.clusters == ["m", "m/sub", "m/w"]
    assert collapse(g, {"m/sub"}).clusters == []                       # inside a closed scope: not drawn open
    chain = OpGraph([Node("in", "Placeholder")] + [Node(f"s{i}/op", "Relu", (f"s{i - 1}/op" if i > 1 else "in",))
                                                    for i in range(1, 7)] + [Node("s/op", "Relu", ("s6/op",))])
    series = collapse(chain)
    assert list(series.units) == [("op", "in"), ("series", "s[1-6]"), ("scope", "s")]   # "s" has no number
    assert series.units[("series", "s[1-6]")].members == 6 and series.where["s4/op"] == ("series", "s[1-6]")
    assert series.edges == {(("op", "in"), ("series", "s[1-6]")): 1, (("series", "s[1-6]"), ("scope", "s")): 1}
    one_open = collapse(chain, {"s3"})
    assert one_open.units[("series", "s[1-6]")].members == 5 and ("op", "s3/op") in one_open.units
    assert len(collapse(chain, {"s3", "s4"}).units) == len(collapse(chain, series=None).units) == 8   # 4 < 5 left
    capped = collapse(g, {"m", "m/w", "m/sub"}, max_units=6)
    assert len(capped.units) <= 6 and capped.closed == ["m/w"]         # the deepest closed first (ties: by name)
    assert search([n.name for n in SCOPED], "SUB/") == ["m/sub/x", "m/sub/y"]


def test_no_box_or_scope_is_drawn_rounded():
    """Graphviz's rounded style costs the browser ~0.2 s of main-thread CPU on a six-op graph
    (bench/README.md, Op graph): neither view asks for it."""
    chain = OpGraph([Node("in", "Placeholder")] + [Node(f"s{i}/op", "Relu", (f"s{i - 1}/op" if i > 1 else "in",))
                                                    for i in range(1, 7)] + [Node("m/a", "Relu", ("s6/op",))])
    scale = Scale.robust([], "rms")
    near = page.dot(chain.neighbourhood("s3/op", 2), chain, {}, scale)
    whole = graph_dot.model_dot(collapse(chain, {"m"}), chain, {}, scale, "rms", set(), None)
    assert "style=filled" in near and '"cluster_m"' in whole and '"filled,dashed"' in whole   # a series' box
    for text in (near, whole):
        assert "rounded" not in text, text


def test_whole_model_view_search_and_nan_scope(runs):
    run = inspector.open_run(runs / "nan")
    nan_op = run.first_nonfinite()["tensor"].split(":")[0]
    at = ok(start(runs / "nan", "Op graph", query={"gr_view": "Whole model", "gr_step": "29"}))
    text = chart(at)
    graph = OpGraph(parse_graph_def(run.graph_def_bytes()))
    kept = [n for n in graph.nodes if not page.HIDDEN.search(n)]
    assert f"{len(kept)} ops in" in captions(at)
    scope = nan_op.split("/")[0]
    assert f'subgraph "cluster_{scope}"' in text                        # the centre's scope is open
    # a closed scope holding a NaN op after the centre (at step 29 the NaN has spread): red
    bad = run.query_stats(steps=(29, 29), kinds=["forward"], groups=["all"], columns=["nan"])
    later = sorted({str(t).split("/")[0] for t in bad[bad["nan"] > 0]["tensor"]} - {scope})
    assert later
    m = re.search(r'\[label="' + re.escape(later[0]) + r'/ \((\d+) ops\)\\n[^"]*NaN/Inf", fillcolor="(#[0-9a-f]{6})"',
                  text)
    assert m and m.group(2) == page.NONFINITE
    at.text_input(key="gr_find").set_value("biasadd").run()
    matches = at.selectbox(key="gr_match")
    want = sorted((n for n in kept if "biasadd" in n.lower()), key=lambda n: (len(n), n))
    assert matches.options == want and matches.value == want[0]
    text = chart(ok(at))
    outlined = re.findall(r'\[label="BiasAdd\\nBiasAdd\\n[^"]*"[^]]*penwidth=3, color="(#[0-9a-f]{6})"', text)
    assert sorted(outlined) == sorted([graph_dot.CENTRE] + [graph_dot.MATCH] * (len(want) - 1))  # each match
    for op in want:                                                     # ... in its opened scope
        assert f'subgraph "cluster_{op.split("/")[0]}"' in text
    at.radio(key="gr_view").set_value("Neighbourhood").run()
    assert re.search(r'\[label="' + re.escape(want[0]) + r'\\n[^"]*"[^]]*penwidth=3', chart(ok(at)))  # the centre
    at.text_input(key="gr_find").set_value("no such op").run()
    assert any("No op outside the backward pass holds no such op" in unescape(i.value) for i in ok(at).info)


def test_whole_model_view_of_a_1000_op_model(tmp_path):
    """Every kept op lies in exactly one box; the top level of a 1,000-tensor model stays under the
    box cap, and opening scopes past it closes the deepest again (with a warning)."""
    path = make_synthetic_run(tmp_path / "big", steps=3, tensors=1000, dump_every=None)
    run = inspector.open_run(path)
    graph = OpGraph(parse_graph_def(run.graph_def_bytes()))
    kept = [n for n in graph.nodes if not page.HIDDEN.search(n)]
    assert len(kept) > 2000
    at = ok(start(path, "Op graph", query={"gr_view": "Whole model"}))
    text = chart(at)
    boxes = re.findall(r"^  u\d+ \[", text, re.M)
    assert len(boxes) <= graph_model.MAX_UNITS and f"{len(kept)} ops in {len(boxes)} boxes" in captions(at)
    counts = [int(n) for n in re.findall(r'(?:/ \(|series of \d+; )(\d+) ops?\)', text)]
    assert sum(counts) + (len(boxes) - len(counts)) == len(kept)        # each op in one box
    assert "conv[2-330] (series of 329; " in text                      # conv1 holds the centre: open
    scopes = sorted({n.split("/")[0] for n in kept if "/" in n})[:120]
    at.multiselect(key="gr_open_scopes").set_value(scopes).run()
    assert any("deepest were left closed" in w.value for w in ok(at).warning)
    assert len(re.findall(r"^  u\d+ \[", chart(at), re.M)) <= graph_model.MAX_UNITS


def test_a_searched_op_that_was_not_captured_says_why(tmp_path):
    """The Op graph's search finds every op of the graph; one the hook left out is drawn
    without a value and the page says why: excluded by which rule (the run's accounting)."""
    from inspector.testing import make_synthetic_run
    make_synthetic_run(tmp_path / "exp1", steps=6, tensors=12, dump_every=None)
    run = inspector.open_run(tmp_path / "exp1")
    excluded = run.uncaptured("gradients/")
    assert len(excluded) and (excluded["status"] == "excluded").all()
    at = ok(start(tmp_path, "Op graph", query={"run": "exp1"}, gr_find="gradients/", gr_all=True))
    op = str(at.selectbox(key="gr_match").value)
    assert f"{op}: excluded: excluded by the default rule 'backward'" in captions(at)
    shown = pd.concat([d.value for d in at.dataframe])
    assert op in set(shown["name"]) and set(shown["status"]) == {"excluded"}
