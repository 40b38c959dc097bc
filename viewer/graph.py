"""Page: the op graph around a tensor (the run's ``graph.pb``), coloured by a statistic.

Producers and consumers of the chosen tensor's op, ``hops`` data edges out, drawn with
``st.graphviz_chart`` from DOT text made here (every name escaped; nodes are ``n0``, ``n1``...).
Each op with statistics at the chosen step is filled by the chosen statistic of its tensor
(a sequential palette between the shown nodes' lowest and highest value; log-spaced for l2 and
std when they span over two decades); NaN/Inf ops are red, dead ops (every element zero) grey,
ops the hook did not capture white. Graphviz charts are not clickable in Streamlit: a picker of
the shown ops opens one in the tensor browser. Where the view's worker has several sessions
with a graph (a resume, train and evaluate calls), a picker chooses one (``?gr_session=``), the
newest of the view's mode by default; a graph file over ``graphdef.MAX_GRAPH_BYTES`` is refused.

Example::

    near = OpGraph(nodes).neighbourhood("conv2/Relu", hops=2, max_nodes=60)
    st.graphviz_chart(dot(near, graph, looks))
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from inspector.errors import InspectorError
from inspector.format import graph_name
from inspector.graphdef import Neighbourhood, OpGraph, parse_graph_def

from . import data
from .ui import Ctx, default_tensor, need, plain

STATS = ("l2", "mean", "std", "min", "max", "zero_fraction")
LOG_STATS = {"l2", "std"}
#: viridis at 5 stops: dark (low) to yellow (high)
PALETTE = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")
NONFINITE, DEAD, UNCAPTURED = "#d62728", "#9e9e9e", "#ffffff"
#: ops hidden unless asked for: the backward pass and the inspector's own ops
HIDDEN = re.compile(r"(^|/)gradients(_\d+)?/|^tf_inspector/")
MAX_NODES = 60


@dataclass(frozen=True)
class Look:
    """What a node shows: its tensor (None: not captured), value, and whether NaN/Inf or dead."""
    tensor: str | None = None
    value: float | None = None
    nonfinite: bool = False
    dead: bool = False


def escape(text: str) -> str:
    r"""``text`` inside a DOT double-quoted string: backslashes and quotes escaped, newlines as
    ``\n`` (so no Graphviz escape such as ``\N`` or ``\G`` is taken from a name).

    >>> print(escape('a"b\\c'))
    a\"b\\c
    """
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "")


def palette(t: float) -> str:
    """The colour at ``t`` in [0, 1] along :data:`PALETTE` (linear in RGB between stops).

    >>> palette(0.0), palette(1.0)
    ('#440154', '#fde725')
    """
    t = min(max(float(t), 0.0), 1.0) * (len(PALETTE) - 1)
    i = min(int(t), len(PALETTE) - 2)
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in PALETTE[i:i + 2])
    f = t - i
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def scale(values: list[float], stat: str) -> tuple[float, float, bool]:
    """(low, high, log) of the colour scale over the shown finite ``values``: log for l2/std
    when all are positive and span over two decades."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    if not v.size:
        return 0.0, 1.0, False
    lo, hi = float(v.min()), float(v.max())
    log = stat in LOG_STATS and lo > 0 and hi / lo > 100
    return lo, hi, log


def colour(look: Look, lo: float, hi: float, log: bool) -> str:
    """The fill of a node (see the module docstring)."""
    if look.tensor is None or look.value is None and not look.nonfinite and not look.dead:
        return UNCAPTURED
    if look.nonfinite:
        return NONFINITE
    if look.dead:
        return DEAD
    if look.value is None or not math.isfinite(look.value):
        return UNCAPTURED
    a, b, x = (math.log10(lo), math.log10(hi), math.log10(look.value)) if log else (lo, hi, look.value)
    return palette(0.5 if b == a else (x - a) / (b - a))


def _text_colour(fill: str) -> str:
    r, g, b = (int(fill[k:k + 2], 16) for k in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


def dot(near: Neighbourhood, graph: OpGraph, looks: dict[str, Look], stat: str = "l2") -> str:
    """DOT text of ``near``: one box per op (name, op type, the statistic), data edges solid,
    control edges dashed, the centre drawn thick, and a legend of the colours."""
    # the scale spans the ops it colours (NaN/Inf and dead ones have colours of their own)
    values = [lk.value for lk in looks.values() if lk.value is not None and not lk.nonfinite and not lk.dead]
    lo, hi, log = scale(values, stat)
    ids = {name: f"n{i}" for i, name in enumerate(near.nodes)}
    out = ['digraph G {', '  rankdir=TB;',
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
    for name, nid in ids.items():
        look = looks.get(name, Look())
        fill = colour(look, lo, hi, log)
        label = f"{name}\n{graph.nodes[name].op}"
        if look.nonfinite:
            label += "\nNaN/Inf"
        elif look.dead:
            label += "\ndead (all zero)"
        elif look.value is not None:
            label += f"\n{stat} = {look.value:.4g}"
        extra = ', penwidth=3, color="#1f77b4"' if name == near.centre else ""
        out.append(f'  {nid} [label="{escape(label)}", fillcolor="{fill}", fontcolor="{_text_colour(fill)}"{extra}];')
    for src, dst, control in near.edges:
        out.append(f"  {ids[src]} -> {ids[dst]}" + (" [style=dashed];" if control else ";"))
    out += _legend(lo, hi, log, stat, bool(values)) + ["}"]
    return "\n".join(out)


def _legend(lo: float, hi: float, log: bool, stat: str, ranged: bool) -> list[str]:
    items = [("NaN/Inf", NONFINITE), ("dead (all zero)", DEAD), ("not captured / no statistics", UNCAPTURED)]
    if ranged:  # the value scale, where some shown op has a finite value
        items += [(f"low {stat} = {lo:.3g}", PALETTE[0]),
                  (f"high {stat} = {hi:.3g}" + (" (log scale)" if log else ""), PALETTE[-1])]
    out = ['  subgraph cluster_legend {', '    label="colours"; fontname="Helvetica"; fontsize=10; color="#bbbbbb";']
    for i, (text, fill) in enumerate(items):
        out.append(f'    legend{i} [label="{escape(text)}", fillcolor="{fill}", fontcolor="{_text_colour(fill)}"];')
    out.append("    " + " -> ".join(f"legend{i}" for i in range(len(items))) + " [style=invis];")
    out.append("  }")
    return out


# ---- data -------------------------------------------------------------------------------------
def graph_key(sig: tuple) -> tuple:
    """The part of ``sig`` the graph depends on: the graph files and the view."""
    return tuple(e for e in sig if e[0] == "view" or (e[0] == "" and str(e[1]).startswith("graph.")))


def graph_sessions(path: str, sig: tuple) -> tuple[str, list[int]]:
    """(worker, its sessions with a graph file): the view's worker (the sidebar's, else that of
    the run's default manifest); the view's mode's sessions first, each group newest first.
    Empty for a run whose graphs predate session numbers (``graph.<worker>.pb``)."""
    run = data.get_run(path, sig)
    view = next((e for e in sig if e[0] == "view"), ("view", "train", None, None))
    mode, worker = view[1], view[2] or run.manifest["worker"]
    files = {e[1] for e in sig if e[0] == ""}
    have = sorted(((s, m["mode"]) for (w, s), m in run.manifests.items() if w == worker and s >= 1
                   and graph_name(w, s) in files), reverse=True)
    return worker, [s for s, m in have if m == mode] + [s for s, m in have if m != mode]


def op_graph(path: str, sig: tuple, worker: str | None = None, session: int | None = None) -> OpGraph:
    """The graph of ``worker``'s ``session`` (default: the run's default manifest's), parsed once
    per graph file (``InspectorError`` if unreadable or over ``graphdef.MAX_GRAPH_BYTES``)."""
    return _op_graph(path, graph_key(sig), sig, worker, session)


@st.cache_resource(max_entries=8, show_spinner=False)
def _op_graph(path: str, key: tuple, _sig: tuple, worker: str | None, session: int | None) -> OpGraph:
    run = data.get_run(path, _sig)
    what = f"graph of {run.name}" + (f", session {session}" if session else "")
    try:
        raw = run.graph_def_bytes(worker, session)   # bounded by graphdef.MAX_GRAPH_BYTES
    except OSError as e:
        raise InspectorError(f"this run's session has no readable graph file ({type(e).__name__})") from None
    return OpGraph(parse_graph_def(raw, what))


def session_picker(path: str, sig: tuple) -> tuple[str | None, int | None]:
    """The session whose graph the page shows: a picker where the view's worker has several
    sessions with a graph (a resumed run, train and evaluate), the newest of the view's mode
    first; (None, None): the run's default graph."""
    worker, sessions = graph_sessions(path, sig)
    if not sessions:
        return None, None
    if len(sessions) == 1:
        return worker, sessions[0]
    run = data.get_run(path, sig)
    modes = {s: run.manifests[(worker, s)]["mode"] for s in sessions}
    session = st.selectbox("Session", sessions, key="gr_session", bind="query-params",
                           format_func=lambda s: f"{s} ({modes[s]})",
                           help="each train/evaluate call or resume wrote its own graph; the newest first")
    return worker, int(session)


def tensor_of_op(catalog: pd.DataFrame) -> dict[str, str]:
    """op name -> its catalog name: the first output (``:0``) where captured, a variable record
    by its handle op."""
    out: dict[str, str] = {}
    for row in catalog.sort_values("name").itertuples(index=False):
        op = row.op if isinstance(row.op, str) else None
        if op and (op not in out or str(row.name).endswith(":0")):
            out[op] = str(row.name)
    return out


@st.cache_data(max_entries=32, show_spinner=False)
def looks(path: str, sig: tuple, tensors: tuple[str, ...], ops: tuple[str, ...], step: int, kind: str,
          stat: str) -> dict[str, Look]:
    """op -> :class:`Look` of ``stat`` (``kind``, group all) at ``step``; ``ops[i]`` is the op of
    ``tensors[i]``."""
    run = data.get_run(path, sig)
    cols = list(dict.fromkeys([stat, "nan", "inf", "zero_fraction"]))
    df = run.query_stats(list(tensors), steps=(step, step), kinds=[kind], groups=["all"], columns=cols)
    rows = {str(r["tensor"]): r for r in df.to_dict("records")}
    out = {}
    for op, t in zip(ops, tensors):
        r = rows.get(t)
        if r is None:
            out[op] = Look(t)
            continue
        v = r[stat]
        out[op] = Look(t, None if v is None or not math.isfinite(v) else float(v),
                       bool(r["nan"] or r["inf"]), bool(r["zero_fraction"] == 1.0))
    return out


# ---- the page ---------------------------------------------------------------------------------
def render(ctx: Ctx) -> None:
    st.header("Op graph")
    run = data.get_run(ctx.path, ctx.sig)
    worker, session = session_picker(ctx.path, ctx.sig)
    try:
        graph = op_graph(ctx.path, ctx.sig, worker, session)
    except InspectorError as e:
        st.info(f"No op graph to show: {plain(e)}")
        return
    by_op = {op: t for op, t in tensor_of_op(run.tensors).items() if op in graph.nodes}
    position = {name: i for i, name in enumerate(run.tensors["name"])}
    names = sorted(by_op.values(), key=position.__getitem__)  # catalog (graph) order
    if not need(bool(names), "No captured tensor of this run is an op of its graph."):
        return
    first = data.first_nonfinite(ctx.path, ctx.sig)
    nan_tensor = first.get("tensor") if first else None
    c = st.columns([3, 1, 1, 1])
    tensor = c[0].selectbox("Tensor", names, index=names.index(nan_tensor) if nan_tensor in names
                            else default_tensor(names), key="gr_tensor", bind="query-params")
    hops = int(c[1].number_input("Hops", 1, 10, 2, key="gr_hops", bind="query-params",
                                 help="producers and consumers this many data edges away"))
    cap = int(c[2].number_input("Max nodes", 5, 500, MAX_NODES, key="gr_max", bind="query-params"))
    show_all = c[3].toggle("Backward ops", key="gr_all", help="also show the backward pass (gradients/...) and the "
                           "inspector's own ops")
    steps = [int(s) for s in data.stats_steps(ctx.path, ctx.sig)]
    c = st.columns([2, 1, 1])
    step = (c[0].select_slider("Step", options=steps, value=steps[-1], key="gr_step", bind="query-params")
            if steps else None)
    kind = c[1].radio("Kind", ["forward", "gradient"], key="gr_kind", bind="query-params", horizontal=True)
    stat = c[2].selectbox("Colour by", STATS, key="gr_stat", bind="query-params")
    centre = run.tensors.loc[tensor, "op"]
    near = graph.neighbourhood(centre, hops, cap, keep=(lambda n: True) if show_all else
                               (lambda n: not HIDDEN.search(n)))
    if near.capped:
        st.warning(f"{near.total} ops lie within {hops} hops of {plain(centre)}: showing the {len(near.nodes)} "
                   f"closest. Lower the hops or raise the node limit.")
    shown = [(op, by_op[op]) for op in near.nodes if op in by_op]
    found = looks(ctx.path, ctx.sig, tuple(t for _, t in shown), tuple(op for op, _ in shown), step, kind, stat) \
        if step is not None else {op: Look(t) for op, t in shown}
    st.graphviz_chart(dot(near, graph, found, stat), width="stretch")
    st.caption(f"{len(near.nodes)} ops within {hops} hops of {plain(centre)} (thick border); fill: {kind} "
               f"{stat} at step {step} (group all), dark = low, yellow = high; red: NaN/Inf; grey: dead (every "
               f"element zero); white: not captured or no statistics. Dashed: control edges.")
    openable = [t for _, t in shown]
    c = st.columns([3, 1])
    pick = c[0].selectbox("Open an op's tensor in the tensor browser", openable, index=openable.index(tensor),
                          key="gr_open")
    if c[1].button("Open in tensor browser", key="gr_go"):
        open_in_browser(pick)


def open_in_browser(tensor: str) -> None:
    """Switch to the tensor browser showing ``tensor`` (its URL-bound ``tb_tensor``)."""
    from . import app_main  # late: app_main imports this page
    st.session_state.pop("tb_search", None)  # a search left from earlier would hide the tensor
    st.switch_page(app_main.page("Tensor browser"), query_params={"tb_tensor": tensor})
