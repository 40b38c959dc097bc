"""The run's op graph (``graph.<worker>.s<session>.pb``, a serialized GraphDef) without TensorFlow.

A minimal protobuf wire-format decoder reads what the viewer's graph page needs: each node's
``name`` (NodeDef field 1), ``op`` (2), ``input`` (3) and ``device`` (4); every other field
(attributes, shapes, constants, the function library) is skipped by its length, never parsed.
Malformed bytes raise ``DamagedFileError``; nothing here can read past the buffer.

Example::

    g = OpGraph(parse_graph_def(run.graph_def_bytes()))
    near = g.neighbourhood("conv2/Relu", hops=2, max_nodes=60)
    near.nodes        # {op name: signed distance: -k producers, 0 the centre, +k consumers}
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from inspector.errors import DamagedFileError

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: The most bytes a graph file may hold: checked before it is read, as manifests are against
#: ``manifest_schema.MAX_MANIFEST_BYTES``; a larger one is refused with its name and size.
#: (A GraphDef inlines its constants, so it can be far larger than a manifest; 256 MiB holds
#: the graph of a model with ~60M float constants, and a 2 GiB protobuf is the format's limit.)
MAX_GRAPH_BYTES = 256 * 1024 ** 2


@dataclass(frozen=True)
class Node:
    """One NodeDef: ``inputs`` as stored (``op``, ``op:1``, ``^op`` for a control input)."""
    name: str
    op: str = ""
    inputs: tuple[str, ...] = ()
    device: str = ""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterable[tuple[int, int, object]]:
    """(field number, wire type, value) of a message: an int, or a memoryview for LEN fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == _LEN:
            n, pos = _varint(buf, pos)
            if n > len(buf) - pos:
                raise ValueError(f"a field of {n} bytes runs past the end ({len(buf) - pos} left)")
            yield number, wire, buf[pos:pos + n]
            pos += n
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(buf):
                raise ValueError("truncated fixed-width field")
        else:  # 3/4: deprecated groups, 6/7: invalid; a GraphDef has none
            raise ValueError(f"unexpected wire type {wire} (field {number})")


def _text(value: object) -> str:
    if not isinstance(value, memoryview):
        raise ValueError("a string field is not length-delimited")
    return bytes(value).decode("utf-8")


def _node(buf: memoryview) -> Node:
    name, op, device, inputs = "", "", "", []
    for number, _, value in _fields(buf):
        if number == 1:
            name = _text(value)
        elif number == 2:
            op = _text(value)
        elif number == 3:
            inputs.append(_text(value))
        elif number == 4:
            device = _text(value)
    return Node(name, op, tuple(inputs), device)


def parse_graph_def(data: bytes, what: str = "graph") -> list[Node]:
    """The nodes (GraphDef field 1) of serialized GraphDef ``data``, in file order; a
    ``DamagedFileError`` naming ``what`` for bytes that are not one."""
    try:
        nodes = [_node(value) for number, wire, value in _fields(memoryview(data))
                 if number == 1 and isinstance(value, memoryview)]
    except (ValueError, UnicodeDecodeError) as e:
        raise DamagedFileError(f"damaged {what}: not a GraphDef ({e})") from None
    if any(not n.name for n in nodes):
        raise DamagedFileError(f"damaged {what}: a node without a name")
    return nodes


def _key(number: int, wire: int) -> bytes:
    return _varint_bytes(number << 3 | wire)


def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + _varint_bytes(len(payload)) + payload


def encode_graph_def(nodes: Iterable[Node]) -> bytes:
    """A GraphDef holding ``nodes`` (name, op, inputs, device), as TensorFlow would serialize
    them (for synthetic runs and tests; ``parse_graph_def`` reads it back).

    >>> parse_graph_def(encode_graph_def([Node("a", "Relu", ("x:0",))]))
    [Node(name='a', op='Relu', inputs=('x:0',), device='')]
    """
    out = bytearray()
    for n in nodes:
        body = _len_field(1, n.name.encode()) + _len_field(2, n.op.encode())
        body += b"".join(_len_field(3, i.encode()) for i in n.inputs)
        if n.device:
            body += _len_field(4, n.device.encode())
        out += _len_field(1, body)
    return bytes(out)


def input_op(name: str) -> tuple[str, bool]:
    """(op name, is a control input) of a NodeDef input.

    >>> input_op("conv1/Relu:0"), input_op("^init"), input_op("x")
    (('conv1/Relu', False), ('init', True), ('x', False))
    """
    control = name.startswith("^")
    return re.sub(r":\d+$", "", name.lstrip("^")), control


@dataclass
class Neighbourhood:
    """The ops within ``hops`` of ``centre``: ``nodes`` {name: signed distance} (producers
    negative, consumers positive, the centre 0), ``total`` how many there were before the cap."""
    centre: str
    hops: int
    nodes: dict[str, int]
    total: int
    # (from, to, control) among nodes
    edges: list[tuple[str, str, bool]] = field(default_factory=list)

    @property
    def capped(self) -> bool:
        return self.total > len(self.nodes)


class OpGraph:
    """Producers and consumers of each op (data inputs; control inputs are drawn, not followed)."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.inputs: dict[str, list[tuple[str, bool]]] = {}
        self.consumers: dict[str, list[str]] = {}
        for n in self.nodes.values():
            ins = [input_op(i) for i in n.inputs]
            self.inputs[n.name] = ins
            for src, control in ins:
                if not control:
                    self.consumers.setdefault(src, []).append(n.name)

    def producers(self, name: str) -> list[str]:
        return [src for src, control in self.inputs.get(name, []) if not control]

    def _walk(self, centre: str, hops: int, step: Callable[[str], list[str]],
              keep: Callable[[str], bool]
              ) -> dict[str, int]:
        dist = {centre: 0}
        queue = deque([centre])
        while queue:
            name = queue.popleft()
            if dist[name] >= hops:
                continue
            for nxt in step(name):
                if nxt not in dist and keep(nxt):
                    dist[nxt] = dist[name] + 1
                    queue.append(nxt)
        del dist[centre]
        return dist

    def neighbourhood(self, centre: str, hops: int = 2, max_nodes: int | None = None,
                      keep: Callable[[str], bool] = lambda name: True) -> Neighbourhood:
        """Ops at most ``hops`` data edges upstream (producers) or downstream (consumers) of
        ``centre``, those ``keep`` accepts; the closest ``max_nodes`` (the centre included; ties:
        by name) when there are more. ``KeyError`` if the graph has no op ``centre``."""
        if centre not in self.nodes:
            raise KeyError(centre)
        if hops < 0:
            raise ValueError(f"hops must be >= 0, not {hops}")
        up = self._walk(centre, hops, self.producers, keep)
        down = self._walk(centre, hops, lambda n: self.consumers.get(n, []), keep)
        found = {centre: 0, **{n: -d for n, d in up.items()},
                 **{n: d for n, d in down.items() if n not in up}}
        order = sorted(found, key=lambda n: (abs(found[n]), n))
        shown = order if max_nodes is None else order[:max(int(max_nodes), 1)]
        nodes = {n: found[n] for n in shown}
        edges = list(dict.fromkeys((src, n, control) for n in nodes
                                   for src, control in self.inputs.get(n, [])
                                   if src in nodes))  # x * x: one edge
        return Neighbourhood(centre, hops, nodes, len(found), edges)
