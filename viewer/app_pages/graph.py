"""Page: the op graph (the run's ``graph.pb``), coloured by a statistic at a step: the
neighbourhood of one op, or the whole model with its name scopes collapsed and opened on demand
(TensorBoard's Graphs dashboard is the model), and a search box that finds ops by substring.

Each captured op is filled by the chosen statistic of its tensor (default RMS, which does not grow
with a tensor's size as l2 does) on a robust scale over every captured op of the model at that
step (:mod:`viewer.charts.graph_colours`, with a legend); NaN/Inf ops are red, dead ops (every
element zero) grey, and the label says which ops were captured with a gradient, captured forward
only (the gradient view has nothing for them), or not captured. On a run with a NaN/Inf the page
opens at its first step, on its tensor and kind. Graphviz charts are not clickable in Streamlit: a
picker of the shown ops opens one in the tensor browser. Where the view's worker has several
sessions with a graph (a resume, train and evaluate calls), a picker chooses one
(``?gr_session=``), the newest of the view's mode by default; a graph file over
``graphdef.MAX_GRAPH_BYTES`` is refused.

Example::

    near = OpGraph(nodes).neighbourhood("conv2/Relu", hops=2, max_nodes=60)
    st.graphviz_chart(dot(near, graph, looks, Scale.robust(values, "rms"), "rms"))
"""
from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis
from inspector.errors import InspectorError
from inspector.format import graph_name
from inspector.graph.scopes import search
from inspector.graph.graphdef import OpGraph

from .. import data, page_links
from ..charts import graph_model
from ..charts.graph_colours import (DEAD, FORWARD_ONLY, NO_STATS, NONFINITE, PALETTE, STATES,
                                    UNCAPTURED, Look, Scale, palette)
from ..charts.graph_dot import dot, escape
from ..ui import Ctx, default_tensor, need, plain
from ..uncaptured import show_uncaptured

__all__ = ["DEAD", "FORWARD_ONLY", "NO_STATS", "NONFINITE", "PALETTE", "UNCAPTURED", "Look",
           "Scale", "dot", "escape", "palette", "render"]

#: the statistics a node can be coloured by; rms (derived: sqrt(mean^2 + std^2)) first
STATS = ("rms", "mean", "std", "min", "max", "l2", "zero_fraction")
#: the recorded columns each statistic is read from
COLUMNS = {"rms": ("mean", "std")}
#: ops hidden unless asked for: the backward pass and the inspector's own ops
HIDDEN = re.compile(r"(^|/)gradients(_\d+)?/|^tf_inspector/")
MAX_NODES = 60
#: search matches listed in the picker (the count says how many there are)
MAX_MATCHES = 200
VIEWS = ("Neighbourhood", "Whole model")


# ---- data -------------------------------------------------------------------------------------
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
                           help="each train/evaluate call or resume wrote its own graph; the "
                                "newest first")
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
def step_looks(path: str, sig: tuple, step: int | None, kind: str, stat: str) -> dict[str, Look]:
    """tensor -> :class:`Look` of ``stat`` (``kind``, group all) at ``step``, for every tensor of
    the catalog: its value, NaN/Inf, dead, 'forward_only' (the gradient of a tensor captured
    without one) or 'no_stats' (captured, no row at this step)."""
    run = data.get_run(path, sig)
    cat = run.tensors
    rows: dict[str, dict] = {}
    if step is not None:
        cols = list(dict.fromkeys([*COLUMNS.get(stat, (stat,)), "nan", "inf", "zero_fraction"]))
        df = run.query_stats(steps=(step, step), kinds=[kind], groups=["all"], columns=cols)
        if stat in COLUMNS:
            df = df.assign(**{stat: analysis.rms(df["mean"], df["std"])})
        rows = {str(r["tensor"]): r for r in df.to_dict("records")}
    grad = dict(zip(cat["name"], cat["has_gradient"])) if "has_gradient" in cat else {}
    # has_gradient False (not merely unknown): the hook recorded the tensor forward only
    no_grad = {t for t, g in grad.items() if isinstance(g, (bool, np.bool_)) and not g}
    return {str(t): _look(str(t), rows.get(str(t)), stat, kind, t not in no_grad if grad else None)
            for t in cat["name"]}


def _look(tensor: str, row: dict | None, stat: str, kind: str, gradient: bool | None) -> Look:
    if kind == "gradient" and gradient is False:
        return Look(tensor, None, "forward_only", gradient)
    if row is None:
        return Look(tensor, None, "no_stats", gradient)
    v = row[stat]
    value = float(v) if v is not None and math.isfinite(v) else None
    state = "nonfinite" if row["nan"] or row["inf"] else "dead" if row["zero_fraction"] == 1.0 \
        else "value" if value is not None else "no_stats"
    return Look(tensor, value, state, gradient)


def op_looks(by_op: dict[str, str], tensor_looks: dict[str, Look]) -> dict[str, Look]:
    """op -> the :class:`Look` of its tensor (``by_op``: :func:`tensor_of_op`); ops not in it are
    not captured (no entry)."""
    return {op: tensor_looks.get(t, Look(t, None, "no_stats")) for op, t in by_op.items()}


def default_step(steps: list[int], first: dict | None) -> int:
    """Index in ``steps`` the step slider opens at: the first NaN/Inf's step (the first statistics
    step at or after it, where it has none), else the last step.

    >>> default_step([0, 10, 20, 30], {"step": 15}), default_step([0, 10], None)
    (2, 1)
    """
    at = first.get("step") if first else None
    if isinstance(at, (int, np.integer)):
        later = [i for i, s in enumerate(steps) if s >= at]
        if later:
            return later[0]
    return len(steps) - 1


# ---- the page ---------------------------------------------------------------------------------
def render(ctx: Ctx) -> None:
    st.header("Op graph")
    run = data.get_run(ctx.path, ctx.sig)
    worker, session = session_picker(ctx.path, ctx.sig)
    try:
        graph = data.op_graph(ctx.path, ctx.sig, worker, session)
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
    c = st.columns([3, 2, 2])
    tensor = c[0].selectbox("Tensor", names, index=names.index(nan_tensor) if nan_tensor in names
                            else default_tensor(names), key="gr_tensor", bind="query-params")
    find = c[1].text_input("Search ops", key="gr_find", bind="query-params",
                           placeholder="part of an op name",
                           help="every op of the graph whose name holds this text "
                                "(case-insensitive); the chosen match becomes the centre")
    view = c[2].radio("View", VIEWS, key="gr_view", bind="query-params", horizontal=True,
                      help="the ops around the centre, or the whole model with name scopes "
                           "collapsed")
    step, kind, stat, show_all = value_choices(ctx, first)
    keep = (lambda n: True) if show_all else (lambda n: not HIDDEN.search(n))
    centre, matches = search_centre(graph, keep, find.strip(), run.tensors.loc[tensor, "op"],
                                    show_all)
    say_why(run, find.strip(), centre, centre in by_op, matches, worker, session)
    looks = op_looks(by_op, step_looks(ctx.path, ctx.sig, step, kind, stat))
    # the loss's and labels' ops are drawn on the model's scale without setting it: a labels
    # cast or the loss's sum is no layer, and would stretch the colours every layer shares
    plumbing = data.plumbing(ctx.path, ctx.sig)
    scale = Scale.robust([lk.value for op, lk in looks.items()
                          if lk.state == "value" and op not in plumbing], stat)
    where = f"{kind} {stat} at step {step} (group all)"
    if view == VIEWS[1]:
        drawn = graph_model.render(graph, looks, scale, stat, keep, centre, matches, where)
    else:
        drawn = neighbourhood(graph, looks, scale, stat, keep, centre, where)
    openable = list(dict.fromkeys(by_op[op] for op in drawn if op in by_op)) or names
    want = by_op.get(centre, tensor)
    c = st.columns([3, 1])
    pick = c[0].selectbox("Open an op's tensor in the tensor browser", openable,
                          index=openable.index(want) if want in openable else 0, key="gr_open")
    if c[1].button("Open in tensor browser", key="gr_go"):
        open_in_browser(pick)


def say_why(run, text: str, centre: str, captured: bool, matches: list[str], worker: str | None,
            session: int | None) -> None:
    """Why a searched op that is not drawn with a value was not captured: skipped (the reason)
    or excluded (the rule), from the run's accounting (``run.why``); every such match of the
    search in a table (the Tensor browser's)."""
    if not text:
        return
    if not captured:
        try:
            st.caption(f"{plain(str(run.why(centre, worker, session)))}")
        except InspectorError as e:
            st.caption(f"Why {plain(centre)} was not captured is unknown: {plain(e)}")
    show_uncaptured(run, text, expanded=not matches)


def value_choices(ctx: Ctx, first: dict | None) -> tuple[int | None, str, str, bool]:
    """(step, kind, statistic, show the backward ops): the step and kind open at the first
    NaN/Inf's where the run has one."""
    steps = [int(s) for s in data.stats_steps(ctx.path, ctx.sig)]
    c = st.columns([2, 1, 1, 1])
    step = (c[0].select_slider("Step", options=steps, value=steps[default_step(steps, first)],
                               key="gr_step", bind="query-params",
                               help="opens at the first NaN/Inf's step where the run has one")
            if steps else None)
    kinds = ["forward", "gradient"]
    kind = c[1].radio("Kind", kinds,
                      index=kinds.index(first["kind"]) if first and first.get("kind") in kinds
                      else 0, key="gr_kind", bind="query-params", horizontal=True)
    stat = c[2].selectbox("Colour by", STATS, key="gr_stat", bind="query-params",
                          help="rms = sqrt(mean² + std²): the typical magnitude, whatever the "
                               "tensor's size (l2 grows with it)")
    show_all = c[3].toggle("Backward ops", key="gr_all",
                           help="also show the backward pass (gradients/...) and the inspector's "
                                "own ops")
    return step, str(kind), str(stat), bool(show_all)


def search_centre(graph: OpGraph, keep: Callable[[str], bool], text: str, centre: str,
                  show_all: bool) -> tuple[str, list[str]]:
    """(the centre, the search's matches): with a search that matches, a picker of the matches
    chooses the centre; else it stays ``centre`` (the Tensor picker's op)."""
    if not text:
        return centre, []
    matches = search([n for n in graph.nodes if keep(n)], text)
    if not matches:
        st.info(f"No op{'' if show_all else ' outside the backward pass'} holds {plain(text)}.")
        return centre, []
    label = (f"Matches: {len(matches)} op{'s hold' if len(matches) != 1 else ' holds'} "
             f"{plain(repr(text))}")
    pick = st.selectbox(label, matches[:MAX_MATCHES], key="gr_match",
                        help="the chosen op is the centre (the Tensor picker's is used again once "
                             "the search is cleared)")
    return str(pick), matches


def neighbourhood(graph: OpGraph, looks: dict[str, Look], scale: Scale, stat: str,
                  keep: Callable[[str], bool], centre: str, where: str) -> list[str]:
    """The ops within some hops of ``centre``, drawn with the page's colours; returns them."""
    c = st.columns(2)
    hops = int(c[0].number_input("Hops", 1, 10, 2, key="gr_hops", bind="query-params",
                                 help="producers and consumers this many data edges away"))
    cap = int(c[1].number_input("Max nodes", 5, 500, MAX_NODES, key="gr_max", bind="query-params"))
    near = graph.neighbourhood(centre, hops, cap, keep=lambda n: n == centre or keep(n))
    if near.capped:
        st.warning(f"{near.total} ops lie within {hops} hops of {plain(centre)}: showing the "
                   f"{len(near.nodes)} closest. Lower the hops or raise the node limit.")
    st.graphviz_chart(dot(near, graph, {op: looks[op] for op in near.nodes if op in looks},
                          scale, stat),
                      width="stretch")
    st.caption(f"{len(near.nodes)} ops within {hops} hops of {plain(centre)} (thick border); fill: "
               f"{where}, {scale.describe() if scale.n else 'no op has a value'}. "
               f"{legend_caption()} Dashed: control edges.")
    return list(near.nodes)


def legend_caption() -> str:
    """The states' colours in words (the chart's legend draws them)."""
    words = {"nonfinite": "red", "dead": "grey", "forward_only": "beige", "no_stats": "light grey",
             "uncaptured": "white"}
    return ("; ".join(f"{words[k]}: {text}" for k, (_, text) in STATES.items()) + ". The "
            "value scale is the model's layers': the loss's and labels' ops are coloured on it "
            "without setting it.")


def open_in_browser(tensor: str) -> None:
    """Switch to the tensor browser showing ``tensor`` (its URL-bound ``tb_tensor``)."""
    st.session_state.pop("tb_search", None)  # a search left from earlier would hide the tensor
    page_links.switch_to("Tensor browser", {"tb_tensor": tensor})
