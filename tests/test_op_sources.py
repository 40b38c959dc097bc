"""Op source locations (catalog ``source_*``): the file, line and function of the user's code
that created each captured op, for DumpHook under MonitoredSession and for InspectCallback.
The oracle is this file itself: lines are found with ``inspect``, never typed in."""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from hooks.capture.source_lines import is_library, op_source, shown_path  # noqa: E402
from inspector.graph.graphdef import OpGraph, parse_graph_def  # noqa: E402

v1 = tf.compat.v1
HERE = Path(__file__).resolve()


def line_of(fn, text: str) -> int:
    """The line of ``fn``'s source holding ``text`` (exactly once)."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, ln in enumerate(lines) if text in ln]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def block(x, w):
    h = tf.matmul(x, w, name="mm")
    return tf.nn.relu(h, name="act")


def model():
    x = v1.placeholder(tf.float32, [4, 3], name="x")
    w = v1.get_variable("w", [3, 2], initializer=v1.ones_initializer())
    out = block(x, w)
    loss = tf.reduce_mean(out, name="loss")
    return x, loss


def resolved(path: str) -> Path:
    """A stored path (relative to the training process's cwd, or absolute) as an absolute path."""
    return Path(path) if os.path.isabs(path) else (Path.cwd() / path).resolve()


def test_dump_hook_records_where_each_op_was_created(tmp_path):
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x, loss = model()
        train_op = tf.group(v1.train.GradientDescentOptimizer(0.1).minimize(loss), v1.assign_add(gs, 1))
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: np.ones((4, 3), np.float32)})
    run = inspector.open_run(tmp_path / "run")
    cat = run.tensors
    # the graph page's reader (no TensorFlow) finds every captured op in the run's graph.pb
    graph = OpGraph(parse_graph_def(run.graph_def_bytes()))
    assert set(cat["op"]) <= set(graph.nodes)
    assert set(graph.neighbourhood("act", 1).nodes) == {"act", "mm", "loss", "gradients/act_grad/ReluGrad"}
    expect = {"act:0": (block, "tf.nn.relu(h"), "mm:0": (block, "tf.matmul(x"), "loss:0": (model, "reduce_mean"),
              "w": (model, "get_variable(")}            # a variable record: where its variable was made
    for name, (fn, text) in expect.items():
        row = cat.loc[name]
        assert resolved(row["source_file"]) == HERE, (name, row["source_file"])
        assert row["source_line"] == line_of(fn, text), name
        assert row["source_function"] == fn.__name__
        assert row["source_stack"][-1] == [row["source_file"], row["source_line"], row["source_function"]]
    # the stack: the test's call of model() above the innermost frame, outermost first
    stack = cat.loc["act:0", "source_stack"]
    assert [f[2] for f in stack[-3:]] == ["test_dump_hook_records_where_each_op_was_created", "model", "block"]
    # stored relative to the working directory (the checkout, where pytest runs)
    assert not os.path.isabs(cat.loc["act:0", "source_file"]) and HERE.is_relative_to(Path.cwd())


def test_frames_of_libraries_and_of_the_hook_are_left_out():
    assert is_library(tf.__file__) and is_library(inspect.__file__) and is_library(inspector.__file__)
    assert not is_library(__file__)
    assert shown_path("/a/b/c.py", "/a") == os.path.join("b", "c.py") and shown_path("/x/c.py", "/a") == "/x/c.py"
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [2], name="x")
        y = tf.identity(x, name="y")  # <- made here
        made_here = line_of(test_frames_of_libraries_and_of_the_hook_are_left_out, "# <- " + "made here")
        assert op_source(y.op)["source_line"] == made_here
        imported = v1.GraphDef()
        imported.CopyFrom(g.as_graph_def())
    with tf.Graph().as_default() as g2:
        tf.import_graph_def(imported, name="")
        # an op imported from a GraphDef has no creation traceback: unknown (null), never an error
        assert set(op_source(g2.get_operation_by_name("y")).values()) == {None}


class Doubler(tf.keras.layers.Layer):
    """A custom layer: its call is user code, so its ops have a source."""

    def call(self, x):
        return tf.multiply(x, 2.0, name="twice")


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_keras_callback_records_custom_layer_sources(tmp_path, source):
    from hooks.keras import InspectCallback
    keras = tf.keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,))
    out = keras.layers.Dense(2, name="logits")(Doubler(name="doubler")(inp))
    m = keras.Model(inp, out)
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.ones((8, 3), np.float32)
    y = np.arange(8) % 2
    where = dict(probe=(x, y)) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "run", **where, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    m.fit(x, y, batch_size=4, epochs=1, callbacks=[cb], verbose=0)
    run = inspector.open_run(tmp_path / "run")
    cat = run.tensors
    mine = cat[cat["keras_layer"].fillna("").str.endswith("doubler") & (cat["op_type"] == "Mul")]
    assert len(mine) == 1, cat[["name", "keras_layer"]]
    row = mine.iloc[0]
    assert resolved(row["source_file"]) == HERE
    assert row["source_line"] == line_of(Doubler.call, "tf.multiply(x") and row["source_function"] == "call"
    # a built-in layer's ops were built by Keras, called by the hook's trace: no user frame,
    # so no source (never the line of model.fit, which built nothing)
    dense = cat[cat["keras_layer"].fillna("").str.endswith("logits") & (cat["op_type"] == "MatMul")]
    assert len(dense) == 1 and dense["source_file"].isna().all()
    # the probe function's graph holds the captured ops: the custom layer's op feeds the Dense's
    graph = OpGraph(parse_graph_def(run.graph_def_bytes()))
    tensors = cat[cat["kind"] == "tensor"]
    assert set(tensors["op"]) <= set(graph.nodes)
    assert dense["op"].iloc[0] in graph.neighbourhood(row["op"], 1).nodes


def test_nan_alert_names_where_the_first_nan_op_was_created(tmp_path):
    """A real NaN run: the Summary's alert (analysis.run_alerts) ends with the source location
    of the tensor that first held the NaN."""
    from inspector.analysis import run_alerts
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x, loss = model()
        train_op = tf.group(v1.assign_add(gs, 1))
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(3):
                sess.run(train_op, {x: np.full((4, 3), np.nan if step == 1 else 1.0, np.float32)})
    run = inspector.open_run(tmp_path / "run")
    first = run.first_nonfinite()
    where = {"x:0": (model, "placeholder("), "mm:0": (block, "tf.matmul(x"), "act:0": (block, "tf.nn.relu(h"),
             "loss:0": (model, "reduce_mean")}
    fn, text = where[first["tensor"]]
    made = f"created at {cat_path(run, first['tensor'])}:{line_of(fn, text)} in {fn.__name__}"
    (alert,) = [a for a in run_alerts(run) if a.kind == "nonfinite"]
    assert alert.step == 2 and alert.message.endswith(made), alert.message


def cat_path(run, tensor: str) -> str:
    path = run.tensors.loc[tensor, "source_file"]
    assert resolved(path) == HERE
    return path


def estimator_model_fn(features, labels, mode):
    h = tf.compat.v1.layers.dense(features["x"], 2, name="est_dense")
    act = tf.nn.relu(h, name="est_act")
    loss = tf.identity(tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, act), name="est_loss")
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.skipif(not hasattr(getattr(tf, "estimator", None), "Estimator"), reason="no tf.estimator (TF 2.16+)")
def test_estimator_ops_have_their_model_fn_line(tmp_path):
    """Under Estimator.train the model_fn is called through the hooks' recording wrapper
    (estimator_recorder): the model_fn's own frames remain the source."""
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(8, drop_remainder=True)
    est = tf.estimator.Estimator(estimator_model_fn, model_dir=str(tmp_path / "model"))
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    est.train(input_fn, hooks=[hook], steps=1)
    row = inspector.open_run(tmp_path / "run").tensors.loc["est_act:0"]
    assert resolved(row["source_file"]) == HERE and row["source_function"] == "estimator_model_fn"
    assert row["source_line"] == line_of(estimator_model_fn, "tf.nn.relu(h")
