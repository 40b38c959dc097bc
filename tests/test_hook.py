"""DumpHook on small CNNs: exact values, gradients, statistics, schedule, budgets, failures."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from inspector.format.loghist import LogHistogram  # noqa: E402
from hooks import DumpHook, capture, mark  # noqa: E402
from hooks.dump_hook import worker_from_env  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, build_cnn, conv_net  # noqa: E402

v1 = tf.compat.v1
WATCH = ["x:0", "conv1/relu:0", "conv2/relu:0", "flat:0", "fc/logits:0"]


def train(model, hook, steps, before_step=None, nan_at=None):
    """Run ``steps`` training steps under MonitoredSession; ``before_step(step, raw_session)`` may peek."""
    out = {}
    creator = v1.train.ChiefSessionCreator()
    with v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
        for step in range(1, steps + 1):
            feed = model.feed(step, nan=step == nan_at)
            if before_step:
                out[step] = sess.run_step_fn(lambda step_context: before_step(step, step_context.session, feed))
            sess.run(model.train_op, feed)
    return out


def test_dumped_forward_and_gradients_equal_separate_runs(tmp_path):
    with tf.Graph().as_default() as g:
        m = build_cnn()
        watch = [g.get_tensor_by_name(n) for n in WATCH]
        independent = tf.gradients(m.loss, watch)
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=0, dump_every_n_steps=0,
                        dump_steps=[3], samples_per_group=BATCH, strict=True)
        seen = train(m, hook, 4, before_step=lambda s, raw, feed: raw.run((watch, independent), feed) if s == 3 else None)
    run = inspector.open_run(tmp_path / "run")
    assert run.steps == [3]
    forward, grads = seen[3]
    keep = run.samples(3)["index"].to_numpy()
    assert list(keep) == list(range(BATCH))
    for name, f, gr in zip(WATCH, forward, grads):
        np.testing.assert_allclose(run.tensor(name, 3), f[keep], rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(run.tensor(name, 3, "gradient"), gr[keep], rtol=1e-5, atol=1e-8, err_msg=name)
    assert list(run.samples(3)["label"]) == list(batch_labels(3))


def test_gradients_agree_with_finite_differences(tmp_path):
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float64, [3, 4], name="x")
        w = v1.get_variable("w", [4, 2], tf.float64, initializer=v1.random_normal_initializer(seed=2))
        h = tf.tanh(tf.matmul(x, w), name="h")
        loss = tf.reduce_sum(tf.sin(h) * tf.constant([[1.0, -2.0]], tf.float64), name="loss")
        train_op = tf.group(v1.assign_add(gs, 1))
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=0, dump_every_n_steps=1,
                        samples_per_group=3, strict=True)
        xv = np.random.default_rng(0).normal(size=(3, 4))
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: xv})
            hv = sess.run_step_fn(lambda step_context: step_context.session.run(h, {x: xv}))
            fd = np.zeros_like(hv)
            eps = 1e-6
            for idx in np.ndindex(*hv.shape):
                d = np.zeros_like(hv)
                d[idx] = eps
                lp, lm = (sess.run_step_fn(lambda step_context: step_context.session.run(loss, {x: xv, h: hv + s * d})) for s in (1, -1))
                fd[idx] = (lp - lm) / (2 * eps)
    run = inspector.open_run(tmp_path / "run")
    np.testing.assert_allclose(run.tensor("h:0", 1, "gradient"), fd, rtol=1e-6, atol=1e-8)


def test_a_gradient_under_several_keys_is_written_once(tmp_path):
    """d loss / d a = d loss / d c = d loss / d (a + c): one tensor, one array in the file,
    three keys that read back the independent gradient."""
    from safetensors.numpy import load_file
    from inspector.format import dump_name
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [4, 3], name="x")
        w = v1.get_variable("w", [3, 3], initializer=v1.random_normal_initializer(seed=1))
        a = tf.matmul(x, w, name="a")
        c = tf.tanh(x, name="c")
        total = tf.add(a, c, name="sum")
        loss = tf.reduce_sum(tf.square(total), name="loss")
        train_op = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=gs)
        names = ["a:0", "c:0", "sum:0"]
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=0, dump_every_n_steps=1,
                        samples_per_group=4, strict=True)
        xv = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            wv = sess.run_step_fn(lambda step_context: step_context.session.run(w))
            sess.run(train_op, {x: xv})
    run = inspector.open_run(tmp_path / "run")
    stored = load_file(str(tmp_path / "run" / dump_name("chief", 1, 1)))
    assert sum(k in stored for k in ("gradient/a:0", "gradient/c:0", "gradient/sum:0")) == 1, sorted(stored)
    expected = 2 * (xv @ wv + np.tanh(xv))  # d sum(s^2) / d s, and the add passes it to a and c
    for name in names:
        np.testing.assert_allclose(run.tensor(name, 1, "gradient"), expected, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(run.tensor("c:0", 1), np.tanh(xv), rtol=1e-6)


def _numpy_stats(a: np.ndarray) -> dict:
    fin = a[np.isfinite(a)]
    return {"count": a.size, "mean": fin.mean(), "std": fin.std(), "min": fin.min(), "max": fin.max(),
            "l2": np.sqrt((fin.astype(np.float64) ** 2).sum()), "zero_fraction": (a == 0).mean(),
            "nan": np.isnan(a).sum(), "inf": np.isinf(a).sum()}


QS = np.linspace(0, 1, 41)


def check_quantiles(got, values: np.ndarray, what: str) -> None:
    """Each quantile of ``got`` (one row of run.quantiles) within the stated relative error of
    numpy's (method 'lower': the value of rank floor(q (n - 1)), which the bound is about)."""
    from inspector.format.loghist import RELATIVE_ERROR
    v = np.asarray(values, np.float64).ravel()
    want = np.quantile(v[np.isfinite(v)], QS, method="lower")
    est = got[[f"q{q:g}" for q in QS]].to_numpy()[0]
    assert got.attrs["relative_error"] == RELATIVE_ERROR
    bound = RELATIVE_ERROR * np.abs(want) * (1 + 1e-12)
    assert np.all(np.abs(est - want) <= bound), (what, np.max(np.abs(est - want) / np.maximum(np.abs(want), 1e-300)))


@pytest.mark.parametrize("hist_max", [None, 500])
def test_statistics_equal_numpy_on_dumped_tensors(tmp_path, monkeypatch, hist_max):
    from inspector.format import layout as fmt
    if hist_max:  # histograms of tensors above hist_max elements: every k-th element of each sample
        monkeypatch.setattr(fmt, "HIST_MAX_ELEMENTS", hist_max)
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, positive=lambda y: tf.equal(y, 1), stats_every_n_steps=2,
                        dump_every_n_steps=2, samples_per_group=BATCH, strict=True)
        train(m, hook, 2)
    run = inspector.open_run(tmp_path / "run")
    stats = run.query_stats(steps=(2, 2))
    groups = run.samples(2)["group"].to_numpy()
    checked = subsampled = 0
    for name in WATCH:
        for kind in ("forward", "gradient"):
            a = np.asarray(run.tensor(name, 2, kind), np.float64)
            strided = fmt.hist_sample(a, len(a))  # every value, or every k-th block of each sample
            subsampled += strided.size < a.size
            for group, rows in (("all", slice(None)), ("positive", groups == "positive"), ("negative", groups == "negative")):
                row = stats[(stats.tensor == name) & (stats.kind == kind) & (stats.group == group)].iloc[0]
                ref = _numpy_stats(a[rows])
                for col, value in ref.items():
                    np.testing.assert_allclose(row[col], value, rtol=2e-5, atol=1e-7, err_msg=f"{name} {kind} {group} {col}")
                want = LogHistogram.of(strided[rows])
                assert list(row["hist_bucket"]) == want.index.tolist(), (name, kind, group)
                assert list(row["hist_count"]) == want.count.tolist() and want.total == np.isfinite(strided[rows]).sum()
                check_quantiles(run.quantiles(name, (2, 2), kind, group, QS), strided[rows], f"{name} {kind} {group}")
                checked += 1
    assert checked == len(WATCH) * 2 * 3
    assert (subsampled > 0) == bool(hist_max)


def test_no_gradient_tensors_are_marked_not_zero(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        train(m, hook, 1)
    run = inspector.open_run(tmp_path / "run")
    assert not run.tensors.loc["probs:0", "has_gradient"] and run.tensors.loc["fc/logits:0", "has_gradient"]
    assert "gradient/probs:0" not in run.dump_keys(1) and "forward/probs:0" in run.dump_keys(1)
    assert run.stats.query("tensor == 'probs:0' and kind == 'gradient'").empty
    with pytest.raises(inspector.NoDumpError, match="no gradient"):
        run.tensor("probs:0", 1, "gradient")


def test_default_filters_leave_out_backward_optimizer_and_ints(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        v1.summary.scalar("loss_summary", m.loss)
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, strict=True)
        train(m, hook, 1)
    names = list(inspector.open_run(tmp_path / "run").tensors.index)
    assert set(WATCH) <= set(names) and "loss:0" in names
    assert not [n for n in names if "gradients" in n or "GradientDescent" in n or "summary" in n.lower()]
    assert "labels:0" not in names  # int32: not captured


def test_include_exclude_and_op_type_filters(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, include=r"^conv", exclude=r"conv2", op_types=["Relu"], strict=True)
        train(m, hook, 1)
    assert list(inspector.open_run(tmp_path / "run").tensors.index) == ["conv1/relu:0"]


def test_a_filter_pattern_that_matches_no_name_is_warned_about(caplog):
    """Keras 3's input name (^data:0$) given under tf.keras 2.15
    (IteratorGetNext:0) excluded nothing, silently. A pattern that matches no tensor name of
    the graph (backward ops and all) is a typo: warned, naming it and some real names."""
    with tf.Graph().as_default() as g:
        build_cnn()
        with caplog.at_level(logging.WARNING, logger="tf_inspector"):
            capture.select_tensors(g, include=[r"^conv", r"^nothing_here"], exclude=[r"^data:0$", r"gradients/"])
    warned = [r.getMessage() for r in caplog.records if r.name == "tf_inspector"]
    assert len(warned) == 2 and "'^nothing_here'" in warned[0] and "'^data:0$'" in warned[1]
    assert "conv1/" in warned[0]   # real names to compare with


def test_schedule_dumps_exactly_the_steps_asked(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=4, dump_every_n_steps=5,
                        dump_steps=[2, "7:8"], strict=True)
        train(m, hook, 12)
    run = inspector.open_run(tmp_path / "run")
    assert run.steps == [2, 5, 7, 8, 10]
    assert sorted(run.stats.step.unique()) == [4, 8, 12]


def test_sample_budget_holds(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=0, dump_every_n_steps=1,
                        samples_per_group=1, strict=True)
        train(m, hook, 3)
    run = inspector.open_run(tmp_path / "run")
    for step in run.steps:
        s = run.samples(step)
        assert sorted(s["group"]) == ["negative", "positive"]
        labels = batch_labels(step)
        assert list(s["index"]) == sorted([int(np.argmax(labels == 1)), int(np.argmax(labels == 0))])
        assert run.tensor("conv1/relu:0", step).shape[0] == 2
        np.testing.assert_array_equal(run.tensor("x:0", step), batch_images(step)[s["index"]])
        weights = run.tensors.query("op_type == 'ReadVariableOp'").index[0]  # not batched: dumped whole
        assert list(run.tensor(weights, step).shape) == run.tensors.loc[weights, "shape"]


def test_byte_budget_drops_dumps_and_records_them(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=0, dump_every_n_steps=1,
                        max_bytes=60_000, strict=True)
        train(m, hook, 6)
    run = inspector.open_run(tmp_path / "run")
    assert 0 < len(run.steps) < 6 and run.dropped["count"].sum() == 6 - len(run.steps)
    assert sum(p.stat().st_size for p in (tmp_path / "run" / "dumps").iterdir()) <= 60_000


def test_nonfinite_is_found_and_next_step_dumped(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=0,
                        dump_on_nonfinite=True, strict=True)
        train(m, hook, 5, nan_at=3)
    run = inspector.open_run(tmp_path / "run")
    nf = run.first_nonfinite()
    assert nf["step"] == 3 and nf["tensor"] == "x:0"
    assert run.manifest["first_nonfinite"]["step"] == 3
    # the NaN step itself is dumped from the same run (the next run may never come), and the next
    assert run.steps == [3, 4]
    assert np.isnan(run.tensor("x:0", 3)).any() and not np.isnan(run.tensor("x:0", 4)).any()
    assert run.dump_metadata(3)["reason"] == "NaN/Inf in the loss"
    scheduled = [k for k in run.dump_keys(4) if not k.startswith("update/")]  # updates need a read before
    assert set(run.dump_keys(3)) == set(scheduled)                     # the packed dump unpacks whole
    for key in scheduled:
        assert run.dump_array(3, key).shape == run.dump_array(4, key).shape, key
    kept = run.samples(3)                                              # step 3's own kept samples
    np.testing.assert_array_equal(kept["label"], batch_labels(3)[kept["index"]])
    assert sorted(kept["group"]) == ["negative"] * 2 + ["positive"] * 2
    assert run.dump_metadata(4)["reason"] == "after NaN/Inf"


def test_marked_loss_and_labels_need_no_names(tmp_path):
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="y")
        loss = conv_net(x, y)
        mark(loss=loss, labels=y, positive=lambda t: tf.equal(t, 0))  # negatives of class 1 this time
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: batch_images(1), y: batch_labels(1)})
    run = inspector.open_run(tmp_path / "run")
    assert run.manifest["loss"] == "loss:0" and run.manifest["labels"] == "y:0"
    s = run.samples(1)
    assert (s["group"] == np.where(s["label"] == 0, "positive", "negative")).all()
    # the rule the groups came from (the marked one, not the default label != 0)
    assert run.manifest["groups"]["rule"] == "positive/negative by hooks.mark(positive=...)"


def test_errors_degrade_unless_strict(tmp_path, caplog):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels="no_such_labels", stats_every_n_steps=1)
        train(m, hook, 2)  # training goes on
        assert hook._disabled
        assert "the hook is disabled and training continues" in caplog.text  # said through logging
        caplog.clear()
        train(m, hook, 1)   # a new session with the same hook: still disabled, and it says so
    said = [r.getMessage() for r in caplog.records if "disabled by an earlier error" in r.getMessage()]
    assert len(said) == 1 and "no_such_labels" in said[0] and "create a new DumpHook" in said[0]
    with tf.Graph().as_default():
        m = build_cnn()
        with pytest.raises(ValueError, match="no_such_labels"):
            train(m, DumpHook(tmp_path / "run2", labels="no_such_labels", strict=True), 1)


@pytest.mark.parametrize("strict", [True, False])
def test_a_global_step_training_never_advances_is_refused(tmp_path, strict, caplog):
    """minimize(loss) without global_step= in a graph that has one. Every
    row carried step 0 (the schedule counted runs, later dumps were dropped as a second dump
    of step 0; under a loss-scale optimizer nothing was written). Refused, saying what to pass."""
    with tf.Graph().as_default():
        v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 4], name="x")
        w = v1.get_variable("w", [4, 1], tf.float32)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss)   # no global_step=
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, strict=strict)
        if strict:
            with pytest.raises(ValueError, match="global_step:0.*no op adds to.*global_step= to minimize.*mode='eval'"):
                v1.train.MonitoredSession(hooks=[hook])
            return
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(3):
                sess.run(train_op, {x: np.ones((BATCH, 4), np.float32)})
    assert hook._disabled and "no op adds to" in caplog.text
    assert not (tmp_path / "r").exists() or not inspector.open_run(tmp_path / "r").steps


def test_a_reference_variables_read_is_not_captured(tmp_path):
    """A reference (non-resource) variable's ``w/read`` shares the
    variable's buffer, which the optimizer updates in place during the same run, so its dump
    held the weights after the update (the forward pass used those before). Skipped, with the
    reason; a resource variable's read on the loss's path is still captured, exact."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 4], name="x")
        ref = v1.get_variable("ref", [4, 1], tf.float32, use_resource=False)
        res = v1.get_variable("res", [1, 1], tf.float32, use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.matmul(x, ref), res) - 1.0), name="loss")
        train_op = v1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=gs)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_steps=[1], samples_per_group=BATCH)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            weights = sess.run_step_fn(lambda step_context: step_context.session.run([ref, res]))
            sess.run(train_op, {x: np.ones((BATCH, 4), np.float32)})
    run = inspector.open_run(tmp_path / "r")
    assert "ref/read:0" in run.manifest["skipped"] and "ref/read:0" not in run.tensors.index
    np.testing.assert_array_equal(run.tensor("MatMul_1/ReadVariableOp:0", 1), weights[1])   # before the update


@pytest.mark.parametrize("how", ["assign", "v1_cond"])
def test_a_global_step_training_advances_otherwise_is_not_refused(tmp_path, how):
    """The refusal of a global step 'no op adds to' looked for an
    AssignAdd whose input is the variable itself. ``tf.group(minimize(loss), assign(gs, gs + 1))``
    advances it by an Assign, and an apply_gradients(global_step=) inside a v1 cond (a step
    applied only while its gradients are finite, under v1 control flow) reaches it through a
    Switch: both were refused, saying training never advances the step, where before every row
    carried its own step (1, 2, 3). Recorded, one row per step."""
    if how == "v1_cond":
        v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            gs = v1.train.get_or_create_global_step()
            x = v1.placeholder(tf.float32, [BATCH, 4], name="x")
            w = v1.get_variable("w", [4, 1], tf.float32, use_resource=True)
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0), name="loss")
            opt = v1.train.GradientDescentOptimizer(0.1)
            if how == "assign":
                train_op = tf.group(opt.minimize(loss), v1.assign(gs, gs + 1))
            else:
                grads = opt.compute_gradients(loss)
                finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g, _ in grads])

                def apply():
                    with tf.control_dependencies([opt.apply_gradients(grads, global_step=gs)]):
                        return tf.constant(True)
                train_op = tf.cond(finite, apply, lambda: tf.constant(False))
            hook = DumpHook(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                for _ in range(3):
                    sess.run(train_op, {x: np.ones((BATCH, 4), np.float32)})
    finally:
        v1.enable_control_flow_v2()
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.query_stats(["loss:0"], groups=["all"], kinds=["forward"])["step"]) == [1, 2, 3]


def test_a_reference_variables_read_through_reshapes_is_not_captured_after_the_update(tmp_path):
    """``w/read`` of a reference variable the step updates is
    skipped (it shares the variable's buffer, updated in place), but Reshape, ExpandDims,
    Squeeze, StopGradient, CheckNumerics (and others) of it pass that buffer on unchanged: their
    dumps held the weights after the update, to the bit. Each is skipped, with the reason, or
    holds the weights the step used."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 4], name="x")
        ref = v1.get_variable("ref", [4, 1], tf.float32, use_resource=False)
        views = [tf.reshape(ref, [4], name="flat"), tf.expand_dims(ref, 0, name="expanded"),
                 tf.squeeze(ref, 1, name="squeezed"), tf.stop_gradient(ref, name="stopped"),
                 tf.debugging.check_numerics(ref, "ref", name="checked")]
        extra = tf.add_n([tf.reduce_sum(v) for v in views[1:]])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, tf.reshape(views[0], [4, 1])) - 1.0)) + 0.0 * extra
        train_op = v1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=gs)
        hook = DumpHook(tmp_path / "r", stats_every_n_steps=0, dump_steps=[1], samples_per_group=BATCH, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            before = sess.run_step_fn(lambda step_context: step_context.session.run(ref))
            sess.run(train_op, {x: np.ones((BATCH, 4), np.float32)})
    run = inspector.open_run(tmp_path / "r")
    for v in views:
        if v.name in run.tensors.index:
            np.testing.assert_array_equal(np.asarray(run.tensor(v.name, 1)).reshape(-1), before.reshape(-1),
                                          err_msg=v.name)
        else:
            assert v.name in run.manifest["skipped"], v.name


def test_writer_failure_does_not_stop_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the run directory should go")
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(blocker / "run", labels=m.y, stats_every_n_steps=1)
        train(m, hook, 3)
        assert hook._disabled


def test_worker_names_files_and_reads_tf_config(tmp_path, monkeypatch):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, worker="worker-1",
                        strict=True)
        train(m, hook, 1)
    run = inspector.open_run(tmp_path / "run")
    assert run.workers == ["worker-1"] and (tmp_path / "run" / "dumps" / "worker-1.s0001.step-0000000001.safetensors").exists()
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}')
    assert worker_from_env() == ("worker-0", False)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}')
    assert worker_from_env() == ("chief-0", True)


def test_tensors_in_v1_while_loops_are_skipped(tmp_path):
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            m = build_cnn()
            loop = v1.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 1.5), [tf.constant(0), m.loss])
            total = tf.identity(loop[1], name="looped")
            hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                sess.run([m.train_op, total], m.feed(1))
    finally:
        v1.enable_control_flow_v2()
    run = inspector.open_run(tmp_path / "run")
    skipped = run.manifest["skipped"]   # besides the loop's body: the variables' unordered own reads
    assert any("while" in n for n in skipped)
    assert all("while" in n or n.endswith("/w/Read/ReadVariableOp:0") for n in skipped)
    assert "looped:0" in run.tensors.index and run.steps == [1]
    # the loop's Exit is its result, outside the loop (not "inside a while body"): captured,
    # the value of what it feeds
    assert "while/Exit_1:0" not in run.manifest["skipped"]
    np.testing.assert_array_equal(run.tensor("while/Exit_1:0", 1), run.tensor("looped:0", 1))


def test_a_tf2_loops_body_is_listed_as_skipped(tmp_path):
    """A TF2 while loop (a Keras LSTM's, in a model_fn) runs its body in a function: its ops are
    not the graph's and cannot be fetched: listed as skipped (the backward pass's own loop
    not), and the loop's result is captured."""
    with tf.Graph().as_default():
        m = build_cnn()
        _, looped = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, tf.tanh(a * 1.5, name="step")),
                                  [tf.constant(0), m.loss], name="loop")
        total = tf.identity(looped, name="looped")
        train = v1.train.GradientDescentOptimizer(0.01).minimize(total, global_step=v1.train.get_global_step())
        hook = DumpHook(tmp_path / "run", loss=total, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=0,
                        strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train, m.feed(1))
    run = inspector.open_run(tmp_path / "run")
    body = [n for n in run.manifest["skipped"] if n.startswith("loop/body/")]
    assert any("step" in n for n in body), run.manifest["skipped"]
    assert not any("gradients" in n for n in run.manifest["skipped"])
    assert not set(body) & set(run.tensors.index) and "looped:0" in run.tensors.index


def test_v1_control_flow_is_skipped_with_the_reason_and_its_results_are_not():
    """A v1 cond's branches and a v1 loop's body cannot be fetched, and say so; what comes
    out of them (the cond's Merge, an outermost loop's Exit) can, and is selected. The Exit
    of a loop inside another loop's body is inside that body."""
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as g:
            x = v1.placeholder(tf.float32, [None, 3], name="x")
            c = tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: tf.tanh(x), name="c")
            inner = lambda a: tf.while_loop(lambda j, b: j < 2, lambda j, b: (j + 1, b * 2.0), [0, a], name="inner")[1]  # noqa: E731
            tf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, inner(a)), [0, c], name="outer")
            sel = capture.select_tensors(g)
    finally:
        v1.enable_control_flow_v2()
    chosen = {t.name for t in sel.tensors}
    assert {"c/Merge:0", "outer/Exit_1:0"} <= chosen and "outer/inner/Exit_1:0" in sel.skipped
    assert {"c/mul:0", "c/Tanh:0", "outer/inner/mul:0"} <= set(sel.skipped) and not sel.aliases
    assert {sel.reasons[n] for n in sel.skipped} == {capture.IN_V1_BODY}



def test_a_v1_loop_that_changes_state_is_not_run_by_the_hook(tmp_path):
    """Since a v1 loop's Exit is captured, the hook fetched it in every
    sampled step, and so ran the loop where training never does: here a loop whose result only
    the user's own, occasional op assigns, and whose body increments a counter. A loop's result
    is captured where the loss needs it (training runs the loop anyway) or where its loop
    changes nothing (TensorArray/stack plumbing and reads only); else skipped, saying why."""
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default() as g:
            m = build_cnn()
            calls = v1.get_variable("calls", [], tf.float32, initializer=v1.zeros_initializer(), trainable=False,
                                    use_resource=True)
            snapshot = v1.get_variable("snapshot", [], tf.float32, initializer=v1.zeros_initializer(), trainable=False,
                                       use_resource=True)

            def body(i, a):
                with tf.control_dependencies([calls.assign_add(1.0)]):
                    return i + 1, a * 0.5
            _, result = v1.while_loop(lambda i, a: i < 2, body, [0, tf.constant(8.0)], name="refresh")
            snapshot.assign(result, read_value=False)   # the user runs this now and then; training never
            v1.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * 0.5), [0, tf.constant(8.0)], name="pure")
            read = calls.read_value()
            sel = capture.select_tensors(g, loss=m.loss, fetched=True)
            hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                for step in range(2):
                    sess.run(m.train_op, m.feed(step))
                count = sess.run_step_fn(lambda step_context: step_context.session.run(read))
    finally:
        v1.enable_control_flow_v2()
    assert count == 0
    assert "refresh/Exit_1:0" in sel.skipped and "AssignAddVariableOp" in sel.reasons["refresh/Exit_1:0"]
    assert "pure/Exit_1:0" in {t.name for t in sel.tensors}
    run = inspector.open_run(tmp_path / "run")
    assert "refresh/Exit_1:0" in run.manifest["skipped"] and "pure/Exit_1:0" in run.tensors.index


def test_the_hook_runs_no_assignment_training_does_not(tmp_path):
    """``v.assign_add(1.0)`` returns a read gated on the assignment; the
    hook captured that read, so every sampled step ran the user's occasional assignment (a
    counter training never bumped read 5 after 5 runs). A tensor whose fetch would run a
    stateful op training does not run (the loss, UPDATE_OPS and TRAIN_OP do not need it) is
    skipped, saying why; batch norm's moving averages (UPDATE_OPS) are captured as before."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="y")
        # a moving average as batch norm keeps one (tf.nn and variables only: no v1 layers in Keras 3)
        moving = v1.get_variable("moving_mean", [], tf.float32, initializer=v1.zeros_initializer(),
                                 trainable=False, use_resource=True)
        with tf.name_scope("AssignMovingAvg"):
            update = moving.assign(0.9 * moving + 0.1 * tf.reduce_mean(x), read_value=False)
            with tf.control_dependencies([update]):
                tf.identity(moving.read_value(), name="after")   # computed by running the update
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, update)
        loss = conv_net(x, y)
        counter = v1.get_variable("counter", [], tf.float32, initializer=v1.zeros_initializer(), trainable=False,
                                  use_resource=True)
        counter.assign_add(1.0, name="bump")   # an op the user runs now and then, training never
        read = counter.read_value()
        gated = [op.outputs[0].name for op in tf.compat.v1.get_default_graph().get_operations()
                 if any(c.type == "AssignAddVariableOp" for c in op.control_inputs)]   # the read bump returns
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        tf.compat.v1.get_default_graph().clear_collection(v1.GraphKeys.TRAIN_OP)   # UPDATE_OPS alone says it
        hook = DumpHook(tmp_path / "run", loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=1,
                        strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(3):
                sess.run(train_op, {x: batch_images(step), y: batch_labels(step)})
            count = sess.run_step_fn(lambda step_context: step_context.session.run(read))
    assert count == 0
    run = inspector.open_run(tmp_path / "run")
    assert gated and set(gated) <= set(run.manifest["skipped"])
    assert "AssignMovingAvg/after:0" in run.tensors.index and run.steps == [1, 2, 3]


def test_the_skip_reason_of_a_racy_read_says_where_its_value_is(caplog):
    """A read off the loss's path of a variable the step updates is skipped; the reason points
    at the variable's record, which holds the value the step used. A non-trainable variable (a
    moving mean) has no record: its reason says so instead of pointing at a record that is not
    there."""
    with tf.Graph().as_default() as g:
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="y")
        moving = v1.get_variable("bn/moving_mean", [], tf.float32, initializer=v1.zeros_initializer(),
                                 trainable=False, use_resource=True)
        update = moving.assign(0.9 * moving + 0.1 * tf.reduce_mean(x), read_value=False)
        loss = conv_net(x, y)
        with tf.control_dependencies([update]):
            v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
        sel = capture.select_tensors(g, loss=loss, fetched=True)
    assert "the variable's record holds the value the step used" in sel.reasons["conv1/w/Read/ReadVariableOp:0"]
    why = sel.reasons["bn/moving_mean/Read/ReadVariableOp:0"]
    assert "not trainable, so it has no variable record" in why and "record holds" not in why
    # the log says it once per kind of reason, not once per variable; each tensor is listed
    trainable = [n for n, r in sel.reasons.items() if "record holds" in r]
    assert len(trainable) >= 2, sel.reasons
    with caplog.at_level(logging.INFO, logger="tf_inspector"):
        capture.log_unfetchable(sel)
    racy = [r.getMessage() for r in caplog.records if "which the training step writes" in r.getMessage()]
    assert len(racy) == 2, racy
    assert all(n in next(m for m in racy if "record holds" in m) for n in trainable), racy


def test_a_read_in_no_order_with_the_update_is_not_captured(tmp_path):
    """A variable's own Read/ReadVariableOp (its graph element, which the
    forward pass does not use) is in no order with the optimizer's update in the same run; its
    recorded value differed from the weights the step used in 1 of 40 steps. Such a read is
    skipped, saying why; the read the convolution uses (before the update) is captured."""
    with tf.Graph().as_default() as g:
        m = build_cnn()
        sel = capture.select_tensors(g, loss=m.loss, fetched=True)
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        train(m, hook, 2)
    assert "conv1/w/Read/ReadVariableOp:0" in sel.skipped
    assert "conv1/w" in sel.reasons["conv1/w/Read/ReadVariableOp:0"]
    run = inspector.open_run(tmp_path / "run")
    assert "conv1/w/Read/ReadVariableOp:0" in run.manifest["skipped"] and "Conv2D/ReadVariableOp:0" in run.tensors.index


def test_a_v1_loop_result_the_loss_does_not_use_has_no_gradient(tmp_path):
    """tf.gradients through a v1 loop gives an unused loop result zeros
    (ZerosLikeForExit), and so does what only feeds it: the captured Exit read has_gradient
    with an all-zero gradient, where docs/guide/attach.md promises "no gradient, never zeros"."""
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            m = build_cnn()
            flat = v1.get_default_graph().get_tensor_by_name("flat:0")
            side = tf.multiply(flat, 2.0, name="side")   # feeds only the loop variable the loss does not use
            _, used, unused = v1.while_loop(lambda i, a, b: i < 2, lambda i, a, b: (i + 1, a * 1.5, b + a),
                                            [0, flat, side], name="loop")
            loss = tf.add(m.loss, tf.reduce_mean(used), name="total")
            train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=m.global_step)
            hook = DumpHook(tmp_path / "run", loss=loss, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1,
                            strict=True)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                sess.run(train_op, m.feed(1))
    finally:
        v1.enable_control_flow_v2()
    cat = inspector.open_run(tmp_path / "run").tensors
    assert cat.loc[used.name, "has_gradient"]
    assert not cat.loc[unused.name, "has_gradient"] and not cat.loc["side:0", "has_gradient"]

def _cond_model(xv: np.ndarray, w: np.ndarray):
    """x @ w through a TF2 tf.cond (a tensor predicate), a loss and an optimizer."""
    x = v1.placeholder(tf.float64, [None, 3], name="x")
    h = tf.matmul(x, v1.get_variable("w", initializer=w), name="h")
    c = tf.cond(tf.reduce_sum(h) > 0, lambda: h * 2.0, lambda: tf.tanh(h), name="cond")
    loss = tf.reduce_sum(c, name="loss")
    return x, v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())


def test_a_tf2_cond_output_is_captured_as_its_identity_not_skipped(tmp_path, caplog):
    """A TF2 tf.cond's If op is marked not fetchable by TensorFlow, and
    its output cond:0 was listed as skipped "inside while/cond bodies", although tf.cond
    returns it through cond/Identity, which is captured: the same value, not a skipped tensor."""
    caplog.set_level(logging.INFO, logger="tf_inspector")
    rng = np.random.default_rng(5)
    xv, w = np.abs(rng.normal(size=(4, 3))), np.abs(rng.normal(size=(3, 2)))   # the true branch
    with tf.Graph().as_default():
        x, train_op = _cond_model(xv, w)
        hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=4,
                        strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: xv})
    run = inspector.open_run(tmp_path / "run")
    # skipped: the variable's own read, in no order with the update, and what runs inside the
    # branches' functions (test_a_tf2_loops_body_is_listed_as_skipped); not the cond's output
    skipped = run.manifest["skipped"]
    branches = [n for n in skipped if n.startswith(("cond/then_branch/", "cond/else_branch/"))]
    assert branches and [n for n in skipped if n not in branches] == ["w/Read/ReadVariableOp:0"]
    assert "cond:0" not in run.tensors.index
    index = np.asarray(run.samples(1)["index"])
    np.testing.assert_allclose(run.tensor("cond/Identity:0", 1), 2 * (xv @ w)[index], rtol=1e-12)
    np.testing.assert_allclose(run.tensor("cond/Identity:0", 1, "gradient"), 1.0)
    assert "cond:0 as cond/Identity:0" in caplog.text
    assert not [r for r in caplog.records if r.getMessage().startswith("skipping") and " cond:0" in r.getMessage()]


def test_a_tf2_cond_output_whose_identity_is_filtered_out_says_so():
    """Where the filters leave out the Identity, cond:0 is skipped: the reason is the TF2 cond
    and names the tensor holding its value, not "inside while/cond bodies"."""
    with tf.Graph().as_default() as g:
        _cond_model(np.ones((1, 3)), np.ones((3, 2)))
        sel = capture.select_tensors(g, exclude=r"Identity")
    assert sel.skipped == ["cond:0"] and not sel.aliases
    assert "TF2 cond" in sel.reasons["cond:0"] and "cond/Identity:0" in sel.reasons["cond:0"]


def test_tensors_after_a_tf2_while_loop_are_captured(tmp_path):
    """The gradient of a TF2 while loop adds accumulator inputs from the
    'gradients/' scope to the forward While op, and everything after the loop (the logits, the
    loss) was taken for backward ops and silently left out. Now captured, values and gradients
    exact (d loss / d a of loss = sum(a @ w2) is w2's row sums)."""
    rng = np.random.default_rng(3)
    xv, w1, w2 = rng.normal(size=(4, 3)), rng.normal(size=(3, 5)), rng.normal(size=(5, 2))
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 3], name="x")
        h = tf.matmul(x, v1.get_variable("w1", initializer=w1), name="h")
        _, a = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, 0.9 * a + tf.tanh(a)), [tf.constant(0), h])
        a = tf.identity(a, name="a")
        loss = tf.reduce_sum(tf.matmul(a, v1.get_variable("w2", initializer=w2)), name="loss")
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=4,
                        strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op, {x: xv})
    run = inspector.open_run(tmp_path / "run")
    assert {"a:0", "loss:0"} <= set(run.tensors.index)
    ref = xv @ w1
    for _ in range(3):
        ref = 0.9 * ref + np.tanh(ref)
    index = np.asarray(run.samples(1)["index"])
    np.testing.assert_allclose(run.tensor("a:0", 1), ref[index], rtol=1e-12)
    np.testing.assert_allclose(run.tensor("a:0", 1, "gradient"), np.tile(w2.sum(1), (len(index), 1)), rtol=1e-12)
    assert run.query_stats(["loss:0"], kinds=["forward"])["mean"].iloc[0] == pytest.approx((ref @ w2).sum())


def test_a_gradient_penalty_in_the_forward_pass_is_captured(tmp_path):
    """A WGAN-GP penalty takes tf.gradients inside the forward pass, and the
    ops after it (the penalty, the loss) were taken for backward ops and silently left out.
    What the loss is computed from, outside a gradients scope, is forward: captured, exact."""
    rng = np.random.default_rng(4)
    xv, wv = rng.normal(size=(4, 3)), rng.normal(size=(3, 1))
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float64, [None, 3], name="x")
        d = tf.matmul(tf.tanh(x), v1.get_variable("w", initializer=wv), name="d")
        penalty = tf.reduce_mean(tf.square(tf.norm(tf.gradients(d, x)[0], axis=1) - 1), name="penalty")
        loss = tf.add(tf.reduce_mean(d), penalty, name="loss")
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train, {x: xv})
    run = inspector.open_run(tmp_path / "run")
    grad_x = (1 - np.tanh(xv) ** 2) * wv.T                    # d d / d x, row by row
    want = np.mean((np.linalg.norm(grad_x, axis=1) - 1) ** 2)
    np.testing.assert_allclose(run.tensor("penalty:0", 1), want, rtol=1e-12)
    np.testing.assert_allclose(run.tensor("loss:0", 1), np.mean(np.tanh(xv) @ wv) + want, rtol=1e-12)
    np.testing.assert_allclose(run.tensor("penalty:0", 1, "gradient"), 1.0)
    np.testing.assert_allclose(run.tensor("d:0", 1, "gradient"), np.full((4, 1), 0.25))


def test_an_unseen_loss_behind_a_tf1_while_loop_is_explained(tmp_path, caplog):
    """Under v1 control flow the optimizer's backward pass through a while loop is not recorded
    (it needs the loop's state), so no loss is found: the warning says why and what to pass."""
    v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            x = v1.placeholder(tf.float32, [None, 3], name="x")
            h = tf.matmul(x, v1.get_variable("w1", [3, 5]), name="h")
            _, a = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, tf.tanh(a)), [tf.constant(0), h])
            loss = tf.reduce_sum(a, name="loss")
            train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
            hook = DumpHook(tmp_path / "run", stats_every_n_steps=1)
            with v1.train.MonitoredSession(hooks=[hook]) as sess:
                sess.run(train_op, {x: np.ones((2, 3), np.float32)})
    finally:
        v1.enable_control_flow_v2()
    assert "no loss found" in caplog.text and "TF1 while loop" in caplog.text


def test_monitored_training_session_path(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=2, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], checkpoint_dir=None) as sess:
            for step in range(1, 5):
                sess.run(m.train_op, m.feed(step))
    run = inspector.open_run(tmp_path / "run")
    assert run.status == "finished" and run.steps == [2, 4]
    assert set(run.stats.group.unique()) == {"all", "positive", "negative"}


def test_nonfinite_loss_is_caught_between_stats_steps(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=0, dump_every_n_steps=0,
                        dump_on_nonfinite=True, strict=True)
        train(m, hook, 4, nan_at=2)
    run = inspector.open_run(tmp_path / "run")
    assert run.manifest["first_nonfinite"] == {"step": 2, "tensor": "loss:0", "kind": "forward", "source": "loss check"}
    assert run.steps == [2, 3]  # the NaN step from its own run, then the next
    assert np.isnan(run.tensor("x:0", 2)).any()
