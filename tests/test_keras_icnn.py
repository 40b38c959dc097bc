"""The Keras ICNN layer (hooks/keras/icnn.py) against the TF-compat layer (inspector/icnn/layer.py):
the same output, d loss / d x (mask constant + filter-loss term) and beta pseudo-gradient, for
one class and several (filter slices), with the release's beta update and the stable one; and
a multi-class Keras model's run as the viewer reads it."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hooks.keras.icnn import ICNNEpoch, ICNNMask  # noqa: E402

from inspector.icnn import layer as icnn  # noqa: E402

tf1 = tf.compat.v1


def _inputs(seed=0, n=6, h=5, w=4, c=3):
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.normal(size=(n, h, w, c)), 0).astype("float32")
    positive = np.arange(n) % 2 == 0
    up = rng.normal(size=(n, h, w, c)).astype("float32")
    return x, positive, up


def _compat(x, positive, up, epoch, kwargs):
    """post, d x, d beta and beta after the gradient (the stable update moves it)."""
    with tf.Graph().as_default():
        xt = tf.constant(x)
        post = icnn.conv_mask(xt, tf.constant(positive), tf.constant(epoch), name="m", **kwargs)
        loss = tf.reduce_sum(post * up)
        beta = tf1.get_collection(icnn.BETA_COLLECTION)[0]
        dx, dbeta = tf.gradients(loss, [xt, beta])
        with tf1.Session() as s:
            s.run(tf1.global_variables_initializer())
            return [*s.run([post, dx, dbeta]), s.run(beta)]


def _keras(x, positive, up, epoch, kwargs):
    layer = ICNNMask(name="m", **kwargs)
    xt = tf.constant(x)
    layer.build([xt.shape, positive.shape])
    layer.epoch.assign(epoch)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        post = layer([xt, tf.constant(positive)])
        loss = tf.reduce_sum(post * up)
    dx, dbeta = tape.gradient(loss, [xt, layer.beta])
    return post.numpy(), dx.numpy(), np.asarray(dbeta), np.asarray(layer.beta)


def _assert_same(expected, got):
    for name, e, g in zip(("post_mask", "d x", "d beta", "beta after"), expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("kwargs", [{}, {"mu": "argmax"}, {"reduction": "sum", "part_filters": 2},
                                    {"filter_loss": False, "beta_init": 1.0}, {"filter_loss_weight": 1e4}])
def test_keras_layer_matches_compat_layer(kwargs):
    x, positive, up = _inputs()
    expected = _compat(x, positive, up, 3.0, kwargs)
    got = _keras(x, positive, up, 3.0, kwargs)
    _assert_same(expected, got)
    # the filter-loss term is there: without it d x differs (unless switched off)
    if kwargs.get("filter_loss", True):
        plain = _keras(x, positive, up, 3.0, {**kwargs, "filter_loss": False})
        assert not np.allclose(plain[1], got[1])



CLASSES = {"filter_class": [0, 1, 2, 1], "class_density": [0.3, 0.2, 0.4]}


def _class_labels(n=6, k=3):
    labels = np.zeros((n, k), bool)
    labels[np.arange(n - 1), np.arange(n - 1) % k] = True    # the last sample: no class (background)
    return labels


@pytest.mark.parametrize("kwargs", [CLASSES, {**CLASSES, "part_filters": 3, "reduction": "sum"},
                                    {**CLASSES, "beta_update": "stable", "beta_rate": 0.2}])
def test_several_classes_match_the_compat_layer(kwargs):
    x, _, up = _inputs(c=4)
    labels = _class_labels()
    expected = _compat(x, labels, up, 2.0, kwargs)
    got = _keras(x, labels, up, 2.0, kwargs)
    _assert_same(expected, got)
    # the class slices and weights matter: one class over "any class" gives another d x
    single = _keras(x, labels.any(axis=1), up, 2.0, {k: v for k, v in kwargs.items() if k not in CLASSES})
    assert not np.allclose(single[1], got[1])


@pytest.mark.parametrize("form", [_compat, _keras])
def test_numeric_labels_are_read_only_where_they_are_0_or_1(form):
    """One-hot numbers give what bool labels give; soft or smoothed labels, which a cast would make
    True wherever nonzero (every sample a positive of every class), are refused at the step."""
    x, _, up = _inputs(c=4)
    labels = _class_labels()
    expected = form(x, labels, up, 2.0, CLASSES)
    _assert_same(expected, form(x, labels.astype("float32"), up, 2.0, CLASSES))
    _assert_same(form(x, labels[:, 0], up, 2.0, {}), form(x, labels[:, 0].astype("int32"), up, 2.0, {}))
    smoothed = (labels * 0.9 + 0.1 / 3).astype("float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="soft or smoothed labels"):
        form(x, smoothed, up, 2.0, CLASSES)
    with pytest.raises(ValueError, match="ICNN labels must be bool .* got dtype string"):
        form(x, np.array(["a"] * 6), up, 2.0, {})


def test_under_xla_soft_labels_turn_the_output_nan():
    """XLA drops the assertion: there the layer's output is NaN on a step with labels that are
    not 0/1, never the output of labels cast to True."""
    x, _, _ = _inputs(c=4)
    labels = _class_labels()
    layer = ICNNMask(name="m", beta_watch=False, **CLASSES)
    layer.build([x.shape, labels.shape])
    run = tf.function(lambda a, b: layer([a, b]), jit_compile=True)
    hard = run(tf.constant(x), tf.constant(labels.astype("float32"))).numpy()
    np.testing.assert_allclose(hard, layer([tf.constant(x), tf.constant(labels)]).numpy(), rtol=1e-6)
    assert np.isfinite(hard).all()
    soft = run(tf.constant(x), tf.constant((labels * 0.9 + 0.1 / 3).astype("float32"))).numpy()
    assert np.isnan(soft).all()


def test_stable_update_moves_beta_itself_as_the_compat_layer():
    x, positive, up = _inputs()
    kwargs = {"beta_update": "stable", "beta_rate": 0.5, "beta_init": 1.0}
    expected = _compat(x, positive, up, 1.0, kwargs)
    got = _keras(x, positive, up, 1.0, kwargs)
    _assert_same(expected, got)
    assert not got[2].any()                        # beta's gradient is 0 ...
    assert not np.allclose(got[3], 1.0)            # ... and the gradient computation moved beta
    with pytest.raises(ValueError, match="beta_rate must be a number in"):
        ICNNMask(beta_update="stable", beta_rate=1.5)


def test_a_multiclass_keras_model_records_its_class_slices(tmp_path):
    import inspector
    from hooks.keras import InspectCallback
    keras = tf.keras
    n, k = 8, 3
    rng = np.random.default_rng(0)
    x = rng.random((n, 6, 6, 1)).astype("float32")
    y = np.arange(n) % (k + 1)                             # 0: background, k + 1: class k
    labels = y[:, None] == np.arange(1, k + 1)[None, :]
    images, lab = keras.Input((6, 6, 1)), keras.Input((k,), dtype="bool")
    top = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(images)
    post = ICNNMask(name="icnn_mask", filter_class=[0, 1, 2, 0], class_density=[0.25] * k, monitor=False)([top, lab])
    out = keras.layers.Dense(k + 1)(keras.layers.Flatten()(post))
    model = keras.Model([images, lab], out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "run", probe=([x, labels], y), stats_every_n_steps=1, dump_every_n_steps=2,
                         samples_per_group=n)
    model.fit([x, labels], y, batch_size=n, epochs=2, verbose=0, callbacks=[cb, ICNNEpoch()])
    run = inspector.open_run(tmp_path / "run")
    name = run.icnn_layers().set_index("layer").loc["icnn_mask", "class_positive"]
    assert run.tensors.loc[name, "icnn_filter_class"] == [0, 1, 2, 0]
    step = run.dump_steps()[-1]
    np.testing.assert_array_equal(np.asarray(run.tensor(name, step)), labels)


def test_epoch_callback_sets_one_based_epoch():
    keras = tf.keras
    images = keras.Input((6, 6, 2))
    pos = keras.Input((), dtype="bool")
    top = keras.layers.Conv2D(3, 3, padding="same", activation="relu")(images)
    layer = ICNNMask(name="mask")
    out = keras.layers.Dense(1)(keras.layers.GlobalMaxPooling2D()(layer([top, pos])))
    model = keras.Model([images, pos], out)
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((8, 6, 6, 2)).astype("float32")
    y = np.arange(8) % 2
    model.fit([x, y == 1], y.astype("float32"), epochs=3, verbose=0, callbacks=[ICNNEpoch()])
    assert float(np.asarray(layer.epoch)) == 3.0


def test_bad_input_refused():
    with pytest.raises(ValueError, match="reduction"):
        ICNNMask(reduction="avg")
    with pytest.raises(ValueError, match="static H, W, C"):
        ICNNMask().build([(None, None, 4, 3), (None,)])
    # several classes: the errors name the layer's labels input, and the value as given
    with pytest.raises(ValueError, match=r"need the labels input .* of shape \[N, K\]"):
        ICNNMask(filter_class=[0, 1, 2]).build([(None, 4, 4, 3), (None,)])
    with pytest.raises(ValueError, match=r"with the labels input .*filter_class must be .* got \(0, 1\)$"):
        ICNNMask(filter_class=[0, 1], class_density=[0.5, 0.5]).build([(None, 4, 4, 3), (None, 2)])


@pytest.mark.parametrize("source, update", [("probe", "stable"), ("probe", "release"), ("train_batch", "stable")])
def test_the_capture_leaves_the_layers_beta_update_and_watch_alone(tmp_path, source, update):
    """The probe's backward pass is an observer's: with a stable update it would move beta a
    second time on every sampled step (on the probe's labels), and it would call the beta
    watch twice a step. The step capture's pass is training's own: the update runs in it, once.
    Training with the callback equals training without it, bit for bit."""
    from hooks.keras import InspectCallback
    keras = tf.keras
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(8, 8, 8, 1))).astype("float32")
    y = np.arange(8) % 2

    def train(callback: bool):
        keras.utils.set_random_seed(3)
        images, pos = keras.Input((8, 8, 1)), keras.Input((), dtype="bool")
        top = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(images)
        mask = ICNNMask(name="icnn_mask", beta_update=update, beta_rate=0.2)
        out = keras.layers.Dense(2)(keras.layers.Flatten()(mask([top, pos])))
        model = keras.Model([images, pos], out)
        model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        probe = ([x[::-1], y[::-1] == 1], y[::-1])            # other labels per position than training's
        where = dict(probe=probe) if source == "probe" else dict(source="train_batch")
        cbs = [InspectCallback(tmp_path / f"r{source}{update}", **where, stats_every_n_steps=1, strict=True)] \
            if callback else []
        model.fit([x, y == 1], y, batch_size=8, epochs=6, shuffle=False, verbose=0, callbacks=cbs)
        return [np.asarray(w) for w in model.weights], mask._watch._calls

    (plain, plain_calls), (probed, probed_calls) = train(False), train(True)
    assert plain_calls == probed_calls == 6
    for a, b in zip(plain, probed):
        np.testing.assert_array_equal(a, b)


def test_config_round_trip_keeps_the_classes_and_the_update():
    layer = ICNNMask(name="m", filter_class=[0, 1, 0], class_density=[0.4, 0.3], beta_update="stable",
                     beta_rate=0.2, beta_watch=False)
    config = layer.get_config()
    assert config["filter_class"] == [0, 1, 0] and config["class_density"] == [0.4, 0.3]
    again = ICNNMask.from_config(config)
    assert again.get_config() == config
    assert (again.filter_class, again.beta_update, again.beta_rate) == ((0, 1, 0), "stable", 0.2)
