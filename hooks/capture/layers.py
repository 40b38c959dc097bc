"""The tensors of the always-on statistics (``layer_stats_every_n_steps``): each layer's output
as Grappler's fused ops produce it, and d loss / d that output.

Grappler's remapper (and oneDNN's graph pass after it) fuses a contraction with the bias, batch
norm, residual add and activation that follow it into one op (``_FusedConv2D``,
``_FusedMatMul``, ``_FusedBatchNormEx``, ...) only where nothing else reads the intermediate
outputs. A statistics step that reads every op's output splits each of them apart again
(bench/README.md, "Step profile"). These statistics read only what the fused ops produce: a
captured tensor is left out where its op's output has one consumer in the model's graph and
that consumer is one the op fuses into (:data:`FUSES_INTO`), and so are tensors computed from
no variable (the input images, the labels: their gradient, ``d loss / d input``, is one more
backward convolution that training never runs), the variables' own reads, and tensors that
are not per sample (weight-decay terms and their sums: one small op each, whose fixed cost
adds up), the loss excepted.

Example::

    chosen = layer_outputs(captured, graph_ops_before_the_hook, loss)
"""
from __future__ import annotations

from typing import Iterable, Sequence

import tensorflow as tf

from hooks.capture.select import Captured

CONTRACTIONS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul",
                          "BatchMatMulV2", "BatchMatMulV3"})
BIASES = frozenset({"BiasAdd", "BiasAddV1", "Add", "AddV2"})
NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Selu",
                         "Softplus", "Gelu"})
#: op type -> the consumer types Grappler fuses it into (contraction + bias/norm [+ add]
#: [+ activation]; norm [+ add] + activation)
FUSES_INTO: dict[str, frozenset[str]] = {
    **{op: BIASES | NORMS for op in CONTRACTIONS},
    **{op: ACTIVATIONS | {"Add", "AddV2"} for op in BIASES | NORMS},
}
#: ops that hold or read a variable: what the "computed from a variable" walk starts from
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})


def fused_away(t: tf.Tensor, model_ops: set[str]) -> bool:
    """Whether ``t`` is an intermediate output of a chain Grappler fuses: its only consumer among
    ``model_ops`` (the graph's ops before the hook added its own) is one its op fuses into."""
    into = FUSES_INTO.get(t.op.type)
    if not into:
        return False
    consumers = [c for c in t.consumers() if c.name in model_ops]
    return len(consumers) == 1 and consumers[0].type in into


def from_variables(ops: Iterable[tf.Operation]) -> set[str]:
    """Names of the ops computed from a variable (data inputs, transitively); ``ops`` in creation
    order (an op's inputs before it), as ``Graph.get_operations`` lists them."""
    out: set[str] = set()
    for op in ops:
        if op.type in _VARIABLE_OPS or any(x.op.name in out for x in op.inputs):
            out.add(op.name)
    return out


def layer_outputs(captured: Sequence[Captured], model_ops: Sequence[tf.Operation],
                  loss: tf.Tensor | None = None) -> list[Captured]:
    """The entries of ``captured`` whose tensors the always-on statistics read (module doc), in
    their order; ``model_ops``: the graph's ops before the hook built any, in creation order."""
    names = {op.name for op in model_ops}
    computed = from_variables(model_ops)
    loss_name = loss.name if loss is not None else None
    return [c for c in captured
            if (c.batched or c.name == loss_name) and c.tensor.op.name in computed
            and not _weights(c.tensor.op) and not fused_away(c.tensor, names)]


def _weights(op: tf.Operation) -> bool:
    """A variable, or a read of one's whole value (a resource read, a reference variable's
    ``w/read``): the weights, not a layer's output."""
    return op.type in _VARIABLE_OPS or op.type == "ReadVariableOp" or (
        op.type == "Identity" and bool(op.inputs) and op.inputs[0].op.type in _VARIABLE_OPS)
