"""d loss / d t for the captured tensors: the raw pass, dense gradients, the loss scale undone,
and the optimizer's own gradients where they were shared.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import tensorflow as tf
# get_gradient_function: tf.gradients' own lookup
from tensorflow.python.framework import ops as tf_ops

from inspector.format import SHARED_GRADIENTS_COLLECTION, parse_shared_gradient_entry
from inspector.icnn.layer import observer_gradients


def raw_gradients(loss: tf.Tensor, tensors: Sequence[tf.Tensor], observer: bool = True) -> list:
    """``tf.gradients(loss, tensors)`` built once, as TensorFlow returns them (IndexedSlices
    kept: what an optimizer is handed); None where t does not reach the loss. ``observer``:
    this pass only observes (the training step has its own), so custom gradients with side
    effects leave them out (``inspector.icnn.layer.observer_gradients``); False where this
    pass is the training step's own (the Keras step capture answering fit's tape)."""
    if not tensors:
        return []
    with tf.name_scope("tf_inspector/gradients"), \
            observer_gradients() if observer else contextlib.nullcontext():
        return tf.gradients(loss, list(tensors), stop_gradients=gradient_stops(tensors),
                            unconnected_gradients=tf.UnconnectedGradients.NONE)


def gradient_stops(tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Those of ``tensors`` whose op has no gradient function and takes no floating input, for
    ``tf.gradients``' ``stop_gradients``: tf.gradients asks for the op's gradient function once
    it reaches it from the loss, and raised LookupError (a SparseTensor's float values out of
    ``DeserializeSparse``: canned linear models with weighted sparse columns). Their own
    gradients are still computed. An op with a gradient function is never a stop: a
    ``ReadVariableOp`` passes its gradient to the variable's handle (which Keras
    differentiates), a ``TensorListStack`` to the loop that filled the list."""
    return [t for t in tensors
            if not any(x.dtype.is_floating or x.dtype.is_complex for x in t.op.inputs)
            and not differentiable(t.op)]


def differentiable(op: tf.Operation) -> bool:
    """Whether a gradient flows through ``op``: a gradient function is registered for it, and
    it is not ``NotDifferentiable`` (None)."""
    try:
        return tf_ops.get_gradient_function(op) is not None
    except LookupError:   # no gradient registered: none flows through it
        return False


def dense_gradient(g) -> tf.Tensor | None:
    """A gradient as the capture records it: dense (e.g. a gather input's IndexedSlices), and
    None where it is not floating."""
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return g if g is None or g.dtype.is_floating else None


def gradients(loss: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor | None]:
    """d loss / d t for every t, built once, dense; None where t does not reach the loss."""
    return [dense_gradient(g) for g in raw_gradients(loss, tensors)]


def unscale(scaled: Sequence, plain: Sequence, scale: tf.Tensor) -> list:
    """d loss / d t as mixed-precision training takes it, from ``scaled`` (d (loss * scale) / d t)
    and ``plain`` (d loss / d t): float16 gradients of the unscaled loss lose values below
    ~6e-5 and read 0 below ~6e-8, where the loss-scaled ones keep them. So ``scaled / scale``
    in float32 (float64 stays float64), and where that overflowed (a step a dynamic loss
    scale skips) ``plain``: a routine loss-scale overflow is no NaN/Inf in the records."""
    out = []
    with tf.name_scope("tf_inspector/unscale"):
        for g, p in zip(scaled, plain):
            g = dense_gradient(g)
            if g is None:
                # the scaled pass (the optimizer's) says what reaches the loss: a plain pass
                # over many tensors at once fills zeros for a multi-output op's unused output
                # (SparseSoftmaxCrossEntropyWithLogits:1), a gradient of zeros that is none
                out.append(None)
                continue
            wide = tf.float64 if g.dtype == tf.float64 else tf.float32
            g = tf.cast(g, wide) / tf.cast(scale, wide)
            out.append(g if p is None else tf.where(tf.math.is_finite(g), g, tf.cast(p, wide)))
    return out


def shared_gradients(graph: tf.Graph, loss: tf.Tensor) -> dict[str, tf.Tensor | None]:
    """tensor name -> d loss / d tensor (None: unconnected) recorded by ``hooks.minimize`` for
    ``loss``."""
    out: dict[str, tf.Tensor | None] = {}
    for entry in graph.get_collection(SHARED_GRADIENTS_COLLECTION):
        loss_name, tensor, grad = parse_shared_gradient_entry(entry)
        if loss_name == loss.name:
            out[tensor] = None if grad is None else graph.get_tensor_by_name(grad)
    return out
