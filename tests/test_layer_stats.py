"""The always-on statistics (``layer_stats_every_n_steps``): which tensors and gradients they
record, rows identical to every op's statistics of the same step, and Grappler's fused ops kept
in the graph the step executes (RunMetadata's partition graphs)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector.format import STAT_COLUMNS  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, placeholders  # noqa: E402

v1 = tf.compat.v1


def _net(x, y):
    """conv + bias + relu twice, dense + bias: the chains Grappler fuses."""
    init = v1.glorot_uniform_initializer(seed=1)
    h = x
    for i, stride in ((1, 1), (2, 2)):
        w = v1.get_variable(f"conv{i}/w", [3, 3, int(h.shape[-1]), 8], initializer=init)
        b = v1.get_variable(f"conv{i}/b", [8], initializer=v1.constant_initializer(0.1))
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w, stride, "SAME", name=f"conv{i}/conv"), b,
                                      name=f"conv{i}/bias"), name=f"conv{i}/relu")
    flat = tf.reshape(h, [BATCH, -1], name="flat")
    w = v1.get_variable("fc/w", [int(flat.shape[-1]), 2], initializer=init)
    b = v1.get_variable("fc/b", [2], initializer=v1.zeros_initializer())
    logits = tf.nn.bias_add(tf.matmul(flat, w, name="fc/matmul"), b, name="fc/logits")
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return tf.add(xent, 1e-4 * tf.nn.l2_loss(w, name="decay"), name="loss")


class _Graphs(v1.train.SessionRunHook):
    """The op types of the graph each run executed."""

    def __init__(self):
        self.types: list[set[str]] = []

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(None, options=v1.RunOptions(output_partition_graphs=True))

    def after_run(self, run_context, run_values):
        self.types.append({n.op for g in run_values.run_metadata.partition_graphs for n in g.node})


def _train(tmp_path, steps: int, **hooks_kw) -> tuple[dict, _Graphs]:
    graphs = _Graphs()
    with tf.Graph().as_default():
        gs, x, y = placeholders()
        loss = _net(x, y)
        train_op = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
        hooks = [DumpHook(tmp_path / name, loss=loss, labels=y, dump_every_n_steps=0, strict=True,
                          **kw) for name, kw in hooks_kw.items()]
        with v1.train.MonitoredSession(hooks=[*hooks, graphs]) as sess:
            for step in range(1, steps + 1):
                sess.run(train_op, {x: batch_images(step), y: batch_labels(step)})
    return {name: inspector.open_run(tmp_path / name) for name in hooks_kw}, graphs


def test_layer_statistics_record_the_fused_ops_outputs_and_their_gradients(tmp_path):
    runs, _ = _train(tmp_path, 3, layers=dict(layer_stats_every_n_steps=1, stats_every_n_steps=3))
    rows = runs["layers"].query_stats()
    layer_step = set(zip(*rows[rows["step"] == 1][["tensor", "kind"]].to_numpy().T))
    every_op = set(zip(*rows[rows["step"] == 3][["tensor", "kind"]].to_numpy().T))
    for name in ("conv1/relu:0", "conv2/relu:0", "fc/logits:0", "loss:0"):
        assert {(name, "forward"), (name, "gradient")} <= layer_step, name
    # the fused chains' intermediate outputs, the input (and d loss / d input), the weights'
    # reads and the variables' rows: on the statistics step only
    left_out = {("conv1/conv:0", "forward"), ("conv1/bias:0", "forward"), ("conv1/bias:0", "gradient"),
                ("conv2/conv:0", "forward"), ("fc/matmul:0", "forward"), ("x:0", "forward"),
                ("x:0", "gradient"), ("conv1/w", "forward"), ("conv1/w", "gradient"),
                ("conv1/w", "update"), ("decay:0", "forward")}
    assert left_out <= every_op and not left_out & layer_step
    assert layer_step < every_op
    assert sorted(rows["step"].unique()) == [1, 2, 3]
    assert set(rows[rows["step"] == 1]["group"]) == set(rows[rows["step"] == 3]["group"])
    assert runs["layers"].manifest["config"]["layer_stats_every_n_steps"] == 1


def test_layer_rows_equal_every_ops_rows_of_the_same_step(tmp_path):
    runs, _ = _train(tmp_path, 2, layers=dict(layer_stats_every_n_steps=1, stats_every_n_steps=0),
                     full=dict(stats_every_n_steps=1))
    key = ["tensor", "kind", "group", "step"]
    layers = runs["layers"].query_stats().sort_values(key).reset_index(drop=True)
    full = runs["full"].query_stats().merge(layers[key], on=key).sort_values(key).reset_index(drop=True)
    assert len(layers) > 10 and len(full) == len(layers)
    np.testing.assert_array_equal(layers[list(STAT_COLUMNS)].to_numpy(), full[list(STAT_COLUMNS)].to_numpy())
    for a, b in zip(layers["hist_count"], full["hist_count"]):
        np.testing.assert_array_equal(a, b)


def test_layer_statistics_leave_grapplers_fused_convolution_in_the_executed_graph(tmp_path):
    _, graphs = _train(tmp_path, 4, layers=dict(layer_stats_every_n_steps=1, stats_every_n_steps=4))
    fused = [any("FusedConv2D" in t for t in types) for types in graphs.types]
    # steps 1-3 record the layers, the fused op runs; step 4 reads every op's output, which
    # splits it (the check can fail)
    assert fused == [True, True, True, False]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_a_bad_layer_schedule_is_refused_naming_it(bad):
    from hooks import CaptureOptions
    with pytest.raises(ValueError, match=f"layer_stats_every_n_steps={bad!r} must be a non-negative int"):
        CaptureOptions(layer_stats_every_n_steps=bad)


def test_the_keras_callback_refuses_the_layer_schedule(tmp_path):
    from hooks.keras import InspectCallback
    with pytest.raises(ValueError, match="layer_stats_every_n_steps=1: the always-on layer statistics are DumpHook's"):
        InspectCallback(tmp_path / "run", layer_stats_every_n_steps=1)
    InspectCallback(tmp_path / "run", layer_stats_every_n_steps=None)
