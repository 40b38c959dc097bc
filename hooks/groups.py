"""Sample groups: which statistics rows a batched tensor gets besides ``all``.

``DumpHook(groups=...)`` takes one of:

- ``None`` (default): ``positive`` / ``negative`` by the ``positive=`` predicate or the
  default rule on the labels (docs/guide/loss-and-labels.md); the ICNN pages use these.
- ``"per_class"``: one group per class id, ``class_0`` ... ``class_<C-1>``. C is the labels'
  static last dimension for one-hot / probability labels [N, C > 1], else ``num_classes=``;
  at most ``MAX_CLASS_GROUPS`` (more is refused when the hook is built: pass a function that
  pools classes instead). Class ids are [N] or [N, 1] integers (floats holding integers, bool),
  or the argmax of [N, C]. A sample whose id is outside [0, C) (or a float that is not an
  integer) is a *bad* sample (below).
- a function ``fn(labels)`` or ``fn(labels, predictions)`` returning ``{name: bool [N]}``,
  built in the graph once (so statistics stay in the fused pass). Groups are disjoint:
  a sample in no group counts in ``all`` only; a sample in two groups is a *bad* sample.
  ``predictions``: ``DumpHook(predictions=...)``, else the EstimatorSpec's predictions (a
  tensor, or its dict, such as canned heads' ``{"logits", "probabilities", "class_ids"}``).

Bad samples are checked on every statistics step (one scalar fetched with the statistics):
a step with any writes its ``all`` rows only and the hook logs an error naming the rule, so
a group's numbers never cover the wrong samples.

Example::

    def correct(labels, predictions):
        hit = tf.equal(tf.argmax(predictions["logits"], 1), tf.reshape(tf.cast(labels, tf.int64), [-1]))
        return {"correct": hit, "misclassified": tf.logical_not(hit)}
    DumpHook("runs/x", groups=correct)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from inspector.format import check_group_name
from inspector.manifest_schema import GROUPS_REFUSED_KEY

from . import capture
from .capture import Groups
from .options import MAX_CLASS_GROUPS, check_classes, group_kind  # noqa: F401 (MAX_CLASS_GROUPS: its home was here)


@dataclass
class GroupSpec:
    """How to build :class:`Groups` from labels (and predictions); see the module docstring."""
    kind: str                                 # 'positive_negative', 'per_class', 'function'
    positive: Callable | tf.Tensor | None = None
    num_classes: int | None = None
    fn: Callable | None = None

    @classmethod
    def parse(cls, groups: Any, positive=None, num_classes: int | None = None) -> "GroupSpec":
        """``groups=`` / ``positive=`` / ``num_classes=`` (checked by ``options.group_kind``)."""
        kind = group_kind(groups, positive, num_classes)
        return cls(kind, positive=positive if kind == "positive_negative" else None,
                   num_classes=num_classes if kind == "per_class" else None, fn=groups if kind == "function" else None)

    @property
    def needs_predictions(self) -> bool:
        if self.fn is None:
            return False
        try:
            params = [p for p in inspect.signature(self.fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        except (TypeError, ValueError):
            return False
        return len(params) >= 2

    def describe(self, labels: tf.Tensor) -> str:
        """The rule in words, for the log and the manifest."""
        if self.kind == "per_class":
            return f"per_class: {_class_rule(labels)}"
        if self.kind == "function":
            return f"function {getattr(self.fn, '__qualname__', repr(self.fn))}"
        if self.positive is not None:
            return "positive/negative by the positive= argument"
        return f"positive/negative: {capture.default_rule(labels)}"

    def build(self, labels: tf.Tensor, predictions: Any = None) -> Groups:
        """The groups of ``labels``' batch, built in the graph; ValueError / LabelsError when the
        labels (or the function's result) do not fit the rule."""
        with tf.name_scope("tf_inspector/groups/"):
            if self.kind == "per_class":
                return _per_class(labels, self.num_classes)
            if self.kind == "function":
                return _from_function(self.fn, labels, predictions, self.needs_predictions)
            # samples the default rule cannot split: that step's statistics are written for 'all' only
            return capture.positive_groups(labels, self.positive, count_bad=True)


def _class_rule(labels: tf.Tensor) -> str:
    shape = labels.shape
    if shape.rank == 2 and shape[1] not in (None, 1):
        return f"argmax of one-hot / probabilities [N, {shape[1]}]"
    return f"class ids {'[N]' if shape.rank == 1 else '[N, 1]'}"


def _per_class(labels: tf.Tensor, num_classes: int | None) -> Groups:
    shape = labels.shape
    if not (labels.dtype.is_integer or labels.dtype.is_floating or labels.dtype == tf.bool):
        raise capture.LabelsError(f"groups='per_class': labels {labels.name} are {labels.dtype.name}, not class "
                                  f"ids; pass groups=<function> mapping them to named groups")
    one_hot = shape.rank == 2 and shape[1] not in (None, 1)
    if one_hot:
        if num_classes is not None and num_classes != shape[1]:
            raise ValueError(f"num_classes={num_classes} but labels {labels.name} are one-hot [N, {shape[1]}]")
        num_classes = int(shape[1])
        ids = tf.argmax(tf.cast(labels, tf.float32) if labels.dtype == tf.bool else labels, axis=1,
                        output_type=tf.int32)
        bad = tf.zeros([], tf.int32)
    elif shape.rank == 1 or (shape.rank == 2 and shape[1] == 1):
        flat = tf.reshape(labels, [-1])
        if num_classes is None:
            raise ValueError(f"groups='per_class' with class-id labels {labels.name} {shape}: the number of "
                             f"classes is unknown; pass num_classes=")
        if labels.dtype == tf.bool:
            flat = tf.cast(flat, tf.int32)
        whole = tf.equal(flat, tf.round(flat)) if flat.dtype.is_floating else tf.ones_like(flat, tf.bool)
        ids64 = tf.cast(tf.where(whole, flat, -tf.ones_like(flat)), tf.int64)
        inside = tf.logical_and(whole, tf.logical_and(ids64 >= 0, ids64 < num_classes))
        ids = tf.where(inside, tf.cast(ids64, tf.int32), tf.fill(tf.shape(ids64), num_classes))
        bad = tf.reduce_sum(tf.cast(tf.logical_not(inside), tf.int32))
    else:
        raise capture.LabelsError(f"groups='per_class': labels {labels.name} have shape {shape}; class ids "
                                  f"[N] / [N, 1] or one-hot [N, C] are needed")
    check_classes(num_classes)
    names = tuple(f"class_{i}" for i in range(num_classes))
    return Groups(ids, names, tuple(range(num_classes)), bad)


def _from_function(fn: Callable, labels: tf.Tensor, predictions: Any, with_predictions: bool) -> Groups:
    if with_predictions and predictions is None:
        raise ValueError(f"groups={getattr(fn, '__name__', fn)!r} takes predictions, but none were found: pass "
                         f"DumpHook(predictions=...) (a tensor or its name)")
    out = fn(labels, predictions) if with_predictions else fn(labels)
    if not isinstance(out, Mapping) or not out:
        raise ValueError(f"groups function {getattr(fn, '__name__', fn)!r} must return a non-empty dict "
                         f"{{name: bool [N]}}, not {type(out).__name__}")
    names = tuple(out)
    for n in names:
        check_group_name(n)
    masks = []
    for n in names:
        m = tf.convert_to_tensor(out[n])
        if m.dtype != tf.bool or m.shape.rank not in (None, 1):
            raise ValueError(f"group {n!r}: the function must return bool [N] tensors, not {m.dtype.name} {m.shape}")
        masks.append(tf.reshape(m, [-1]))
    member = tf.cast(tf.stack(masks, axis=1), tf.int32)  # [N, K]
    inside = tf.reduce_sum(member, axis=1)
    ids = tf.where(tf.equal(inside, 1), tf.argmax(member, axis=1, output_type=tf.int32),
                   tf.fill(tf.shape(inside), len(names)))
    bad = tf.reduce_sum(tf.cast(inside > 1, tf.int32))
    return Groups(ids, names, tuple(range(len(names))), bad)


class Refusals:
    """One writer session's statistics steps whose groups were refused: the manifest's
    ``groups_refused`` record, written at the first such step (so a crash keeps it) and
    completed with ``steps`` and ``last_step`` when the session closes."""

    def __init__(self) -> None:
        self.record: dict | None = None
        self.steps = 0

    def note(self, step: int, samples: int | None, why: str) -> dict | None:
        """Count ``step``; the record to write now if it is the session's first, else None."""
        self.steps += 1
        first = self.record is None
        if first:
            self.record = {"first_step": int(step), "samples": samples, "why": why}
        self.record["last_step"] = int(step)
        return dict(self.record, steps=1) if first else None

    def close(self, writer) -> None:
        """Complete the record in ``writer``'s manifest before it closes (if a step was refused)."""
        if self.record is not None:
            writer.update_manifest(**{GROUPS_REFUSED_KEY: {**self.record, "steps": self.steps}})


def all_rows_only(rows: Sequence[tuple[str, str, str]], n: int) -> np.ndarray:
    """bool [n]: the statistics rows of group ``all`` (``rows``: (tensor, kind, group) of the
    first rows; the rest, e.g. variable updates, are ``all`` rows): what a refused step writes."""
    return np.asarray([g == "all" for _, _, g in rows] + [True] * (n - len(rows)))


def bad_rule(spec: GroupSpec) -> str:
    """What a bad sample is under ``spec`` (for the error the hook logs)."""
    if spec.kind == "per_class":
        return "class ids outside [0, num_classes) or not integers"
    if spec.kind == "positive_negative":
        return ("float labels that are not whole numbers (soft or regression targets): the default rule "
                "(label != 0) needs class ids; pass positive=")
    return "samples in more than one group (groups must be disjoint)"
