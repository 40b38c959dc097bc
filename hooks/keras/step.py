"""Capture inside ``fit``'s own train step, for ``InspectCallback(source="train_batch")``.

The callback wraps the model's ``train_step`` for the duration of ``fit``. ``fit``'s own train
function is traced with the wrapper doing nothing (it calls the model's step: same graph, same
cost). For sampled steps the callback builds a second train function (``make_train_function(
force=True)``, once per kind of sampled step) whose trace runs the model's step and then the
hook's capture over the ops that step built: the model's forward pass, the loss, ``d loss /
d output`` from one ``tf.gradients``, the fused statistics and the dump, all of the step's own
batch and its own forward values (the weights before the update, dropout's own masks). Their
results go into variables that the callback reads after the step. On a sampled step the
callback hands ``fit`` that function and gives the plain one back after.

Example (what ``InspectCallback`` does)::

    step = StepGraph(model, options)
    step.install()                       # in set_model: before fit builds its train function
    step.use((True, False))              # in on_train_batch_begin of a statistics step
    out = step.results()                 # in on_train_batch_end: {"stats": (values, hist splits,
                                         # index, count)}
    step.use(None); step.uninstall()     # after the step; at the end of fit
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import tensorflow as tf

from hooks.capture.gradients import differentiable
from hooks.variables import update_stats
from hooks.keras import replicas
from hooks.keras.trace import (GroupsError, ProbeGraph, ProbeOptions, _tf_var, layer_paths,
                               read_handle, record_calls, variable_name)
from hooks.stats.exact import concat_stats

Key = tuple[bool, bool]   # (statistics, dump)
log = logging.getLogger("tf_inspector")


def unpack(data) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of a ``train_step`` argument, as Keras unpacks it."""
    if isinstance(data, (tuple, list)):
        if len(data) > 3:
            raise ValueError(f"a training batch of {len(data)} elements: expected x, (x, y) or "
                             "(x, y, sample_weight)")
        parts = list(data) + [None] * (3 - len(data))
        return parts[0], parts[1], parts[2]
    return data, None, None


def refuse_unsupported(model) -> None:
    """ValueError for what the step capture cannot do, before ``fit`` traces anything."""
    jit = getattr(model, "jit_compile", False)
    # any truthy value: tf.keras 2.15 keeps compile(jit_compile="auto") as is, and compiles by XLA
    if jit:
        raise ValueError(f"source='train_batch' with model.jit_compile={jit!r}: the statistics "
                         "kernel and the capture cannot be compiled by XLA; compile(..., "
                         "jit_compile=False) or use source='probe'")
    if getattr(model, "run_eagerly", False):
        raise ValueError("source='train_batch' with run_eagerly=True: the capture needs fit's "
                         "traced train step; compile(..., run_eagerly=False) or use source='probe'")


@contextlib.contextmanager
def recorded_loss(model, box: dict) -> Iterator[None]:
    """While tracing the step: ``box["loss"]`` is what ``compute_loss`` returned (the loss
    before any loss scaling), ``box["ops"]`` the op interval it built."""
    graph = tf.compat.v1.get_default_graph()
    original = model.compute_loss

    def compute_loss(*args, **kwargs):
        start = len(graph.get_operations())
        loss = original(*args, **kwargs)
        box.setdefault("loss", loss)
        # tf.keras: positional
        box.setdefault("y_pred", kwargs.get("y_pred", args[2] if len(args) > 2 else None))
        box.setdefault("ops", (start, len(graph.get_operations())))
        return loss

    saved = model.__dict__.get("compute_loss")
    object.__setattr__(model, "compute_loss", compute_loss)
    try:
        yield
    finally:
        if saved is None:
            model.__dict__.pop("compute_loss", None)
        else:
            object.__setattr__(model, "compute_loss", saved)


@contextlib.contextmanager
def shared_backward(step: "StepGraph", graph: tf.Graph, box: dict, capture_now) -> Iterator[None]:
    """While tracing a capturing step: the train step's ``tape.gradient(loss, variables)`` is
    answered by the capture's own ``tf.gradients`` over every op output and those variables,
    one backward pass instead of two (the gradient functions are the same registered ones, so
    the optimizer gets the same gradients). ``capture_now(handles)`` builds the capture and
    leaves the handles' gradients in ``step.extra_gradients``; its result goes to
    ``box["out"]``. Any other call (another target than the recorded loss, e.g. a scaled one,
    output gradients, sources that are not variables, another graph) is the tape's own."""
    tape_gradient = tf.GradientTape.gradient
    none = tf.UnconnectedGradients.NONE

    def gradient(tape, target, sources, output_gradients=None, unconnected_gradients=none):
        flat = tf.nest.flatten(sources)
        ours = tf.compat.v1.get_default_graph() is graph and flat \
            and all(_is_variable(v) for v in flat) and _any_of(flat, step.model)
        if ours and step.options.gradients and isinstance(target, tf.Tensor):
            if box.get("loss") is None:
                own_loss(step, box, target, len(graph.get_operations()))
            if box.get("loss") is not None:
                step_target(step, box, target, _handles(graph, flat))
        if (step.options.gradients and "out" not in box and box.get("loss") is not None
                and target is box["loss"] and not step.mismatch and output_gradients is None
                and unconnected_gradients in (none, "none") and ours):
            out = capture_now([graph.capture(_tf_var(v).handle) for v in flat])
            # None: the capture failed (step.mismatch says why), the tape's own pass
            if out is not None:
                box["out"] = out
                return tf.nest.pack_sequence_as(sources, list(step.extra_gradients))
        return tape_gradient(tape, target, sources, output_gradients, unconnected_gradients)

    tf.GradientTape.gradient = gradient
    try:
        yield
    finally:
        tf.GradientTape.gradient = tape_gradient


def own_loss(step: "StepGraph", box: dict, target: tf.Tensor, ops: int) -> None:
    """A step that never called ``compute_loss`` (a ``train_step`` computing its loss by hand,
    ``compile()`` without ``loss=``) and differentiates ``target`` w.r.t. the model's weights:
    that target is the loss it trains on, so the capture takes its gradients, as ``DumpHook``
    takes the loss the optimizer differentiated. Its ops are those built since the model's
    call (``box["ops"]``: None there, :meth:`StepGraph._capture_step` fills the start in).
    Under loss scaling the target may be the scaled loss, which cannot be told from the
    loss: refused (``step.mismatch``)."""
    if _refused_under_loss_scaling(
            step, f"the train step differentiates {target.name} and never called compute_loss: "
                  "under loss scaling whether that target is the loss or the loss times the scale "
                  f"cannot be told; compute the loss with self.compute_loss(...) in train_step"):
        return
    if not step.told_own_loss:   # once, not at each trace of a sampled step's function
        step.told_own_loss = True
        log.info("the train step of %s never called compute_loss: the capture takes the target it "
                 "differentiates, %s, as the loss (the one the step trains on)", step.model.name,
                 target.name)
    box["loss"], box["ops"], box["own_loss"] = target, (None, ops), True


def _refused_under_loss_scaling(step: "StepGraph", why: str) -> bool:
    """Under loss scaling, record ``why`` as the step's mismatch (the first one stays) and say
    True."""
    if not loss_scaling(step.model):
        return False
    step.mismatch = step.mismatch or why
    return True


def step_target(step: "StepGraph", box: dict, target: tf.Tensor, handles: set[str]) -> None:
    """Note a target the step differentiates w.r.t. the model's variables, and make the loss the
    capture differentiates the one the step trains on: ``compute_loss``'s result, or it times a
    factor (a loss scale, ``loss_scale_factor``, a constant: the capture takes the unscaled
    loss's gradients, as the optimizer applies them), else the target itself (terms the step
    adds to ``compute_loss``'s result change the gradients: those of ``compute_loss``'s part
    alone can be far off the applied ones), as DumpHook takes the loss the optimizer
    differentiated. Refused (``step.mismatch``): such a target
    under loss scaling (its scale cannot be told apart), and a second target (two optimizers,
    sharpness-aware minimization: which gradients are the step's would be a guess).
    ``handles``: the names of the variables' handles in the step's graph (:func:`_handles`)."""
    targets = box.setdefault("targets", set())
    same = target is box["loss"] or _scaled(target, box["loss"], handles)
    if not same and not targets:
        if _refused_under_loss_scaling(
                step, f"the train step differentiates {target.name}, neither compute_loss's result "
                      f"({box['loss'].name}) nor it times the loss scale: under loss scaling its "
                      "gradients cannot be unscaled; compute the whole loss in compute_loss "
                      f"(override it, or use add_loss), or {step.instead}"):
            return
        log.info("the train step differentiates %s, not compute_loss's result %s: the capture "
                 "takes its gradients (the loss the step trains on)", target.name, box["loss"].name)
        box["loss"], same = target, True
    targets.add(box["loss"].name if same else target.name)
    if len(targets) > 1:
        step.mismatch = step.mismatch or (
            f"the train step differentiates {len(targets)} targets w.r.t. the model's variables "
            f"({', '.join(sorted(targets))}): which gradients are the step's is ambiguous (two "
            f"optimizers, sharpness-aware minimization); {step.instead}")


def loss_scaling(model) -> bool:
    """Whether the optimizer scales the loss and unscales its gradients (a ``LossScaleOptimizer``,
    Keras 3's ``loss_scale_factor``)."""
    optimizer = getattr(model, "optimizer", None)
    return "LossScale" in type(optimizer).__name__ \
        or getattr(optimizer, "loss_scale_factor", None) is not None


#: ops scaling their first input by their second (Mul: either); the loss over a count is scaled too
_SCALING = {"Mul": 2, "RealDiv": 1, "Div": 1, "DivNoNan": 1}


def _scaled(target: tf.Tensor, loss: tf.Tensor, handles: set[str]) -> bool:
    """``target`` is ``loss`` (seen through Identity and Cast: ``scale_loss``) times or over
    factors no gradient flows from to the variables (``handles``): a loss scale, a constant, a
    stopped gradient. A factor computed from them (the model's output, say) makes another
    target, whose gradients are not the loss's times a factor (``loss * mean(y_pred ** 2)``
    is not a scaled loss: its gradients differ from the loss's)."""
    want, seen, stack = _through(loss).name, set(), [target]
    # down the scaled side of each Mul or Div (seen once: a product may share its inputs)
    while stack:
        t = _through(stack.pop())
        if t.name == want:
            return True
        if t.name in seen or t.op.type not in _SCALING:
            continue
        seen.add(t.name)
        a, b = t.op.inputs[0], t.op.inputs[1]
        stack += [x for x, f in ((a, b), (b, a))[:_SCALING[t.op.type]] if not _depends(f, handles)]
    return False


def _through(t: tf.Tensor) -> tf.Tensor:
    """``t`` seen through what leaves a scalar as it is: Identity, Cast, a mean or sum of it
    alone."""
    while t.op.inputs and (t.op.type in ("Identity", "Cast")
                           or t.op.type in ("Mean", "Sum") and t.op.inputs[0].shape.rank == 0):
        t = t.op.inputs[0]
    return t


def _handles(graph: tf.Graph, variables: list) -> set[str]:
    """The names, in ``graph``, of the variables' captured handles (what reads them)."""
    ids = {id(h) for h in map(_handle, variables) if h is not None}
    return {inner.name for outer, inner in graph.captures if id(outer) in ids}


def _handle(v) -> tf.Tensor | None:
    """``v``'s handle; None where it has none to give (a distributed variable outside a replica
    raises): this runs inside fit's trace, where an error would end the fit."""
    try:
        return _tf_var(v).handle
    except (AttributeError, ValueError, RuntimeError):
        return None


def _depends(t: tf.Tensor, handles: set[str]) -> bool:
    """Whether a gradient flows from ``t`` back to a handle in ``handles``: its ops' inputs
    followed up to ops without a gradient (StopGradient, Shape) and integer inputs, as
    ``tf.gradients`` does."""
    seen, stack = set(), [t.op]
    while stack:
        op = stack.pop()
        if op.name in seen or not differentiable(op):
            continue
        seen.add(op.name)
        for i in op.inputs:
            if i.name in handles:
                return True
            if not (i.dtype.is_integer or i.dtype == tf.bool):
                stack.append(i.op)
    return False


def _any_of(variables: list, model) -> bool:
    """Whether any of ``variables`` is one of ``model``'s: a target differentiated w.r.t. another
    model's weights alone (a GAN's generator, when the discriminator is recorded) is not the
    recorded model's loss."""
    mine = {id(_tf_var(v)) for v in model.trainable_variables}
    return any(id(_tf_var(v)) in mine for v in variables)


def _is_variable(v) -> bool:
    """A tf.Variable, or a Keras 3 variable holding one."""
    return isinstance(v, tf.Variable) or isinstance(getattr(v, "value", None), tf.Variable)


class StepGraph(ProbeGraph):
    """The hook's capture built into ``fit``'s train function (see the module docstring)."""

    batch_words = "the training step's batch"

    def __init__(self, model, options: ProbeOptions) -> None:
        super().__init__(model, None, None, None, options, any_batch=True)   # no probe: no args
        self.has_targets = self.has_sample_weight = False
        self.current: Key | None = None   # the capture fit's next step runs (read while tracing it)
        self._outputs: dict[Key, list[tuple[tuple, tf.Variable]]] = {}
        self._fns: dict[Key, Any] = {}
        self._fns_with: Any = None   # fit's own train function when those in _fns were traced
        self._plain: tuple[Any, Any] | None = None
        self._saved_step: Any = None
        self._installed = False
        # the model's own train function(s), put back after fit
        self._own: tuple[Any, Any] = (None, None)
        self._kept: _Kept | None = None              # ours, from the last fit
        self._warned_no_loss = False
        self.told_own_loss = False   # the step's loss is its own, not compute_loss's (logged once)
        self._warned_calls = False   # the step called the model more than once (warned once)
        self._types: list[str] = []
        self._rename: dict[str, str] = {}
        #: what to do where the step never calls the model (ends the refusal's message)
        self.no_call = "a custom train_step? use source='probe'"
        #: what to do instead where the capture is refused (ends such messages)
        self.instead = "use source='probe'"
        #: why the capture was refused: the callback records the probe instead where nothing was
        #: written from this step capture yet, else it disables itself at that step's end
        self.mismatch: str | None = None
        self.fatal = False   # the refusal is a setting the probe refuses too (groups=): no fallback

    # ---- the wrapper ---------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap ``model.train_step`` (an instance attribute; the class's method is untouched). fit
        then builds its train function with the wrapper, unless the functions kept from an
        earlier fit of this model still hold (same compile, the model's own function untouched
        since): those are reused, so a fit per epoch does not trace the step again each time."""
        if self._installed:
            return
        model = self.model
        refuse_unsupported(model)
        self._saved_step = model.__dict__.get("train_step")
        self._own = (model.train_function, getattr(model, "train_tf_function", None))
        original = model.train_step

        def train_step(data):
            key = self.current
            if key is None:
                return original(data)
            return self._capturing_step(lambda: original(data), unpack(data), key)

        object.__setattr__(model, "train_step", train_step)
        kept, self._kept = self._kept, None
        if kept is not None and self._reusable(kept):
            _set_train_function(model, kept.wrapped)
            self._fns, self._fns_with = kept.capturing, kept.wrapped[0]
        else:
            model.train_function = None
            self._fns = {}
        self._installed = True

    def _reusable(self, kept: "_Kept") -> bool:
        """Whether the functions kept from the last fit still hold: the same compile, and the
        model's own train function untouched since."""
        return kept.own is self.model.train_function \
            and identical(kept.compiled, _compiled(self.model))

    def reuses_kept(self) -> bool:
        """Whether the next ``install`` reuses the last fit's functions, and so this catalog;
        if not (compile() ran since), fit traces the step anew: a new StepGraph names its
        catalog."""
        return self._kept is not None and self._reusable(self._kept)

    def abandon(self) -> None:
        """After a fit that ended by an exception (Keras skips on_train_end, so ``uninstall``
        never ran): the model's own train_step back, and nothing of that fit reused. Its
        functions were traced with that fit's compile, and putting one back would train the
        next fit with an old optimizer and loss."""
        if not self._installed:
            return
        if self._saved_step is None:
            self.model.__dict__.pop("train_step", None)
        else:
            object.__setattr__(self.model, "train_step", self._saved_step)
        self.model.train_function = None   # rebuilt by fit from the model's own step
        self.current, self._plain, self._kept, self._fns, self._installed = \
            None, None, None, {}, False

    def uninstall(self) -> None:
        """The model's own ``train_step`` and train function back; ours are kept for its next
        fit."""
        if not self._installed:
            return
        model = self.model
        wrapped = (model.train_function, getattr(model, "train_tf_function", None))
        if self._saved_step is None:
            model.__dict__.pop("train_step", None)
        else:
            object.__setattr__(model, "train_step", self._saved_step)
        _set_train_function(model, self._own)
        self._kept = _Kept(_compiled(model), self._own[0], wrapped, self._fns)
        self._fns = {}
        self._installed = False

    def use(self, key: Key | None) -> None:
        """``fit``'s next step runs the capturing function for ``key`` (None: its own function)."""
        model = self.model
        if key is None:
            if self._plain is not None:
                _set_train_function(model, self._plain)
            self.current, self._plain = None, None
            return
        if self._plain is None:
            if self._fns and self._fns_with is not model.train_function:
                # fit's function was rebuilt since ours were traced
                # (make_train_function(force=True), e.g. by a callback that froze a layer): ours
                # would still train what the old one did. Fit trains with its own from here; the
                # catalog cannot follow a new step.
                self._fns = {}
                raise RuntimeError("fit's train function was rebuilt during this fit "
                                   "(make_train_function(force=True), e.g. after changing "
                                   "layer.trainable): source='train_batch' captures the step it "
                                   "traced first and cannot follow it; fit goes on with the new "
                                   "function unrecorded. Rebuild it between fits (compile() "
                                   "again), or use source='probe'")
            self._plain = (model.train_function, getattr(model, "train_tf_function", None))
            self._fns_with = model.train_function
        if key not in self._fns:
            # tf.keras 2.15 returns and sets the function; Keras 3 only sets it
            model.make_train_function(force=True)
            self._fns[key] = model.train_function
        self.current = key           # read while fit traces the function on this step
        _set_train_function(model, (self._fns[key], None))

    # ---- inside the traced step ----------------------------------------------------------------
    def _capturing_step(self, run: Callable[[], Any], data: tuple, key: Key):
        """``run()`` (the step: fit's ``train_step(data)``, a custom loop's step function) traced
        with the capture over the ops it builds; ``data`` = (x, y, sample_weight), x None for the
        model's own input (its first call's argument)."""
        g = tf.compat.v1.get_default_graph()
        x, y, sw = data
        box: dict = {}
        self.has_targets, self.has_sample_weight = y is not None, sw is not None
        with record_calls(self.model, g) as calls, recorded_loss(self.model, box), \
                shared_backward(self, g, box, lambda extra: self._refusing(
                    lambda: self._capture_step(g, (x, y, sw), calls, box, key, extra))):
            logs = run()
        out = box.get("out")
        # the step's gradients were not the loss's (a scaled loss): its own pass
        if out is None and not self.mismatch:
            out = self._refusing(lambda: self._capture_step(g, (x, y, sw), calls, box, key, ()))
        if not self.mismatch and replicas.primary():   # the others' results are the first's
            self._refusing(lambda: self._finish(key, out))
        if self.mismatch:
            return logs   # fit's step as it is; its capture is refused (mismatch)
        if self.graph_def is None:
            self.graph_def = g.as_graph_def(add_shapes=True).SerializeToString()
            self.account(g)
        return logs

    def _refusing(self, build):
        """``build()``, or None where it raised: an error raised here would end fit's trace of its
        train function, and so the fit (a custom step that never calls the model must not crash
        fit, and with strict=False must not raise at all). It is kept in ``mismatch`` instead, the
        step trains as it is, and the callback refuses at the step's end (logged, or raised if
        strict)."""
        try:
            return build()
        except GroupsError as e:   # a setting to change: the probe would refuse it too
            self.mismatch, self.fatal = self.mismatch or str(e), True
            return None
        except Exception as e:   # noqa: BLE001 - any failure of the capture, never the step's
            # own code
            self.mismatch = self.mismatch \
                or f"the step capture failed while fit traced its train step: {e}"
            return None

    def _finish(self, key: Key, out: dict) -> None:
        """The updates after the step, and every result into its variable (``_store``)."""
        with tf.name_scope("tf_inspector"):
            out.update(self._updates(key))
            # the layout's order, one matrix each: 3 reads after the step, not 6
            if "update_stats" in out:
                rows = out.pop("update_stats")
                out["stats"] = concat_stats([out["stats"], rows]) if out.get("stats") else rows
            self._store(key, out)

    def _capture_step(self, g, data, calls, box: dict, key: Key, extra) -> dict:
        """The capture over the ops the step built so far (the model's call and its loss)."""
        x, y, sw = data
        ops = g.get_operations()
        name = layer_paths(self.model)[id(self.model)]
        call = next((c for c in calls if c.path == name and c.call == 0 and c.end >= 0), None)
        if call is None:
            raise RuntimeError(f"the train step of {name} did not call the model: {self.no_call}")
        if x is None:   # a custom loop's step: the model's input is what its first call got
            x = call.inputs
        again = sum(c.path == name and c.end >= 0 for c in calls) - 1
        if again and not self._warned_calls:
            self._warned_calls = True   # a custom train_step with two views of the batch, say
            log.warning("the train step of %s calls the model %d times: the capture records the "
                        "ops of its first call (their values and d loss / d output), not those of "
                        "the other %d", name, again + 1, again)
        # the loss the step computed, targets or none (fit(x) with add_loss terms only): the one
        # it differentiates, so the step's own gradients come from it (shared_backward)
        loss = box.get("loss")
        if loss is None and self.options.gradients and not self._warned_no_loss:
            # a custom train_step whose update is not a tape's gradient of a loss
            self._warned_no_loss = True
            log.warning("the train step of %s neither called model.compute_loss nor differentiated "
                        "a loss w.r.t. the model's weights with tf.GradientTape: no loss tensor, "
                        "so no gradients are captured (forward values only); compute the loss with "
                        "self.compute_loss(...) in train_step, or differentiate it with "
                        "tape.gradient(loss, self.trainable_variables)", name)
        lo, hi = box.get("ops", (0, 0))
        # a loss of the step's own: built after the model's call
        lo = call.end if lo is None else lo
        with tf.name_scope("tf_inspector"):
            outputs = box.get("y_pred")
            return self._capture(g, (x, y, sw), ops[call.start:call.end], ops[lo:hi], loss, calls,
                                 *key, extra=extra,
                                 outputs=call.output if outputs is None else outputs)

    def _updates(self, key: Key) -> dict:
        """Each variable's update in the graph: a read created after the step's optimizer (automatic
        control dependencies order it after the update) minus the record's value, the step's own
        read before it; with their statistics (the rows after the in-graph ones) on a
        statistics step, the arrays on a dump step. No copy of the weights leaves the graph."""
        stats, dump = key
        with tf.name_scope("updates"):
            g = tf.compat.v1.get_default_graph()
            delta = {r.variable: tf.subtract(tf.raw_ops.ReadVariableOp(
                         resource=g.capture(read_handle(_tf_var(v))), dtype=r.tensor.dtype),
                         r.tensor)
                     for r, v in self.traced_variables}
            out: dict = {}
            if stats and delta:
                out["update_stats"] = update_stats(list(delta.values()), self.options.native_stats)
            if dump and delta:
                out["update"] = delta
        return out

    def _remember(self, everything, records, sel, loss, labels, tf_vars) -> None:
        """The first trace names the catalog. A retrace (fit's function retraces for the smaller
        last batch of an epoch) may name the same ops otherwise (Keras 3 numbers name scopes
        per trace): it must capture the same ops in the same order, and its names are mapped
        to the first trace's."""
        types = [c.catalog_entry()["op_type"] for c in everything]
        if self._names is None:
            super()._remember(everything, records, sel, loss, labels, tf_vars)
            self._types, self._rename = types, {}
            return
        if types != self._types:
            # not raised here: this runs inside fit's trace, and training must go on without us
            self.mismatch = (f"tracing fit's train step again captured other ops ({len(types)} "
                             f"tensors, {len(self._types)} the first time): this model's step is "
                             f"not deterministic; {self.instead}")
            return
        self._rename = {c.name: first for c, first in zip(everything, self._names)}

    def _renamed(self, key: str) -> str:
        kind, _, name = key.partition("/")
        return f"{kind}/{self._rename.get(name, name)}"

    def _store(self, key: Key, out: dict) -> None:
        """Assign every result to a variable (created once, eagerly, shape free: the last batch
        of an epoch may be smaller), so the callback reads them after the step."""
        if "dump" in out and self._rename:
            out["dump"] = {self._renamed(k): v for k, v in out["dump"].items()}
            self.aliases = {self._renamed(k): self._renamed(v) for k, v in self.aliases.items()}
        leaves = _paths(out)
        known = self._outputs.get(key)
        if known is None:
            # created eagerly, outside tf.function's variable lifting: a variable that a first
            # trace creates makes tf.function trace the whole step a second time
            # (its no-variable-creation function), the capture's largest fixed cost
            with tf.init_scope():
                known = [(path, tf.Variable(tf.zeros([0] * max(t.shape.rank or 0, 0), t.dtype),
                                            trainable=False, shape=tf.TensorShape(None),
                                            name="tf_inspector_out",
                                            experimental_enable_variable_lifting=False))
                         for path, t in leaves]
            self._outputs[key] = known
        if [p for p, _ in known] != [p for p, _ in leaves]:
            raise RuntimeError("tracing the train step again gave other captured tensors than its "
                               "first trace")
        for (_, var), (_, t) in zip(known, leaves):
            var.assign(t)

    # ---- after the step ------------------------------------------------------------------------
    def results(self, key: Key) -> dict:
        """The step's captured results, as ``ProbeGraph.function(...)()`` returns them (numpy)."""
        out: dict = {}
        for path, var in self._outputs[key]:
            node = out
            for p in path[:-1]:
                node = node.setdefault(p, {})
            node[path[-1]] = _value(var)
        if "stats" in out:   # the captured tensors' rows, then the updates' (_capturing_step)
            out["stats"] = tuple(out["stats"][i] for i in range(len(out["stats"])))
        if key[0] and "stats" not in out:
            out["stats"] = ()    # nothing to compute statistics of
        return out


def _value(var: tf.Variable):
    """``var.numpy()`` by the bare read op: ``numpy()`` adds an Identity and Python around it,
    several times the read's own cost, on every read of a statistics step."""
    try:
        handle = var.handle
    except ValueError:   # a distributed variable has no one handle outside a replica: its own read
        return var.numpy()
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=var.dtype).numpy()


@dataclass
class _Kept:
    """A fit's train functions, reused by the next fit of the same model while ``compiled`` (the
    optimizer and compiled loss objects) and the model's own function ``own`` are unchanged:
    ``compile`` replaces both, and a fit without the callback may have rebuilt ``own``. Both
    are compared by identity (the references kept here also stop an id being reused)."""
    compiled: tuple
    own: Any
    wrapped: tuple[Any, Any]          # (train_function, train_tf_function) tracing the wrapper
    capturing: dict[Key, Any]


def _compiled(model) -> tuple:
    """What ``compile`` replaces: the optimizer and the compiled loss (Keras 3 / tf.keras 2.15),
    from the instance's own attributes (Keras 3's class has a method named compiled_loss)."""
    return model.optimizer, model.__dict__.get("_compile_loss"), model.__dict__.get("compiled_loss")


def compile_state(model) -> tuple:
    """The objects a trace of the model's step depends on besides its code: compile()'s
    optimizer and loss, and the trainable variables (compared by :func:`identical`)."""
    return (*_compiled(model), *model.trainable_variables)


#: Keras 3 (tf.keras 2.15 is 2.x)
KERAS3 = int(str(getattr(tf.keras, "__version__", None)
                 or __import__("keras").__version__).split(".")[0]) >= 3

#: fit's train functions (by weak reference) -> the variables trainable when one was traced,
#: held (so no id compared is reused by another variable). For every callback: a new callback
#: per fit (a notebook cell run again) sees what the model's function was traced with too.
_TRAINED: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()


class TrainedVariables:
    """Which variables fit's train function updates: those trainable when it was traced.

    Keras traces the train step once, at the first call of the function ``make_train_function``
    made, and fit reuses it until ``compile()`` or ``make_train_function(force=True)``. A layer
    frozen or unfrozen since trains as before (Keras 3 between fits: a frozen layer's weights
    would still update, its records gone; either Keras within a fit; tf.keras
    2.15's fit restores the flags of compile() time). Records of ``model.trainable_variables``
    would then leave out weights that train, or show ones that do not: refused (:meth:`check`)."""

    def __init__(self) -> None:
        self._new: Any = None                 # a function first seen at a step's begin

    def check(self, model) -> None:
        """At a step's begin: ValueError naming the variables where ``model.trainable_variables``
        differs from those fit's train function was traced with. A function not seen before is
        traced by this step (or was, by a fit without this callback: unknown, taken as is).
        Keras 3 only: tf.keras 2.15's fit puts compile()'s flags back for its length, so what
        trains is what it reports; a train_step that sets flags itself (a GAN's) would read as
        a mismatch there, and a fit that trains as reported must not be refused)."""
        if not KERAS3:
            return
        fn = model.train_function
        held = _TRAINED.get(fn) if fn is not None else None
        if held is None:
            self._new = fn
            return
        now = list(model.trainable_variables)
        ids = {id(v) for v in now}
        still = [variable_name(v) for v in held if id(v) not in ids]
        known = {id(v) for v in held}
        idle = [variable_name(v) for v in now if id(v) not in known]
        if still or idle:
            raise ValueError(mismatch_message(still, idle))

    def traced(self, model) -> None:
        """At a step's end: a function first seen at its begin was traced with the variables
        trainable now (a layer built inside the step has its weights by then). Where the step
        capture ran instead, fit's own is traced at its first unsampled step: with the same
        variables, unless trainable changes in between (then the next check refuses)."""
        if self._new is not None:
            _TRAINED[self._new], self._new = list(model.trainable_variables), None


def mismatch_message(still: list[str], idle: list[str]) -> str:
    """What fit trains against what ``trainable`` says, and what to do."""
    parts = ([f"still updates {', '.join(still)} (trainable=False now)"] if still else []) + \
        ([f"does not update {', '.join(idle)} (trainable=True now)"] if idle else [])
    return ("model.trainable_variables changed since fit's train function was built: it "
            f"{' and '.join(parts)}. Keras builds the train step once and reuses it until "
            "compile(), so setting layer.trainable without compile() does not change what fit "
            "trains, and InspectCallback would record other variables than those trained. Call "
            "model.compile(...) again after changing trainable (or "
            "model.make_train_function(force=True)), then fit")


def identical(a: tuple, b: tuple) -> bool:
    """The same objects, one for one (by identity: a new compile makes new ones)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _set_train_function(model, fns: tuple[Any, Any]) -> None:
    """Swap fit's train function by plain attribute writes. The model's own ``__setattr__``
    tracks a new value as a checkpoint dependency (tf.keras 2.15 walks every layer's weights
    for it, and a sampled step makes four writes); the functions swapped
    in are fit's own, which Keras tracked when it made them."""
    object.__setattr__(model, "train_function", fns[0])
    if fns[1] is not None:
        object.__setattr__(model, "train_tf_function", fns[1])


def _paths(out: dict, prefix: tuple = ()) -> list[tuple[tuple, tf.Tensor]]:
    """Flatten ``{"stats": (a, b, c), "dump": {name: t}, ...}`` into (path, tensor) pairs, in
    order."""
    items: list[tuple[tuple, tf.Tensor]] = []
    for k in sorted(out) if isinstance(out, dict) else range(len(out)):
        v = out[k]
        if isinstance(v, (dict, tuple, list)):
            items += _paths(v, prefix + (k,))
        else:
            items.append((prefix + (k,), tf.convert_to_tensor(v)))
    return items
