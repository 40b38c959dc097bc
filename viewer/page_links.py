"""Opening one page from another: app_main registers how it makes a page's ``st.Page``, so a
page switches to another without importing app_main (which imports every page)."""
from __future__ import annotations

from typing import Callable

import streamlit as st
from streamlit.navigation.page import StreamlitPage

_page_of: Callable[[str], StreamlitPage] | None = None


def register(page_of: Callable[[str], StreamlitPage]) -> None:
    """``page_of(title)``: the ``st.Page`` of the page titled ``title`` (app_main.page)."""
    global _page_of
    _page_of = page_of


def switch_to(title: str, query_params: dict[str, str]) -> None:
    """Open the page titled ``title`` with ``query_params`` (its URL-bound widgets' values)."""
    if _page_of is None:
        raise RuntimeError("the viewer's pages are not registered: viewer.app_main registers them "
                           "on import")
    st.switch_page(_page_of(title), query_params=query_params)


def link(title: str, label: str, query_params: dict[str, str] | None = None) -> None:
    """A link to the page titled ``title`` (a button that opens it with ``query_params``)."""
    if _page_of is None:
        return
    if st.button(label, key=f"link:{title}:{label}:{sorted((query_params or {}).items())}"):
        switch_to(title, query_params or {})
