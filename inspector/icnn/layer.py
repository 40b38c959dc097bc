"""The ICNN conv-mask layer (Zhang, Wu, Zhu, CVPR 2018) for TF1-style graphs.

Imports TensorFlow: ``import inspector`` never imports this module; import it
explicitly (``from inspector.icnn import layer``) inside a ``model_fn``. Built only from
``tf.nn`` / ``tf.compat.v1`` primitives (no Keras, no ``tf.compat.v1.layers``), so it
runs under TensorFlow 2.15 and the latest TensorFlow alike. docs/ICNN.md describes it;
where the paper and the authors' MatConvNet release differ, the release is followed.

Example (inside a model_fn)::

    from inspector.icnn import layer as icnn
    x = tf.nn.relu(conv3)                                   # [N, H, W, C], x >= 0
    epoch = icnn.epoch_from_step(tf.compat.v1.train.get_or_create_global_step(), 60)
    post = icnn.conv_mask(x, tf.equal(labels, 1), epoch, name="icnn_mask")
    logits = next_layers(post)

Tensors registered for the dump hook
------------------------------------
For every role in ``inspector.format.ICNN_ROLES`` the layer adds
one entry per role to the graph collection ``inspector.format.ICNN_COLLECTION``
(see :func:`registered`).
Each tensor is a float op output named ``<layer>/<role>:0``, except beta's,
``<layer>/beta_value:0`` (``<layer>/beta`` is the variable). Shapes (the viewer relies on them):

============  ==============  ============================================================
role          shape           meaning
============  ==============  ============================================================
pre_mask      [N, H, W, C]    x, the layer input (a ReLU output, so >= 0)
mask          [N, H, W, C]    m in [-1, 1]; 1 for channels that are not part filters
mu            [N, C, 2]       (row, col) of each map's peak, in [-1, 1] map coordinates:
                              row = linspace(-1, 1, H)[i], col = linspace(-1, 1, W)[j]
sqrtvar       [N, C]          spatial std of the map around mu, in map pixels
post_mask     [N, H, W, C]    relu(x * m), the layer output
beta          [C]             the per-channel mask sharpness (a variable's value)
strength      [N, C]          s = mean_hw(x * m)
filter_loss   [C]             monitoring estimate of -MI(X; T) over the batch (see below)
============  ==============  ============================================================

A multi-class layer (labels [N, K]) also registers ``class_positive`` (``ICNN_CLASS_ROLES``):
[N, K], 1.0 where sample n is a positive of class k, the labels its groups use; its entry
carries ``filter_class`` (:func:`filter_classes`), which the hook writes into the catalog.

Scale of the filter-loss gradient
---------------------------------
The release sums the classification loss over the batch, adds the filter-loss term
``1e-5 * g`` to the per-sample gradient at x, and divides every parameter gradient by the
batch size at the update. A mean-reduced TF loss already carries the 1/N, so with
``reduction="mean"`` (default) the filter-loss term and beta's pseudo-gradient are divided
by the (dynamic) batch size N: the ratio of filter-loss to classification gradient, and the
update of beta, are then those of the release. Use ``reduction="sum"`` with a
sum-reduced loss. ``filter_loss_weight`` multiplies the term on top (1.0 = release).

beta
----
beta is a ``[C]`` variable (initial 2.0) in ``GLOBAL_VARIABLES``/``TRAINABLE_VARIABLES`` and
in ``BETA_COLLECTION``; it has no regularizer. Its gradient is the release's pseudo-gradient
``(beta - clip(3/t, 1.5, 3)) * 1e4`` times ``beta_lr_mult`` (0.05, the release's learning-rate
multiplier; with plain SGD/momentum scaling the gradient is scaling the learning rate).
Adaptive optimizers (Adam) undo gradient scaling: give beta its own optimizer if that
matters. Exclude beta from a hand-written weight decay with :func:`weight_decay_variables`.

Monitoring value ``filter_loss``
--------------------------------
The release never computes the loss value. ``filter_loss[c]`` is the paper's
``-MI(X; T)`` with X = the maps of channel c in this batch (uniform), the templates
T = {T-} + {T_mu : mu on the H x W grid} built with the current beta (same formula as the
mask; T- = -1 everywhere), priors p(T-) = 1 - alpha, p(T_mu) = alpha / (H*W) with alpha the
fraction of positives in the batch, and ``p(x|T) = exp(mean_hw(x * T) / a) / Z_T`` with
``a = 0.5`` (the gradient's temperature; the paper's ``tr(x . T)`` with tau = 1/(a*H*W)) and
Z_T summed over the batch. Lower is better: it is low when each map matches one template
sharply (a single compact peak). Like the paper's MI it does not see labels (a filter that
also fires on negatives is not penalised; watch ``strength`` per group for that), it cannot
know where ground-truth parts are (use ``inspector.icnn.stability``), and it scales with the
activation energy: maps with small activations give values near 0 for every filter.
Its internals live under ``<layer>/monitor/``; ``DumpHook(exclude=r"/monitor/")`` keeps their
[H*W, H, W, C] template tensors out of the dumps. Cost O(N * C * (H*W)^2); pass ``monitor=False`` to
replace it by zeros.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from inspector.format import ICNN_COLLECTION, ICNN_ROLES, icnn_entry, parse_icnn_entry

tf1 = tf.compat.v1

#: Graph collection holding every ICNN beta variable (to exclude from weight decay).
BETA_COLLECTION = "tf_inspector/icnn_beta"

ALPHA = 0.5            # temperature a of the filter loss (release: alpha = 0.5)
FILTER_GRAD_SCALE = 1e-5  # release: 0.00001 * w_pos / w_neg
BETA_GRAD_SCALE = 1e4     # release: (target - beta) * (-10000)
BETA_TARGET_RANGE = (1.5, 3.0)  # release: min(max(3 ./ t, 1.5), 3)
BETA_UPDATES = ("release", "stable")


def epoch_from_step(step: tf.Tensor, steps_per_epoch: int) -> tf.Tensor:
    """1-based epoch (as in the release) from a global step: ``step // steps_per_epoch + 1``.

    >>> epoch = epoch_from_step(tf1.train.get_or_create_global_step(), 60)  # doctest: +SKIP
    """
    if int(steps_per_epoch) < 1:
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    step = tf.cast(step, tf.int64)
    return tf.cast(step // int(steps_per_epoch) + 1, tf.float32)


def weight_decay_variables(variables: Optional[Sequence[tf.Variable]] = None,
                           graph: Optional[tf.Graph] = None) -> list:
    """Trainable variables minus every ICNN beta: what a hand-written L2 term should cover.

    >>> l2 = tf.add_n([tf.nn.l2_loss(v) for v in weight_decay_variables()])  # doctest: +SKIP
    """
    graph = graph or tf1.get_default_graph()
    if variables is None:
        variables = graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)
    betas = {id(v) for v in graph.get_collection(BETA_COLLECTION)}
    return [v for v in variables if id(v) not in betas]


def _grid(n: int, dtype) -> tf.Tensor:
    # np.linspace(-1, 1, n): the release's posTemp / linspace(-1, 1, h).
    return tf.constant(np.linspace(-1.0, 1.0, n), dtype=dtype)


def _part_vector(part_filters, channels: int) -> np.ndarray:
    """Boolean [C] from None (all), an int count (the first k, like the release's partRate),
    or a length-C sequence of bools."""
    if part_filters is None:
        return np.ones(channels, bool)
    if isinstance(part_filters, (int, np.integer)) and not isinstance(part_filters, bool):
        if not 0 <= part_filters <= channels:
            raise ValueError(f"part_filters={part_filters} must be between 0 and C={channels}")
        out = np.zeros(channels, bool)
        out[: int(part_filters)] = True
        return out
    arr = np.asarray(part_filters, dtype=bool)
    if arr.shape != (channels,):
        raise ValueError("part_filters must be None, an int or a bool vector of length "
                         f"C={channels}, got shape {arr.shape}")
    return arr


def mu_and_sqrtvar(x: tf.Tensor, mu: str = "centroid"):
    """Integer peak position (1-based row, col) and sqrtvar of each map, as ``getMu.m``.

    Returns ``(mu_row, mu_col, sqrtvar)``, each [N, C], in x's dtype. ``centroid``: the
    activation-weighted mean position rounded half up (MATLAB ``round`` for v >= 0) and
    clipped below at 1; ``argmax``: the first largest activation in MATLAB's column-major
    order. sqrtvar is the spatial std around that position, in pixels.
    """
    _, h, w, _ = x.shape.as_list()
    dtype = x.dtype
    rows = tf.reshape(tf.range(1, h + 1, dtype=tf.int32), [1, h, 1, 1])
    cols = tf.reshape(tf.range(1, w + 1, dtype=tf.int32), [1, 1, w, 1])
    rows_f, cols_f = tf.cast(rows, dtype), tf.cast(cols, dtype)
    total = tf.maximum(tf.reduce_sum(x, axis=[1, 2]), tf.cast(1e-9, dtype))  # [N, C]
    if mu == "centroid":
        r = tf.reduce_sum(x * rows_f, axis=[1, 2]) / total
        c = tf.reduce_sum(x * cols_f, axis=[1, 2]) / total
        mu_r = tf.maximum(tf.floor(r + 0.5), 1.0)
        mu_c = tf.maximum(tf.floor(c + 0.5), 1.0)
    elif mu == "argmax":
        # Column-major flattening (H fastest), so ties resolve like MATLAB's max.
        n_c_w_h = tf.transpose(x, [0, 3, 2, 1])
        flat = tf.reshape(n_c_w_h, tf.stack([tf.shape(x)[0], x.shape[3], w * h]))
        idx = tf.argmax(flat, axis=2, output_type=tf.int32)
        mu_r = tf.cast(idx % h + 1, dtype)
        mu_c = tf.cast(idx // h + 1, dtype)
    else:
        raise ValueError(f"mu must be 'centroid' or 'argmax', got {mu!r}")
    d2 = (tf.square(rows_f - mu_r[:, None, None, :]) + tf.square(cols_f - mu_c[:, None, None, :]))
    sqrtvar = tf.sqrt(tf.reduce_sum(d2 * x, axis=[1, 2]) / total)
    return mu_r, mu_c, sqrtvar


def mask_from_mu(mu_r: tf.Tensor, mu_c: tf.Tensor, beta: tf.Tensor, part: tf.Tensor,
                 h: int, w: int):
    """The mask ``max(1 - beta * (|gy - mu_row| + |gx - mu_col|), -1)``
    (``getMask``), 1 off part filters.

    ``mu_r``, ``mu_c``: 1-based integer peak positions [N, C] (:func:`mu_and_sqrtvar`); ``beta``
    [C]; ``part`` bool [C]. Returns ``(mask [N, H, W, C], mu_row, mu_col)``, mu in [-1, 1] map
    coordinates. ``inspector.icnn.templates.template_at`` is its NumPy twin.

    >>> m, _, _ = mask_from_mu(tf.ones([1, 1]), tf.ones([1, 1]), tf.constant([2.0]),
    ...                        tf.constant([True]), 3, 3)          # doctest: +SKIP
    """
    dtype = mu_r.dtype
    gy, gx = _grid(h, dtype), _grid(w, dtype)
    mu_row = tf.gather(gy, tf.cast(mu_r, tf.int32) - 1)   # [N, C] in [-1, 1]
    mu_col = tf.gather(gx, tf.cast(mu_c, tf.int32) - 1)
    dist = (tf.abs(gy[None, :, None, None] - mu_row[:, None, None, :])
            + tf.abs(gx[None, None, :, None] - mu_col[:, None, None, :]))
    m = tf.maximum(1.0 - dist * beta[None, None, None, :], -1.0)
    m = tf.where(tf.broadcast_to(part, tf.shape(m)), m, tf.ones_like(m))
    return m, mu_row, mu_col


def masked_forward(x: tf.Tensor, beta: tf.Tensor, part: tf.Tensor, mu: str = "centroid"):
    """``(relu(x * m), roles)``: the layer's forward pass,
    shared by ``conv_mask`` and the Keras layer.

    ``roles`` holds the named tensors ``mask``, ``strength``, ``mu`` and ``sqrtvar`` (created in
    the caller's name scope, so they are ``<layer>/mask:0`` ...)."""
    _, h, w, _ = x.shape.as_list()
    mu_r, mu_c, sqrtvar = mu_and_sqrtvar(x, mu)
    m, mu_row, mu_col = mask_from_mu(mu_r, mu_c, beta, part, h, w)
    m = tf.identity(m, name="mask")
    s = tf.identity(tf.reduce_mean(x * m, axis=[1, 2]), name="strength")
    roles = {"mask": m, "strength": s,
             "mu": tf.identity(tf.stack([mu_row, mu_col], axis=2), name="mu"),
             "sqrtvar": tf.identity(sqrtvar, name="sqrtvar")}
    return tf.nn.relu(x * m), roles


def _replace_inf(v: tf.Tensor, valid: tf.Tensor) -> tf.Tensor:
    """MATLAB ``v(isinf(v)) = max(v(~isinf(v)))`` over the valid entries (0 if none finite)."""
    finite = tf.logical_and(valid, tf.math.is_finite(v))
    big = tf.reduce_max(tf.where(finite, v, tf.fill(tf.shape(v), tf.cast(-np.inf, v.dtype))))
    big = tf.where(tf.math.is_finite(big), big, tf.zeros_like(big))
    return tf.where(tf.math.is_inf(v), tf.fill(tf.shape(v), big), v)


def _replace_nan(v: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.math.is_nan(v), tf.zeros_like(v), v)


def _normalised_strength(g, valid_n, valid, mag):
    """The release's clean-up and normalisation of g ([N, C]) over the rows in valid_n."""
    g = _replace_nan(_replace_inf(g, valid))
    g = tf.where(valid, g, tf.zeros_like(g))
    count = tf.reduce_sum(tf.cast(valid_n, g.dtype))  # positives (or negatives) in the batch
    mean = tf.reduce_sum(g, axis=0) / count            # [C]; NaN when count == 0, masked below
    g = g / (mean[None, :] * mag)
    g = _replace_inf(_replace_nan(g), valid)
    return tf.where(valid, g, tf.zeros_like(g))


def _filter_loss_value(x, beta, part, positive, h, w):
    """Batch estimate of -MI(X; T) per channel; see the module docstring."""
    dtype = x.dtype
    gy, gx = _grid(h, dtype), _grid(w, dtype)
    # Templates for every grid position mu = (gy[i], gx[j]): [L, H, W] distances.
    dist = (tf.abs(gy[None, :, None]
                   - tf.reshape(tf.tile(gy[:, None], [1, w]), [-1])[:, None, None])
            + tf.abs(gx[None, None, :]
                     - tf.reshape(tf.tile(gx[None, :], [h, 1]), [-1])[:, None, None]))
    temps = tf.maximum(1.0 - dist[..., None] * beta[None, None, None, :], -1.0)  # [L, H, W, C]
    temps = tf.where(tf.broadcast_to(part, tf.shape(temps)), temps, tf.ones_like(temps))
    n_t = h * w  # L: the number of positive templates
    scores_pos = tf.einsum("nhwc,lhwc->ncl", x, temps) / (h * w * ALPHA)       # [N, C, L]
    scores_neg = -tf.reduce_mean(x, axis=[1, 2])[..., None] / ALPHA            # [N, C, 1]
    scores = tf.concat([scores_neg, scores_pos], axis=2)                       # [N, C, L+1]
    log_p_x_t = scores - tf.reduce_logsumexp(scores, axis=0, keepdims=True)    # over the batch
    alpha = tf.reduce_mean(tf.cast(positive, dtype))
    tiny = tf.cast(1e-30, dtype)
    log_prior = tf.concat([tf.math.log(tf.maximum(1.0 - alpha, tiny))[None],
                           tf.fill([n_t], tf.math.log(tf.maximum(alpha / n_t, tiny)))], axis=0)
    prior = tf.concat([(1.0 - alpha)[None], tf.fill([n_t], alpha / n_t)], axis=0)   # [L+1]
    log_p_x = tf.reduce_logsumexp(log_p_x_t + log_prior, axis=2, keepdims=True)  # [N, C, 1]
    mi = tf.reduce_sum(prior * tf.reduce_sum(tf.exp(log_p_x_t) * (log_p_x_t - log_p_x), axis=0),
                       axis=1)
    return -mi


def conv_mask(x: tf.Tensor,
              labels_positive: tf.Tensor,
              epoch: Union[tf.Tensor, float, None] = None,
              *,
              step: Optional[tf.Tensor] = None,
              steps_per_epoch: Optional[int] = None,
              name: str = "icnn_mask",
              mu: str = "centroid",
              part_filters=None,
              beta_init: float = 2.0,
              beta_lr_mult: float = 0.05,
              filter_loss: bool = True,
              filter_loss_weight: float = 1.0,
              mag: float = 0.1,
              reduction: str = "mean",
              monitor: bool = True,
              register: bool = True,
              beta_update: str = "release",
              beta_rate: float = 0.01,
              beta_watch: bool = True,
              filter_class=None,
              class_density=None) -> tf.Tensor:
    """Apply the ICNN mask to ``x`` ([N, H, W, C], x >= 0); return ``relu(x * mask)``.

    Args:
      x: a ReLU (or max-pool of a ReLU) output with static H, W, C.
      labels_positive: bool [N], True for images of the (single) positive class; or, for
        several classes, bool [N, K] (column k: images of class k) with ``filter_class``.
      epoch: current 1-based epoch (float scalar tensor); or give ``step`` and
        ``steps_per_epoch`` instead. Values below 1 are treated as 1.
      name: variable scope and name prefix of the registered tensors.
      mu: ``"centroid"`` (release) or ``"argmax"`` (paper).
      part_filters: None (all channels), an int k (the first k), or a bool [C]; other
        channels get mask 1, no filter loss and a zero beta gradient.
      beta_init, beta_lr_mult: initial beta and the factor on its pseudo-gradient.
      filter_loss: add the filter-loss gradient at x (False: only ``upstream * relu(m)``).
      filter_loss_weight: extra factor on that gradient (1.0 = the release's scale).
      mag: the release's ``l.mag``: the term is divided by ``epoch / mag``.
      reduction: ``"mean"`` for a batch-mean loss (divide the injected terms by N) or ``"sum"``.
      monitor: build the ``filter_loss`` monitoring value (else zeros).
      register: add the role tensors to ``ICNN_COLLECTION``.
      beta_update: ``"release"`` (default): beta gets the release's pseudo-gradient and the
        optimizer moves it (its step can exceed 1 and diverge; see docs/ICNN.md).
        ``"stable"``: every gradient computation moves beta itself,
        ``beta += beta_rate * (target - beta)``, and beta's gradient is 0.
      beta_rate: the stable update's step, in (0, 1).
      beta_watch: log a warning once (:class:`BetaWatch`) when beta leaves the targets'
        range or oscillates around its target.
      filter_class: with [N, K] labels, an int [C]: the class whose filter slice each
        channel belongs to (the release's argmax of ``sliceMag``); values in [0, K).
      class_density: with K <= 10 classes, float [K] in (0, 1): each class's share of the
        training images; the release weighs class k's terms by ``w_pos = 0.5 / density[k]``,
        ``w_neg = 0.5 / (1 - density[k])`` (with K > 10: ``0.5 * K`` and ``0.5 / (1 - 1 / K)``).

    The backward pass treats the mask as a constant: ``dx = upstream * relu(m)`` plus the
    filter-loss term; beta receives only its pseudo-gradient. See the module docstring.
    """
    x = tf.convert_to_tensor(x)
    if x.shape.rank != 4 or None in x.shape.as_list()[1:]:
        raise ValueError(f"x must be NHWC with static H, W, C, got shape {x.shape}")
    if not x.dtype.is_floating:
        raise ValueError(f"x must be a float tensor, got dtype {x.dtype.name}")
    check_options(mu, reduction, beta_update, beta_rate)
    c = x.shape.as_list()[3]
    dtype = x.dtype
    if epoch is None:
        if step is None or steps_per_epoch is None:
            raise ValueError("conv_mask needs epoch, or both step and steps_per_epoch")
        epoch = epoch_from_step(step, steps_per_epoch)
    epoch = tf.maximum(tf.cast(epoch, dtype), 1.0)
    part_np = _part_vector(part_filters, c)
    labels_positive = tf.convert_to_tensor(labels_positive)
    slices = _class_slices(labels_positive.shape, part_np, filter_class, class_density)

    with tf1.variable_scope(name):
        beta_var = tf1.get_variable("beta", shape=[c], dtype=dtype,
                                    initializer=tf1.constant_initializer(beta_init), trainable=True)
        if all(v is not beta_var for v in tf1.get_collection(BETA_COLLECTION)):  # `in` would use ==
            tf1.add_to_collection(BETA_COLLECTION, beta_var)
        scope = tf1.get_variable_scope().original_name_scope
    with tf1.name_scope(scope):
        watch = BetaWatch(name, beta_init) if beta_watch else None
        post, out = mask_roles(x, beta_var, beta_var, labels_positive, part_np, slices, epoch,
                               mu=mu, filter_loss=filter_loss,
                               filter_loss_weight=filter_loss_weight, mag=mag, reduction=reduction,
                               beta_lr_mult=beta_lr_mult, beta_update=beta_update,
                               beta_rate=beta_rate, watch=watch, monitor=monitor)
    if register:
        register_roles(name, out, slices)
    return post


def register_roles(layer: str, out: dict[str, tf.Tensor], slices) -> None:
    """Add each role tensor of ``out`` to the default graph's ``ICNN_COLLECTION``; with class
    slices (:func:`_class_slices`) also ``class_positive``, carrying each filter's class."""
    for role in ICNN_ROLES:
        tf1.add_to_collection(ICNN_COLLECTION, icnn_entry(layer, role, out[role].name))
    if slices is not None:
        tf1.add_to_collection(ICNN_COLLECTION,
                              icnn_entry(layer, "class_positive", out["class_positive"].name,
                                         filter_classes(slices)))


_OBSERVER = threading.local()   # .on: gradients built now are an observer's extra pass


@contextlib.contextmanager
def observer_gradients() -> Iterator[None]:
    """Gradients built inside are an observer's extra backward pass (``DumpHook``'s own
    ``tf.gradients``, the Keras callback's probe), not the training step's: the layer's
    gradient then leaves out its side effects, the ``"stable"`` update of beta and the beta
    watch, which belong to the training step's one pass (an observer's pass would otherwise
    move beta a second time on every sampled step, on the observer's samples). The values
    are the same either way (beta's gradient is 0 under the stable update).

    >>> with observer_gradients():                      # doctest: +SKIP
    ...     grads = tf.gradients(loss, captured)
    """
    before = getattr(_OBSERVER, "on", False)
    _OBSERVER.on = True
    try:
        yield
    finally:
        _OBSERVER.on = before


def check_options(mu: str, reduction: str, beta_update: str, beta_rate: float) -> None:
    """ValueError naming the bad value of any of these ``conv_mask`` / ``ICNNMask`` arguments."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if mu not in ("centroid", "argmax"):
        raise ValueError(f"mu must be 'centroid' or 'argmax', got {mu!r}")
    if beta_update not in BETA_UPDATES:
        raise ValueError(f"beta_update must be one of {BETA_UPDATES}, got {beta_update!r}")
    if isinstance(beta_rate, (bool, str)) or not isinstance(beta_rate, (int, float, np.number)) \
            or not 0.0 < float(beta_rate) < 1.0:
        raise ValueError("beta_rate must be a number in (0, 1) so beta cannot overshoot its "
                         f"target, got {beta_rate!r}")


def mask_roles(x: tf.Tensor, beta_read, beta_var, labels: tf.Tensor, part_np: np.ndarray, slices,
               epoch: tf.Tensor, *, monitor: bool,
               **grad_options) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The layer's output ``relu(x * m)`` and every role tensor, built in the current name scope
    under the registered names (``pre_mask``, ``beta_value``, ``post_mask``, ``filter_loss``,
    ``class_positive`` with class slices; the rest from :func:`masked_forward`): the one body
    of :func:`conv_mask` and the Keras ``ICNNMask``. ``beta_read``: beta's value as the layer
    uses it; ``grad_options``: :func:`masked`'s keyword arguments."""
    _, h, w, c = x.shape.as_list()
    labels, valid = bool_labels(labels)
    positive, groups = _class_groups(labels, part_np, slices)
    pre = tf.identity(x, name="pre_mask")
    beta = tf.identity(beta_read, name="beta_value")  # the read, passed into the custom grad
    part = tf.constant(part_np)
    y, out = masked(pre, beta, beta_var, part, groups, epoch, **grad_options)
    # labels not all 0/1 where the assertion did not run (XLA): a NaN, not a guess
    if valid is not None:
        y = y + tf.cast(tf.where(valid, 0.0, np.nan), y.dtype)
    post = tf.identity(y, name="post_mask")
    if monitor:
        # Own scope: its [H*W, H, W, C] template tensors are worth leaving out of dumps
        # (DumpHook/InspectCallback(exclude=r"/monitor/")).
        with tf.name_scope("monitor"):
            fl = _filter_loss_value(pre, beta, part, positive, h, w)
    else:
        fl = tf.zeros([c], x.dtype)
    out.update(pre_mask=pre, post_mask=post, beta=beta,
               filter_loss=tf.identity(fl, name="filter_loss"))
    if slices is not None:   # the viewer's class split: exactly the labels the groups used
        out["class_positive"] = tf.identity(tf.cast(labels, x.dtype), name="class_positive")
    return post, out


def masked(x: tf.Tensor, beta: tf.Tensor, beta_var, part: tf.Tensor, groups, epoch: tf.Tensor, *,
           mu: str, filter_loss: bool, filter_loss_weight: float, mag: float, reduction: str,
           beta_lr_mult: float, beta_update: str, beta_rate: float,
           watch: "BetaWatch | None") -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """``relu(x * m)`` with the release's custom gradient, and the role tensors it computed.

    The one implementation of the layer's forward and backward (through :func:`mask_roles`,
    for :func:`conv_mask` and the Keras ``ICNNMask`` alike). ``beta``: beta's read (the value used);
    ``beta_var``: the variable (assigned by the ``"stable"`` update); ``groups``:
    :func:`_class_groups`'s list."""
    dtype = x.dtype
    out: dict[str, tf.Tensor] = {}  # role -> tensor

    @tf.custom_gradient
    def _masked(x_in, beta_v):
        y, roles = masked_forward(x_in, beta_v, part, mu)
        out.update(roles)
        m, s, sqrtvar = roles["mask"], roles["strength"], roles["sqrtvar"]

        def _beta_step(dx, beta_v, s, sqrtvar, scale):
            """(dx, d beta): the release's pseudo-gradient, or the stable update and 0."""
            target = _group_target(groups, s, sqrtvar)
            acting = not getattr(_OBSERVER, "on", False)   # read when the backward pass is built
            deps = [_watch_beta(watch, beta_v, target, part)] if watch is not None and acting \
                else []
            if beta_update == "stable":
                if acting:
                    new = tf.where(part,
                                   beta_v + tf.cast(beta_rate, dtype) * (target - beta_v), beta_v)
                    deps.append(beta_var.assign(new))
                with tf.control_dependencies(deps):
                    return tf.identity(dx), tf.zeros_like(beta_v)
            dbeta = _pseudo_grad_toward(beta_v, target, part) * (scale * beta_lr_mult)
            with tf.control_dependencies(deps):
                return dx, tf.identity(dbeta)

        def grad(dy):
            dx = dy * tf.nn.relu(m)
            n = tf.cast(tf.shape(x_in)[0], dtype)
            scale = 1.0 / n if reduction == "mean" else tf.cast(1.0, dtype)
            if filter_loss:
                terms = [_filter_grad(x_in, m, s, pos_k, tf.constant(part_k), epoch,
                                      mag, w_pos, w_neg)
                         for pos_k, part_k, w_pos, w_neg in groups]   # disjoint channels
                dx = dx + tf.add_n(terms) * (scale * filter_loss_weight)
            return _beta_step(dx, beta_v, s, sqrtvar, scale)

        return y, grad

    return _masked(x, beta), out


def filter_classes(slices) -> list[int]:
    """The class of each filter from :func:`_class_slices`, -1 for filters that are no part filter.

    >>> filter_classes([(np.array([True, False, False]), 1, 1),
    ...                 (np.array([False, True, False]), 1, 1)])
    [0, 1, -1]
    """
    out = np.full(slices[0][0].size, -1, np.int64)
    for k, (part_k, _, _) in enumerate(slices):
        out[part_k] = k
    return out.tolist()


def _filter_grad(x, m, s, positive, part, epoch, mag, w_pos=1.0, w_neg=1.0):
    """The release's filter-loss term at x ([N, H, W, C]), before the 1/N of ``reduction``."""
    dtype = x.dtype
    a = ALPHA
    m_flip = tf.reverse(m, axis=[0, 3])     # MATLAB mask(:,:,end:-1:1,end:-1:1): channels and batch
    log_z_pos = a * tf.math.log(tf.reduce_mean(tf.exp(tf.reduce_mean(x * m_flip, axis=[1, 2]) / a),
                                               axis=0))
    log_z_neg = a * tf.math.log(tf.reduce_mean(tf.exp(tf.reduce_mean(-x, axis=[1, 2]) / a), axis=0))
    # Over all channels, as the release does (its logZ vectors span every filter).
    log_z_pos = _replace_inf(log_z_pos, tf.ones_like(log_z_pos, tf.bool))
    log_z_neg = _replace_inf(log_z_neg, tf.ones_like(log_z_neg, tf.bool))
    mag_t = epoch / mag
    part_row = part[None, :]

    pos_n = positive[:, None]
    valid_pos = tf.logical_and(pos_n, part_row)
    g_pos = tf.exp(s / a) * (s - log_z_pos[None, :] + a)
    g_pos = _normalised_strength(g_pos, positive, valid_pos, mag_t)

    neg_n = tf.logical_not(positive)[:, None]
    valid_neg = tf.logical_and(neg_n, part_row)
    sn = tf.reduce_mean(x, axis=[1, 2])
    g_neg = tf.exp(-sn / a) * (-sn - log_z_neg[None, :] + a)
    g_neg = _normalised_strength(g_neg, tf.logical_not(positive), valid_neg, mag_t)

    term = (-m * g_pos[:, None, None, :] * (FILTER_GRAD_SCALE * w_pos)
            + g_neg[:, None, None, :] * (FILTER_GRAD_SCALE * w_neg) * tf.ones_like(x))
    return tf.cast(term, dtype)


def _class_slices(labels_shape: tf.TensorShape, part_np: np.ndarray, filter_class, class_density,
                  labels: str = "labels_positive"):
    """None for one class; for [N, K] labels, [(part channels of class k [C] bool, w_pos, w_neg)]
    with the release's weights (see :func:`conv_mask`). Checked before any op is built."""
    if labels_shape.rank != 2:
        if filter_class is not None or class_density is not None:
            raise ValueError(f"filter_class and class_density need {labels} of shape [N, K], got "
                             f"shape {labels_shape}")
        return None
    k = labels_shape.as_list()[1]
    if k is None:
        raise ValueError(f"{labels} [N, K] needs a static K, got shape {labels_shape}")
    channels = part_np.size
    fc = np.asarray(filter_class if filter_class is not None else [], dtype=np.int64)
    if fc.shape != (channels,) or (fc[part_np] < 0).any() or (fc[part_np] >= k).any():
        raise ValueError(f"with {labels} [N, {k}], filter_class must be an int vector of length "
                         f"C={channels} with values in [0, {k}) on part channels, got "
                         f"{filter_class!r}")
    if k > 10:
        weights = [(0.5 * k, 0.5 / (1.0 - 1.0 / k))] * k
    else:
        dens = np.asarray(class_density if class_density is not None else [], dtype=np.float64)
        if dens.shape != (k,) or not ((dens > 0) & (dens < 1)).all():
            raise ValueError(f"with K={k} <= 10 classes, class_density must be K shares in (0, 1) "
                             "(the release weighs class k by 0.5 / density[k]), got "
                             f"{class_density!r}")
        weights = [(0.5 / d, 0.5 / (1.0 - d)) for d in dens]
    return [(part_np & (fc == j), w_pos, w_neg) for j, (w_pos, w_neg) in enumerate(weights)]


def bool_labels(labels) -> tuple[tf.Tensor, tf.Tensor | None]:
    """(``labels`` as bool, ``valid``): bool labels as given (``valid`` None); numbers only where
    every value is 0 or 1, else InvalidArgumentError at the step, and ``valid`` (a bool scalar)
    is False: XLA drops the assertion, so the layer turns its output NaN on such a step
    instead. Why: a cast makes every nonzero value True, so soft or smoothed labels (0.9 /
    0.01) would silently make every sample a positive of every class.

    >>> bool_labels(tf.constant([[0.0, 1.0]]))[0].dtype
    tf.bool
    """
    labels = tf.convert_to_tensor(labels)
    if labels.dtype == tf.bool:
        return labels, None
    if not (labels.dtype.is_integer or labels.dtype.is_floating):
        raise ValueError("ICNN labels must be bool (or 0/1 numbers), got dtype "
                         f"{labels.dtype.name}")
    binary = tf.reduce_all(tf.logical_or(tf.equal(labels, 0), tf.equal(labels, 1)))
    check = tf.debugging.Assert(binary, [
        "ICNN labels must be bool, or numbers that are all 0 or 1 (one-hot); these have other "
        "values (soft or smoothed labels?), which a cast would make True wherever nonzero. Pass "
        "the hard labels, e.g. tf.one_hot(class_ids, K, dtype=tf.bool). min, max:",
        tf.reduce_min(labels), tf.reduce_max(labels)])
    with tf.control_dependencies([check]):
        return tf.cast(labels, tf.bool), binary


def _class_groups(labels, part_np: np.ndarray, slices):
    """(any-class positives [N], [(positives [N], part channels [C] bool, w_pos, w_neg)]):
    one group with weights 1 for one class, one per class otherwise; ``labels`` bool."""
    if slices is None:
        positive = tf.reshape(labels, [-1])
        return positive, [(positive, part_np, 1.0, 1.0)]
    groups = [(labels[:, j], part_k, w_pos, w_neg)
              for j, (part_k, w_pos, w_neg) in enumerate(slices)]
    return tf.reduce_any(labels, axis=1), groups


def _group_target(groups, s, sqrtvar):
    """beta's target per channel, each from its class's positives (:func:`_beta_target`)."""
    if len(groups) == 1:
        return _beta_target(s, sqrtvar, groups[0][0])
    target = tf.fill(tf.shape(s)[1:], tf.cast(BETA_TARGET_RANGE[1], s.dtype))
    for pos_k, part_k, _, _ in groups:
        target = tf.where(tf.constant(part_k), _beta_target(s, sqrtvar, pos_k), target)
    return target


def _pseudo_grad_toward(beta, target, part):
    """The release's pseudo-gradient (beta - target) * 1e4 on the part filters, 0 elsewhere."""
    g = (beta - target) * BETA_GRAD_SCALE
    return tf.where(part, g, tf.zeros_like(g))


def _beta_target(s, sqrtvar, positive):
    """clip(3/t, 1.5, 3), t = sum_pos(s * sqrtvar) / sum_pos(s): [C].

    A NaN ratio (no positives, or zero strength) gives the target 3.0, because MATLAB's
    min/max ignore NaN.
    """
    posf = tf.cast(positive, s.dtype)[:, None]
    t = tf.reduce_sum(s * sqrtvar * posf, axis=0) / tf.reduce_sum(s * posf, axis=0)
    q = 3.0 / t
    return tf.where(tf.math.is_nan(q), tf.fill(tf.shape(q), tf.cast(BETA_TARGET_RANGE[1], s.dtype)),
                    tf.clip_by_value(q, *BETA_TARGET_RANGE))


class BetaWatch:
    """Warns once per layer (logger ``tf_inspector.icnn``) when beta runs away.

    Called with beta and its target ([C]) at every training step (a ``tf.numpy_function``
    in the layer's gradient). Two signs, each warned once per layer:

    - *out of range*: a part channel's beta left ``[min(1.5, init), max(3.0, init)]``. Every
      target lies in [1.5, 3]; an update with a step below 1 keeps beta between its initial
      value and the targets, so leaving that range means the step is above 1 (overshoot).
    - *oscillating*: on ``flips`` consecutive updates some part channel's beta moved past
      the target that drove the update: its step ``k = (beta_t - beta_{t-1}) / (target_{t-1}
      - beta_{t-1})`` exceeded 1 (between 1 and 2 it overshoots but converges; above 2 it
      diverges). Updates that start within ``floor`` of their target are not judged (there a
      noisy target makes any small step look like an overshoot).

    ``events`` keeps what was found (``(kind, step_count, message)``) for tests and callers.

    >>> w = BetaWatch("m", init=2.0)
    >>> _ = w(np.array([2.0]), np.array([3.0]), np.array([True]))
    >>> _ = w(np.array([3.5]), np.array([3.0]), np.array([True]))   # warns: out of range
    >>> [e[0] for e in w.events]
    ['out_of_range']
    """

    def __init__(self, layer: str, init: float, flips: int = 3, floor: float = 0.01):
        self.layer, self.flips, self.floor = layer, int(flips), float(floor)
        self.low, self.high = min(BETA_TARGET_RANGE[0], init), max(BETA_TARGET_RANGE[1], init)
        self.events: list = []
        self._last: Optional[tuple] = None          # (beta, target) of the previous update
        self._run = np.zeros(0, np.int64)
        self._calls = 0

    def __call__(self, beta: np.ndarray, target: np.ndarray, part: np.ndarray) -> np.ndarray:
        self._calls += 1
        beta, target, part = np.asarray(beta), np.asarray(target), np.asarray(part, bool)
        kinds = {e[0] for e in self.events}
        bad = part & ~((beta >= self.low) & (beta <= self.high))   # NaN counts as out of range
        if bad.any() and "out_of_range" not in kinds:
            c = int(np.flatnonzero(bad)[0])
            self._warn("out_of_range", f"ICNN layer {self.layer}: beta of channel {c} is "
                       f"{beta[c]:.4g}, outside [{self.low:g}, {self.high:g}] (the targets' range) "
                       f"after {self._calls} update(s): the update overshoots its target "
                       "(step > 1, e.g. SGD with lr > N / (beta_lr_mult * 1e4)); masks may leave "
                       "[-1, 1]. Lower the learning rate or use beta_update='stable'.")
        if self._last is not None:
            prev_beta, prev_target = self._last
            gap = prev_target - prev_beta
            with np.errstate(divide="ignore", invalid="ignore"):
                step = (beta - prev_beta) / gap
            over = part & (np.abs(gap) > self.floor) & (step > 1.0)
            self._run = np.where(over, self._run + 1, 0)
            if (self._run >= self.flips).any() and "oscillating" not in kinds:
                c = int(np.flatnonzero(self._run >= self.flips)[0])
                self._warn("oscillating", f"ICNN layer {self.layer}: beta of channel {c} jumped "
                           f"past its target on {self.flips} consecutive updates (last step "
                           f"{step[c]:.3g} x the distance; beta {beta[c]:.4g}): the update's step "
                           "is above 1. Lower the learning rate or use beta_update='stable'.")
        else:
            self._run = np.zeros(beta.shape, np.int64)
        self._last = (beta.copy(), target.copy())
        return beta

    def _warn(self, kind: str, message: str) -> None:
        self.events.append((kind, self._calls, message))
        logging.getLogger("tf_inspector.icnn").warning(message)


def _watch_beta(watch: "BetaWatch", beta, target, part):
    """An op that runs ``watch`` on beta and its target; its output is beta (for a control edge)."""
    out = tf.numpy_function(watch, [beta, target, part], beta.dtype, stateful=True,
                            name="beta_watch")
    return tf.reshape(out, tf.shape(beta))


def registered(graph: "tf.Graph | None" = None) -> list[tuple[str, str, "tf.Tensor"]]:
    """(layer, role, tensor) for every tensor an ICNN layer registered in ``graph``."""
    graph = graph or tf1.get_default_graph()
    out = []
    for entry in graph.get_collection(ICNN_COLLECTION):
        layer, role, name = parse_icnn_entry(entry)
        out.append((layer, role, graph.get_tensor_by_name(name)))
    return out
