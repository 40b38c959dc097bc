"""DumpHook(groups=...): per-class groups and groups from a user function, against numpy over
each group's samples (an Oracle hook fetches the tensors in the same training run), through
MonitoredTrainingSession (TF 2.15 and the latest TF)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from inspector.format import FORMAT_VERSION  # noqa: E402
from inspector.format.loghist import LogHistogram  # noqa: E402
from hooks import DumpHook  # noqa: E402
from hooks.capture.groups import MAX_CLASS_GROUPS, GroupSpec  # noqa: E402

v1 = tf.compat.v1
N, D, C, H = 16, 5, 4, 6
RNG = np.random.default_rng(3)
X = RNG.normal(size=(N, D)).astype(np.float32)
Y = np.array([0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 3, 3, 2, 0, 1, 0], np.int64)
TENSORS = ("hidden:0", "logits:0")


class Oracle(v1.train.SessionRunHook):
    """The values of TENSORS in the training run of step 1."""

    def begin(self) -> None:
        g = v1.get_default_graph()
        self.fetch = {n: g.get_tensor_by_name(n) for n in TENSORS}
        self.seen: dict = {}

    def before_run(self, run_context):
        return None if self.seen else v1.train.SessionRunArgs(self.fetch)

    def after_run(self, run_context, run_values) -> None:
        if not self.seen:
            self.seen = run_values.results


def _train(run_dir, y=Y, label_shape=(None,), **kw) -> dict:
    """One training step of a 2-layer net on (X, y); ``label_shape``: the labels placeholder's
    shape ((None, None): [N, C] with C known at run time; y is fed as [N, 1] then)."""
    batch = label_shape[0]
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [batch, D], name="x")
        labels = v1.placeholder(tf.as_dtype(np.asarray(y).dtype), list(label_shape), name="y")
        feed_y = np.asarray(y).reshape(-1, 1) if len(label_shape) == 2 else y
        w1 = v1.get_variable("w1", initializer=RNG.normal(size=(D, H)).astype(np.float32))
        w2 = v1.get_variable("w2", initializer=RNG.normal(size=(H, C)).astype(np.float32))
        hidden = tf.nn.relu(tf.matmul(x, w1), name="hidden")
        logits = tf.matmul(hidden, w2, name="logits")
        ids = tf.reshape(tf.cast(tf.round(labels), tf.int64), [-1])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
        step = v1.train.get_or_create_global_step()
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
        oracle = Oracle()
        hook = DumpHook(run_dir, loss=loss, labels=labels, stats_every_n_steps=1, dump_every_n_steps=1,
                        strict=True, **{"samples_per_group": N, **kw})
        with v1.train.MonitoredTrainingSession(hooks=[hook, oracle]) as sess:
            sess.run(train, feed_dict={x: X, labels: feed_y})
    return oracle.seen


def _check_against_numpy(run, seen: dict, members: dict[str, np.ndarray]) -> None:
    """Per group: mean, std, min, max and histogram of each tensor equal numpy over its samples."""
    for name in TENSORS:
        df = run.query_stats([name], kinds=["forward"]).set_index("group")
        for group, rows in members.items():
            x = seen[name][rows]
            v = x.astype(np.float64)   # as the statistics sum: a float32 mean near 0 is off by 1e-5 relative
            row = df.loc[group]
            assert row["count"] == x.size
            np.testing.assert_allclose([row["mean"], row["std"], row["min"], row["max"]],
                                       [v.mean(), v.std(), v.min(), v.max()], rtol=1e-5, atol=1e-6)
            want = LogHistogram.of(x)
            assert list(row["hist_bucket"]) == want.index.tolist() and list(row["hist_count"]) == want.count.tolist()
            np.testing.assert_allclose(run.query_stats([name], kinds=["forward"], group=group, columns=["mean"])["mean"],
                                       v.mean(), rtol=1e-5, atol=1e-7 * np.abs(v).max())


def test_per_class_groups_equal_numpy(tmp_path):
    seen = _train(tmp_path / "run", groups="per_class", num_classes=C)
    run = inspector.open_run(tmp_path / "run")
    names = [f"class_{k}" for k in range(C)]
    assert run.groups == ["all", *names]
    assert run.manifest["groups"]["names"] == names and run.manifest["format_version"] == FORMAT_VERSION
    _check_against_numpy(run, seen, {f"class_{k}": Y == k for k in range(C)})
    samples = run.samples(1)
    assert sorted(samples["index"]) == list(range(N))  # the budget (N per class) keeps every sample
    assert list(samples["group"]) == [f"class_{Y[i]}" for i in samples["index"]]
    with pytest.raises(inspector.UnknownGroupError, match="class_0, class_1"):
        run.query_stats(group="positive")
    from inspector import cli
    assert "groups     all, class_0, class_1, class_2, class_3   (per_class: class ids [N])" in cli.summary(run)
    out = tmp_path / "s.csv"
    assert cli.main(["export", str(tmp_path / "run"), "--format", "csv", "--out", str(out), "--group", "class_2"]) == 0
    import pandas as pd
    assert set(pd.read_csv(out)["group"]) == {"class_2"}
    assert cli.main(["export", str(tmp_path / "run"), "--format", "csv", "--out", str(out), "--force",
                     "--group", "class_9"]) == 2  # an unknown group is an error naming the known ones


def test_function_groups_with_predictions_equal_numpy(tmp_path):
    def correct(labels, predictions):
        hit = tf.equal(tf.argmax(predictions, 1), labels)
        return {"correct": hit, "misclassified": tf.logical_not(hit)}
    seen = _train(tmp_path / "run", groups=correct, predictions="logits:0")
    run = inspector.open_run(tmp_path / "run")
    assert run.groups == ["all", "correct", "misclassified"]
    hit = seen["logits:0"].argmax(1) == Y
    assert 0 < hit.sum() < N  # both groups have samples
    _check_against_numpy(run, seen, {"correct": hit, "misclassified": ~hit})
    samples = run.samples(1)
    assert list(samples["group"]) == ["correct" if hit[i] else "misclassified" for i in samples["index"]]


def test_default_groups_stay_positive_negative(tmp_path):
    seen = _train(tmp_path / "run")
    run = inspector.open_run(tmp_path / "run")
    assert run.groups == ["all", "positive", "negative"] and run.manifest["format_version"] == FORMAT_VERSION
    _check_against_numpy(run, seen, {"positive": Y != 0, "negative": Y == 0})


def test_overlapping_groups_are_refused_per_step(tmp_path, caplog):
    def overlapping(labels):
        return {"low": labels <= 1, "odd": tf.equal(labels % 2, 1)}  # label 1 is in both
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        _train(tmp_path / "run", groups=overlapping)
    run = inspector.open_run(tmp_path / "run")
    assert set(run.stats["group"].astype(str)) == {"all"}  # never numbers over the wrong samples
    assert "more than one group" in caplog.text
    assert run.manifest["groups_refused"]["samples"] == int((Y == 1).sum())


def test_float_labels_are_split_only_where_they_are_class_ids(tmp_path, caplog):
    """Float class ids (0., 1., ...) split as integers do; a label that is not a whole number
    (a soft or regression target, which label != 0 would call positive) refuses the step's groups."""
    seen = _train(tmp_path / "whole", y=Y.astype(np.float32))
    run = inspector.open_run(tmp_path / "whole")
    assert "groups_refused" not in run.manifest
    _check_against_numpy(run, seen, {"positive": Y != 0, "negative": Y == 0})
    soft = Y.astype(np.float32)
    soft[5] = 0.7
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        seen = _train(tmp_path / "soft", y=soft)
    run = inspector.open_run(tmp_path / "soft")
    assert set(run.stats["group"].astype(str)) == {"all"}
    assert "not whole numbers" in caplog.text and "pass positive=" in run.manifest["groups_refused"]["why"]
    assert run.manifest["groups_refused"]["samples"] == 1
    assert (run.manifest["groups_refused"]["steps"], run.manifest["groups_refused"]["last_step"]) == (1, 1)
    # the viewer's alerts say the groups' rows are missing on purpose
    from inspector.analysis import run_alerts
    (alert,) = [a for a in run_alerts(run) if a.kind == "groups_refused"]
    assert alert.step == 1 and "not whole numbers" in alert.message and alert.severity == "warning"
    # never dumped as a group's: the refused step's dump keeps the budget's first samples,
    # ungrouped (it had kept only the samples in a group: none at all for regression targets)
    assert np.asarray(run.dump_array(1, "samples/index")).tolist() == list(range(N))
    assert "samples/group" not in run.dump_keys(1) and run.dump_metadata(1)["groups"] == "refused"
    from inspector.cli import summary
    assert "refused    groups on 1 statistics steps of chief session 1 from step 1: float labels" in summary(run)
    assert "group" not in run.samples(1) and run.samples(1)["label"].tolist() == soft.tolist()
    np.testing.assert_array_equal(run.tensor("hidden:0", 1), seen["hidden:0"])
    # a smaller budget: the first 2 x samples_per_group, whatever their group
    seen = _train(tmp_path / "budget", y=soft, samples_per_group=3)
    run = inspector.open_run(tmp_path / "budget")
    assert np.asarray(run.dump_array(1, "samples/index")).tolist() == list(range(6))
    np.testing.assert_array_equal(run.tensor("hidden:0", 1), seen["hidden:0"][:6])
    # a static batch that the budget covers: the dump still holds exactly the indexed rows
    _train(tmp_path / "static", y=soft, label_shape=(N,))
    run = inspector.open_run(tmp_path / "static")
    assert np.asarray(run.dump_array(1, "samples/index")).tolist() == list(range(N))
    assert run.dump_array(1, "forward/hidden:0").shape[0] == N
    # [N, C] labels with C known at run time are class ids on steps where C is 1
    _train(tmp_path / "wide", y=soft, label_shape=(None, None))
    run = inspector.open_run(tmp_path / "wide")
    assert set(run.stats["group"].astype(str)) == {"all"} and run.manifest["groups_refused"]["samples"] == 1


@pytest.mark.parametrize("loss", ["squared error", "absolute error", "huber", "sigmoid cross entropy"])
def test_whole_number_float_targets_of_a_regression_are_refused(tmp_path, caplog, loss):
    """Counts 0..3 as float targets: whole numbers, so the run-time check let label != 0 split
    them into 'positive' = non-zero targets, without a word. Labels the loss compares to
    predictions by a squared or absolute difference are regression targets: refused when the
    hook is built (an error naming the op and the fix, 'all' rows only). A classifier's float
    {0, 1} labels keep their positive/negative groups."""
    y = (Y % 2 if loss == "sigmoid cross entropy" else Y).astype(np.float32)
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, D], name="x")
        labels = v1.placeholder(tf.float32, [None], name="y")
        w = v1.get_variable("w", initializer=RNG.normal(size=(D, 1)).astype(np.float32))
        pred = tf.reshape(tf.matmul(x, w), [-1], name="pred")
        value = {"squared error": lambda: tf.reduce_mean(tf.square(pred - labels)),
                 "absolute error": lambda: v1.losses.absolute_difference(labels, pred),
                 "huber": lambda: v1.losses.huber_loss(labels, pred),
                 "sigmoid cross entropy": lambda: tf.reduce_mean(
                     tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=pred))}[loss]()
        train = v1.train.GradientDescentOptimizer(0.01).minimize(value, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", loss=value, labels=labels, stats_every_n_steps=1, dump_every_n_steps=1)
        with caplog.at_level(logging.ERROR, logger="tf_inspector"), v1.train.MonitoredTrainingSession(hooks=[hook]) as s:
            s.run(train, feed_dict={x: X, labels: y})
    run = inspector.open_run(tmp_path / "run")
    groups = set(run.stats["group"].astype(str))
    if loss == "sigmoid cross entropy":
        assert groups == {"all", "positive", "negative"} and not caplog.text
        return
    op = {"squared error": "Square", "absolute error": "Abs", "huber": "Abs"}[loss]
    assert groups == {"all"} and run.groups == ["all"]
    assert run.groups_note.startswith("none: labels y:0 are regression targets (the loss is computed from ")
    assert "positive=lambda y: y > threshold" in run.groups_note
    assert "labels y:0 are regression targets (the loss is computed from " in caplog.text
    assert f", a {op} of them)" in caplog.text and "Pass positive=lambda y: y > threshold" in caplog.text


def test_class_id_out_of_range_refused(tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        _train(tmp_path / "run", groups="per_class", num_classes=3)  # Y holds class 3
    run = inspector.open_run(tmp_path / "run")
    assert set(run.stats["group"].astype(str)) == {"all"}
    assert "outside [0, num_classes)" in caplog.text


def test_group_arguments_are_checked():
    with pytest.raises(ValueError, match=f"at most {MAX_CLASS_GROUPS}"):
        GroupSpec.parse("per_class", num_classes=MAX_CLASS_GROUPS + 1)
    with pytest.raises(ValueError, match="per_class"):
        GroupSpec.parse("per-class")
    with pytest.raises(ValueError, match="positive="):
        GroupSpec.parse("per_class", positive=lambda y: y > 0)
    with tf.Graph().as_default():
        y = v1.placeholder(tf.int64, [None])
        with pytest.raises(ValueError, match="num_classes="):
            GroupSpec.parse("per_class").build(y)
        with pytest.raises(ValueError, match="must match"):
            GroupSpec.parse(lambda labels: {"all": labels > 0}).build(y)
        with pytest.raises(ValueError, match="predictions"):
            GroupSpec.parse(lambda labels, p: {"a": labels > 0}).build(y)


HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(getattr(tf, "estimator", None), "Estimator")


class PredictionsOracle(v1.train.SessionRunHook):
    """The EstimatorSpec's class ids, labels and logits in the training run of step 1."""

    def begin(self) -> None:
        from hooks.recorders import estimator as estimator_recorder
        g = v1.get_default_graph()
        call = estimator_recorder.lookup(g)
        preds = dict(call.predictions)
        self.fetch = {k: g.get_tensor_by_name(preds[k]) for k in ("class_ids", "logits")}
        self.fetch["labels"] = g.get_tensor_by_name(call.labels)
        self.seen: dict = {}

    def before_run(self, run_context):
        return None if self.seen else v1.train.SessionRunArgs(self.fetch)

    def after_run(self, run_context, run_values) -> None:
        self.seen = self.seen or run_values.results


@pytest.mark.skipif(not HAS_ESTIMATOR, reason="this TensorFlow has no tf.estimator (2.16+)")
def test_estimator_predictions_found_for_a_groups_function(tmp_path):
    """A canned DNNClassifier: labels and predictions come from the model_fn call, with no names."""
    def correct(labels, predictions):
        hit = tf.equal(tf.reshape(predictions["class_ids"], [-1]), tf.reshape(labels, [-1]))
        return {"correct": hit, "misclassified": tf.logical_not(hit)}

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": X}, Y % 3)).batch(N, drop_remainder=True)
    est = tf.estimator.DNNClassifier([H], [tf.feature_column.numeric_column("x", [D])], n_classes=3,
                                     model_dir=str(tmp_path / "model"), config=tf.estimator.RunConfig(tf_random_seed=1))
    oracle = PredictionsOracle()
    hook = DumpHook(tmp_path / "run", groups=correct, stats_every_n_steps=1, dump_every_n_steps=1,
                    strict=True)
    est.train(input_fn, hooks=[hook, oracle], steps=1)
    run = inspector.open_run(tmp_path / "run")
    assert run.groups == ["all", "correct", "misclassified"]
    logits, hit = oracle.seen["logits"], oracle.seen["class_ids"].ravel() == oracle.seen["labels"].ravel()
    name = next(n for n in run.tensors.index if run.tensors.loc[n, "batched"] and n.endswith("logits/BiasAdd:0"))
    df = run.query_stats([name], kinds=["forward"]).set_index("group")
    for group, rows in (("correct", hit), ("misclassified", ~hit)):
        assert df.loc[group, "count"] == logits[rows].size
        if rows.any():   # in float64, as the statistics sum: numpy's float32 mean of a mean near 0 is off 2e-5
            v = logits[rows].astype(np.float64)
            np.testing.assert_allclose(df.loc[group, "mean"], v.mean(), rtol=1e-6, atol=1e-7 * np.abs(v).max())


def test_a_run_without_labels_lists_no_groups_and_says_why(tmp_path):
    """No labels given, marked or passed by an Estimator: the manifest names no group, and
    run.groups_note says why and what to pass (labels=, hooks.mark(labels=...), positive=,
    groups=), as InspectCallback's runs do; its statistics have 'all' rows only."""
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, D], name="x")
        w = v1.get_variable("w", initializer=RNG.normal(size=(D, 1)).astype(np.float32))
        value = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        train = v1.train.GradientDescentOptimizer(0.01).minimize(value, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", loss=value, stats_every_n_steps=1, dump_every_n_steps=0)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as s:
            s.run(train, feed_dict={x: X})
    run = inspector.open_run(tmp_path / "run")
    assert run.groups == ["all"] and set(run.stats["group"].astype(str)) == {"all"}
    note = run.groups_note
    assert note.startswith("none: no labels found (none given, and no Estimator model_fn was recorded)")
    assert all(word in note for word in ("labels=", "hooks.mark(labels=...)", "positive=", "groups="))
