"""Graph side of the dump hook: which tensors to capture, their gradients, the dump fetches.

Everything here runs once, in ``DumpHook.begin()``, before the graph is finalized. The
result is three kinds of fetches: one fused statistics matrix per step, a dict of
full tensors (only the kept samples) for dump steps, and the kept samples' metadata.
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops   # get_gradient_function: tf.gradients' own lookup

from inspector.format import (DEFAULT_GROUPS, ICNN_COLLECTION, SHARED_GRADIENTS_COLLECTION, icnn_catalog_fields,
                              parse_icnn_entry, parse_shared_gradient_entry)
from inspector.accounting import DEFAULT_RULES, UNACCOUNTED, Rule, reason_kind, record, user_rules
from inspector.icnn.layer import observer_gradients
# the model's input op types (batch_axis uses capture.INPUT_OP_TYPES; the viewer, inspector.format's)
from inspector.format import INPUT_OP_TYPES  # noqa: F401

from .options import FLOAT_DTYPE_NAMES, CaptureOptions, compile_patterns
from .structure import on_device_of, value_source

log = logging.getLogger("tf_inspector")
v1 = tf.compat.v1

#: Name patterns left out by default: the backward pass, optimizers, saver, summaries, init
#: (``inspector.accounting.DEFAULT_RULES``, which names each rule).
DEFAULT_EXCLUDE = tuple(p for r in DEFAULT_RULES for p in r.patterns)
#: Op types never worth capturing (no values, constants, variable plumbing, summaries, I/O),
#: and blocking takes another run performs: SyncReplicasOptimizer's chief takes the aggregated
#: gradients in a queue runner of its own, and fetching one in a training step ran it there,
#: waiting forever for gradients.
DEFAULT_EXCLUDE_OP_TYPES = frozenset(t for r in DEFAULT_RULES for t in r.op_types)
FLOAT_DTYPES = tuple(tf.as_dtype(name) for name in FLOAT_DTYPE_NAMES)


@dataclass
class Captured:
    """One captured tensor and what the catalog says about it."""
    tensor: tf.Tensor
    batched: bool
    gradient: tf.Tensor | None = None
    icnn_layer: str | None = None
    icnn_role: str | None = None
    #: more catalog fields: feeds, zero_gradient_expected (structure.py), variable (variables.py)
    extra: dict = field(default_factory=dict)
    #: the groups of this tensor's own samples when they are not the labels' batch (a tower's
    #: slice, hooks/towers.py); None: the run's groups (batched tensors)
    grouping: "Groups | None" = None

    @property
    def name(self) -> str:
        return self.tensor.name

    def catalog_entry(self) -> dict:
        t, op = self.tensor, self.tensor.op
        shape = None if t.shape.rank is None else [d for d in t.shape.as_list()]
        return {"name": t.name, "op": op.name, "op_type": op.type, "dtype": t.dtype.name, "shape": shape,
                "scope": op.name.rpartition("/")[0], "has_gradient": self.gradient is not None,
                "batched": self.batched, "icnn_layer": self.icnn_layer, "icnn_role": self.icnn_role, **self.extra}


@dataclass
class Selection:
    tensors: list[tf.Tensor]
    skipped: list[str] = field(default_factory=list)   # names that cannot be fetched
    #: skipped name -> why it cannot be fetched
    reasons: dict[str, str] = field(default_factory=dict)
    #: a TF2 cond's output (not fetchable) -> the Identity tf.cond returned for it, captured:
    #: the same value under the name the model holds, so not skipped
    aliases: dict[str, str] = field(default_factory=dict)
    #: every other float output of the graph -> the rule that left it out (its id in
    #: ``inspector.accounting``: "backward", "constant", "include", ...)
    excluded: dict[str, str] = field(default_factory=dict)

    def within(self, ops: set[str]) -> Selection:
        """The same tensors and exclusions; the skipped tensors and aliases of ``ops`` only (what
        a Keras trace captures from: tensors outside it were never candidates, fetchable or not)."""
        def own(name: str) -> bool:
            return name.rpartition(":")[0] in ops
        return Selection(self.tensors, [n for n in self.skipped if own(n)],
                         {n: r for n, r in self.reasons.items() if own(n)},
                         {n: a for n, a in self.aliases.items() if own(n)}, self.excluded)


def filters_of(options: CaptureOptions) -> dict:
    """The tensor filters of ``options`` as ``select_tensors`` takes them, the dtypes TensorFlow's."""
    return dict(include=options.include, exclude=options.exclude, op_types=options.op_types,
                exclude_op_types=options.exclude_op_types, dtypes=as_dtypes(options.dtypes))


def as_dtypes(dtypes: Iterable) -> tuple[tf.DType, ...]:
    """``dtypes=`` as TensorFlow dtypes (names, numpy dtypes and ``tf.DType`` are all taken)."""
    out = []
    for d in dtypes:
        try:
            out.append(tf.as_dtype(d))
        except TypeError:
            raise ValueError(f"dtypes entry {d!r} is not a dtype: pass TensorFlow dtypes or their names, "
                             f"e.g. dtypes=[tf.float32] or dtypes=['float32']") from None
    return tuple(out)


#: TF2 (control flow v2) cond ops. cond_v2 marks each not fetchable (its gradient's variant
#: outputs cannot be fetched) and returns every branch output through an Identity.
V2_COND_OP_TYPES = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})
IN_V1_BODY = "inside a v1 while/cond body"


def _in_control_flow(op: tf.Operation) -> bool:
    """True if ``op``'s outputs live inside a v1 while/cond body, where they cannot be fetched."""
    # Private Operation._control_flow_context: no public test (TF 2.15, 2.21; docs/ARCHITECTURE.md).
    ctx = getattr(op, "_control_flow_context", None)
    if ctx is not None and op.type in ("Exit", "RefExit"):
        # a loop's Exit is created in the loop's context, but its output is the loop's
        # result, outside the loop: fetchable unless the loop is itself in a body
        ctx = ctx.outer_context
    return ctx is not None


#: stateful op types a v1 loop may hold and still be run by a fetch of its result with no
#: effect training could see: TensorArray and gradient-stack plumbing (resources of the run)
#: and variable reads
_LOOP_PLUMBING = ("TensorArray", "Stack", "ReadVariableOp")


def _loop_effects(graph: tf.Graph) -> dict:
    """v1 while context -> the stateful op types inside it (its nested bodies included) other
    than :data:`_LOOP_PLUMBING`: what running the loop runs (an assignment, a random op, an
    iterator's next element, a print)."""
    out: dict = {}
    for op in graph.get_operations():
        ctx = getattr(op, "_control_flow_context", None)   # private: see _in_control_flow
        if ctx is None or op.type.startswith(_LOOP_PLUMBING) or not _stateful(op):
            continue
        while ctx is not None:
            out.setdefault(ctx, set()).add(op.type)
            ctx = ctx.outer_context
    return out


#: stateful op types whose run changes nothing another run could see: variable handles and
#: reads, loops' TensorArray/stack plumbing, placeholders
_NO_EFFECT = ("ReadVariableOp", "VarHandleOp", "VariableV2", "VarIsInitializedOp", "TensorArray", "Stack",
              "Placeholder", "PlaceholderWithDefault")


def _stateful(op: tf.Operation) -> bool:
    try:
        return op.op_def.is_stateful
    except Exception:  # noqa: BLE001 - an op without an OpDef: count it as stateful
        return True


def ran_by_training(graph: tf.Graph, loss: tf.Tensor | None) -> set[str]:
    """Names of the ops a training run runs anyway: everything the loss, the UPDATE_OPS and the
    TRAIN_OP collections are computed from, data and control inputs alike."""
    v1 = tf.compat.v1
    roots = ([loss.op] if loss is not None else []) + [
        x if isinstance(x, tf.Operation) else x.op
        for key in (v1.GraphKeys.UPDATE_OPS, v1.GraphKeys.TRAIN_OP) for x in graph.get_collection(key)
        if isinstance(x, (tf.Operation, tf.Tensor))]
    return upstream(roots)


def upstream(roots: Sequence[tf.Operation]) -> set[str]:
    """Names of ``roots`` and of every op they run after: data and control inputs, transitively."""
    seen, stack = {op.name for op in roots}, list(roots)
    while stack:
        op = stack.pop()
        for prev in [x.op for x in op.inputs] + list(op.control_inputs):
            if prev.name not in seen:
                seen.add(prev.name)
                stack.append(prev)
    return seen


def side_effects(graph: tf.Graph, ran: set[str]) -> dict[str, set[str]]:
    """op name -> the stateful op types outside ``ran`` that running it runs (its own, its
    inputs' and control inputs', a v1 loop's body for its Exit): what a fetch of its outputs
    would do that training does not (an assignment, an iterator's next element, a random
    draw). Ops with none are absent."""
    loops: dict | None = None
    out: dict[str, set[str]] = {}
    for op in graph.get_operations():   # creation order: an op's inputs come first
        if op.name in ran:
            continue
        own = {op.type} if _stateful(op) and not op.type.startswith(_NO_EFFECT) else set()
        for prev in [x.op for x in op.inputs] + list(op.control_inputs):
            own |= out.get(prev.name, set())
        if op.type in ("Exit", "RefExit"):   # its loop's body is not among its inputs' inputs yet
            loops = _loop_effects(graph) if loops is None else loops
            own |= loops.get(getattr(op, "_control_flow_context", None), set())
        if own:
            out[op.name] = own
    return out


#: op types that write their input 0's variable (resource and reference variables)
_WRITES = ("Assign", "ResourceApply", "ResourceSparseApply", "Apply", "SparseApply", "ResourceScatter", "Scatter")


#: TF2 control flow and function calls: a write inside (a loss-scale optimizer's update, in the
#: cond that skips it) is no op of the graph, and TRAIN_OP may name an op of the branch's graph
FUNCTIONAL = ("If", "Case", "While", "StatefulPartitionedCall")


def functional_writes(op: tf.Operation) -> list[str]:
    """The variables whose handles ``op`` (a TF2 cond, loop or call) takes, but those TensorFlow
    marks read-only (``_read_only_resource_inputs``, indices of ``op.inputs``; private, as
    automatic control dependencies read it, TF 2.15, 2.21): written inside, for all it shows."""
    try:
        read_only = set(op.get_attr("_read_only_resource_inputs"))
    except ValueError:
        read_only = set()
    return [t.op.name for i, t in enumerate(op.inputs) if t.dtype == tf.resource and i not in read_only]


def _before_all(graph: tf.Graph, read: str, writers: set[str], before: dict[str, set[str]]) -> bool:
    """Whether every writer is a TF2 cond or loop that runs after ``read`` (the loss scale read
    that scales the loss whose gradients the cond applies): then the read is ordered before."""
    for w in writers:
        op = graph.get_operation_by_name(w)
        if op.type not in FUNCTIONAL:
            return False
        if w not in before:
            before[w] = upstream([op])
        if read not in before[w]:
            return False
    return True


#: ops that hand a variable's handle or reference on unchanged: v1 control flow's (an update
#: in a v1 cond takes its variable through a Switch, one in a v1 loop through an Enter) and
#: identities
_PASSES = ("Switch", "RefSwitch", "Enter", "RefEnter", "Identity", "RefIdentity")


def write_target(t: tf.Tensor) -> str:
    """The name of the op ``t`` (a write's variable input) comes from, through :data:`_PASSES`:
    the variable's, where it is one. Under v1 control flow (TF1 code, a TF1 loss-scale
    optimizer's cond) every update takes its variable through a Switch; taken by that name the
    writes would not be seen (reference variables' reads would dump the weights after the
    update; the global step's increment would not be found)."""
    op = t.op
    while op.type in _PASSES and op.inputs:
        op = op.inputs[0].op
    return op.name


def written(graph: tf.Graph, ran: set[str]) -> dict[str, set[str]]:
    """variable op name -> the ops of training's run that write it (a TF2 cond or loop taking
    its handle, not read-only, included; one inside a v1 cond or loop, :func:`write_target`)."""
    writes: dict[str, set[str]] = {}
    for op in graph.get_operations():
        if op.name in ran and op.type.startswith(_WRITES) and op.inputs:
            writes.setdefault(write_target(op.inputs[0]), set()).add(op.name)
        elif op.type in FUNCTIONAL:
            for var in functional_writes(op):
                writes.setdefault(var, set()).add(op.name)
    return writes


def ref_aliases(graph: tf.Graph, ran: set[str]) -> dict[str, str]:
    """op name -> the reference (non-resource) variable whose buffer its output shares, for
    reads (``w/read``, and views of it: :func:`_may_forward`) of variables training's run writes.
    Such a read does not copy: the optimizer updates the buffer in place during the same run,
    so the fetched value is the weights after the update (``w2/read:0`` under
    ``disable_v2_behavior``), on the loss's path too.
    Resource variables copy on write and are not affected."""
    writes = written(graph, ran)
    out: dict[str, str] = {}
    for op in graph.get_operations():   # creation order: an op's inputs come first
        # the written reference variable each input is, or is a view of (None: neither)
        sources = [x.op.name if x.op.type in ("VariableV2", "Variable") and x.op.name in writes
                   else out.get(x.op.name) for x in op.inputs]
        src = next((v for v in sources if v is not None), None)
        if src is not None and _may_forward(op):
            out[op.name] = src
    return out


#: ops whose output may be (a part of) their input's buffer: TensorFlow's kernels forward it, or
#: slice it, rather than copy. Of a reference variable's read, such a view is the variable's
#: buffer too: Reshape, ExpandDims, StopGradient or CheckNumerics of ``w/read`` hold the weights
#: after the update, to the bit, not only an Identity of it
_VIEWS = frozenset({"Identity", "IdentityN", "RefIdentity", "StopGradient", "PreventGradient",
                    "Reshape", "ExpandDims", "Squeeze", "EnsureShape", "CheckNumerics", "CheckNumericsV2",
                    "Print", "Bitcast", "DebugIdentity", "DebugIdentityV2", "Slice", "StridedSlice",
                    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit"})


def _may_forward(op: tf.Operation) -> bool:
    """Whether ``op``'s output may share its input's buffer (:data:`_VIEWS`; unknown where it
    depends on values: yes). Those that do only for some arguments: Transpose keeping the
    order of the dimensions other than 1's, Tile by ones, a Pad of zeros, BroadcastTo the same
    shape, ReverseV2 of no axis, a Split or Unpack with nothing but 1's before its axis."""
    if op.type in _VIEWS:
        return True
    if op.type not in ("Transpose", "ConjugateTranspose", "Tile", "Pad", "PadV2", "MirrorPad", "BroadcastTo",
                       "ReverseV2", "Split", "SplitV", "Unpack") or not op.inputs:
        return False
    data = op.inputs[1] if op.type == "Split" else op.inputs[0]
    dims = data.shape.as_list() if data.shape.rank is not None else None
    try:
        if op.type == "Unpack":
            arg = op.get_attr("axis")
        else:
            arg = tf.get_static_value(op.inputs[0] if op.type == "Split" else
                                      op.inputs[2] if op.type == "SplitV" else op.inputs[1])
    except (ValueError, TypeError, IndexError):
        return True
    if arg is None:
        return True
    arg = np.asarray(arg)
    if op.type in ("Transpose", "ConjugateTranspose"):
        if dims is None:
            return True
        kept = [int(p) for p in arg.reshape(-1) if dims[int(p)] != 1]
        return kept == sorted(kept)
    if op.type == "Tile":
        return bool(np.all(arg == 1))
    if op.type in ("Pad", "PadV2", "MirrorPad"):
        return bool(np.all(arg == 0))
    if op.type == "BroadcastTo":
        return dims is None or None in dims or list(arg.reshape(-1)) == dims
    if op.type == "ReverseV2":
        return arg.size == 0
    if dims is None:   # Split, SplitV, Unpack: a slice of whole rows can be the input's buffer
        return True
    axis = int(arg.reshape(-1)[0]) % len(dims) if dims else 0
    return all(d == 1 for d in dims[:axis])


def unordered_reads(graph: tf.Graph, ran: set[str], of_loss: set[str]) -> dict[str, str]:
    """op name -> the variable it reads (or is computed from a read of) where training's run
    writes that variable and the read is not on the loss's path: nothing orders it against the
    write, so its value is the one before or after the update, by chance (the variable's own
    ``Read/ReadVariableOp`` can differ from the weights the step used, in about 1 of 40
    steps). A read on the loss's path runs before the update, which needs the gradient. A TF2
    cond or loop that takes a variable's handle, not read-only, counts as writing it (under a
    loss-scale optimizer the update sits in a cond's branch; run by training or not, which the
    branch's graph in TRAIN_OP does not tell)."""
    writes = written(graph, ran)
    out: dict[str, str] = {}
    before: dict[str, set[str]] = {}   # a TF2 cond or loop -> the ops it runs after
    for op in graph.get_operations():
        if op.name in of_loss:
            continue
        source = op.inputs[0].op if op.inputs else None
        if (source is not None and source.name in writes and op.type in ("ReadVariableOp", "Identity")
                and not writes[source.name] & upstream([op])   # a read after its write is ordered
                and not _before_all(graph, op.name, writes[source.name], before)):
            out[op.name] = source.name
            continue
        var = next((out[x.op.name] for x in op.inputs if x.op.name in out), None)
        if var is not None:
            out[op.name] = var
    return out


def _v2_cond_alias(t: tf.Tensor) -> tf.Tensor | None:
    """The fetchable Identity of ``t``, an output of a TF2 cond op (what tf.cond returned), if any."""
    if t.op.type not in V2_COND_OP_TYPES:
        return None
    return next((c.outputs[0] for c in t.consumers() if c.type == "Identity" and not _in_control_flow(c)
                 and c.graph.is_fetchable(c.outputs[0])), None)


def _why_unfetchable(graph: tf.Graph, t: tf.Tensor) -> str | None:
    """Why ``t`` cannot be fetched by ``Session.run``, or None if it can."""
    if _in_control_flow(t.op):
        return IN_V1_BODY
    if graph.is_fetchable(t):
        return None
    if t.op.type in V2_COND_OP_TYPES:
        return "a TF2 cond's output that TensorFlow marks not fetchable, with no Identity returned for it"
    return "marked not fetchable by TensorFlow"


#: TF2 loops, conds and function calls: the ops whose functions' insides ``function_body_tensors``
#: lists (not a tf.data op's map function: the input pipeline is not the model)
CALL_OP_TYPES = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                           "PartitionedCall", "StatefulPartitionedCall"})
#: attributes naming the functions a TF2 loop, cond or call runs (While, If, Case, PartitionedCall)
_FUNCTION_ATTRS = ("cond", "body", "then_branch", "else_branch", "branches", "f")
IN_FUNCTION = ("inside a TF2 function (a while loop's body or condition, a cond's branch, a called function such "
               "as a Keras LSTM/GRU's): not an op of the traced graph, it runs once per iteration or call and "
               "cannot be fetched; the loop's or call's outputs are captured")


def function_body_tensors(ops: Iterable[tf.Operation], *, include=None, exclude=None,
                          op_types: Iterable[str] | None = None, exclude_op_types: Iterable[str] | None = None,
                          dtypes: Sequence[tf.DType] = FLOAT_DTYPES) -> list[str]:
    """``<op>/<attribute>/<tensor>`` for each output computed inside the functions that ``ops``
    (TF2 loops, conds, function calls) run, nested ones included, that the filters would
    select: what the capture cannot fetch, to list as skipped, so that the manifest never
    claims a complete capture where, say, a Keras LSTM's gates (its while loop's body, or under
    tf.keras 2.15 a function holding the loop) were left out."""
    inc, exc = compile_patterns(include), compile_patterns(exclude) + compile_patterns(DEFAULT_EXCLUDE)
    skip = DEFAULT_EXCLUDE_OP_TYPES | set(exclude_op_types or ()) | {"Placeholder"}   # arguments come from outside
    names = _inside(ops, tuple(dtypes), set(op_types or ()), skip)
    return [n for n in names if (not inc or any(p.search(n) for p in inc)) and not any(p.search(n) for p in exc)]


def _inside(ops: Iterable[tf.Operation], dtypes: tuple, types: set[str], skip: frozenset[str]) -> list[str]:
    """:func:`function_body_tensors` before the name filters."""
    out: list[str] = []
    for op in ops:
        for prefix, body in _functions_of(op):
            inner = body.get_operations()
            out += [f"{prefix}/{t.name}" for o in inner if o.type not in skip and (not types or o.type in types)
                    for t in o.outputs if t.dtype.base_dtype in dtypes]
            out += [f"{prefix}/{n}" for n in _inside(inner, dtypes, types, skip)]
    return out


def _functions_of(op: tf.Operation) -> list[tuple[str, tf.Graph]]:
    """(``<op>/<attribute>``, the function's graph) for each function ``op`` runs; none where
    TensorFlow keeps no graph for it (private ``Graph._get_function``, TF 2.15, 2.21)."""
    out = []
    for attr in _FUNCTION_ATTRS:
        value = op.node_def.attr[attr] if attr in op.node_def.attr else None
        if value is None:
            continue
        one = value.HasField("func")
        for i, fn in enumerate([value.func] if one else value.list.func):
            found = _function_graph(op.graph, fn.name)
            if found is not None:
                out.append((f"{op.name}/{attr}" + ("" if one else f"/{i}"), found))
    return out


def _function_graph(graph: tf.Graph, name: str | None) -> tf.Graph | None:
    """The graph of the function ``name`` in ``graph``'s library or an enclosing graph's."""
    while name and graph is not None:
        find = getattr(graph, "_get_function", None)   # private: without it, nothing is listed
        fn = find(name) if find is not None else None
        if fn is not None:
            return getattr(fn, "graph", None)
        graph = getattr(graph, "outer_graph", None)
    return None


def _sort_unfetchable(unfetchable: list[tf.Tensor], captured: set[str]) -> Selection:
    """The skipped names with their reasons, and the TF2 cond outputs whose value is captured
    as the Identity tf.cond returned (an alias: not skipped)."""
    out = Selection([])
    for t in unfetchable:
        alias = _v2_cond_alias(t)
        if alias is not None and alias.name in captured:
            out.aliases[t.name] = alias.name
            continue
        out.skipped.append(t.name)
        out.reasons[t.name] = (_why_unfetchable(t.graph, t) if alias is None else
                               f"a TF2 cond's output that TensorFlow marks not fetchable; its value is "
                               f"{alias.name}, which the filters leave out")
    return out


def backward_ops(graph: tf.Graph, loss: tf.Tensor | None = None) -> set[str]:
    """Names of ops of any backward pass or optimizer (descendants of 'gradients' scopes).

    An op created before the first of those is forward, whatever it reads: the gradient of a
    TF2 ``tf.while_loop`` adds accumulator inputs (``gradients/while_grad/...``) to the
    forward ``While`` op, which made it, and everything after the loop (logits, the loss),
    a "descendant" of the backward pass, silently left out of the capture. So is every op the
    ``loss`` is computed from outside a 'gradients' scope: a gradient penalty (WGAN-GP) takes
    ``tf.gradients`` inside the forward pass, and the ops after it, the loss included, are
    the model's, not a backward pass's."""
    grad_re = re.compile(r"(^|/)gradients(_\d+)?/")
    ops = graph.get_operations()   # in creation order
    first = next((i for i, op in enumerate(ops) if grad_re.search(op.name)), len(ops))
    forward = {op.name for op in ops[:first]}
    if loss is not None:
        forward |= {name.rpartition(":")[0] for name in ancestors(loss) if not grad_re.search(name)}
    seeds = [op for op in ops[first:] if grad_re.search(op.name)]
    seen = {op.name for op in seeds}
    stack = list(seeds)
    while stack:
        op = stack.pop()
        # private Operation._control_outputs: the ops gated on this one (TF 2.15, 2.21)
        consumers = [c for out in op.outputs for c in out.consumers()] + list(op._control_outputs)
        for c in consumers:
            if c.name not in seen and c.name not in forward:
                seen.add(c.name)
                stack.append(c)
    return seen


def ancestors(t: tf.Tensor) -> set[str]:
    """Names of every tensor ``t`` is computed from (data inputs, transitively), ``t`` included."""
    seen, stack = {t.name}, [t]
    while stack:
        for x in stack.pop().op.inputs:
            if x.name not in seen:
                seen.add(x.name)
                stack.append(x)
    return seen


@dataclass
class _Filters:
    """The capture's filters, compiled, each naming its rule (``inspector.accounting``)."""
    include: list[re.Pattern]
    exclude: list[re.Pattern]                 # the user's
    defaults: list[tuple[re.Pattern, str]]    # the default name patterns and their rules
    types: set[str] | None                    # op_types=
    skip_types: dict[str, str]                # op type -> the rule that leaves it out
    dtypes: Sequence[tf.DType]

    def op_rule(self, op: tf.Operation, backward: set[str]) -> str | None:
        """The rule that leaves out every output of ``op``, or None."""
        if op.name in backward:
            return "backward"
        if op.type in self.skip_types:
            return self.skip_types[op.type]
        return "op_types" if self.types and op.type not in self.types else None

    def tensor_rule(self, t: tf.Tensor) -> str | None:
        """The rule that leaves out ``t`` (an output of an op no :meth:`op_rule` leaves out), or None."""
        if t.dtype.base_dtype not in self.dtypes:
            return "dtypes"
        if self.include and not any(p.search(t.name) for p in self.include):
            return "include"
        if any(p.search(t.name) for p in self.exclude):
            return "exclude"
        return next((rule for p, rule in self.defaults if p.search(t.name)), None)


def _filters(include, exclude, op_types, exclude_op_types, dtypes, use_default_exclude: bool) -> _Filters:
    skip = {t: r.rule for r in reversed(DEFAULT_RULES) for t in r.op_types}   # the first rule naming it wins
    skip = {**dict.fromkeys(exclude_op_types or (), "exclude_op_types"), **skip}
    defaults = [(re.compile(p), r.rule) for r in DEFAULT_RULES for p in r.patterns] if use_default_exclude else []
    return _Filters(compile_patterns(include), compile_patterns(exclude), defaults,
                    set(op_types) if op_types else None, skip, tuple(dtypes))


def accountable(t: tf.Tensor, dtypes: Sequence[tf.DType] = FLOAT_DTYPES) -> bool:
    """Whether the accounting (``inspector.accounting``) counts ``t``: a float output, or one
    of the capture's ``dtypes``."""
    return t.dtype.base_dtype in FLOAT_DTYPES or t.dtype.base_dtype in dtypes


def select_tensors(graph: tf.Graph, *, include=None, exclude=None, op_types: Iterable[str] | None = None,
                   exclude_op_types: Iterable[str] | None = None, dtypes: Sequence[tf.DType] = FLOAT_DTYPES,
                   forced: Iterable[tf.Tensor] = (), use_default_exclude: bool = True,
                   loss: tf.Tensor | None = None, fetched: bool = False) -> Selection:
    """Outputs of every forward op that pass the filters (plus ``forced`` tensors); ``loss``:
    what it is computed from is forward (:func:`backward_ops`). Those that cannot be fetched
    are skipped, with the reason, unless their value is captured as a TF2 cond's Identity.
    ``fetched`` (DumpHook: its tensors are fetches of the training's own runs): also skipped,
    with the reason, a tensor whose fetch would run a stateful op training does not run
    (:func:`side_effects`): the hook must not change what training does. Every other float
    output is in ``excluded``, with the rule that left it out."""
    filters = _filters(include, exclude, op_types, exclude_op_types, dtypes, use_default_exclude)
    given = filters.include + filters.exclude   # the caller's patterns: one that matches no name is a typo (warned)
    matched: set[int] = set()
    backward = backward_ops(graph, loss)
    forced = list(forced)
    forced_names = {t.name for t in forced}
    # A fetch runs everything its tensor is computed from: a read gated on the user's own
    # occasional assign_add, or a v1 loop's result whose loop has effects, ran them on every
    # sampled step (the user's counter would count the hook's fetches).
    # Without a loss or a TRAIN_OP nothing says what training runs (its input pipeline, even):
    # the rule would skip every tensor, so it is not applied there.
    known = loss is not None or bool(graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP))
    ran = ran_by_training(graph, loss) if fetched and known else set()
    effects = side_effects(graph, ran) if ran else {}
    # A read of a variable the step writes, off the loss's path, is in no order with the write.
    of_loss = {n.rpartition(":")[0] for n in ancestors(loss)} if loss is not None else set()
    racy = unordered_reads(graph, ran, of_loss) if ran and loss is not None else {}
    aliased = ref_aliases(graph, ran) if ran else {}
    recorded = _recorded_variables(graph) if racy else set()
    chosen, unfetchable, reasons, excluded = [], [], {}, {}
    for op in graph.get_operations():
        if given and len(matched) < len(given):
            matched.update(id(p) for p in given for t in op.outputs if p.search(t.name))
        op_rule = filters.op_rule(op, backward)
        for t in op.outputs:
            if t.name in forced_names or not accountable(t, dtypes):
                continue
            rule = op_rule or filters.tensor_rule(t)
            if rule is not None:
                excluded[t.name] = rule
                continue
            if _why_unfetchable(graph, t) is not None:
                unfetchable.append(t)
                continue
            why = _unsafe_fetch(op.name, aliased, racy, effects, recorded)
            if why:
                unfetchable.append(t)
                reasons[t.name] = why
                continue
            chosen.append(t)
    for p in given:
        if id(p) not in matched:
            log.warning("include/exclude pattern %r matches no tensor name of the graph (names look like %s): "
                        "it selects nothing", p.pattern, _listed([t.name for t in chosen], 3))
    sel = _sort_unfetchable(unfetchable, {t.name for t in chosen} | forced_names)
    sel.reasons.update({n: r for n, r in reasons.items() if n in sel.reasons})
    sel.tensors = chosen + forced
    sel.excluded = excluded
    return sel


def _recorded_variables(graph: tf.Graph) -> set[str]:
    """Names of the variables that get a variable record (``hooks/variables.py``): the trainable
    resource variables. A non-trainable one (a batch norm's moving mean) has none."""
    return {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
            if getattr(getattr(v, "handle", None), "dtype", None) == tf.resource}


def _unsafe_fetch(op: str, aliased: Mapping[str, str], racy: Mapping[str, str],
                  effects: Mapping[str, set[str]], recorded: set[str] = frozenset()) -> str | None:
    """Why fetching an output of ``op`` would record a wrong value or change what training
    does (:func:`ref_aliases`, :func:`unordered_reads`, :func:`side_effects`), or None.
    ``recorded``: the variables with a record (:func:`_recorded_variables`), which holds the
    value the step used; the reason says where that value is, or that nothing holds it."""
    if op in aliased:
        return (f"it shares (or may share) the buffer of {aliased[op]}, a reference variable the training step "
                f"updates in place: its recorded value could be the weights after the update. "
                f"Resource variables (TF2 behaviour, use_resource=True) have no such alias")
    if op in racy:
        where = ("the variable's record holds the value the step used" if racy[op] in recorded else
                 "it is not trainable, so it has no variable record: its value is not recorded; read it from a "
                 "checkpoint")
        return (f"it reads {racy[op]}, which the training step writes, off the loss's path: in no order with the "
                f"update, its value would be the one before or after it, by chance ({where})")
    runs = effects.get(op)
    if runs:
        return (f"computing it runs {', '.join(sorted(runs))}, which training does not run (the loss, UPDATE_OPS "
                f"and TRAIN_OP do not need it): fetching it would change what training does")
    return None


def accounting(ops: Iterable[tf.Operation], sel: Selection, captured: Iterable[str], filters: Mapping,
               rest: Rule = UNACCOUNTED) -> dict:
    """The manifest's ``accounting`` (FORMAT.md) of ``ops``' outputs (the saved graph's): each
    float output (or one of ``filters["dtypes"]``) captured (``captured``: the catalog's
    names), skipped or excluded as ``sel`` says; ``rest``: the rule of the outputs it does not
    name (ops made after the selection; outside a Keras trace's region)."""
    dtypes = tuple(filters.get("dtypes") or FLOAT_DTYPES)
    outputs = [(t.name, op.type) for op in ops for t in op.outputs if accountable(t, dtypes)]
    custom = None if set(dtypes) == set(FLOAT_DTYPES) else [d.name for d in dtypes]
    rules = [*DEFAULT_RULES, *user_rules(filters.get("include"), filters.get("exclude"), filters.get("op_types"),
                                         filters.get("exclude_op_types"), custom)]
    skipped = {n: sel.reasons.get(n, "cannot be fetched") for n in sel.skipped}
    return record(outputs, captured, sel.aliases, skipped, sel.excluded, rules, rest)


def _listed(names: Sequence[str], most: int = 20) -> str:
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")


def log_unfetchable(sel: Selection) -> None:
    """Log the skipped tensors once per reason, and the TF2 cond outputs captured as their Identity."""
    by_reason: dict[str, list[str]] = {}
    for name in sel.skipped:
        # one line per kind of reason, not per variable read (the manifest keeps each in full)
        why = reason_kind(sel.reasons.get(name, "cannot be fetched"))
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        log.info("skipping %d tensors (%s): %s", len(names), why, _listed(names))
    if sel.aliases:
        log.info("%d TF2 cond outputs, not fetchable, are captured as the Identity tf.cond returned: %s",
                 len(sel.aliases), _listed([f"{k} as {v}" for k, v in sel.aliases.items()]))


def icnn_roles(graph: tf.Graph) -> dict[str, tuple[str, str]]:
    """tensor name -> (layer, role) from the ICNN layer's registrations."""
    out = {}
    for entry in graph.get_collection(ICNN_COLLECTION):
        layer, role, name = parse_icnn_entry(entry)
        out[name] = (layer, role)
    return out


def icnn_fields(graph: tf.Graph) -> dict[str, dict]:
    """tensor name -> the catalog fields its ICNN registration carries (a multi-class layer's
    ``icnn_filter_class`` on ``class_positive``; {} for the other roles)."""
    return {parse_icnn_entry(e)[2]: icnn_catalog_fields(e) for e in graph.get_collection(ICNN_COLLECTION)}


def raw_gradients(loss: tf.Tensor, tensors: Sequence[tf.Tensor], observer: bool = True) -> list:
    """``tf.gradients(loss, tensors)`` built once, as TensorFlow returns them (IndexedSlices
    kept: what an optimizer is handed); None where t does not reach the loss. ``observer``:
    this pass only observes (the training step has its own), so custom gradients with side
    effects leave them out (``inspector.icnn.layer.observer_gradients``); False where this
    pass is the training step's own (the Keras step capture answering fit's tape)."""
    if not tensors:
        return []
    with tf.name_scope("tf_inspector/gradients"), observer_gradients() if observer else contextlib.nullcontext():
        return tf.gradients(loss, list(tensors), stop_gradients=gradient_stops(tensors),
                            unconnected_gradients=tf.UnconnectedGradients.NONE)


def gradient_stops(tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Those of ``tensors`` whose op has no gradient function and takes no floating input, for
    ``tf.gradients``' ``stop_gradients``: tf.gradients asks for the op's gradient function once
    it reaches it from the loss, and raised LookupError (a SparseTensor's float values out of
    ``DeserializeSparse``: canned linear models with weighted sparse columns). Their own
    gradients are still computed. An op with a gradient function is never a stop: a
    ``ReadVariableOp`` passes its gradient to the variable's handle (which Keras
    differentiates), a ``TensorListStack`` to the loop that filled the list."""
    return [t for t in tensors if not any(x.dtype.is_floating or x.dtype.is_complex for x in t.op.inputs)
            and not differentiable(t.op)]


def differentiable(op: tf.Operation) -> bool:
    """Whether a gradient flows through ``op``: a gradient function is registered for it, and
    it is not ``NotDifferentiable`` (None)."""
    try:
        return tf_ops.get_gradient_function(op) is not None
    except LookupError:   # no gradient registered: none flows through it
        return False


def dense_gradient(g) -> tf.Tensor | None:
    """A gradient as the capture records it: dense (e.g. a gather input's IndexedSlices), and
    None where it is not floating."""
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return g if g is None or g.dtype.is_floating else None


def gradients(loss: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor | None]:
    """d loss / d t for every t, built once, dense; None where t does not reach the loss."""
    return [dense_gradient(g) for g in raw_gradients(loss, tensors)]


def unscale(scaled: Sequence, plain: Sequence, scale: tf.Tensor) -> list:
    """d loss / d t as mixed-precision training takes it, from ``scaled`` (d (loss * scale) / d t)
    and ``plain`` (d loss / d t): float16 gradients of the unscaled loss lose values below
    ~6e-5 and read 0 below ~6e-8, where the loss-scaled ones keep them. So ``scaled / scale``
    in float32 (float64 stays float64), and where that overflowed (a step a dynamic loss
    scale skips) ``plain``: a routine loss-scale overflow is no NaN/Inf in the records."""
    out = []
    with tf.name_scope("tf_inspector/unscale"):
        for g, p in zip(scaled, plain):
            g = dense_gradient(g)
            if g is None:
                # the scaled pass (the optimizer's) says what reaches the loss: a plain pass
                # over many tensors at once fills zeros for a multi-output op's unused output
                # (SparseSoftmaxCrossEntropyWithLogits:1), a gradient of zeros that is none
                out.append(None)
                continue
            wide = tf.float64 if g.dtype == tf.float64 else tf.float32
            g = tf.cast(g, wide) / tf.cast(scale, wide)
            out.append(g if p is None else tf.where(tf.math.is_finite(g), g, tf.cast(p, wide)))
    return out


def shared_gradients(graph: tf.Graph, loss: tf.Tensor) -> dict[str, tf.Tensor | None]:
    """tensor name -> d loss / d tensor (None: unconnected) recorded by ``hooks.minimize`` for ``loss``."""
    out: dict[str, tf.Tensor | None] = {}
    for entry in graph.get_collection(SHARED_GRADIENTS_COLLECTION):
        loss_name, tensor, grad = parse_shared_gradient_entry(entry)
        if loss_name == loss.name:
            out[tensor] = None if grad is None else graph.get_tensor_by_name(grad)
    return out


class LabelsError(ValueError):
    """No default rule says which samples of these labels are positive."""


def default_rule(labels: tf.Tensor) -> str:
    """The default positive rule for ``labels`` (docs/guide/loss-and-labels.md); raises ``LabelsError``."""
    shape, rank = labels.shape, labels.shape.rank
    dtype = labels.dtype
    if not (dtype.is_integer or dtype.is_floating or dtype == tf.bool):
        raise LabelsError(f"labels {labels.name} are {labels.dtype.name}: no default positive rule; pass "
                          f"positive=lambda y: ... (a bool [N] of the positive samples).")
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
    """bool [N] per ``default_rule``: [N] and [N, 1] are class ids, [N, C > 1] one-hot or probabilities."""
    default_rule(labels)  # refuses what has no rule
    if labels.shape.rank == 1:
        return tf.not_equal(labels, tf.zeros([], labels.dtype))
    ids = tf.reduce_any(tf.not_equal(labels, tf.zeros([], labels.dtype)), axis=1)  # C == 1: the id itself
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
    if not labels.dtype.is_floating or shape.rank not in (1, 2) or (shape.rank == 2 and shape[1] not in (None, 1)):
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
    (hooks/groups.py; None: none can); ``complete``: every sample is in a group by
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


def from_positive(positive_ids: tf.Tensor, bad: tf.Tensor | None = None, complete: bool = False) -> Groups:
    """positive/negative :class:`Groups` from int [N] ids, 1 positive, 0 negative, -1 neither
    (:func:`group_ids`); ``complete``: no id can be -1."""
    ids = tf.cast(positive_ids, tf.int32)
    return Groups(tf.where(ids < 0, tf.fill(tf.shape(ids), 2), 1 - ids), DEFAULT_GROUPS, (1, 0), bad, complete)


def positive_groups(labels: tf.Tensor, positive: Callable | tf.Tensor | None, count_bad: bool = False) -> Groups:
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


def grouping_of(cap: Captured, groups: Groups | None) -> Groups | None:
    """The groups ``cap``'s samples are split by: its own (a tower's), else the run's if it is
    batched, else none."""
    if not cap.batched:
        return None
    return cap.grouping if cap.grouping is not None else groups


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
    rank = tf.reduce_sum(tf.cumsum(member, axis=0, exclusive=True) * member, axis=1)   # place in its group
    mask = tf.logical_and(ids < groups.count, rank < per_group)
    if groups.bad is not None:
        first = tf.range(tf.size(ids)) < groups.count * per_group
        mask = tf.where(groups.bad > 0, first, mask)
    keep = tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)
    codes = tf.gather(tf.constant(list(groups.codes) + [-1], tf.int32), tf.gather(ids, keep))
    return keep, codes


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
    one per key: fetching hundreds of (empty) arrays every step cost ~6 ms of Python on
    ResNet-8. :func:`unpack` restores the arrays.

    Example::

        fetch = pack_when(tf.logical_not(finite), {"forward/x:0": x})
        arrays = unpack(session.run(fetch), ["forward/x:0"], ["float32"])   # {} unless not finite
    """
    flat: dict[tf.DType, list[tf.Tensor]] = {}
    shapes = []
    for t in tensors.values():
        t = taken(pred, t)  # also gates tensors not gated already (a Switch of a dead tensor is dead)
        flat.setdefault(t.dtype, []).append(tf.reshape(t, [-1]))
        shape = tf.shape(t, out_type=tf.int64)
        shapes.append(tf.concat([tf.reshape(tf.size(shape, out_type=tf.int64), [1]), shape], 0))
    out = {f"values/{d.name}": _or_empty(pred, tf.concat(v, 0)) for d, v in flat.items()}
    out["shapes"] = _or_empty(pred, tf.concat(shapes, 0)) if shapes else tf.zeros([0], tf.int64)
    return out


def unpack(results: Mapping[str, np.ndarray], keys: Sequence[str], dtypes: Sequence[str]) -> dict[str, np.ndarray]:
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


def keeps_whole_batch(groups: "Groups | None", static_batch: int | None, per_group: int) -> int | None:
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
            mine = tf.boolean_mask(keep, keep < tf.shape(t)[0])  # robust to a different batch
            t = tf.gather(t, mine)
    return t
