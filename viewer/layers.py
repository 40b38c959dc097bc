"""The rows of a layer x step view: which layer each tensor belongs to, which row a folded
layer shows, and the network (forward, topological) order of rows. No Streamlit here.

A *layer* is the ICNN layer a tensor belongs to (its ``icnn_layer``, or an ICNN layer whose
scope its scope lies under: the layer's helper ops), else its Keras layer (``keras_layer``),
else the tensor's name scope. A scope TF opened under an op's name (``conv1/Conv2D/ReadVariableOp``
reads the kernel *for* ``conv1/Conv2D``) counts as that op's, and an op outside every scope
(a pooling op, the loss's own ops) is a layer of its own: unrelated unscoped ops are never
folded together. Folded, a layer shows one row: its ICNN ``post_mask`` output, else its last
op output in network order.

Rows are in network order where the run has its graph (``graph.pb``): each op's place in a
topological order of the forward graph's data edges (:func:`network_order`), so a layer the
hook lists late (an ICNN layer's roles) sits between the layers it reads from and feeds.

Not every op is a layer's: the loss's ops (the cross-entropy, a weight-decay term, their sum)
and the labels' (a cast, a one-hot) are the run's plumbing (:func:`plumbing`): the per-layer
views group them apart (the ``part`` column: ``model``, ``loss`` or ``labels``), so a labels cast
that grows never reads as an exploding layer.

Example::

    order = network_order(graph)                          # op name -> place
    parts = plumbing(graph, "loss/Mean:0", "labels:0")    # op name -> "loss" / "labels"
    rows = layer_rows(run.tensors, tensors, order)        # tensor, layer, output
    shown = shown_rows(rows, unfold={"icnn"})
"""
from __future__ import annotations

from typing import Collection, Iterator, Mapping

import numpy as np
import pandas as pd

from inspector.graph.graphdef import OpGraph


def layer_of(scope: str, icnn_layer: object, icnn_layers: Collection[str], owner: str = "") -> str:
    """The layer of a tensor whose op (or the op whose scope it lies in) is ``owner``, in ``scope``.

    >>> layer_of("icnn/helper", None, ["icnn"]), layer_of("conv1", None, ["icnn"])
    ('icnn', 'conv1')
    >>> layer_of("", None, [], "pool1")
    'pool1'
    """
    if isinstance(icnn_layer, str) and icnn_layer:
        return icnn_layer
    under = [L for L in icnn_layers if scope == L or scope.startswith(L + "/")]
    return max(under, key=len) if under else (scope or owner or "(no scope)")


def op_scope(op: str, scope: str, ops: Mapping[str, str]) -> tuple[str, str]:
    """(scope, owner): ``scope`` with the scopes TF opens under an op's own name replaced by that
    op's scope, and the op they lead to; ``ops``: op name -> scope.

    >>> ops = {"conv1/Conv2D": "conv1", "L2Loss": ""}
    >>> op_scope("conv1/Conv2D/ReadVariableOp", "conv1/Conv2D", ops)
    ('conv1', 'conv1/Conv2D')
    >>> op_scope("L2Loss/Read", "L2Loss", ops)
    ('', 'L2Loss')
    """
    seen = set()
    while scope in ops and scope not in seen:
        seen.add(scope)
        op, scope = scope, ops[scope]
    return scope, op


def network_order(graph: OpGraph) -> dict[str, int]:
    """Each op's place in a topological order of the graph's data edges (an op after the ops it
    reads), ties in GraphDef order (the order the ops were created). A TF1 while loop's back
    edge (a ``NextIteration`` output) is not followed, nor any edge closing a cycle, so every
    op gets a place.

    >>> from inspector.graph.graphdef import Node
    >>> network_order(OpGraph([Node("b", "Relu", ("a",)), Node("c", "Relu", ("b",)),
    ...                        Node("a", "Conv2D")]))
    {'a': 0, 'b': 1, 'c': 2}
    """
    def inputs(name: str) -> Iterator[str]:
        return (p for p in graph.producers(name)
                if p in graph.nodes and graph.nodes[p].op != "NextIteration")

    order: dict[str, int] = {}
    for root in graph.nodes:
        if root in order:
            continue
        stack, on_path = [(root, inputs(root))], {root}
        while stack:  # depth-first over inputs, iteratively: graphs hold 100k ops
            name, todo = stack[-1]
            nxt = next((p for p in todo if p not in order and p not in on_path), None)
            if nxt is None:
                stack.pop()
                on_path.discard(name)
                order[name] = len(order)
            else:
                on_path.add(nxt)
                stack.append((nxt, inputs(nxt)))
    return order


#: Ops that hold or read a variable: a weight's read is the model's, whatever it feeds
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "ReadVariableOp",
                          "ResourceGather", "VarIsInitializedOp"})
#: Ops that are no source of data (an op with no data inputs of these types starts nothing)
CONSTANT_OPS = frozenset({"Const", "NoOp", "Fill", "ZerosLike", "OnesLike"})


def _forward(graph: OpGraph, starts: Collection[str], tensors: Collection[str] = (),
             stop: Collection[str] = ()) -> set[str]:
    """The ops reachable along data edges from the ops ``starts`` and from the consumers of the
    tensors ``tensors`` (``op:k``: that output only), themselves included (the ``starts``); an op
    in ``stop`` is reached but not followed."""
    seen = set(starts)
    todo = list(starts)
    wanted = {(t.rsplit(":", 1)[0], t) for t in tensors}
    for op, tensor in wanted:
        bare = tensor[:-2] if tensor.endswith(":0") else tensor
        for c in graph.consumers.get(op, []):
            if c not in seen and any(i in (tensor, bare) for i in graph.nodes[c].inputs):
                seen.add(c)
                todo.append(c)
    while todo:
        op = todo.pop()
        if op in stop:
            continue
        for c in graph.consumers.get(op, []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _backward(graph: OpGraph, start: str) -> set[str]:
    """``start`` and every op it reads, along data edges."""
    seen, todo = {start}, [start]
    while todo:
        for p in graph.producers(todo.pop()):
            if p not in seen and p in graph.nodes:
                seen.add(p)
                todo.append(p)
    return seen


def plumbing(graph: OpGraph | None, loss: str | None, labels: str | None) -> dict[str, str]:
    """{op name: ``labels`` or ``loss``} of the ops that are not the model's layers:

    - ``labels``: computed from the labels alone (with constants): a cast, a one-hot;
    - ``loss``: an op the loss reads that combines the labels with the model's output (the
      cross-entropy, its mean, the loss's sum), or that reads the weights but no input data (a
      weight-decay term, its coefficient's product); the loss op itself.

    The model's input data is every source op other than the labels' output, a variable or a
    constant. Without a graph: only the manifest's loss and labels tensors' ops.

    >>> from inspector.graph.graphdef import Node
    >>> g = OpGraph([Node("x", "Placeholder"), Node("y", "Placeholder"), Node("w", "VarHandleOp"),
    ...     Node("r", "ReadVariableOp", ("w",)), Node("mm", "MatMul", ("x", "r")),
    ...     Node("cast", "Cast", ("y",)), Node("xent", "Xent", ("mm", "cast")),
    ...     Node("l2", "L2Loss", ("r",)), Node("loss", "AddN", ("xent", "l2"))])
    >>> sorted(plumbing(g, "loss:0", "y:0").items())
    [('cast', 'labels'), ('l2', 'loss'), ('loss', 'loss'), ('xent', 'loss'), ('y', 'labels')]

    Features and labels from one input pipeline op (an Estimator's ``IteratorGetNext``):

    >>> g = OpGraph([Node("it", "IteratorV2"), Node("next", "IteratorGetNext", ("it",)),
    ...     Node("w", "VariableV2"), Node("mm", "MatMul", ("next", "w")),
    ...     Node("Cast_1", "Cast", ("next:1",)), Node("xent", "Xent", ("mm", "Cast_1"))])
    >>> sorted(plumbing(g, "xent:0", "next:1").items())
    [('Cast_1', 'labels'), ('xent', 'loss')]
    """
    out: dict[str, str] = {}
    loss_op = loss.rsplit(":", 1)[0] if loss else None
    labels_op = labels.rsplit(":", 1)[0] if labels else None
    if graph is None or loss_op not in (graph.nodes if graph else ()):
        out.update({labels_op: "labels"} if labels_op else {})
        out.update({loss_op: "loss"} if loss_op else {})
        return out
    nodes = graph.nodes
    sources = [n for n, node in nodes.items() if not graph.producers(n)]
    variables = _forward(graph, [n for n in sources if nodes[n].op in VARIABLE_OPS])
    inputs = [n for n in sources if n != labels_op and nodes[n].op not in VARIABLE_OPS
              and nodes[n].op not in CONSTANT_OPS]
    # the input data flows through the labels' op (an IteratorGetNext yields features and
    # labels) by its other outputs only
    other = [f"{labels_op}:{k}" for k in range(8)] if labels_op in nodes else []
    data = _forward(graph, inputs, stop={labels_op} if labels_op else set()) \
        | _forward(graph, [], [t for t in other if t != labels])
    from_labels = _forward(graph, [], [labels]) if labels and labels_op in nodes else set()
    if labels_op in nodes and labels_op not in data:
        from_labels.add(labels_op)
    read = _backward(graph, loss_op)
    for op in read:
        kind = nodes[op].op
        if op in from_labels and op not in data and op not in variables:
            out[op] = "labels"
        elif op == loss_op or (op in from_labels and op in data) or (
                op in variables and op not in data and kind not in VARIABLE_OPS
                and not _reads_only_variables(graph, op)):
            out[op] = "loss"
    # a label op the loss does not read (a metric's cast) is the labels' too
    for op in from_labels - data - variables:
        out.setdefault(op, "labels")
    return out


def _reads_only_variables(graph: OpGraph, op: str) -> bool:
    """True for a variable's read under another name (an ``Identity`` of a ``VariableV2``)."""
    ins = graph.producers(op)
    return graph.nodes[op].op == "Identity" and bool(ins) and all(
        p in graph.nodes and graph.nodes[p].op in VARIABLE_OPS for p in ins)


def positions(catalog: pd.DataFrame, tensors: list[str],
              order: Mapping[str, int] | None) -> np.ndarray:
    """Each tensor's place in network order (its op's in ``order``); a tensor whose op the graph
    lacks takes the place of the tensor listed before it in ``catalog`` (so it stays beside it).
    Without ``order``: the catalog's order."""
    index = {n: i for i, n in enumerate(catalog["name"])}
    if not order:
        return np.array([index[t] for t in tensors], np.float64)
    place, last = {}, -1.0
    for name, op in zip(catalog["name"], catalog["op"] if "op" in catalog else catalog["name"]):
        last = float(order[op]) if op in order else last
        place[name] = last
    return np.array([place[t] for t in tensors], np.float64)


def layer_rows(catalog: pd.DataFrame, tensors: list[str],
               order: Mapping[str, int] | None = None,
               parts: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per tensor of ``tensors``: its ``layer``, whether it is the layer's ``output``
    (the row a folded layer shows): the ICNN ``post_mask``, else the layer's last op output (not
    a variable record), else its last row; and its ``part``: ``model``, or ``loss`` / ``labels``
    for an op in ``parts`` (:func:`plumbing`) that no Keras or ICNN layer holds. In network
    order with ``order`` (:func:`network_order`; a layer's rows together, at its output's place,
    variable records after its ops), else in ``tensors``' order."""
    # no statistics of this kind (a run without gradients): no rows, not a KeyError
    if not len(tensors):
        return pd.DataFrame({"tensor": [], "layer": [], "output": [], "part": []}, dtype=object)
    cat = catalog.loc[tensors]
    icnn = sorted({str(v) for v in catalog["icnn_layer"].dropna()})
    ops = dict(zip(catalog["op"], catalog["scope"].fillna(""))) if "op" in catalog else {}
    op_of = cat["op"] if "op" in cat else cat["name"]
    keras = cat["keras_layer"] if "keras_layer" in cat \
        else pd.Series(None, index=cat.index, dtype=object)
    layers = [k if isinstance(k, str) and k and not (isinstance(ly, str) and ly) else
              layer_of(*_scoped(str(op), str(s), ops, icnn, ly))
              for op, s, ly, k in zip(op_of, cat["scope"].fillna(""), cat["icnn_layer"], keras)]
    kind = cat["kind"] if "kind" in cat else pd.Series("tensor", index=cat.index)
    df = pd.DataFrame({"tensor": tensors, "layer": layers, "role": list(cat["icnn_role"]),
                       "op_output": list(kind.fillna("tensor") != "variable"),
                       "place": positions(catalog, tensors, order)})
    # a stable sort: tensors of one op (IdentityN:0, :1) and of one place keep their order
    if order:
        df = df.sort_values("place", kind="stable").reset_index(drop=True)
    post = df[df["role"] == "post_mask"].groupby("layer")["tensor"].first()
    last = df.groupby("layer")["tensor"].last()
    last_op = df[df["op_output"]].groupby("layer")["tensor"].last()
    out_of = {**last.to_dict(), **last_op.to_dict(), **post.to_dict()}
    df["output"] = [out_of[ly] == t for t, ly in zip(df["tensor"], df["layer"])]
    df["part"] = _parts(catalog, df["tensor"], parts or {})
    # an ICNN layer's helper ops (its filter loss's slices) are the layer's, whatever they feed
    df.loc[df["layer"].isin(icnn), "part"] = "model"
    if order:  # each layer's rows together, at its output's place; variable records after its ops
        at = df["layer"].map(df[df["output"]].set_index("layer")["place"])
        df = df.assign(at=at, var=~df["op_output"]).sort_values(["at", "layer", "var", "place"],
                                                                kind="stable")
    return df.drop(columns=[c for c in ("role", "op_output", "place", "at", "var")
                            if c in df]).reset_index(drop=True)


def _parts(catalog: pd.DataFrame, tensors: pd.Series, parts: Mapping[str, str]) -> list[str]:
    """Each tensor's part: ``parts``' for its op, unless a Keras or ICNN layer holds it (a layer
    is the model's whatever it reads), else ``model``."""
    out = []
    for t in tensors:
        row = catalog.loc[t]
        op = str(row["op"]) if "op" in catalog else t.rsplit(":", 1)[0]
        held = any(isinstance(row.get(c), str) and row.get(c)
                   for c in ("keras_layer", "icnn_layer"))
        kind = row.get("kind")
        out.append("model" if held or kind == "variable" else parts.get(op, "model"))
    return out


def _scoped(op: str, scope: str, ops: Mapping[str, str], icnn: list[str], icnn_layer: object
            ) -> tuple[str, object, list[str], str]:
    """:func:`layer_of`'s arguments for a tensor of ``op`` in ``scope``."""
    scope, owner = op_scope(op, scope, ops)
    return scope, icnn_layer, icnn, owner


def shown_rows(rows: pd.DataFrame, unfold: Collection[str] = (),
               all_ops: bool = False) -> pd.DataFrame:
    """The rows to draw: every op of the layers in ``unfold`` (all if ``all_ops``), the output
    row of the others, with ``label``: the tensor, and '(+N ops)' on a folded layer's row."""
    size = rows.groupby("layer")["tensor"].transform("size")
    open_ = rows["layer"].isin(set(unfold)) | all_ops
    # a layer whose output row was left out (a loss op in a model's scope) shows its last row
    has_out = rows.groupby("layer")["output"].transform("any").astype(bool)
    last = ~rows["layer"].duplicated(keep="last")
    keep = rows[open_ | rows["output"] | (~has_out & last)].copy()
    hidden = (size - 1)[keep.index]
    folded = ~open_[keep.index] & (hidden > 0)
    keep["label"] = [f"{t} (+{h} ops of {ly})" if f else t
                     for t, h, ly, f in zip(keep["tensor"], hidden, keep["layer"], folded)]
    return keep.reset_index(drop=True)
