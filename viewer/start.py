"""The viewer server's start: the modules every page view needs, imported once when the server
starts, before it accepts the first browser (Streamlit runs the page script per view, and the
first view after a start would otherwise pay these imports: 2-3 s).

``streamlit run app.py`` (and ``viewer/app.py``, which ``python -m inspector app`` runs) finds
the ``st.App`` the script defines when imported as a module, and serves it; its ``lifespan``
runs :func:`preload` before the server answers. Page views run the same file as a script.

Example (what ``app.py`` does)::

    app = App(__file__, lifespan=lifespan)     # imported by `streamlit run`: the ASGI app
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from typing import Any, AsyncIterator

log = logging.getLogger("tf_inspector.viewer")

#: What the pages import (``viewer.app_main`` imports every page module, hence inspector, numpy,
#: pandas, pyarrow and Altair); Matplotlib, which the pages import on first use
#: (``viewer.ui.plots``), too: the first view of a page with figures would pay it
PRELOAD = ("viewer.app_main", "inspector.analysis.plots", "matplotlib.pyplot")


def preload(names: tuple[str, ...] = PRELOAD) -> float:
    """Import ``names``; seconds taken. A module that fails is logged and skipped: the page view
    that needs it shows the error."""
    t = time.perf_counter()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the server still starts; the page says what is missing
            log.exception("viewer: preloading %s failed", name)
    return time.perf_counter() - t


@contextlib.asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """The ``st.App`` lifespan: :func:`preload` before the server accepts connections (in a
    worker thread: the event loop stays free)."""
    secs = await asyncio.get_running_loop().run_in_executor(None, preload)
    log.info("viewer: modules preloaded in %.1f s", secs)
    yield
