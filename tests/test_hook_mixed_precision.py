"""DumpHook under TF1 mixed precision: a MixedPrecisionLossScaleOptimizer's loss scale."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
import hooks.loss_scale  # noqa: E402
from hooks import DumpHook  # noqa: E402

v1 = tf.compat.v1
N = 32


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 8)).astype("float32")
    return x, (x[:, :1] * 1e-3).astype("float32")   # small targets: gradients below float16's range


def _fp16_model():
    """A float16 MLP on float32 variables (TF1 mixed precision by hand); loss in float32."""
    x = v1.placeholder(tf.float32, [N, 8], name="x")
    y = v1.placeholder(tf.float32, [N, 1], name="y")
    w1 = v1.get_variable("w1", [8, 16], tf.float32, initializer=v1.random_normal_initializer(seed=1))
    w2 = v1.get_variable("w2", [16, 1], tf.float32, initializer=v1.random_normal_initializer(stddev=1e-4, seed=2))
    h = tf.nn.relu(tf.matmul(tf.cast(x, tf.float16), tf.cast(w1, tf.float16)), name="h1")
    out = tf.cast(tf.matmul(h, tf.cast(w2, tf.float16)), tf.float32)
    return x, y, w1, h, tf.reduce_mean(tf.square(out - y), name="loss")


@pytest.mark.parametrize("scale, loss_arg", [(2.0 ** 15, False), (2.0 ** 15, True), (2.0 ** 60, False)])
def test_loss_scale_optimizer_gradients_are_the_unscaled_ones(tmp_path, scale, loss_arg):
    """Found by a red team: under MixedPrecisionLossScaleOptimizer the hook took its loss x scale
    for the loss (gradients and loss 2^15 times too large), and with loss= the plain loss it
    took float16 gradients of the unscaled loss, which read 0 where the applied ones do not.
    Now d (loss x scale) / d t / scale in float32, from the optimizer's own pass, equal to what
    the optimizer applies; where that overflows (2^60: a step the dynamic scale skips), the
    unscaled gradient, never a NaN/Inf the training did not have."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x, y, w1, h, loss = _fp16_model()
        opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1e-3), v1.mixed_precision.DynamicLossScale(initial_loss_scale=scale))
        grads_and_vars = opt.compute_gradients(loss)
        applied = next(g for g, v in grads_and_vars if v is w1)
        train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
        scaled = tf.gradients(loss * scale, h)[0]
        plain = tf.gradients(loss, [h, w1])
        hook = DumpHook(tmp_path / "r", loss=loss if loss_arg else None, stats_every_n_steps=1, dump_steps=[1],
                        samples_per_group=N, strict=True)
        feed = {x: x_val, y: y_val}
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            want = sess.run_step_fn(lambda step_context: step_context.session.run((applied, scaled, plain), feed))
            sess.run(train_op, feed)
    applied_w1, scaled_h, (plain_h, plain_w1) = want
    expected = np.asarray(scaled_h, np.float32) / scale
    expected = np.where(np.isfinite(expected), expected, plain_h.astype(np.float32))
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["loss"] == "loss:0" and run.manifest["first_nonfinite"] is None
    step, = run.steps   # 0 where the optimizer skipped the step: it does not advance the global step then
    index = np.asarray(run.samples(step)["index"])
    got = run.tensor("h1:0", step, "gradient")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected[index], rtol=1e-6, atol=0)
    want_w1 = applied_w1 if scale < 2 ** 40 else plain_w1   # what the optimizer applies where it applies
    np.testing.assert_allclose(run.tensor("w1", step, "gradient"), want_w1, rtol=1e-6, atol=0)
    if scale < 2 ** 40:   # the float16 pass of the unscaled loss reads 0 where the scaled one does not
        assert np.mean(plain_h == 0) > 0.3 and np.mean(got == 0) == 0
    else:   # the scaled pass overflowed: the step the optimizer skips; the records are the unscaled pass
        assert not np.isfinite(applied_w1).all() and not np.isfinite(scaled_h).all()


def _classifier_run(run_dir, loss_scale: bool):
    """A float16 classifier (sparse softmax cross-entropy: an op with an output the loss does
    not use), one statistics step, with or without a loss-scale optimizer."""
    rng = np.random.default_rng(1)
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = tf.constant(rng.normal(size=(N, 8)).astype("float32"))
        y = tf.constant(rng.integers(0, 3, N).astype("int32"))
        w = v1.get_variable("w", [8, 3], tf.float32, initializer=v1.random_normal_initializer(seed=1))
        logits = tf.cast(tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16)), tf.float32, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        opt = v1.train.GradientDescentOptimizer(0.1)
        if loss_scale:
            opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
        train_op = opt.minimize(loss, global_step=gs)
        hook = DumpHook(run_dir, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op)
    return inspector.open_run(run_dir).tensors["has_gradient"]


def test_a_tensor_the_loss_does_not_use_has_no_gradient_under_loss_scaling(tmp_path):
    """Found by a new user's trial: under a loss-scale optimizer, the cross-entropy op's second
    output (its backprop, which the loss does not use) was recorded with a gradient of zeros,
    where the same model without loss scaling records none: the unscaled fallback pass, over
    every tensor at once, fills zeros for a multi-output op's unused output."""
    plain = _classifier_run(tmp_path / "plain", loss_scale=False)
    scaled = _classifier_run(tmp_path / "scaled", loss_scale=True)
    unused = "SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits:1"
    assert not plain[unused] and not scaled[unused]
    assert scaled[plain.index].equals(plain)   # the loss scale's own ops aside, the same tensors have gradients


def test_steps_the_loss_scale_skips_are_named_in_the_step_lag_warning(tmp_path, caplog):
    """A step a dynamic loss scale skips (its gradients overflowed) does not advance the global
    step, so the hook's rows carry the step before it: the warning named only gradient
    accumulation and other runs, not the everyday mixed-precision cause."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x, y, _, _, loss = _fp16_model()
        opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1e-3), v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0 ** 60))
        train_op = opt.minimize(loss, global_step=gs)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with caplog.at_level(logging.WARNING, logger="tf_inspector"), v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(3):
                sess.run(train_op, {x: x_val, y: y_val})
    lag = [r.getMessage() for r in caplog.records if "training runs" in r.getMessage()]
    assert len(lag) == 1 and "loss-scale optimizer skipping steps" in lag[0]


@pytest.mark.parametrize("strict", [True, False])
def test_a_loss_argument_naming_the_scaled_loss_is_refused(tmp_path, strict, caplog):
    """Left by session 15: ``loss=`` naming the optimizer's ``loss x scale`` recorded gradients
    the scale times those training applies (2^15), with no warning. Now refused, naming the
    loss to give; without strict=True the hook goes on with forward values only."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x, y, _, _, loss = _fp16_model()
        opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            v1.train.GradientDescentOptimizer(1e-3), v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0 ** 15))
        train_op = opt.minimize(loss, global_step=gs)
        scaled = hooks.loss_scale.lookup(tf.compat.v1.get_default_graph(), loss).scaled
        hook = DumpHook(tmp_path / "r", loss=scaled, stats_every_n_steps=1, dump_every_n_steps=0, strict=strict)
        if strict:
            with pytest.raises(ValueError, match=f"{scaled.name}.*loss x scale.*'loss:0'"):
                v1.train.MonitoredSession(hooks=[hook])
            return
        with caplog.at_level(logging.ERROR, logger="tf_inspector"), v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: x_val, y: y_val})
    assert any("'loss:0'" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["loss"] is None and not run.tensors["has_gradient"].any()
