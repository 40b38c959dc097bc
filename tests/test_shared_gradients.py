"""One backward pass shared by the optimizer and DumpHook: explicitly (hooks.minimize) or
recorded from optimizer.minimize (hooks.recorders.gradients)."""
from __future__ import annotations

import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import hooks  # noqa: E402
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector.format import SHARED_GRADIENTS_COLLECTION, parse_shared_gradient_entry  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, conv_net  # noqa: E402

v1 = tf.compat.v1
WATCH = ["x:0", "conv1/relu:0", "conv2/relu:0", "flat:0", "fc/logits:0"]


def build(shared: bool, use_resource: bool = True, momentum: bool = False):
    """The test CNN trained by optimizer.minimize or hooks.minimize; returns (x, y, loss, train_op)."""
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
    y = v1.placeholder(tf.int32, [BATCH], name="labels")
    with v1.variable_scope(v1.get_variable_scope(), use_resource=use_resource):
        loss = conv_net(x, y)
    opt = v1.train.MomentumOptimizer(0.1, 0.9) if momentum else v1.train.GradientDescentOptimizer(0.1)
    train = hooks.minimize(opt, loss, global_step=gs) if shared else opt.minimize(loss, global_step=gs)
    return x, y, loss, train


def feed(x, y, step):
    return {x: batch_images(step), y: batch_labels(step)}


class Trace(v1.train.SessionRunHook):
    """Asks for a FULL_TRACE of every step and keeps the executed op types' counts."""

    def __init__(self):
        self.counts: list[dict[str, int]] = []

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(None, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        counts: dict[str, int] = {}
        for dev in run_values.run_metadata.step_stats.dev_stats:
            for ns in dev.node_stats:
                m = re.search(r"= (?:_Mkl)?(?:Native)?(\w+)\(", ns.timeline_label)  # oneDNN renames ops
                if m:
                    counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        self.counts.append(counts)


@pytest.mark.parametrize("use_resource", [True, False])
def test_shared_gradients_equal_independent_gradients(tmp_path, use_resource):
    with tf.Graph().as_default() as g:
        x, y, loss, train = build(shared=True, use_resource=use_resource)
        entries = [parse_shared_gradient_entry(e) for e in g.get_collection(SHARED_GRADIENTS_COLLECTION)]
        recorded = {t: gr for _, t, gr in entries}
        assert set(WATCH) <= recorded.keys() and recorded["probs:0"] is None  # probs does not reach the loss
        assert all(lo == loss.name for lo, _, _ in entries)
        watch = [g.get_tensor_by_name(n) for n in WATCH]
        shared = [g.get_tensor_by_name(recorded[n]) for n in WATCH]
        independent = tf.gradients(loss, watch)
        hook = DumpHook(tmp_path / "run", labels=y, stats_every_n_steps=0, dump_every_n_steps=1,
                        samples_per_group=BATCH, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            raw = sess.run_step_fn(lambda step_context: step_context.session.run((shared, independent), feed(x, y, 1)))
            sess.run(train, feed(x, y, 1))
        assert all(c.gradient is not None and c.gradient.name == recorded[c.name]
                   for c in hook.captured if c.name in WATCH)  # the hook took the shared ones
    for a, b in zip(*raw):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    run = inspector.open_run(tmp_path / "run")
    for name, expected in zip(WATCH, raw[1]):
        np.testing.assert_allclose(run.tensor(name, 1, "gradient"), expected, rtol=1e-5, atol=1e-8, err_msg=name)


def _backprop_counts(tmp_path, shared: bool, share_gradients: bool = True) -> tuple[dict, dict]:
    """Executed op counts of a plain step and of a statistics step of a small ResNet v2.

    A ResNet, not the tiny CNN: there Grappler happens to deduplicate the two passes."""
    from bench.resnet import build_resnet
    with tf.Graph().as_default():
        m = build_resnet(n=1, batch=4, hw=8, examples=8, shared_gradients=shared)
        hook = DumpHook(tmp_path / f"run{shared}{share_gradients}", loss=m.loss, labels=m.labels,
                        stats_every_n_steps=2, dump_every_n_steps=0, strict=True, share_gradients=share_gradients)
        trace = Trace()
        with v1.train.MonitoredSession(hooks=[hook, trace]) as sess:
            for _ in (1, 2):
                sess.run(m.train_op)
    return trace.counts[0], trace.counts[1]


@pytest.mark.parametrize("shared", [True, False], ids=["hooks.minimize", "recorded"])
def test_statistics_step_does_not_run_the_backward_pass_twice(tmp_path, shared):
    plain, stats = _backprop_counts(tmp_path, shared=shared)
    assert plain["Conv2DBackpropFilter"] == 9  # 9 convolutions
    for op in ("Conv2DBackpropFilter", "FusedBatchNormGradV3", "ReluGrad"):
        assert stats[op] == plain[op], op
    # + the input gradient of the first conv only (d loss / d images: captured, not trained)
    assert stats["Conv2DBackpropInput"] == plain["Conv2DBackpropInput"] + 1


def test_share_gradients_false_builds_the_hooks_own_pass(tmp_path):
    plain, stats = _backprop_counts(tmp_path, shared=False, share_gradients=False)
    assert stats["Conv2DBackpropFilter"] == 2 * plain["Conv2DBackpropFilter"]


def test_recorded_gradients_equal_independent_gradients(tmp_path):
    """optimizer.minimize, no hooks.minimize: every captured gradient (the input's, which the
    optimizer's pass does not reach, included) equals tf.gradients, in a graph where the input
    also skips to a later op (an edge whose naive completion would count paths twice)."""
    from hooks.recorders import gradients as gradient_recorder
    with tf.Graph().as_default() as g:
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        xs = tf.multiply(x, 2.0, name="scaled")  # unprocessed: upstream of every variable
        w = v1.get_variable("w", [3, 3, 1, 4], use_resource=True)
        h = tf.nn.relu(tf.nn.conv2d(xs, w, 1, "SAME"), name="h")
        skip = tf.concat([h, xs, tf.square(xs, name="sq")], axis=3, name="skip")  # input skips ahead
        v = v1.get_variable("v", [8 * 8 * 6, 2], use_resource=True)
        logits = tf.matmul(tf.reshape(skip, [BATCH, -1]), v, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        recorded = gradient_recorder.lookup(g, loss)
        assert "h:0" in recorded and "x:0" not in recorded and "scaled:0" not in recorded
        hook = DumpHook(tmp_path / "run", loss=loss, labels=y, stats_every_n_steps=0, dump_every_n_steps=1,
                        samples_per_group=BATCH, strict=True)
        names = ["x:0", "scaled:0", "sq:0", "h:0", "skip:0", "logits:0"]
        independent = tf.gradients(loss, [g.get_tensor_by_name(n) for n in names])
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            expected = sess.run_step_fn(lambda step_context: step_context.session.run(independent, feed(x, y, 1)))
            sess.run(train, feed(x, y, 1))
        by_name = {c.name: c.gradient for c in hook.captured}
        assert by_name["h:0"].name == recorded["h:0"]  # reused, not rebuilt
    run = inspector.open_run(tmp_path / "run")
    for name, want in zip(names, expected):
        np.testing.assert_allclose(run.tensor(name, 1, "gradient"), want, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("use_resource", [True, False])
def test_training_equals_optimizer_minimize(tmp_path, use_resource):
    weights = []
    for shared in (False, True):
        with tf.Graph().as_default():
            x, y, loss, train = build(shared=shared, use_resource=use_resource, momentum=True)
            hook = DumpHook(tmp_path / f"run{shared}", labels=y, stats_every_n_steps=2, dump_every_n_steps=3,
                            strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                for step in range(1, 7):
                    sess.run(train, feed(x, y, step))
                weights.append(sess.run_step_fn(
                    lambda step_context: step_context.session.run(v1.trainable_variables())))
    assert len(weights[0]) == 3
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not np.allclose(weights[0][0], build_initial_conv1())  # it did train


def build_initial_conv1():
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1])
        conv_net(x, v1.placeholder(tf.int32, [BATCH]))
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            return s.run(v1.trainable_variables()[0])


def test_compute_gradients_returns_grads_and_vars_for_apply(tmp_path):
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        loss = conv_net(x, y)
        opt = v1.train.GradientDescentOptimizer(0.1)
        gv = hooks.compute_gradients(opt, loss)
        assert [v.name for _, v in gv] == [v.name for v in v1.trainable_variables()]
        assert all(gr is not None for gr, _ in gv)
        assert g.get_collection(SHARED_GRADIENTS_COLLECTION)
        assert g.get_collection("tf_inspector/loss") == [loss]  # the hook's default loss
        train = opt.apply_gradients([(tf.clip_by_norm(gr, 1.0), v) for gr, v in gv])
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            s.run(train, feed(x, y, 1))


def test_after_uninstall_the_hook_builds_its_own_pass(tmp_path):
    """A model built after gradient_recorder.uninstall(): optimizer.minimize is not recorded,
    so the hook's statistics step runs a second backward pass (and sharing still works with
    hooks.minimize, which needs no wrapping)."""
    from hooks.recorders import gradients as gradient_recorder
    assert gradient_recorder.uninstall()
    try:
        plain, stats = _backprop_counts(tmp_path, shared=False)
        assert stats["Conv2DBackpropFilter"] == 2 * plain["Conv2DBackpropFilter"]
        plain, stats = _backprop_counts(tmp_path / "explicit", shared=True)
        assert stats["Conv2DBackpropFilter"] == plain["Conv2DBackpropFilter"]
    finally:
        assert gradient_recorder.install()
