"""Which tensors can be fetched in a training step without changing it: control flow, side
effects, variables read in no fixed order against their writes, TF2 function bodies.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


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
_NO_EFFECT = ("ReadVariableOp", "VarHandleOp", "VariableV2", "VarIsInitializedOp", "TensorArray",
              "Stack", "Placeholder", "PlaceholderWithDefault")


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
        for key in (v1.GraphKeys.UPDATE_OPS, v1.GraphKeys.TRAIN_OP)
        for x in graph.get_collection(key)
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
_WRITES = ("Assign", "ResourceApply", "ResourceSparseApply", "Apply", "SparseApply",
           "ResourceScatter", "Scatter")


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
    return [t.op.name for i, t in enumerate(op.inputs)
            if t.dtype == tf.resource and i not in read_only]


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
                    "Reshape", "ExpandDims", "Squeeze", "EnsureShape", "CheckNumerics",
                    "CheckNumericsV2", "Print", "Bitcast", "DebugIdentity", "DebugIdentityV2",
                    "Slice", "StridedSlice", "Switch", "RefSwitch", "Merge", "RefMerge", "Enter",
                    "RefEnter", "Exit", "RefExit"})


def _may_forward(op: tf.Operation) -> bool:
    """Whether ``op``'s output may share its input's buffer (:data:`_VIEWS`; unknown where it
    depends on values: yes). Those that do only for some arguments: Transpose keeping the
    order of the dimensions other than 1's, Tile by ones, a Pad of zeros, BroadcastTo the same
    shape, ReverseV2 of no axis, a Split or Unpack with nothing but 1's before its axis."""
    if op.type in _VIEWS:
        return True
    if op.type not in ("Transpose", "ConjugateTranspose", "Tile", "Pad", "PadV2", "MirrorPad",
                       "BroadcastTo", "ReverseV2", "Split", "SplitV", "Unpack") or not op.inputs:
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
        if (source is not None and source.name in writes
                and op.type in ("ReadVariableOp", "Identity")
                and not writes[source.name] & upstream([op])   # a read after its write is ordered
                and not _before_all(graph, op.name, writes[source.name], before)):
            out[op.name] = source.name
            continue
        var = next((out[x.op.name] for x in op.inputs if x.op.name in out), None)
        if var is not None:
            out[op.name] = var
    return out


def _v2_cond_alias(t: tf.Tensor) -> tf.Tensor | None:
    """The fetchable Identity of ``t``, an output of a TF2 cond op (what tf.cond returned), if
    any."""
    if t.op.type not in V2_COND_OP_TYPES:
        return None
    return next((c.outputs[0] for c in t.consumers()
                 if c.type == "Identity" and not _in_control_flow(c)
                 and c.graph.is_fetchable(c.outputs[0])), None)


def _why_unfetchable(graph: tf.Graph, t: tf.Tensor) -> str | None:
    """Why ``t`` cannot be fetched by ``Session.run``, or None if it can."""
    if _in_control_flow(t.op):
        return IN_V1_BODY
    if graph.is_fetchable(t):
        return None
    if t.op.type in V2_COND_OP_TYPES:
        return ("a TF2 cond's output that TensorFlow marks not fetchable, with no Identity "
                "returned for it")
    return "marked not fetchable by TensorFlow"


#: TF2 loops, conds and function calls: the ops whose functions' insides ``function_body_tensors``
#: lists (not a tf.data op's map function: the input pipeline is not the model)
CALL_OP_TYPES = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                           "PartitionedCall", "StatefulPartitionedCall"})


#: attributes naming the functions a TF2 loop, cond or call runs (While, If, Case, PartitionedCall)
_FUNCTION_ATTRS = ("cond", "body", "then_branch", "else_branch", "branches", "f")


IN_FUNCTION = ("inside a TF2 function (a while loop's body or condition, a cond's branch, a called "
               "function such as a Keras LSTM/GRU's): not an op of the traced graph, it runs once "
               "per iteration or call and cannot be fetched; the loop's or call's outputs are "
               "captured")


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
