"""The training batch of a sampled ``fit`` step, for ``InspectCallback(source="train_batch")``.

``BatchStash`` wraps the model's ``train_step`` for the duration of ``fit``: on the steps the
callback asks for (a boolean variable it sets before the step), the step's own batch is copied
into variables of unknown shape before the step runs; on every other step the wrapper is one
``tf.cond`` on that boolean. The callback then replays the step: it puts the weights the step
started from back, runs its capture graph on the stashed batch and restores the weights the
step produced (``swap_weights``), so the values and gradients are those the step's update was
computed from.

Example (what ``InspectCallback`` does)::

    stash = BatchStash()
    stash.install(model)                 # in set_model: before fit builds its train function
    stash.want(True)                     # in on_train_batch_begin of a sampled step
    x, y, sw = stash.batch()             # in on_train_batch_end
    stash.uninstall(model)               # in on_train_end
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf


def unpack(data) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of a ``train_step`` argument, as Keras unpacks it."""
    if isinstance(data, (tuple, list)):
        if len(data) > 3:
            raise ValueError(f"a training batch of {len(data)} elements: expected x, (x, y) or (x, y, sample_weight)")
        parts = list(data) + [None] * (3 - len(data))
        return parts[0], parts[1], parts[2]
    return data, None, None


class BatchStash:
    """Copies a sampled step's batch into variables from inside ``fit``'s train function."""

    def __init__(self) -> None:
        self._flag: tf.Variable | None = None
        self._vars: list[tf.Variable] = []
        self._structure: Any = None
        self._saved: Any = None
        self._installed = False

    # ---- the wrapper ---------------------------------------------------------------------------
    def install(self, model) -> None:
        """Wrap ``model.train_step`` (an instance attribute, the class's method is untouched) and
        drop a train function built earlier, so ``fit`` builds its own with the wrapper."""
        if self._installed:
            return
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None and strategy.num_replicas_in_sync > 1:
            raise ValueError(f"source='train_batch' under {type(strategy).__name__} with "
                             f"{strategy.num_replicas_in_sync} replicas: each replica sees its own slice of the "
                             f"batch; use source='probe'")
        if self._flag is None:
            self._flag = tf.Variable(False, trainable=False, name="tf_inspector_stash_flag")
        self._saved = model.__dict__.get("train_step")
        original = model.train_step

        def train_step(data):
            self._stash(data)
            return original(data)

        object.__setattr__(model, "train_step", train_step)
        model.train_function = None
        self._installed = True

    def uninstall(self, model) -> None:
        """Put the model's own ``train_step`` back (and drop the train function built with ours)."""
        if not self._installed:
            return
        if self._saved is None:
            model.__dict__.pop("train_step", None)
        else:
            object.__setattr__(model, "train_step", self._saved)
        model.train_function = None
        self._installed = False

    def _stash(self, data) -> None:
        flat = [t for t in tf.nest.flatten(unpack(data)) if t is not None]
        if not self._vars:
            self._structure = tf.nest.map_structure(lambda t: None if t is None else 0, unpack(data))
            with tf.init_scope():   # created once, eagerly, at the train function's first trace
                self._vars = [tf.Variable(tf.zeros([0] * max(t.shape.rank or 1, 1), t.dtype), trainable=False,
                                          shape=tf.TensorShape(None), name=f"tf_inspector_stash_{i}")
                              for i, t in enumerate(flat)]
        if len(flat) != len(self._vars):
            raise ValueError(f"the training batch changed structure ({len(flat)} tensors, first step had "
                             f"{len(self._vars)}): source='train_batch' needs the same (x, y, sample_weight) "
                             f"structure at every step")
        tf.cond(self._flag, lambda: tf.group([v.assign(t) for v, t in zip(self._vars, flat)]), tf.no_op)

    # ---- the callback's side -------------------------------------------------------------------
    def want(self, on: bool) -> None:
        """Whether the next step's batch is copied."""
        if self._flag is not None:
            self._flag.assign(on)

    def batch(self) -> tuple[Any, Any, Any]:
        """The last copied batch as ``(x, y, sample_weight)`` tensors (None where absent)."""
        if not self._vars:
            raise RuntimeError("no training batch was copied: fit did not run the wrapped train_step "
                               "(a model whose train function was built before the callback was attached?)")
        values = iter([tf.convert_to_tensor(v.numpy()) for v in self._vars])
        return tf.nest.map_structure(lambda leaf: None if leaf is None else next(values), self._structure)


@contextlib.contextmanager
def swap_weights(variables: Sequence, before: Sequence[np.ndarray]) -> Iterator[None]:
    """The variables hold ``before`` inside the block and their current values again after it."""
    after = [v.numpy() for v in variables]
    for v, b in zip(variables, before):
        v.assign(b)
    try:
        yield
    finally:
        for v, a in zip(variables, after):
            v.assign(a)
