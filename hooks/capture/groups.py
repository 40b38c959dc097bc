"""Sample groups: the rule that splits a batch (positive/negative, per class, a user function), the
in-graph group ids and kept samples, and what a step whose samples break the rule records.

Sample groups: which statistics rows a batched tensor gets besides ``all``.

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
        hit = tf.equal(tf.argmax(predictions["logits"], 1),
                       tf.reshape(tf.cast(labels, tf.int64), [-1]))
        return {"correct": hit, "misclassified": tf.logical_not(hit)}
    DumpHook("runs/x", groups=correct)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from hooks.options import (  # noqa: F401 (MAX_CLASS_GROUPS: its home was here)
    FLOAT_DTYPE_NAMES,
    MAX_CLASS_GROUPS,
    CaptureOptions,
    check_classes,
    compile_patterns,
    group_kind,
)
from inspector.format import DEFAULT_GROUPS, check_group_name
from inspector.format.manifest import GROUPS_REFUSED_KEY

class LabelsError(ValueError):
    """No default rule says which samples of these labels are positive."""


def default_rule(labels: tf.Tensor) -> str:
    """The default positive rule for ``labels`` (docs/guide/loss-and-labels.md); raises
    ``LabelsError``."""
    shape, rank = labels.shape, labels.shape.rank
    dtype = labels.dtype
    if not (dtype.is_integer or dtype.is_floating or dtype == tf.bool):
        raise LabelsError(f"labels {labels.name} are {labels.dtype.name}: no default positive "
                          "rule; pass positive=lambda y: ... (a bool [N] of the positive "
                          "samples).")
    whole = " (whole numbers; others in no group)" if dtype.is_floating else ""
    if rank == 1:
        return f"class ids [N]: label != 0{whole}"
    if rank == 2 and shape[1] == 1:
        return f"class ids [N, 1]: label != 0{whole}"
    if rank == 2 and shape[1] is not None:
        return f"one-hot / probabilities [N, {shape[1]}]: argmax != 0"
    if rank == 2:
        return "[N, C], C known at run time: label != 0 if C == 1, else argmax != 0"
    raise LabelsError(f"labels {labels.name} have shape {shape}: no default positive rule for rank "
                      f"{rank}; pass positive=lambda y: ... (a bool [N] of the positive samples).")


def _default_positive(labels: tf.Tensor) -> tf.Tensor:
    """bool [N] per ``default_rule``: [N] and [N, 1] are class ids, [N, C > 1] one-hot or
    probabilities."""
    default_rule(labels)  # refuses what has no rule
    if labels.shape.rank == 1:
        return tf.not_equal(labels, tf.zeros([], labels.dtype))
    # C == 1: the id itself
    ids = tf.reduce_any(tf.not_equal(labels, tf.zeros([], labels.dtype)), axis=1)
    if labels.shape[1] == 1:
        return ids
    values = tf.cast(labels, tf.int32) if labels.dtype == tf.bool else labels
    hot = tf.not_equal(tf.argmax(values, axis=1), 0)
    if labels.shape[1] is not None:
        return hot
    return tf.where(tf.equal(tf.shape(labels)[1], 1), ids, hot)


def not_class_ids(labels: tf.Tensor) -> tf.Tensor | None:
    """bool [N]: the samples whose float class-id labels ([N] or [N, 1]) are not whole numbers
    (soft binary targets, regression targets), which the default rule cannot split: "label !=
    0" would call every one of them positive. [N, C] with C unknown until run time: the same
    on steps where C is 1 (``default_rule``). None where every label is a class id by type."""
    shape = labels.shape
    if not labels.dtype.is_floating or shape.rank not in (1, 2) \
            or (shape.rank == 2 and shape[1] not in (None, 1)):
        return None
    fraction = tf.logical_not(tf.equal(labels, tf.round(labels)))
    if shape.rank == 1:
        return fraction
    fraction = tf.reduce_any(fraction, axis=1)
    return fraction if shape[1] == 1 else tf.logical_and(tf.equal(tf.shape(labels)[1], 1), fraction)


def group_ids(labels: tf.Tensor, positive: Callable | tf.Tensor | None) -> tf.Tensor:
    """int32 [N]: 1 for positive samples, 0 for negative ones (:func:`positive_groups` also
    marks those the default rule cannot split).

    ``positive`` is a callable on the labels tensor, a precomputed bool tensor, or None:
    the default rule (``default_rule``): labels != 0 for class ids [N] or [N, 1], argmax != 0
    for one-hot / probability labels [N, C > 1]; other labels raise ``LabelsError``."""
    if isinstance(positive, (tf.Tensor, tf.Variable)):
        pos = positive
    elif callable(positive):
        pos = positive(labels)
    else:
        pos = _default_positive(labels)
    pos = tf.convert_to_tensor(pos)
    if pos.dtype != tf.bool:
        pos = tf.not_equal(pos, tf.zeros([], pos.dtype))
    if pos.shape.rank is None or pos.shape.rank > 1:
        pos = tf.reduce_any(tf.reshape(pos, [tf.shape(pos)[0], -1]), axis=1)
    return tf.cast(pos, tf.int32)


@dataclass
class Groups:
    """The sample groups of one batch: ``ids`` int32 [N], each sample's group index 0..K-1, or
    K: in no group; ``names`` the K names (rows after ``all``); ``codes`` what a dump's
    ``samples/group`` stores per group; ``bad`` an int32 scalar: samples breaking the rule
    (hooks/capture/groups.py; None: none can); ``complete``: every sample is in a group by
    construction (a dump whose budget covers the batch may then fetch tensors whole)."""
    ids: tf.Tensor
    names: tuple[str, ...] = DEFAULT_GROUPS
    codes: tuple[int, ...] = (1, 0)
    bad: tf.Tensor | None = None
    complete: bool = False

    @property
    def count(self) -> int:
        return len(self.names)

    def sliced(self, ids: tf.Tensor) -> "Groups":
        """The same groups over other samples (a tower's slice of the batch). ``bad`` stays the
        whole batch's: a step whose samples break the rule is refused in every slice, and
        its slices' dumps keep their first samples, ungrouped, like the batch's."""
        return Groups(ids, self.names, self.codes, self.bad, self.complete)


def from_positive(positive_ids: tf.Tensor, bad: tf.Tensor | None = None,
                  complete: bool = False) -> Groups:
    """positive/negative :class:`Groups` from int [N] ids, 1 positive, 0 negative, -1 neither
    (:func:`group_ids`); ``complete``: no id can be -1."""
    ids = tf.cast(positive_ids, tf.int32)
    return Groups(tf.where(ids < 0, tf.fill(tf.shape(ids), 2), 1 - ids), DEFAULT_GROUPS, (1, 0),
                  bad, complete)


def positive_groups(labels: tf.Tensor, positive: Callable | tf.Tensor | None,
                    count_bad: bool = False) -> Groups:
    """positive/negative :class:`Groups` of ``labels`` (:func:`group_ids`), complete unless the
    default rule may leave samples in neither (:func:`not_class_ids`); ``count_bad``: those
    samples' count as ``bad`` (the step's groups are then refused)."""
    ids = group_ids(labels, positive)
    unsure = not_class_ids(labels) if positive is None else None
    if unsure is None:
        return from_positive(ids, complete=True)
    bad = tf.reduce_sum(tf.cast(unsure, tf.int32)) if count_bad else None
    return from_positive(tf.where(unsure, -tf.ones_like(ids), ids), bad)


def as_groups(groups: "Groups | tf.Tensor | None") -> Groups | None:
    """``groups``, or positive/negative groups from a :func:`group_ids` tensor (1 positive)."""
    return groups if groups is None or isinstance(groups, Groups) else from_positive(groups)


def kept_samples(groups: "Groups | tf.Tensor | None", batch: tf.Tensor, per_group: int
                 ) -> tuple[tf.Tensor, tf.Tensor | None]:
    """Batch indices kept by the sample budget: the first ``per_group`` samples of each group
    (in batch order), and each kept sample's group code (``samples/group``, -1: in no group);
    without groups the first ``2 * per_group`` samples. On a step whose samples break the
    group rule (``groups.bad``: its statistics are written for ``all`` only), the first
    ``count * per_group`` samples, whatever their group: float regression targets under the
    default rule put every sample in no group, and the dumps had kept none."""
    groups = as_groups(groups)
    if groups is None:
        return tf.range(tf.minimum(batch, 2 * per_group)), None
    ids = groups.ids
    member = tf.one_hot(ids, groups.count, dtype=tf.int32)   # id count (no group): all zeros
    # place in its group
    rank = tf.reduce_sum(tf.cumsum(member, axis=0, exclusive=True) * member, axis=1)
    mask = tf.logical_and(ids < groups.count, rank < per_group)
    if groups.bad is not None:
        first = tf.range(tf.size(ids)) < groups.count * per_group
        mask = tf.where(groups.bad > 0, first, mask)
    keep = tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)
    codes = tf.gather(tf.constant(list(groups.codes) + [-1], tf.int32), tf.gather(ids, keep))
    return keep, codes


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
                   num_classes=num_classes if kind == "per_class" else None,
                   fn=groups if kind == "function" else None)

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
        return f"positive/negative: {default_rule(labels)}"

    def build(self, labels: tf.Tensor, predictions: Any = None) -> Groups:
        """The groups of ``labels``' batch, built in the graph; ValueError / LabelsError when the
        labels (or the function's result) do not fit the rule."""
        with tf.name_scope("tf_inspector/groups/"):
            if self.kind == "per_class":
                return _per_class(labels, self.num_classes)
            if self.kind == "function":
                return _from_function(self.fn, labels, predictions, self.needs_predictions)
            # samples the default rule cannot split: that step's statistics are written for 'all'
            # only
            return positive_groups(labels, self.positive, count_bad=True)


def _class_rule(labels: tf.Tensor) -> str:
    shape = labels.shape
    if shape.rank == 2 and shape[1] not in (None, 1):
        return f"argmax of one-hot / probabilities [N, {shape[1]}]"
    return f"class ids {'[N]' if shape.rank == 1 else '[N, 1]'}"


def _per_class(labels: tf.Tensor, num_classes: int | None) -> Groups:
    shape = labels.shape
    if not (labels.dtype.is_integer or labels.dtype.is_floating or labels.dtype == tf.bool):
        raise LabelsError(f"groups='per_class': labels {labels.name} are {labels.dtype.name}, not "
                          f"class ids; pass groups=<function> mapping them to named groups")
    one_hot = shape.rank == 2 and shape[1] not in (None, 1)
    if one_hot:
        if num_classes is not None and num_classes != shape[1]:
            raise ValueError(f"num_classes={num_classes} but labels {labels.name} are one-hot [N, "
                             f"{shape[1]}]")
        num_classes = int(shape[1])
        ids = tf.argmax(tf.cast(labels, tf.float32) if labels.dtype == tf.bool else labels, axis=1,
                        output_type=tf.int32)
        bad = tf.zeros([], tf.int32)
    elif shape.rank == 1 or (shape.rank == 2 and shape[1] == 1):
        flat = tf.reshape(labels, [-1])
        if num_classes is None:
            raise ValueError(f"groups='per_class' with class-id labels {labels.name} {shape}: the "
                             f"number of classes is unknown; pass num_classes=")
        if labels.dtype == tf.bool:
            flat = tf.cast(flat, tf.int32)
        whole = tf.equal(flat, tf.round(flat)) if flat.dtype.is_floating \
            else tf.ones_like(flat, tf.bool)
        ids64 = tf.cast(tf.where(whole, flat, -tf.ones_like(flat)), tf.int64)
        inside = tf.logical_and(whole, tf.logical_and(ids64 >= 0, ids64 < num_classes))
        ids = tf.where(inside, tf.cast(ids64, tf.int32), tf.fill(tf.shape(ids64), num_classes))
        bad = tf.reduce_sum(tf.cast(tf.logical_not(inside), tf.int32))
    else:
        raise LabelsError(f"groups='per_class': labels {labels.name} have shape {shape}; class ids "
                                  f"[N] / [N, 1] or one-hot [N, C] are needed")
    check_classes(num_classes)
    names = tuple(f"class_{i}" for i in range(num_classes))
    return Groups(ids, names, tuple(range(num_classes)), bad)


def _from_function(fn: Callable, labels: tf.Tensor, predictions: Any,
                   with_predictions: bool) -> Groups:
    if with_predictions and predictions is None:
        raise ValueError(f"groups={getattr(fn, '__name__', fn)!r} takes predictions, but none were "
                         f"found: pass DumpHook(predictions=...) (a tensor or its name)")
    out = fn(labels, predictions) if with_predictions else fn(labels)
    if not isinstance(out, Mapping) or not out:
        raise ValueError(f"groups function {getattr(fn, '__name__', fn)!r} must return a non-empty "
                         f"dict {{name: bool [N]}}, not {type(out).__name__}")
    names = tuple(out)
    for n in names:
        check_group_name(n)
    masks = []
    for n in names:
        m = tf.convert_to_tensor(out[n])
        if m.dtype != tf.bool or m.shape.rank not in (None, 1):
            raise ValueError(f"group {n!r}: the function must return bool [N] tensors, not "
                             f"{m.dtype.name} {m.shape}")
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
        return ("float labels that are not whole numbers (soft or regression targets): the default "
                "rule (label != 0) needs class ids; pass positive=")
    return "samples in more than one group (groups must be disjoint)"
