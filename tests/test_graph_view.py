"""The op graph page and its TensorFlow-free GraphDef reader, and op source locations shown in
the viewer (tensor browser, Summary's NaN alert), driven with AppTest on synthetic runs."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from test_app import captions, ok, start, unescape  # noqa: E402

import inspector  # noqa: E402
from inspector.errors import DamagedFileError  # noqa: E402
from inspector.format import graph_name, manifest_name  # noqa: E402
from inspector.graphdef import Node, OpGraph, encode_graph_def, input_op, parse_graph_def  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402
from viewer import graph as page  # noqa: E402

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
    text = page.dot(g.neighbourhood("b", 1), g, {})
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
    nan_tensor = run.first_nonfinite()["tensor"]
    at = ok(start(runs / "nan", "Op graph"))
    assert at.selectbox(key="gr_tensor").value == nan_tensor          # opens on the first NaN's tensor
    assert at.select_slider(key="gr_step").value == 29
    text = chart(at)
    shown = re.findall(r'\[label="([^"\\]+)\\n', text)
    # oracle: the statistics at step 29, group all, forward
    ops = dict(zip(run.tensors["op"], run.tensors["name"]))
    stats = run.query_stats([ops[o] for o in shown if o in ops], steps=(29, 29), kinds=["forward"], groups=["all"],
                            columns=["nan", "inf", "zero_fraction"]).set_index("tensor")
    assert len(stats) >= 4
    for op in shown:
        t = ops.get(op)
        if t is None or t not in stats.index:
            assert fill_of(text, op) == page.UNCAPTURED, op
        elif stats.loc[t, "nan"] + stats.loc[t, "inf"] > 0:
            assert fill_of(text, op) == page.NONFINITE, op
        else:
            assert fill_of(text, op) not in (page.NONFINITE, page.UNCAPTURED), op
    assert fill_of(text, nan_tensor.split(":")[0]) == page.NONFINITE
    assert {page.NONFINITE, page.DEAD, page.PALETTE[0], page.PALETTE[-1]} <= set(re.findall(r"#[0-9a-f]{6}", text))
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


def test_graph_page_hops_cap_backward_and_open(runs):
    at = ok(start(runs / "nan", "Op graph", query={"gr_tensor": "conv2/Relu:0", "gr_hops": "1"}))
    n1 = len(re.findall(r"^  n\d+ \[", chart(at), re.M))
    assert n1 == 3                                                    # BiasAdd -> Relu -> conv3/Conv2D
    at.number_input(key="gr_hops").set_value(3).run()
    n3 = len(re.findall(r"^  n\d+ \[", chart(ok(at)), re.M))
    assert n3 > n1
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
    monkeypatch.setattr(inspector.graphdef, "MAX_GRAPH_BYTES", size - 1)
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
    assert f"First NaN/Inf: step {NAN_AT}, found by the statistics (forward of {nan_tensor}), created at " \
           "examples/models.py:57 in conv_block." in captions(at)
    errors = unescape(" ".join(e.value for e in at.error))
    assert "created at examples/models.py:57 in conv_block" in errors
    at = ok(start(path, "Tensor browser", query={"tb_tensor": nan_tensor}))
    md = unescape(" ".join(m.value for m in at.markdown))
    assert "Created at **examples/models.py:57 in conv_block**" in md
    assert "examples/train.py:12 in main\nexamples/models.py:57 in conv_block" in [t.value for t in at.text]
    at = ok(start(path, "Tensor browser", query={"tb_tensor": "conv1/Relu:0"}))     # none recorded
    assert "Created at: unknown" in captions(at)


def test_dot_colours_follow_the_statistic():
    """Fills from the values (dead and NaN ops keep their own colours and stay out of the scale);
    l2 over three decades is log-spaced: the geometric middle gets the middle colour."""
    nodes = [Node("a", "Relu"), Node("b", "Relu", ("a",)), Node("c", "Relu", ("b",)), Node("d", "Relu", ("c",)),
             Node("e", "Relu", ("d",)), Node("f", "Relu", ("e",))]
    g = OpGraph(nodes)
    looks = {"a": page.Look("a:0", 1.0), "b": page.Look("b:0", 1000.0), "c": page.Look("c:0", 10 ** 1.5),
             "d": page.Look("d:0", 0.0, dead=True), "e": page.Look("e:0", None, nonfinite=True)}
    text = page.dot(g.neighbourhood("a", 5), g, looks, "l2")
    assert fill_of(text, "a") == page.PALETTE[0] and fill_of(text, "b") == page.PALETTE[-1]
    assert fill_of(text, "c") == page.palette(0.5) == page.PALETTE[2]
    assert fill_of(text, "d") == page.DEAD and fill_of(text, "e") == page.NONFINITE
    assert fill_of(text, "f") == page.UNCAPTURED
    assert "low l2 = 1" in text and "high l2 = 1e+03 (log scale)" in text
    linear = page.dot(g.neighbourhood("a", 5), g, looks, "mean")          # mean: a linear scale
    assert fill_of(linear, "c") == page.palette((10 ** 1.5 - 1) / 999)
    empty = page.dot(g.neighbourhood("a", 5), g, {}, "l2")
    assert "low l2" not in empty and "NaN/Inf" in empty                   # no values: no value legend
