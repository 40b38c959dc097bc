"""Which tensors are per-sample: axis 0 is the batch, decided from data flow, not from shapes.

The batch axis is traced forward, once per graph, in op creation order (a topological
order outside v1 while loops):

- **sources**: the outputs (rank >= 1) of the model's inputs: placeholders, ``tf.data``
  iterators (``IteratorGetNext``), queue dequeues, and the labels;
- an op's output is batched when a rule for its op type says axis 0 of a batched input
  becomes its axis 0: elementwise ops and broadcasting (an input of the output's rank),
  conv / pooling / bias add / batch norm's ``y``, ``MatMul`` on the left operand (not
  ``transpose_a``), reductions and ``ArgMax`` / ``Cumsum`` not over axis 0, ``Transpose``
  with ``perm[0] == 0``, ``Concat`` / ``Pack`` / ``Split`` / ``Unpack`` on another axis,
  ``ExpandDims`` / ``Squeeze`` of other axes, ``Reshape`` keeping the per-sample size
  (or whose new shape starts with ``tf.shape(batched)[0]``), slices taking all of axis 0,
  ``Tile`` / ``Pad`` leaving it alone, ``Gather`` of batched indices on axis 0 (embedding
  lookups: the rows looked up are batched, the table is not), softmax cross entropy;
  ``Fill`` / ``BroadcastTo`` / ``Tile`` to a shape that starts with a batched tensor's
  ``tf.shape(x)[0]`` (``tf.ones(tf.shape(x))``, a row tiled to the batch), and ``Reshape`` of
  an unbatched tensor to such a shape (a sparse feature column's per-sample embedding sums,
  reshaped to the SparseTensor's ``dense_shape``);
- everything else derived from a batched tensor is not batched: reductions over axis 0
  (batch-norm mean and variance, their moving averages), transposes moving axis 0,
  ``Shape`` / ``Size``, weight gradients;
- ops without a rule (custom ops, rare types) are batched when a batched input has the
  output's rank and a compatible axis 0 (equal or unknown sizes).

Tensors with no batched input (variables, biases, constants) are never batched, whatever
their shape: 8 filters with a batch of 8 are told apart.

**Batch moved off axis 0, and back.** A reshape merging the batch with the axes after it
(``[B, T, F] -> [B*T, F]``: ``TimeDistributed`` under tf.keras, a layer folding time into the
batch) makes a *merged* tensor, each sample's rows a contiguous run of ``k`` rows; a transpose
putting the batch on axis 1 (``[B, T, F] -> [T, B, F]``: a time-major loop, Keras 3's
``TimeDistributed``) or a stack of batched tensors on axis 0 makes a *time-major* one. Neither is
batched (its rows are not samples: ``all`` rows only, dumped whole; :meth:`BatchAxis.moved_at`
names the ops), but the trace carries them: row-keeping ops (the rules above, elementwise ops
only for time-major tensors) keep the state, and the batch is back on axis 0 after a reshape
of a merged tensor to ``k`` times its per-row size (or to a shape starting with a batched
tensor's ``tf.shape(x)[0]``), a transpose of a time-major one putting axis 1 first, and a
time step taken from it (``x[t]``, an unstack along axis 0). A reshape of a batched tensor to
any other static shape makes a *flat* one (``[B, T, D] -> [1, B*T, D, 1]``: tf.keras 2.15's
LayerNormalization): its buffer is still sample after sample, kept by same-shaped elementwise
ops and batch norm's ``y``, and a reshape back to the per-sample size restores the batch. A
TF2 while loop taking the batch (a whole-batch input, or a tensor list unstacked from a
time-major tensor: an RNN) has batched outputs where the loop variable came in batched or has
the batch's static size, and the list it stacks is time-major where its axis 1 does; a
function call (tf.keras 2.15's LSTM) has batched outputs whose axis 0 has the batch's size.
Only whole-batch tensors are carried (a tower's slice is not). :meth:`BatchAxis.note` says
why a tensor computed from the batch is not batched (moved, lost at an op, a part).

**Towers.** ``tf.split`` on axis 0 of a batched tensor (multi-tower training) makes each
output batched over *its slice* of the batch: the trace keeps, per batched tensor, the chain
of splits it came through (:meth:`BatchAxis.slice_of`: () for the whole batch), so a tower's
samples are grouped by the same split of the labels' groups (``hooks/capture/towers.py``). Other
selections of part of axis 0 (``x[:16]``, a gather of unbatched indices) and ops mixing
tensors of different slices are *unresolved*: not batched, listed by :meth:`unresolved` (the
hook warns and gives them no groups). Limits: an input whose axis 0 is
not the batch (time-major sequences, a placeholder of class weights) is taken as batched;
say so with ``unbatched=``. Overrides are regexes on tensor names, applied during the
trace, so what follows from an overridden tensor follows the override:
``batched=`` marks matching tensors (rank >= 1) as batched, ``unbatched=`` as not batched
(it wins when both match).

Example::

    axis = BatchAxis(graph, labels, batched=r"^my_buffer", unbatched=r"^class_weights")
    axis.is_batched(graph.get_tensor_by_name("conv1/Relu:0"))
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence, Union

import numpy as np
import tensorflow as tf

from hooks.options import compile_patterns
from inspector.format import INPUT_OP_TYPES

#: Op types whose outputs (rank >= 1) are the model's inputs: axis 0 is the batch.
SOURCE_OP_TYPES = INPUT_OP_TYPES | frozenset({
    "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo", "QueueDequeueUpToV2"})
#: Never batched, whatever their inputs: sizes, and gradients of weights.
NEVER = frozenset({
    "Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "Where", "Unique", "UniqueV2",
    "Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNativeBackpropFilter", "BiasAddGrad", "TensorArrayV3", "TensorArraySizeV3",
    "DynamicPartition",
})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
#: ops whose outputs computed from the batch are meant to be over it (statistics, weight
#: gradients): their non-batched outputs have no :meth:`BatchAxis.note`
AGGREGATES = REDUCTIONS | frozenset({
    "ArgMax", "ArgMin", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "Split", "SplitV", "Unpack",
    "Slice", "StridedSlice", "GatherV2", "Gather", "ResourceGather", "Cumsum", "Cumprod",
    "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"})
#: TF2 while loops: output i is loop variable i
LOOPS = frozenset({"While", "StatelessWhile"})
#: function calls (a tf.keras 2.15 LSTM's or GRU's implementation)
CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
#: Selections of part of axis 0 (``x[:16]``, ``tf.gather(x, idx)``): per-sample over samples
#: the trace cannot map to the labels.
PARTS = frozenset({"Slice", "StridedSlice", "GatherV2", "Gather"})
Rule = Callable[[tf.Operation, Callable[[tf.Tensor], bool]], Sequence[bool]]
#: ((split op name, output index), ...): the splits along axis 0 a tensor came through.
Slice = tuple
Patterns = Union[str, Iterable[str], None]


class BatchAxis:
    """The batched tensors of ``graph``, traced once (see the module docstring)."""

    def __init__(self, graph: tf.Graph, labels: tf.Tensor | None = None, batched: Patterns = None,
                 unbatched: Patterns = None) -> None:
        self._force = compile_patterns(batched)
        self._cut = compile_patterns(unbatched)
        self._sources = {labels.name} if labels is not None else set()
        self._batched: set[str] = set()
        self._slice: dict[str, Slice] = {}   # batched tensor -> its slice of the batch
        self._partial: set[str] = set()      # part of the batch, not traced: unresolved
        self._split_ops: dict[tuple, str] = {}  # a split's signature -> the first split op with it
        #: tensors whose batch is off axis 0: ("merged", rows per sample, op) or ("time_major", 1,
        #: op), op the one that moved it (module docstring)
        self._moved: dict[str, tuple[str, int, str]] = {}
        #: tensors derived from the batch whose axis 0 is no longer it, no rule carrying it back:
        #: tensor -> the op where it was lost (:meth:`note`)
        self._lost: dict[str, str] = {}
        self._graph = graph
        #: the op that cut the labels from part of a batched tensor (``labels[:16]`` of a batch of
        #: 32), None if they are a whole batch: taken as the batch, they would group the other
        #: samples' rows by labels that are not theirs
        self.labels_cut: tf.Operation | None = None
        for op in graph.get_operations():
            self._trace(op)

    def is_batched(self, t: tf.Tensor) -> bool:
        return t.name in self._batched

    def slice_of(self, t: tf.Tensor) -> "Slice":
        """The splits a batched ``t`` came through: ((split signature, output index), ...), ()
        for the whole batch. Splits of the batch into the same parts (``tf.split(x, 2)`` and
        ``tf.split(labels, 2)``, or equal constant sizes) have one signature: their i-th
        outputs hold the same samples."""
        return self._slice.get(t.name, ())

    def split_op(self, signature: tuple) -> tf.Operation:
        """The (first) split op of a signature in :meth:`slice_of`."""
        return self._graph.get_operation_by_name(self._split_ops[signature])

    def unresolved(self, t: tf.Tensor) -> bool:
        """``t`` is per-sample over a part of the batch the trace cannot map to the labels."""
        return t.name in self._partial

    def moved_at(self, tensors: Iterable[tf.Tensor]) -> list[str]:
        """The ops that moved the batch off axis 0 (a merging reshape, a time-major transpose or
        stack) for those of ``tensors`` whose batch is off axis 0, in first-seen order."""
        ops = [self._moved[t.name][2] for t in tensors if t.name in self._moved]
        return list(dict.fromkeys(ops))

    def note(self, t: tf.Tensor) -> str | None:
        """Why ``t``, computed from the batch, is not per-sample (its dump holds the whole
        tensor, its statistics group ``all`` only): None for a batched tensor and for one the
        batch does not reach (a weight) or only reaches through a reduction over it."""
        if self.is_batched(t):
            return None
        if self.unresolved(t):
            return "per-sample over a part of the batch the trace cannot map to the labels"
        if t.name in self._moved:
            kind, _, op = self._moved[t.name]
            how = {"merged": "merged with the axes after it", "time_major": "on axis 1 "
                   "(time-major)", "flat": "folded into another shape"}[kind]
            return f"the batch is {how} since {op}: its rows are not samples"
        if t.name in self._lost:
            op = self._graph.get_operation_by_name(self._lost[t.name])
            return f"axis 0 stops being the batch at {op.name} ({op.type}): no rule carries " \
                   "the batch through it"
        return None

    def lost_at(self, outputs: Iterable[tf.Tensor]) -> list[str]:
        """The ops where axis 0 stopped being the batch on the way to ``outputs`` that are not
        batched (rank >= 1): ops with a batched input and no batched output on that path (an
        RNN's time-major transpose, a reshape merging the batch with another axis). Empty when
        every such output is batched, or none comes from a batched tensor."""
        lost: list[str] = []
        seen: set[str] = set()
        todo = [t for t in outputs if t.shape.rank != 0 and not self.is_batched(t)]
        while todo:
            t = todo.pop()
            if t.name in seen or self.is_batched(t) or self.unresolved(t):
                continue
            seen.add(t.name)
            if any(self.is_batched(x) for x in t.op.inputs):
                if t.op.name not in lost:
                    lost.append(t.op.name)
                continue
            todo += list(t.op.inputs)
        return lost

    def _trace(self, op: tf.Operation) -> None:
        outs = self._op_outputs(op)
        split = self._split_axis0(op)
        moved = self._moved_outputs(op) if not any(outs) else [None] * len(op.outputs)
        for i, (t, b) in enumerate(zip(op.outputs, outs)):
            if split is not None:
                if self._override(t, True):
                    self._batched.add(t.name)
                    self._slice[t.name] = split + ((self._signature(op), i),)
                continue
            if t.name in self._sources and not b and self._partial_out(op, i):
                self.labels_cut = op
            if not self._override(t, b):
                if self._override(t, self._partial_out(op, i)):
                    self._partial.add(t.name)
                elif moved[i] is not None \
                        and not (self._cut and any(p.search(t.name) for p in self._cut)):
                    self._moved[t.name] = moved[i]
                elif (origin := self._lost_origin(op, t)) is not None:
                    self._lost[t.name] = origin
                continue
            slices = {self._slice.get(x.name, ()) for x in op.inputs if self.is_batched(x)}
            slices |= _shape_slices(op, self)
            if len(slices) > 1 or any(self.unresolved(x) for x in op.inputs):
                self._partial.add(t.name)  # mixes slices: whose samples would its rows be?
                continue
            self._batched.add(t.name)
            if slices and (s := slices.pop()):
                self._slice[t.name] = s

    def _lost_origin(self, op: tf.Operation, t: tf.Tensor) -> str | None:
        """The op where the batch was lost on the way to ``t`` (not batched, not moved), or None:
        ``op`` itself when a batched or moved input enters an op that is no aggregate over the
        batch, the origin of a lost input otherwise."""
        if not t.shape.rank or op.type in NEVER:
            return None
        for x in op.inputs:
            if x.name in self._lost:
                return self._lost[x.name]
        if self._cut and any(p.search(t.name) for p in self._cut):
            return None
        if any(self.is_batched(x) and not self.slice_of(x) for x in op.inputs):
            return None if op.type in AGGREGATES else op.name
        if any(x.name in self._moved for x in op.inputs):
            return None if op.type in REDUCTIONS else op.name
        return None

    def _split_axis0(self, op: tf.Operation) -> "Slice | None":
        """A ``Split``/``SplitV`` along axis 0 of a batched tensor: that tensor's slice."""
        if op.type not in ("Split", "SplitV"):
            return None
        value, axis = (op.inputs[1], op.inputs[0]) if op.type == "Split" \
            else (op.inputs[0], op.inputs[2])
        if not self.is_batched(value) or _axis(_const(axis), value.shape.rank) != 0:
            return None
        return self.slice_of(value)

    def _signature(self, op: tf.Operation) -> tuple:
        """What a split of axis 0 cuts: equal parts, constant sizes, else this op alone."""
        sizes = _const(op.inputs[1]) if op.type == "SplitV" else None
        sig = (("equal", len(op.outputs)) if op.type == "Split" else
               ("sizes", tuple(int(v) for v in sizes)) if sizes is not None and -1 not in sizes
               else ("op", op.name))
        self._split_ops.setdefault(sig, op.name)
        return sig

    def _partial_out(self, op: tf.Operation, i: int) -> bool:
        """Output ``i`` would be per-sample if unresolved inputs and selections of part of axis 0
        counted as batched: it is per-sample over a part of the batch not traced."""
        if not op.outputs[i].shape.rank or op.type in NEVER:
            return False
        x = op.inputs[0] if op.inputs else None
        if op.type in PARTS and _selects_axis0(op) and x is not None \
                and (self.is_batched(x) or self.unresolved(x)):
            return True
        if not any(self.unresolved(x) for x in op.inputs):
            return False

        def b(x: tf.Tensor) -> bool:
            return self.is_batched(x) or self.unresolved(x)
        return bool(RULES.get(op.type, same_leading)(op, b)[i])

    def _op_outputs(self, op: tf.Operation) -> Sequence[bool]:
        if op.type in SOURCE_OP_TYPES:
            return [True] * len(op.outputs)
        if op.type in SHAPED:  # the batch may come from the shape operand alone
            return SHAPED[op.type](op, self.is_batched)
        if op.type in LOOPS | CALLS:
            return self._carried(op)
        if op.type in NEVER or not any(self.is_batched(x) for x in op.inputs):
            return self._restored(op) or self._reshaped_to_batch(op) or [False] * len(op.outputs)
        return RULES.get(op.type, same_leading)(op, self.is_batched)

    def _loop_batch(self, op: tf.Operation) -> tuple[bool, int | None]:
        """(whether a while loop or function call takes the batch, its static size): a
        whole-batch input, or (loops) a tensor list unstacked from a time-major tensor (an RNN's
        inputs, one time step per iteration)."""
        for x in op.inputs:
            if self.is_batched(x) and not self.slice_of(x):
                return True, _dim0(x)
            src = x.op.inputs[0] if x.op.type == "TensorListFromTensor" else None
            if op.type in LOOPS and src is not None \
                    and self._moved.get(src.name, ("",))[0] == "time_major":
                return True, src.shape[1] if (src.shape.rank or 0) > 1 else None
        return False, None

    def _carried(self, op: tf.Operation) -> list[bool]:
        """A while loop's or function call's outputs: batched where the loop variable came in
        batched, or where the op takes the batch and the output's axis 0 is the batch's size
        (an RNN's state, zeros of a static batch size on the way in; a tf.keras LSTM's
        function-call outputs). The body is not traced: a loop variable of exactly the batch's
        static size that is no per-sample state would be taken as one (``unbatched=``)."""
        takes, n = self._loop_batch(op)
        outs = []
        for i, out in enumerate(op.outputs):
            x = op.inputs[i] if op.type in LOOPS and i < len(op.inputs) else None
            if x is not None and self.is_batched(x) and _keeps_axis0(out, x):
                outs.append(True)
                continue
            d = _dim0(out)
            outs.append(takes and bool(out.shape.rank) and (d == n if n is not None and
                                                            d is not None else d is None))
        return outs

    def _reshaped_to_batch(self, op: tf.Operation) -> list[bool] | None:
        """A reshape of a tensor with no batch axis to a shape that starts with a batched tensor's
        batch size: one row per sample, in the batch's order. A sparse feature column's embedding
        (a segment sum per sample, its segments the SparseTensor's rows) comes out this way. Not
        for a tensor whose batch is off axis 0, nor for a part of the batch: their rows are not
        the samples in order."""
        if op.type != "Reshape" or not op.outputs[0].shape.rank:
            return None
        x = op.inputs[0]
        if x.name in self._moved or self.unresolved(x) \
                or not _leads_with_batch(op.inputs[1], self.is_batched):
            return None
        return [True]

    def _restored(self, op: tf.Operation) -> list[bool] | None:
        """Outputs that put a moved batch back on axis 0 (module docstring), or None."""
        x = op.inputs[0] if op.inputs else None
        state = self._moved.get(x.name) if x is not None else None
        if state is None:
            return None
        kind, rows, _ = state
        out = op.outputs[0]
        if kind == "flat":   # back to a shape of per-sample size: the buffer is sample-major
            if op.type != "Reshape":
                return None
            return [bool(out.shape.rank) and _per_sample(out) == rows]
        if kind == "merged" and op.type == "Reshape":
            a, c = _per_sample(x), _per_sample(out)
            back = (a is not None and c is not None and c == rows * a) or \
                _leads_with_batch(op.inputs[1], self.is_batched)
            return [back and bool(out.shape.rank)]
        if kind != "time_major":
            return None
        if op.type in ("Transpose", "ConjugateTranspose"):
            perm = _const(op.inputs[1])
            return [perm is not None and perm.size > 1 and int(perm[0]) == 1 and int(perm[1]) == 0]
        if op.type == "StridedSlice":   # x[t]: one time step, [B, ...]
            masks = _attr(op, "shrink_axis_mask", 0), \
                _attr(op, "new_axis_mask", 0) | _attr(op, "ellipsis_mask", 0)
            return [bool(masks[0] & 1) and not masks[1] & 1 and bool(out.shape.rank)]
        if op.type == "Unpack" and _axis(_attr(op, "axis", 0), x.shape.rank) == 0:
            return [bool(o.shape.rank) for o in op.outputs]
        return None

    def _moved_outputs(self, op: tf.Operation) -> list[tuple[str, int, str] | None]:
        """Per output: the moved-batch state it gets (module docstring), or None."""
        none: list[tuple[str, int, str] | None] = [None] * len(op.outputs)
        if op.type in NEVER or not op.outputs:
            return none
        whole = [x for x in op.inputs if self.is_batched(x) and not self.slice_of(x)]
        made = _moving(op, whole) or self._stacked(op)
        if made is not None:
            return [(made[0], made[1], op.name)] + none[1:]
        states = {self._moved[x.name] for x in op.inputs if x.name in self._moved}
        if len(states) != 1 or any(self.is_batched(x) for x in op.inputs) or op.type in SHAPED:
            return none
        state = states.pop()
        if state[0] == "flat":   # the same buffer layout: same shape, elementwise or batch norm
            x = next(x for x in op.inputs if self._moved.get(x.name) == state)
            same_shape = op.outputs[0].shape.is_fully_defined() \
                and op.outputs[0].shape == x.shape
            keeps = same_shape and (op.type not in RULES or RULES[op.type] is _first_input)
            return [state if keeps else None] + none[1:]

        def same(x: tf.Tensor) -> bool:
            return self._moved.get(x.name) == state
        if state[0] == "merged":   # rows stay rows through the axis-0 rules
            rule = RULES.get(op.type, same_leading)
        elif op.type in RULES and op.type not in ("BatchMatMulV2", "BatchMatMulV3"):
            # time-major: elementwise ops only (a reduction over axis 1 is over the batch)
            return none
        else:
            rule = same_leading
        return [state if keep else None for keep in rule(op, same)]

    def _stacked(self, op: tf.Operation) -> tuple[str, int] | None:
        """A ``TensorListStack`` of a list a batch-taking while loop wrote (an RNN's outputs,
        one step per iteration): time-major when its axis 1 is the batch's size."""
        if op.type != "TensorListStack" or op.inputs[0].op.type not in LOOPS:
            return None
        takes, n = self._loop_batch(op.inputs[0].op)
        out = op.outputs[0]
        if not takes or (out.shape.rank or 0) < 2 or not _compatible(out.shape[1], n):
            return None
        return "time_major", 1

    def _override(self, t: tf.Tensor, batched: bool) -> bool:
        batched = batched or t.name in self._sources
        if self._cut and any(p.search(t.name) for p in self._cut):
            return False
        if self._force and any(p.search(t.name) for p in self._force):
            batched = True
        return batched and t.shape.rank is not None and t.shape.rank >= 1


def _selects_axis0(op: tf.Operation) -> bool:
    """A slice or gather that picks some rows of axis 0, keeping it as axis 0 (not ``x[0]``)."""
    if op.type == "StridedSlice":
        masks = _attr(op, "shrink_axis_mask", 0) | _attr(op, "new_axis_mask", 0) \
            | _attr(op, "ellipsis_mask", 0)
        return not masks & 1
    if op.type in ("Gather", "GatherV2"):
        axis = 0 if op.type == "Gather" else _axis(_const(op.inputs[2]), op.inputs[0].shape.rank)
        return axis == 0 and not _attr(op, "batch_dims", 0) and bool(op.inputs[1].shape.rank)
    return True


def _shape_slices(op: tf.Operation, axis: BatchAxis, depth: int = 4) -> set:
    """Slices of the batched tensors whose ``tf.shape`` feeds ``op`` (``tf.fill(tf.shape(x))``):
    a shaped op takes its batch from there."""
    if op.type not in SHAPED:
        return set()
    found, stack = set(), [(x, depth) for x in op.inputs]
    while stack:
        t, d = stack.pop()
        if t.op.type in ("Shape", "ShapeN"):
            found |= {axis.slice_of(x) for x in t.op.inputs if axis.is_batched(x)}
        elif d > 0:
            stack += [(x, d - 1) for x in t.op.inputs]
    return found


def _moving(op: tf.Operation, whole: list[tf.Tensor]) -> tuple[str, int] | None:
    """(kind, rows per sample) where ``op`` moves a whole-batch input's batch off axis 0: a
    reshape to a divisor of its per-sample size (merged), a transpose swapping axes 0 and 1
    or a stack of batched tensors along axis 0 (time-major)."""
    names = {t.name for t in whole}
    if not names:
        return None
    out = op.outputs[0]
    x = op.inputs[0]
    if op.type == "Reshape" and x.name in names and (out.shape.rank or 0) >= 1:
        a, c = _per_sample(x), _per_sample(out)
        if a is not None and c and c < a and a % c == 0:
            return "merged", a // c
        if a is not None and out.shape.is_fully_defined():
            return "flat", a   # [B, T, D] -> [1, B*T, D, 1] (tf.keras LayerNormalization)
    if op.type in ("Transpose", "ConjugateTranspose") and x.name in names:
        perm = _const(op.inputs[1])
        if perm is not None and perm.size > 1 and int(perm[0]) == 1 and int(perm[1]) == 0:
            return "time_major", 1
    if op.type == "Pack" and _axis(_attr(op, "axis", 0), out.shape.rank) == 0 \
            and len(whole) == len(op.inputs):
        return "time_major", 1
    return None


# ---- rules: op -> batched per output, given which inputs are batched ---------------------------
def _const(t: tf.Tensor) -> np.ndarray | None:
    """The value of ``t`` when known while building the graph (axes, perms, shapes), else None."""
    try:
        v = tf.get_static_value(t)
    except Exception:  # noqa: BLE001 - an unfoldable input is simply not constant
        return None
    return None if v is None else np.asarray(v)


def _axis(value, rank: int | None) -> int | None:
    """A constant axis normalized to >= 0 (None when unknown)."""
    if value is None or np.ndim(value) != 0:
        return None
    a = int(value)
    if a < 0:
        return None if rank is None else a + rank
    return a


def _compatible(a: int | None, b: int | None) -> bool:
    return a is None or b is None or a == b


def _dim0(t: tf.Tensor) -> int | None:
    return t.shape[0] if t.shape.rank else None


def _keeps_axis0(out: tf.Tensor, x: tf.Tensor) -> bool:
    """``x`` has ``out``'s rank and a compatible axis 0."""
    r = out.shape.rank
    return bool(r) and x.shape.rank == r and _compatible(_dim0(x), _dim0(out))


def same_leading(op: tf.Operation, b) -> list[bool]:
    """Elementwise / broadcasting / shape-keeping ops, and the default: some batched input
    of the output's rank with a compatible axis 0."""
    return [any(b(x) and _keeps_axis0(out, x) for x in op.inputs) for out in op.outputs]


def _first_input(op: tf.Operation, b) -> list[bool]:
    """Output 0 follows input 0 (conv, pooling, fused batch norm's y); other outputs do not."""
    return [i == 0 and b(op.inputs[0]) and bool(out.shape.rank) for i, out in enumerate(op.outputs)]


def _all_outputs(op: tf.Operation, b) -> list[bool]:
    return [bool(out.shape.rank) for out in op.outputs]


def _reduction(op: tf.Operation, b) -> list[bool]:
    axes = _const(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if not b(op.inputs[0]) or axes is None:
        return [False]
    axes = [_axis(a, rank) for a in np.atleast_1d(axes)]
    return [None not in axes and 0 not in axes and bool(op.outputs[0].shape.rank)]


def _along_axis(axis_input: int) -> Rule:
    """ArgMax, Cumsum, ...: batched unless the op runs along axis 0."""
    def rule(op, b):
        axis = _axis(_const(op.inputs[axis_input]), op.inputs[0].shape.rank)
        return [b(op.inputs[0]) and axis not in (None, 0) and bool(out.shape.rank)
                for out in op.outputs]
    return rule


def _attr(op: tf.Operation, name: str, default=None):
    try:
        return op.get_attr(name)
    except ValueError:
        return default


def _matmul(op: tf.Operation, b) -> list[bool]:
    return [b(op.inputs[0])
            and not (_attr(op, "transpose_a", False) or _attr(op, "adjoint_a", False))]


def _batch_matmul(op: tf.Operation, b) -> list[bool]:
    out = op.outputs[0]
    if out.shape.rank == 2:
        return [b(op.inputs[0]) and not _attr(op, "adj_x", False)]
    return same_leading(op, b)


def _transpose(op: tf.Operation, b) -> list[bool]:
    perm = _const(op.inputs[1])
    return [b(op.inputs[0]) and perm is not None and perm.size > 0 and int(perm[0]) == 0]


def _concat(axis_first: bool) -> Rule:
    def rule(op, b):
        values = op.inputs[1:] if axis_first else op.inputs[:-1]
        axis = _axis(_const(op.inputs[0] if axis_first else op.inputs[-1]),
                     op.outputs[0].shape.rank)
        return [axis not in (None, 0) and any(b(v) for v in values)]
    return rule


def _pack(op: tf.Operation, b) -> list[bool]:
    axis = _axis(_attr(op, "axis", 0), op.outputs[0].shape.rank)
    return [axis not in (None, 0) and any(b(x) for x in op.inputs)]


def _unpack(op: tf.Operation, b) -> list[bool]:
    axis = _axis(_attr(op, "axis", 0), op.inputs[0].shape.rank)
    return [axis not in (None, 0) and b(op.inputs[0]) and bool(out.shape.rank)
            for out in op.outputs]


def _split(value_input: int, axis_input: int) -> Rule:
    def rule(op, b):
        axis = _axis(_const(op.inputs[axis_input]), op.inputs[value_input].shape.rank)
        return [axis not in (None, 0) and b(op.inputs[value_input]) for _ in op.outputs]
    return rule


def _expand_dims(op: tf.Operation, b) -> list[bool]:
    axis = _axis(_const(op.inputs[1]), op.outputs[0].shape.rank)
    return [b(op.inputs[0]) and axis not in (None, 0)]


def _squeeze(op: tf.Operation, b) -> list[bool]:
    x, out = op.inputs[0], op.outputs[0]
    dims = [_axis(d, x.shape.rank) for d in _attr(op, "squeeze_dims", []) or []]
    if dims:
        return [b(x) and None not in dims and 0 not in dims and bool(out.shape.rank)]
    # squeeze every size-1 axis: axis 0 stays unless the batch is statically 1
    return [b(x) and _dim0(x) != 1 and bool(out.shape.rank)]


def _per_sample(t: tf.Tensor) -> int | None:
    dims = t.shape.as_list()[1:] if t.shape.rank else None
    return None if dims is None or None in dims else int(np.prod(dims, dtype=np.int64))


def _is_batch_size(t: tf.Tensor, b) -> bool:
    """``t`` is ``tf.shape(x)[0]`` of a batched ``x``, the shape or the size maybe cast
    (``tf.cast(tf.shape(x, out_type=tf.int64)[0], tf.int32)``), as :func:`_leads_with_batch`."""
    while t.op.type in ("Cast", "Identity"):
        t = t.op.inputs[0]
    of = _shape_of(t.op.inputs[0]) if t.op.type == "StridedSlice" else None
    if of is None:
        return False
    begin = _const(t.op.inputs[1])
    return b(of) and begin is not None and begin.size > 0 and int(begin[0]) == 0 and \
        bool(_attr(t.op, "shrink_axis_mask", 0) & 1)


def _shape_of(t: tf.Tensor) -> tf.Tensor | None:
    """The tensor whose ``tf.shape`` ``t`` is, through casts (``tf.cast(tf.shape(x), tf.int32)``:
    a SparseTensor's ``dense_shape``, as feature columns make it), else None."""
    while t.op.type in ("Cast", "Identity"):
        t = t.op.inputs[0]
    return t.op.inputs[0] if t.op.type == "Shape" else None


def _leads_with_batch(shape: tf.Tensor, b) -> bool:
    """The shape vector ``shape`` starts with a batched tensor's batch size: ``tf.shape(x)``,
    ``tf.shape(x)[:k]``, ``tf.slice(tf.shape(x), [0], [k])`` (each maybe cast),
    ``tf.stack([tf.shape(x)[0], ...])``, ``tf.concat([tf.shape(x)[:1], ...], 0)``."""
    op = shape.op
    whole = _shape_of(shape)
    if whole is not None:
        return b(whole)
    of = _shape_of(op.inputs[0]) if op.type in ("StridedSlice", "Slice") else None
    if of is not None and not (op.type == "StridedSlice" and _attr(op, "shrink_axis_mask", 0) & 1):
        begin = _const(op.inputs[1])
        zero = begin is not None and begin.size > 0 and int(begin[0]) == 0
        return (zero or (op.type == "StridedSlice" and bool(_attr(op, "begin_mask", 0) & 1))) \
            and b(of)
    if op.type == "Pack" and op.inputs:
        return _is_batch_size(op.inputs[0], b)
    if op.type == "ConcatV2" and len(op.inputs) > 1:
        return _leads_with_batch(op.inputs[0], b)
    return False


def _reshape(op: tf.Operation, b) -> list[bool]:
    x, shape, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if not b(x) or not out.shape.rank:
        return [False]
    if not _compatible(_dim0(x), _dim0(out)):
        return [False]
    a, c = _per_sample(x), _per_sample(out)
    if a is not None and c is not None:
        return [a == c]
    return [_leads_with_batch(shape, b)]


# ---- ops whose batch can come from their shape operand: tf.fill(tf.shape(x), v),
# tf.tile(row, [n, 1]) ----
def _fill(op: tf.Operation, b) -> list[bool]:
    return [bool(op.outputs[0].shape.rank) and _leads_with_batch(op.inputs[0], b)]


def _broadcast_to(op: tf.Operation, b) -> list[bool]:
    return [bool(op.outputs[0].shape.rank)
            and (same_leading(op, b)[0] or _leads_with_batch(op.inputs[1], b))]


def _tile(op: tf.Operation, b) -> list[bool]:
    x, multiples = op.inputs
    m = _const(multiples)
    if b(x):
        return [m is not None and m.size > 0 and int(m[0]) == 1]
    return [_dim0(x) == 1 and multiples.op.type == "Pack" and bool(multiples.op.inputs)
            and _is_batch_size(multiples.op.inputs[0], b)]


def _slice(op: tf.Operation, b) -> list[bool]:
    x = op.inputs[0]
    begin, size = _const(op.inputs[1]), _const(op.inputs[2])
    if not b(x) or begin is None or size is None or begin.size == 0:
        return [False]
    return [int(begin[0]) == 0
            and (int(size[0]) == -1 or (_dim0(x) is not None and int(size[0]) == _dim0(x)))]


def _strided_slice(op: tf.Operation, b) -> list[bool]:
    x, out = op.inputs[0], op.outputs[0]
    if not b(x) or not out.shape.rank:
        return [False]
    mask = {k: _attr(op, k, 0) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                         "shrink_axis_mask")}
    if mask["ellipsis_mask"] & 1:
        return [True]  # x[..., i]: axis 0 inside the ellipsis
    if (mask["new_axis_mask"] | mask["shrink_axis_mask"]) & 1:
        return [False]
    begin, end, strides = (_const(t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None or begin.size == 0:
        return [False]
    whole_start = bool(mask["begin_mask"] & 1) or int(begin[0]) == 0
    n = _dim0(x)
    whole_end = bool(mask["end_mask"] & 1) or (n is not None and int(end[0]) >= n) \
        or int(end[0]) >= 2 ** 31 - 1
    return [whole_start and whole_end and int(strides[0]) == 1]


def _leading_row(value_index: int, row_index: int, unit) -> Rule:
    """Pad: batched when the op leaves axis 0 alone (paddings[0] == [0, 0])."""
    def rule(op, b):
        v = _const(op.inputs[row_index])
        return [b(op.inputs[value_index]) and v is not None and v.size > 0
                and bool(np.all(v[0] == unit))]
    return rule


def _gather(params: int, indices: int, axis_input: int | None) -> Rule:
    def rule(op, b):
        p, i = op.inputs[params], op.inputs[indices]
        if _attr(op, "batch_dims", 0):
            return [b(p) or b(i)]
        axis = 0 if axis_input is None else _axis(_const(op.inputs[axis_input]), p.shape.rank)
        if axis == 0:  # rows picked by the indices: per-sample when the indices are
            return [b(i) and bool(i.shape.rank)]
        return [axis is not None and b(p)]
    return rule


def _one_hot(op: tf.Operation, b) -> list[bool]:
    return [b(op.inputs[0]) and bool(op.inputs[0].shape.rank) and _attr(op, "axis", -1) != 0]


def _einsum(op: tf.Operation, b) -> list[bool]:
    eq = (_attr(op, "equation", b"") or b"").decode().replace(" ", "")
    if "->" not in eq:
        return [False]
    ins, out = eq.split("->")
    lead = out[:3] if out.startswith("...") else out[:1]
    return [bool(lead)
            and any(b(x) and s.startswith(lead) for x, s in zip(op.inputs, ins.split(",")))]


RULES: dict[str, Rule] = {
    **{t: _reduction for t in REDUCTIONS},
    "ArgMax": _along_axis(1), "ArgMin": _along_axis(1),
    "Cumsum": _along_axis(1), "Cumprod": _along_axis(1),
    "CumulativeLogsumexp": _along_axis(1), "ReverseV2": lambda op, b: [b(op.inputs[0]) and (
        (_const(op.inputs[1]) is not None) and 0 not in [
            _axis(a, op.inputs[0].shape.rank) for a in np.atleast_1d(_const(op.inputs[1]))])],
    "MatMul": _matmul, "BatchMatMul": _batch_matmul,
    "BatchMatMulV2": _batch_matmul, "BatchMatMulV3": _batch_matmul,
    "Einsum": _einsum, "Transpose": _transpose, "ConjugateTranspose": _transpose,
    "ConcatV2": _concat(False), "Concat": _concat(True), "Pack": _pack, "Unpack": _unpack,
    "Split": _split(1, 0), "SplitV": _split(0, 2), "ExpandDims": _expand_dims, "Squeeze": _squeeze,
    "Reshape": _reshape, "Slice": _slice, "StridedSlice": _strided_slice,
    "Pad": _leading_row(0, 1, 0), "PadV2": _leading_row(0, 1, 0),
    "MirrorPad": _leading_row(0, 1, 0),
    "GatherV2": _gather(0, 1, 2), "Gather": _gather(0, 1, None),
    "ResourceGather": _gather(0, 1, None),
    "OneHot": _one_hot,
    "FusedBatchNorm": _first_input,
    "FusedBatchNormV2": _first_input, "FusedBatchNormV3": _first_input,
    "SparseSoftmaxCrossEntropyWithLogits": _all_outputs,
    "SoftmaxCrossEntropyWithLogits": _all_outputs,
}
#: rules applied even when no input is batched (the batch size comes in through a shape)
SHAPED: dict[str, Rule] = {"Fill": _fill, "BroadcastTo": _broadcast_to, "Tile": _tile}
