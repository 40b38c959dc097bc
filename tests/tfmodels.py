"""Small graph-mode models for the hook tests (tf.nn + tf.compat.v1 only: TF 2.15 and latest)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
BATCH, HW = 8, 8


@dataclass
class Model:
    x: tf.Tensor
    y: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Operation
    global_step: tf.Variable

    def feed(self, step: int, nan: bool = False) -> dict:
        return {self.x: batch_images(step, nan), self.y: batch_labels(step)}


def batch_images(step: int, nan: bool = False) -> np.ndarray:
    x = np.random.default_rng(step).normal(size=(BATCH, HW, HW, 1)).astype(np.float32)
    if nan:
        x[0, 0, 0, 0] = np.nan
    return x


def batch_labels(step: int) -> np.ndarray:
    y = np.random.default_rng(1000 + step).integers(0, 2, BATCH).astype(np.int32)
    y[:2] = (1, 0)  # every batch has a positive and a negative
    return y


def conv_net(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """x [N,8,8,1] -> conv1/relu -> conv2/relu -> fc/logits; returns the mean-reduced loss."""
    init = v1.glorot_uniform_initializer(seed=1)
    w1 = v1.get_variable("conv1/w", [3, 3, 1, 4], initializer=init)
    h1 = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"), name="conv1/relu")
    w2 = v1.get_variable("conv2/w", [3, 3, 4, 4], initializer=init)
    h2 = tf.nn.relu(tf.nn.conv2d(h1, w2, 2, "SAME"), name="conv2/relu")
    flat = tf.reshape(h2, [-1, 4 * 4 * 4], name="flat")
    w3 = v1.get_variable("fc/w", [64, 2], initializer=init)
    logits = tf.matmul(flat, w3, name="fc/logits")
    tf.nn.softmax(logits, name="probs")  # does not reach the loss: no gradient
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")


def placeholders() -> tuple[tf.Variable, tf.Tensor, tf.Tensor]:
    """The global step, the images ``x`` [BATCH,8,8,1] and the ``labels`` [BATCH] that
    ``batch_images`` and ``batch_labels`` feed. Call inside ``graph.as_default()``."""
    gs = v1.train.get_or_create_global_step()
    x = v1.placeholder(tf.float32, [BATCH, HW, HW, 1], name="x")
    y = v1.placeholder(tf.int32, [BATCH], name="labels")
    return gs, x, y


def build_cnn() -> Model:
    """Placeholders, the conv net, SGD. Call inside ``graph.as_default()``."""
    gs, x, y = placeholders()
    loss = conv_net(x, y)
    v1.losses.add_loss(loss)  # the hook's default: the LOSSES collection
    train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
    return Model(x, y, loss, train, gs)


def bn_cnn(x: tf.Tensor, y: tf.Tensor, scale: float = 1.0, dead_bias: float = 0.0,
           weight_decay: float = 1e-3) -> tf.Tensor:
    """x [N,8,8,1] -> (conv + bias -> batch norm -> relu) x 2 -> * scale -> fc; softmax cross
    entropy plus L2 weight decay. The conv biases feed batch norm, so their gradients are ~0 by
    construction. ``scale`` multiplies the last activations (1e-8: vanishing gradients below,
    1e8: exploding); ``dead_bias`` starts the second batch norm's beta there (-100: dead ReLU)."""
    init = v1.glorot_uniform_initializer(seed=3)
    h = x
    for i, c in enumerate((8, 8), start=1):
        with v1.variable_scope(f"block{i}"):
            w = v1.get_variable("w", [3, 3, int(h.shape[-1]), c], initializer=init)
            b = v1.get_variable("b", [c], initializer=v1.zeros_initializer())
            gamma = v1.get_variable("gamma", [c], initializer=v1.ones_initializer())
            beta = v1.get_variable("beta", [c], initializer=v1.constant_initializer(dead_bias if i == 2 else 0.0))
            z = tf.nn.bias_add(tf.nn.conv2d(h, w, 1 + (i == 2), "SAME"), b, name="conv")
            bn, _, _ = v1.nn.fused_batch_norm(z, gamma, beta, is_training=True)
            h = tf.nn.relu(bn, name="relu")
    h = tf.multiply(h, scale, name="scaled")
    flat = tf.reshape(h, [-1, 4 * 4 * 8], name="flat")
    w3 = v1.get_variable("fc/w", [128, 2], initializer=init)
    b3 = v1.get_variable("fc/b", [2], initializer=v1.zeros_initializer())
    logits = tf.nn.bias_add(tf.matmul(flat, w3), b3, name="fc/logits")
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="xent")
    decay = weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()])
    return tf.add(xent, decay, name="loss")
