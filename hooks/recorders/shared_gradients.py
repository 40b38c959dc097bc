"""One backward pass for the optimizer and ``DumpHook``: ``hooks.minimize`` /
``hooks.compute_gradients``.

Without this, ``DumpHook`` builds its own ``tf.gradients(loss, captured)`` in ``begin()``.
Grappler does not merge that second backward pass with the optimizer's, so on every
statistics or dump step the convolution backprops run twice. ``hooks.minimize`` builds ONE
``tf.gradients(loss, captured_tensors + variables)``: the variables' part goes to
``optimizer.apply_gradients``, and the captured tensors' part is recorded in the graph
collection ``SHARED_GRADIENTS_COLLECTION`` (JSON strings, so checkpoints can serialize
it), where ``DumpHook`` finds it. On steps where the hook fetches nothing, the extra
gradients are not fetched and do not run: training costs what ``optimizer.minimize`` costs.

Example (a one-line change in a model_fn or training script)::

    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):       # as with optimizer.minimize
        train_op = hooks.minimize(optimizer, loss, global_step=global_step)

Call it where you would call ``optimizer.minimize``: after the model is built, so the
tensors ``DumpHook`` will capture (default filters) already exist. Tensors the hook
captures that were created later, or that a different loss reaches, get the hook's own
``tf.gradients`` as before. Optimizers that override ``compute_gradients`` (loss scaling,
SyncReplicas, TPU) are passed through unchanged, without sharing, with a warning.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import tensorflow as tf

from hooks import capture
from inspector.format import LOSS_COLLECTION, SHARED_GRADIENTS_COLLECTION, shared_gradient_entry

log = logging.getLogger("tf_inspector")
v1 = tf.compat.v1
GradsAndVars = list[tuple[Any, Any]]


def _target(v: Any) -> Any:
    """What ``tf.gradients`` differentiates for ``v``, as the v1 optimizer does it."""
    if isinstance(v, tf.Variable) and getattr(v, "op", None) is not None \
            and v.op.type in ("VariableV2", "Variable"):
        # ref variables: the variable itself, not its read (private, as v1 optimizers; TF 2.15,
        # 2.21)
        return v._ref()
    return v  # resource variables (tf.gradients takes their handle), plain tensors


def _overrides_compute_gradients(optimizer: Any) -> bool:
    return type(optimizer).compute_gradients is not v1.train.Optimizer.compute_gradients


def compute_gradients(optimizer: v1.train.Optimizer, loss: tf.Tensor,
                      var_list: Sequence | None = None,
                      gate_gradients: int = v1.train.Optimizer.GATE_OP, aggregation_method=None,
                      colocate_gradients_with_ops: bool = False,
                      grad_loss: tf.Tensor | None = None) -> GradsAndVars:
    """``optimizer.compute_gradients(loss, ...)``, sharing its backward pass with ``DumpHook``.

    Returns the same ``[(gradient, variable)]`` list; also records d loss / d t for every
    tensor ``t`` the hook would capture with its default filters.

    Example::

        grads_and_vars = hooks.compute_gradients(opt, loss)
        grads_and_vars = [(tf.clip_by_norm(g, 5.0), v) for g, v in grads_and_vars]
        train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
    """
    kw = dict(var_list=var_list, gate_gradients=gate_gradients,
              aggregation_method=aggregation_method,
              colocate_gradients_with_ops=colocate_gradients_with_ops, grad_loss=grad_loss)
    if callable(loss) or tf.executing_eagerly():
        raise ValueError("hooks.compute_gradients needs a graph-mode loss tensor (tf.compat.v1 "
                         "training)")
    if _overrides_compute_gradients(optimizer):
        # DumpHook may still reuse the pass through hooks.recorders.gradients (a loss-scale
        # optimizer's, unscaled: hooks.recorders.loss_scale); hooks.minimize adds nothing to it
        log.warning("%s overrides compute_gradients: hooks.minimize passes it through unchanged "
                    "(DumpHook reuses its backward pass only where hooks.recorders.gradients "
                    "recorded it)",
                    type(optimizer).__name__)
        return optimizer.compute_gradients(loss, **kw)
    if gate_gradients not in (optimizer.GATE_NONE, optimizer.GATE_OP, optimizer.GATE_GRAPH):
        raise ValueError(f"gate_gradients={gate_gradients} must be GATE_NONE, GATE_OP or "
                         "GATE_GRAPH")
    g = v1.get_default_graph()
    # private Optimizer._scale_loss, as compute_gradients calls it: 1/replicas under a MEAN strategy
    # (TF 2.15, 2.21)
    scale = getattr(optimizer, "_scale_loss", None)
    scaled = scale(loss) if scale is not None else loss
    if var_list is None:
        var_list = v1.trainable_variables() \
            + g.get_collection(v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES)
    else:
        var_list = tf.nest.flatten(var_list)
    # private GraphKeys._STREAMING_MODEL_PORTS: compute_gradients adds these too (TF 2.15, 2.21)
    var_list = list(var_list) + g.get_collection(v1.GraphKeys._STREAMING_MODEL_PORTS)
    if not var_list:
        raise ValueError("No variables to optimize.")
    # The tensors DumpHook.begin() will select with its default filters (ICNN roles included).
    roles = capture.icnn_roles(g)
    tensors = capture.select_tensors(g, forced=[g.get_tensor_by_name(n) for n in roles]).tensors
    grads = v1.gradients(scaled, tensors + [_target(v) for v in var_list], grad_ys=grad_loss,
                         gate_gradients=gate_gradients == optimizer.GATE_OP,
                         aggregation_method=aggregation_method,
                         colocate_gradients_with_ops=colocate_gradients_with_ops,
                         unconnected_gradients=tf.UnconnectedGradients.NONE)
    if gate_gradients == optimizer.GATE_GRAPH:
        grads = list(tf.tuple(grads))
    t_grads, v_grads = grads[:len(tensors)], grads[len(tensors):]
    _record(g, loss, tensors, t_grads)
    if not g.get_collection(LOSS_COLLECTION):
        # DumpHook's default loss: the one we differentiated
        g.add_to_collection(LOSS_COLLECTION, loss)
    return list(zip(v_grads, var_list))


def _record(g: tf.Graph, loss: tf.Tensor, tensors: Sequence[tf.Tensor], grads: Sequence) -> None:
    """Add one collection entry per tensor; densify IndexedSlices as the hook would."""
    with tf.name_scope("tf_inspector/shared_gradients"):
        for t, grad in zip(tensors, grads):
            if isinstance(grad, tf.IndexedSlices):  # e.g. the gradient of a gather's params
                grad = tf.convert_to_tensor(grad)
            if grad is not None and not grad.dtype.is_floating:
                grad = None
            g.add_to_collection(SHARED_GRADIENTS_COLLECTION,
                                shared_gradient_entry(loss.name, t.name,
                                                      None if grad is None else grad.name))


def minimize(optimizer: v1.train.Optimizer, loss: tf.Tensor, global_step: tf.Variable | None = None,
             var_list: Sequence | None = None, name: str | None = None, **kw) -> tf.Operation:
    """``optimizer.minimize(loss, ...)`` whose backward pass ``DumpHook`` reuses.

    ``kw``: ``gate_gradients``, ``aggregation_method``, ``colocate_gradients_with_ops``,
    ``grad_loss``, as for ``optimizer.minimize``.

    Example::

        with tf.control_dependencies(
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = hooks.minimize(tf.compat.v1.train.AdamOptimizer(1e-3), loss, global_step=gs)
    """
    grads_and_vars = compute_gradients(optimizer, loss, var_list=var_list, **kw)
    if not [v for grad, v in grads_and_vars if grad is not None]:
        raise ValueError("No gradients provided for any variable, check your graph for ops that "
                         "do not support gradients, between variables "
                         f"{[str(v) for _, v in grads_and_vars]} and loss {loss}.")
    return optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
