"""Graph side of ``InspectCallback``: trace a Keras model and its compiled loss into a
``tf.function`` graph and run the hook's capture machinery over that graph's ops.

The traced function returns the statistics and dumps that ``DumpHook`` would fetch from a
v1 graph; the catalog (``Captured`` records, with the Keras layer owning each op) is built
once, while tracing. Everything here is TensorFlow; ``hooks/keras/callback.py`` is the callback.

Example::

    probe = ProbeGraph(model, x, y, options)            # options: ProbeOptions
    fn = probe.function(stats=True, dump=False)         # a concrete function (traced once)
    out = fn(*probe.args)                               # {"stats": (values, hist splits, index,
                                                        # count)}
    probe.captured                                      # catalog, in statistics row order
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from hooks import capture
from hooks.capture import batch_axis
from hooks.capture import feeds
from hooks.recorders import loss_and_labels
from hooks.capture import source_lines
from hooks.capture.groups import GroupSpec
from hooks.keras import replicas
from hooks.variables import VariableRecord, selected
from hooks.stats import fast as fast_stats
from inspector.format.accounting import OUTSIDE

log = logging.getLogger("tf_inspector")


@dataclass
class ProbeOptions:
    """What to capture (the same meaning as ``DumpHook``'s arguments)."""
    filters: dict
    positive: Callable | Any = None
    samples_per_group: int = 2
    gradients: bool = True
    native_stats: bool = True
    training: bool = False
    batch_overrides: dict = field(default_factory=dict)
    groups: GroupSpec = field(default_factory=lambda: GroupSpec("positive_negative"))


# ---- which Keras layer owns each op ------------------------------------------------------------
def layer_paths(model) -> dict[int, str]:
    """id(layer) -> its path below ``model`` ('encoder/dense_1'), every nested layer once (a
    layer reachable along two paths keeps the first). Uses the private ``_flatten_layers``
    (tf.keras 2.15 and Keras 3 both have it): public ``layers`` misses a custom layer's
    sublayers."""
    out: dict[int, str] = {}

    def walk(layer, prefix: str) -> None:
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if id(child) in out:
                continue
            path = f"{prefix}{child.name}"
            out[id(child)] = path
            walk(child, path + "/")
    out[id(model)] = model.name
    walk(model, model.name + "/")
    return out


@dataclass
class _Call:
    path: str
    call: int          # 0 for a layer's first call in the trace, 1 for its second (shared layers)
    start: int         # ops created in [start, end) belong to it unless a nested call claims them
    end: int = -1
    output: Any = None   # what the call returned
    inputs: Any = None   # its first argument (the model's input, in a step that calls it)


@contextlib.contextmanager
def record_calls(model, graph: tf.Graph) -> Iterator[list[_Call]]:
    """While tracing: which op-creation interval each layer call spans.

    Wraps ``call`` of every layer with an instance attribute for the duration of the trace (the
    class's method is put back after): Keras has no public per-call hook, and name scopes are
    ambiguous for a shared layer ('dense_1' is the second call of 'dense' or a layer 'dense_1')."""
    paths = layer_paths(model)
    layers = {id(layer): layer
              for layer in model._flatten_layers(include_self=True, recursive=True)}
    calls: list[_Call] = []
    counts: dict[int, int] = {}
    saved = {}

    def wrap(layer, original):
        def call(*args, **kwargs):
            if tf.compat.v1.get_default_graph() is not graph:
                # Keras 3 runs an unbuilt layer's call once in a scratch graph to infer shapes:
                # not a call of this trace
                return original(*args, **kwargs)
            c = _Call(paths.get(id(layer), layer.name), counts.get(id(layer), 0),
                      len(graph.get_operations()), inputs=args[0] if args else kwargs.get("inputs"))
            counts[id(layer)] = c.call + 1
            calls.append(c)
            try:
                c.output = original(*args, **kwargs)
                return c.output
            finally:
                c.end = len(graph.get_operations())
        return call

    try:
        for key, layer in layers.items():
            saved[key] = layer.__dict__.get("call")
            object.__setattr__(layer, "call", wrap(layer, layer.call))
        yield calls
    finally:
        for key, layer in layers.items():
            if saved.get(key) is None:
                layer.__dict__.pop("call", None)
            else:
                object.__setattr__(layer, "call", saved[key])


def owners(ops: Sequence[tf.Operation], calls: Sequence[_Call]) -> dict[str, _Call]:
    """op name -> the innermost layer call that created it (ops outside every call: absent)."""
    out: dict[str, _Call] = {}
    # outer calls first: an inner call (later start, or same start and shorter) overwrites
    for c in sorted(calls, key=lambda c: (c.start, -(c.end - c.start))):
        for op in ops[c.start:c.end]:
            out[op.name] = c
    return out


# ---- the loss, without touching the training metrics -------------------------------------------
def metric_variables(model) -> list:
    """Variables of the model's metrics (the loss tracker included), deduplicated."""
    seen, out = set(), []
    candidates = list(getattr(model, "metrics_variables", None) or [])
    for m in getattr(model, "metrics", []):
        candidates += list(m.variables)
    for v in candidates:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def seed_states(model) -> list:
    """Keras 3's random seed generators' state variables of the model (dropout draws advance
    them); tf.keras 2.15's stateful random ops have none."""
    return [v for v in getattr(model, "non_trainable_variables", [])
            if str(getattr(v, "path", "")).endswith("seed_generator_state")]


@contextlib.contextmanager
def metrics_untouched(model) -> Iterator[None]:
    """Inside a traced function: whatever the body does to the model's metric variables and
    random seed states is undone.

    ``compute_loss`` also updates the loss trackers that ``fit`` reports (tf.keras 2.15: the
    loss mean; Keras 3: per-output losses): their values are read before and assigned back
    after, so the progress bar and History never see the probe (automatic control dependencies
    order the reads, the body and the assignments). A probe in training mode draws dropout
    masks from Keras 3's seed generators: their states are put back too, so training draws
    the masks it would without the callback."""
    tracked = [_tf_var(v) for v in metric_variables(model) + seed_states(model)]
    with tf.name_scope("tf_inspector/metrics"):
        before = [tf.identity(v.read_value()) for v in tracked]
    yield
    with tf.name_scope("tf_inspector/metrics"):
        for v, b in zip(tracked, before):
            v.assign(b)


@contextlib.contextmanager
def metrics_not_updated(model) -> Iterator[None]:
    """While tracing the probe's loss: the model's metrics' ``update_state`` does nothing (an
    instance attribute, removed after). Their values would be put back anyway
    (:func:`metrics_untouched`); under a distribution strategy with several replicas tf.keras
    2.15's loss tracker is a sync-on-read variable that cannot even be updated outside a replica,
    which made the probe fail there."""
    saved = {}
    for m in getattr(model, "metrics", []):
        saved[id(m)] = (m, m.__dict__.get("update_state"))
        object.__setattr__(m, "update_state", lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for m, own in saved.values():
            if own is None:
                m.__dict__.pop("update_state", None)
            else:
                object.__setattr__(m, "update_state", own)


def _tf_var(v) -> tf.Variable:
    """The tf.Variable behind a Keras 3 variable (``.value``), or ``v`` itself (tf.keras 2.15)."""
    return v if isinstance(v, tf.Variable) else v.value


def read_handle(var: tf.Variable) -> tf.Tensor:
    """The handle a read of ``var`` goes through here: its own, or outside a replica a
    distributed variable's component on this device (else its primary), the one its reads in
    cross-replica context use (private ``_get_on_device_or_primary``: a distributed variable
    has no one handle there)."""
    try:
        return var.handle
    except ValueError:
        component = getattr(var, "_get_on_device_or_primary", None)
        if component is None:
            raise
        return component().handle


def variable_name(v) -> str:
    """'dense/kernel': Keras 3's ``path``, else the tf.Variable name without ':0'."""
    path = getattr(v, "path", None)
    return path if isinstance(path, str) else v.name.split(":")[0]


def variable_names(model) -> dict[int, str]:
    """id(variable) -> its record's name: :func:`variable_name`, and where nested models repeat
    one (tf.keras 2.15: two sub-models' ``proj/kernel``), ``#2``, ``#3`` in the order of the
    layers that own them. Not in ``trainable_variables``' order: freezing or unfreezing a layer
    changes that, and a record would change which variable it holds between fits."""
    # id(variable) -> (its deepest layer's order, its index there)
    owner: dict[int, tuple[int, int]] = {}
    variables: dict[int, Any] = {}
    layers = {id(model): model,
              **{id(x): x for x in model._flatten_layers(include_self=False, recursive=True)}}
    # depth first: a nested layer after the one holding it
    for i, lid in enumerate(layer_paths(model)):
        for k, v in enumerate(getattr(layers.get(lid), "weights", None) or []):
            owner[id(v)], variables[id(v)] = (i, k), v
    names: dict[int, str] = {}
    seen: dict[str, int] = {}
    for vid in sorted(owner, key=owner.get):
        name = variable_name(variables[vid])
        seen[name] = seen.get(name, 0) + 1
        names[vid] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return names


def variable_layers(model) -> dict[int, str]:
    """id(variable) -> the path of the deepest layer holding it (:func:`layer_paths`): its
    record's ``keras_layer``, so that a per-layer view puts it with its layer's ops."""
    layers = {id(model): model,
              **{id(x): x for x in model._flatten_layers(include_self=False, recursive=True)}}
    out: dict[int, str] = {}
    for lid, path in layer_paths(model).items():   # depth first: a sublayer after its parent
        for v in getattr(layers.get(lid), "weights", None) or []:
            out[id(v)] = path
    return out


# ---- the probe graph -------------------------------------------------------------------------
class ProbeGraph:
    """The model's forward pass and compiled loss on a fixed batch, with every op's capture."""

    #: the batch the capture records, in messages (the training step's capture says its own)
    batch_words = "the probe batch"

    def __init__(self, model, x, y, sample_weight, options: ProbeOptions,
                 any_batch: bool = False) -> None:
        self.model, self.options, self.any_batch = model, options, any_batch
        self.args = tuple(a for a in (x, y, sample_weight) if a is not None)
        self._has_y, self._has_sw = y is not None, sample_weight is not None
        self.captured: list[capture.Captured] = []
        self.variables: list[VariableRecord] = []
        self.tf_vars: list = []    # the Keras variables of ``variables``, in order
        self.rows: list[tuple[str, str, str]] = []
        self.aliases: dict[str, str] = {}
        self.skipped: list[str] = []
        self.accounting: dict | None = None   # the manifest's (FORMAT.md), of graph_def's ops
        self._selection: capture.Selection | None = None   # the first trace's
        self.loss_name: str | None = None
        self.labels_name: str | None = None
        self.graph_def: bytes | None = None
        self.input_names: list[str] = []   # the model's inputs x in the traced graph
        self._names: list[str] | None = None
        self._functions: dict[tuple[bool, bool], Any] = {}
        self.extra_gradients: list = []   # the last _capture's gradients of its ``extra``
        # the last _capture's (VariableRecord, Keras variable) pairs
        self.traced_variables: list = []
        self._warned_groups = False   # the batch axis was lost before the output (warned once)
        self._warned_loss = False     # compile() without a loss: forward values only (warned once)
        self.groups_entry: dict | None = None   # the manifest's ``groups`` (rule, names, codes)

    def function(self, stats: bool, dump: bool):
        """The concrete function computing the statistics and/or the dump (traced on first use)."""
        key = (stats, dump)
        if key not in self._functions:
            fn = tf.function(lambda *a: self._body(stats, dump, *a), autograph=False)
            concrete = fn.get_concrete_function(*self._specs())
            if self.graph_def is None:
                self.graph_def = concrete.graph.as_graph_def(add_shapes=True).SerializeToString()
                self.account(concrete.graph)
            self._functions[key] = concrete
        return self._functions[key]

    def _specs(self) -> list:
        """Argument specs named probe_x, probe_y, probe_sample_weight (the placeholders' names);
        the batch axis is left free when ``any_batch`` (training batches: the last one is
        smaller)."""
        names = ["probe_x"] + ["probe_y"] * self._has_y + ["probe_sample_weight"] * self._has_sw

        def spec(t, n):
            shape = t.shape
            if self.any_batch and shape.rank:
                shape = tf.TensorShape([None]).concatenate(shape[1:])
            return tf.TensorSpec(shape, t.dtype, name=n)
        return [tf.nest.map_structure(lambda t, n=n: spec(t, n), a)
                for a, n in zip(self.args, names)]

    def _unpack(self, args):
        args = list(args)
        x = args.pop(0)
        y = args.pop(0) if self._has_y else None
        sw = args.pop(0) if self._has_sw else None
        return x, y, sw

    def _body(self, want_stats: bool, want_dump: bool, *args) -> dict:
        g = tf.compat.v1.get_default_graph()
        x, y, sw = self._unpack(args)
        with metrics_untouched(self.model):
            start = len(g.get_operations())
            with record_calls(self.model, g) as calls:
                y_pred = self.model(x, training=self.options.training)
            middle = len(g.get_operations())
            loss = self._probe_loss(x, y, y_pred, sw)
            end = len(g.get_operations())
        ops = g.get_operations()
        return self._capture(g, (x, y, sw), ops[start:middle], ops[middle:end], loss, calls,
                             want_stats, want_dump, outputs=y_pred)

    def _probe_loss(self, x, y, y_pred, sw) -> tf.Tensor | None:
        """The compiled loss on the probe (``compute_loss``: loss_weights, several outputs and
        add_loss terms as in fit), None without targets; None too, warned once, where
        ``compile()`` had no ``loss=`` and the model adds none (a ``train_step`` computing its
        loss by hand): the probe has no loss to differentiate, only the step has one."""
        if y is None:
            return None
        if not has_compiled_loss(self.model) and not self.model.losses:
            if not self._warned_loss:
                self._warned_loss = True
                log.warning("%s was compiled without loss= and adds no loss of its own (add_loss): "
                            "the probe runs the compiled loss, so it records forward values only, "
                            "no gradients; the loss a train_step of its own computes is recorded "
                            "by source='train_batch' (the default without probe=)", self.model.name)
            return None
        with metrics_not_updated(self.model):
            loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw)
        # under a strategy of n replicas Keras's compute_loss scales the loss by 1/n (each
        # replica's share of a sum over replicas: scale_loss_for_distribution, both Keras
        # versions); the probe is one pass over the whole batch, whose loss is n times that
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss

    def _capture(self, g, data, forward, loss_ops, loss, calls, want_stats: bool, want_dump: bool,
                 extra: Sequence[tf.Tensor] = (), outputs: Any = None) -> dict:
        """The capture over ``g``'s ``forward`` ops (the model's call), the inputs ``data`` =
        (x, y, sample_weight) and of ``loss_ops`` (what computing the loss built) only what the loss
        is computed from (not the loss trackers' updates): statistics and/or dump tensors.
        ``extra``: more tensors (a train step's variable handles) whose ``d loss / d t`` the same
        backward pass builds, left in ``self.extra_gradients`` as TensorFlow returns them.
        ``outputs``: the model's output (its ``y_pred``), to say where groups are lost before it."""
        x, y, sw = data
        ops = g.get_operations()
        region = {op.name for op in forward}
        region |= {t.op.name for t in tf.nest.flatten((x, y, sw)) if t is not None}
        of_loss = {name.rpartition(":")[0] for name in loss_and_labels.ancestors(loss)} \
            if loss is not None else set()
        region |= {op.name for op in loss_ops if op.name in of_loss}
        roles = capture.icnn_roles(g)   # an ICNNMask layer's registrations (hooks/keras/icnn.py)
        sel = capture.select_tensors(g, forced=[g.get_tensor_by_name(n) for n in roles],
                                     **self.options.filters).within(region)
        # a loop's body (an RNN's steps), a cond's branches: not ops of this graph, listed as
        # skipped
        inside = capture.function_body_tensors([op for op in ops if op.name in region],
                                               **self.options.filters)
        sel.skipped += inside
        sel.reasons.update(dict.fromkeys(inside, capture.IN_FUNCTION))
        tensors = [t for t in sel.tensors if t.op.name in region]
        labels = y if isinstance(y, tf.Tensor) else None
        axis = batch_axis.BatchAxis(g, labels, **self.options.batch_overrides)
        several = replicas.count() > 1
        # one replica of several: groups, samples and dumps index the global batch
        gx, gy, g_outputs = replicas.gather_batch([x, y, outputs]) if several else (x, y, outputs)
        gid = self._groups(gy, g_outputs)
        if gid is not None:
            self._warn_groups_lost(axis, x, outputs, tensors)
        handles, tf_vars = self._handles(g)
        wanted = tensors + handles if loss is not None and self.options.gradients else []
        # with `extra` (fit's tape sources) this pass is the training step's own, side effects and
        # all
        raw = capture.raw_gradients(loss, wanted + list(extra), observer=not extra) \
            if wanted or extra else []
        grads = ([capture.dense_gradient(d) for d in raw[:len(wanted)]] if wanted
                 else [None] * (len(tensors) + len(handles)))
        # under a LossScaleOptimizer whatever tensors are captured: the variables' gradients
        # come through the float16 backward pass too
        scale = loss_scale(self.model) if wanted and not extra else None
        if scale is not None:
            grads = scaled_gradients(loss, wanted, grads, scale)
        extra_gradients = raw[len(wanted):]
        grads = reaching(loss, tensors, grads)
        by_owner = owners(ops, calls)
        fields = capture.icnn_fields(g)
        captured = []
        for t, grad in zip(tensors, grads):
            c = capture.Captured(t, axis.is_batched(t), grad, *roles.get(t.name, (None, None)),
                                 extra=dict(fields.get(t.name, {})))
            owner = by_owner.get(t.op.name)
            c.extra.update(keras_layer=owner.path if owner else None,
                           keras_call=owner.call if owner else None,
                           batch_note=axis.note(t))
            captured.append(c)
        if several:
            sources = {t.name for t in tf.nest.flatten((x, y, sw)) if t is not None}
            captured, per_replica = replicas.split(captured, replicas.batch_dependent(ops, sources))
            sel.skipped += per_replica
            sel.reasons.update(dict.fromkeys(per_replica, replicas.PER_REPLICA))
        feeds.annotate(captured, g, set())
        records = self._variable_records(tf_vars, handles, grads[len(tensors):], region)
        # this trace's (a retrace has its own tensors)
        if replicas.primary():   # the replica whose results are written (_updates reads them)
            self.traced_variables = list(zip(records, tf_vars))
        read_of = {read: r.variable for r in records for read in r.reads}
        for c in captured:  # a read of a variable names it (FORMAT.md, catalog field `variable`)
            if c.name in read_of:
                c.extra["variable"] = read_of[c.name]
        everything = captured + records
        source_lines.annotate(everything, g)
        values = replicas.combine(everything) if several else everything
        # set after the last cross-replica step: replicas run in turn, one until it waits on the
        # others, so set any earlier another replica's trace would overwrite it before it is read
        self.extra_gradients = extra_gradients
        if not replicas.primary():   # the first replica names the catalog and writes the results
            return {}
        self._remember(everything, records, sel, loss, labels, tf_vars)
        self.input_names = [t.name for t in tf.nest.flatten(x) if t is not None]
        out: dict[str, Any] = {}
        if want_stats:
            st = fast_stats.build_stats(values, gid, self.options.native_stats)
            out["stats"] = st.tensors() if st is not None else ()
            self.rows = st.rows if st is not None else []
        if want_dump:
            out.update(self._dump(values, gid, gy if isinstance(gy, tf.Tensor) else None, gx))
        return out

    def _warn_groups_lost(self, axis: batch_axis.BatchAxis, x, outputs,
                          tensors: Sequence[tf.Tensor]) -> None:
        """Warn (once) where the batch axis leaves axis 0: tensors from there have ``all`` rows only
        and are dumped whole (after an LSTM, and under tf.keras 2.15 after a LayerNormalization
        or a Dense on sequences, even the logits have no positive/negative rows: the user must
        be told). Where it comes back (``batch_axis``: a reshape undoing a merge, a
        transpose back from time-major) the tensors after it have their groups again, and the
        warning names the ops in between; where it does not reach the model's output, it says so."""
        outputs = [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
        inputs = [t for t in tf.nest.flatten(x) if isinstance(t, tf.Tensor)]
        if self._warned_groups or not any(map(axis.is_batched, inputs)):
            return
        lost, moved = axis.lost_at(outputs), axis.moved_at(tensors)
        if not (lost or moved):
            return
        self._warned_groups = True
        if lost:
            log.warning("the batch axis of %s is lost at %s (an op no rule carries the batch "
                        "through: the catalog's batch_note says so per tensor): the tensors after "
                        "it, the model's output included, have group 'all' rows only and are "
                        "dumped whole; where axis 0 of such tensors is the batch, name them with "
                        "batched=", self.model.name, _listed(lost))
        else:
            log.warning("the batch axis of %s leaves axis 0 at %s (a reshape merging the batch "
                        "with time, a time-major transpose) and comes back before the output: the "
                        "%d tensors in between have group 'all' rows only and are dumped whole; "
                        "those after it have their groups",
                        self.model.name, _listed(moved),
                        sum(axis.moved_at([t]) != [] for t in tensors))

    def _groups(self, y, predictions) -> capture.Groups | None:
        """The sample groups of this batch (``groups=``, ``positive=``), built in the graph, and
        the manifest's ``groups`` entry for them. GroupsError where ``groups=`` does not fit."""
        spec, positive = self.options.groups, self.options.positive
        if y is None:
            self._no_groups(f"{self.batch_words} has no targets (y)")
            return None
        if spec.kind != "positive_negative":
            try:
                spec = class_count(spec, y, predictions)
                if spec.needs_predictions and predictions is None:
                    raise ValueError(f"groups={spec.fn!r} takes (y, y_pred), but the model's "
                                     "output in this step is not known; pass a function of y "
                                     "alone")
                built = spec.build(y, predictions)
            except ValueError as e:
                raise GroupsError(str(e)) from e
            self.groups_entry = {"rule": spec.describe(y) if isinstance(y, tf.Tensor)
                                         else spec.kind,
                                 "names": list(built.names), "codes": list(built.codes)}
            return built
        if positive is not None and not callable(positive):  # a fixed bool [N] for the fixed probe
            pos = tf.convert_to_tensor(positive)
            n = tf.nest.flatten(y)[0].shape[0]
            if pos.shape.rank != 1 or pos.shape[0] != n:
                raise ValueError(f"positive= as an array must be [N] = [{n}] (one flag per probe "
                                 f"sample), got shape {pos.shape}")
            return capture.positive_groups(pos, pos)
        if not isinstance(y, tf.Tensor):
            if callable(positive):
                return capture.positive_groups(y, positive)
            self._no_groups(f"{self.batch_words}'s targets are nested "
                            f"({len(tf.nest.flatten(y))} outputs): pass positive= or groups= (a "
                            "callable on the targets) for groups")
            return None
        # count_bad: a step's samples in no group (float targets) make its dump keep the
        # budget's first samples, ungrouped (capture.kept_samples), not none of them
        built = capture.positive_groups(y, positive, count_bad=True)
        rule = "positive/negative by the positive= argument" if positive is not None \
            else spec.describe(y)
        if self.groups_entry is None:   # once per capture, not per trace
            classes = output_width(predictions) or 0
            log.info("sample groups %s%s", rule,
                     f"; the model has {classes} outputs: groups='per_class' gives one group "
                     "per class" if positive is None and classes > 2 else "")
        self.groups_entry = {"rule": rule, "names": list(built.names), "codes": list(built.codes)}
        return built

    def _no_groups(self, why: str) -> None:
        """No labels give groups: the manifest's ``groups`` names none and says why (statistics
        and dumps are group ``all`` only); warned once per capture."""
        if self.groups_entry is None or self.groups_entry["names"]:
            log.warning("no sample groups for %s: %s; statistics have group 'all' only",
                        self.model.name, why)
        self.groups_entry = {"rule": f"none: {why}", "names": [], "codes": []}

    def groups_manifest(self) -> dict:
        """``{"groups": ...}`` for the manifest: the rule that grouped the samples, with the
        groups' names and codes; nothing where there were none."""
        return {"groups": self.groups_entry} if self.groups_entry is not None else {}

    def _handles(self, g) -> tuple[list[tf.Tensor], list]:
        """The function's placeholders of the model's trainable variables (d loss / d handle is
        d loss / d variable summed over every read, as ``tf.gradients(loss, variable)``)."""
        handles, out = [], []
        for v in self.model.trainable_variables:
            var = _tf_var(v)
            if not selected(variable_name(v), **self.options.filters):
                continue
            handles.append(g.capture(read_handle(var)))
            out.append(v)
        return handles, out

    def _variable_records(self, tf_vars, handles, grads, region: set[str]) -> list[VariableRecord]:
        records, stable, owner = [], variable_names(self.model), variable_layers(self.model)
        for v, handle, grad in zip(tf_vars, handles, grads):
            var = _tf_var(v)
            name = stable.get(id(v)) or variable_name(v)
            # reads in the captured region only (a train step's optimizer reads the variable too)
            found = [op.outputs[0] for op in handle.consumers() if op.type == "ReadVariableOp"
                     and not op.name.startswith("tf_inspector/") and op.name in region]
            reads = [t.name for t in found]
            # the model's own read where there is one: its statistics and dump are then shared
            # (fast_stats and build_dump compute a tensor once under every name)
            with tf.name_scope("tf_inspector/variables"):
                value = found[0] if found \
                    else tf.raw_ops.ReadVariableOp(resource=handle, dtype=var.dtype.base_dtype)
            records.append(VariableRecord(value, False, grad, variable=name,
                                          handle_op=handle.op.name, reads=reads, after=value,
                                          extra={"keras_layer": owner.get(id(v)),
                                                 "keras_call": None}))
        return records

    def _remember(self, everything, records, sel, loss, labels, tf_vars) -> None:
        names = [c.name for c in everything]
        if self._names is None:
            self._names, self.captured, self.variables, self.tf_vars = \
                names, everything, records, tf_vars
            self.skipped = [n for n in sel.skipped]
            self._selection = sel
            capture.log_unfetchable(sel)
            self.loss_name = loss.name if loss is not None else None
            self.labels_name = labels.name if labels is not None else None
        elif names != self._names:
            raise RuntimeError("tracing the probe again (for dumps) gave other tensor names than "
                               "the first trace: this model's forward pass is not deterministic; "
                               "capture statistics only (dump_every_n_steps=0) or report the model")

    def account(self, g) -> None:
        """The accounting of ``g``'s ops, the graph saved with the run, from the first trace's
        selection: what lies outside the model's call and its loss is excluded as
        ``accounting.OUTSIDE`` unless a default rule says it (the inspector's own ops)."""
        if self._selection is not None:
            self.accounting = capture.accounting(g.get_operations(), self._selection,
                                                 [c.name for c in self.captured],
                                                 self.options.filters, OUTSIDE)

    def _dump(self, captured, gid, labels, x) -> dict:
        first = tf.nest.flatten(x)[0]
        n = tf.shape(labels)[0] if labels is not None else tf.shape(first)[0]
        keep, kept_groups = capture.kept_samples(gid, n, self.options.samples_per_group)
        static = first.shape.as_list()[0] if first.shape.rank else None
        keep_all_of = capture.keeps_whole_batch(gid, static, self.options.samples_per_group)
        dump, aliases = capture.build_dump(captured, keep, keep_all_of)
        self.aliases = aliases
        samples = {"samples/index": keep}
        if kept_groups is not None:
            samples["samples/group"] = kept_groups
        if labels is not None \
                and (labels.dtype.is_floating or labels.dtype.is_integer
                     or labels.dtype == tf.bool):
            samples["samples/label"] = tf.gather(labels,
                                                 tf.boolean_mask(keep, keep < tf.shape(labels)[0]))
        return {"dump": dump, "samples": samples}


def _listed(names: Sequence[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


def reaching(loss: tf.Tensor | None, tensors: Sequence[tf.Tensor], grads: list) -> list:
    """``grads`` (the tensors' first, then the variables'), None for a tensor the loss is not
    computed from. ``tf.gradients`` over many tensors fills zeros for an unused output of a
    multi-output op whose other output the loss uses (an LSTM's final state outputs, batch
    norm's batch statistics, the cross entropy's backprop output): those get None, so that the
    catalog's ``has_gradient`` stays false for them rather than record gradients of zeros."""
    if loss is None:
        return grads
    reach = loss_and_labels.ancestors(loss)
    return [None if i < len(tensors) and tensors[i].name not in reach else g
            for i, g in enumerate(grads)]


class GroupsError(ValueError):
    """``groups=`` does not fit the model's targets or output (a setting to change, not the
    batch)."""


def has_compiled_loss(model) -> bool:
    """Whether ``compile()`` was given a loss (Keras 3: its ``_compile_loss``; tf.keras 2.15: a
    ``compiled_loss`` container with user losses)."""
    if "_compile_loss" in model.__dict__ or not hasattr(model, "compiled_loss"):
        return model.__dict__.get("_compile_loss") is not None
    container = model.__dict__.get("compiled_loss")
    return container is not None and getattr(container, "_user_losses", None) is not None


def output_width(predictions) -> int | None:
    """The last axis of the model's one output (logits or probabilities [N, C]: its class
    count), None where the model has several outputs or that axis is unknown."""
    outs = [t for t in tf.nest.flatten(predictions) if isinstance(t, tf.Tensor)]
    c = outs[0].shape[-1] if len(outs) == 1 and (outs[0].shape.rank or 0) >= 2 else None
    return None if c is None else int(c)


def class_count(spec: GroupSpec, y, predictions) -> GroupSpec:
    """``groups="per_class"`` with class-id targets and no ``num_classes``: the class count is
    the last axis of the model's one output (logits or probabilities [N, C]), as a ``fit``
    user's model states it. ValueError where there is no such axis."""
    if spec.kind != "per_class" or spec.num_classes is not None:
        return spec
    if not isinstance(y, tf.Tensor):
        raise ValueError("groups='per_class' needs the targets as one tensor; this model's are "
                         "nested (several outputs): pass groups=<function y -> {name: bool [N]}>")
    if y.shape.rank == 2 and y.shape[1] not in (None, 1):
        return spec   # one-hot: the class count is its last axis
    c = output_width(predictions)
    if c is None or c < 2:
        shapes = [tuple(t.shape) for t in tf.nest.flatten(predictions) if isinstance(t, tf.Tensor)]
        raise ValueError(f"groups='per_class' with class-id targets {tuple(y.shape)}: the class "
                         "count is neither given (num_classes=) nor the last axis of the model's "
                         f"output {shapes}; pass num_classes=")
    return dataclasses.replace(spec, num_classes=int(c))


def loss_scale(model) -> tf.Tensor | None:
    """The current loss scale of the model's ``LossScaleOptimizer`` (mixed precision; Keras 3:
    ``dynamic_scale``, tf.keras 2.15: ``loss_scale``), else None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or "LossScale" not in type(optimizer).__name__:
        return None
    scale = getattr(optimizer, "dynamic_scale", None)
    scale = getattr(optimizer, "loss_scale", None) if scale is None else scale
    if scale is None or callable(scale):
        return None
    # a Keras 3 variable's tf.Variable (tf.Variable.value is a method)
    held = getattr(scale, "value", None)
    return tf.cast(tf.convert_to_tensor(scale if held is None or callable(held) else held),
                   tf.float32)


def scaled_gradients(loss: tf.Tensor, tensors: Sequence[tf.Tensor], plain: list,
                     scale: tf.Tensor) -> list:
    """d loss / d t as mixed-precision training computes it (``capture.unscale``): the unscaled
    loss's float16 backward pass underflows (most of a ReLU layer's gradients read zero where
    the applied ones have none). One more
    backward pass, on sampled steps of mixed-precision models only."""
    raw = capture.raw_gradients(loss * tf.cast(scale, loss.dtype), list(tensors))
    return capture.unscale(raw, plain, scale)
