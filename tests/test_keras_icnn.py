"""The Keras ICNN layer (hooks/keras_icnn.py) against the TF-compat layer (inspector/icnn.py):
the same output, d loss / d x (mask constant + filter-loss term) and beta pseudo-gradient."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hooks.keras_icnn import ICNNEpoch, ICNNMask  # noqa: E402

from inspector.icnn import layer as icnn  # noqa: E402

tf1 = tf.compat.v1


def _inputs(seed=0, n=6, h=5, w=4, c=3):
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.normal(size=(n, h, w, c)), 0).astype("float32")
    positive = np.arange(n) % 2 == 0
    up = rng.normal(size=(n, h, w, c)).astype("float32")
    return x, positive, up


def _compat(x, positive, up, epoch, kwargs):
    with tf.Graph().as_default():
        xt = tf.constant(x)
        post = icnn.conv_mask(xt, tf.constant(positive), tf.constant(epoch), name="m", **kwargs)
        loss = tf.reduce_sum(post * up)
        beta = tf1.get_collection(icnn.BETA_COLLECTION)[0]
        dx, dbeta = tf.gradients(loss, [xt, beta])
        with tf1.Session() as s:
            s.run(tf1.global_variables_initializer())
            return s.run([post, dx, dbeta])


def _keras(x, positive, up, epoch, kwargs):
    layer = ICNNMask(name="m", **kwargs)
    xt = tf.constant(x)
    layer.build([xt.shape, (len(positive),)])
    layer.epoch.assign(epoch)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        post = layer([xt, tf.constant(positive)])
        loss = tf.reduce_sum(post * up)
    dx, dbeta = tape.gradient(loss, [xt, layer.beta])
    return post.numpy(), dx.numpy(), np.asarray(dbeta)


@pytest.mark.parametrize("kwargs", [{}, {"mu": "argmax"}, {"reduction": "sum", "part_filters": 2},
                                    {"filter_loss": False, "beta_init": 1.0}, {"filter_loss_weight": 1e4}])
def test_keras_layer_matches_compat_layer(kwargs):
    x, positive, up = _inputs()
    expected = _compat(x, positive, up, 3.0, kwargs)
    got = _keras(x, positive, up, 3.0, kwargs)
    for name, e, g in zip(("post_mask", "d x", "d beta"), expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8, err_msg=name)
    # the filter-loss term is there: without it d x differs (unless switched off)
    if kwargs.get("filter_loss", True):
        plain = _keras(x, positive, up, 3.0, {**kwargs, "filter_loss": False})
        assert not np.allclose(plain[1], got[1])


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
