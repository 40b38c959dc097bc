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

Example::

    order = network_order(graph)                          # op name -> place
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
               order: Mapping[str, int] | None = None) -> pd.DataFrame:
    """One row per tensor of ``tensors``: its ``layer`` and whether it is the layer's ``output``
    (the row a folded layer shows): the ICNN ``post_mask``, else the layer's last op output (not
    a variable record), else its last row. In network order with ``order`` (:func:`network_order`;
    a layer's rows together, at its output's place, variable records after its ops), else in
    ``tensors``' order."""
    # no statistics of this kind (a run without gradients): no rows, not a KeyError
    if not len(tensors):
        return pd.DataFrame({"tensor": [], "layer": [], "output": []}, dtype=object)
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
    if order:  # each layer's rows together, at its output's place; variable records after its ops
        at = df["layer"].map(df[df["output"]].set_index("layer")["place"])
        df = df.assign(at=at, var=~df["op_output"]).sort_values(["at", "layer", "var", "place"],
                                                                kind="stable")
    return df.drop(columns=[c for c in ("role", "op_output", "place", "at", "var")
                            if c in df]).reset_index(drop=True)


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
    keep = rows[open_ | rows["output"]].copy()
    hidden = (size - 1)[keep.index]
    folded = ~open_[keep.index] & (hidden > 0)
    keep["label"] = [f"{t} (+{h} ops of {ly})" if f else t
                     for t, h, ly, f in zip(keep["tensor"], hidden, keep["layer"], folded)]
    return keep.reset_index(drop=True)
