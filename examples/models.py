"""The demo's networks: an interpretable CNN (ICNN) and its plain twin, from tf.nn primitives.

Both share one architecture on 48 x 48 images::

    conv1 5x5x16 + ReLU + maxpool 2   -> 24 x 24
    conv2 3x3x32 + ReLU + maxpool 2   -> 12 x 12
    conv3 3x3x32 + ReLU               -> 12 x 12   the "top conv map" (its filters are studied)
    [ICNN only: inspector.icnn.layer.conv_mask]        named scope "icnn_mask"
    conv4 3x3x32 + ReLU + global max pool + dense -> one logit

Feature-map index i of conv3 sees image pixel ``RF_CENTER + RF_STRIDE * i`` (0-based).
``build`` is used both by the Estimator ``model_fn`` and by the MonitoredTrainingSession path.

Example::

    est = tf.estimator.Estimator(model_fn, model_dir, params=dict(icnn=True, steps_per_epoch=90))
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from inspector.icnn import layer as icnn

tf1 = tf.compat.v1

TOP_LAYER = "conv3/Relu"       # name of the studied map (pre-mask in the ICNN)
RF_STRIDE = 4.0
RF_CENTER = 1.5
DEFAULTS: Dict[str, Any] = dict(icnn=True, learning_rate=1e-3, weight_decay=1e-4, steps_per_epoch=100,
                                filter_loss_weight=1.0, mu="centroid")


def _conv(x: tf.Tensor, name: str, k: int, cout: int) -> tf.Tensor:
    cin = x.shape.as_list()[-1]
    with tf1.variable_scope(name):
        w = tf1.get_variable("weights", [k, k, cin, cout],
                             initializer=tf1.initializers.variance_scaling(2.0, "fan_in", "truncated_normal"))
        b = tf1.get_variable("biases", [cout], initializer=tf1.zeros_initializer())
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, [1, 1, 1, 1], "SAME"), b), name="Relu")


def _pool(x: tf.Tensor, name: str) -> tf.Tensor:
    return tf.nn.max_pool2d(x, 2, 2, "VALID", name=name)


def build(images: tf.Tensor, labels: Optional[tf.Tensor], mode: str, params: Dict[str, Any]) -> Dict[str, tf.Tensor]:
    """Build the network. ``mode``: "train", "eval" or "infer". Returns a dict with
    ``logits``, ``probability``, ``top`` (the conv3 map), ``post`` (what conv4 sees) and, with
    labels, ``labels`` and ``loss``; in train mode also ``train_op``."""
    p = {**DEFAULTS, **params}
    step = tf1.train.get_or_create_global_step()
    x = _pool(_conv(images, "conv1", 5, 16), "pool1")
    x = _pool(_conv(x, "conv2", 3, 32), "pool2")
    top = _conv(x, "conv3", 3, 32)
    out: Dict[str, tf.Tensor] = {"top": top}
    if labels is not None:
        labels = tf.identity(tf.cast(labels, tf.int64), name="labels")
        out["labels"] = labels
    if p["icnn"]:
        positive = (tf.equal(labels, 1) if labels is not None
                    else tf.zeros(tf.shape(top)[:1], tf.bool))   # inference: no labels, mask only
        epoch = icnn.epoch_from_step(step, int(p["steps_per_epoch"]))
        post = icnn.conv_mask(top, positive, epoch, name="icnn_mask", mu=p["mu"],
                              filter_loss_weight=float(p["filter_loss_weight"]))
    else:
        post = top
    out["post"] = post
    x = _conv(post, "conv4", 3, 32)
    feat = tf.reduce_max(x, axis=[1, 2], name="global_max_pool")
    with tf1.variable_scope("logit"):
        w = tf1.get_variable("weights", [32, 1], initializer=tf1.initializers.glorot_uniform())
        b = tf1.get_variable("biases", [1], initializer=tf1.zeros_initializer())
        logits = tf.squeeze(tf.matmul(feat, w) + b, axis=1, name="logits")
    out["logits"] = logits
    out["probability"] = tf.sigmoid(logits, name="probability")
    if labels is None:
        return out
    xent = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=logits), name="xent")
    # Weight decay on the weights only: icnn.weight_decay_variables() leaves out every beta.
    decay = [v for v in icnn.weight_decay_variables() if "weights" in v.op.name]
    loss = tf.add(xent, p["weight_decay"] * tf.add_n([tf.nn.l2_loss(v) for v in decay]), name="loss")
    out["loss"] = loss
    _mark(loss, labels)
    if mode == "train":
        opt = tf1.train.AdamOptimizer(p["learning_rate"])
        out["train_op"] = opt.minimize(loss, global_step=step)
    return out


def _mark(loss: tf.Tensor, labels: tf.Tensor) -> None:
    try:
        import hooks
    except ImportError:  # the hook is optional for the model itself
        return
    hooks.mark(loss=loss, labels=labels, positive=lambda y: tf.equal(y, 1))


def has_estimator() -> bool:
    """True when ``tf.estimator`` exists (TensorFlow <= 2.15)."""
    try:
        return hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")
    except Exception:   # noqa: BLE001 - a broken lazy import means "no estimator"
        return False


def model_fn(features, labels, mode, params):
    """``tf.estimator`` model_fn; ``features`` is the image batch [N, 48, 48, 1]."""
    est = tf.estimator
    images = features["image"] if isinstance(features, dict) else features
    kind = {est.ModeKeys.TRAIN: "train", est.ModeKeys.EVAL: "eval", est.ModeKeys.PREDICT: "infer"}[mode]
    out = build(images, labels if mode != est.ModeKeys.PREDICT else None, kind, params)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"probability": out["probability"], "top": out["top"]})
    if mode == est.ModeKeys.EVAL:
        acc = tf1.metrics.accuracy(out["labels"], tf.cast(out["probability"] > 0.5, tf.int64))
        return est.EstimatorSpec(mode, loss=out["loss"], eval_metric_ops={"accuracy": acc})
    return est.EstimatorSpec(mode, loss=out["loss"], train_op=out["train_op"])
