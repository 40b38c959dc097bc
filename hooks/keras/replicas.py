"""A step capture inside one replica of several (``MirroredStrategy``): the global batch.

``MirroredStrategy`` traces the replica step once per replica into one graph, each on its slice
of the batch. Every replica builds the capture over its own ops; before the statistics and the
dump, each captured value is combined across replicas (one ``all_gather`` and one ``all_reduce``
per capture) so what is recorded is the step's global batch, in replica order:

- a per-sample (batched) tensor and its ``d loss / d t``: gathered on axis 0. The loss a replica
  differentiates is its share of the global one (Keras scales each replica's loss by
  ``1/replicas``; ``tf.nn.compute_average_loss`` divides by the global batch size), so each
  sample's gradient is the global loss's;
- a variable's gradient, and that of any tensor computed from the weights alone (a cast of a
  kernel): summed over replicas, the gradient the optimizer applies (its all-reduce);
- a tensor computed from a replica's slice that is not per-sample (a loss's mean over the slice,
  a batch norm's moments): it has no value of the global batch, so it is not recorded
  (:data:`PER_REPLICA`, listed as skipped with that reason).

Only the first replica writes the results (the others build the same combined values)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import tensorflow as tf

from hooks.capture.select import Captured
from hooks.variables import VariableRecord

#: why a tensor of the replica step is not recorded (the catalog's skip reason)
PER_REPLICA = ("computed from one replica's slice of the batch and not per sample (a mean over "
               "the slice, say): the global batch has no such value")


def count() -> int:
    """The replicas in sync where this runs inside a replica of a strategy, else 1."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return 1
    return tf.distribute.get_replica_context().num_replicas_in_sync


def primary() -> bool:
    """Whether this is the first replica (or no strategy's replica at all)."""
    if count() == 1:
        return True
    rid = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
    return rid is None or int(rid) == 0


def gather_batch(values: Sequence[Any]) -> list[Any]:
    """Each of ``values`` (tensors, nests of them, or None) gathered on axis 0 over the
    replicas: the global batch, in replica order."""
    flat = [(i, t) for i, t in enumerate(tf.nest.flatten(list(values), expand_composites=False))
            if t is not None]
    got = tf.distribute.get_replica_context().all_gather([t for _, t in flat], axis=0)
    out = tf.nest.flatten(list(values))
    for (i, _), g in zip(flat, got):
        out[i] = g
    return tf.nest.pack_sequence_as(list(values), out)


def batch_dependent(ops: Sequence[tf.Operation], sources: set[str]) -> set[str]:
    """The names of ``ops``' outputs computed from a tensor in ``sources`` (the replica's batch),
    following inputs in creation order (topological in a function graph)."""
    out: set[str] = set(sources)
    for op in ops:
        if any(i.name in out for i in op.inputs):
            out.update(t.name for t in op.outputs)
    return out


def split(captured: list[Captured], dependent: set[str]) -> tuple[list[Captured], list[str]]:
    """``captured`` without the tensors :func:`combine` cannot make global (not per-sample, yet
    computed from the replica's slice), and those tensors' names."""
    keep, drop = [], []
    for c in captured:
        (drop if not c.batched and c.name in dependent else keep).append(c)
    return keep, [c.name for c in drop]


@dataclass
class Combined(Captured):
    """A captured tensor's values over every replica, under the replica's own tensor's name."""
    own: str = ""

    @property
    def name(self) -> str:
        return self.own


def combine(everything: Sequence[Captured]) -> list[Captured]:
    """``everything`` (:func:`split`'s, and the variable records) with global values: batched
    tensors and their gradients gathered, the other gradients summed (see the module doc)."""
    gather = [t for c in everything if c.batched for t in (c.tensor, c.gradient) if t is not None]
    reduce = [c.gradient for c in everything if not c.batched and c.gradient is not None]
    ctx = tf.distribute.get_replica_context()
    gathered = iter(ctx.all_gather(gather, axis=0) if gather else [])
    reduced = iter(ctx.all_reduce("SUM", reduce) if reduce else [])
    out: list[Captured] = []
    for c in everything:
        if c.batched:
            tensor = next(gathered)
            grad = next(gathered) if c.gradient is not None else None
        else:
            tensor, grad = c.tensor, (next(reduced) if c.gradient is not None else None)
        if isinstance(c, VariableRecord):
            out.append(dataclasses.replace(c, tensor=tensor, gradient=grad))
        else:
            fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
            out.append(Combined(**{**fields, "tensor": tensor, "gradient": grad}, own=c.name))
    return out
