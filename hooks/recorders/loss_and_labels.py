"""Which tensor is the loss and which the labels, when ``DumpHook`` is not told.

Loss, first match wins:

1. ``DumpHook(loss=...)``;
2. ``hooks.mark(loss=...)`` (or ``hooks.minimize``, which marks the loss it minimizes);
3. the loss the optimizer's ``tf.gradients`` differentiated (recorded by
   ``hooks.recorders.gradients``; a loss-scale optimizer's ``loss * scale`` stands for its
   loss, ``hooks.recorders.loss_scale``): scalar losses whose pass reached a variable. One: that
   one. Several: the one that is also the EstimatorSpec's loss (or the LOSSES
   collection's), else ambiguous;
4. the ``loss`` of the EstimatorSpec the model_fn returned (``hooks.recorders.estimator``);
5. the LOSSES collection, deduplicated: each tensor once, non-scalar entries (per-example
   losses of canned heads) left out, and entries another entry is computed from left out
   (the Estimator appends ``spec.loss``, a total that already contains them). One left:
   that, plus the REGULARIZATION_LOSSES it does not already contain (what
   ``tf.compat.v1.losses.get_total_loss()`` minimizes). Several: ambiguous;
6. none: forward values only.

Labels: ``DumpHook(labels=...)``, else ``hooks.mark(labels=...)``, else the ``labels`` the
Estimator passed to the model_fn (a single tensor, or a dict of one), else none.

``loss=`` or a mark naming a loss-scale optimizer's ``loss * scale`` is refused: its gradients
would be ``scale`` times those training applies.

Ambiguous cases are refused, never guessed: the hook logs an error naming the candidates
(``strict=True``: raises ``AmbiguousError``) and goes on without gradients (loss) or
without positive/negative groups (labels).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import tensorflow as tf

from hooks import capture
from hooks.capture import towers
from hooks.recorders import estimator as estimator_recorder
from hooks.recorders import gradients as gradient_recorder
from hooks.recorders import loss_scale
from inspector.format import LABELS_COLLECTION, LOSS_COLLECTION, POSITIVE_COLLECTION

if TYPE_CHECKING:
    from hooks.capture.groups import GroupSpec

log = logging.getLogger("tf_inspector")
v1 = tf.compat.v1
#: op types whose outputs in a recorded pass show that it differentiated a variable
VARIABLE_OP_TYPES = frozenset({"ReadVariableOp", "ResourceGather", "VarHandleOp", "VariableV2",
                               "Variable"})
HOOK_SCOPE = "tf_inspector/"


class AmbiguousError(ValueError):
    """The hook cannot tell which tensor is meant; the message names the candidates."""


@dataclass
class Choice:
    tensor: tf.Tensor
    reason: str


# ---- loss ------------------------------------------------------------------------------------
def resolve_loss(graph: tf.Graph, explicit: tf.Tensor | None, *, strict: bool) -> tf.Tensor | None:
    """The loss per the rules above, logged with the reason; None (logged) when there is none."""
    try:
        choice = choose_loss(graph, explicit)
    except AmbiguousError as e:
        if strict:
            raise
        log.error("%s Capturing forward values only, without gradients.", e)
        return None
    if choice is None:
        log.warning("no loss found (pass loss=, call hooks.mark(loss=...) in model_fn, or use "
                    "tf.compat.v1.losses)%s; capturing forward values only, without gradients",
                    _v1_loop_hint(graph))
        return None
    log.info("loss: %s (%s)", choice.tensor.name, choice.reason)
    return choice.tensor


def _v1_loop_hint(graph: tf.Graph) -> str:
    """Why an optimizer's loss may be unseen: the recorder skips backward passes through TF1
    (v1 control flow) while loops, whose gradients need the loop's own state."""
    if any(op.type == "LoopCond" for op in graph.get_operations()):
        return (": the graph has a TF1 while loop (v1 control flow, e.g. dynamic_rnn under "
                "disable_v2_behavior), whose backward pass the optimizer's loss cannot be "
                "read from")
    return ""


def choose_loss(graph: tf.Graph, explicit: tf.Tensor | None = None) -> Choice | None:
    """The loss and why it was chosen; raises ``AmbiguousError``."""
    if explicit is not None:
        return Choice(_not_scaled(graph, explicit, "loss="), "the loss= argument")
    marked = graph.get_collection(LOSS_COLLECTION)
    if marked:
        return Choice(_not_scaled(graph, marked[-1], "hooks.mark(loss=...)"),
                      "marked with hooks.mark or hooks.minimize")
    spec = _spec_loss(graph)
    recorded = optimizer_losses(graph)
    if recorded:
        return _from_recorded(graph, recorded, spec)
    if spec is not None:
        return Choice(spec, "the loss of the EstimatorSpec the model_fn returned")
    return collection_loss(graph)


def _not_scaled(graph: tf.Graph, t: tf.Tensor, how: str) -> tf.Tensor:
    """``t``, unless it is a loss-scale optimizer's ``loss x scale``: its gradients would be
    ``scale`` times those training applies (2^15 under the dynamic default), with nothing in
    the records to say so. Refused (``AmbiguousError``), naming the loss to give instead."""
    loss = loss_scale.unscaled(graph, t)
    if loss is not t:
        raise AmbiguousError(f"{how} names {t.name!r}, the loss x scale a loss-scale optimizer "
                             "differentiates: its gradients would be the scale times those "
                             f"training applies. Name the loss it scales, {loss.name!r} (its "
                             "gradients are then taken through the scale, as the optimizer takes "
                             "them).")
    return t


def _spec_loss(graph: tf.Graph) -> tf.Tensor | None:
    call = estimator_recorder.lookup(graph)
    t = _by_name(graph, call.loss) if call is not None and call.loss else None
    return t if t is not None and t.shape.rank == 0 else None


def _by_name(graph: tf.Graph, name: str) -> tf.Tensor | None:
    try:
        return graph.get_tensor_by_name(name)
    except (KeyError, ValueError):
        return None


def optimizer_losses(graph: tf.Graph) -> list[tf.Tensor]:
    """Scalar losses whose recorded ``tf.gradients`` pass reached a variable (an optimizer's),
    leaving out the hook's own passes."""
    out = []
    for name, table in gradient_recorder.recorded_losses(graph).items():
        grads = [g for g in table.values() if g not in (None, gradient_recorder.INDEXED)]
        if grads and all(g.startswith(HOOK_SCOPE) for g in grads):
            continue  # built by a DumpHook, not by the model
        t = _by_name(graph, name)
        if t is None or t.shape.rank != 0:
            continue
        ops = {graph.get_operation_by_name(k.rsplit(":", 1)[0]).type for k in table
               if _has_op(graph, k)}
        if ops & VARIABLE_OP_TYPES:
            # a loss-scale optimizer's loss x scale: the loss
            out.append(loss_scale.unscaled(graph, t))
    return _unique(out)


def _has_op(graph: tf.Graph, tensor_name: str) -> bool:
    try:
        graph.get_operation_by_name(tensor_name.rsplit(":", 1)[0])
        return True
    except (KeyError, ValueError):
        return False


def _from_recorded(graph: tf.Graph, recorded: list[tf.Tensor], spec: tf.Tensor | None) -> Choice:
    why = "the loss the optimizer's tf.gradients differentiated"
    if len(recorded) == 1:
        t = recorded[0]
        differs = f"; the EstimatorSpec's loss is {spec.name}" \
            if spec is not None and spec.name != t.name else ""
        return Choice(t, why + differs)
    names = {t.name for t in recorded}
    if spec is not None and spec.name in names:
        return Choice(spec, f"{why}, and the EstimatorSpec's loss (other passes: "
                            f"{_names(recorded, spec)})")
    try:
        listed = collection_loss(graph, build=False)
    except AmbiguousError:
        listed = None
    if listed is not None and listed.tensor.name in names:
        others = _names(recorded, listed.tensor)
        return Choice(listed.tensor, f"{why}, and the LOSSES collection's (other passes: {others})")
    raise AmbiguousError("cannot tell the loss: tf.gradients differentiated several scalars with "
                         f"respect to variables ({', '.join(sorted(names))}). Pass "
                         f"DumpHook(loss=...) or call hooks.mark(loss=...).")


def _names(tensors: Iterable[tf.Tensor], chosen: tf.Tensor) -> str:
    return ", ".join(sorted(t.name for t in tensors if t.name != chosen.name))


def _unique(tensors: Iterable) -> list[tf.Tensor]:
    seen, out = set(), []
    for t in tensors:
        if isinstance(t, tf.Tensor) and t.name not in seen:
            seen.add(t.name)
            out.append(t)
    return out


ancestors = capture.ancestors   # names of every tensor t is computed from (data inputs), t included


def collection_loss(graph: tf.Graph, build: bool = True) -> Choice | None:
    """Rule 5: the deduplicated LOSSES collection plus the regularization it lacks.
    ``build=False``: the collection's loss alone, nothing added to the graph."""
    entries = _unique(graph.get_collection(v1.GraphKeys.LOSSES))
    scalars = [t for t in entries if t.shape.rank == 0]
    dropped = [t.name for t in entries if t.shape.rank != 0]
    contains = {t.name: ancestors(t) for t in scalars}
    kept = [t for t in scalars
            if not any(t.name in contains[u.name] for u in scalars if u is not t)]
    if not kept:
        return None
    if len(kept) > 1:
        raise AmbiguousError("cannot tell the loss: the LOSSES collection holds several scalars, "
                             f"none computed from the others ({', '.join(t.name for t in kept)}), "
                             "and no optimizer pass was recorded. Pass DumpHook(loss=...), e.g. "
                             "loss=tf.compat.v1.losses.get_total_loss().")
    loss = kept[0]
    notes = [f"{len(entries)} distinct entries"]
    if len(scalars) > 1:
        notes.append(f"{', '.join(t.name for t in scalars if t is not loss)} already in it")
    if dropped:
        notes.append(f"non-scalar {', '.join(dropped)} left out")
    reg = [r for r in _unique(graph.get_collection(v1.GraphKeys.REGULARIZATION_LOSSES))
           if r.shape.rank == 0 and r.name not in contains[loss.name]]
    if reg and build:
        # absolute: tf_inspector/total_loss wherever begin() runs
        with graph.name_scope(HOOK_SCOPE):
            loss = tf.add_n([loss] + [tf.cast(r, loss.dtype) for r in reg], name="total_loss")
        notes.append(f"plus REGULARIZATION_LOSSES {', '.join(r.name for r in reg)}")
    return Choice(loss, "the LOSSES collection: " + "; ".join(notes))


# ---- labels ----------------------------------------------------------------------------------
#: the group rule of samples split by ``hooks.mark(positive=...)``
MARKED_RULE = "positive/negative by hooks.mark(positive=...)"

def resolve_groups(graph: tf.Graph, explicit: tf.Tensor | None, spec: "GroupSpec", predictions=None,
                   *, strict: bool, loss: tf.Tensor | None = None
                   ) -> tuple[tf.Tensor | None, capture.Groups | None, str | None]:
    """(labels, their :class:`capture.Groups` per ``spec``, the rule in words). Labels and groups
    are None when unknown or refused (logged); without groups the rule is ``"none: <why>"``,
    the manifest's reason (FORMAT.md, ``groups``). ``loss``: labels it is computed from as
    regression targets (:func:`regression_targets`) are refused under the default positive
    rule."""
    try:
        labels, reason, marked = choose_labels(graph, explicit)
    except AmbiguousError as e:
        _refuse(e, strict)
        return None, None, no_groups(str(e))
    if labels is None:
        log.info("no labels (%s): statistics for group 'all' only (pass labels= or "
                 "hooks.mark(labels=...))", reason)
        return None, None, no_groups(f"no labels found ({reason}): pass labels= or "
                                     "hooks.mark(labels=...), and positive= or groups= for "
                                     "groups other than label != 0")
    whole = towers.whole_batch(labels)
    if whole is not labels:
        # one tower's labels: their groups are that tower's samples only, and grouping the other
        # towers (and the whole batch) by them left those with no sample in any group
        if marked is not None or isinstance(spec.positive, (tf.Tensor, tf.Variable)) \
                or spec.needs_predictions:
            log.warning("labels %s are one tower's part of the batch (a tf.split of %s), and their "
                        "groups were given for that part only (%s): the other towers' samples have "
                        "none, so statistics are for group 'all' only. Pass the whole batch's "
                        "labels, labels=%r, with positive= a function of them, or "
                        "labels={scope: labels} per tower", labels.name, whole.name,
                        "hooks.mark(positive=...)" if marked is not None else
                        "positive= a tensor" if spec.kind == "positive_negative"
                        else "a groups function of predictions", whole.name)
            return labels, None, no_groups(
                f"labels {labels.name} are one tower's part of the batch and their groups were "
                f"given for that part only: pass the whole batch's labels, {whole.name}, with "
                "positive= a function of them, or labels={scope: labels} per tower")
        log.info("labels %s are one tower's part of the batch: grouping by %s, the labels they "
                 "were split from, so every tower's samples are grouped by their own labels",
                 labels.name, whole.name)
        labels, marked = whole, None
    if spec.kind == "positive_negative" and spec.positive is None and marked is not None:
        log.info("labels: %s (%s), positive samples as marked with hooks.mark", labels.name, reason)
        # mark(positive=): 0 or 1 each; the rule is the mark's, not the default rule of labels
        return labels, capture.from_positive(marked, complete=True), MARKED_RULE
    targets = regression_targets(graph, labels, loss) \
        if spec.kind == "positive_negative" and spec.positive is None \
        else None
    if targets:
        _refuse(capture.LabelsError(f"labels {labels.name} are regression targets ({targets}): the "
                                    "default rule (label != 0) would split them into zero and "
                                    "non-zero targets, not classes. Pass positive=lambda y: y > "
                                    f"threshold for the split you mean, or groups=<function>."),
                strict)
        return labels, None, no_groups(f"labels {labels.name} are regression targets "
                                       f"({targets}): pass positive=lambda y: y > threshold, "
                                       "or groups=<function>")
    if predictions is None and spec.needs_predictions:
        predictions = estimator_predictions(graph)
    try:
        groups = spec.build(labels, predictions)
    except (capture.LabelsError, ValueError) as e:
        _refuse(e, strict)
        return labels, None, no_groups(str(e))
    rule = spec.describe(labels)
    log.info("labels: %s (%s); groups: %s (%s)", labels.name, reason, rule, ", ".join(groups.names))
    return labels, groups, rule


#: the keys of the predictions a canned regression head returns (RegressionHead,
#: PoissonRegressionHead, LogisticRegressionHead); classification heads add class ids
REGRESSION_HEAD_KEYS = frozenset({"predictions", "logits"})
#: op types that make labels reaching the loss through them regression targets: a squared
#: error, or the square or absolute value of a difference with them (mean squared or absolute
#: error, Huber)
_DISTANCES = frozenset({"SquaredDifference", "Square", "Abs"})


def regression_targets(graph: tf.Graph, labels: tf.Tensor, loss: tf.Tensor | None) -> str | None:
    """Why ``labels`` ([N] or [N, 1]) are regression targets, not class ids, or None: the
    EstimatorSpec's predictions are a canned regression head's, or the loss is computed from
    them through a squared or absolute difference (a classifier's cross entropy is not)."""
    if labels.shape.rank not in (1, 2) or (labels.shape.rank == 2 and labels.shape[1] != 1):
        return None
    call = estimator_recorder.lookup(graph)
    keys = {k for k, _ in call.predictions} if call is not None else set()
    if "predictions" in keys and keys <= REGRESSION_HEAD_KEYS:
        return "the EstimatorSpec's predictions are a regression head's: " + ", ".join(sorted(keys))
    if loss is None:
        return None
    upstream, seen, todo = ancestors(loss), set(), [labels]
    while todo:
        t = todo.pop()
        for op in t.consumers():
            if op.name in seen or not any(o.name in upstream for o in op.outputs):
                continue
            seen.add(op.name)
            if op.type in _DISTANCES:
                return f"the loss is computed from {op.name}, a {op.type} of them"
            todo += op.outputs
    return None


def estimator_predictions(graph: tf.Graph):
    """The EstimatorSpec's predictions: a tensor, or a dict of its dense tensors; None."""
    call = estimator_recorder.lookup(graph)
    if call is None or not call.predictions:
        return None
    found = {k: _by_name(graph, n) for k, n in call.predictions}
    found = {k: t for k, t in found.items() if t is not None}
    if not found:
        return None
    return found[""] if list(found) == [""] else found


def no_groups(why: str) -> str:
    """The manifest's rule where labels give no groups: ``"none: <why>"`` (``run.groups_note``)."""
    return f"none: {why}"


def _refuse(error: ValueError, strict: bool) -> None:
    """Raise under strict=True, else log: the hook goes on without groups."""
    if strict:
        raise error
    log.error("%s Statistics for group 'all' only.", error)


def choose_labels(graph: tf.Graph, explicit: tf.Tensor | None
                  ) -> tuple[tf.Tensor | None, str, tf.Tensor | None]:
    """(labels, why, group ids marked with them) per the rules above; raises ``AmbiguousError``."""
    if explicit is not None:
        return explicit, "the labels= argument", None
    if graph.get_collection(LABELS_COLLECTION):
        marked = graph.get_collection(POSITIVE_COLLECTION)
        return graph.get_collection(LABELS_COLLECTION)[-1], "marked with hooks.mark", \
            (marked[-1] if marked else None)
    call = estimator_recorder.lookup(graph)
    if call is None:
        return None, "none given, and no Estimator model_fn was recorded", None
    if call.labels_note:
        raise AmbiguousError(f"cannot tell the labels: {call.labels_note}. Pass "
                             f"DumpHook(labels=...) or call hooks.mark(labels=...).")
    labels = _by_name(graph, call.labels) if call.labels else None
    if labels is None:
        return None, "the Estimator's model_fn received none", None
    return labels, "the labels the Estimator passed to the model_fn", None
