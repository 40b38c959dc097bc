"""Multi-tower training: each tower's tensors are grouped by the tower's own samples.

In seed-002-style training the batch is cut with ``tf.split`` and each tower sees one part,
so the labels' groups (one per sample of the whole batch) do not line up with a tower's
rows. Two ways to resolve a tower, both exact:

- **traced**: ``hooks.capture.batch_axis`` follows ``tf.split`` along axis 0 (equal or ``SplitV``
  sizes, known or not); a tensor of slice i gets the same split of the batch's group ids,
  cut at the split's own output sizes at run time (:func:`slice_groups`). Nested splits
  compose. The tower is named by the split output it came from (``split:1``).
- **explicit**: ``DumpHook(labels={"tower_0": t0, "tower_1": t1})``: the per-sample
  tensors whose names start with ``tower_0/`` are grouped by ``t0``'s groups. A tensor
  whose batch size differs from its tower's labels at run time breaks the group rule
  (that step's group rows are not written: ``hooks/capture/groups.py``).

Unresolved tensors (per-sample over a part of the batch the trace cannot map, such as
``x[:16]``, or mixing two towers) get statistics for ``all`` only and are stored whole in
dumps; the hook logs a warning naming them. Never grouped by another tower's labels.

Example::

    unresolved = towers.assign(captured, axis, groups, {"tower_0": groups_0})
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from hooks.capture.batch_axis import PARTS, BatchAxis, Slice
from hooks.capture.groups import Groups
from hooks.capture.select import Captured

#: ops that cut a batch into towers along axis 0 (when their axis is 0)
SPLITS = ("Split", "SplitV")


def slice_groups(axis: BatchAxis, groups: Groups, where: Slice) -> Groups:
    """``groups`` of the samples of slice ``where`` (``BatchAxis.slice_of``)."""
    ids, k = groups.ids, groups.count
    with tf.name_scope("tf_inspector/towers/"):
        for signature, i in where:
            op = axis.split_op(signature)
            value = op.inputs[1] if op.type == "Split" else op.inputs[0]
            n = tf.shape(value)[0]
            ids = tf.concat([ids, tf.fill([n], k)], 0)[:n]  # past the labels: in no group
            sizes = [tf.shape(out)[0] for out in op.outputs]
            start = tf.add_n(sizes[:i]) if i else tf.constant(0)
            ids = ids[start:start + sizes[i]]
    return groups.sliced(ids)


def tower_name(axis: BatchAxis, where: Slice) -> str:
    """The split output a slice's tensors come from (``split:1``: the first split of its kind)."""
    signature, i = where[-1]
    return axis.split_op(signature).outputs[i].name


def prefix_of(name: str, prefixes: Sequence[str]) -> str | None:
    """The longest scope prefix ``name`` lies in (``tower_0`` holds ``tower_0/conv/Relu:0``)."""
    hits = [p for p in prefixes if name.startswith(p.rstrip("/") + "/")]
    return max(hits, key=len) if hits else None


def assign(captured: Sequence[Captured], axis: BatchAxis, groups: Groups | None,
           explicit: Mapping[str, Groups]) -> list[str]:
    """Give each tower tensor its tower's groups (``Captured.grouping``, catalog ``tower``);
    unresolved tensors are made unbatched. Returns the names of the unresolved tensors."""
    sliced: dict[Slice, Groups] = {}
    unresolved = []
    for c in captured:
        prefix = prefix_of(c.name, list(explicit))
        if prefix is not None and (c.batched or axis.unresolved(c.tensor)):
            c.batched, c.grouping, c.extra["tower"] = True, explicit[prefix], prefix
        elif axis.unresolved(c.tensor):
            c.batched = False
            unresolved.append(c.name)
        elif c.batched and (where := axis.slice_of(c.tensor)):
            c.extra["tower"] = tower_name(axis, where)
            if groups is not None:
                if where not in sliced:
                    sliced[where] = slice_groups(axis, groups, where)
                c.grouping = sliced[where]
    return unresolved


def size_checks(captured: Sequence[Captured], explicit: Mapping[str, Groups]) -> tf.Tensor | None:
    """int32 scalar: tensors grouped by explicit tower labels whose batch differs from them."""
    ids = {id(g) for g in explicit.values()}
    checks = [tf.cast(tf.not_equal(tf.shape(c.tensor)[0], tf.size(c.grouping.ids)), tf.int32)
              for c in captured if c.grouping is not None and id(c.grouping) in ids]
    if not checks:
        return None
    with tf.name_scope("tf_inspector/towers/"):
        return tf.add_n(checks)


def split_axis0(t: tf.Tensor) -> tf.Tensor | None:
    """The tensor ``t`` was cut from by a ``tf.split`` along axis 0 (``t`` one of its parts), else
    None."""
    op = t.op
    if op.type not in SPLITS:
        return None
    value, axis = (op.inputs[1], op.inputs[0]) if op.type == "Split" \
        else (op.inputs[0], op.inputs[2])
    a = tf.get_static_value(axis)
    if a is None or np.ndim(a) != 0:
        return None
    a = int(a) + (value.shape.rank or 0) * (int(a) < 0)
    return value if a == 0 else None


def whole_batch(labels: tf.Tensor) -> tf.Tensor:
    """The labels of the whole batch that ``labels`` (one tower's part, cut by ``tf.split``
    along axis 0, maybe repeatedly) were cut from; ``labels`` if they are not such a part."""
    while (whole := split_axis0(labels)) is not None:
        labels = whole
    return labels


def cut_at(axis: BatchAxis, names: Iterable[str], graph: tf.Graph) -> dict[str, list[str]]:
    """{where the batch was cut: the unresolved tensors (``names``) computed from there}: each
    unresolved tensor traced back through unresolved inputs to the ops where its rows stopped
    being the batch's, each described (the op, its type, and what it did)."""
    out: dict[str, list[str]] = {}
    for name in names:
        t = graph.get_tensor_by_name(name)
        seen, todo, origins = set(), [t], []
        while todo:
            x = todo.pop()
            if x.name in seen:
                continue
            seen.add(x.name)
            parts = [i for i in x.op.inputs if axis.unresolved(i)]
            if parts:
                todo += parts
            else:
                origins.append(_describe_cut(axis, x.op))
        for where in dict.fromkeys(origins):
            out.setdefault(where, []).append(name)
    return out


def _describe_cut(axis: BatchAxis, op: tf.Operation) -> str:
    batched = [x for x in op.inputs if axis.is_batched(x)]
    if op.type in PARTS and batched:
        return (f"{op.name} ({op.type}: takes some rows of {batched[0].name}, whose axis 0 is "
                "taken as the batch)")
    slices = sorted({tower_name(axis, w) if (w := axis.slice_of(x)) else "the whole batch"
                     for x in batched})
    return (f"{op.name} ({op.type}: combines rows of "
            f"{' and '.join(slices) or 'several parts of the batch'})")
