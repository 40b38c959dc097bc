"""``inspect_step``: the step capture of ``InspectCallback`` for custom training loops.

A custom loop's step function (a ``tf.function`` or plain eager Python, ``tf.GradientTape`` and
``optimizer.apply_gradients``) is wrapped; on a sampled step the wrapper runs a second traced
function instead of it: the step's own Python code (autograph-converted, as ``tf.function``
does) and then the capture over the ops it built, exactly as ``InspectCallback`` does inside
``fit``'s train step (``hooks/keras/step.py``: ``StepGraph``). The step's
``tape.gradient(loss, model.trainable_variables)`` is answered by the capture's own backward
pass, so the recorded gradients are the ones the update is computed from, and its target is
the loss. Other steps call the step function itself: same graph, same cost. Writing, the
schedule, groups, NaN checks and the run directory are ``InspectCallback``'s.

Example::

    step = inspect_step(train_step, "runs/loop1", model, stats_every_n_steps=10)
    for x, y in dataset:
        loss = step(x, y)           # train_step(x, y), recorded on sampled steps
    step.close()                    # or: with inspect_step(...) as step: ...
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

import tensorflow as tf

from hooks.keras.callback import InspectCallback
from hooks.keras.step import Key, StepGraph, unpack
from hooks.keras.trace import ProbeOptions

log = logging.getLogger("tf_inspector")

Labels = Callable[..., Any]


def default_labels(*args, **kwargs):
    """The targets of a step called as ``step(x, y)``, ``step((x, y))`` or ``step(x, y, sw)``
    (fit's unpacking); None for ``step(x)`` or a single batch that is not a tuple."""
    if kwargs and not args:
        return kwargs.get("y", kwargs.get("labels"))
    data = args[0] if len(args) == 1 else tuple(args[:3])
    return unpack(data)[1]


class LoopStepGraph(StepGraph):
    """``StepGraph`` over a custom loop's step function rather than ``fit``'s train step."""

    def __init__(self, model, options: ProbeOptions, fn: Callable, labels: Labels) -> None:
        super().__init__(model, options)
        self.no_call = "pass the model the step function trains as model="
        self.instead = ("inspect_step records a step differentiating one target w.r.t. the "
                        "model's variables (docs/guide/custom-loops.md)")
        python = getattr(fn, "python_function", fn)    # a tf.function's own Python
        # as tf.function runs it: autograph turns Python control flow on tensors into graph ops
        self._convert = _autograph(fn)
        self._run = tf.autograph.to_graph(python) if self._convert else python
        self._labels = labels
        self._returned: dict = {}   # the capture of the trace under way (_store)

    def capturing(self, key: Key):
        """The traced function of a sampled step of kind ``key`` (statistics, dump): it returns
        the step function's result and the capture's (:meth:`results` reads them)."""
        if key not in self._fns:
            def body(*args, **kwargs):
                self._returned = {}
                if self._replicas() > 1:   # the capture inside each replica's step (strategy.run)
                    with self._per_replica(key):
                        return self._run(*args, **kwargs), self._returned
                data = (None, self._labels(*args, **kwargs), None)
                result = self._capturing_step(lambda: self._run(*args, **kwargs), data, key)
                return result, self._returned
            # autograph=False: the user's code is converted above, the capture's never is
            self._fns[key] = tf.function(body, autograph=False, reduce_retracing=True)
        return self._fns[key]

    def _replicas(self) -> int:
        strategy = getattr(self.model, "distribute_strategy", None)
        return getattr(strategy, "num_replicas_in_sync", 1)

    @contextlib.contextmanager
    def _per_replica(self, key: Key) -> Iterator[None]:
        """While tracing: the model's strategy's ``run(fn, args, kwargs)`` runs ``fn`` under the
        step capture in each replica, as ``fit``'s train step is (hooks/keras/replicas.py makes
        the values the global batch's); the labels are those of ``fn``'s arguments."""
        strategy = self.model.distribute_strategy
        run = strategy.run

        def captured_run(fn, args=(), kwargs=None, options=None):
            own = tf.autograph.to_graph(fn) if self._convert else fn   # as strategy.run would

            @tf.autograph.experimental.do_not_convert   # the capture's code is never converted
            def replica_step(*a, **k):
                data = (None, self._labels(*a, **k), None)
                return self._capturing_step(lambda: own(*a, **k), data, key)
            return run(replica_step, args=args, kwargs=kwargs or {}, options=options)

        strategy.run = captured_run
        try:
            yield
        finally:
            del strategy.run

    def _store(self, key: Key, out: dict) -> None:
        """The results leave the function as its outputs (fit's step keeps them in variables,
        since fit owns its function's outputs): no variable is created in the trace, which
        would make ``tf.function`` trace the step twice."""
        if "dump" in out and self._rename:
            out["dump"] = {self._renamed(k): v for k, v in out["dump"].items()}
            self.aliases = {self._renamed(k): self._renamed(v) for k, v in self.aliases.items()}
        self._returned = out

    def results(self, key: Key, out: dict | None = None) -> dict:   # type: ignore[override]
        """The capture's outputs of a sampled step, as numpy (``StepGraph.results``' form)."""
        out = tf.nest.map_structure(lambda t: t.numpy(), dict(out or {}))
        if "stats" in out:
            out["stats"] = tuple(out["stats"])
        elif key[0]:
            out["stats"] = ()    # nothing to compute statistics of
        return out


def _autograph(fn) -> bool:
    """Whether ``fn`` runs with autograph: a ``tf.function``'s own setting (True by default), and
    a plain eager function traced on sampled steps (as ``tf.function(fn)`` would)."""
    return bool(getattr(fn, "_autograph", True))


def refuse_unsupported_loop(fn, model) -> None:
    """ValueError for what the capture cannot record, before anything is traced: a step compiled
    by XLA (the statistics kernel is not XLA's)."""
    jit = getattr(fn, "_jit_compile", None)
    if jit:
        raise ValueError(f"inspect_step of a tf.function(jit_compile={jit!r}): the capture's "
                         "statistics kernel cannot be compiled by XLA; wrap the step function "
                         "without jit_compile (XLA steps are not recorded)")


class InspectedStep:
    """A custom loop's step function, recorded on sampled steps (see the module docstring).

    Call it as the step function itself; each call is one step (numbered from
    ``initial_step + 1``). ``close()`` ends the writer session (or use it as a context manager:
    an exception leaving the block ends the session as failed)."""

    def __init__(self, fn: Callable, run_dir, model, *, labels: Labels | None = None,
                 initial_step: int = 0, **options) -> None:
        if not callable(fn):
            raise TypeError(f"inspect_step needs the step function, got {type(fn).__name__}")
        if not hasattr(model, "trainable_variables") or not hasattr(model, "_flatten_layers"):
            raise TypeError(f"model= must be the Keras model the step trains, got "
                            f"{type(model).__name__}")
        if labels is not None and not callable(labels):
            raise TypeError("labels= must be a function of the step's arguments returning the "
                            f"targets (labels=lambda x, y: y), got {type(labels).__name__}")
        if isinstance(initial_step, bool) or not isinstance(initial_step, int) or initial_step < 0:
            raise ValueError(f"initial_step must be an int >= 0 (steps are numbered from "
                             f"initial_step + 1), got {initial_step!r}")
        self.fn = fn
        self._cb = InspectCallback(run_dir, source="train_batch", **options)
        tf.keras.callbacks.Callback.set_model(self._cb, model)   # not the fit install
        self._cb._model_name = model.name
        refuse_unsupported_loop(fn, model)
        self._graph = LoopStepGraph(model, self._cb.trace_options, fn, labels or default_labels)
        self._cb._graph = self._graph
        self._cb._step = initial_step
        self.disabled = ""   # why recording stopped; the step function runs on regardless

    @property
    def step(self) -> int:
        """The number of the last step called."""
        return self._cb._step

    @property
    def run_dir(self) -> str:
        return self._cb.run_dir

    def __call__(self, *args, **kwargs):
        cb, step = self._cb, self._cb._step + 1
        wants = self._wants(step)
        if wants is None:
            cb._step = step
            return self.fn(*args, **kwargs)
        stats, dump = wants
        key = (stats or not self._graph.captured, dump)
        try:   # the trace only: an error there is the capture's, and the step runs without it
            fn = self._graph.capturing(key)
            fn.get_concrete_function(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - never the training's own failure
            self._disable(f"tracing the step function with the capture failed: "
                          f"{type(e).__name__}: {e}")
            cb._step = step
            return self.fn(*args, **kwargs)
        result, out = fn(*args, **kwargs)
        cb._step = step
        if self._graph.mismatch:
            self._disable(self._graph.mismatch)
            return result
        self._record(step, stats, dump, key, out)
        return result

    def _wants(self, step: int) -> tuple[bool, bool] | None:
        """What step ``step`` records, None for nothing (or after the recording stopped)."""
        cb = self._cb
        if self.disabled or cb._disabled:
            return None
        stats, dump = cb._wants(step)
        dump = dump or cb._force_dump
        if dump and cb._writer is not None and not cb._writer.closed:
            reason = cb._writer.would_drop(cb._dump_estimate)
            if reason:
                cb._writer.record_drop(step, reason, cb._dump_estimate)
                dump = False
        return (stats, dump) if stats or dump else None

    def _record(self, step: int, stats: bool, dump: bool, key: Key, returned: dict) -> None:
        cb = self._cb
        try:
            out = self._graph.results(key, returned)
            if cb._writer is None or cb._writer.closed:
                cb._open()
            cb._write(step, stats, dump, out)
        except Exception as e:  # noqa: BLE001 - the writer's failure must not end training
            self._disable(f"recording step {step} failed: {type(e).__name__}: {e}")

    def _disable(self, why: str) -> None:
        """Stop recording (the step function runs on), logged; raised with ``strict=True``."""
        if self._cb.strict:
            raise RuntimeError(why)
        self.disabled = why
        log.error("inspect_step stops recording %s: %s (the step function runs on unrecorded)",
                  self._cb.run_dir, why)
        if self._cb._writer is not None and not self._cb._writer.closed:
            self._cb._writer.update_manifest(hook_error=why)

    def close(self, error: str | None = None) -> None:
        """End the writer session: finished, or failed with ``error``."""
        writer = self._cb._writer
        if writer is None or writer.closed:
            return
        if error is None:
            self._cb._close()
        else:
            writer.close("failed", error=error)

    def __enter__(self) -> "InspectedStep":
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(None if kind is None else f"{kind.__name__}: {value}")


def inspect_step(fn: Callable, run_dir, model, *, labels: Labels | None = None,
                 initial_step: int = 0, **options) -> InspectedStep:
    """Record a custom training loop's step function: every op's forward value on the step's own
    batch, ``d loss / d output`` and the variables' gradients and updates, on sampled steps.

    Args:
      fn: the step function, a ``tf.function`` or plain Python run eagerly, which calls
        ``model``, differentiates its loss with ``tape.gradient(loss,
        model.trainable_variables)`` (or a list holding them) and applies the gradients. The
        target of that call is the loss recorded.
      run_dir: the run directory, as for ``InspectCallback``.
      model: the Keras model whose ops and variables are recorded (a GAN: the generator or the
        discriminator; the loss is the target differentiated w.r.t. its variables).
      labels: a function of the step's arguments returning the targets the groups come from
        (``positive=``, ``groups=``); by default ``y`` of ``step(x, y)``/``step((x, y))``.
      initial_step: the step before the first call (a resumed loop: the steps already trained).
      **options: ``InspectCallback``'s (``stats_every_n_steps``, ``dump_every_n_steps``,
        ``positive``, ``groups``, ``include``, ``strict``, ... or ``options=CaptureOptions``).
    """
    return InspectedStep(fn, run_dir, model, labels=labels, initial_step=initial_step, **options)
