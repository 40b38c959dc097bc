"""The viewer server's start: ``python -m viewer.start run <script> [streamlit options]`` is
``streamlit run`` with the modules every page view needs imported first, before the server
answers, so the first page view after a start does not pay those imports (2-3 s).

Streamlit runs the page script per view in the server's own process, so a module imported here
is one the script finds in ``sys.modules``: a plain ``streamlit run`` after the imports, with no
server-start hook needed from Streamlit. ``python -m inspector app`` and ``make demo`` start the
viewer this way; ``streamlit run app.py`` works as well, without the preload.

Example (what ``inspector.cli.app`` runs)::

    python -m viewer.start run viewer/app.py --server.port 8501 -- runs/
"""
from __future__ import annotations

import importlib
import logging
import sys
import time

log = logging.getLogger("tf_inspector.viewer")

#: What the pages import (``viewer.app_main`` imports every page module, hence inspector, numpy,
#: pandas, pyarrow and Altair); Matplotlib, which the pages import on first use
#: (``viewer.ui.plots``), too: the first view of a page with figures would pay it
PRELOAD = ("viewer.app_main", "inspector.analysis.plots", "matplotlib.pyplot")


def preload(names: tuple[str, ...] = PRELOAD) -> float:
    """Import ``names``; seconds taken. A module that fails is logged and skipped: the page view
    that needs it shows the error."""
    t = time.perf_counter()
    # each st.cache_data function defined before Streamlit's runtime exists warns that it has
    # none (29 lines): it is made just after, and the pages' caches use it
    caching = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    quiet = _Below(logging.ERROR)
    caching.addFilter(quiet)
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # the server still starts; the page says what is missing
                log.exception("viewer: preloading %s failed", name)
    finally:
        caching.removeFilter(quiet)
    return time.perf_counter() - t


class _Below(logging.Filter):
    """Drops a logger's records under ``level`` (Streamlit sets its loggers' levels itself)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def main(argv: list[str]) -> None:
    """:func:`preload`, then ``streamlit <argv>`` in this process (its health check answers once
    the imports are done: no page view can arrive before them)."""
    handler = logging.StreamHandler()   # the server's console: Streamlit's lines, and ours
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.info("viewer: modules preloaded in %.1f s", preload())
    from streamlit.web import cli

    sys.argv = ["streamlit", *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
