"""DOT text of the op graph page's two views (``st.graphviz_chart`` draws it): the neighbourhood of
one op and the whole model with name scopes collapsed, with their colour legend. Every name is
escaped (:func:`escape`); nodes are ``n0``, ``n1``... (neighbourhood) or ``u0``, ``u1``... (whole
model).

Example::

    dot(graph.neighbourhood("conv2/Relu", 2), graph, looks, scale, "rms")
    model_dot(collapse(graph, {"conv2"}), graph, looks, scale, "rms", matches=set(),
              centre="conv2/Relu")
"""
from __future__ import annotations

import re
from typing import Iterable

import numpy as np

from inspector.graph.scopes import Collapsed, Unit, parent
from inspector.graph.graphdef import Neighbourhood, OpGraph

from .graph_colours import Look, Scale, fill_of, legend_items, state_text, text_colour

#: border colours of the centre op and of the search's matches
CENTRE, MATCH = "#1f77b4", "#ff7f0e"
#: Both views' node defaults, and the borders of a closed scope's box and of a series of them.
#: No box or cluster is rounded: Graphviz's rounded style costs the browser ~0.2 s of
#: main-thread CPU even on a six-op graph (bench/README.md, "Op graph"), a third of the page's
#: own cost
NODES = '  node [shape=box, style=filled, fontname="Helvetica", fontsize=14];'
BORDERS = {"scope": ", peripheries=2", "series": ', peripheries=2, style="filled,dashed"'}


#: Control characters but the newline (a label's line break): a NUL in a DOT string makes
#: Graphviz (viz.js) fail with no message, others draw nothing
_CONTROL_RE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


def visible(text: str) -> str:
    r"""``text`` with each control character but the newline written as ``\xNN``.

    >>> print(visible("a\x00b"))
    a\x00b
    """
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def escape(text: str) -> str:
    r"""``text`` inside a DOT double-quoted string: control characters drawn as ``\xNN``
    (:func:`visible`), backslashes and quotes escaped, newlines as ``\n`` (so no Graphviz
    escape such as ``\N`` or ``\G`` is taken from a name).

    >>> print(escape('a"b\\c'))
    a\"b\\c
    """
    return visible(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def node_line(nid: str, label: str, fill: str, extra: str = "") -> str:
    """One DOT node statement, its label escaped."""
    return (f'  {nid} [label="{escape(label)}", fillcolor="{fill}", '
            f'fontcolor="{text_colour(fill)}"{extra}];')


def dot(near: Neighbourhood, graph: OpGraph, looks: dict[str, Look], scale: Scale,
        stat: str = "rms") -> str:
    """DOT text of ``near``: one box per op (name, op type, the statistic or the op's state), data
    edges solid, control edges dashed, the centre drawn thick, and a legend of the colours."""
    ids = {name: f"n{i}" for i, name in enumerate(near.nodes)}
    out = ['digraph G {', '  rankdir=TB;', NODES]
    for name, nid in ids.items():
        look = looks.get(name, Look())
        label = f"{name}\n{graph.nodes[name].op}\n{state_text(look, stat)}"
        extra = f', penwidth=3, color="{CENTRE}"' if name == near.centre else ""
        out.append(node_line(nid, label, fill_of(look, scale), extra))
    for src, dst, control in near.edges:
        out.append(f"  {ids[src]} -> {ids[dst]}" + (" [style=dashed];" if control else ";"))
    out += legend(scale, {lk.state for lk in looks.values()} | {"uncaptured"}) + ["}"]
    return "\n".join(out)


def legend(scale: Scale, states: set[str] | None = None) -> list[str]:
    """DOT lines of the colour legend, one row of swatches (an HTML-like table node): the value
    scale (where some op has a value), then the states (those in ``states``; all when None), under
    a title saying which scale it is."""
    items = legend_items(scale, states)
    title = scale.describe() if scale.n else "colours"
    cells = "".join(f'<TD BGCOLOR="{fill}"><FONT COLOR="{text_colour(fill)}">'
                    f'{html(text)}</FONT></TD>'
                    for text, fill in items)
    table = ('<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="4"><TR>'
             f'<TD COLSPAN="{len(items)}">{html(title)}</TD></TR><TR>{cells}</TR></TABLE>')
    return ['  subgraph cluster_legend {', '    peripheries=0;',
            '    legend [shape=plaintext, margin=0, fontname="Helvetica", fontsize=14, '
            f'label=<{table}>];', '  }']


def html(text: str) -> str:
    """``text`` inside a Graphviz HTML-like label.

    >>> html("<= a & b")
    '&lt;= a &amp; b'
    """
    return (visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def scope_look(ops: Iterable[str], looks: dict[str, Look], stat: str = "rms") -> tuple[Look, str]:
    """(the look a closed scope is filled with, its summary line) from its ops' looks: NaN/Inf if
    any op has one, else the median of the values, else dead if every captured op is, else no value.

    >>> look, line = scope_look(["a", "b", "c"], {"a": Look("a:0", 1.0, "value"),
    ...                                           "b": Look("b:0", 3.0, "value")})
    >>> look.value, line
    (2.0, '2 of 3 ops captured; median rms 2')
    """
    ops = list(ops)
    have = [looks[o] for o in ops if o in looks]
    bad = sum(lk.state == "nonfinite" for lk in have)
    values = [lk.value for lk in have if lk.state == "value" and lk.value is not None]
    head = f"{len(have)} of {len(ops)} ops captured"
    if bad:
        return Look("scope", None, "nonfinite"), f"{head}; {bad} NaN/Inf"
    if values:
        m = float(np.median(values))
        return Look("median", m, "value"), f"{head}; median {stat} {m:.3g}"
    if have and all(lk.state == "dead" for lk in have):
        return Look("scope", None, "dead"), f"{head}; all dead"
    return Look("scope", None, "no_stats" if have else "uncaptured"), head


def _label(unit: Unit, graph: OpGraph, looks: dict[str, Look], stat: str) -> tuple[str, Look]:
    short = unit.name[len(unit.cluster) + 1:] \
        if unit.cluster and unit.name.startswith(unit.cluster + "/") \
        else unit.name
    if unit.kind == "scope":
        look, line = scope_look(unit.ops, looks, stat)
        return f"{short}/ ({len(unit.ops)} op{'s' * (len(unit.ops) != 1)})\n{line}", look
    if unit.kind == "series":
        look, line = scope_look(unit.ops, looks, stat)
        return f"{short} (series of {unit.members}; {len(unit.ops)} ops)\n{line}", look
    look = looks.get(unit.name, Look())
    return f"{short}\n{graph.nodes[unit.name].op}\n{state_text(look, stat)}", look


def model_dot(view: Collapsed, graph: OpGraph, looks: dict[str, Look], scale: Scale, stat: str,
              matches: set[str], centre: str | None) -> str:
    """DOT text of the whole-model ``view``: closed scopes as double-bordered boxes (a series of
    them dashed), ops as boxes, open scopes as nested clusters, edges labelled with the op
    edges they stand for (when more than one); the box holding ``centre`` outlined blue, those
    holding ``matches`` orange."""
    ids = {uid: f"u{i}" for i, uid in enumerate(view.units)}
    marked = {view.where.get(centre): CENTRE} if centre in view.where else {}
    for op in matches:
        if op in view.where and view.where[op] not in marked:
            marked[view.where[op]] = MATCH
    lines: dict[str, list[str]] = {}
    for uid, unit in view.units.items():
        label, look = _label(unit, graph, looks, stat)
        extra = BORDERS.get(unit.kind, "")
        if uid in marked:
            extra += f', penwidth=3, color="{marked[uid]}"'
        lines.setdefault(unit.cluster, []).append(node_line(ids[uid], label, fill_of(look, scale),
                                                            extra))
    out = ['digraph G {', '  rankdir=TB; compound=true;', NODES]
    children: dict[str, list[str]] = {}
    for c in view.clusters:
        children.setdefault(parent(c), []).append(c)

    def emit(cluster: str, depth: int) -> None:
        for i, c in enumerate(children.get(cluster, [])):
            name = c[len(cluster) + 1:] if cluster else c
            out.append(f'  subgraph "cluster_{escape(c)}" {{')
            out.append(f'    label="{escape(name)}/"; fontname="Helvetica"; fontsize=14; '
                       'color="#888888"; '
                       f'bgcolor="{"#f7f7f7" if depth % 2 == 0 else "#ffffff"}";')
            emit(c, depth + 1)
            out.append("  }")
        out.extend(lines.get(cluster, []))

    emit("", 0)
    for (a, b), n in view.edges.items():
        out.append(f"  {ids[a]} -> {ids[b]}" + (f' [label="{n}", fontsize=12];' if n > 1 else ";"))
    out += legend(scale, {lk.state for lk in looks.values()} | {"uncaptured"}) + ["}"]
    return "\n".join(out)
