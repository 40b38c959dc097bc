"""The dump fetch: the kept samples of every captured tensor, packed only on dump steps.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from hooks.capture.feeds import on_device_of, value_source
from hooks.capture.groups import Groups
from hooks.capture.select import Captured

v1 = tf.compat.v1


def ungrouped_dump(arrays: dict[str, np.ndarray]) -> bool:
    """Drop the ``samples/.../group`` arrays of a dump whose kept samples include samples in no
    group (codes -1: :func:`kept_samples` on a step whose samples break the group rule); the
    group of those samples is unknown, and FORMAT.md has no code for it. Whether it did."""
    ungrouped = [k for k, a in arrays.items()
                 if k.startswith("samples/") and k.endswith("/group") and np.any(np.asarray(a) < 0)]
    for k in ungrouped:
        del arrays[k]
    return bool(ungrouped)


def taken(pred: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    """``t`` where ``pred`` is true; a dead tensor otherwise (v1 Switch): ops reading it run
    only on steps where ``pred`` holds."""
    return tf.raw_ops.Switch(data=t, pred=pred)[1]


def _or_empty(pred: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """``x`` (alive only when ``pred``) where ``pred`` is true, else an empty [0] of its dtype."""
    skipped, _ = tf.raw_ops.Switch(data=tf.zeros([0], x.dtype), pred=pred)
    return tf.raw_ops.Merge(inputs=[x, skipped])[0]


def pack_when(pred: tf.Tensor, tensors: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """``tensors``, where ``pred`` holds, packed into one flat vector per dtype plus one int64
    vector of (rank, *shape) per tensor; each is empty on other steps. A few fetches instead of
    one per key: fetching hundreds of (empty) arrays every step costs Python time every step.
    :func:`unpack` restores the arrays.

    Example::

        fetch = pack_when(tf.logical_not(finite), {"forward/x:0": x})
        arrays = unpack(session.run(fetch), ["forward/x:0"], ["float32"])   # {} unless not finite
    """
    flat: dict[tf.DType, list[tf.Tensor]] = {}
    shapes = []
    for t in tensors.values():
        # also gates tensors not gated already (a Switch of a dead tensor is dead)
        t = taken(pred, t)
        flat.setdefault(t.dtype, []).append(tf.reshape(t, [-1]))
        shape = tf.shape(t, out_type=tf.int64)
        shapes.append(tf.concat([tf.reshape(tf.size(shape, out_type=tf.int64), [1]), shape], 0))
    out = {f"values/{d.name}": _or_empty(pred, tf.concat(v, 0)) for d, v in flat.items()}
    out["shapes"] = _or_empty(pred, tf.concat(shapes, 0)) if shapes else tf.zeros([0], tf.int64)
    return out


def unpack(results: Mapping[str, np.ndarray], keys: Sequence[str],
           dtypes: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays :func:`pack_when` packed (``keys`` and their dtype names, in its order);
    {} when its ``pred`` was false (the vectors are empty)."""
    shapes = results["shapes"]
    if not len(shapes):
        return {}
    out, pos, offset = {}, 0, dict.fromkeys(dtypes, 0)
    for key, dtype in zip(keys, dtypes):
        rank = int(shapes[pos])
        shape = tuple(int(d) for d in shapes[pos + 1:pos + 1 + rank])
        pos += 1 + rank
        n = int(np.prod(shape, dtype=np.int64))
        out[key] = results[f"values/{dtype}"][offset[dtype]:offset[dtype] + n].reshape(shape)
        offset[dtype] += n
    return out


def keeps_whole_batch(groups: "Groups | None", static_batch: int | None,
                      per_group: int) -> int | None:
    """``build_dump``'s ``keep_all_of``: the static batch size when :func:`kept_samples` keeps
    every sample (a budget of at least the batch per group, 2x without groups, and every sample
    in a group: else the budget leaves the others out), or None."""
    budget = per_group if groups is not None else 2 * per_group
    whole = static_batch and budget >= static_batch and (groups is None or groups.complete)
    return static_batch if whole else None


def build_dump(captured: Sequence[Captured], keep: tf.Tensor, keep_all_of: int | None = None,
               gate: tf.Tensor | None = None, keeps: Mapping[int, tf.Tensor] | None = None
               ) -> tuple[dict[str, tf.Tensor], dict[str, str]]:
    """'forward/<name>' and 'gradient/<name>' -> kept samples (batched) or the whole tensor,
    and aliases: key -> the key holding the same tensor (fetched and written once).

    The same tensor appears under several keys where a gradient passes through an op
    unchanged (d loss / d conv output = d loss / d the add it feeds) or a tensor is captured
    as a forward value and as another tensor's gradient (also through Identity ops, such as
    the ones ``gate_gradients`` puts around an optimizer's gradients).
    ``keep_all_of``: the static batch size when the budget keeps every sample; batched tensors
    of exactly that leading size are then fetched as they are (gathering all rows is a copy
    of every dumped byte). ``gate``: a boolean scalar; the dump's tensors (and the gathers
    that keep their samples) then run only on steps where it is true (:func:`taken`): pack
    them with :func:`pack_when` to fetch them. ``keeps``: id(``Captured.grouping``) -> the kept
    samples of a tower's tensors (rows of its slice of the batch)."""
    out: dict[str, tf.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[str, bool], str] = {}
    with tf.name_scope("tf_inspector/dump"):
        for cap in captured:
            for kind, t in (("forward", cap.tensor), ("gradient", cap.gradient)):
                if t is None:
                    continue
                key = f"{kind}/{cap.name}"
                own = (keeps or {}).get(id(cap.grouping)) if cap.grouping is not None else None
                seen = first.setdefault((value_source(t).name, cap.batched, id(own)), key)
                if seen != key:
                    aliases[key] = seen
                    continue
                out[key] = _kept(t if gate is None else taken(gate, t), cap.batched,
                                 keep if own is None else own, keep_all_of if own is None else None)
    return out, aliases


def _kept(t: tf.Tensor, batched: bool, keep: tf.Tensor, keep_all_of: int | None) -> tf.Tensor:
    """What a dump stores of ``t``: the kept samples (batched) or all of it; bfloat16 as float32."""
    with on_device_of(t):  # kept samples gathered where t lives: only they are copied to the host
        if t.dtype == tf.bfloat16:  # numpy and safetensors readers lack bfloat16
            t = tf.cast(t, tf.float32)
        if batched and not (keep_all_of and t.shape.rank and t.shape.as_list()[0] == keep_all_of):
            # the kept samples below t's batch size (robust to a different batch): keep is
            # ascending, so a prefix; a slice builds far fewer ops than a boolean mask, and a
            # dump gathers from every captured tensor
            mine = keep[:tf.reduce_sum(tf.cast(keep < tf.shape(t)[0], tf.int32))]
            t = tf.gather(t, mine)
    return t
