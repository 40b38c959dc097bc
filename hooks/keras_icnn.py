"""The ICNN conv-mask layer as a Keras layer (tf.keras 2.15 and Keras 3 on the TF backend).

The maths is ``inspector.icnn``'s (the TF-compat layer): the same peak position, mask,
filter-loss gradient and beta pseudo-gradient functions, with the same release semantics:
the mask is a constant in the backward pass (``dx = upstream * relu(m)`` plus the filter-loss
term), beta receives only its pseudo-gradient. docs/ICNN.md describes them. What differs is
plumbing: beta is a Keras weight, the epoch a non-trainable Keras weight that ``ICNNEpoch``
sets at every epoch's start (1-based, as the release), and the labels come in as a second
input (``fit`` feeds them like any input).

Example::

    from hooks.keras_icnn import ICNNEpoch, ICNNMask
    images = keras.Input((48, 48, 1)); positive = keras.Input((), dtype="bool")
    top = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(...)
    post = ICNNMask(name="icnn_mask")([top, positive])          # relu(top * mask)
    model = keras.Model([images, positive], logits)
    model.fit([x, y == 1], y, callbacks=[ICNNEpoch()])

In a traced graph (``fit``'s train function, ``InspectCallback``'s probe) the layer registers
its role tensors (pre_mask, mask, mu, sqrtvar, post_mask, beta, strength, filter_loss) in the
graph's ``ICNN_COLLECTION``, so the catalog marks them as ``DumpHook``'s does.
"""
from __future__ import annotations

import tensorflow as tf

from inspector.icnn import layer as icnn
from inspector.format import ICNN_COLLECTION, ICNN_ROLES, icnn_entry

keras = tf.keras


def masked(x: tf.Tensor, beta: tf.Tensor, positive: tf.Tensor, part: tf.Tensor, epoch: tf.Tensor, *,
           mu: str, filter_loss: bool, filter_loss_weight: float, mag: float, reduction: str,
           beta_lr_mult: float) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """``relu(x * m)`` with the release's custom gradient, and the role tensors it computed.

    The same forward and backward as the custom gradient inside ``inspector.icnn.conv_mask``
    (built from its functions ``masked_forward``, ``_filter_grad``, ``_beta_pseudo_grad``)."""
    dtype = x.dtype
    out: dict[str, tf.Tensor] = {}

    @tf.custom_gradient
    def _masked(x_in, beta_v):
        y, roles = icnn.masked_forward(x_in, beta_v, part, mu)
        out.update(roles)
        m, s, sqrtvar = roles["mask"], roles["strength"], roles["sqrtvar"]

        def grad(dy):
            dx = dy * tf.nn.relu(m)
            n = tf.cast(tf.shape(x_in)[0], dtype)
            scale = 1.0 / n if reduction == "mean" else tf.cast(1.0, dtype)
            if filter_loss:
                dx = dx + icnn._filter_grad(x_in, m, s, positive, part, epoch, mag) * (scale * filter_loss_weight)
            dbeta = icnn._beta_pseudo_grad(beta_v, s, sqrtvar, positive, part) * (scale * beta_lr_mult)
            return dx, dbeta

        return y, grad

    return _masked(x, beta), out


class ICNNMask(keras.layers.Layer):
    """The ICNN conv mask on ``[x, positive]``: x [N, H, W, C] (>= 0, static H, W, C), positive bool [N].

    Arguments as ``inspector.icnn.conv_mask`` (mu, part_filters, beta_init, beta_lr_mult,
    filter_loss, filter_loss_weight, mag, reduction, monitor, register); the epoch is the
    layer's ``epoch`` weight, set by the ``ICNNEpoch`` callback (1 until then)."""

    def __init__(self, mu: str = "centroid", part_filters=None, beta_init: float = 2.0, beta_lr_mult: float = 0.05,
                 filter_loss: bool = True, filter_loss_weight: float = 1.0, mag: float = 0.1,
                 reduction: str = "mean", monitor: bool = True, register: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if mu not in ("centroid", "argmax"):
            raise ValueError(f"mu must be 'centroid' or 'argmax', got {mu!r}")
        self.mu, self.part_filters, self.beta_init, self.beta_lr_mult = mu, part_filters, beta_init, beta_lr_mult
        self.filter_loss, self.filter_loss_weight, self.mag = filter_loss, filter_loss_weight, mag
        self.reduction, self.monitor, self.register = reduction, monitor, register

    def build(self, input_shape) -> None:
        shape = list(input_shape[0])
        if len(shape) != 4 or None in shape[1:]:
            raise ValueError(f"ICNNMask needs x as NHWC with static H, W, C, got shape {tuple(shape)}")
        c = int(shape[3])
        self.part = icnn._part_vector(self.part_filters, c)
        self.beta = self.add_weight(name="beta", shape=(c,), initializer=keras.initializers.Constant(self.beta_init),
                                    trainable=True)
        self.epoch = self.add_weight(name="epoch", shape=(), initializer=keras.initializers.Constant(1.0),
                                     trainable=False)
        super().build(input_shape)

    def call(self, inputs):
        x, positive = inputs
        x = tf.convert_to_tensor(x)
        if not x.dtype.is_floating:
            raise ValueError(f"x must be a float tensor, got dtype {x.dtype.name}")
        _, h, w, c = x.shape.as_list()
        positive = tf.reshape(tf.cast(positive, tf.bool), [-1])
        pre = tf.identity(x, name="pre_mask")
        beta = tf.identity(tf.cast(tf.convert_to_tensor(self.beta), x.dtype), name="beta_value")
        epoch = tf.maximum(tf.cast(tf.convert_to_tensor(self.epoch), x.dtype), 1.0)
        part = tf.constant(self.part)
        y, out = masked(pre, beta, positive, part, epoch, mu=self.mu, filter_loss=self.filter_loss,
                        filter_loss_weight=self.filter_loss_weight, mag=self.mag, reduction=self.reduction,
                        beta_lr_mult=self.beta_lr_mult)
        post = tf.identity(y, name="post_mask")
        if self.monitor:
            with tf.name_scope("monitor"):  # DumpHook/InspectCallback(exclude=r"/monitor/") drops its templates
                fl = icnn._filter_loss_value(pre, beta, part, positive, h, w)
        else:
            fl = tf.zeros([c], x.dtype)
        out.update(pre_mask=pre, post_mask=post, beta=beta, filter_loss=tf.identity(fl, name="filter_loss"))
        if self.register and not tf.executing_eagerly():
            for role in ICNN_ROLES:
                tf.compat.v1.add_to_collection(ICNN_COLLECTION, icnn_entry(self.name, role, out[role].name))
        return post

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self) -> dict:
        return {**super().get_config(), "mu": self.mu, "part_filters": self.part_filters,
                "beta_init": self.beta_init, "beta_lr_mult": self.beta_lr_mult, "filter_loss": self.filter_loss,
                "filter_loss_weight": self.filter_loss_weight, "mag": self.mag, "reduction": self.reduction,
                "monitor": self.monitor, "register": self.register}


class ICNNEpoch(keras.callbacks.Callback):
    """Sets every ``ICNNMask``'s ``epoch`` weight to the 1-based epoch at each epoch's start."""

    def on_epoch_begin(self, epoch, logs=None) -> None:
        for layer in self.model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, ICNNMask) and layer.built:
                layer.epoch.assign(float(epoch + 1))
