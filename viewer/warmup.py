"""The first page, read ahead: when the viewer's server starts, a thread draws the Summary of the
runs folder's first run (the page a first visit opens) with no browser attached, so the reads
and chart specs that page caches are there, or being made, when the first visitor arrives.

Drawn outside a browser session, Streamlit's elements are dropped and its widgets return their
defaults ("bare mode"), while ``st.cache_data`` / ``st.cache_resource`` keep what the page reads:
the page's own code fills the cache, so what is read ahead is exactly what it reads (no list of
reads to keep in step with it). A visitor arriving while it runs waits on the same cached calls
(Streamlit computes a cache entry once, whoever asks first), never reading twice. Nothing here
can stop the server: a run that cannot be read is left to the page to report.

Example (``viewer.start``, before the server starts)::

    warmup.start("runs/")
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("tf_inspector.viewer")
#: How long the thread waits for Streamlit's runtime (the caches the server's pages use)
RUNTIME_WAIT_S = 120.0
THREAD = "tf-inspector-warmup"
#: Streamlit's loggers that warn, once per element, that a thread draws without a browser session:
#: what this thread does on purpose (their other records, and other threads', pass)
BARE_MODE_LOGGERS = ("streamlit", "streamlit.runtime.scriptrunner_utils.script_run_context",
                     "streamlit.runtime.state.session_state_proxy",
                     "streamlit.runtime.caching.cache_data_api")


class _NotThisThread(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD or record.levelno >= logging.ERROR


def summary(given: str) -> str | None:
    """Draw the Summary of the first run in the runs folder ``given`` (as the sidebar picks it:
    the folder itself, its first run, the default view) in bare mode; that run's path, or None
    where the folder has no run."""
    from viewer import app_main, data
    from viewer.app_pages import summary as page
    from viewer.paths import resolve_inside
    from viewer.ui import Ctx

    root = app_main.runs_root(given)
    data.set_root(root)
    runs, _ = data.list_runs(str(resolve_inside(root, "")), str(root))
    if not runs:
        return None
    path = runs[0]
    sig = data.signature(path)
    if sig is None:
        return None
    page.render(Ctx(path, app_main.view_picker(path, sig), tuple(runs)))
    return path


def _run(given: str) -> None:
    from streamlit.runtime import Runtime

    deadline = time.monotonic() + RUNTIME_WAIT_S
    while not Runtime.exists():   # before it, the caches would be this thread's, not the pages'
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    for name in BARE_MODE_LOGGERS:
        logging.getLogger(name).addFilter(_NotThisThread())
    t = time.perf_counter()
    try:
        path = summary(given)
    except Exception:  # the page says what is wrong when it is visited
        log.debug("viewer: reading the first run ahead failed", exc_info=True)
        return
    if path is not None:
        log.info("viewer: the Summary of %s read ahead in %.1f s", path, time.perf_counter() - t)


def start(given: str) -> threading.Thread:
    """Start reading the Summary of ``given``'s first run ahead, on a daemon thread."""
    thread = threading.Thread(target=_run, args=(given,), name=THREAD, daemon=True)
    thread.start()
    return thread
