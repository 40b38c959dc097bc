"""DumpHook under TF1 mixed precision: a MixedPrecisionLossScaleOptimizer's loss scale."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
import hooks.recorders.loss_scale  # noqa: E402
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


def _scaled_training(scale):
    """In the default graph: a global step and ``_fp16_model`` trained by gradient descent under
    a TF1 loss-scale optimizer (``scale``: an initial dynamic scale, a LossScale, or "dynamic").
    Returns (global step, x, y, loss, train op)."""
    gs = v1.train.get_or_create_global_step()
    x, y, _, _, loss = _fp16_model()
    if isinstance(scale, float):
        scale = v1.mixed_precision.DynamicLossScale(initial_loss_scale=scale)
    opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(v1.train.GradientDescentOptimizer(1e-3), scale)
    return gs, x, y, loss, opt.minimize(loss, global_step=gs)


@pytest.mark.parametrize("scale, loss_arg", [(2.0 ** 15, False), (2.0 ** 15, True), (2.0 ** 60, False)])
def test_loss_scale_optimizer_gradients_are_the_unscaled_ones(tmp_path, scale, loss_arg):
    """Under MixedPrecisionLossScaleOptimizer the hook took its loss x scale
    for the loss (gradients and loss 2^15 times too large), and with loss= the plain loss it
    took float16 gradients of the unscaled loss, which read 0 where the applied ones do not.
    Now d (loss x scale) / d t / scale in float32, from the optimizer's own pass, equal to what
    the optimizer applies. Where that overflows (2^60) the optimizer skips the step: the run has
    no step of its own, and nothing of it is written (recorded in ``dropped``)."""
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
    if scale > 2 ** 40:   # the scaled pass overflowed: the step the optimizer skips (the global step stays 0)
        assert not np.isfinite(applied_w1).all() and not np.isfinite(scaled_h).all()
        assert run.steps == [] and run.stats_steps().size == 0
        assert sorted(run.dropped["what"]) == ["dump", "stats"] and (run.dropped["first_step"] == 1).all()
        return
    step, = run.steps
    assert step == 1
    index = np.asarray(run.samples(step)["index"])
    got = run.tensor("h1:0", step, "gradient")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected[index], rtol=1e-6, atol=0)
    np.testing.assert_allclose(run.tensor("w1", step, "gradient"), applied_w1, rtol=1e-6, atol=0)
    # the float16 pass of the unscaled loss reads 0 where the scaled one does not
    assert np.mean(plain_h == 0) > 0.3 and np.mean(got == 0) == 0


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
    """Under a loss-scale optimizer, the cross-entropy op's second
    output (its backprop, which the loss does not use) was recorded with a gradient of zeros,
    where the same model without loss scaling records none: the unscaled fallback pass, over
    every tensor at once, fills zeros for a multi-output op's unused output."""
    plain = _classifier_run(tmp_path / "plain", loss_scale=False)
    scaled = _classifier_run(tmp_path / "scaled", loss_scale=True)
    unused = "SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits:1"
    assert not plain[unused] and not scaled[unused]
    assert scaled[plain.index].equals(plain)   # the loss scale's own ops aside, the same tensors have gradients


def test_runs_the_loss_scale_skips_are_dropped_and_said_once(tmp_path, caplog):
    """A run a dynamic loss scale skips (its gradients overflowed) does not advance the global
    step. Its rows carried the step before it, with a warning naming gradient accumulation and
    other runs; now they are not written: recorded in ``dropped``, and said once in the log."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(2.0 ** 60)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with caplog.at_level(logging.WARNING, logger="tf_inspector"), v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(3):
                sess.run(train_op, {x: x_val, y: y_val})
    said = [r.getMessage() for r in caplog.records if r.name == "tf_inspector" and r.levelno == logging.WARNING]
    skips = [m for m in said if "was skipped by the loss scale" in m]
    assert len(skips) == 1 and "sampled for step 1 was skipped by the loss scale" in skips[0]
    # and, at its end, that the session recorded nothing, naming where the drops are
    assert [m for m in said if m not in skips] and all("recorded nothing" in m for m in said if m not in skips)
    run = inspector.open_run(tmp_path / "r")
    assert run.stats_steps().size == 0
    (what, count, first, last), = run.dropped[["what", "count", "first_step", "last_step"]].values.tolist()
    assert (what, count, first, last) == ("stats", 3, 1, 1)


@pytest.mark.parametrize("strict", [True, False])
def test_a_loss_argument_naming_the_scaled_loss_is_refused(tmp_path, strict, caplog):
    """``loss=`` naming the optimizer's ``loss x scale`` would record gradients the scale times
    those training applies (2^15). Refused, naming the loss to give; without strict=True the
    hook goes on with forward values only."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(2.0 ** 15)
        scaled = hooks.recorders.loss_scale.lookup(tf.compat.v1.get_default_graph(), loss).scaled
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


def _skipping_training(run_dir, runs: int, **hook_kw):
    """Trains ``runs`` runs under a dynamic loss scale that overflows at first (2^30: six runs
    skipped) and again each time it grows (increment_period=3: every fourth run after). Per run:
    (global step before, after, w2 before, w2 after), read outside the hook."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(
            v1.mixed_precision.DynamicLossScale(initial_loss_scale=2.0 ** 30, increment_period=3))
        w2, = (v for v in v1.trainable_variables() if v.op.name == "w2")
        hook = DumpHook(run_dir, strict=True, samples_per_group=N, **hook_kw)
        seen = []
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            def read():
                return sess.run_step_fn(lambda step_context: step_context.session.run((gs, w2)))
            for _ in range(runs):
                before = read()
                sess.run(train_op, {x: x_val, y: y_val})
                seen.append((*before, *read()))
    return [(int(g0), int(g1), w0, w) for g0, w0, g1, w in seen]


def test_every_applied_step_is_sampled_with_its_own_rows_under_a_skipping_loss_scale(tmp_path, caplog):
    """Under a dynamic loss scale with stats_every_n_steps=1 only some runs got
    statistics, and applied steps went unrecorded. A sampled run the scale skipped (the global
    step stayed put) had already moved the schedule past the step it planned (its count + 1)
    while its row took the step read after it (the step before): the run that then made that
    step was not due, and skipped runs between samples left the count ahead of the global step.
    Rows of skipped runs also carried the step before, as if that step's (two rows per step,
    or the only row of a step whose own run went unsampled). Now every applied step has its
    own rows and dump, each from the run that made it; a skipped run's are dropped, recorded."""
    with caplog.at_level(logging.WARNING, logger="tf_inspector"):
        seen = _skipping_training(tmp_path / "r", 20, stats_every_n_steps=1, dump_every_n_steps=1)
    applied = {g1: (w0, w) for g0, g1, w0, w in seen if g1 > g0}
    skipped = [g0 + 1 for g0, g1, _, _ in seen if g1 == g0]
    assert len(applied) >= 8 and len(skipped) >= 8 and min(skipped) < max(applied)   # interleaved
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == list(run.steps) == sorted(applied) == list(range(1, len(applied) + 1))
    for step, (before, after) in applied.items():   # the values of the run that made the step
        np.testing.assert_array_equal(run.tensor("w2", step), before)
        np.testing.assert_array_equal(run.tensor("w2", step, "update"), after - before)
        assert np.any(after != before)
    update = run.query_stats(tensors=["w2"], kinds=["update"], groups=["all"])
    assert len(update) == len(applied) and (update["max"] - update["min"] > 0).all()
    drops = {r.what: r for r in run.dropped.itertuples()}
    assert set(drops) == {"stats", "dump"}
    for r in drops.values():
        assert r.count == len(skipped) and "loss scale skipped" in r.reason and (r.first_step, r.last_step) == (min(skipped), max(skipped))
    assert "was skipped by the loss scale" in caplog.text and "training runs" not in caplog.text


@pytest.mark.parametrize("every", [2, 3])
def test_the_schedule_samples_the_multiples_when_skipped_runs_went_unsampled(tmp_path, every):
    """Runs the scale skipped between two sampled ones leave the hook's run count ahead of the
    global step; the schedule planned from that count and sampled steps off the multiples
    (with rows of skipped runs among them). Now a sampled run plans from the step read before it."""
    seen = _skipping_training(tmp_path / "r", 20, stats_every_n_steps=every, dump_every_n_steps=every)
    last = seen[-1][1]
    applied = {g1: w0 for g0, g1, w0, _ in seen if g1 > g0}
    run = inspector.open_run(tmp_path / "r")
    want = list(range(every, last + 1, every))
    assert list(run.stats_steps()) == list(run.steps) == want
    for step in want:
        np.testing.assert_array_equal(run.tensor("w2", step), applied[step])


@pytest.mark.parametrize("dump_steps", [[], [5]])
def test_a_nan_loss_the_loss_scale_skips_is_dumped_at_the_step_before_it(tmp_path, dump_steps):
    """dump_on_nonfinite under a dynamic loss scale: the run whose loss is NaN is skipped (its
    gradients are NaN too). Its dump, the NaN/Inf one, carries the step its run left the global
    step at (4), also where the schedule had sampled the run for step 5; step 5 is then the next
    run's, dumped as the step after the NaN. Its statistics are not written (they are no step's)."""
    x_val, y_val = _data()
    nan = y_val.copy()
    nan[0] = np.nan
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(2.0 ** 20)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=5, dump_every_n_steps=0, dump_steps=dump_steps,
                        dump_on_nonfinite=True, strict=True)
        steps = []
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for i in range(8):
                sess.run(train_op, {x: x_val, y: nan if i == 4 else y_val})
                steps.append(sess.run_step_fn(lambda step_context: step_context.session.run(gs)))
    assert steps == [1, 2, 3, 4, 4, 5, 6, 7]
    run = inspector.open_run(tmp_path / "r")
    assert {s: run.dump_metadata(s)["reason"] for s in run.steps} == {4: "NaN/Inf in the loss", 5: "after NaN/Inf"}
    assert np.isnan(run.tensor("loss:0", 4)) and np.isfinite(run.tensor("loss:0", 5))
    assert list(run.stats_steps()) == [5] and run.manifest["first_nonfinite"]["step"] == 4
    assert run.dropped[["what", "count", "first_step"]].values.tolist() == [["stats", 1, 5]]


def test_a_refused_scaled_loss_still_records_training(tmp_path, caplog):
    """Without strict=True, ``loss=`` naming the scaled loss is refused and
    the hook goes on without a loss; the mode then came from the graph, where a TF2 cond hides
    the optimizer's increment of the global step (its then-branch): with no loss and no visible
    increment the session was taken for prediction. Four training runs were written as predict
    batches 0..3, all at global step 0, with no training step at all. A graph in which a
    loss-scale optimizer scaled a loss trains: rows carry the training steps."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(2.0 ** 15)
        scaled = hooks.recorders.loss_scale.lookup(tf.compat.v1.get_default_graph(), loss).scaled
        hook = DumpHook(tmp_path / "r", loss=scaled, stats_every_n_steps=2, dump_every_n_steps=0)
        with caplog.at_level(logging.ERROR, logger="tf_inspector"), v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(4):
                sess.run(train_op, {x: x_val, y: y_val})
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["loss"] is None and run.config["mode"] == "train"
    assert list(run.stats_steps()) == [2, 4]


def test_a_read_in_no_order_with_the_update_is_not_captured_under_a_loss_scale(tmp_path):
    """Without loss scaling a variable's own Read/ReadVariableOp (off the
    loss's path, in no order with the update) is skipped, saying why (test_hook.py). Under a
    loss-scale optimizer the update runs inside a TF2 cond's branch (the step it may skip):
    no write is seen, the read is captured, and its value is the one before or after the
    update by chance (two identical trainings under TF 2.21 recorded w2's read with means
    1.8e-5 and 1.2e-5 at one step)."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training("dynamic")
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: x_val, y: y_val})
    run = inspector.open_run(tmp_path / "r")
    assert "w2/Read/ReadVariableOp:0" in run.manifest["skipped"]
    assert "w2/Read/ReadVariableOp:0" not in run.tensors.index


def test_a_validation_run_is_no_training_run_under_a_loss_scale(tmp_path, caplog):
    """A run through the session that trains nothing (a validation fetch of
    the loss) is not a training step (test_hook.py). Under a loss-scale optimizer the increment
    of the global step sits in a TF2 cond's branch, which the check did not see: every run was
    counted as a training run, and a sampled validation run was dropped as "a run the loss
    scale skipped (its gradients overflowed)", logged so, where nothing overflowed."""
    x_val, y_val = _data()
    with tf.Graph().as_default():
        gs, x, y, loss, train_op = _scaled_training(2.0 ** 8)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=2, dump_every_n_steps=3, strict=True)
        with caplog.at_level(logging.WARNING, logger="tf_inspector"), v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(6):
                sess.run(train_op, {x: x_val, y: y_val})
                sess.run(loss, {x: x_val, y: y_val})
            steps = sess.run_step_fn(lambda step_context: step_context.session.run(gs))
    assert steps == 6
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == [2, 4, 6] and run.steps == [3, 6]
    assert run.dropped.empty and "skipped by the loss scale" not in caplog.text


def test_a_loss_scale_optimizer_under_v1_control_flow_records_each_step_with_the_weights_it_used(tmp_path):
    """Under v1 control flow (TF1 code,
    ``disable_v2_behavior``) the loss-scale optimizer's cond is a v1 cond, whose ops take the
    variables through Switch ops. The global step's AssignAdd was not seen (the hook refused the
    graph: 'a global step that no op adds to'; before 4b61e83 it recorded every step), and
    neither were the updates of the reference variables: ``w1/read`` would be dumped with the
    weights after the update. Recorded, steps 1-3; ``w1/read`` skipped or the weights before."""
    x_val, y_val = _data()
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            gs = v1.train.get_or_create_global_step()
            x = v1.placeholder(tf.float32, [N, 8], name="x")
            y = v1.placeholder(tf.float32, [N, 1], name="y")
            w1 = v1.get_variable("w1", [8, 16], tf.float32, initializer=v1.random_normal_initializer(seed=1),
                                 use_resource=False)
            w2 = v1.get_variable("w2", [16, 1], tf.float32, initializer=v1.random_normal_initializer(seed=2),
                                 use_resource=False)
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y), name="loss")
            opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(v1.train.GradientDescentOptimizer(0.1),
                                                                      "dynamic")
            train_op = opt.minimize(loss, global_step=gs)
            hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_steps=[1], samples_per_group=N, strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                before = sess.run_step_fn(lambda step_context: step_context.session.run(w1))
                for _ in range(3):
                    sess.run(train_op, {x: x_val, y: y_val})
    finally:
        v1.enable_control_flow_v2()
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.query_stats(["loss:0"], groups=["all"], kinds=["forward"])["step"]) == [1, 2, 3]
    if "w1/read:0" in run.tensors.index:
        np.testing.assert_array_equal(run.tensor("w1/read:0", 1), before)
    else:
        assert "w1/read:0" in run.manifest["skipped"]
