"""Variable records: d loss / d variable over every read, value, and the step's update, against
tf.gradients and values read around the training run."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector import analysis, cli  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, conv_net  # noqa: E402

v1 = tf.compat.v1
LR, DECAY, STEPS = 0.1, 0.01, 3


@pytest.fixture(scope="module")
def decayed(tmp_path_factory):
    """conv_net plus L2 weight decay on every weight, plain SGD; per step the oracle's
    tf.gradients(loss, w) and w before the step, and w after the last step."""
    path = tmp_path_factory.mktemp("vars") / "run"
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        xent = conv_net(x, y)
        weights = v1.trainable_variables()
        loss = tf.add(xent, DECAY * tf.add_n([tf.nn.l2_loss(w) for w in weights]), name="total_loss")
        train_op = v1.train.GradientDescentOptimizer(LR).minimize(loss, global_step=gs)
        oracle = {w.op.name: tf.gradients(loss, w)[0] for w in weights}
        values = {w.op.name: w.read_value() for w in weights}
        hook = DumpHook(path, loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        seen = {}
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(1, STEPS + 1):
                feed = {x: batch_images(step), y: batch_labels(step)}
                seen[step] = sess.run_step_fn(lambda step_context: step_context.session.run((oracle, values), feed))
                sess.run(train_op, feed)
            seen[STEPS + 1] = (None, sess.run_step_fn(lambda step_context: step_context.session.run(values)))
    return inspector.open_run(path), seen


def test_variable_gradient_sums_every_read(decayed):
    run, seen = decayed
    assert set(run.variables.index) == {"conv1/w", "conv2/w", "fc/w"}
    for step in range(1, STEPS + 1):
        for name, grad in seen[step][0].items():
            np.testing.assert_allclose(run.tensor(name, step, "gradient"), grad, rtol=1e-5, atol=1e-7, err_msg=name)
    # the forward pass's own read misses the weight-decay path: DECAY * w
    conv_read = run.tensors.query("variable == 'conv1/w' and op_type == 'ReadVariableOp'")
    conv_read = [n for n in conv_read.index if "L2Loss" not in n and run.tensors.loc[n, "has_gradient"]][0]
    single = run.tensor(conv_read, 2, "gradient")
    assert not np.allclose(single, seen[2][0]["conv1/w"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(seen[2][0]["conv1/w"] - single, DECAY * seen[2][1]["conv1/w"], rtol=1e-4, atol=1e-7)


def test_variable_value_and_update_are_before_and_after_the_step(decayed):
    run, seen = decayed
    for step in range(1, STEPS + 1):
        for name, before in seen[step][1].items():
            after = seen[step + 1][1][name]
            np.testing.assert_array_equal(run.tensor(name, step), before, err_msg=name)
            update = run.tensor(name, step, "update")
            np.testing.assert_allclose(update, after - before, rtol=1e-6, atol=1e-9, err_msg=name)
            np.testing.assert_allclose(update, -LR * seen[step][0][name], rtol=1e-4, atol=1e-8, err_msg=name)
    stats = run.query_stats(tensors=["fc/w"], kinds=["update"])
    assert list(stats["group"]) == ["all"] * STEPS and list(stats["step"]) == list(range(1, STEPS + 1))
    row = stats.iloc[1]
    update = np.asarray(run.tensor("fc/w", 2, "update"), np.float64)
    assert row["count"] == update.size and row["l2"] == pytest.approx(np.linalg.norm(update), rel=1e-6)
    assert np.asarray(row["hist_count"]).sum() == update.size
    ratios = analysis.update_ratios(run.query_stats(kinds=["forward", "update"]), run.tensors)
    assert ratios.loc[2, "fc/w"] == pytest.approx(np.linalg.norm(update) / np.linalg.norm(seen[2][1]["fc/w"]), rel=1e-5)


def test_reads_name_their_variable_and_info_counts_records(decayed):
    run, _ = decayed
    cat = run.tensors
    row = cat.loc["conv1/w"]
    assert row["kind"] == "variable" and row["op_type"] == "VarHandleOp" and row["has_update"]
    captured = set(cat.index[(cat["variable"] == "conv1/w") & (cat["kind"] == "tensor")])
    # every read, captured or skipped (a read off the loss's path, in no order with the update)
    assert captured and captured <= set(row["reads"]) and set(row["reads"]) - captured <= set(run.manifest["skipped"])
    assert any("L2Loss" in r for r in row["reads"]) and set(row["feeds"]) == {"Conv2D", "L2Loss"}
    assert (cat.loc[cat["op_type"] == "ReadVariableOp", "variable"].notna()).all()
    assert cat.loc["conv1/relu:0", "kind"] == "tensor" and cat.loc["conv1/relu:0", "feeds"] == ["Conv2D"]
    text = cli.summary(run)
    assert "variables  3 trainable (3 with updates), read by" in text
    with pytest.raises(inspector.UnknownTensorError, match="conv1/w"):
        run.tensor("conv1/W", 1)


def test_embedding_gather_gradient_is_densified(tmp_path):
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int32, [4], name="ids")
        emb = v1.get_variable("emb", [6, 3], initializer=v1.random_normal_initializer(seed=4))
        rows = tf.nn.embedding_lookup(emb, ids)
        loss = tf.reduce_sum(tf.square(rows)) + 0.5 * tf.nn.l2_loss(emb)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        oracle = tf.convert_to_tensor(tf.gradients(loss, emb)[0])
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        feed = {ids: np.array([1, 4, 1, 0], np.int32)}
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            expected = sess.run_step_fn(lambda step_context: step_context.session.run(oracle, feed))
            sess.run(train_op, feed)
    run = inspector.open_run(tmp_path / "run")
    np.testing.assert_allclose(run.tensor("emb", 1, "gradient"), expected, rtol=1e-5)
    np.testing.assert_allclose(run.tensor("emb", 1, "update"), -0.1 * expected, rtol=1e-4, atol=1e-7)


def test_filters_apply_to_variable_records(tmp_path):
    from hooks.variables import selected
    assert selected("conv1/w", include="^conv") and not selected("fc/w", include="^conv")
    assert not selected("conv1/w", exclude="w$") and not selected("conv1/w", op_types=["Relu"])
    assert selected("conv1/w", op_types=["Relu", "VarHandleOp"])


def test_viewer_shows_variables(decayed):
    pytest.importorskip("streamlit")
    from test_app import ok, start
    run, _ = decayed
    at = ok(start(run.path.parent, "Training overview", query={"run": run.path.name}, ov_tab="Update / weight ratio"))
    assert "Update / weight ratio per variable" in [s.value for s in at.subheader]
    at = ok(start(run.path.parent, "Tensor browser", query={"run": run.path.name}, tb_search="conv1/w",
                  tb_tensor="conv1/w"))
    kinds = [r for r in at.radio if r.key == "tb_kind"][0]
    assert list(kinds.options) == ["forward", "gradient", "update"]


def test_numpy_statistics_match_numpy_per_array():
    from hooks.variables import numpy_stats
    from inspector.format import hist_sample
    from inspector.format.loghist import LogHistogram
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(3, 3, 4)), np.zeros(0), rng.normal(size=200_000), np.float32([7.0]),
              np.array([np.nan, np.inf, 0.0, 2.0])]
    values, splits, index, count = numpy_stats(arrays)
    hists = [LogHistogram(index[a:b], count[a:b]) for a, b in zip(splits[:-1], splits[1:])]
    for a, v, h in zip(arrays, values, hists):
        x = a.astype(np.float64).ravel()
        f = x[np.isfinite(x)]
        assert v[0] == x.size and v[7] == np.isnan(x).sum() and v[8] == np.isinf(x).sum()
        if not f.size:
            assert np.isnan(v[1:5]).all() and h.total == 0
            continue
        np.testing.assert_allclose(v[1:7], [f.mean(), f.std(), f.min(), f.max(), np.linalg.norm(f), (x == 0).mean()])
        want = LogHistogram.of(hist_sample(a, 1).ravel())   # in the array's own dtype
        assert h.index.tolist() == want.index.tolist() and h.count.tolist() == want.count.tolist()


def test_a_variable_read_by_another_op_type_says_why_it_has_no_gradient(tmp_path):
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", [4, 3], initializer=v1.random_normal_initializer(seed=5))
        picked = tf.raw_ops.ResourceGatherNd(resource=w.handle, indices=[[1], [2]], dtype=tf.float32)
        loss = tf.reduce_sum(tf.square(picked)) + tf.nn.l2_loss(w)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            sess.run(train_op)
    run = inspector.open_run(tmp_path / "run")
    row = run.variables.loc["w"]
    assert not row["has_gradient"] and "ResourceGatherNd" in row["gradient_note"]
    assert run.tensor("w", 1, "update").shape == (4, 3)  # value and update are still recorded
    with pytest.raises(inspector.NoDumpError, match="read by ResourceGatherNd.*no gradient"):
        run.tensor("w", 1, "gradient")


def test_a_read_inside_a_cond_off_the_loss_path_keeps_the_gradient(tmp_path):
    """Canned linear models: their ``zero_fraction`` summary reads each weight inside a TF2 cond
    (an ``If`` op taking the handle), which the loss is not computed from, so it adds nothing to
    d loss / d variable. The record sums the other reads, as tf.gradients(loss, w) does."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 4], name="x")
        w = v1.get_variable("w", [4, 3], initializer=v1.random_normal_initializer(seed=5))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w))) + tf.nn.l2_loss(w)
        tf.cond(tf.reduce_sum(x) > 0, lambda: tf.math.zero_fraction(w), lambda: tf.constant(0.0), name="fraction")
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        oracle = tf.gradients(loss, w)[0]
        assert any(op.type in ("If", "StatelessIf") and w.handle in list(op.inputs)
                   for op in v1.get_default_graph().get_operations())
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, strict=True)
        feed = {x: np.random.default_rng(0).normal(size=(BATCH, 4)).astype(np.float32)}
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            want = sess.run_step_fn(lambda step_context: step_context.session.run(oracle, feed))
            sess.run(train_op, feed)
    run = inspector.open_run(tmp_path / "run")
    assert run.variables.loc["w", "has_gradient"]
    np.testing.assert_allclose(run.tensor("w", 1, "gradient"), want, rtol=1e-5, atol=1e-7)


def test_update_snapshots_stay_private_to_each_hook(tmp_path):
    """The values before a step live in snapshot variables: in no collection (so never saved,
    initialised or waited for by a Scaffold), named apart per hook and worker (a parameter
    server would otherwise share one between workers), and both hooks' updates are right."""
    with tf.Graph().as_default() as g:
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        loss = conv_net(x, y)
        train_op = v1.train.GradientDescentOptimizer(LR).minimize(loss, global_step=gs)
        hooks = [DumpHook(tmp_path / name, loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=1,
                          worker=name, strict=True) for name in ("a", "b")]
        w = v1.trainable_variables()[0]
        with v1.train.MonitoredTrainingSession(hooks=hooks, checkpoint_dir=str(tmp_path / "ckpt"),
                                               save_summaries_steps=None, log_step_count_steps=None) as sess:
            before = sess.run_step_fn(lambda step_context: step_context.session.run(w))
            sess.run(train_op, {x: batch_images(1), y: batch_labels(1)})
            after = sess.run_step_fn(lambda step_context: step_context.session.run(w))
        shared = sorted(op.get_attr("shared_name").decode() for op in g.get_operations()
                        if op.type == "VarHandleOp" and op.name.startswith("tf_inspector"))
    assert len(shared) == 2 * 3 and len(set(shared)) == 6 and {s.split("/")[1] for s in shared} == {"a", "b"}
    saved = [name for name, _ in tf.train.list_variables(str(tmp_path / "ckpt"))]
    assert saved and not [n for n in saved if "tf_inspector" in n]
    for name in ("a", "b"):
        np.testing.assert_allclose(inspector.open_run(tmp_path / name).tensor(w.op.name, 1, "update"),
                                   after - before, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("share", [True, False])
def test_a_sparse_features_float_values_get_their_gradient(tmp_path, share):
    """A SparseTensor from an input pipeline (weighted sparse columns of canned linear models):
    its float values come out of DeserializeSparse, which has no gradient function; tf.gradients
    raised LookupError on reaching it and the hook disabled itself. The values' gradient (and
    the weights') are recorded, from the optimizer's pass or the hook's own."""
    idx = np.array([[0, 1], [1, 0], [1, 3], [2, 2]], np.int64)
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        dense = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
        ds = tf.data.Dataset.from_tensors((dense, tf.SparseTensor(idx, [0.5, 2.0, -1.0, 3.0], [3, 4]))).repeat()
        x, sp = v1.data.make_one_shot_iterator(ds).get_next()   # one op's outputs: x is captured too
        w = v1.get_variable("w", [4, 2], initializer=v1.random_normal_initializer(seed=5))
        loss = tf.reduce_sum(tf.square(tf.sparse.sparse_dense_matmul(sp, w) + tf.matmul(x, w)), name="loss")
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        oracle = tf.gradients(loss, [sp.values, w])
        hook = DumpHook(tmp_path / "run", loss=loss, stats_every_n_steps=1, dump_every_n_steps=1, strict=True,
                        share_gradients=share)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            want = sess.run_step_fn(lambda step_context: step_context.session.run(oracle))
            sess.run(train_op)
    run = inspector.open_run(tmp_path / "run")
    (values,) = [n for n in run.tensors.index if run.tensors.loc[n, "op_type"] == "DeserializeSparse"]
    np.testing.assert_allclose(run.tensor(values, 1, "gradient"), want[0], rtol=1e-6)
    np.testing.assert_allclose(run.tensor("w", 1, "gradient"), want[1], rtol=1e-6)
