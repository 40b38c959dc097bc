"""Per-variable records: value, d loss / d variable over all its reads, and the step's update.

A weight's gradient at one read (``conv1/w/ReadVariableOp:0``) misses every other read of
the same variable, e.g. the weight-decay term's. A *variable record* is a catalog entry of
kind ``variable`` named by the variable (``conv1/w``) with:

- ``forward``: the value this step read, before the update (the read the forward pass
  already does; its statistics and dump are shared with that read, so they cost nothing);
- ``gradient``: the sum of d loss / d read over every forward read of the variable, which is
  ``tf.gradients(loss, variable)``; a ``ResourceGather`` (embedding lookup) contributes its
  IndexedSlices densified to the variable's shape. A variable read by another op type gets
  no gradient (``gradient_note`` says why);
- ``update``: value after the step's update minus value before. The training run copies
  the "before" read into a snapshot variable beside it; in ``after_run``'s one extra run the
  graph subtracts the snapshot from a second read and computes the statistics (the fused
  kernel: one pass, off the Python thread). Only on statistics and dump steps. Where the
  training run itself makes every write of the variables and of the global step (a plain
  optimizer step, checked per set of fetches), :class:`SameRun` reads them in that run, after
  those writes, instead, and no extra run is needed.

Example::

    records = find_records(graph, backward_ops, gradients_of)   # list[VariableRecord]
    updates = Updates(records, bins=30)
    session.run([train_op, updates.save])        # the training run takes the snapshots
    deltas, rows = session.run([updates.delta, updates.stats])
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from hooks.capture.feeds import feeds, zero_gradient_expected
from hooks.capture.fetchable import FUNCTIONAL, ancestors, upstream, written
from hooks.capture.select import DEFAULT_EXCLUDE, Captured
from hooks.stats.fast import build_stats
from inspector.format import STAT_COLUMNS, hist_sample
from inspector.format.loghist import sparse_of

log = logging.getLogger("tf_inspector")
v1 = tf.compat.v1
_EXCLUDE = [re.compile(p) for p in DEFAULT_EXCLUDE]
#: op types that touch a variable's handle without reading it for the forward pass
_NOT_READS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                        "VarIsInitializedOp", "DestroyResourceOp", "VariableShape"})


@dataclass
class VariableRecord(Captured):
    """A trainable variable: ``tensor`` is a forward read (its value before the update)."""
    variable: str = ""
    handle_op: str = ""
    reads: list[str] = field(default_factory=list)
    after: tf.Tensor | None = None          # a read run after the step's update
    note: str | None = None                 # why there is no gradient, if there is none

    @property
    def name(self) -> str:
        return self.variable

    def catalog_entry(self) -> dict:
        e = super().catalog_entry()
        e.update(name=self.variable, op=self.handle_op, op_type="VarHandleOp", kind="variable",
                 scope=self.variable.rpartition("/")[0], variable=self.variable, reads=self.reads,
                 has_update=self.after is not None, gradient_note=self.note)
        return e


def selected(name: str, include=None, exclude=None, op_types=None, exclude_op_types=None,
             **_) -> bool:
    """Whether the hook's filters keep the record of variable ``name``: ``op_types`` must name
    ``VarHandleOp`` if given, and ``include``/``exclude`` apply to the variable's name.

    >>> selected("conv1/w", include="^conv"), selected("conv1/w", op_types=["Relu"])
    (True, False)
    """
    from hooks.options import compile_patterns
    if (op_types and "VarHandleOp" not in op_types) or "VarHandleOp" in (exclude_op_types or ()):
        return False
    inc, exc = compile_patterns(include), compile_patterns(exclude)
    return (not inc or any(p.search(name) for p in inc)) and not any(p.search(name) for p in exc)


def _forward(op: tf.Operation, backward: set[str]) -> bool:
    return (op.name not in backward and not op.name.startswith("tf_inspector/")
            and not any(p.search(op.name) for p in _EXCLUDE))


def variable_of(t: tf.Tensor) -> str | None:
    """The variable a read (ReadVariableOp, or a ref variable's Identity) reads, else None."""
    op = t.op
    if op.type == "ReadVariableOp" \
            or (op.type == "Identity" and op.inputs and op.inputs[0].op.type == "VariableV2"):
        src = op.inputs[0].op
        while src.type == "Identity" and src.inputs:
            src = src.inputs[0].op
        return src.name if src.type in ("VarHandleOp", "VariableV2") else None
    return None


def _densify(grad: tf.Tensor, gather: tf.Operation, shape: tf.TensorShape) -> tf.Tensor:
    """d loss / d params of a ResourceGather (axis 0) as a dense tensor of the variable's shape."""
    idx = tf.reshape(gather.inputs[1], [-1])
    rows = tf.reshape(grad, tf.concat([[-1], tf.shape(grad)[tf.rank(gather.inputs[1]):]], 0))
    return tf.math.unsorted_segment_sum(rows, idx, shape.as_list()[0] or tf.shape(idx)[0])


def find_records(graph: tf.Graph, backward: set[str],
                 gradients_of: Callable[[list[tf.Tensor]], list[tf.Tensor | None]] | None,
                 filters: dict | None = None,
                 loss: tf.Tensor | None = None) -> list[VariableRecord]:
    """One record per trainable resource variable that the forward pass reads.

    ``gradients_of(tensors)``: d loss / d t for each t (the hook's shared machinery), or None
    without a loss. ``filters``: the hook's include/exclude/op_types (see :func:`selected`).
    ``loss``: an op of another type taking the handle whose outputs the loss is not computed
    from (a canned model's ``zero_fraction`` summary reads its weights inside a TF2 cond)
    adds nothing to d loss / d variable, so the reads' gradients still sum to it."""
    upstream = ancestors(loss) if loss is not None else None
    plans, refs = [], []
    for var in graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES):
        if not selected(var.op.name, **(filters or {})):
            continue
        handle = getattr(var, "handle", None)
        if handle is None or handle.dtype != tf.resource:
            refs.append(var.op.name)
            continue
        uses = [op for op in handle.consumers()
                if _forward(op, backward) and op.type not in _NOT_READS]
        reads = [op.outputs[0] for op in uses if op.type == "ReadVariableOp"]
        gathers = [op for op in uses if op.type == "ResourceGather"]
        others = sorted({op.type for op in uses
                         if upstream is None or any(t.name in upstream for t in op.outputs)}
                        - {"ReadVariableOp", "ResourceGather"})
        if reads or gathers:
            plans.append((var, reads, gathers, others))
    if refs:  # reference variables: their reads are captured (Identity 'w/read'), not summed
        log.info("no variable records for %d reference (non-resource) variables: %s", len(refs),
                 ", ".join(refs[:10]) + (" ..." if len(refs) > 10 else ""))
    wanted = [t for _, reads, gathers, _ in plans for t in reads + [g.outputs[0] for g in gathers]]
    grads = dict(zip((t.name for t in wanted), gradients_of(wanted))) if gradients_of and wanted \
        else {}
    keep = {op.name for op in graph.get_operations() if _forward(op, backward)}
    return [_record(var, reads, gathers, others, grads, keep)
            for var, reads, gathers, others in plans]


def _record(var, reads: list[tf.Tensor], gathers: list[tf.Operation], others: list[str],
            grads: dict, keep: set[str]) -> VariableRecord:
    with tf.name_scope("tf_inspector/variables"):
        parts = [grads.get(t.name) for t in reads]
        parts += [None if grads.get(g.outputs[0].name) is None
                  else _densify(grads[g.outputs[0].name], g, var.shape)
                  for g in gathers]
        parts = [p for p in parts if p is not None]
        note = (f"read by {', '.join(others)} on the loss's path, whose gradient the record does "
                "not sum (it sums ReadVariableOp and ResourceGather reads only: without that path "
                f"the sum would not be d loss / d variable)" if others else None)
        gradient = None if note or not parts else (parts[0] if len(parts) == 1 else tf.add_n(parts))
        # the value before the update: a read that reaches the loss runs before the optimizer's
        # update (the update needs the gradient, which needs the forward pass through that read)
        connected = [t for t in reads if grads.get(t.name) is not None]
        before = (connected or reads or [tf.raw_ops.ReadVariableOp(resource=var.handle,
                                                                   dtype=var.dtype.base_dtype)])[0]
        after = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=var.dtype.base_dtype)
    zero = bool(reads) and not gathers \
        and all(zero_gradient_expected(t, keep) for t in connected or reads)
    uses = sorted({k for t in reads for k in feeds(t, keep)} | {g.type for g in gathers})
    return VariableRecord(before, False, gradient, variable=var.op.name,
                          handle_op=var.handle.op.name, reads=[t.name for t in reads], after=after,
                          note=note, extra={"feeds": uses, "zero_gradient_expected": zero})


def stats_rows(records: Sequence[VariableRecord]) -> list[tuple[str, str, str]]:
    """(tensor, kind, group) rows of the update statistics, appended to the in-graph rows."""
    return [(r.variable, "update", "all") for r in records]


def numpy_stats(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray]:
    """Statistics of each array (not batched), as the in-graph kernels compute them: values
    [n, 9] in STAT_COLUMNS order and the n rows' log-magnitude histograms as (splits [n + 1],
    bucket index [N], count [N]) (``inspector.format.loghist``). Vectorized over the arrays (a
    per-array loop pays numpy's fixed cost per call for every variable).

    >>> values, splits, index, count = numpy_stats([np.array([0.0, 1.0, np.nan]), np.ones(2)])
    >>> values[:, :2].tolist(), splits.tolist(), index.tolist(), count.tolist()
    ([[3.0, 0.5], [2.0, 1.0]], [0, 2, 3], [0, 1010, 1010], [1, 1, 2])
    """
    n = len(arrays)
    flat = [np.asarray(a, np.float64).ravel() for a in arrays]
    sizes = np.array([a.size for a in flat])
    seg = np.repeat(np.arange(n), sizes)
    x = np.concatenate(flat) if n else np.zeros(0)
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0.0)

    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if n \
        else np.zeros(0, np.int64)
    full = sizes > 0

    def ssum(v: np.ndarray) -> np.ndarray:  # per-array sums (reduceat: no empty segments)
        out = np.zeros(n)
        out[full] = np.add.reduceat(v, starts[full]) if v.size else 0.0
        return out

    c = ssum(fin.astype(np.float64))
    mean = ssum(xf) / np.maximum(c, 1)
    m2 = ssum(np.where(fin, x - mean[seg], 0.0) ** 2)  # two passes: exact when |mean| >> std
    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
    lo[full] = np.minimum.reduceat(np.where(fin, x, np.inf), starts[full])
    hi[full] = np.maximum.reduceat(np.where(fin, x, -np.inf), starts[full])
    nan = ssum(np.isnan(x).astype(np.float64))
    has = c > 0
    std = np.sqrt(m2 / np.maximum(c, 1))
    values = np.stack([sizes.astype(np.float64), np.where(has, mean, np.nan),
                       np.where(has, std, np.nan), np.where(has, lo, np.nan),
                       np.where(has, hi, np.nan), np.sqrt(m2 + c * mean ** 2),
                       ssum((x == 0).astype(np.float64)) / np.maximum(sizes, 1), nan,
                       sizes - c - nan], 1)
    # a histogram counts a subsample of large tensors (FORMAT.md)
    splits, index, count = sparse_of([hist_sample(a, 1).ravel() if a.size else a for a in flat])
    assert values.shape[1] == len(STAT_COLUMNS)
    return values, splits, index, count


class Updates:
    """The update (after - before) of every variable record on sampled training steps.

    The step's run copies each variable's forward read (its value before the update) into a
    private snapshot variable beside it; one extra ``session.run`` after the step (which also
    reads the exact global step) subtracts the snapshot from a fresh read and computes the
    statistics in the graph. Nothing crosses to the host but the rows (and, in a dump, the
    updates): fetching the values before and feeding them back, and numpy's statistics of the
    updates (:func:`numpy_stats`), would cost every sampled step host copies and CPU time.

    The snapshots are in no collection (never saved, initialised or waited for by a
    Scaffold); each is written before it is read in every session. ``owner`` (the worker)
    names them apart where a parameter server would otherwise share them between workers."""

    def __init__(self, records: Sequence[VariableRecord], use_native: bool = True,
                 owner: str = "") -> None:
        self.records = [r for r in records if r.after is not None]
        with tf.name_scope("tf_inspector/updates"):
            saves, self.delta = [], {}
            for r in self.records:
                # where the variable lives: no copy elsewhere
                with r.tensor.graph.colocate_with(r.tensor.op):
                    # the op's graph-unique name keeps two hooks' snapshots apart in one session
                    name = tf.compat.v1.get_default_graph().unique_name("before",
                                                                        mark_as_used=False)
                    handle = tf.raw_ops.VarHandleOp(dtype=r.tensor.dtype, shape=r.tensor.shape,
                                                    shared_name=f"tf_inspector/{owner}/{name}",
                                                    name="before")
                    saves.append(tf.raw_ops.AssignVariableOp(resource=handle, value=r.tensor))
                    before = tf.raw_ops.ReadVariableOp(resource=handle, dtype=r.tensor.dtype)
                #: {variable: value after this step's update - value before}
                self.delta[r.variable] = tf.subtract(_host(r.after), _host(before), name="update")
            #: fetched with the training run: the snapshots of the values before its update
            self.save = tf.group(*saves, name="save_before")
            #: rows for :func:`stats_rows`, in record order: (values, hist splits, index, count)
            self.stats = update_stats([self.delta[r.variable] for r in self.records], use_native)


class SameRun:
    """The reads ``Updates`` and the global step need after a step, made in the training run
    itself: each variable read again with control dependencies on the optimizer's writes of it,
    the global step after its increment. Fetched only with a run whose ops make exactly those
    writes (:meth:`reads_for`): that run's reads then see what an extra run after it would (no
    other write comes between), and the extra ``session.run`` after a sampled step (about half a
    millisecond of the training thread's time) is not needed. Values identical: the update is
    the same read after minus the same forward read before, through the same statistics.

    ``records``: the variable records (those with ``after``); ``global_step``: the variable, or
    None; ``backward``: ``capture.backward_ops``: the optimizer's writes are among them."""

    def __init__(self, graph: tf.Graph, records: Sequence[VariableRecord], global_step,
                 backward: set[str], use_native: bool = True) -> None:
        self.graph = graph
        writes = written(graph, {op.name for op in graph.get_operations()})
        #: variable op name -> the writes a run must make, all of them and no other
        self.expected: dict[str, frozenset[str]] = {}
        self.records = [r for r in records if r.after is not None]
        self.delta: dict[str, tf.Tensor] = {}
        self.step: dict[str, tf.Tensor] = {}   # the increment's op name -> the step after it
        self._plans: dict[tuple, dict[str, tf.Tensor] | None] = {}
        self._needs_step = global_step is not None   # and without a resource handle, never read
        handle = getattr(global_step, "handle", None)
        self._step_op = handle.op.name if handle is not None else ""
        waits = {r.variable: self._writes(writes, r.handle_op, backward) for r in self.records}
        incs = self._writes(writes, self._step_op, backward, expect=False) if handle is not None \
            else []
        #: whether reads can wait on the writes: not on a write inside a v1 cond or loop (a read
        #: after an update its cond did not take would have no value, and fail the training run),
        #: nor on a TF2 cond or loop that may write (a loss scale's: it may skip the update)
        self.usable = not any(op.type in FUNCTIONAL
                              or getattr(op, "_control_flow_context", None) is not None
                              for ops in [*waits.values(), incs] for op in ops)
        self.stats = None
        if not self.usable:
            return
        with tf.name_scope("tf_inspector/same_run"):
            for r in self.records:
                with tf.control_dependencies(waits[r.variable]), graph.colocate_with(r.after.op):
                    after = tf.raw_ops.ReadVariableOp(resource=r.after.op.inputs[0],
                                                      dtype=r.after.dtype)
                self.delta[r.variable] = tf.subtract(_host(after), _host(r.tensor), name="update")
            self.stats = update_stats([self.delta[r.variable] for r in self.records],
                                      use_native) if self.records else None
            if handle is not None:
                for op in incs:
                    with tf.control_dependencies([op]), graph.colocate_with(handle.op):
                        self.step[op.name] = tf.raw_ops.ReadVariableOp(
                            resource=handle, dtype=global_step.dtype.base_dtype)

    def _writes(self, writes: dict[str, set[str]], var: str, backward: set[str],
                expect: bool = True) -> list[tf.Operation]:
        """The optimizer's writes of ``var`` (``expect``: those a run must make, all of them)."""
        names = sorted(w for w in writes.get(var, ()) if w in backward)
        if expect:
            self.expected[var] = frozenset(names)
        return [self.graph.get_operation_by_name(w) for w in names]

    @property
    def planned(self) -> bool:
        """Whether some run's plan is known (a plan walks the graph once per set of fetches)."""
        return bool(self._plans)

    def reads_for(self, key: tuple, fetches: list) -> dict[str, tf.Tensor] | None:
        """``{"step", "update", "update_stats"}`` to fetch with a run of ``fetches`` (graph
        elements; ``key`` names them), or None where that run does not make exactly the writes
        the reads wait for: another write, a missing one, a TF2 cond or loop that may write (a
        loss scale's), or a global step advanced by none or by several writes."""
        if not self.usable:
            return None
        if key not in self._plans:
            if len(self._plans) > 256:
                self._plans.clear()
            self._plans[key] = self._plan(fetches)
        return self._plans[key]

    def _plan(self, fetches: list) -> dict[str, tf.Tensor] | None:
        try:
            roots = [f if isinstance(f, tf.Operation) else f.op for f in
                     (self.graph.as_graph_element(f) if isinstance(f, str) else f for f in fetches)]
        except (KeyError, ValueError, TypeError, AttributeError):
            return None
        reached = written(self.graph, upstream(roots))
        if any(reached.get(var, set()) != set(ops) for var, ops in self.expected.items()):
            return None
        reads: dict[str, tf.Tensor] = {}
        if self._needs_step:
            made = reached.get(self._step_op, set())
            if len(made) != 1 or next(iter(made)) not in self.step:
                return None
            reads["step"] = self.step[next(iter(made))]
        if self.stats is not None:
            reads["update"], reads["update_stats"] = self.delta, self.stats
        return reads


def update_stats(deltas: Sequence[tf.Tensor], use_native: bool = True) -> tuple:
    """(values, hist splits, hist index, hist count) of the updates ``deltas`` in the graph, one
    statistics row each (unbatched, no groups), in order: the rows that follow the captured
    tensors' rows."""
    fetch = build_stats([Captured(d, batched=False, gradient=None) for d in deltas], None,
                        use_native)
    return fetch.tensors()


def _host(t: tf.Tensor) -> tf.Tensor:
    """numpy lacks bfloat16: fetch it as float32."""
    return tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t
