"""What each captured tensor feeds, recorded in the catalog so TF-free analysis can judge alerts.

Two catalog fields come from here (FORMAT.md, "Catalog entry"):

- ``feeds``: the sorted op types of the tensor's forward consumers (Identity ops looked
  through), e.g. ``["BiasAdd"]`` for a bias read, ``["FusedBatchNormV3"]`` for a conv output.
- ``zero_gradient_expected``: True where d loss / d tensor is ~0 by construction: a
  per-channel shift (a bias) added right before a training-mode batch normalization, which
  subtracts the batch mean and so removes any constant shift. Its gradient is then rounding
  noise (~1e-9), which is not a vanishing gradient.

Example::

    feeds(tensor, forward_ops)            # ['BiasAdd']
    zero_gradient_expected(bias_read)     # True when the BiasAdd feeds FusedBatchNormV3
"""
from __future__ import annotations

import contextlib

import tensorflow as tf

#: Normalizations that remove a per-channel shift of their input (in training mode).
BATCH_NORM_OPS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
#: Ops that add a (broadcast) shift to their first input.
SHIFT_OPS = frozenset({"BiasAdd", "Add", "AddV2"})
PASS_THROUGH = frozenset({"Identity", "IdentityN"})


def consumers(t: tf.Tensor, keep: set[str] | None = None) -> list[tf.Operation]:
    """Forward consumers of ``t``, looking through Identity ops (``keep``: names of forward ops)."""
    out, stack, seen = [], [t], set()
    while stack:
        for op in stack.pop().consumers():
            if op.name in seen or (keep is not None and op.name not in keep):
                continue
            seen.add(op.name)
            if op.type in PASS_THROUGH:
                stack.extend(op.outputs)
            else:
                out.append(op)
    return out


def feeds(t: tf.Tensor, keep: set[str] | None = None) -> list[str]:
    """Sorted op types ``t`` feeds in the forward pass."""
    return sorted({op.type for op in consumers(t, keep)})


def _normalizes(op: tf.Operation) -> bool:
    """A training-mode batch norm (fused, or tf.nn.moments-based: a 'moments' scope)."""
    if op.type in BATCH_NORM_OPS:
        try:
            return bool(op.get_attr("is_training"))
        except ValueError:
            return True
    return "/moments/" in op.name or op.name.startswith("moments/")


def _is_shift_operand(t: tf.Tensor, op: tf.Operation) -> bool:
    """``t`` is the broadcast (lower-rank) operand of a bias add, not the activations."""
    if op.type not in SHIFT_OPS or len(op.inputs) != 2:
        return False
    out_rank, rank = op.outputs[0].shape.rank, t.shape.rank
    return rank is not None and out_rank is not None and rank < out_rank


def zero_gradient_expected(t: tf.Tensor, keep: set[str] | None = None) -> bool:
    """True if every forward use of ``t`` is a shift that a batch norm then removes."""
    uses = consumers(t, keep)
    if not uses:
        return False
    for op in uses:
        if not _is_shift_operand(t, op):
            return False
        after = consumers(op.outputs[0], keep)
        if not after or not all(_normalizes(c) for c in after):
            return False
    return True


def annotate(captured: list, graph: tf.Graph, backward: set[str]) -> None:
    """Fill ``feeds`` and ``zero_gradient_expected`` into each Captured's catalog extras."""
    keep = {op.name for op in graph.get_operations() if op.name not in backward
            and not op.name.startswith("tf_inspector/")}
    for cap in captured:
        if "feeds" in cap.extra:  # variable records set their own
            continue
        cap.extra["feeds"] = feeds(cap.tensor, keep)
        cap.extra["zero_gradient_expected"] = zero_gradient_expected(cap.tensor, keep)


def value_source(t: tf.Tensor) -> tf.Tensor:
    """The tensor ``t`` copies through Identity ops (same value; control inputs only order)."""
    while t.op.type == "Identity" and len(t.op.inputs) == 1:
        t = t.op.inputs[0]
    return t


def accelerator(t: tf.Tensor) -> str | None:
    """``t``'s device where the graph pins it to an accelerator (GPU, TPU), else None.

    >>> with tf.device("/device:GPU:0"): x = tf.zeros([2])   # doctest: +SKIP
    >>> accelerator(x)                                        # '/device:GPU:0'
    """
    if not t.device:
        return None
    kind = (tf.DeviceSpec.from_string(t.device).device_type or "").upper()
    return t.device if kind in ("GPU", "TPU") else None


def on_device_of(t: tf.Tensor):
    """A device scope putting new ops where ``t`` is pinned (an accelerator), else no scope:
    what reads ``t`` then runs beside it, and only its (small) result crosses to the host."""
    dev = accelerator(t)
    return tf.device(dev) if dev else contextlib.nullcontext()
