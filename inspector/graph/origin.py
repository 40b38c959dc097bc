"""Where a NaN or Inf was born: the first op, in the graph's dependency order, whose output is
non-finite while the outputs it was computed from are finite.

At the first statistics step that counts a NaN/Inf, every tensor downstream of the origin is
non-finite too, the gradient of the input included, so the first non-finite row in catalog
order names a victim, not the culprit. This walks the run's graph (graph.pb, no TensorFlow):

- **forward**: among the ops with a non-finite output, those whose nearest captured producers
  (uncaptured ops in between are walked through) are all finite; the first in dependency order.
  An input op is the input data; a variable read means the weights were already non-finite
  when the step began, so the value was born in an earlier step's update.
- **backward** (only when the forward pass is finite): among the tensors with a non-finite
  gradient, those whose nearest captured consumers on the loss's path have finite gradients;
  the one nearest the loss. The op that made it is that consumer, whose gradient function
  turned a finite gradient into a non-finite one (a ``tf.norm`` of zeros: d sqrt(0) = Inf).

The step is that of the first statistics step with a NaN/Inf. Where the hook's every-step loss
check saw one earlier, the result says so: the statistics may then show a consequence (weights
already non-finite), and statistics on every step (``stats_every_n_steps=1``) find the origin
at the step it was born.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from inspector.errors import InspectorError
from inspector.format import INPUT_OP_TYPES
from inspector.format.manifest import source_where
from inspector.graph.graphdef import OpGraph

#: op types that read a variable's value: a non-finite one means the weights already were
VARIABLE_READ_TYPES = frozenset({"ReadVariableOp", "VarHandleOp", "VariableV2", "Variable",
                                 "Identity"})


@dataclass
class Origin:
    """The op that made the first NaN/Inf, and the evidence.

    ``where``: 'forward', 'backward', 'input' (the batch held it) or 'weights' (a variable was
    already non-finite when the step ran: born in an earlier update). ``tensor``: the first
    non-finite tensor (for 'backward', the tensor whose gradient turned non-finite); ``op``: the
    op that made it (for 'backward', the consumer whose gradient function did); ``finite``: the
    captured tensors it was computed from, all finite at that step."""
    step: int
    where: str
    op: str
    op_type: str
    tensor: str
    layer: str
    source: str | None
    nan: int
    inf: int
    count: int
    finite: list[str] = field(default_factory=list)
    loss_check_step: int | None = None
    worker: str | None = None
    session: int | None = None

    def text(self) -> str:
        """One sentence: what turned non-finite where, from what, and which step."""
        what = ", ".join(f"{n} {w}" for n, w in ((self.nan, "NaN"), (self.inf, "Inf")) if n) \
            or "non-finite"
        share = f" ({what} of {self.count} values)" if self.count else f" ({what})"
        src = f", created at {self.source}" if self.source else ""
        made = f" from finite {_listed(self.finite)}" if self.finite else ""
        head = {
            "forward": f"{self.op} ({self.op_type}, layer {self.layer}) made the first non-finite "
                       f"values: {self.tensor}{share}{made}",
            "backward": f"the backward pass of {self.op} ({self.op_type}, layer {self.layer}) made "
                        f"the first non-finite gradient: d loss / d {self.tensor}{share}, while "
                        "the gradient it received was finite",
            "input": f"the input data {self.tensor} held non-finite values{share}",
            "weights": f"the weights {self.tensor} (layer {self.layer}) were already "
                       f"non-finite{share}: an earlier update made them so",
        }[self.where]
        tail = f" at step {self.step}{src}"
        if self.loss_check_step is not None and self.loss_check_step < self.step:
            tail += (f"; the loss was already non-finite at step {self.loss_check_step} (the "
                     "hook's every-step check), before this statistics step: "
                     "stats_every_n_steps=1 finds the step it was born")
        return head + tail


def _listed(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def topological_order(graph: OpGraph) -> dict[str, int]:
    """{op: its index in a dependency order} (producers first; a loop's back edge ignored)."""
    order: dict[str, int] = {}
    state: dict[str, int] = {}
    for root in sorted(graph.nodes):
        if root in state:
            continue
        stack = [(root, iter(graph.producers(root)))]
        state[root] = 1
        while stack:
            name, it = stack[-1]
            nxt = next((p for p in it if p in graph.nodes and p not in state), None)
            if nxt is not None:
                state[nxt] = 1
                stack.append((nxt, iter(graph.producers(nxt))))
                continue
            stack.pop()
            state[name] = 2
            order[name] = len(order)
    return order


def nearest_captured(graph: OpGraph, op: str, captured: set[str], up: bool,
                     limit: int = 10_000) -> set[str]:
    """The captured ops nearest ``op`` upstream (``up``) or downstream: each path walked through
    uncaptured ops stops at the first captured one."""
    step = graph.producers if up else (lambda n: graph.consumers.get(n, []))
    found: set[str] = set()
    seen = {op}
    todo = list(step(op))
    while todo and len(seen) < limit:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in captured:
            found.add(name)
        else:
            todo.extend(step(name))
    return found


def captured_ops(catalog: pd.DataFrame, graph: OpGraph) -> tuple[set[str], dict[str, str]]:
    """(the catalog's ops that ``graph`` holds, {op: its first captured tensor})."""
    tensor_of_op: dict[str, str] = {}
    for name, op in zip(catalog["name"], catalog["op"]):
        tensor_of_op.setdefault(op, str(name))
    return {op for op in tensor_of_op if isinstance(op, str) and op in graph.nodes}, tensor_of_op


def layer_of(row: pd.Series | dict) -> str:
    """The layer a catalog row belongs to: its Keras layer, else its name scope."""
    for key in ("keras_layer", "scope"):
        v = row.get(key)
        if isinstance(v, str) and v:
            return v
    name = str(row.get("name", ""))
    return name.rsplit("/", 1)[0] if "/" in name else name


def _bad_ops(rows: pd.DataFrame, catalog: pd.DataFrame, kind: str) -> dict[str, pd.Series]:
    """{op: its first non-finite row of ``kind``}."""
    sub = rows[(rows["kind"] == kind) & ((rows["nan"] > 0) | (rows["inf"] > 0))]
    op_of = dict(zip(catalog["name"], catalog["op"]))
    out: dict[str, pd.Series] = {}
    for _, r in sub.iterrows():
        op = op_of.get(str(r["tensor"]))
        if isinstance(op, str) and op not in out:
            out[op] = r
    return out


def find_origin(rows: pd.DataFrame, catalog: pd.DataFrame, graph: OpGraph,
                step: int) -> Origin | None:
    """The origin at ``step`` from its statistics ``rows`` (group all; columns tensor, kind,
    nan, inf, count) over ``graph``; None if no row counts a NaN/Inf."""
    cat = catalog.set_index("name", drop=False)
    captured, tensor_of_op = captured_ops(catalog, graph)
    order = topological_order(graph)
    forward = _bad_ops(rows, catalog, "forward")
    finite_fwd = captured - set(forward)
    candidates = []
    for op, r in forward.items():
        if op not in graph.nodes:
            continue
        ups = nearest_captured(graph, op, captured, up=True)
        if not ups & set(forward):
            candidates.append((order.get(op, 1 << 60), op, r, sorted(tensor_of_op[u] for u in ups)))
    if candidates:
        _, op, r, inputs = min(candidates, key=lambda c: c[0])
        meta = cat.loc[str(r["tensor"])]
        meta = meta.iloc[0] if isinstance(meta, pd.DataFrame) else meta
        op_type = str(graph.nodes[op].op)
        weights = meta.get("kind") == "variable" or (op_type in VARIABLE_READ_TYPES | INPUT_OP_TYPES
                                                      and isinstance(meta.get("variable"), str))
        # a variable first: a function graph passes a variable's handle in as a Placeholder
        where = "weights" if weights else "input" if op_type in INPUT_OP_TYPES else "forward"
        return Origin(step, where, op, op_type, str(r["tensor"]), layer_of(meta),
                      source_where(meta), int(r["nan"]), int(r["inf"]), int(r.get("count", 0) or 0),
                      [u for u in inputs if _op(cat, u) in finite_fwd])
    return _backward_origin(rows, catalog, cat, graph, order, captured, tensor_of_op, step)


def _op(cat: pd.DataFrame, tensor: str) -> str | None:
    row = cat.loc[tensor] if tensor in cat.index else None
    if row is None:
        return None
    row = row.iloc[0] if isinstance(row, pd.DataFrame) else row
    return str(row["op"])


def _backward_origin(rows: pd.DataFrame, catalog: pd.DataFrame, cat: pd.DataFrame, graph: OpGraph,
                     order: dict[str, int], captured: set[str], tensor_of_op: dict[str, str],
                     step: int) -> Origin | None:
    gradient = _bad_ops(rows, catalog, "gradient")
    with_gradient = set(catalog.loc[catalog["has_gradient"].fillna(False).astype(bool), "op"])
    judged = {op for op in captured if op in with_gradient}
    candidates = []
    for op, r in gradient.items():
        if op not in graph.nodes:
            continue
        downs = nearest_captured(graph, op, judged, up=False)
        if downs and not downs & set(gradient):
            candidates.append((order.get(op, -1), op, r, downs))
    if not candidates:
        return None
    _, op, r, downs = max(candidates, key=lambda c: c[0])
    consumers = [c for c in graph.consumers.get(op, []) if c in graph.nodes]
    maker = min(consumers, key=lambda c: order.get(c, 1 << 60)) if consumers else op
    meta = cat.loc[str(r["tensor"])]
    meta = meta.iloc[0] if isinstance(meta, pd.DataFrame) else meta
    made = cat.loc[tensor_of_op[maker]] if maker in tensor_of_op else meta
    made = made.iloc[0] if isinstance(made, pd.DataFrame) else made
    layer = layer_of(made) if maker in tensor_of_op \
        else (maker.rsplit("/", 1)[0] if "/" in maker else layer_of(meta))
    return Origin(step, "backward", maker, str(graph.nodes[maker].op), str(r["tensor"]), layer,
                  source_where(made) or source_where(meta), int(r["nan"]), int(r["inf"]),
                  int(r.get("count", 0) or 0),
                  sorted(tensor_of_op[d] for d in downs if d in tensor_of_op))


def nonfinite_origin(run: Any, mode: str | None = None, worker: str | None = None,
                     evidence: list[dict] | None = None) -> Origin | None:
    """The origin of the first NaN/Inf the statistics of ``run``'s view (an :class:`inspector.Run`:
    not imported here, which the reader imports) saw (see the module docstring); None if they
    saw none, or the run has no graph to walk."""
    evidence = run.nonfinite_evidence(mode, worker) if evidence is None else evidence
    stats = next((e for e in evidence if e.get("source") == "statistics"), None)
    if stats is None:
        return None
    step, w, s = int(stats["step"]), stats.get("worker"), stats.get("session")
    checks = [int(e["step"]) for e in evidence
              if e.get("source") != "statistics" and e.get("worker") == w]
    try:
        graph = run.op_graph(w, s)
    except (OSError, InspectorError, KeyError):
        return None
    rows = run.query_stats(at_steps=[step], groups=["all"], columns=["nan", "inf", "count"],
                           mode=mode, worker=w, finite_part=True)
    origin = find_origin(rows, run.tensors, graph, step)
    if origin is not None:
        origin.loss_check_step = min(checks) if checks else None
        origin.worker, origin.session = w, s
    return origin


