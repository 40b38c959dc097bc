"""Which loss and labels DumpHook takes when not told, checked against tf.gradients / numpy
(tf.nn + tf.compat.v1 only: TF 2.15 and the latest)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook, capture  # noqa: E402
from hooks.recorders import loss_and_labels  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, conv_net  # noqa: E402

v1 = tf.compat.v1
WATCH = ["x:0", "conv1/relu:0", "fc/logits:0"]


def _net(decay: float = 0.0):
    """x, int labels [N], conv net; v1.losses cross entropy in LOSSES, L2 weight decay in
    REGULARIZATION_LOSSES. Returns (x, y, cross entropy, total = get_total_loss())."""
    x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
    y = v1.placeholder(tf.int32, [BATCH], name="labels")
    conv_net(x, y)
    logits = v1.get_default_graph().get_tensor_by_name("fc/logits:0")
    xent = v1.losses.sparse_softmax_cross_entropy(y, logits)
    if decay:
        for w in v1.trainable_variables():
            v1.losses.add_loss(decay * tf.nn.l2_loss(w), v1.GraphKeys.REGULARIZATION_LOSSES)
    return x, y, xent, v1.losses.get_total_loss()


def _dump_and_oracle(tmp_path, train_of, oracle_loss_of, **hook_kw):
    """Train one step with DumpHook(run_dir) and fetch tf.gradients(oracle loss, WATCH) in that same run."""
    with tf.Graph().as_default() as g:
        gs = v1.train.get_or_create_global_step()
        x, y, xent, total = _net(decay=1e-2)
        train_op = train_of(xent, total, gs)
        watch = [g.get_tensor_by_name(n) for n in WATCH]
        oracle = tf.gradients(oracle_loss_of(xent, total), watch)
        hook = DumpHook(tmp_path / "run", stats_every_n_steps=0, dump_every_n_steps=1, samples_per_group=BATCH,
                        **hook_kw)
        feed = {x: batch_images(1), y: batch_labels(1)}
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            expected = sess.run_step_fn(lambda step_context: step_context.session.run(oracle, feed))
            sess.run(train_op, feed)
    return inspector.open_run(tmp_path / "run"), dict(zip(WATCH, expected))


def _assert_gradients(run, expected):
    for name, grad in expected.items():
        np.testing.assert_allclose(run.tensor(name, 1, "gradient"), grad, rtol=1e-5, atol=1e-8, err_msg=name)


def test_the_loss_the_optimizer_minimizes_not_the_collection_sum(tmp_path):
    """LOSSES holds the cross entropy, the optimizer minimizes get_total_loss() (with weight decay)."""
    run, expected = _dump_and_oracle(
        tmp_path, lambda xent, total, gs: v1.train.GradientDescentOptimizer(0.1).minimize(total, global_step=gs),
        lambda xent, total: total)
    assert run.manifest["loss"] == "total_loss:0"
    _assert_gradients(run, expected)


def test_a_collection_listing_the_total_twice_is_not_doubled(tmp_path):
    """The Estimator's pattern: spec.loss appended to LOSSES beside the entries it sums."""
    def train_of(xent, total, gs):
        v1.losses.add_loss(total)
        v1.losses.add_loss(total)
        return tf.group(v1.assign_add(gs, 1))  # no optimizer pass: the collection decides
    run, expected = _dump_and_oracle(tmp_path, train_of, lambda xent, total: total)
    assert run.manifest["loss"] == "total_loss:0"
    _assert_gradients(run, expected)


def test_regularization_is_added_to_a_collection_loss_that_lacks_it(tmp_path):
    run, expected = _dump_and_oracle(tmp_path, lambda xent, total, gs: tf.group(v1.assign_add(gs, 1)),
                                     lambda xent, total: total)
    assert run.manifest["loss"] == "tf_inspector/total_loss:0"
    _assert_gradients(run, expected)


def test_loss_argument_wins(tmp_path):
    run, expected = _dump_and_oracle(
        tmp_path, lambda xent, total, gs: v1.train.GradientDescentOptimizer(0.1).minimize(total, global_step=gs),
        lambda xent, total: xent, loss="sparse_softmax_cross_entropy_loss/value:0")
    _assert_gradients(run, expected)


def test_per_example_entries_are_never_summed():
    with tf.Graph().as_default():
        x, y, xent, total = _net()
        per_example = v1.losses.sparse_softmax_cross_entropy(
            y, v1.get_default_graph().get_tensor_by_name("fc/logits:0"), reduction=v1.losses.Reduction.NONE)
        assert per_example.shape.rank == 1 and per_example in v1.get_collection(v1.GraphKeys.LOSSES)
        choice = loss_and_labels.choose_loss(v1.get_default_graph())
        assert choice.tensor is xent and f"non-scalar {per_example.name} left out" in choice.reason


def _two_independent_losses():
    x, y, xent, _ = _net()
    aux = tf.reduce_mean(tf.square(v1.get_default_graph().get_tensor_by_name("conv1/relu:0")), name="aux")
    v1.losses.add_loss(aux)
    return x, y, xent, aux


def test_ambiguous_collection_is_refused_with_the_candidates(tmp_path, caplog):
    with tf.Graph().as_default() as g:
        _, _, xent, aux = _two_independent_losses()
        with pytest.raises(loss_and_labels.AmbiguousError, match="aux:0") as e:
            loss_and_labels.choose_loss(g)
        assert xent.name in str(e.value) and "loss=" in str(e.value)
        with caplog.at_level(logging.ERROR, logger="tf_inspector"):
            assert loss_and_labels.resolve_loss(g, None, strict=False) is None  # forward values only
        assert "aux:0" in caplog.text


def test_several_optimizer_passes_are_ambiguous_unless_one_is_the_collections(tmp_path):
    with tf.Graph().as_default() as g:
        _, _, xent, aux = _two_independent_losses()
        v1.train.GradientDescentOptimizer(0.1).minimize(xent)
        v1.train.GradientDescentOptimizer(0.1).minimize(aux)
        with pytest.raises(loss_and_labels.AmbiguousError, match="several scalars"):
            loss_and_labels.choose_loss(g)
    with tf.Graph().as_default() as g:
        x, y, xent, _ = _net()
        aux = tf.reduce_mean(tf.square(g.get_tensor_by_name("conv1/relu:0")), name="aux")
        v1.train.GradientDescentOptimizer(0.1).minimize(xent)
        v1.train.GradientDescentOptimizer(0.1).minimize(aux)  # not in LOSSES
        assert loss_and_labels.choose_loss(g).tensor is xent


def test_a_saliency_pass_is_not_the_optimizers():
    """tf.gradients of some scalar with respect to the input reaches no variable: not a training loss."""
    with tf.Graph().as_default() as g:
        x, _, xent, aux = _two_independent_losses()
        v1.train.GradientDescentOptimizer(0.1).minimize(xent)
        tf.gradients(aux, x)
        assert loss_and_labels.choose_loss(g).tensor is xent


def test_strict_hook_raises_on_ambiguity_and_lenient_one_keeps_forward_values(tmp_path):
    def build():
        gs = v1.train.get_or_create_global_step()
        x, y, _, _ = _two_independent_losses()
        return x, y, tf.group(v1.assign_add(gs, 1))
    with tf.Graph().as_default():
        x, y, op = build()
        with pytest.raises(loss_and_labels.AmbiguousError):
            with v1.train.MonitoredSession(hooks=[DumpHook(tmp_path / "strict", strict=True)]):
                pass
    with tf.Graph().as_default():
        x, y, op = build()
        hook = DumpHook(tmp_path / "lenient", stats_every_n_steps=1, dump_every_n_steps=1)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(op, {x: batch_images(1), y: batch_labels(1)})
        assert not hook._disabled
    run = inspector.open_run(tmp_path / "lenient")
    assert run.manifest["loss"] is None and not run.tensors.has_gradient.any() and run.steps == [1]


# ---- labels --------------------------------------------------------------------------------------
LABEL_CASES = {
    "ids [N]": (np.array([0, 1, 2, 0, 1, 0, 0, 3], np.int64), None),
    "ids [N, 1]": (np.array([[0], [1], [1], [0], [1], [0], [0], [1]], np.int32), None),
    "float [N, 1]": (np.array([[0.], [1.], [1.], [0.], [1.], [0.], [0.], [1.]], np.float32), None),
    "float [N]": (np.array([0., 1., 0., 0., 1., 0., 0., 1.], np.float32), None),
    "bool [N]": (np.array([False, True, True, False, True, False, False, False]), None),
    "one-hot [N, 3]": (np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 0, 2, 1, 0]], None),
    "probabilities [N, 2]": (np.array([[.9, .1], [.2, .8], [.6, .4], [.3, .7]] * 2, np.float32), None),
    "one-hot [N, C unknown]": (np.eye(3, dtype=np.float32)[[1, 1, 2, 0, 0, 2, 1, 0]], [BATCH, None]),
    "ids [N, C unknown], C = 1": (np.array([[0], [2], [1], [0], [1], [0], [0], [1]], np.int32), [BATCH, None]),
}


def _expected_positive(labels: np.ndarray) -> np.ndarray:
    if labels.ndim == 1 or labels.shape[1] == 1:
        return labels.reshape(len(labels)) != 0
    return labels.argmax(1) != 0


@pytest.mark.parametrize("case", sorted(LABEL_CASES))
def test_default_positive_rule_counts_match_numpy(tmp_path, case):
    values, shape = LABEL_CASES[case]
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.as_dtype(values.dtype), shape or list(values.shape), name="y")
        h = tf.nn.relu(x, name="h")
        step = v1.assign_add(gs, 1)
        hook = DumpHook(tmp_path / "run", labels=y, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run([h, step], {x: batch_images(1), y: values})
    stats = inspector.open_run(tmp_path / "run").stats
    counts = stats[(stats.tensor == "h:0") & (stats.kind == "forward")].set_index("group")["count"]
    positive = _expected_positive(values)
    assert counts["positive"] == positive.sum() * 64 and counts["negative"] == (~positive).sum() * 64, case


@pytest.mark.parametrize("shape,dtype", [([BATCH, 4, 4], tf.int32), ([BATCH], tf.string), (None, tf.int32)])
def test_labels_without_a_default_rule_are_refused(shape, dtype):
    with tf.Graph().as_default():
        y = v1.placeholder(dtype, shape, name="y")
        with pytest.raises(capture.LabelsError, match="positive="):
            capture.group_ids(y, None)
        assert capture.group_ids(y, lambda t: tf.ones([BATCH], tf.bool)) is not None  # positive= still works
