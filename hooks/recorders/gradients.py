"""Reuse the optimizer's own backward pass with no change to the training code.

``import hooks`` calls :func:`install`, which wraps two private functions of
``tensorflow.python.ops.gradients_util`` (``_GradientsHelper``, ``_AggregatedGrads``) to
*record*, for every ``tf.gradients(loss, ...)`` built afterwards (``optimizer.minimize``
included), the aggregated gradient it creates for each op output on its way: exactly
d loss / d t for every tensor ``t`` between the variables and the loss. The wrappers only
record names (they change nothing, and any error in them is swallowed); a recording holds
strings, so graphs are freed as before. The install is logged once at DEBUG on
``tf_inspector``.

Opt out with ``TF_INSPECTOR_RECORD_GRADIENTS=0`` (before ``import hooks``) or undo it with
:func:`uninstall`: TensorFlow's functions are then the originals again, and a ``DumpHook``
on a model built afterwards builds its own ``tf.gradients`` (a second backward pass on
statistics and dump steps) unless the model uses ``hooks.minimize``, which shares its
pass explicitly without any wrapping.

``DumpHook`` then takes d loss / d t from the recording for every captured tensor the
optimizer's pass covered, and builds only the missing part itself (``complete``): the
tensors upstream of every variable, such as the input images, get their gradients from the
recorded gradients of the first ops they feed (e.g. one Conv2DBackpropInput), not from a
second backward pass through the network.

Not recorded: gradients built before ``import hooks``, inside while loops, for several
``ys`` at once or with ``grad_ys``. ``hooks.minimize`` (explicit sharing) keeps working
where the wrapped functions do not exist (a future TensorFlow); ``DumpHook(share_gradients=False)``
ignores recordings.

Example::

    import hooks                                   # before the model is built
    train_op = optimizer.minimize(loss)            # recorded
    recorded = gradient_recorder.lookup(tf.compat.v1.get_default_graph(), loss)
"""
from __future__ import annotations

import threading
import weakref
from typing import Sequence

import tensorflow as tf

from hooks.capture.gradients import gradient_stops
from hooks.recorders.patching import MethodPatch

#: a recorded gradient that is an IndexedSlices (not reusable as one tensor)
INDEXED = "<IndexedSlices>"
_local = threading.local()
_lock = threading.Lock()
# graph -> loss tensor name -> {op output name: gradient tensor name | None (no gradient) | INDEXED}
_recordings: "weakref.WeakKeyDictionary[tf.Graph, dict[str, dict[str, str | None]]]" = \
    weakref.WeakKeyDictionary()


#: ``TF_INSPECTOR_RECORD_GRADIENTS=0`` (or false, no, off): :func:`install` wraps nothing.
ENV_VAR = "TF_INSPECTOR_RECORD_GRADIENTS"


def _gradients_util():
    """TensorFlow's ``gradients_util`` module, or None.

    Private TensorFlow API: ``tf.gradients`` (tensorflow/python/ops/gradients_impl.py) calls
    ``gradients_util._GradientsHelper``, which calls ``_AggregatedGrads`` once per op of the
    backward pass, both looked up as module globals at call time, so replacing the module
    attributes reaches every later ``tf.gradients``. No public API exposes the per-op
    gradients of a pass. Tested with TensorFlow 2.15 and 2.21; where a version lacks them,
    nothing is wrapped and ``hooks.minimize`` still shares the pass explicitly."""
    try:
        from tensorflow.python.ops import gradients_util
    except ImportError:
        return None
    return gradients_util


def install() -> bool:
    """Wrap ``gradients_util`` once (``import hooks`` calls this). False where opted out by
    ``TF_INSPECTOR_RECORD_GRADIENTS=0`` or where this TensorFlow lacks the functions."""
    return _patch.install()


def uninstall() -> bool:
    """Put TensorFlow's own ``_GradientsHelper`` and ``_AggregatedGrads`` back; True if they had
    been wrapped. Recordings already made stay readable; later ``tf.gradients`` are not recorded."""
    return _patch.uninstall()


def installed() -> bool:
    """Whether ``tf.gradients`` built now are recorded."""
    return _patch.installed


def _loss_of_call(ys, grad_ys) -> tf.Tensor | None:
    """The single tensor differentiated with default grad_ys, or None (not recorded)."""
    ys_list = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    gys = list(grad_ys) if isinstance(grad_ys, (list, tuple)) else [grad_ys]
    if len(ys_list) == 1 and isinstance(ys_list[0], tf.Tensor) and all(g is None for g in gys):
        return ys_list[0]
    return None


def _wrap_helper(helper):
    def wrapper(ys, xs, grad_ys=None, *args, **kwargs):
        try:
            loss = _loss_of_call(ys, grad_ys)
        except Exception:  # noqa: BLE001 - recording must never break tf.gradients
            loss = None
        previous = getattr(_local, "loss", None)
        _local.loss = loss
        try:
            return helper(ys, xs, grad_ys, *args, **kwargs)
        finally:
            _local.loss = previous
    return wrapper


def _wrap_aggregated(aggregated):
    def wrapper(grads, op, gradient_uid, loop_state, *args, **kwargs):
        out = aggregated(grads, op, gradient_uid, loop_state, *args, **kwargs)
        loss = getattr(_local, "loss", None)
        if loss is not None and loop_state is None:
            try:
                _record(loss, op, out)
            except Exception:  # noqa: BLE001 - recording must never break tf.gradients
                pass
        return out
    return wrapper


_patch = MethodPatch("gradient recorder", _gradients_util,
                     {"_GradientsHelper": _wrap_helper, "_AggregatedGrads": _wrap_aggregated},
                     env_var=ENV_VAR,
                     missing="this TensorFlow has no gradients_util._GradientsHelper",
                     detail="tf.gradients built from now on record their per-op gradients "
                            f"({ENV_VAR}=0 or hooks.recorders.gradients.uninstall() to opt out)",
                     replaced="something wrapped gradients_util after it; leaving both in place")


def _record(loss: tf.Tensor, op: tf.Operation, out_grads: Sequence) -> None:
    with _lock:
        table = _recordings.setdefault(op.graph, {}).setdefault(loss.name, {})
        for t, g in zip(op.outputs, out_grads):
            if t.name in table:
                continue  # a later tf.gradients of the same loss: keep the first
            if isinstance(g, tf.Tensor):
                table[t.name] = g.name
            elif isinstance(g, tf.IndexedSlices):
                table[t.name] = INDEXED
            else:  # None / []: the loss does not depend on this output
                table[t.name] = None


def lookup(graph: tf.Graph, loss: tf.Tensor) -> dict[str, str | None]:
    """{op output name: its recorded gradient's name, None or INDEXED} for ``loss`` in ``graph``."""
    with _lock:
        return dict(_recordings.get(graph, {}).get(loss.name, {}))


def recorded_losses(graph: tf.Graph) -> dict[str, dict[str, str | None]]:
    """{loss name: its recording} for every loss some ``tf.gradients`` in ``graph``
    differentiated."""
    with _lock:
        return {name: dict(table) for name, table in _recordings.get(graph, {}).items()}


def complete(graph: tf.Graph, loss: tf.Tensor, tensors: Sequence[tf.Tensor],
             recorded: dict[str, str | None]) -> dict[str, tf.Tensor | None]:
    """d loss / d t for the ``tensors`` the recording does not cover, built from it.

    The recorded ops ("processed") are every op between the variables and the loss. A path
    from an unprocessed tensor to the loss enters the processed region through an edge
    (u -> P): u unprocessed, P processed. So d loss / d x = sum over such edges of
    d(u)/d(x) . [d P's outputs / d u]^T g(P's outputs): first each edge's local term (P's
    gradient function alone: all its inputs are stopped), then one tf.gradients over
    the unprocessed region with those terms as grad_ys. Tensors not upstream of any edge do
    not reach the loss (None)."""
    wanted = [t for t in tensors if t.name not in recorded]
    if not wanted:
        return {}
    processed = {name.rsplit(":", 1)[0] for name in recorded}
    upstream = _descendants({t.op for t in wanted}, processed)
    local: dict[str, list[tf.Tensor]] = {}
    edges: dict[str, tf.Tensor] = {}
    with tf.name_scope("tf_inspector/gradients_from_recorded"):
        for p in _entry_ops(upstream, processed):
            ins = [u for u in p.inputs
                   if u.op.name not in processed and u.op in upstream and u.dtype.is_floating]
            ys = [y for y in p.outputs if recorded.get(y.name) not in (None, INDEXED)]
            if not ins or not ys:
                continue
            # stop at every input of P: its local term only, not paths between its inputs
            parts = tf.gradients(ys, ins,
                                 grad_ys=[graph.get_tensor_by_name(recorded[y.name]) for y in ys],
                                 stop_gradients=list(p.inputs),
                                 unconnected_gradients=tf.UnconnectedGradients.NONE)
            for u, g in zip(ins, parts):
                if g is not None:
                    local.setdefault(u.name, []).append(tf.convert_to_tensor(g))
                    edges[u.name] = u
        if not local:
            return {t.name: None for t in wanted}
        us = list(edges.values())
        grad_us = [tf.add_n(local[u.name]) if len(local[u.name]) > 1 else local[u.name][0]
                   for u in us]
        grads = tf.gradients(us, wanted, grad_ys=grad_us, stop_gradients=gradient_stops(wanted),
                             unconnected_gradients=tf.UnconnectedGradients.NONE)
    return {t.name: (tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g)
            for t, g in zip(wanted, grads)}


def _descendants(ops: set, processed: set[str]) -> set:
    """``ops`` and every unprocessed op downstream of them."""
    seen, stack = set(ops), list(ops)
    while stack:
        for t in stack.pop().outputs:
            for c in t.consumers():
                if c not in seen and c.name not in processed:
                    seen.add(c)
                    stack.append(c)
    return seen


def _entry_ops(upstream: set, processed: set[str]) -> list:
    """Processed ops with an input from ``upstream`` (unprocessed), in graph order."""
    out, seen = [], set()
    for op in upstream:
        for t in op.outputs:
            for c in t.consumers():
                if c.name in processed and c not in seen:
                    seen.add(c)
                    out.append(c)
    return sorted(out, key=lambda o: o._id)  # private Operation._id (TF 2.15, 2.21): creation order

