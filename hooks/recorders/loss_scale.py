"""Record TF1 loss scaling, so ``DumpHook`` records d loss / d t, not d (loss x scale) / d t.

``tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer`` (also reached through
``tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer`` and
``enable_mixed_precision_graph_rewrite``) differentiates ``loss * scale`` and divides the
gradients by ``scale``. The hook saw only the scaled pass: it took ``loss * scale`` for the
loss and recorded gradients ``scale`` times too large (2^15 with the dynamic default), and
with ``loss=`` the plain loss it took float16 gradients of the unscaled loss, which read 0
below ~6e-8 where the applied ones do not.

``import hooks`` calls :func:`install`, which wraps the optimizer's private ``_scale_loss``
to remember, per graph, each scaled loss, the loss it scales and the scale tensor it was
multiplied by (the same tensor, so the same value in every run: a second read of the
dynamic scale could run after the step's own update of it). The wrapper records names only
and swallows its own errors. Not seen: a model built before ``import hooks``, and Keras'
``LossScaleOptimizer`` (whose Keras path, ``hooks.keras``, reads its scale itself).

Example::

    import hooks                                         # before the model is built
    opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, "dynamic")
    train_op = opt.minimize(loss)
    loss_scale.lookup(graph, loss)                       # Scaling(scaled=<mul:0>, scale=<...:0>)
"""
from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

import tensorflow as tf

from hooks.recorders.patching import MethodPatch

_lock = threading.Lock()
# graph -> scaled loss name -> (loss name, scale tensor name)
_scaled: "weakref.WeakKeyDictionary[tf.Graph, dict[str, tuple[str, str]]]" = \
    weakref.WeakKeyDictionary()


class Scaling(NamedTuple):
    """``scaled`` = loss x ``scale`` (float32), as a loss-scale optimizer differentiated it."""
    scaled: tf.Tensor
    scale: tf.Tensor


def _optimizer_class():
    """TF1's ``MixedPrecisionLossScaleOptimizer``, or None.

    Private TensorFlow API: ``_scale_loss`` (training/experimental/loss_scale_optimizer.py) is
    where ``compute_gradients`` multiplies the loss by the scale; no public API says which
    loss and scale a scaled loss came from. Tested with TensorFlow 2.15 and 2.21."""
    try:
        from tensorflow.python.training.experimental import loss_scale_optimizer
    except ImportError:
        return None
    return getattr(loss_scale_optimizer, "MixedPrecisionLossScaleOptimizer", None)


def install() -> bool:
    """Wrap ``_scale_loss`` once (``import hooks`` calls this); False where it does not exist."""
    return _patch.install()


def uninstall() -> bool:
    """Put TensorFlow's ``_scale_loss`` back; True if it had been wrapped."""
    return _patch.uninstall()


def _wrap(method):
    def wrapper(self, loss):
        scaled = method(self, loss)
        try:
            _record(loss, scaled)
        except Exception:  # noqa: BLE001 - recording must never break the optimizer
            pass
        return scaled
    return wrapper


_patch = MethodPatch("loss-scale recorder", _optimizer_class, {"_scale_loss": _wrap},
                     log_uninstall=False)


def _record(loss, scaled) -> None:
    """``scaled`` is ``Mul(loss, Cast?(scale))`` (TF 2.15, 2.21); anything else is not recorded."""
    if not isinstance(loss, tf.Tensor) or not isinstance(scaled, tf.Tensor) \
            or tf.executing_eagerly():
        return   # a callable loss (eager minimize): no graph to record in
    op = scaled.op
    if op.type != "Mul" or op.inputs[0].name != loss.name:
        return
    scale = op.inputs[1]
    if scale.op.type == "Cast":   # to a float16 loss's dtype: the float32 scale before it
        scale = scale.op.inputs[0]
    with _lock:
        _scaled.setdefault(op.graph, {}).setdefault(scaled.name, (loss.name, scale.name))


def lookup(graph: tf.Graph, loss: tf.Tensor) -> Scaling | None:
    """How a loss-scale optimizer scaled ``loss`` in ``graph`` (its first scaling), or None."""
    with _lock:
        table = dict(_scaled.get(graph, {}))
    for scaled, (name, scale) in table.items():
        if name == loss.name:
            return Scaling(graph.get_tensor_by_name(scaled),
                           tf.cast(graph.get_tensor_by_name(scale), tf.float32))
    return None


def scales(graph: tf.Graph) -> bool:
    """Whether a loss-scale optimizer scaled a loss in ``graph``: its training run may then
    leave the global step where it was (a dynamic scale skipping a step that overflowed)."""
    with _lock:
        return bool(_scaled.get(graph))


def unscaled(graph: tf.Graph, t: tf.Tensor) -> tf.Tensor:
    """The loss ``t`` scales, where ``t`` is a loss-scale optimizer's scaled loss; else ``t``."""
    with _lock:
        entry = _scaled.get(graph, {}).get(t.name)
    return t if entry is None else graph.get_tensor_by_name(entry[0])
