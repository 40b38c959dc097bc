"""The ops a search finds that were not captured, and why: the table the Tensor browser and the
Op graph page show under a search (``run.uncaptured``)."""
from __future__ import annotations

import streamlit as st

from inspector.errors import InspectorError

from .ui import plain


def show_uncaptured(run, text: str, expanded: bool) -> None:
    """The graph's ops (and skipped tensors) matching ``text`` that were not captured, each
    skipped (why) or excluded (by which rule): ``run.uncaptured``, so a search for an op that
    is not in the catalog says why instead of nothing."""
    try:
        df = run.uncaptured(text)
    except InspectorError as e:
        st.caption(f"Ops not captured: unknown ({plain(str(e))})")
        return
    if df.empty:
        if run.accounting().empty:
            st.caption("This run predates the accounting: it does not record why other ops were "
                       "not captured.")
        return
    more = " (the first 200)" if len(df) >= 200 else ""
    with st.expander(f"{len(df)} ops matching the search were not captured{more}: skipped or "
                     "excluded, and why",
                     expanded=expanded):
        st.dataframe(df, hide_index=True, width="stretch", height=min(260, 40 + 35 * len(df)))
