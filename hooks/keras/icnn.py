"""The ICNN conv-mask layer as a Keras layer (tf.keras 2.15 and Keras 3 on the TF backend).

The maths is ``inspector.icnn``'s (the TF-compat layer), through the same function
(``inspector.icnn.layer.mask_roles``), with the same release semantics: the mask is a constant in
the backward pass (``dx = upstream * relu(m)`` plus the filter-loss term), beta receives only
its pseudo-gradient (or, with ``beta_update="stable"``, moves itself); several classes take
bool [N, K] labels with ``filter_class`` and ``class_density``, as ``conv_mask``. docs/ICNN.md
describes them. What differs is plumbing: beta is a Keras weight, the epoch a non-trainable
Keras weight that ``ICNNEpoch`` sets at every epoch's start (1-based, as the release), and
the labels come in as a second input (``fit`` feeds them like any input).

Example::

    from hooks.keras.icnn import ICNNEpoch, ICNNMask
    images = keras.Input((48, 48, 1)); positive = keras.Input((), dtype="bool")
    top = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(...)
    post = ICNNMask(name="icnn_mask")([top, positive])          # relu(top * mask)
    model = keras.Model([images, positive], logits)
    model.fit([x, y == 1], y, callbacks=[ICNNEpoch()])

    # three classes, filters 0-3 of class 0, 4-7 of class 1, 8-11 of class 2:
    labels = keras.Input((3,), dtype="bool")   # labels[n, k]: sample n is of class k
    post = ICNNMask(filter_class=[0] * 4 + [1] * 4 + [2] * 4,
                    class_density=[0.3, 0.3, 0.3])([top, labels])

In a traced graph (``fit``'s train function, ``InspectCallback``'s probe) the layer registers
its role tensors (pre_mask, mask, mu, sqrtvar, post_mask, beta, strength, filter_loss, and
class_positive with several classes) in the graph's ``ICNN_COLLECTION``, so the catalog marks
them as ``DumpHook``'s does.
"""
from __future__ import annotations

import tensorflow as tf

from hooks.keras.trace import _tf_var
from inspector.icnn import layer as icnn

keras = tf.keras


class ICNNMask(keras.layers.Layer):
    """The ICNN conv mask on ``[x, labels]``: x [N, H, W, C] (>= 0, static H, W, C); labels bool
    [N] (positives of the one class) or [N, K] (static K, with ``filter_class``).

    Arguments as ``inspector.icnn.conv_mask`` (mu, part_filters, beta_init, beta_lr_mult,
    filter_loss, filter_loss_weight, mag, reduction, monitor, register, beta_update, beta_rate,
    beta_watch, filter_class, class_density); the epoch is the layer's ``epoch`` weight, set by
    the ``ICNNEpoch`` callback (1 until then). ``beta_watch`` runs a NumPy check in the step, so
    the layer then tells Keras 3 not to compile the model with XLA."""

    def __init__(self, mu: str = "centroid", part_filters=None, beta_init: float = 2.0,
                 beta_lr_mult: float = 0.05, filter_loss: bool = True,
                 filter_loss_weight: float = 1.0, mag: float = 0.1, reduction: str = "mean",
                 monitor: bool = True, register: bool = True, beta_update: str = "release",
                 beta_rate: float = 0.01, beta_watch: bool = True, filter_class=None,
                 class_density=None, **kwargs) -> None:
        super().__init__(**kwargs)
        icnn.check_options(mu, reduction, beta_update, beta_rate)
        self.mu, self.part_filters, self.beta_init, self.beta_lr_mult = \
            mu, part_filters, beta_init, beta_lr_mult
        self.filter_loss, self.filter_loss_weight, self.mag = filter_loss, filter_loss_weight, mag
        self.reduction, self.monitor, self.register = reduction, monitor, register
        self.beta_update, self.beta_rate, self.beta_watch = beta_update, beta_rate, beta_watch
        # tuples: tf.keras 2.15 would track a list attribute as a ListWrapper (and say so in errors)
        self.filter_class = None if filter_class is None else tuple(int(k) for k in filter_class)
        self.class_density = None if class_density is None \
            else tuple(float(d) for d in class_density)
        self._watch: icnn.BetaWatch | None = None
        if beta_watch:
            # Keras 3's jit_compile="auto": tf.numpy_function cannot be compiled
            self.supports_jit = False

    def build(self, input_shape) -> None:
        shape, labels = list(input_shape[0]), tf.TensorShape(input_shape[1])
        if len(shape) != 4 or None in shape[1:]:
            raise ValueError("ICNNMask needs x as NHWC with static H, W, C, got shape "
                             f"{tuple(shape)}")
        if labels.rank not in (1, 2):
            raise ValueError("ICNNMask needs labels bool [N] (one class) or [N, K] (K classes), "
                             f"got shape {labels}")
        c = int(shape[3])
        self.part = icnn._part_vector(self.part_filters, c)
        self.slices = icnn._class_slices(labels, self.part, self.filter_class, self.class_density,
                                         labels="the labels input (the layer's second)")
        self.beta = self.add_weight(name="beta", shape=(c,),
                                    initializer=keras.initializers.Constant(self.beta_init),
                                    trainable=True)
        self.epoch = self.add_weight(name="epoch", shape=(),
                                     initializer=keras.initializers.Constant(1.0), trainable=False)
        if self.beta_watch:
            self._watch = icnn.BetaWatch(self.name, self.beta_init)
        super().build(input_shape)

    def call(self, inputs):
        x, labels = inputs
        x = tf.convert_to_tensor(x)
        if not x.dtype.is_floating:
            raise ValueError(f"x must be a float tensor, got dtype {x.dtype.name}")
        epoch = tf.maximum(tf.cast(tf.convert_to_tensor(self.epoch), x.dtype), 1.0)
        post, out = icnn.mask_roles(
            x, tf.cast(tf.convert_to_tensor(self.beta), x.dtype), _tf_var(self.beta),
            tf.convert_to_tensor(labels), self.part, self.slices, epoch, mu=self.mu,
            filter_loss=self.filter_loss, filter_loss_weight=self.filter_loss_weight, mag=self.mag,
            reduction=self.reduction, beta_lr_mult=self.beta_lr_mult, beta_update=self.beta_update,
            beta_rate=self.beta_rate, watch=self._watch, monitor=self.monitor)
        if self.register and not tf.executing_eagerly():
            icnn.register_roles(self.name, out, self.slices)
        return post

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self) -> dict:
        return {**super().get_config(), "mu": self.mu, "part_filters": self.part_filters,
                "beta_init": self.beta_init, "beta_lr_mult": self.beta_lr_mult,
                "filter_loss": self.filter_loss, "filter_loss_weight": self.filter_loss_weight,
                "mag": self.mag, "reduction": self.reduction,
                "monitor": self.monitor, "register": self.register, "beta_update": self.beta_update,
                "beta_rate": self.beta_rate, "beta_watch": self.beta_watch,
                "filter_class": None if self.filter_class is None else list(self.filter_class),
                "class_density": None if self.class_density is None else list(self.class_density)}


class ICNNEpoch(keras.callbacks.Callback):
    """Sets every ``ICNNMask``'s ``epoch`` weight to the 1-based epoch at each epoch's start."""

    def on_epoch_begin(self, epoch, logs=None) -> None:
        for layer in self.model._flatten_layers(include_self=False, recursive=True):
            if isinstance(layer, ICNNMask) and layer.built:
                layer.epoch.assign(float(epoch + 1))
