"""``DumpHook``: a SessionRunHook that captures every op's forward value and gradient.

Example::

    from hooks import DumpHook
    hook = DumpHook("runs/exp1", labels="labels:0", positive=lambda y: tf.equal(y, 1),
                    stats_every_n_steps=10, dump_every_n_steps=100)
    estimator.train(input_fn, hooks=[hook], steps=1000)
    # statistics of the layers' outputs on every step, of every op every 500:
    hook = DumpHook("runs/long", layer_stats_every_n_steps=1, stats_every_n_steps=500)
    # or: with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess: ...

Steps are global steps, counted after the step's update (the first training step is 1),
as checkpoints count them. On a step that neither computes statistics nor dumps, the hook
adds nothing to ``session.run``.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np
import tensorflow as tf

from hooks import capture, native
from hooks import prewarm, variables
from hooks.capture import batch_axis, layers, towers
from hooks.capture import feeds
from hooks.recorders import loss_and_labels
from hooks.capture import source_lines
from hooks.capture.groups import GroupSpec, Refusals, all_rows_only, bad_rule
from hooks.recorders import gradients as gradient_recorder
from hooks.recorders import loss_scale
from hooks.stats import fast as fast_stats
from inspector.format import (ALIASES_KEY, LABELS_COLLECTION, LOSS_COLLECTION, MODES,
                              POSITIVE_COLLECTION, STAT_COLUMNS)
from inspector.format.manifest import GROUPS_REFUSED_KEY, RECORDED_NOTHING_KEY, hook_config
from inspector.icnn.layer import observer_gradients
from inspector.sessions import trainings
from inspector.sizes import human_bytes
from inspector.storage import normalize
from inspector.writer import RunWriter, StatsLayout

from .options import FLOAT_DTYPE_NAMES, CaptureOptions, takes_options
from .schedule import StepSpec

# A library leaves logging to the application: records propagate to its handlers (absl,
# files). No handler of its own, not even a NullHandler: with none configured anywhere,
# Python's last-resort handler prints warnings and errors on stderr, so a refused or failed
# hook is never silent. What the hook picked is INFO:
# logging.getLogger("tf_inspector").setLevel(logging.INFO) shows it.
log = logging.getLogger("tf_inspector")
v1 = tf.compat.v1
_NAN, _INF = STAT_COLUMNS.index("nan"), STAT_COLUMNS.index("inf")
assert _INF == _NAN + 1, "the NaN and Inf columns are read as one slice"


def mark(loss: tf.Tensor | None = None, labels: tf.Tensor | None = None,
         positive: Callable[[tf.Tensor], tf.Tensor] | tf.Tensor | None = None) -> None:
    """Inside a model_fn: tell ``DumpHook`` which tensors are the loss and the labels.

    Example::

        def model_fn(features, labels, mode):
            ...
            hooks.mark(loss=loss, labels=labels, positive=lambda y: tf.equal(y, 1))
    """
    g = v1.get_default_graph()
    if loss is not None:
        g.add_to_collection(LOSS_COLLECTION, loss)
    if labels is not None:
        g.add_to_collection(LABELS_COLLECTION, labels)
        if positive is not None:
            g.add_to_collection(POSITIVE_COLLECTION, capture.group_ids(labels, positive))


#: the guarded methods that start a session or fit, and what they start
_STARTS = {"begin": "session", "on_train_begin": "fit"}


def guarded(noun: str):
    """Decorator: log an error once and disable the hook (``noun``: "hook", "callback") instead
    of raising (unless ``self.strict``); the writer session is closed as failed. A disabled
    hook stays so (its state may be half-built), and says so again at each new session or fit
    (``begin``, ``on_train_begin``): a user who fixed the cause and trained again with the same
    object must not be left with nothing recorded and no word why."""
    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            if self._disabled:
                if method.__name__ in _STARTS:
                    log.warning("this %s was disabled by an earlier error (%s) and records nothing "
                                "in this %s; create a new %s", noun, self._disabled,
                                _STARTS[method.__name__], type(self).__name__)
                return None
            try:
                return method(self, *args, **kwargs)
            except Exception as e:
                if self.strict:
                    raise
                self._disabled = f"{type(self).__name__}.{method.__name__}: {type(e).__name__}: {e}"
                log.error("%s.%s failed (%s: %s); the %s is disabled and training continues. "
                          "Pass strict=True to raise instead.", type(self).__name__,
                          method.__name__, type(e).__name__, e, noun)
                if self._writer is not None and not self._writer.closed:
                    try:
                        error = f"{method.__name__}: {type(e).__name__}: {e}"
                        self._writer.update_manifest(hook_error=error)
                        self._writer.close(status="failed", error=f"the {noun} failed in {error}")
                    except Exception:
                        pass
                return None
        return wrapper
    return decorate


_guarded = guarded("hook")


def _tf_config() -> dict:
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        config = {}
    return config if isinstance(config, dict) else {}


def cluster_tasks() -> int:
    """Number of tasks in TF_CONFIG's cluster (0 without one)."""
    cluster = _tf_config().get("cluster") or {}
    return sum(len(v) for v in cluster.values() if isinstance(v, (list, dict)))


def worker_from_env() -> tuple[str, bool]:
    """(worker name, is_chief) from TF_CONFIG; ('chief', True) without a cluster."""
    config = _tf_config()
    task = config.get("task", {})
    kind, index = task.get("type"), task.get("index", 0)
    if not kind:
        return "chief", True
    no_chief = not ({"chief", "master"} & set(config.get("cluster", {})))
    is_chief = kind in ("chief", "master") or (kind == "worker" and index == 0 and no_chief)
    return f"{kind}-{index}", is_chief


#: the training run of a session whose signature the sampled steps' pre-built runs repeat: the
#: second, as the first also carries what other hooks fetch on their first step only (Estimator's
#: LoggingTensorHook and SummarySaverHook)
RECORDED_RUN = 2


class DumpHook(v1.train.SessionRunHook):
    """Capture forward values and gradients of every op into a run directory.

    Args:
      run_dir: directory of the run (created). Read it with ``inspector.open_run(run_dir)``.
        An fsspec URL writes to object storage (``s3://bucket/runs/exp1``, ``gs://...``): each
        file one object, written whole; needs ``pip install 'tf-inspector[s3]'``
        (docs/guide/distributed-and-storage.md).
      loss: loss tensor or name. Default: ``hooks.mark(loss=...)``, else the loss the
        optimizer's recorded ``tf.gradients`` differentiated, else the EstimatorSpec's loss,
        else the deduplicated scalar LOSSES (+ REGULARIZATION_LOSSES); ambiguous cases are
        refused (``hooks.recorders.loss_and_labels``, docs/guide/loss-and-labels.md). The choice and
        why is logged.
      labels: labels tensor or name. Default: ``hooks.mark(labels=...)``, else the labels an
        Estimator passed to the model_fn. Without labels there are no groups. Multi-tower
        training: a dict ``{scope prefix: labels of that tower}`` groups each tower's
        per-sample tensors by its own labels (``hooks/capture/towers.py``); towers cut from one
        batch with ``tf.split`` need no dict (the split is traced).
      predictions: tensor or name passed to a two-argument ``groups`` function. Default: the
        EstimatorSpec's predictions (a tensor, or its dict).
      share_gradients: reuse the optimizer's backward pass (below). False: always build
        the hook's own ``tf.gradients``, a second backward pass on statistics and dump steps.
      mode: 'train', 'eval' or 'predict', recorded with every row and file. Default: 'eval'
        in a graph built by ``Estimator.evaluate`` (it has an eval step counter), 'predict'
        where no loss is found and nothing advances the global step, else 'train'.
      eval_stats_batches: in eval/predict sessions, statistics of the first this many batches
        of each evaluation (None: every batch), each kept apart by its batch index.
      eval_dump_batches: in eval/predict sessions, full dumps of the first this many batches.
      options: the options ``DumpHook`` and ``InspectCallback`` share (``hooks.CaptureOptions``:
        filters, schedule, groups, budgets, writing), each also a keyword argument here with the
        same default (``include=``, ``stats_every_n_steps=``, ...); give each one way.

    Variables: every trainable resource variable also gets a record named by the variable
    (``conv1/w``): its value, d loss / d variable summed over all its reads, and on sampled
    training steps its update (value after the step minus before); see ``hooks/variables.py``.

    Sessions: every ``train``/``evaluate``/``predict`` call (and every session MonitoredSession
    recreates after an error) is a new writer session of this worker in ``run_dir``, so a run
    accumulates (FORMAT.md, "Sessions"). If the session ends with an exception (``end()`` is
    then not called), the hook still writes what it holds and records status 'failed'.

    Gradients: where the model was built after ``import hooks``, the hook reuses the
    gradients the optimizer's ``tf.gradients`` already computes (``hooks.recorders.gradients``)
    and builds only what that pass does not cover, such as d loss / d images. Gradients
    built before ``import hooks`` are not recorded; train with ``hooks.minimize(optimizer,
    loss, ...)`` to share them explicitly (``hooks.recorders.shared_gradients``). Otherwise the hook
    builds its own ``tf.gradients``, which TensorFlow runs as a second backward pass.
    """

    @takes_options
    def __init__(self, run_dir: str | os.PathLike, *, loss: tf.Tensor | str | None = None,
                 labels: tf.Tensor | str | Mapping[str, tf.Tensor | str] | None = None,
                 predictions: tf.Tensor | str | None = None, share_gradients: bool = True,
                 mode: str | None = None, eval_stats_batches: int | None = None,
                 eval_dump_batches: int = 1, options: CaptureOptions | None = None,
                 # the shared options as keywords (CaptureOptions documents them): takes_options
                 # gathers them into options=, which is what the body reads
                 include: str | Sequence[str] | None = None,
                 exclude: str | Sequence[str] | None = None, op_types: Iterable[str] | None = None,
                 exclude_op_types: Iterable[str] | None = None,
                 dtypes: Sequence[tf.DType | str] = FLOAT_DTYPE_NAMES,
                 batched: str | Sequence[str] | None = None,
                 unbatched: str | Sequence[str] | None = None, gradients: bool = True,
                 stats_every_n_steps: int | None = 100,
                 layer_stats_every_n_steps: int | None = None,
                 dump_every_n_steps: int | None = 1000,
                 dump_steps: Iterable[StepSpec] = (), dump_on_nonfinite: bool = False,
                 positive: Callable | None = None, groups: str | Callable | None = None,
                 num_classes: int | None = None, samples_per_group: int = 2,
                 max_bytes: int | None = 2 * 1024 ** 3, histogram_bins: int | None = None,
                 native_stats: bool = True, worker: str | None = None, queue_size: int = 8,
                 stats_flush_secs: float = 10.0, fsync: bool = False,
                 storage_options: dict[str, Any] | None = None, strict: bool = False) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode={mode!r} must be one of {MODES} (or None: from the graph)")
        # never None: takes_options resolved it
        self.options = options = cast(CaptureOptions, options)
        self.run_dir = normalize(run_dir)
        self.schedule = options.schedule
        self.loss_arg, self.labels_arg = loss, labels
        self.group_spec = GroupSpec.parse(options.groups, options.positive, options.num_classes)
        self.predictions_arg = predictions
        self.filters = capture.filters_of(options)
        self.strict = options.strict
        default_worker, self.is_chief = worker_from_env()
        self.worker = options.worker or default_worker
        self.share_gradients = share_gradients
        self.mode_arg, self.eval_stats_batches, self.eval_dump_batches = mode, eval_stats_batches, \
            eval_dump_batches
        # Under asynchronous multi-worker training the global step moves between this worker's
        # runs: read it with every run (one scalar) so the schedule sees each crossing.
        self._track_step = cluster_tasks() > 1
        self._disabled = ""   # why the hook was disabled (guarded); empty while it is not
        self._writer: RunWriter | None = None
        # the live session (MonitoredSession's tf.Session) and its coordinator; a session begun
        # inside it (train_and_evaluate's evaluation) is another's: this hook leaves it alone
        self._session: Any = None
        self._coord: Any = None
        self._nested_begin = self._nested_logged = False
        self._reset()

    def _reset(self) -> None:
        self.captured: list[capture.Captured] = []
        self._stats = None
        self._dump: dict[str, tf.Tensor] = {}
        self._dump_metadata: dict[str, str] = {}
        self._samples: dict[str, tf.Tensor] = {}
        self._groups: capture.Groups | None = None
        self._tower_groups: dict[str, capture.Groups] = {}
        self._bad: tf.Tensor | None = None
        self._groups_rule: str | None = None
        self._refusals = Refusals()
        self._global_step = None
        self._counts_every_run = True               # no op adds to the global step
        self._trains: dict[tuple, bool] = {}        # a run's fetches -> whether they train
        self._loss_finite = None
        self._step = 0
        # Each schedule has considered every global step up to these (a firing run also
        # covers the steps other workers added during it, up to the step read after it).
        self._stats_since = self._dump_since = 0
        self._batch = 0           # batch index within an eval/predict session
        self._pending: tuple[int, bool, bool] | None = None
        self._in_run = False   # between this session's before_run and after_run (see _watch)
        self._runs = 0   # training runs of this hook, its sessions together
        # (runs, global step) at the last sampled run
        self._sampled_at: tuple[int, int] | None = None
        self._warned_lag = False
        # A loss-scale optimizer in the graph: a training run may leave the global step where it
        # was (a step the dynamic scale skipped). Sampled runs then read the step before them.
        self._skips = False
        self._since_before = (0, 0)   # the schedules' counts before the pending run (see _skipped)
        self._warned_skip = False
        self._force_dump = False
        self._first_nonfinite: dict | None = None
        self._dump_bytes_estimate = 0
        self._nan_dump: dict[str, tf.Tensor] = {}
        self._nan_layout: tuple[list[str], list[str]] = ([], [])
        self._writer_args: dict[str, Any] = {}
        self._updates: variables.Updates | None = None
        self._same_run: variables.SameRun | None = None
        # the training runs of this session so far (an int), then its RECORDED_RUN-th recorded
        # (prewarm.RunRecorder), then the thread that builds the next sampled steps' executors
        # from it; False where none is built
        self._prewarm: Any = 0
        # the always-on statistics (layer_stats_every_n_steps): their fetch and the layout's rows
        # it computes, in order
        self._layers: tuple[Any, np.ndarray] | None = None
        self._model_ops: list[tf.Operation] = []
        self._callables: dict[tuple, Any] = {}   # _run_reads's callables
        self._opened_at = (0, 0)   # (training runs, global step) when the writer session opened
        self.mode = self.mode_arg or "train"

    # ---- graph construction ----------------------------------------------------------------
    def _tensor(self, value, what: str) -> tf.Tensor | None:
        if value is None or isinstance(value, (tf.Tensor, tf.Variable)):
            return value
        g = v1.get_default_graph()
        name = value if ":" in value else value + ":0"
        try:
            return g.get_tensor_by_name(name)
        except (KeyError, ValueError):
            ops = [op.name for op in g.get_operations()]
            from inspector.errors import suggest
            raise ValueError(f"{what}={value!r} names no tensor in the "
                             f"graph.{suggest(value, ops)}") from None

    def _resolve_loss(self, g: tf.Graph) -> tf.Tensor | None:
        return loss_and_labels.resolve_loss(g, self._tensor(self.loss_arg, "loss"),
                                            strict=self.strict)

    def _resolve_groups(self, g: tf.Graph,
                        loss: tf.Tensor | None) -> tuple[tf.Tensor | None, capture.Groups | None]:
        if isinstance(self.labels_arg, Mapping):
            return self._resolve_tower_labels(g)
        labels, groups, rule = loss_and_labels.resolve_groups(
            g, self._tensor(self.labels_arg, "labels"), self.group_spec,
            self._tensor(self.predictions_arg, "predictions"), strict=self.strict, loss=loss)
        self._groups = groups
        # without groups: "none: <why>", written to the manifest (_groups_manifest)
        self._groups_rule = rule
        return labels, groups

    def _resolve_tower_labels(self, g: tf.Graph) -> tuple[None, None]:
        """``labels={prefix: tensor}``: each tower's groups (no whole-batch labels)."""
        for prefix, value in self.labels_arg.items():
            labels = self._tensor(value, f"labels[{prefix!r}]")
            try:
                self._tower_groups[prefix] = self.group_spec.build(labels)
            except (capture.LabelsError, ValueError) as e:
                loss_and_labels._refuse(e, self.strict)
                self._tower_groups.clear()
                return None, None
            rule = self.group_spec.describe(labels)
            log.info("labels of tower %s: %s; groups: %s", prefix, labels.name, rule)
        names = {tuple(gr.names) for gr in self._tower_groups.values()}
        if len(names) > 1:
            loss_and_labels._refuse(ValueError(f"the towers' groups differ ({sorted(names)}); "
                                               "every tower needs the same group names"),
                                    self.strict)
            self._tower_groups.clear()
        elif self._tower_groups:
            self._groups_rule = f"per tower ({', '.join(self._tower_groups)}): {rule}"
        return None, None

    @_guarded
    def begin(self) -> None:
        if self._writer is not None and not self._writer.closed and self._coord is not None \
                and not self._coord.should_stop() \
                and v1.get_default_graph().get_collection(v1.GraphKeys.EVAL_STEP):
            # An evaluation inside the live session (local train_and_evaluate evaluates inside
            # training, one hook in both specs): taking it over closed the live session and lost
            # it. Any other new session takes over, as before (a session never closed: failed).
            self._nested_begin = True
            if self._nested_logged:
                return
            self._nested_logged = True
            log.error("DumpHook(%s) is recording a live %s session, and another session began "
                      "inside it (the same hook in train_and_evaluate's TrainSpec and EvalSpec?): "
                      "it records the live one only. Give the evaluation its own DumpHook(run_dir, "
                      "worker='evaluator-0')", self.run_dir, self.mode)
            return
        self._close_writer("failed",
                           "a new session began before this one ended (end() was not called)")
        self._reset()
        g = v1.get_default_graph()
        _refuse_distributed(g)
        graph_def = g.as_graph_def(add_shapes=True).SerializeToString()
        saved = g.get_operations()   # the ops of graph_def: what the accounting accounts for
        self._model_ops = saved      # and the model's graph, before the hook adds to it
        loss = self._resolve_loss(g)
        labels, gid = self._resolve_groups(g, loss)
        roles = capture.icnn_roles(g)
        forced = [g.get_tensor_by_name(n) for n in roles]
        sel = capture.select_tensors(g, forced=forced, loss=loss, fetched=True, **self.filters)
        self._list_function_bodies(g, loss, sel)
        capture.log_unfetchable(sel)
        axis = batch_axis.BatchAxis(g, labels, **self.options.batch_overrides)
        # the labels of the batch's samples (the dump's sample labels): none where they are a part
        # of it
        batch_labels, gid = self._whole_batch_groups(axis, labels, gid)
        grads = (self._gradients(g, loss, sel.tensors)
                 if loss is not None and self.options.gradients
                 else [None] * len(sel.tensors))
        fields = capture.icnn_fields(g)
        for t, grad in zip(sel.tensors, grads):
            layer, role = roles.get(t.name, (None, None))
            self.captured.append(capture.Captured(t, axis.is_batched(t), grad, layer, role,
                                                  extra=dict(fields.get(t.name, {}))))
        self._assign_towers(axis, gid)
        for c in self.captured:   # after the towers: a tower's tensors are per-sample of its part
            c.extra["batch_note"] = None if c.batched else axis.note(c.tensor)
        self._global_step = v1.train.get_global_step(g)
        self._counts_every_run = not _advances(g, self._global_step)
        self.mode = self.mode_arg or detect_mode(g, loss, self._global_step)
        if self.mode == "train" and self._global_step is not None and self._counts_every_run:
            raise ValueError(_STILL_STEP.format(self._global_step.name))
        self._skips = self.mode == "train" and self._global_step is not None \
            and loss_scale.scales(g)
        backward = self._add_variable_records(g, loss)
        self._build_fetches(gid, batch_labels, loss)
        self._same_run = self._same_run_reads(g, backward)
        log.info("capturing %d tensors (%d with gradients) into %s, mode %s%s", len(self.captured),
                 sum(c.gradient is not None for c in self.captured), self.run_dir, self.mode,
                 "" if self.mode_arg else " (from the graph; pass mode= to set it)")
        rows = self._stats.rows \
            + (variables.stats_rows(self._updates.records) if self._updates else [])
        layout = StatsLayout(*map(tuple, zip(*rows))) if self._stats else None
        # The writer (a new session of this worker) opens with the session, in after_create_session.
        accounting = capture.accounting(saved, sel, [t.name for t in sel.tensors], self.filters)
        self._writer_args = dict(worker=self.worker,
                                 manifest=self._manifest(loss, labels, sel.skipped, accounting),
                                 stats_layout=layout, graph_def=graph_def, mode=self.mode,
                                 options=self.options.writer_options)

    def _whole_batch_groups(self, axis: batch_axis.BatchAxis, labels: tf.Tensor | None,
                            groups: capture.Groups | None
                            ) -> tuple[tf.Tensor | None, capture.Groups | None]:
        """``(labels, groups)``, unless the labels are computed from part of the batch: one tower's
        (past the tf.split that resolve traces back), or rows a slice or gather selects
        (``labels[:16]``). Grouping the other samples' rows by them left those in no group, or
        with another tower's groups, and a dump's labels could be another sample's. Then no
        groups and no sample labels, ``(None, None)`` (warned), as without labels."""
        where = axis.slice_of(labels) if labels is not None else ()
        cut = axis.labels_cut if labels is not None else None
        if not where and cut is None:
            return labels, groups
        part = (f"{towers.tower_name(axis, where)}, one tower's part of the batch" if where else
                f"part of the batch ({cut.name}, a {cut.type}, selects some rows of "
                f"{cut.inputs[0].name})")
        fix = f"computed before {axis.split_op(where[0][0]).name} splits it" if where \
            else f"not cut by {cut.name}"
        log.warning("labels %s are computed from %s: the batch's other samples have no labels "
                    "there, so statistics are for group 'all' only and dumps keep no labels. Pass "
                    "labels of the whole batch (%s), or labels={scope: labels} per tower",
                    labels.name, part, fix)
        self._groups = None
        self._groups_rule = loss_and_labels.no_groups(
            f"labels {labels.name} are computed from {part}: pass labels of the whole batch "
            f"({fix}), or labels={{scope: labels}} per tower")
        return None, None

    def _assign_towers(self, axis: batch_axis.BatchAxis, groups: capture.Groups | None) -> None:
        """Tower tensors get their tower's groups; unresolved ones none (warned); the group rule
        check (``bad``) covers every grouping."""
        unresolved = towers.assign(self.captured, axis, groups, self._tower_groups)
        if unresolved and (groups is not None or self._tower_groups):
            cuts = towers.cut_at(axis, unresolved, self.captured[0].tensor.graph)
            where = "; ".join(f"at {cut}: {_listed(names, 5)}"
                              for cut, names in list(cuts.items())[:10])
            log.warning("%d tensors have rows that cannot be matched to the labels' samples, so "
                        "their statistics are for group 'all' only and dumps store them whole. "
                        "Where their rows stopped being the batch's: %s. If that input's axis 0 is "
                        "not the batch (a SparseTensor's values or indices count entries), say so "
                        "with unbatched=<its name>; towers cut with tf.split are traced, towers "
                        "fed apart need labels={scope: labels}", len(unresolved), where)
        bads = [gr.bad for gr in [groups, *self._tower_groups.values()]
                if gr is not None and gr.bad is not None]
        size = towers.size_checks(self.captured, self._tower_groups)
        bads += [size] if size is not None else []
        self._bad = (bads[0] if len(bads) == 1 else tf.add_n(bads)) if bads else None

    def _add_variable_records(self, g: tf.Graph, loss: tf.Tensor | None) -> set[str]:
        """Catalog extras (what each tensor feeds, which variable a read reads) and one record per
        trainable variable (hooks/variables.py); its update is measured in training only. Returns
        the backward ops (``capture.backward_ops``)."""
        backward = capture.backward_ops(g)
        for c in self.captured:
            name = variables.variable_of(c.tensor)
            if name:
                c.extra["variable"] = name
        feeds.annotate(self.captured, g, backward)
        grads = (functools.partial(self._gradients, g, loss, what="variable records")
                 if loss is not None and self.options.gradients else None)
        records = variables.find_records(g, backward, grads, self.filters, loss)
        self.captured += records
        source_lines.annotate(self.captured, g)
        self._updates = (variables.Updates(records, self.options.native_stats, owner=self.worker)
                         if records and self.mode == "train" else None)
        return backward

    def _same_run_reads(self, g: tf.Graph, backward: set[str]) -> variables.SameRun | None:
        """The global step and the updates read in a sampled training run itself, where it makes
        their writes (``variables.SameRun``). Not under a loss scale (a run may skip its update)
        nor with other workers moving the global step (the step is read after the whole run)."""
        if self.mode != "train" or self._skips or self._track_step \
                or (self._updates is None and self._global_step is None):
            return None
        return variables.SameRun(g, self._updates.records if self._updates else [],
                                 self._global_step, backward, self.options.native_stats)

    def _gradients(self, g: tf.Graph, loss: tf.Tensor, tensors: list[tf.Tensor],
                   what: str = "captured tensors") -> list[tf.Tensor | None]:
        """d loss / d t: shared by ``hooks.minimize``, else recorded from the optimizer's pass and
        completed from it, else (or for IndexedSlices) the hook's own ``tf.gradients``; through
        the scale where a loss-scale optimizer scaled ``loss``."""
        grads = self._gradients_of(g, loss, tensors, what)
        # tf.gradients through a v1 while loop gives a loop result the loss does not use (and
        # what only feeds it) zeros, not None (ZerosLikeForExit): no gradient, as anywhere else
        upstream = capture.ancestors(loss)
        return [gr if t.name in upstream else None for t, gr in zip(tensors, grads)]

    def _gradients_of(self, g: tf.Graph, loss: tf.Tensor, tensors: list[tf.Tensor],
                      what: str) -> list[tf.Tensor | None]:
        scaling = loss_scale.lookup(g, loss)
        if scaling is not None:
            return self._unscaled_gradients(g, loss, tensors, scaling, what)
        shared = capture.shared_gradients(g, loss) if self.share_gradients else {}
        recorded = gradient_recorder.lookup(g, loss) if self.share_gradients else {}
        todo = [t for t in tensors if t.name not in shared]
        if recorded and todo:
            usable = [t for t in todo if recorded.get(t.name) != gradient_recorder.INDEXED]
            for t in usable:
                if t.name in recorded:
                    name = recorded[t.name]
                    shared[t.name] = None if name is None else g.get_tensor_by_name(name)
            # completing from the optimizer's pass is an observer's pass too
            with observer_gradients():
                shared.update(gradient_recorder.complete(
                    g, loss, [t for t in usable if t.name not in recorded], recorded))
        rest = [t for t in tensors if t.name not in shared]
        own = dict(zip((t.name for t in rest), capture.gradients(loss, rest)))
        if len(rest) < len(tensors):
            log.info("reusing the optimizer's backward pass for %d of %d %s (%s)",
                     len(tensors) - len(rest), len(tensors), what,
                     "recorded" if recorded else "hooks.minimize")
        return [shared[t.name] if t.name in shared else own[t.name] for t in tensors]

    def _unscaled_gradients(self, g: tf.Graph, loss: tf.Tensor, tensors: list[tf.Tensor],
                            scaling: loss_scale.Scaling, what: str) -> list[tf.Tensor | None]:
        """Under a TF1 loss-scale optimizer, d loss / d t as it takes them: its pass of loss x scale
        (reused, as any pass) / scale in float32, the unscaled pass where that overflowed
        (``capture.unscale``). Its scaled loss alone was 2^15 times too large; the unscaled pass
        alone, in float16, reads 0 below ~6e-8. One more backward pass on sampled steps."""
        log.info("%s is scaled by a loss-scale optimizer (%s): gradients of %d tensors are "
                 "d (%s) / d t / scale, in float32", loss.name, scaling.scale.name, len(tensors),
                 scaling.scaled.name)
        through = self._gradients(g, scaling.scaled, tensors, what)
        return capture.unscale(through, capture.gradients(loss, tensors), scaling.scale)

    def _build_fetches(self, gid: capture.Groups | None, labels, loss) -> None:
        self._stats = fast_stats.build_stats(self.captured, gid, self.options.native_stats)
        self._layers = self._layer_fetch(gid, loss)
        batched = [c for c in self.captured if c.batched]
        batch = tf.shape(labels)[0] if labels is not None else (
            tf.shape(batched[0].tensor)[0] if batched else tf.constant(0))
        keep, kept_groups = capture.kept_samples(gid, batch, self.options.samples_per_group)
        keeps, tower_samples = self._tower_keeps()
        static_batch = labels.shape.as_list()[0] if labels is not None and labels.shape.rank else (
            batched[0].tensor.shape.as_list()[0] if batched and batched[0].tensor.shape.rank
            else None)
        keep_all_of = capture.keeps_whole_batch(gid, static_batch, self.options.samples_per_group)
        self._dump, aliases = capture.build_dump(self.captured, keep, keep_all_of, keeps=keeps)
        self._dump_metadata = {ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else {}
        self._samples = {"samples/index": keep}
        if kept_groups is not None:
            self._samples["samples/group"] = kept_groups
        self._samples.update(tower_samples)
        if labels is not None and (labels.dtype.is_floating or labels.dtype.is_integer
                                   or labels.dtype == tf.bool):
            self._samples["samples/label"] = tf.gather(
                labels, tf.boolean_mask(keep, keep < tf.shape(labels)[0]))
        if self.options.dump_on_nonfinite and loss is not None:
            self._loss_finite = tf.reduce_all(tf.math.is_finite(loss))
            self._loss_name = loss.name
            if self._dump:
                # The step whose loss is NaN/Inf is dumped from the same run: the training run that
                # follows may never come (the Estimator's NanTensorHook raises). Its tensors pass a
                # Switch, and are packed into a few vectors that are empty on other steps.
                bad = tf.logical_not(self._loss_finite)
                gated, _ = capture.build_dump(self.captured, keep, keep_all_of, gate=bad,
                                              keeps=keeps)
                gated.update(self._samples)
                self._nan_dump = capture.pack_when(bad, gated)
                self._nan_layout = (list(gated), [t.dtype.name for t in gated.values()])
        kept = max(1, 2 * self.options.samples_per_group)
        self._dump_bytes_estimate = sum(_static_bytes(t, c.batched) * (kept if c.batched else 1)
                                        for c in self.captured for t in (c.tensor, c.gradient)
                                        if t is not None)

    def _layer_fetch(self, gid: capture.Groups | None,
                     loss: tf.Tensor | None) -> tuple[Any, np.ndarray] | None:
        """The always-on statistics (``layer_stats_every_n_steps``, training only): the fetch of
        the layers' outputs and gradients (``capture.layers``) and the layout's rows it fills."""
        if not self.options.layer_stats_every_n_steps or self.mode != "train" \
                or self._stats is None:
            return None
        chosen = layers.layer_outputs([c for c in self.captured
                                       if not isinstance(c, variables.VariableRecord)],
                                      self._model_ops, loss)
        fetch = fast_stats.build_stats(chosen, gid, self.options.native_stats) if chosen else None
        if fetch is None:
            log.warning("layer_stats_every_n_steps: no captured tensor is a layer's output (a "
                        "tensor computed from a variable); only the statistics steps record")
            return None
        where = {row: i for i, row in enumerate(self._stats.rows)}
        log.info("always-on statistics every %d steps: %d layer outputs, %d with gradients",
                 self.options.layer_stats_every_n_steps, len(chosen),
                 sum(c.gradient is not None for c in chosen))
        return fetch, np.asarray([where[row] for row in fetch.rows], np.int64)

    def _tower_keeps(self) -> tuple[dict[int, tf.Tensor], dict[str, tf.Tensor]]:
        """Per tower grouping: the kept samples of its slice (indices into the tower's rows),
        and the dump's ``samples/<tower>/index`` and ``.../group`` arrays."""
        keeps: dict[int, tf.Tensor] = {}
        samples: dict[str, tf.Tensor] = {}
        for c in self.captured:
            gr = c.grouping
            if gr is None or id(gr) in keeps:
                continue
            keep, codes = capture.kept_samples(gr, tf.size(gr.ids), self.options.samples_per_group)
            keeps[id(gr)] = keep
            samples[f"samples/{c.extra['tower']}/index"] = keep
            samples[f"samples/{c.extra['tower']}/group"] = codes
        return keeps, samples

    def _list_function_bodies(self, g: tf.Graph, loss, sel: capture.Selection) -> None:
        """List as skipped what runs inside the forward pass's TF2 loops, conds and function
        calls (a Keras LSTM's gates in a ``model_fn``): not ops of the graph, they cannot be
        fetched, and were neither captured nor listed (as the Keras capture's were)."""
        backward = capture.backward_ops(g, loss)
        calls = [op for op in g.get_operations()
                 if op.type in capture.CALL_OP_TYPES and op.name not in backward]
        inside = capture.function_body_tensors(calls, **self.filters)
        sel.skipped += inside
        sel.reasons.update(dict.fromkeys(inside, capture.IN_FUNCTION))

    def _manifest(self, loss, labels, skipped, accounting) -> dict[str, Any]:
        config = self.options.manifest_config(native.used(self.options.native_stats),
                                              self.filters["dtypes"])
        return {
            "tensorflow_version": tf.__version__, "is_chief": self.is_chief,
            "loss": loss.name if loss is not None else None,
            "labels": labels.name if labels is not None else None,
            "config": hook_config(**config, share_gradients=self.share_gradients, mode=self.mode,
                                  eval_stats_batches=self.eval_stats_batches,
                                  eval_dump_batches=self.eval_dump_batches),
            "tensors": [c.catalog_entry() for c in self.captured],
            **self._groups_manifest(),
            "skipped": skipped, "first_nonfinite": None, "accounting": accounting,
        }

    def _groups_manifest(self) -> dict[str, Any]:
        """``groups`` (FORMAT.md, manifest)."""
        g = self._groups or next(iter(self._tower_groups.values()), None)
        if g is None:   # no group but 'all', and why (run.groups_note), as InspectCallback writes
            why = self._groups_rule or loss_and_labels.no_groups("no labels gave groups")
            return {"groups": {"rule": why, "names": [], "codes": []}}
        return {"groups": {"rule": self._groups_rule, "names": list(g.names),
                           "codes": list(g.codes)}}

    # ---- the session ----------------------------------------------------------------------
    @_guarded
    def after_create_session(self, session, coord) -> None:
        if self._nested_begin:   # the session begun inside the live one: not this hook's
            self._nested_begin = False
            return
        self._session, self._coord = session, coord
        if isinstance(self._prewarm, prewarm.RunRecorder):
            self._prewarm.remove()
        self._prewarm = 0
        if self._global_step is not None:
            self._step = int(session.run(self._global_step))
        self._stats_since = self._dump_since = self._step
        self._batch = 0
        # a recovered session restores an older checkpoint: its step goes back
        self._sampled_at = None
        if self._writer is None or self._writer.closed:  # a new session (also after a recovery)
            self._writer_args["manifest"]["start_step"] = self._step
            self._writer = RunWriter(self.run_dir, **self._writer_args)
            self._opened_at = (self._runs, self._step)   # this writer session's first run and step
            log.info("writing session %d of worker %s (mode %s) from global step %d",
                     self._writer.session, self.worker, self.mode, self._step)
            if self.mode == "train":
                self._warn_overlap()
        if coord is not None:
            # MonitoredSession skips end() when the session ends with an exception, but always
            # stops the coordinator and joins its threads on close: close the writer there.
            watcher = threading.Thread(target=self._watch, args=(coord, self._writer), daemon=True,
                                       name=f"tf-inspector-watch-{self.worker}")
            watcher.start()
            coord.register_thread(watcher)

    def _warn_overlap(self) -> None:
        """Warn when this training session starts below the last step an earlier training session
        of this worker recorded (``inspector.sessions.trainings``): at step 0 a new training, which
        readers show alone from now on; past 0 a resume from an older checkpoint, whose rows replace
        the earlier session's of the steps both record."""
        found = trainings.last_training(self._writer.store.read, self.worker, self._writer.session)
        if found is None or found[1] <= self._step:
            return
        before, last = found
        if self._step == 0:
            why = ("the graph has no global step, and the hook counts this session's runs from 0"
                   if self._global_step is None else "a fresh or warm-started model")
            log.warning("%s already holds training steps up to %d (worker %s, session %d), and "
                        "this session starts a new training at step 0 (%s): readers now show this "
                        "training only, sessions before %d are hidden from merged views "
                        "(run.sessions' hidden_by; read one with session=N). To keep both "
                        "trainings in view, write this one to another run directory", self.run_dir,
                        last, self.worker, before, why, self._writer.session)
        else:
            log.warning("%s: this session resumes at global step %d, before step %d that session "
                        "%d recorded (a checkpoint older than the last recorded step): its rows of "
                        "steps %d-%d replace session %d's (read those with session=%d)",
                        self.run_dir, self._step, last, before, self._step + 1, last, before,
                        before)

    def _recorded_nothing(self, session) -> str | None:
        """Why this writer session is closing without a recorded step (or None if it recorded
        one): no run at all (a worker whose chief had finished), or runs the schedule did not
        sample, or whose files were all dropped."""
        st = self._writer.state
        if st.first_step is not None or st.dumps:
            return None
        runs, batches, start = self._runs - self._opened_at[0], self._batch, self._opened_at[1]
        if st.dropped.count():
            return ("every statistics step and dump it sampled was dropped (see the "
                    "manifest's dropped)")
        if self.mode != "train":
            return (f"the {self.mode} session ran no batch (its input was empty)"
                    if not batches else
                    f"none of its {batches} batches was sampled "
                    f"(eval_stats_batches={self.eval_stats_batches}, "
                    f"eval_dump_batches={self.eval_dump_batches}, "
                    f"stats_every_n_steps={self.schedule.stats_every})")
        now = self._read_step(session)
        if not runs:
            return (f"no training step ran: the session began at global step {start} and ended "
                    "there (the training had already reached its last step: max_steps, a "
                    "StopAtStepHook, or a chief that finished before this worker started)")
        span = f"global steps {start + 1}..{now}" if now is not None else "its steps"
        return (f"{runs} training runs ({span}) and none was a statistics or dump step "
                f"(stats_every_n_steps={self.schedule.stats_every}, "
                f"dump_every_n_steps={self.schedule.dump_every}): lower stats_every_n_steps (or "
                "list dump_steps) to record a training this short")

    def _read_step(self, session) -> int | None:
        """The global step now (None without one, or where the session cannot run)."""
        if self._global_step is None:
            return self._step
        try:
            return int(session.run(self._global_step))
        except Exception:  # noqa: BLE001 - only a message depends on it
            return None

    def _watch(self, coord, writer: RunWriter) -> None:
        coord.wait_for_stop()
        if writer.closed:
            return
        if self.mode == "predict" and not self._in_run:
            # Estimator.predict is a generator: its caller stopping early (a break, close(), a
            # generator collected) exits the session between batches, skipping end(). Every
            # batch it ran is complete; nothing failed.
            log.info("predict() ended by its caller after %d batches; session %d finished",
                     self._batch, writer.session)
            writer.close("finished")
            return
        writer.close("failed", error=self._abnormal_end())

    def _abnormal_end(self) -> str:
        doing = {"train": "training", "eval": "evaluation",
                 "predict": "prediction"}.get(self.mode, self.mode)
        why = f"the session ended with an error before DumpHook.end() ({doing} raised)"
        nf = self._first_nonfinite
        return why + (f"; NaN/Inf first seen at step {nf['step']} in {nf['tensor']}" if nf else "")

    def _close_writer(self, status: str, error: str | None = None) -> None:
        if self._writer is not None and not self._writer.closed:
            self._writer.close(status, error=error)

    # ---- the training loop -------------------------------------------------------------------
    def _foreign(self, session) -> bool:
        """A run or end of a session begun inside the live one (see begin)."""
        return self._session is not None and session is not self._session

    @_guarded
    def before_run(self, run_context):
        if self._foreign(run_context.session):   # the live run's state stays as it is
            return None
        self._in_run = True
        if self.mode == "train" and not self._run_trains(run_context.original_args.fetches):
            self._pending = None   # a run that does not train (a validation fetch): no step
            return None
        if self.mode == "train":
            step = self._step + 1
            stats, dump = self._due(step)
            if (stats or dump) and self._skips:
                # Runs the loss scale skipped unsampled left this count ahead of the global step:
                # plan from the step before this run, read exactly (one scalar run, sampled runs
                # only)
                self._step = int(self._run_reads(run_context.session,
                                                 {"step": self._global_step})["step"])
                step = self._step + 1
                stats, dump = self._due(step)
            self._since_before = (self._stats_since, self._dump_since)
            self._stats_since, self._dump_since = max(self._stats_since, step), \
                max(self._dump_since, step)
        else:  # eval / predict: batches of one evaluation, at one global step
            step, b = self._step, self._batch
            stats = self._stats is not None and bool(self.schedule.stats_every) and (
                self.eval_stats_batches is None or b < self.eval_stats_batches)
            dump = bool(self._dump) and b < self.eval_dump_batches
        if dump:
            reason = self._writer.would_drop(self._dump_bytes_estimate)
            if reason:
                self._writer.record_drop(step, reason, self._dump_bytes_estimate)
                dump = False
        layer = not stats and self._layers is not None and self.mode == "train" \
            and step % self.options.layer_stats_every_n_steps == 0
        if self.mode == "train" and self._same_run is not None and not self._same_run.planned:
            # the first training run plans its fetches (a walk of the graph, milliseconds), which
            # the sampled runs' fetches usually are: not the first sampled step's time
            self._same_run_for(run_context.original_args.fetches)
        fetches = self._fetches(stats, dump, layer, run_context.original_args.fetches)
        if self.mode == "train" and type(self._prewarm) is int:
            self._prewarm += 1
            if self._prewarm == RECORDED_RUN:
                self._record_run(run_context.session)
        self._pending = (step, stats, dump)
        return v1.train.SessionRunArgs(fetches) if fetches else None

    def _fetches(self, stats: bool, dump: bool, layer: bool, original) -> dict[str, Any]:
        """This hook's fetches for a run of the caller's ``original`` fetches that records
        ``stats``, ``dump`` and ``layer`` (the always-on rows)."""
        fetches: dict[str, Any] = {}
        if stats or layer:
            fetches["stats" if stats else "layer_stats"] = (self._stats if stats
                                                            else self._layers[0]).tensors()
            if self._bad is not None:
                fetches["bad_groups"] = self._bad
        if dump:
            fetches["dump"] = self._dump
            fetches["samples"] = self._samples
        same = self._same_run_for(original) \
            if (stats or dump or layer) and self.mode == "train" else None
        if same is not None:
            fetches["after"] = {k: v for k, v in same.items()
                                if k == "step" or (k == "update_stats" and stats)
                                or (k == "update" and dump)}
        elif (stats or dump) and self._updates is not None:
            fetches["snapshots"] = self._updates.save
        if self._loss_finite is not None:
            fetches["loss_finite"] = self._loss_finite
            if not dump and self._nan_dump and self._first_nonfinite is None \
                    and not self._writer.would_drop(self._dump_bytes_estimate):
                fetches["nan_dump"] = self._nan_dump
        if self._track_step and self._global_step is not None:
            fetches["global_step"] = self._global_step
        return fetches

    def _due(self, step: int) -> tuple[bool, bool]:
        """(statistics, dump) due at a training run that ends at global step ``step``."""
        stats = self._stats is not None and self.schedule.wants_stats(step, self._stats_since)
        dump = bool(self._dump) \
            and (self.schedule.wants_dump(step, self._dump_since) or self._force_dump)
        return stats, dump

    def _same_run_for(self, fetches) -> dict[str, Any] | None:
        """The same-run reads for a run of ``fetches``, or None: the extra run after it."""
        if self._same_run is None:
            return None
        keyed = _fetch_key(fetches)
        return None if keyed is None else self._same_run.reads_for(*keyed)

    def _run_trains(self, fetches) -> bool:
        """Whether a run of ``fetches`` trains: they reach an op that changes state (an assignment,
        an optimizer's update, a scatter, an accumulator or queue write; the global step's
        increment is one). Counted as a step, a run that changes nothing (a validation fetch
        through the session) was sampled and written as the training step before it, with a
        zero update. Not "reaches the increment": SyncReplicasOptimizer's chief increments the
        step in a run of its own, and its workers' training runs would never be sampled. True
        where it cannot be told: no increment in the graph, a fetch that is no graph element."""
        if self._counts_every_run:
            return True
        keyed = _fetch_key(fetches)
        if keyed is None:
            return True
        key, flat = keyed
        if key not in self._trains:
            if len(self._trains) > 256:
                self._trains.clear()
            self._trains[key] = _reaches(flat, _changes_state)
        return self._trains[key]

    @_guarded
    def after_run(self, run_context, run_values) -> None:
        if self._foreign(run_context.session):
            return
        self._in_run = False
        if self._pending is None:
            return
        step, stats, dump = self._pending
        results = run_values.results or {}
        prewarm_from = self._prewarm if isinstance(self._prewarm, prewarm.RunRecorder) else None
        batch = None if self.mode == "train" else self._batch
        finite = bool(results.get("loss_finite", True))
        # the exact global step and the variables' updates and their statistics, all read after
        # this step's update: in the step's own run where it could (variables.SameRun), else in
        # one extra run
        after = results["after"] if "after" in results \
            else self._extra_run(run_context.session, results, stats, dump, finite)
        if self.mode == "train":
            self._runs += 1
            if "step" in after and self._skips and int(after["step"]) < step and (stats or dump):
                # planned at the step before (read in before_run) + 1: the global step did not
                # advance
                self._skipped(step, int(after["step"]), stats, dump, finite, results)
                step, stats, dump = int(after["step"]), False, False
            elif "step" in after:
                step = int(after["step"])
                if not self._skips:  # under a loss scale no row carries a step its run did not make
                    self._check_step_lag(step)
                # This row stands for every multiple up to the step it carries: other workers may
                # have crossed the next one during this run (FORMAT.md, "Schedule").
                if stats:
                    self._stats_since = max(self._stats_since, step)
                if dump:
                    self._dump_since = max(self._dump_since, step)
            elif "global_step" in results:
                # Read in the step's own run, before or after this run's update (the executor
                # orders the two as it likes): a lower bound of the step this run ended at, as
                # is this worker's own count. Taking either as more (read + 1) sampled a step
                # early when the read came last; this way a worker that others move may sample
                # one run late, never early, and one alone samples exactly the multiples.
                step = max(step, int(results["global_step"]))
            self._step = step
        else:
            self._batch += 1
        updates = after.get("update", {})
        if stats:
            values = results["stats"][0]
            self._check_nonfinite(step, values)
            # handed over as fetched, the update rows after the in-graph rows (the layout's
            # order): the writer thread joins and checks them, not the training step
            parts = [results["stats"], *([after["update_stats"]] if "update_stats" in after
                                         else [])]
            self._writer.add_fetched_stats(step, parts, batch=batch or 0,
                                           keep=self._group_rows_check(
                                               step, int(results.get("bad_groups", 0)),
                                               sum(len(p[0]) for p in parts)))
        elif "layer_stats" in results:   # the always-on rows: no NaN check, as documented
            fetch, rows = self._layers
            self._writer.add_fetched_stats(step, [results["layer_stats"]], rows=rows,
                                           keep=self._group_rows_check(
                                               step, int(results.get("bad_groups", 0)), len(rows),
                                               fetch.rows))
        if not finite:
            self._note_nonfinite(step, self._loss_name, "forward")
        if dump:
            why = "after NaN/Inf" if self._force_dump else "schedule"
            self._force_dump = False
            self._add_dump(step, {**results["dump"], **results["samples"],
                                  **{f"update/{k}": v for k, v in updates.items()}}, why, batch)
        elif not finite and "nan_dump" in results:
            self._add_dump(step, capture.unpack(results["nan_dump"], *self._nan_layout),
                           "NaN/Inf in the loss", batch)
        if prewarm_from is not None:
            self._start_prewarm(prewarm_from, step, (stats, dump, "layer_stats" in results))

    def _record_run(self, session) -> None:
        """Record this training run as the session is handed it: every hook's fetches and feeds,
        which the sampled steps' runs repeat with this hook's own changed."""
        self._prewarm = prewarm.RunRecorder(session) \
            if prewarm.ENABLED and isinstance(session, v1.Session) else False

    def _start_prewarm(self, recorder: prewarm.RunRecorder, step: int,
                       ran: tuple[bool, bool, bool]) -> None:
        """Build the executors of the next statistics or dump step's run and of the next
        always-on step's (the recorded training run's, with this hook's fetches for them) on a
        thread, before those steps: a signature's first run otherwise builds it in the step."""
        self._prewarm = False
        recorder.remove()
        if recorder.args is None:   # the run was no MonitoredSession's
            return
        fetches, feed_dict, options = recorder.args
        runs = []
        for kind in sorted(self._next_sampled(step) - {ran}):
            ours = self._fetches(*kind, fetches["caller"])
            merged = {k: v for k, v in fetches.items() if k is not self}
            runs.append(({**merged, self: ours} if ours else merged, feed_dict, options))
        if runs:
            self._prewarm = prewarm.start(recorder.session, runs,
                                          name=f"tf-inspector-prewarm-{self.worker}")

    def _next_sampled(self, step: int) -> set[tuple[bool, bool, bool]]:
        """(stats, dump, layer) of the next statistics or dump step after ``step``, of the next
        multiple of ``dump_every_n_steps`` (statistics and a dump, in the defaults) and of the
        next always-on step."""
        found = set()
        every = self.schedule.dump_every if self._dump else None
        for due in (self.schedule.next_step(step), every and (step // every + 1) * every):
            if due:
                stats, dump = self._due(due)
                found.add((stats, dump, not stats and self._layers is not None
                           and due % self.options.layer_stats_every_n_steps == 0))
        if self._layers is not None:
            every = self.options.layer_stats_every_n_steps
            due = (step // every + 1) * every
            stats, dump = self._due(due)
            found.add((stats, dump, not stats))
        return found

    def _extra_run(self, session, results: dict, stats: bool, dump: bool,
                   finite: bool) -> dict[str, Any]:
        """The reads after a sampled step, in one more run (the values before the update:
        snapshots taken in the step's run); {} where nothing is to read."""
        reads: dict[str, Any] = {}
        if "snapshots" in results and stats:
            reads["update_stats"] = self._updates.stats
        if "snapshots" in results and dump:
            reads["update"] = self._updates.delta
        if self.mode == "train" and self._global_step is not None \
                and (stats or dump or (self._skips and not finite)):
            reads["step"] = self._global_step   # under a loss scale also for the NaN dump's step
        return self._run_reads(session, reads) if reads else {}

    def _skipped(self, step: int, now: int, stats: bool, dump: bool, finite: bool,
                 results: dict) -> None:
        """A run sampled for ``step`` that the loss scale skipped (its gradients overflowed): the
        global step stayed at ``now``, so the run has no step of its own. Its rows and dump are not
        written (each recorded in ``dropped``) and the schedules count as before it, so the next
        run that applies is sampled for ``step``. (Labelled ``now``, its rows read as that step's,
        and the schedule, past ``step``, left the run that made ``step`` unsampled.) Its dump is
        kept as the dump of a NaN/Inf loss, at ``now`` as on unsampled runs."""
        self._stats_since, self._dump_since = self._since_before
        nan_dump = dump and not finite and bool(self._nan_dump) and self._first_nonfinite is None
        why = ("a run the loss scale skipped (its gradients overflowed; the global step did not "
               "advance): it has no step of its own, the next run that applies is sampled for "
               "this step")
        if stats:
            self._writer.record_drop(step, why, what="stats")
            # not written, so said here: a NaN/Inf in a run the training skipped
            self._check_nonfinite(now, results["stats"][0], "the statistics of a run the loss "
                                                            "scale skipped (not written)")
        if dump and not nan_dump:
            self._writer.record_drop(step, why, self._dump_bytes_estimate)
        if not self._warned_skip:
            self._warned_skip = True
            log.warning("the run sampled for step %d was skipped by the loss scale (its gradients "
                        "overflowed; the global step stayed at %d): its statistics and dump are "
                        "not written (manifest 'dropped'), and the next run that applies is "
                        "sampled as step %d instead (logged once)", step, now, step)
        if nan_dump:
            self._add_dump(now, {**results["dump"], **results["samples"]}, "NaN/Inf in the loss",
                           None)

    def _check_step_lag(self, step: int) -> None:
        """Warn once when the global step advanced less than this worker's training runs between
        two sampled runs: gradient accumulation (a train op that advances it every k-th run) or
        a step advanced by another run. Rows carry the global step after their run, which
        may then be a micro-batch's; the schedule counts runs
        (docs/guide/distributed-and-storage.md)."""
        last, self._sampled_at = self._sampled_at, (self._runs, step)
        if last is None or self._track_step or self._warned_lag:
            return
        runs, moved = self._runs - last[0], step - last[1]
        if 0 <= moved < runs:
            self._warned_lag = True
            log.warning("the global step advanced %d over %d training runs (steps %d..%d): "
                        "gradient accumulation, a loss-scale optimizer skipping steps whose "
                        "gradients overflowed (mixed precision), or a step another run advances? "
                        "Each row carries the global step after its run, which may be a "
                        "micro-batch's or a skipped step's, and the schedule counts runs "
                        "(docs/guide/distributed-and-storage.md)",
                        moved, runs, last[1], step)

    def _run_reads(self, session, reads: dict[str, Any]) -> dict[str, Any]:
        """``session.run(reads)`` through a callable made once per session and set of reads:
        a plain ``run`` builds its fetch handler anew each call, on every sampled step."""
        key = (id(session), tuple(reads))
        fn = self._callables.get(key)
        if fn is None:
            if not hasattr(session, "make_callable"):   # a wrapped session: the plain way
                return session.run(reads)
            if len(self._callables) > 16:   # sessions recreated after errors: forget the old ones
                self._callables.clear()
            fn = self._callables[key] = session.make_callable(reads)
        return fn()

    def _group_rows_check(self, step: int, bad: int, rows: int,
                          layout: list | None = None) -> np.ndarray | None:
        """None (write every row), or, on a step where ``bad`` samples break the group rule, a
        mask keeping only the ``all`` rows: a group's numbers never cover the wrong samples."""
        if not bad:
            return None
        first = self._refusals.note(step, bad, bad_rule(self.group_spec))
        if first is not None:
            log.error("step %d: %d samples break the group rule (%s; %s): that step's statistics "
                      "are written for group 'all' only, and so is every such step (logged once)",
                      step, bad, bad_rule(self.group_spec), self._groups_rule)
            self._writer.update_manifest(**{GROUPS_REFUSED_KEY: first})
        return all_rows_only(self._stats.rows if layout is None else layout, rows)

    def _add_dump(self, step: int, arrays: dict, why: str, batch: int | None) -> None:
        self._dump_bytes_estimate = sum(a.nbytes for a in arrays.values())
        refused = {"groups": "refused"} if capture.ungrouped_dump(arrays) else {}
        self._writer.add_dump(step, arrays, {**self._dump_metadata, **refused, "reason": why},
                              batch=batch)

    def _check_nonfinite(self, step: int, values: np.ndarray, source: str = "statistics") -> None:
        # only the first is noted; the NaN and Inf count columns are adjacent: one test of both
        if self._first_nonfinite is not None:
            return
        counted = values[:, _NAN:_INF + 1] > 0
        if not counted.any():
            return
        bad = np.flatnonzero(counted.any(axis=1))
        if bad.size:
            tensor, kind, _ = self._stats.rows[bad[0]]
            self._note_nonfinite(step, tensor, kind, source)

    def _note_nonfinite(self, step: int, tensor: str, kind: str,
                        source: str = "loss check") -> None:
        if self._first_nonfinite is not None:
            return
        self._first_nonfinite = {"step": step, "tensor": tensor, "kind": kind, "source": source}
        log.warning("NaN/Inf first seen at step %d in %s (%s)%s", step, tensor, kind,
                    "; dumping this step and the next" if self.options.dump_on_nonfinite else "")
        self._writer.update_manifest(first_nonfinite=self._first_nonfinite)
        self._force_dump = self.options.dump_on_nonfinite

    @_guarded
    def end(self, session) -> None:
        if self._foreign(session):
            return
        if isinstance(self._prewarm, prewarm.RunRecorder):
            self._prewarm.remove()
        elif isinstance(self._prewarm, threading.Thread):
            self._prewarm.join(timeout=60)   # its session.run never outlives the session
        if self._writer is not None and not self._writer.closed:
            self._refusals.close(self._writer)
            nothing = self._recorded_nothing(session)
            if nothing:
                log.warning("session %d of worker %s in %s recorded nothing: %s",
                            self._writer.session, self.worker, self.run_dir, nothing)
                self._writer.update_manifest(**{RECORDED_NOTHING_KEY: nothing})
            self._writer.close("finished")
            st = self._writer.state
            log.info("run %s session %d finished: %d dumps, %d statistics rows, %s, %d files "
                     "dropped, %d write errors", self.run_dir, self._writer.session, st.dumps,
                     st.stats_rows, human_bytes(st.bytes_written), st.dropped.count(),
                     st.errors.count())


#: a training graph with a global step that no op adds to is refused: every row would carry the
#: step the session began at, the schedule would count runs, and dumps after the first would be
#: dropped as a second dump of one step
_STILL_STEP = ("the graph has a global step ({}) that no op adds to: training never advances it, "
               "and the hook labels rows by it, so every row would carry one step. Pass "
               "global_step= to minimize() or apply_gradients() "
               "(tf.compat.v1.train.get_or_create_global_step()), or build the graph without a "
               "global step (the hook then counts its runs); for an evaluation, pass mode='eval'")


def _refuse_distributed(g: tf.Graph) -> None:
    """ValueError for a graph whose variables a ``tf.distribute`` strategy mirrors (an
    Estimator's ``RunConfig(train_distribute=...)``): the hook does not capture replicas'
    variables (it failed with "DistributedVariable.handle is not available outside the replica
    context", which says nothing of what to change)."""
    mirrored = [v for v in g.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)
                if isinstance(v, tf.distribute.DistributedValues)]
    if mirrored:
        raise ValueError(f"the model's variables ({mirrored[0].name}, ...) are mirrored by a "
                         "tf.distribute strategy (an Estimator's "
                         "RunConfig(train_distribute=...)?): DumpHook does not capture replicated "
                         "variables. Train on one device without train_distribute, or in a "
                         "TF_CONFIG cluster with parameter servers (each worker writes its own "
                         "files; docs/guide/distributed-and-storage.md)")


def detect_mode(g: tf.Graph, loss: tf.Tensor | None, global_step) -> str:
    """'eval' in a graph with an eval step counter (``Estimator.evaluate``), 'predict' where no
    loss was found and no op advances the global step, else 'train'. A graph in which a TF1
    loss-scale optimizer scaled a loss trains, also where no loss was resolved (``loss=``
    naming the scaled loss, refused) and nothing advances the step: it is then refused as a
    step that never advances, not recorded as prediction."""
    if g.get_collection(v1.GraphKeys.EVAL_STEP):
        return "eval"
    if loss is None and not _advances(g, global_step) and not loss_scale.scales(g):
        return "predict"
    return "train"


def _advances(g: tf.Graph, global_step) -> bool:
    """Whether some op of ``g`` adds to the global step (an optimizer's ``global_step=``)."""
    if global_step is None:
        return False
    handle = global_step.op.name if hasattr(global_step, "op") else None
    # AssignAdd, or an Assign of a value computed from the step itself (assign(gs, gs + 1)): a
    # checkpoint restore or the initializer assigns it too, from no read of it. The variable
    # taken through a v1 cond's or loop's Switch or Enter (capture.write_target: a TF1
    # loss-scale optimizer under v1 control flow adds to its step that way). Or a TF2 cond or
    # loop that may write it (a loss-scale optimizer's, whose branch applies the step: its ops
    # are no ops of the graph)
    for op in g.get_operations():
        if op.type in capture.FUNCTIONAL and handle in capture.functional_writes(op):
            return True
        if op.type not in ("AssignAddVariableOp", "AssignAdd", "AssignVariableOp", "Assign") \
                or len(op.inputs) < 2 or capture.write_target(op.inputs[0]) != handle:
            continue
        if op.type.startswith("AssignAdd") or handle in capture.upstream([op.inputs[1].op]):
            return True
    return False


#: Op types that change state: assignments, optimizers' updates, scatters, accumulators, queues.
_STATE_CHANGING = re.compile(r"Assign|Apply|Scatter|Accumulator|Enqueue")


def _changes_state(op: tf.Operation) -> bool:
    """Also a TF2 cond or loop taking a variable's handle not marked read-only (a loss-scale
    optimizer's update, in the cond that may skip it)."""
    return bool(_STATE_CHANGING.search(op.type)) or (op.type in capture.FUNCTIONAL
                                                     and bool(capture.functional_writes(op)))


def _reaches(fetches: list, found: Callable[[tf.Operation], bool]) -> bool:
    """Whether running ``fetches`` (graph elements or their names) runs an op for which
    ``found`` holds: one is among their inputs and control inputs, transitively. True if a
    fetch cannot be resolved (as a run is counted when in doubt)."""
    try:
        g = next(f.graph for f in fetches if not isinstance(f, str))
    except StopIteration:
        g = tf.compat.v1.get_default_graph()
    todo: list[tf.Operation] = []
    for f in fetches:
        try:
            e = g.as_graph_element(f) if isinstance(f, str) else f
        except (KeyError, ValueError, TypeError):
            return True
        todo.append(e if isinstance(e, tf.Operation) else e.op)
    seen: set[tf.Operation] = set()
    while todo:
        op = todo.pop()
        if found(op):
            return True
        if op not in seen:
            seen.add(op)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return False


def _static_bytes(t: tf.Tensor, batched: bool) -> int:
    """Bytes of one sample (batched) or of the whole tensor, unknown dims counted as 1."""
    dims = t.shape.as_list() if t.shape.rank is not None else [1]
    dims = dims[1:] if batched else dims
    size = t.dtype.size if t.dtype != tf.bfloat16 else 4
    return int(np.prod([d or 1 for d in dims], dtype=np.int64)) * size


def _listed(names: Sequence[str], most: int) -> str:
    """``names`` joined, the first ``most`` of them and how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _fetch_key(fetches) -> tuple[tuple[str, ...], list] | None:
    """A run's fetches as (their names, the flat fetches), or None where a fetch is no graph
    element (its name cannot key a cache of what the run does)."""
    try:
        flat = tf.nest.flatten(fetches, expand_composites=True)
        return tuple(f if isinstance(f, str) else f.name for f in flat), flat
    except (AttributeError, TypeError, ValueError):
        return None
