"""``InspectCallback``: every op's forward value and gradient for ``model.fit`` users.

Example (tf.keras 2.15 or Keras 3 on the latest TensorFlow)::

    from hooks.keras import InspectCallback
    cb = InspectCallback("runs/keras1", stats_every_n_steps=10, dump_every_n_steps=100)
    model.fit(x, y, epochs=3, callbacks=[cb])
    # python -m inspector info runs/keras1   |   streamlit run app.py -- runs/

By default (``source="train_batch"``) the capture is built into ``fit``'s own train step
(``hooks/keras/step.py``): on a sampled step the step's own batch, its forward values on the
weights before its update and the gradients that update was computed from, in the same
backward pass; other steps run the model's own train function. Where that cannot be exact
(``hooks/keras/source.py``: XLA, ``run_eagerly``, a custom ``train_step`` the
capture refuses) the callback falls back to the probe, with a warning saying why. With the
probe (``probe=`` a fixed batch, or the fallback), on a sampled step the callback runs the model
and its compiled loss on that batch after the step's update, traced once into a graph where the
hook's capture machinery (``hooks.capture``, ``hooks.stats.fast``) selects every op's output,
builds ``d loss / d output`` with one ``tf.gradients`` and computes the statistics in the graph
(``hooks/keras/trace.py``); the catalog says ``captured_on: "probe batch, after the update"``.
Steps are ``optimizer.iterations`` after the step's update (the first step is 1; after a new
``compile()`` they continue rather than start over, see ``_continue_steps``). On other steps
the callback does nothing but count.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterable, Sequence, cast

import numpy as np
import tensorflow as tf

from hooks import capture, native
from hooks import variables
from hooks.capture.groups import GroupSpec, Refusals, all_rows_only, bad_rule
from hooks.dump_hook import guarded, worker_from_env
from hooks.keras.source import (FitArguments, check_probe, first_batch, fit_arguments, fit_frame,
                                resolve_source)
from hooks.keras.step import (StepGraph, TrainedVariables, compile_state, identical,
                              refuse_unsupported)
from hooks.keras.trace import GroupsError, ProbeGraph, ProbeOptions, _tf_var
from hooks.options import FLOAT_DTYPE_NAMES, CaptureOptions, takes_options
from hooks.schedule import StepSpec
from inspector.format import layout as fmt
from inspector.errors import InspectorError
from inspector.format import ALIASES_KEY, STAT_COLUMNS
from inspector.format.loghist import concat_rows
from inspector.format.manifest import GROUPS_REFUSED_KEY, MAX_MANIFEST_BYTES, load_manifest
from inspector.format.provenance import PROBE_NOTE
from inspector.sizes import human_bytes
from inspector.storage import normalize
from inspector.writer import RunWriter, StatsLayout

log = logging.getLogger("tf_inspector")


_guarded = guarded("callback")


class InspectCallback(tf.keras.callbacks.Callback):
    """Capture forward values and gradients of every op of a Keras model into a run directory.

    Args:
      run_dir: directory of the run (created), or an fsspec URL (``s3://bucket/runs/exp1``) as
        for ``DumpHook``. Read it with ``inspector.open_run(run_dir)``.
      source: ``"train_batch"`` (the default without ``probe=``): record the training step
        itself, captured inside fit's own train step: its batch, its forward values on the
        weights before its update, and the gradients that update was computed from
        (``hooks/keras/step.py``; docs/guide/keras.md). Where that cannot be exact (XLA,
        ``run_eagerly``, a custom ``train_step`` it refuses; several replicas record the global
        batch) the callback warns and records the probe instead. ``"probe"`` (the default with
        ``probe=``): a fixed batch run through the model after each sampled step's update; its
        gradients are the probe's on the updated weights, not those the update came from (the
        catalog's ``captured_on`` says "probe batch, after the update").
      probe: the fixed batch of ``source="probe"``, and with ``source="train_batch"`` the one it
        falls back on (else the first batch of fit's own data): ``(x, y)``,
        ``(x, y, sample_weight)``, ``x`` (no loss: forward values only) or a ``tf.data.Dataset``
        (its first batch). The same samples at every step, so the groups and the dumped samples
        are comparable over time.
      training: call the model with ``training=True`` on the probe (dropout active, batch-norm
        in batch mode; batch-norm moving statistics are then updated by the probe). Default
        False: the inference behaviour, no side effect on the model.
      options: the options ``InspectCallback`` and ``DumpHook`` share (``hooks.CaptureOptions``:
        filters, schedule, groups, budgets, writing), each also a keyword argument here with the
        same default (``include=``, ``stats_every_n_steps=``, ...); give each one way. Here the
        labels are fit's targets ``y``, and a ``groups`` function's predictions the model's output.

    Variables: a record per trainable variable (``dense/kernel``): its value, d loss / d variable
    and the step's update (value after the step minus before): with the training step, the value
    the step read and the gradient its update was computed from; with the probe, the value after
    the step and the probe's gradient on it ("before" copied on sampled steps only).
    """

    @takes_options
    def __init__(self, run_dir: str | os.PathLike, probe=None, *, source: str | None = None,
                 training: bool = False, options: CaptureOptions | None = None,
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
                 positive: Callable | Any = None, groups: str | Callable | None = None,
                 num_classes: int | None = None, samples_per_group: int = 2,
                 max_bytes: int | None = 2 * 1024 ** 3, histogram_bins: int | None = None,
                 native_stats: bool = True, worker: str | None = None, queue_size: int = 8,
                 stats_flush_secs: float = 10.0, fsync: bool = False,
                 storage_options: dict[str, Any] | None = None, strict: bool = False) -> None:
        super().__init__()
        backend = tf.keras.backend.backend()
        if backend != "tensorflow":   # the capture traces the model into a TensorFlow graph
            raise ValueError("InspectCallback needs Keras on the TensorFlow backend; this Keras "
                             f"runs on {backend!r}: set KERAS_BACKEND=tensorflow before "
                             "importing keras")
        # never None: takes_options resolved it
        self.options = options = cast(CaptureOptions, options)
        if options.layer_stats_every_n_steps:
            raise ValueError(f"layer_stats_every_n_steps={options.layer_stats_every_n_steps!r}: "
                             "the always-on layer statistics are DumpHook's only; InspectCallback "
                             "takes stats_every_n_steps (leave layer_stats_every_n_steps None)")
        # a path, or an fsspec URL (object storage): never Path("s3://")
        self.run_dir = normalize(run_dir)
        self.source = resolve_source(source, probe)
        self.probe = check_probe(self.source, probe, options.positive)
        self.group_spec = GroupSpec.parse(options.groups, options.positive, options.num_classes)
        # why the training step cannot be captured exactly, for the model and compile() in
        # _fallback_for: the probe is recorded instead (hooks/keras/source.py)
        self._fallback: str | None = None
        self._fallback_for: tuple = ()
        self._fallback_pending: str | None = None   # refused before fit: falls back at its start
        self._warned_fallback: set[str] = set()
        self._installed: StepGraph | None = None    # the step capture in the model's train_step
        # the fit's data (a fallback probe's), for its length
        self._fit_args: FitArguments | None = None
        self._probe_origin = "probe="               # where the probe came from, in words
        self._sampled = False   # this fit wrote a step (else its end says why not)
        self._fit_first: int | None = None   # the first step of the last fit
        self._opened_with: ProbeGraph | None = None   # the graph of the last writer session
        self._told_unsampled = False
        self._pending: tuple[bool, bool] = (False, False)
        self._first_nonfinite: dict | None = None
        self._force_dump = False
        self._refusals = Refusals()   # this fit's session's
        self.schedule = options.schedule
        self.filters = capture.filters_of(options)
        # what the traced capture (probe or training step) needs of the options
        self.trace_options = ProbeOptions(self.filters, options.positive, options.samples_per_group,
                                          options.gradients, options.native_stats, training,
                                          options.batch_overrides, self.group_spec)
        self.strict = options.strict
        default_worker, self.is_chief = worker_from_env()
        self.worker = options.worker or default_worker
        self._disabled = ""   # why the callback was disabled (guarded); empty while it is not
        self._writer: RunWriter | None = None
        self._graph: ProbeGraph | None = None
        self._traced_for: tuple = ()  # what the probe's trace depends on (keras_step.compile_state)
        self._step = 0
        # steps = optimizer.iterations + this offset: 0 until a new compile() restarts the count
        self._step_offset = 0
        self._optimizer: weakref.ref | None = None
        self._iterations_left: int | None = None   # optimizer.iterations at the last fit's end
        self._counter: Any = None  # the last fit's optimizer.iterations (held: see _continue_steps)
        self._unended = False      # a batch began whose end this callback has not seen
        self._starting = False     # a fit began whose steps are not read yet (on_train_batch_begin)
        self._per_execution = 1    # the fit's steps_per_execution
        self._applied_before = 0   # the optimizer's count before the execution (_per_execution > 1)
        self._model_name: str | None = None   # the model the last fit trained
        self._opened = 0   # writer sessions this callback opened
        self._before: dict[int, np.ndarray] | None = None
        # variables' ids -> a function reading them all
        self._readers: dict[tuple[int, ...], Any] = {}
        self._estimated: ProbeGraph | None = None   # the graph _dump_estimate was computed for
        # what fit's train function updates (refused if not what we record)
        self._trained = TrainedVariables()
        self._fit_watch: Callable[[], str | None] | None = None   # see fit_watch
        # tf.keras 2.15 converts the logs of every batch to numpy (a device sync) for callbacks
        # without this; the callback never reads the logs.
        self._supports_tf_logs = True

    # ---- fit's lifecycle -----------------------------------------------------------------------
    def set_model(self, model) -> None:
        super().set_model(model)
        if self.source == "train_batch":
            self._install(model)

    @_guarded
    def _install(self, model) -> None:
        """The capture goes into fit's train step: installed before fit builds its train function
        (it does so after this); what it cannot do is found before fit traces anything, so
        fit's own function never fails because of the callback: the probe is recorded instead
        (``_fall_back`` at the fit's start)."""
        if self._installed is not None:
            self._installed.abandon()   # installed still: the last fit ended by an exception
            self._installed = None
        if self._fallback is not None \
                and identical((model, *compile_state(model)), self._fallback_for):
            # refused for this model and compile(): the probe goes on, without a new try each fit
            return
        self._fallback = None
        try:
            refuse_unsupported(model)
            if _per_execution(model) > 1:
                raise ValueError(f"steps_per_execution={_per_execution(model)}: fit runs that many "
                                 "steps in one call of its train function, and the step capture "
                                 "records one step's own batch; compile(..., "
                                 "steps_per_execution=1) for that")
        except ValueError as e:
            self._fallback_pending = str(e)
            return
        step = self._graph if isinstance(self._graph, StepGraph) else None
        if step is None or step.model is not model or not step.reuses_kept():
            step = StepGraph(model, self.trace_options)   # fit traces the step anew: a new catalog
        step.install()
        self._graph = self._installed = step

    def _fall_back(self, why: str) -> None:
        """Record the probe instead of the training step, which cannot be captured exactly
        (``why``): the ``probe=`` batch, else the first batch of fit's own data (ValueError
        where there is none to take: the callback then disables itself, training untouched).
        Warned once per reason; the manifest's ``probe.fallback`` keeps it."""
        if self.probe is None:
            found = first_batch(self._fit_args)
            if found is None:
                data = type(self._fit_args.x).__name__ if self._fit_args is not None \
                    else "not known"
                raise ValueError(f"{why}; and no probe batch to record instead (fit's data: "
                                 f"{data}): pass probe=(x, y), a fixed batch recorded after each "
                                 "sampled step's update")
            self.probe, self._probe_origin = found
        self._fallback, self._fallback_for = why, (self.model, *compile_state(self.model))
        self._graph = None   # the probe is traced at the end of the step
        level = logging.INFO if why in self._warned_fallback else logging.WARNING
        self._warned_fallback.add(why)
        log.log(level, "InspectCallback cannot capture the training step of %s exactly (%s). It "
                "records a %d-sample probe batch instead (%s), after each sampled step's update: "
                "its gradients are the probe's on the updated weights, not those the update was "
                "computed from (the catalog says captured_on: %r); pass source='probe' to "
                "choose that", self.model.name, why,
                _probe_size(self.probe[0]), self._probe_origin, PROBE_NOTE)

    @_guarded
    def on_train_begin(self, logs=None) -> None:
        self._fit_watch = fit_watch(self.model)   # its session ends as failed if the fit raises
        # steps_per_execution > 1: batch callbacks run once per execution of that many steps
        self._per_execution = _per_execution(self.model)
        # the last fit ended by an exception (Keras skips on_train_end then): its session ends
        # here, failed, and this fit gets its own (FORMAT.md, "Sessions")
        self._end_interrupted_session()
        if self._installed is not None:
            # fit's own function: an interrupted step may have left ours in place
            self._installed.use(None)
        self._fit_args, self._sampled, self._fit_first = fit_arguments(self.model), False, None
        if self._fallback_pending is not None:
            why, self._fallback_pending = self._fallback_pending, None
            self._fall_back(why)
        if self._model_name not in (None, self.model.name):
            log.warning("this InspectCallback was used with model %r on %s; this fit trains model "
                        "%r, whose steps continue that run's as one training: give each model a "
                        "callback and a run directory of its own", self._model_name, self.run_dir,
                        self.model.name)
        self._model_name = self.model.name
        # read at the fit's first batch: BackupAndRestore (or another callback listed after this
        # one) restores optimizer.iterations in its own on_train_begin
        self._starting = True
        if self._graph is not None and not isinstance(self._graph, StepGraph) and (
                self._graph.model is not self.model or self._recompiled(self.model)):
            # traced at the first step's end: fit has built the loss and metrics by then
            self._graph = None

    def _recompiled(self, model) -> bool:
        """Whether ``compile()`` ran (a new optimizer or loss) or other variables train since the
        probe was traced: it would record the old loss's gradients of the old variables
        (fine-tuning: unfreeze, compile, fit again). The step capture traces fit's new step
        itself (``StepGraph.install``)."""
        return not identical(compile_state(model), self._traced_for)

    def _continue_steps(self, optimizer) -> int:
        """The step before this fit's first: ``optimizer.iterations`` plus the offset. A new
        ``compile()`` brings an optimizer counting from 0 again; its steps would repeat ones
        this callback already wrote, and the later session would hide the earlier one's rows
        of those steps (FORMAT.md, "Sessions"), splicing two trainings into one curve. So
        after a new optimizer counting from 0, steps continue from the last (the manifest's
        ``step_offset`` says by how much). A new optimizer whose count is not 0 was restored
        (``keras.models.load_model`` of a checkpoint): a resume, its steps follow its count.

        Within a fit each batch is a step. Keras 3's ``LossScaleOptimizer`` does not count a
        step it skips (mixed precision, the loss scale overflowing), so the batches ran ahead
        of ``optimizer.iterations``: when the count is where the last fit left it, steps also
        continue from the last. A count set back since (a checkpoint restored) is a resume:
        its steps are recorded again, and the later session wins them."""
        if self._unended and self._counter is not None \
                and int(self._counter.numpy()) + self._step_offset > self._step:
            # The last fit ended by an exception in a batch this callback saw begin, not end.
            # One raised in another callback's batch end comes after the step trained; the last
            # optimizer's count says whether it did (compile() since would else number this
            # fit's steps from one too few). Only that step: steps trained by fits without this
            # callback are not counted after any fit.
            self._step += 1
        self._unended = False
        counter = applied_batches(optimizer)
        iterations = int(counter.numpy())
        # a new optimizer, counting on its own: compile() under mixed precision wraps the same
        # inner optimizer, its count going on, in a new LossScaleOptimizer each time; taken for a
        # restored one, its steps would repeat those already written
        new = self._optimizer is not None and self._optimizer() is not optimizer \
            and counter is not self._counter
        # only as the last fit left it at its end: after a fit ended by an exception (no
        # on_train_end), a restored checkpoint could match a stale count
        untouched = not new and iterations == self._iterations_left
        self._iterations_left = None
        if new and iterations and iterations + self._step_offset < self._step:
            # a restored count, not a new compile's: a model loaded from an earlier checkpoint
            # resumes at its steps (4-6), not after the run's last (7-9)
            log.warning("model.optimizer is new and its count was restored to %d (a checkpoint "
                        "loaded): a resume, steps follow it, and this fit's rows of steps %d-%d "
                        "hide those %s already holds",
                        iterations, iterations + self._step_offset + 1, self._step, self.run_dir)
        elif (new or untouched) and iterations + self._step_offset < self._step:
            self._step_offset = self._step - iterations
            why = ("model.optimizer is new (compile() again) and counts" if new else
                   "optimizer.iterations counted fewer steps than fit ran batches (a loss-scale "
                   "optimizer does not count the steps it skips); it stands")
            log.warning("%s from step %d: this run's steps continue from %d instead (step = "
                        "optimizer.iterations + %d; manifest step_offset)", why, iterations,
                        self._step, self._step_offset)
        self._optimizer, self._counter = weakref.ref(optimizer), counter
        return iterations + self._step_offset

    @_guarded
    def on_train_batch_begin(self, batch, logs=None) -> None:
        first, self._starting = self._starting, False
        if first:
            self._step = self._continue_steps(self.model.optimizer)
            self._fit_first = self._step + 1
        self._unended = True
        if self._per_execution > 1:
            self._applied_before = int(applied_batches(self.model.optimizer).numpy())
        stats, dump = self._wants_execution(self._step)
        dump = dump or self._force_dump
        if first or stats or dump:   # before the step capture traces a function for this step
            self._trained.check(self.model)
        if dump and self._writer is not None and not self._writer.closed:
            reason = self._writer.would_drop(self._dump_estimate)
            if reason:
                self._writer.record_drop(self._step + 1, reason, self._dump_estimate)
                dump = False
        self._pending = (stats, dump)
        if not (stats or dump):
            return
        if not isinstance(self._graph, StepGraph):
            # the update needs the value before the step: copied on sampled steps only (by the
            # variable's id: the probe graph is traced at the end of the first step). The step
            # capture computes it in the graph instead (StepGraph._updates).
            held = list(self.model.trainable_variables)
            self._before = dict(zip(map(id, held), self._values(held)))
        else:
            # the first capture always has the statistics: they define the catalog and its rows
            self._graph.use((stats or not self._graph.captured, dump))

    @_guarded
    def on_train_batch_end(self, batch, logs=None) -> None:
        self._unended = False
        self._trained.traced(self.model)
        # one step, or the execution's: counted by the optimizer (Keras 3 reports an execution
        # cut short by the epoch's end as a whole one)
        self._step += 1 if self._per_execution == 1 else \
            max(1, int(applied_batches(self.model.optimizer).numpy()) - self._applied_before)
        step = self._step
        (stats, dump), self._pending = self._pending, (False, False)
        noted = (self.options.dump_on_nonfinite and self._first_nonfinite is None
                 and not _finite((logs or {}).get("loss")))
        if noted:
            self._note_nonfinite(step, self._graph.loss_name if self._graph else None, "forward",
                                 "loss check")
        out = None
        if isinstance(self._graph, StepGraph):
            key = self._graph.current
            self._graph.use(None)     # fit's own function for the next step
            if self._graph.mismatch and (self._graph is self._opened_with or self._graph.fatal):
                # a retrace captured other ops: refused (logged, or raised if strict), the
                # catalog written would not hold another graph's rows
                raise RuntimeError(self._graph.mismatch)
            if self._graph.mismatch:   # nothing written from the step capture: the probe instead
                self._fall_back(self._graph.mismatch)
            # (no catalog before the first capture)
            elif key is None and not (noted and self._graph.captured):
                return
            else:
                out = self._graph.results(key) if key is not None else None
        if self._graph is None:
            self._trace()
        if not (stats or dump or noted):
            return
        if self._writer is None or self._writer.closed:
            # Every fit() that writes is a writer session of this worker (FORMAT.md, "Sessions"),
            # opened at its first write: a fit that samples no step costs no session (a lock,
            # a listing and manifest writes).
            self._open()
        if not (stats or dump):
            return
        if out is None:
            out = self._graph.function(stats, dump)(*self._graph.args)
        self._write(step, stats, dump, out)

    def _write(self, step: int, stats: bool, dump: bool, out: dict) -> None:
        """One sampled step's statistics and dump, with the variables' updates."""
        self._sampled = True
        in_graph = isinstance(self._graph, StepGraph)
        updates = out.get("update", {}) if in_graph else self._updates()
        if stats:
            values, *hist = (np.asarray(a) for a in out["stats"])   # in_graph: the update rows too
            # update rows follow (count 0: no "before" copy)
            if self._graph.variables and not in_graph:
                rows = variables.numpy_stats(
                    [updates.get(r.variable, np.zeros(0, np.float32))
                     for r in self._graph.variables])
                values, *hist = concat_rows([(values, *hist), rows])
            self._writer.add_stats(step, values, hist, keep=self._ungrouped_check(step, values))
            self._check_nonfinite(step, values)
        if dump:
            arrays = {k: np.asarray(v) for k, v in {**out["dump"], **out["samples"]}.items()}
            arrays.update({f"update/{k}": v for k, v in updates.items()})
            self._dump_estimate = sum(a.nbytes for a in arrays.values())
            aliases = self._graph.aliases
            meta = {ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else {}
            why = "after NaN/Inf" if self._force_dump else "schedule"
            self._force_dump = False
            refused = {"groups": "refused"} if capture.ungrouped_dump(arrays) else {}
            self._writer.add_dump(step, arrays, {**meta, **refused, "reason": why})

    def on_train_end(self, logs=None) -> None:
        if self._installed is not None:   # also when the callback was disabled
            self._installed.use(None)
            self._installed.uninstall()
            self._installed = None
        # see _continue_steps
        self._iterations_left = int(applied_batches(self.model.optimizer).numpy())
        self._dump_left_by_nonfinite()
        self._say_if_unsampled()
        self._close()
        self._fit_watch = self._fit_args = None   # they hold the fit's frame, its data

    @_guarded
    def _say_if_unsampled(self) -> None:
        """At the end of a fit that sampled no step: say so, and what to change. A warning while
        this callback has written nothing (a short fit under the default schedule leaves no run
        directory, and ``open_run`` would say only that it is none); after that, a fit between
        two sampled steps (a fit per epoch) is ordinary: INFO."""
        first = self._fit_first
        if self._sampled or first is None or self._step < first:
            return
        steps = self._step - first + 1
        upcoming = self.schedule.next_step(self._step)
        quiet = self._opened > 0 or self._told_unsampled
        self._told_unsampled = True
        every = max(1, steps // 10)
        log.log(logging.INFO if quiet else logging.WARNING,
                "this fit trained steps %d-%d and InspectCallback sampled none of them "
                "(stats_every_n_steps=%d, dump_every_n_steps=%d%s; the next sampled step is %s), "
                "so it wrote nothing to %s. For a fit this short pass a smaller "
                "stats_every_n_steps (%d gives ~10 points over %d steps) or dump_steps=",
                first, self._step, self.schedule.stats_every, self.schedule.dump_every,
                f", dump_steps={self.schedule.to_json()['dump_steps']}" if self.schedule.ranges
                else "",
                upcoming if upcoming is not None else "none", self.run_dir, every, steps)

    @_guarded
    def _dump_left_by_nonfinite(self) -> None:
        """The probe dump a NaN/Inf asked for when the fit ended before its next step (Keras's
        TerminateOnNaN stops it right there): the probe on the weights training left, under
        the NaN step's number (a probe records the weights after its step)."""
        if not (self._force_dump and self._graph is not None
                and not isinstance(self._graph, StepGraph)):
            return
        if self._writer is None or self._writer.closed:
            self._open()
        self._write(self._step, False, True, self._graph.function(False, True)(*self._graph.args))

    def close(self) -> None:
        """End what a fit ended by an exception left open (Keras skips ``on_train_end`` then):
        its writer session, closed as failed with every row written so far, and the step
        capture in the model's ``train_step``. The writer ends such a session by itself within
        ``writer.OWNER_CHECK_SECS`` (``fit_watch``), this callback's next fit or the process's
        exit would too; call it to hand the run directory's worker name to another callback at
        once (a notebook cell run again). After a fit that ended well it does nothing.

        >>> try:
        ...     model.fit(x, y, callbacks=[cb])   # doctest: +SKIP
        ... finally:
        ...     cb.close()
        """
        if self.model is not None and _inside_fit(self.model):
            log.warning("InspectCallback.close() called during the model's fit: ignored (the fit's "
                        "end closes its session); call it after fit returned or raised")
            return
        self._end_interrupted_session()
        self._fit_watch = None   # a fit that raised before its first write: its frame
        if self._installed is not None:
            self._installed.abandon()
            self._installed = None

    def _end_interrupted_session(self) -> None:
        """Close, as failed, the session a fit that ended by an exception left open (if any);
        where its writer ended it already (``fit_watch``), wait until it has: its worker's
        lock is released then."""
        if self._writer is not None:
            self._writer.close("failed",
                               error="the fit ended by an exception (on_train_end was not called)")

    @_guarded
    def _close(self) -> None:
        if self._writer is not None and not self._writer.closed:
            self._refusals.close(self._writer)
            self._writer.close("finished")
            st = self._writer.state
            log.info("run %s session %d finished: %d dumps, %d statistics rows, %s", self.run_dir,
                     self._writer.session, st.dumps, st.stats_rows, human_bytes(st.bytes_written))

    # ---- helpers -------------------------------------------------------------------------------
    def _wants(self, step: int) -> tuple[bool, bool]:
        return self.schedule.wants_stats(step), self.schedule.wants_dump(step)

    def _wants_execution(self, before: int) -> tuple[bool, bool]:
        """:meth:`_wants` of the steps the next execution runs after step ``before`` (one, or
        ``steps_per_execution``): an execution is sampled where any of its steps is, and recorded
        at its last step."""
        wants = [self._wants(before + i) for i in range(1, self._per_execution + 1)]
        return any(w[0] for w in wants), any(w[1] for w in wants)

    def _updates(self) -> dict[str, np.ndarray]:
        """{variable: value after this step - value before} for the variables copied before it."""
        before, self._before = self._before, None
        if before is None:
            return {}
        pairs = [(r, v) for r, v in zip(self._graph.variables, self._graph.tf_vars)
                 if id(v) in before]
        after = self._values([v for _, v in pairs])
        return {r.variable: a - before[id(v)] for (r, v), a in zip(pairs, after)}

    def _values(self, held: list) -> list[np.ndarray]:
        """The variables' values, read by one function call: a ``.numpy()`` each is an op
        dispatch each, on every sampled step."""
        if not held:
            return []
        key = tuple(map(id, held))
        if key not in self._readers:
            if len(self._readers) > 4:   # another model or compile: forget the old ones
                self._readers.clear()
            tf_vars = [_tf_var(v) for v in held]
            # `held` is kept with the function, so no id in the key can be reused by another
            # variable
            self._readers[key] = (held, tf.function(lambda: [v.read_value() for v in tf_vars],
                                                    autograph=False))
        return [t.numpy() for t in self._readers[key][1]()]

    def _trace(self) -> None:
        """Trace the probe graph (the catalog), once per model: later fit() calls reuse it."""
        x, y, sw = self.probe
        if self._fallback is None:   # (a fallback has said why the step is not recorded)
            _warn_custom_step(self.model)
        graph = ProbeGraph(self.model, x, y, sw, self.trace_options)
        self._traced_for = compile_state(self.model)
        try:
            graph.function(stats=True, dump=False)   # the catalog and statistics rows, always
        except GroupsError:
            raise   # groups= does not fit: its own message, not the batch's
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
            # a strategy's variables or metrics the probe could not use outside a replica (its
            # reads and metric updates are handled: keras/trace.py); nothing else to advise
            if "replica context" in str(e):
                raise ValueError("the probe cannot run under "
                                 f"{type(self.model.distribute_strategy).__name__} ({e}): "
                                 "InspectCallback records nothing in this fit; train with one "
                                 "replica to record it") from e
            shapes = [None if t is None else tf.nest.map_structure(lambda a: tuple(a.shape), t)
                      for t in (x, y)]
            raise ValueError(f"the model and its loss could not run on {self._probe_origin} (x, y "
                             f"shapes {shapes}): {type(e).__name__}: {e}; give a batch like the "
                             "training data's") from e
        if self.schedule.dump_every or self.schedule.ranges:   # traced now, not on a training step
            graph.function(stats=False, dump=True)
            if self.schedule.stats_every:
                graph.function(stats=True, dump=True)
        self._graph = graph

    def _open(self) -> None:
        """Open this fit's writer session."""
        graph = self._graph
        if self._fit_watch is not None and self._fit_watch() is not None:
            # a fit that raised before its first write left it, and batches come without a fit
            # (a loop calling the batch methods by hand, no on_train_begin): nothing to watch
            self._fit_watch = None
        self._refusals = Refusals()
        rows = graph.rows + variables.stats_rows(graph.variables)
        layout = StatsLayout(*map(tuple, zip(*rows))) if rows else None
        if self._estimated is not graph:   # once per graph, not per fit: later dumps measure it
            kept = max(1, 2 * self.options.samples_per_group)
            self._dump_estimate = sum(_nbytes(t) * (kept if c.batched else 1)
                                      // (_batch(t) if c.batched else 1)
                                      for c in graph.captured for t in (c.tensor, c.gradient)
                                      if t is not None)
            self._estimated = graph
        self._writer = RunWriter(self.run_dir, worker=self.worker, manifest=self._manifest(graph),
                                 stats_layout=layout, graph_def=graph.graph_def, mode="train",
                                 owner_gone=self._fit_watch, options=self.options.writer_options)
        # the writer holds the check (and with it fit's frame and locals: its data) until the
        # session ends; kept here too, they outlived a fit that raised until the next fit
        self._fit_watch = None
        self._opened += 1
        self._opened_with = graph
        if self._opened == 1:
            self._warn_if_hiding(self._writer)
        on = ("each sampled step's training batch, before its update"
              if isinstance(graph, StepGraph) else
              f"a {_probe_size(self.probe[0])}-sample probe batch, after each sampled "
              "step's update")
        log.info("capturing %d tensors (%d with gradients) of Keras model %s on %s into %s",
                 len(graph.captured), sum(c.gradient is not None for c in graph.captured),
                 self.model.name, on, self.run_dir)

    def _warn_if_hiding(self, writer: RunWriter) -> None:
        """Warn when this callback's first session starts at or below the last step the
        session before it recorded (another callback or process): a new training written into
        an old run directory, or a resume from a checkpoint, which is meant. The later
        session's rows hide the earlier one's of the same steps."""
        if writer.session == 1:
            return
        name = fmt.manifest_name(self.worker, writer.session - 1)
        try:   # the reader's own check (schema and types), on the bytes the writer's storage reads
            before = load_manifest(name, data=writer.store.read(name, limit=MAX_MANIFEST_BYTES))
        except (OSError, InspectorError):
            return   # no readable manifest there: nothing to compare
        last = (before.get("steps") or [None, None])[1]
        if before.get("mode") == "train" and isinstance(last, int) and last >= self._step:
            log.warning("%s already holds steps up to %d (session %d); this callback writes from "
                        "step %d on, and its rows hide the earlier ones of the same steps. Meant "
                        "for a resume from a checkpoint; for a new training, use another run "
                        "directory", self.run_dir, last, writer.session - 1, self._step)

    def _manifest(self, graph: ProbeGraph) -> dict[str, Any]:
        note: dict[str, str] = {}
        if isinstance(graph, StepGraph):   # fit's own step: always in training mode
            probe = {"source": "train_batch", "samples": None, "training": True,
                     "targets": graph.has_targets, "sample_weight": graph.has_sample_weight}
        else:
            x, y, sw = self.probe
            probe = {"source": "probe", "samples": _probe_size(x),
                     "training": self.trace_options.training, "targets": y is not None,
                     "sample_weight": sw is not None, "origin": self._probe_origin,
                     "fallback": self._fallback}
            # beside every entry: what its gradient and update mean
            note = {"captured_on": PROBE_NOTE}
        probe["inputs"] = graph.input_names
        if self._first_nonfinite is not None and self._first_nonfinite["tensor"] is None:
            # seen in fit's loss before the first capture named the loss tensor
            self._first_nonfinite["tensor"] = graph.loss_name or "loss"
        return {
            "tensorflow_version": tf.__version__, "keras_version": _keras_version(),
            "is_chief": self.is_chief, "source": "keras", "model": self.model.name,
            "probe": probe, "step_offset": self._step_offset,
            "loss": graph.loss_name, "labels": graph.labels_name,
            "config": {**self.options.manifest_config(native.used(self.options.native_stats),
                                                      self.filters["dtypes"]),
                       "share_gradients": False, "mode": "train"},
            "tensors": [{**c.catalog_entry(), **note} for c in graph.captured],
            **graph.groups_manifest(), "skipped": graph.skipped,
            "first_nonfinite": self._first_nonfinite, "accounting": graph.accounting,
        }

    def _ungrouped_check(self, step: int, values: np.ndarray) -> np.ndarray | None:
        """None (write every row), or, on a step where some samples are in no group (float
        targets that are not class ids, ``capture.not_class_ids``), a mask keeping the ``all``
        rows only, as ``DumpHook`` does: the groups' rows would leave those samples out."""
        rows = self._graph.rows
        first = next((i for i, (_, _, g) in enumerate(rows) if g != "all"), None)
        if first is None:
            return None
        count = STAT_COLUMNS.index("count")
        tensor, kind, _ = rows[first]
        mine = [i for i, (t, k, _) in enumerate(rows) if t == tensor and k == kind]
        grouped = sum(values[i, count] for i in mine if rows[i][2] != "all")
        if grouped >= sum(values[i, count] for i in mine if rows[i][2] == "all"):
            return None
        why = bad_rule(self.group_spec)
        first = self._refusals.note(step, None, why)
        if first is not None:
            log.error("step %d: some samples are in no group (%s): that step's statistics are "
                      "written for group 'all' only, and so is every such step (logged once a fit)",
                      step, why)
            self._writer.update_manifest(**{GROUPS_REFUSED_KEY: first})
        return all_rows_only(rows, len(values))

    def _check_nonfinite(self, step: int, values: np.ndarray) -> None:
        nan, inf = STAT_COLUMNS.index("nan"), STAT_COLUMNS.index("inf")
        bad = np.flatnonzero((values[:, nan] > 0) | (values[:, inf] > 0))
        if bad.size:
            rows = self._graph.rows + variables.stats_rows(self._graph.variables)
            tensor, kind, _ = rows[bad[0]]
            self._note_nonfinite(step, tensor, kind, "statistics")

    def _note_nonfinite(self, step: int, tensor: str | None, kind: str, source: str) -> None:
        """Record the first NaN/Inf (the manifest's first_nonfinite) and, if asked, dump the next
        step."""
        if self._first_nonfinite is not None:
            return
        self._first_nonfinite = {"step": step, "tensor": tensor, "kind": kind, "source": source}
        log.warning("NaN/Inf first seen at step %d in %s (%s)%s", step, tensor or "the loss", kind,
                    "; dumping the next step" if self.options.dump_on_nonfinite else "")
        if self._writer is not None and not self._writer.closed:
            self._writer.update_manifest(first_nonfinite=self._first_nonfinite)
        self._force_dump = self.options.dump_on_nonfinite


def _per_execution(model) -> int:
    """The model's ``steps_per_execution`` (1 where unset). ValueError for ``"auto"``: tf.keras
    2.15 starts it at 1 and raises it during fit, so the steps' numbers would be wrong."""
    spe = getattr(model, "steps_per_execution", None)
    spe = getattr(model, "_steps_per_execution", None) if spe is None else spe
    if isinstance(spe, str) or getattr(model, "_autotune_steps_per_execution", False):
        raise ValueError("steps_per_execution='auto': Keras changes it during fit, so "
                         "InspectCallback could not number the steps; compile(..., "
                         "steps_per_execution=<an int>)")
    return 1 if spe is None else int(spe.numpy() if hasattr(spe, "numpy") else spe)


def applied_batches(optimizer):
    """The optimizer's count of the batches it was applied to: ``optimizer.iterations``, but
    under Keras 3's ``gradient_accumulation_steps=k`` that is updates, batches // k (a tensor
    computed at the call), and the count of batches is the variable ``_iterations`` (a new
    callback's steps starting at the updates' count would hide earlier rows). A
    ``LossScaleOptimizer`` (mixed precision) has no accumulation of its own and counts with its
    inner optimizer's ``iterations``: the inner one's count, accumulating or not, so the rule
    above holds under mixed precision too."""
    inner = optimizer
    while getattr(inner, "inner_optimizer", None) is not None \
            and not getattr(inner, "gradient_accumulation_steps", None):
        inner = inner.inner_optimizer
    batches = getattr(inner, "_iterations", None)
    if getattr(inner, "gradient_accumulation_steps", None) and hasattr(batches, "numpy"):
        return batches
    return optimizer.iterations


def _inside_fit(model) -> bool:
    """Whether this thread is inside ``model.fit`` (a callback calling ``close()``)."""
    return fit_frame(model, sys._getframe(1)) is not None


def fit_watch(model) -> Callable[[], str | None] | None:
    """A ``RunWriter(owner_gone=)`` check for the ``model.fit`` this thread is in now: None
    while the thread is still inside that call, a reason once it left it without
    ``on_train_end`` (Keras skips it after an exception). None where no fit calls this (a
    custom loop calling the callback's methods): nothing to watch. The check compares frames
    by identity only, from the writer's thread (``sys._current_frames``)."""
    fit = fit_frame(model, sys._getframe(1))
    if fit is None:
        return None
    thread = threading.get_ident()

    def gone() -> str | None:
        frame = sys._current_frames().get(thread)
        while frame is not None:
            if frame is fit:
                return None
            frame = frame.f_back
        return "the fit ended by an exception (on_train_end was not called)"
    return gone


def _warn_custom_step(model) -> None:
    """The probe runs the model and ``compute_loss``; a ``train_step`` of the user's own may
    train on more (terms added to the loss) or on other parts: say so where it is one."""
    step = getattr(type(model), "train_step", None)
    where = getattr(step, "__module__", "") or ""
    if step is not None and not where.startswith(("keras", "tf_keras", "tensorflow")):
        log.warning("%s has a train_step of its own (%s): the probe records the model's values and "
                    "the gradients of compute_loss (the compiled loss), which may not be what that "
                    "step trains on; source='train_batch' records the step's own", model.name,
                    step.__qualname__)


def _finite(loss) -> bool:
    """Whether fit's reported loss is finite (True when there is none)."""
    if loss is None:
        return True
    return bool(np.all(np.isfinite(np.asarray(loss))))


def _keras_version() -> str | None:
    return getattr(tf.keras, "__version__", None) \
        or getattr(__import__("keras"), "__version__", None)


def _probe_size(x) -> int:
    return int(tf.nest.flatten(x)[0].shape[0])


def _nbytes(t: tf.Tensor) -> int:
    dims = t.shape.as_list() if t.shape.rank is not None else [1]
    return int(np.prod([d or 1 for d in dims], dtype=np.int64)) \
        * (t.dtype.size if t.dtype != tf.bfloat16 else 4)


def _batch(t: tf.Tensor) -> int:
    return (t.shape.as_list()[0] or 1) if t.shape.rank else 1
