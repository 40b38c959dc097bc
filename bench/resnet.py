"""CIFAR ResNet v2 (6n+2 layers) from tf.nn / tf.compat.v1 primitives, for the hook benchmark.

Three families of the same depth (``FAMILIES``): ``bn-resnet`` (below), ``resnet-nobn``
(the same ResNet with each batch norm replaced by a bias: fewer, larger captured
activations per FLOP) and ``vgg`` (a plain CNN: per stage 2n conv3x3-bias-ReLU, then a 2x2
max pool, 16/32/64 filters, global average pool, dense 10; no shortcuts, no batch norm).

The model of seed 004 (conv1 3x3x16, three stages of ``n`` pre-activation blocks with
16/32/64 filters, projection shortcuts where a stage halves the resolution, final BN-ReLU,
global average pool, dense 10; softmax cross-entropy plus 2e-4 weight decay; momentum 0.9
with a piecewise-constant learning rate; batch-norm moving averages in UPDATE_OPS), built
without ``tf.compat.v1.layers`` or Keras so it runs on TF 2.15 and on the latest TF.

Inputs come from a ``tf.data`` iterator over an in-memory array of random images, so
feeding costs the same under every benchmark configuration.

Example::

    with tf.Graph().as_default():
        m = build_resnet(n=1, batch=32)
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            sess.run(m.train_op)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
WEIGHT_DECAY = 2e-4
BN_MOMENTUM = 0.997
FAMILIES = ("bn-resnet", "resnet-nobn", "vgg")
#: Base learning rates. Without batch norm a ResNet at 0.1 turned to NaN within 10 steps for
#: n >= 3 (the statistics then timed the kernel's non-finite path, not a training net); at
#: 0.01, with its blocks' last convs scaled down (``_block_v2``), it trains at n = 1, 3, 5.
BASE_LR = {"bn-resnet": 0.1, "resnet-nobn": 0.01, "vgg": 0.1}


@dataclass
class ResNet:
    images: tf.Tensor
    labels: tf.Tensor
    logits: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Operation
    global_step: tf.Variable


def _conv(x: tf.Tensor, filters: int, kernel: int, stride: int, name: str, scale: float = 1.0) -> tf.Tensor:
    w = v1.get_variable(f"{name}/kernel", [kernel, kernel, int(x.shape[-1]), filters],
                        initializer=v1.variance_scaling_initializer(scale, seed=len(name)))
    return tf.nn.conv2d(x, w, stride, "SAME", name=name)


def _bias_relu(x: tf.Tensor, name: str) -> tf.Tensor:
    with v1.variable_scope(name):
        b = v1.get_variable("bias", [int(x.shape[-1])], initializer=v1.zeros_initializer())
        return tf.nn.relu(tf.nn.bias_add(x, b), name="relu")


def _bn_relu(x: tf.Tensor, name: str, bn: bool = True) -> tf.Tensor:
    """Training-mode fused batch norm with our own variables; moving averages go to UPDATE_OPS.
    ``bn=False``: a bias and ReLU instead (the ResNet without batch norm)."""
    if not bn:
        return _bias_relu(x, name)
    c = int(x.shape[-1])
    with v1.variable_scope(name):
        gamma = v1.get_variable("gamma", [c], initializer=v1.ones_initializer())
        beta = v1.get_variable("beta", [c], initializer=v1.zeros_initializer())
        mean = v1.get_variable("moving_mean", [c], initializer=v1.zeros_initializer(), trainable=False)
        var = v1.get_variable("moving_variance", [c], initializer=v1.ones_initializer(), trainable=False)
        y, bmean, bvar = v1.nn.fused_batch_norm(x, gamma, beta, is_training=True, epsilon=1e-5)
        for moving, batch in ((mean, bmean), (var, bvar)):
            v1.add_to_collection(v1.GraphKeys.UPDATE_OPS,
                                 v1.assign_sub(moving, (1 - BN_MOMENTUM) * (moving - batch)))
        return tf.nn.relu(y, name="relu")


def _block_v2(x: tf.Tensor, filters: int, stride: int, projection: bool, name: str, bn: bool = True,
              branch_scale: float = 1.0) -> tf.Tensor:
    """Pre-activation block: BN-ReLU-conv3x3-BN-ReLU-conv3x3, plus the (projected) shortcut.
    ``branch_scale``: the variance scale of the block's last conv (Fixup's idea: without
    batch norm, blocks at full scale make the activations grow with depth)."""
    with v1.variable_scope(name):
        pre = _bn_relu(x, "bn1", bn)
        shortcut = _conv(pre, filters, 1, stride, "projection") if projection else x
        h = _conv(pre, filters, 3, stride, "conv1")
        h = _bn_relu(h, "bn2", bn)
        h = _conv(h, filters, 3, 1, "conv2", branch_scale)
        return tf.add(h, shortcut, name="add")


def inference(images: tf.Tensor, n: int, filters: int = 16, classes: int = 10,
              family: str = "bn-resnet") -> tf.Tensor:
    """Logits of the 6n+2-layer ``family`` network (FAMILIES) on NHWC ``images``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")
    bn = family == "bn-resnet"
    x = _conv(images, filters, 3, 1, "conv1")
    for stage in range(3):
        for i in range(n):
            if family == "vgg":
                for j in range(2):
                    x = _bias_relu(_conv(x, filters * 2 ** stage, 3, 1, f"stage{stage}/conv{2 * i + j}"),
                                   f"stage{stage}/act{2 * i + j}")
                continue
            first = i == 0 and stage > 0
            x = _block_v2(x, filters * 2 ** stage, 2 if first else 1, first, f"stage{stage}/block{i}", bn,
                          1.0 if bn else 1.0 / (3 * n))
        if family == "vgg" and stage < 2:
            x = tf.nn.max_pool2d(x, 2, 2, "VALID", name=f"stage{stage}/pool")
    x = _bn_relu(x, "pre_activation_final_norm", bn) if family != "vgg" else x
    x = tf.reduce_mean(x, [1, 2], name="final_reduce_mean")
    w = v1.get_variable("dense1/kernel", [int(x.shape[-1]), classes],
                        initializer=v1.glorot_uniform_initializer(seed=7))
    b = v1.get_variable("dense1/bias", [classes], initializer=v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, w), b, name="dense1/logits")


def build_resnet(n: int = 1, batch: int = 32, hw: int = 32, examples: int = 256, seed: int = 0,
                 shared_gradients: bool = False, family: str = "bn-resnet") -> ResNet:
    """Input pipeline, model, loss and train op in the default graph.

    ``shared_gradients``: train with ``hooks.minimize`` (one backward pass shared with
    DumpHook) instead of ``optimizer.minimize``."""
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(examples, hw, hw, 3)).astype(np.float32)
    ys = rng.integers(0, 10, examples).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(batch, drop_remainder=True)
    images, labels = v1.data.make_one_shot_iterator(ds).get_next()
    images = tf.identity(images, name="images")
    labels = tf.identity(labels, name="labels")
    logits = inference(images, n, family=family)
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                          name="cross_entropy")
    l2 = WEIGHT_DECAY * tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()])
    loss = tf.add(xent, l2, name="loss")
    gs = v1.train.get_or_create_global_step()
    base = BASE_LR[family]
    lr = v1.train.piecewise_constant(gs, [10000, 15000, 20000, 25000], [base * f for f in (1, 0.5, 0.1, 0.05, 0.01)])
    with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
        opt = v1.train.MomentumOptimizer(lr, momentum=0.9)
        if shared_gradients:
            import hooks
            train_op = hooks.minimize(opt, loss, global_step=gs)
        else:
            train_op = opt.minimize(loss, global_step=gs)
    return ResNet(images, labels, logits, loss, train_op, gs)
