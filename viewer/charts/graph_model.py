"""The op graph page's whole-model view: every op of the graph, name scopes collapsed into one box
each (TensorBoard's Graphs dashboard), the scopes chosen under "Open scopes" drawn open as nested
clusters, coloured like the neighbourhood view (:mod:`viewer.charts.graph_colours`).

A closed scope's box is red when any op inside has a NaN/Inf, else filled by the median of its
captured ops' values, and says how many ops it holds and how many of them were captured. Five or
more closed sibling scopes named alike but for a trailing number (``conv2`` ... ``conv333``) are one
dashed *series* box; open one of them to draw it apart. The scopes around the centre op and around
the search's matches are always open, so a search shows where its matches lie. Over
:data:`MAX_UNITS` boxes the deepest open scopes are closed again.

Example::

    drawn = render(graph, looks, scale, "rms", keep, centre="conv2/Relu", matches=[],
                   where="forward rms at step 9")
"""
from __future__ import annotations

from typing import Callable

import streamlit as st

from inspector.graph.scopes import all_scopes, collapse, scopes_of
from inspector.graph.graphdef import OpGraph

from .graph_colours import Look, Scale
from .graph_dot import model_dot
from ..ui import plain

#: the most boxes drawn: beyond it the deepest open scopes are closed (Graphviz lays the chart out
#: in the browser, in a time that grows fast with the boxes: bench/README.md, "Op graph")
MAX_UNITS = 200
#: search matches whose scopes are opened and whose boxes are outlined
MAX_REVEALED = 20


def revealed(centre: str | None, matches: list[str]) -> set[str]:
    """The scopes opened for the centre op and the first :data:`MAX_REVEALED` search matches."""
    return {s for op in [centre, *matches[:MAX_REVEALED]] if op for s in [*scopes_of(op), op]}


def render(graph: OpGraph, looks: dict[str, Look], scale: Scale, stat: str,
           keep: Callable[[str], bool], centre: str, matches: list[str], where: str) -> list[str]:
    """The whole-model view's widget and chart; returns the ops drawn as boxes of their own."""
    kept = [n for n in graph.nodes if keep(n) or n == centre]
    scopes = sorted(all_scopes(kept))
    opened = st.multiselect("Open scopes", scopes, key="gr_open_scopes", bind="query-params",
                            placeholder="every scope closed",
                            help="name scopes drawn open (their ops and sub-scopes inside a "
                                 "frame); the scopes holding the centre op and the search matches "
                                 "are open anyway")
    view = collapse(graph, set(opened) | revealed(centre, matches),
                    lambda n: n == centre or keep(n), MAX_UNITS)
    if view.closed:
        st.warning(f"Opening every chosen scope would draw over {MAX_UNITS} boxes: "
                   f"{len(view.closed)} of the deepest were left closed "
                   f"({plain(', '.join(view.closed[:5]))}{', ...' * (len(view.closed) > 5)}).")
    # drawn at its own size in a scrolling frame, not fitted to the page: fitted, a model of
    # many scopes shrank its labels to a few pixels
    st.html("<style>.st-key-gr_model_frame [data-testid='stGraphVizChart'] svg {max-width: none}"
            " .st-key-gr_model_frame [data-testid='stGraphVizChart'] {overflow-x: auto}</style>")
    with st.container(height=900, border=True, key="gr_model_frame"):
        st.graphviz_chart(model_dot(view, graph, looks, scale, stat,
                                    set(matches[:MAX_REVEALED]), centre),
                          width="content")
    kinds = [u.kind for u in view.units.values()]
    st.caption(f"{len(kept)} ops in {len(view.units)} boxes: {kinds.count('scope')} closed scopes "
               "(double border; red if an op inside has a NaN/Inf, else the median of its "
               f"captured ops), {kinds.count('series')} series of alike-named scopes or ops "
               f"(dashed) and {kinds.count('op')} ops; {len(view.clusters)} open scopes as frames. "
               f"Fill: {where}, {scale.describe() if scale.n else 'no op has a value'}. Blue "
               f"border: the centre {plain(centre)}"
               + (f"; orange: the search's matches (the first {MAX_REVEALED})" if matches else "")
               + ". Edge labels: how many op-to-op data edges an edge stands for; control edges "
                 "are left out.")
    return [u.name for u in view.units.values() if u.kind == "op"]
