"""The whole-model view of an op graph: name scopes collapsed into one box each, as TensorBoard's
Graphs dashboard draws a model, TensorFlow-free.

An op's name scopes are the ``/``-separated prefixes of its name (``conv1/w/read`` lies in
``conv1`` and ``conv1/w``). A name that is both an op and a scope (the variable ``conv1/w`` beside
``conv1/w/read``) belongs to its own scope: collapsed, the scope's box stands for it too. Each op
is drawn as the outermost *closed* scope that holds it, or as itself when every scope holding it
is open; closed scopes of one level named alike but for a trailing number (``conv2`` ...
``conv333``) are one *series* box, as TensorBoard groups them; data edges between ops become
edges between what is drawn, counted.

Example::

    view = collapse(graph, opened={"conv1"}, keep=lambda n: not n.startswith("gradients/"))
    view.units      # {("scope", "conv2"): Unit(...), ("op", "conv1/Relu"): Unit(...), ...}
    view.edges      # {(("op", "conv1/Relu"), ("scope", "conv2")): 1, ...}
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from inspector.graph.graphdef import OpGraph

#: A drawn unit: ("scope", path) for a closed scope, ("op", name) for an op shown on its own,
#: ("series", "conv[2-333]") for alike-named siblings drawn as one.
UnitId = tuple[str, str]
#: the fewest alike-named siblings drawn as one series box
SERIES_MIN = 5
#: a name that ends in a number (after a non-digit): its stem and the number
_NUMBERED = re.compile(r"^(.*\D)(\d+)$")


def scopes_of(name: str) -> list[str]:
    """The name scopes holding op ``name``, outermost first (not the name itself).

    >>> scopes_of("a/b/c")
    ['a', 'a/b']
    """
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def parent(path: str) -> str:
    """The scope ``path`` (an op or a scope) lies in; '' at the top level.

    >>> parent("a/b/c"), parent("a")
    ('a/b', '')
    """
    return path.rsplit("/", 1)[0] if "/" in path else ""


@dataclass
class Unit:
    """One box of the whole-model view: a closed scope (``ops``: every kept op inside it, itself
    included where the scope's name is an op's), one op (``ops == [name]``), or a series of
    ``members`` numbered closed scopes or ops (``conv[2-333]``); ``cluster``: the innermost open
    scope it is drawn in ('' at the top level)."""
    kind: str
    name: str
    cluster: str
    ops: list[str] = field(default_factory=list)
    members: int = 1


@dataclass
class Collapsed:
    """The whole-model view: ``units`` in graph (file) order, data ``edges`` between them with the
    number of op edges each stands for, the open scopes drawn as nested ``clusters`` (outermost
    first), ``where`` each kept op's unit, and ``closed``: open scopes the unit cap closed again
    (deepest first)."""
    units: dict[UnitId, Unit]
    edges: dict[tuple[UnitId, UnitId], int]
    clusters: list[str]
    where: dict[str, UnitId]
    closed: list[str] = field(default_factory=list)


def all_scopes(names: Iterable[str]) -> set[str]:
    """Every name scope of ``names`` (each op's prefixes,
    and the names that are prefixes of others)."""
    return {s for n in names for s in scopes_of(n)}


def _unit_id(op: str, opened: set[str], scopes: set[str]) -> UnitId:
    for s in [*scopes_of(op), op]:
        if s in scopes and s not in opened:
            return ("scope", s)
    return ("op", op)


def collapse(graph: OpGraph, opened: Iterable[str] = (),
             keep: Callable[[str], bool] = lambda n: True,
             max_units: int | None = None, series: int | None = SERIES_MIN) -> Collapsed:
    """The whole-model view of ``graph``'s ops that ``keep`` accepts, the scopes in ``opened``
    drawn open (a scope is drawn open only when every scope around it is). Closed scopes (and
    ops) of one level named alike but for a trailing number, ``series`` of them or more, are one
    box, as TensorBoard groups them (None: never). Over ``max_units`` boxes, the deepest open
    scopes are closed again, one at a time, until it fits (the top level is drawn whatever its
    size)."""
    names = [n for n in graph.nodes if keep(n)]
    scopes = all_scopes(names)
    wanted = {s for s in opened if s in scopes}
    # every scope around it open
    shown = {s for s in wanted if all(p in wanted for p in scopes_of(s))}
    closed: list[str] = []
    while True:
        view = _build(graph, names, shown, scopes, series)
        if max_units is None or len(view.units) <= max_units or not shown:
            break
        deepest = max(shown, key=lambda s: (s.count("/"), s))
        shown.discard(deepest)
        closed.append(deepest)
    view.closed = closed
    return view


def _build(graph: OpGraph, names: list[str], shown: set[str], scopes: set[str],
           series: int | None) -> Collapsed:
    where: dict[str, UnitId] = {}
    units: dict[UnitId, Unit] = {}
    for op in names:
        uid = _unit_id(op, shown, scopes)
        where[op] = uid
        if uid not in units:
            # an op drawn on its own inside its own open scope (the variable conv1/w beside
            # conv1/w/read) lies in that scope's cluster, not its parent's
            inside = uid[1] if uid[0] == "op" and op in shown else parent(uid[1])
            units[uid] = Unit(uid[0], uid[1], inside)
        units[uid].ops.append(op)
    if series:
        units = _series(units, where, series)
    edges: dict[tuple[UnitId, UnitId], int] = {}
    for op in names:
        for src in graph.producers(op):
            a, b = where.get(src), where[op]
            if a is not None and a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
    return Collapsed(units, edges, sorted(shown, key=lambda s: (s.count("/"), s)), where)


def _series(units: dict[UnitId, Unit], where: dict[str, UnitId],
            at_least: int) -> dict[UnitId, Unit]:
    """``units`` with each run of ``at_least`` or more alike-named siblings (same cluster and kind,
    one name but for a trailing number) merged into a series unit at the place of its first
    member; ``where`` is updated to match."""
    groups: dict[tuple[str, str, str], list[tuple[int, UnitId]]] = {}
    for uid, u in units.items():
        m = _NUMBERED.match(u.name[len(u.cluster) + 1:] if u.cluster else u.name)
        if m and u.kind in ("scope", "op"):
            groups.setdefault((u.cluster, u.kind, m.group(1)), []).append((int(m.group(2)), uid))
    into: dict[UnitId, UnitId] = {}
    for (cluster, _, prefix), members in groups.items():
        if len(members) >= at_least:
            nums = sorted(n for n, _ in members)
            name = f"{prefix}[{nums[0]}-{nums[-1]}]"
            sid = ("series", f"{cluster}/{name}" if cluster else name)
            into.update({uid: sid for _, uid in members})
    if not into:
        return units
    out: dict[UnitId, Unit] = {}
    for uid, u in units.items():
        if uid not in into:
            out[uid] = u
            continue
        sid = into[uid]
        if sid not in out:
            out[sid] = Unit("series", sid[1], u.cluster, [], 0)
        out[sid].ops += u.ops
        out[sid].members += 1
    for op, uid in where.items():
        where[op] = into.get(uid, uid)
    return out


def search(names: Iterable[str], text: str, limit: int | None = None) -> list[str]:
    """The op names holding ``text`` (case-insensitive substring), shortest first, then by name:
    the closest match leads.

    >>> search(["conv1/Relu", "conv10/Relu", "dense/MatMul"], "CONV1")
    ['conv1/Relu', 'conv10/Relu']
    """
    needle = text.strip().lower()
    if not needle:
        return []
    found = sorted((n for n in names if needle in n.lower()), key=lambda n: (len(n), n))
    return found if limit is None else found[:limit]
