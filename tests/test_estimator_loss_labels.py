"""DumpHook(run_dir) alone on Estimators: the gradients are d spec.loss / d t (tf.gradients in the same
step), and the labels the model_fn received give the positive/negative groups (TF 2.15 + estimator)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook, capture  # noqa: E402

v1 = tf.compat.v1
HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(getattr(tf, "estimator", None), "Estimator")
pytestmark = pytest.mark.skipif(not HAS_ESTIMATOR, reason="this TensorFlow has no tf.estimator (2.16+)")
N, D, STEP = 8, 4, 2
FEATURES = np.random.default_rng(0).normal(size=(4 * N, D)).astype(np.float32)


class Oracle(v1.train.SessionRunHook):
    """At ``step``, fetch every default-captured tensor and tf.gradients(loss(), it), in the training run."""

    def __init__(self, step: int, loss_fn=None) -> None:
        self.step, self.loss_fn, self.seen, self._n = step, loss_fn, {}, 0

    def begin(self) -> None:
        g = v1.get_default_graph()
        # what the Estimator appended to LOSSES last: the EstimatorSpec's loss
        self.loss = self.loss_fn() if self.loss_fn else g.get_collection(v1.GraphKeys.LOSSES)[-1]
        tensors = capture.select_tensors(g, exclude=r"^oracle/").tensors
        with tf.name_scope("oracle"):
            grads = tf.gradients(self.loss, tensors)
        self.fetch = {t.name: (t, tf.convert_to_tensor(gr)) for t, gr in zip(tensors, grads) if gr is not None}

    def before_run(self, run_context):
        self._n += 1
        return v1.train.SessionRunArgs(self.fetch) if self._n == self.step else None

    def after_run(self, run_context, run_values) -> None:
        if self._n == self.step:
            self.seen = run_values.results


def _input_fn(labels: np.ndarray):
    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": FEATURES}, labels)).batch(N, drop_remainder=True)
    return input_fn


def _train(tmp_path, est, labels, oracle: Oracle, strict: bool = True):
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=STEP, dump_every_n_steps=STEP, samples_per_group=N,
                    strict=strict)
    est.train(_input_fn(labels), hooks=[hook, oracle], steps=STEP)
    run = inspector.open_run(tmp_path / "run")
    assert run.steps == [STEP]
    return run


def _check_gradients(run, oracle: Oracle, must_include: list[str]) -> int:
    """Every tensor with a gradient in both: the dump equals the oracle (all N samples kept)."""
    assert run.manifest["loss"] == oracle.loss.name
    checked = 0
    for name, (value, grad) in oracle.seen.items():
        if name not in run.tensors.index or not run.tensors.loc[name, "has_gradient"]:
            continue
        np.testing.assert_allclose(run.tensor(name, STEP), value, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(run.tensor(name, STEP, "gradient"), grad, rtol=1e-4, atol=1e-7, err_msg=name)
        checked += 1
    assert set(must_include) <= set(oracle.seen), sorted(oracle.seen)
    return checked


def _batch_labels(labels: np.ndarray) -> np.ndarray:
    return labels[(STEP - 1) * N: STEP * N]


def _check_positive_count(run, labels_batch: np.ndarray, name: str, per_sample: int, positive: np.ndarray) -> None:
    s = run.query_stats(tensors=[name], steps=(STEP, STEP))
    s = s[s.kind == "forward"].set_index("group")["count"]
    assert s["positive"] == positive.sum() * per_sample and s["negative"] == (~positive).sum() * per_sample
    kept = np.asarray([np.asarray(v) for v in run.samples(STEP)["label"]])
    np.testing.assert_array_equal(kept.reshape(labels_batch.shape), labels_batch)


def test_dnn_classifier_three_classes(tmp_path):
    labels = np.random.default_rng(1).integers(0, 3, size=(4 * N, 1)).astype(np.int64)
    cols = [tf.feature_column.numeric_column("x", shape=[D])]
    est = tf.estimator.DNNClassifier([5, 3], cols, n_classes=3, model_dir=str(tmp_path / "model"))
    oracle = Oracle(STEP)
    run = _train(tmp_path, est, labels, oracle)
    logits = "dnn/logits/BiasAdd:0"
    first = "dnn/hiddenlayer_0/MatMul:0"  # one op from the input
    assert _check_gradients(run, oracle, [logits, first, "dnn/hiddenlayer_1/Relu:0"]) >= 5
    # numpy oracle of the head's loss (mean sparse softmax cross entropy): (softmax - onehot) / N
    z = run.tensor(logits, STEP).astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = _batch_labels(labels)[:, 0]
    np.testing.assert_allclose(run.tensor(logits, STEP, "gradient"), (p - np.eye(3)[y]) / N, rtol=1e-4, atol=1e-7)
    assert run.manifest["labels"] == "IteratorGetNext:1"
    _check_positive_count(run, _batch_labels(labels), logits, 3, y != 0)


def test_linear_classifier_binary(tmp_path):
    labels = np.random.default_rng(2).integers(0, 2, size=(4 * N, 1)).astype(np.int64)
    labels[(STEP - 1) * N: (STEP - 1) * N + 2, 0] = (1, 0)
    cols = [tf.feature_column.numeric_column("x", shape=[D])]
    est = tf.estimator.LinearClassifier(cols, model_dir=str(tmp_path / "model"))
    oracle = Oracle(STEP)
    run = _train(tmp_path, est, labels, oracle)
    logits = [n for n in oracle.seen if n.startswith("linear/linear_model/linear/linear_model/linear/"
                                                     "linear_model/weighted_sum")] or \
        [n for n in oracle.seen if "weighted_sum" in n]
    assert _check_gradients(run, oracle, logits[:1]) >= 2
    y = _batch_labels(labels)[:, 0]
    # [N, 1] labels are class ids: positive = label != 0 (not "one-hot, all negative")
    _check_positive_count(run, _batch_labels(labels), logits[0], 1, y != 0)
    # the weights' records have their gradient: the zero_fraction summary's cond reads them off the loss's path
    assert run.variables["has_gradient"].all(), run.variables["gradient_note"].dropna().tolist()


def test_dnn_regressor_whole_number_targets_are_refused(tmp_path, caplog):
    """Counts 0..3 as float targets of a DNNRegressor: whole numbers, so label != 0 split them
    into 'positive' = non-zero targets, with no hint of the regression head. Refused when the
    hook is built, naming the head, as targets that are not whole numbers are refused."""
    labels = np.random.default_rng(4).integers(0, 4, size=(4 * N, 1)).astype(np.float32)
    est = tf.estimator.DNNRegressor([6], [tf.feature_column.numeric_column("x", shape=[D])],
                                    model_dir=str(tmp_path / "model"))
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        run = _train(tmp_path, est, labels, Oracle(STEP), strict=False)
    assert "are regression targets (the EstimatorSpec's predictions are a regression head's" in caplog.text
    assert set(run.stats["group"].astype(str)) == {"all"} and run.groups == ["all"]
    assert "are regression targets (the EstimatorSpec's predictions" in run.groups_note


def test_keras_model_to_estimator(tmp_path):
    if not hasattr(tf.keras, "estimator"):
        pytest.skip("no tf.keras.estimator")
    labels = np.random.default_rng(3).integers(0, 3, size=(4 * N, 1)).astype(np.int64)
    inp = tf.keras.Input((D,), name="x")
    hidden = tf.keras.layers.Dense(5, activation="relu", name="hidden")(inp)
    out = tf.keras.layers.Dense(3, activation="softmax", name="probs")(hidden)
    model = tf.keras.Model(inp, out)
    model.compile(tf.keras.optimizers.legacy.SGD(0.1), "sparse_categorical_crossentropy")
    est = tf.keras.estimator.model_to_estimator(model, model_dir=str(tmp_path / "model"))
    oracle = Oracle(STEP)
    run = _train(tmp_path, est, labels, oracle)
    assert _check_gradients(run, oracle, ["hidden/MatMul:0", "probs/BiasAdd:0"]) >= 3
    y = _batch_labels(labels)[:, 0]
    _check_positive_count(run, _batch_labels(labels), "probs/BiasAdd:0", 3, y != 0)


def test_custom_model_fn_with_v1_losses_and_weight_decay(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tf_inspector")
    """tf.compat.v1.losses puts the cross entropy in LOSSES, the Estimator appends spec.loss (the
    total): summing the collection doubled every gradient. The hook must take the total alone."""
    labels = np.random.default_rng(4).integers(0, 2, size=(4 * N,)).astype(np.int32)
    spec_loss = []

    def model_fn(features, labels, mode):
        reg = lambda w: 1e-1 * tf.nn.l2_loss(w)  # noqa: E731 - L2 weight decay, in REGULARIZATION_LOSSES
        w1 = v1.get_variable("w1", [D, 6], regularizer=reg, initializer=v1.glorot_uniform_initializer(seed=1))
        w2 = v1.get_variable("w2", [6, 2], regularizer=reg, initializer=v1.glorot_uniform_initializer(seed=2))
        h = tf.nn.relu(tf.matmul(features["x"], w1), name="hidden")
        logits = tf.matmul(h, w2, name="logits")
        v1.losses.sparse_softmax_cross_entropy(labels, logits)
        loss = v1.losses.get_total_loss()
        spec_loss.append(loss)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    oracle = Oracle(STEP, loss_fn=lambda: spec_loss[-1])
    run = _train(tmp_path, est, labels, oracle)
    assert _check_gradients(run, oracle, ["hidden:0", "logits:0", "MatMul:0"]) >= 4
    assert "reusing the optimizer's backward pass" in caplog.text  # the total is what it differentiated
    cat = run.tensors   # a weight (its record, its reads): its gradient includes the weight decay term
    w1 = [n for n in cat.index if n == "w1" or cat.loc[n, "variable"] == "w1"]
    assert w1 and cat.loc["w1", "has_gradient"], list(cat.index)
    _check_positive_count(run, _batch_labels(labels), "logits:0", 2, _batch_labels(labels) != 0)


def _v1_losses_model_fn(spec_loss: list, labels_of=lambda labels: labels):
    def model_fn(features, labels, mode):
        reg = lambda w: 1e-1 * tf.nn.l2_loss(w)  # noqa: E731
        w1 = v1.get_variable("w1", [D, 2], regularizer=reg, initializer=v1.glorot_uniform_initializer(seed=1))
        logits = tf.matmul(features["x"], w1, name="logits")
        v1.losses.sparse_softmax_cross_entropy(labels_of(labels), logits)
        loss = v1.losses.get_total_loss()
        spec_loss.append(loss)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


def test_spec_loss_without_a_recorded_pass(tmp_path, monkeypatch):
    """Rule 4: no recorded optimizer pass (a model built before import hooks): the EstimatorSpec's loss."""
    from hooks.recorders import gradients as gradient_recorder
    monkeypatch.setattr(gradient_recorder, "recorded_losses", lambda graph: {})
    labels = np.random.default_rng(5).integers(0, 2, size=(4 * N,)).astype(np.int32)
    spec_loss = []
    est = tf.estimator.Estimator(_v1_losses_model_fn(spec_loss), model_dir=str(tmp_path / "model"))
    oracle = Oracle(STEP, loss_fn=lambda: spec_loss[-1])
    run = _train(tmp_path, est, labels, oracle)
    assert _check_gradients(run, oracle, ["logits:0"]) >= 2


def test_a_dict_of_labels_is_refused_and_one_entry_is_used(tmp_path, caplog):
    labels = np.random.default_rng(6).integers(0, 2, size=(4 * N,)).astype(np.int32)

    def input_fn(keys):
        return lambda: tf.data.Dataset.from_tensor_slices(
            ({"x": FEATURES}, {k: labels for k in keys})).batch(N, drop_remainder=True)

    est = tf.estimator.Estimator(_v1_losses_model_fn([], lambda y: y["a"]), model_dir=str(tmp_path / "m1"))
    hook = DumpHook(tmp_path / "two", stats_every_n_steps=1, dump_every_n_steps=0)
    est.train(input_fn(["a", "b"]), hooks=[hook], steps=1)
    run = inspector.open_run(tmp_path / "two")
    assert run.manifest["labels"] is None and set(run.stats.group) == {"all"} and not hook._disabled
    assert "dict of 2 labels (a, b)" in caplog.text and "labels=" in caplog.text
    from hooks.recorders.loss_and_labels import AmbiguousError
    with pytest.raises(AmbiguousError, match="dict of 2 labels"):
        est.train(input_fn(["a", "b"]), hooks=[DumpHook(tmp_path / "strict", strict=True)], steps=1)
    est = tf.estimator.Estimator(_v1_losses_model_fn([], lambda y: y["a"]), model_dir=str(tmp_path / "m2"))
    est.train(input_fn(["a"]), hooks=[DumpHook(tmp_path / "one", stats_every_n_steps=1, strict=True)], steps=1)
    run = inspector.open_run(tmp_path / "one")
    assert run.manifest["labels"] == "IteratorGetNext:1" and set(run.stats.group) == {"all", "positive", "negative"}


def test_evaluate_finds_the_spec_loss_and_labels(tmp_path):
    """No optimizer pass in an eval graph: the EstimatorSpec's loss (rule 4) and the model_fn's labels."""
    labels = np.random.default_rng(7).integers(0, 3, size=(4 * N, 1)).astype(np.int64)
    cols = [tf.feature_column.numeric_column("x", shape=[D])]
    est = tf.estimator.DNNClassifier([5], cols, n_classes=3, model_dir=str(tmp_path / "model"))
    est.train(_input_fn(labels), steps=1)
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=N, strict=True)
    est.evaluate(_input_fn(labels), hooks=[hook], steps=1)
    run = inspector.open_run(tmp_path / "run")
    m = run.manifest
    assert m["mode"] == "eval" and m["labels"] == "IteratorGetNext:1"
    assert m["loss"].startswith("head/losses/") and run.tensors.loc["dnn/logits/BiasAdd:0", "has_gradient"]
    stats = run.view("eval").stats
    s = stats[(stats.tensor == "dnn/logits/BiasAdd:0") & (stats.kind == "forward")].set_index("group")["count"]
    positive = labels[:N, 0] != 0  # the first batch
    assert s["positive"] == positive.sum() * 3 and s["negative"] == (~positive).sum() * 3


def test_an_estimator_under_a_distribution_strategy_is_refused_clearly(tmp_path, caplog):
    """An Estimator with RunConfig(train_distribute=MirroredStrategy) had
    the hook fail with "DistributedVariable.handle is not available outside the replica
    context", which said nothing of what to change. Refused now, naming what to do; training
    goes on without the hook (strict=False)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    columns = [tf.feature_column.numeric_column("a", shape=(3,))]
    config = tf.estimator.RunConfig(train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
    est = tf.estimator.DNNClassifier([4], columns, model_dir=str(tmp_path / "model"), config=config)
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=1)
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        est.train(lambda: tf.data.Dataset.from_tensor_slices(({"a": x}, y)).repeat().batch(8), hooks=[hook], steps=2)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert hook._disabled and any("mirrored by a tf.distribute strategy" in m and "train_distribute" in m for m in said)
    assert est.get_variable_value("global_step") == 2   # training went on
