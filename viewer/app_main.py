"""The TF Inspector viewer's entry: ``main()`` draws the page (a run, or a folder of runs).

Streamlit runs a script: ``app.py`` at the repository root (``streamlit run app.py -- runs/``)
calls :func:`main`, and ``python -m inspector app runs/`` runs this file itself (it ships in the
package, so the viewer works from an installed wheel too).

Reads runs only through ``inspector`` (no TensorFlow). The folder given at start (else the
environment variable ``TF_INSPECTOR_RUNS``, else ``runs``) is the viewer's *runs folder*: it
never reads outside it. The sidebar picks a run or sub-folder inside it and the run; Streamlit's
multipage navigation (``st.navigation``) picks the page, each with its own URL path (the page
module's name: ``/distributions?run=exp1``; Summary, the default, is the root ``/``), so the
browser's Back and Forward move between pages. The folder, the run and each page's main choices
(tensor, step, sample, filter, group) are widgets bound to the URL's query (``bind="query-params"``,
the widget's key names the parameter): a copied link reproduces the view. Back and Forward
reload the history entry's URL (``viewer/history.py``: Streamlit 1.60 would rerun with the
previous view's query), so the page shows what its URL names. Each page lives in
``viewer/app_pages/``; an old link's ``?page=<title>`` opens that page.
"""
from __future__ import annotations

import contextvars
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import streamlit as st
from streamlit.navigation.page import StreamlitPage

if __name__ == "__main__" and str(Path(__file__).resolve().parents[1]) not in sys.path:
    # run as a script (`streamlit run .../viewer/app_main.py`) from a checkout that is not
    # installed: import viewer/ and inspector/ from beside this file (hence noqa: E402 below)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inspector.format.provenance import first_note, gradient_meaning# noqa: E402
from inspector.errors import InspectorError  # noqa: E402
from inspector.format import MODES  # noqa: E402
from inspector.storage.safety import real# noqa: E402
from inspector.storage import is_url  # noqa: E402
from inspector.sessions.trainings import view_note# noqa: E402
from viewer import data, history, page_links  # noqa: E402
from viewer.app_pages import (browser, compare, distributions, featuremaps, graph,  # noqa: E402
                              masks, overview, summary)
from viewer.paths import resolve_inside  # noqa: E402
from viewer.ui import Ctx, figure_theme, guard, plain  # noqa: E402

#: page title -> its module (``render(ctx)``); the URL path of a page is its module's name
PAGES: dict[str, ModuleType] = {
    "Summary": summary, "Training overview": overview, "Distributions": distributions,
    "Feature maps": featuremaps, "Masks & templates": masks, "Tensor browser": browser,
    "Op graph": graph, "Compare": compare}
log = logging.getLogger("tf_inspector.viewer")
#: Streamlit's toolbar without developer items ("Deploy", rerun, clear cache); "minimal" would
#: also hide the settings menu, where the user picks the light or dark theme.
TOOLBAR_MODE = "viewer"
#: The scripts ``streamlit run`` is given: their arguments after ``--`` are the viewer's.
SCRIPTS = ("app.py", "app_main.py")


#: The sidebar's widgets, kept across page switches (each page has its own widgets, and a page
#: switch drops the old page's query, so without this a new page would open the first run)
KEPT = ("path", "auto", "run", "mode", "worker")


def restore_sidebar(page_path: str) -> None:
    """Give the sidebar's widgets on a newly opened page the values they had on the last one,
    unless the URL names a value (a link or Back/Forward): the URL wins. On a page switch a
    value the URL lacks (Streamlit's switch can drop it) is set again even where the widget kept
    it: Streamlit then writes it into the new page's URL, so a link copied there names the run."""
    switched = st.session_state.get("_shown_page") not in (None, page_path)
    st.session_state["_shown_page"] = page_path
    for key in KEPT:
        kept = st.session_state.get(f"_kept_{key}")
        if key not in st.query_params and kept is not None \
                and (switched or key not in st.session_state):
            st.session_state[key] = kept


def remember_sidebar() -> None:
    for key in KEPT:
        if key in st.session_state:
            st.session_state[f"_kept_{key}"] = st.session_state[key]


def default_root() -> str:
    """The folder given after ``--`` on the command line, else $TF_INSPECTOR_RUNS, else ``runs``."""
    if len(sys.argv) > 1 and Path(sys.argv[0]).name in SCRIPTS:
        return sys.argv[1]
    return os.environ.get("TF_INSPECTOR_RUNS") or "runs"


def url_path(module: ModuleType) -> str:
    """A page's URL path: its module's name (``url_path(overview) == "overview"``)."""
    return module.__name__.rsplit(".", 1)[-1]


_ctx: contextvars.ContextVar[Ctx | None] = contextvars.ContextVar("tf_inspector_ctx", default=None)


def page_runner(title: str):
    """The callable ``st.Page`` runs for ``title``: that page's ``render`` on the sidebar's run
    (nothing when the sidebar showed why no run can be shown)."""
    def run() -> None:
        ctx = _ctx.get()
        if ctx is not None:
            with guard(title), figure_theme():
                PAGES[title].render(ctx)
    run.__name__ = url_path(PAGES[title])
    return run


@st.fragment(run_every=3)
def watch(folder: str, root: str, runs: tuple[str, ...], path: str | None,
          sig: tuple | None) -> None:
    """Auto-refresh (checked every 3 s): rerun the whole app when the folder's runs change (a
    new run appears: the run list is re-read) or the shown run's files change."""
    if tuple(data.list_runs.__wrapped__(folder, root)[0]) != runs:  # uncached: the folder now
        data.list_runs.clear()
        st.rerun()
    if path is not None and data.signature(path) != sig:  # the files' signature, without the view
        st.rerun()


def pick_run(folder: Path, root: Path, runs: list[str], outside: int) -> str | None:
    """The sidebar's run picker (``?run=<name>``) over ``runs`` (those in ``folder``): the chosen
    run's path, or None after a message (no run there, or ``?run=`` names none of them: never
    another run instead)."""
    if outside:
        st.sidebar.caption(f"{outside} entr{'y' if outside == 1 else 'ies'} leading outside the "
                           "runs folder: skipped")
    if not runs:
        st.error(f"No run in {plain(folder)}: a run is a directory holding manifest.<worker>.json "
                 f"(written by DumpHook). Give a run or a folder of runs in the sidebar.")
        return None
    by_name = {Path(p).name: p for p in runs}  # the runs directly inside the folder: unique names
    asked = st.query_params.get("run")
    unknown = asked is not None and asked not in by_name
    name = st.sidebar.selectbox("Run", list(by_name), index=None if unknown else 0, key="run",
                                bind="query-params", placeholder="choose a run")
    if name is None:
        st.error(f"No run named {plain(repr(asked or ''))} in {plain(folder)}; choose one of its "
                 f"{len(by_name)} runs in the sidebar.")
        return None
    return by_name[name]


def sidebar() -> Ctx | None:
    """Path inside the runs folder, run picker and refresh controls. None (after a message) if
    no run can be shown."""
    sb = st.sidebar
    sb.title("TF Inspector")
    given = default_root()
    # a URL: a folder of runs in a bucket
    root = given.rstrip("/") if is_url(given) else real(given)
    data.set_root(root)
    # the runs folder named in the help, not a caption of its own: every element of the sidebar
    # is paid by every page
    text = sb.text_input("Run or folder in the runs folder", key="path",
                         bind="query-params",  # ?path=: a link keeps the folder
                         placeholder="(the runs folder itself)",
                         help=f"the runs folder: {plain(root)}; a path relative to it (or an "
                              "absolute path inside it)")
    if sb.button("Refresh", help="re-read the run: shows new steps of a run still being written"):
        data.list_runs.clear()  # new runs in the folder; changed files are caught by the signature
    auto = sb.toggle("Auto-refresh (3 s)", key="auto", bind="query-params",
                     help="follow a run that is still being written and new runs appearing in the "
                          "folder")
    try:
        folder = resolve_inside(root, text)
        runs, outside = data.list_runs(str(folder), str(root))
    except InspectorError as e:
        st.error(plain(e))
        return None
    path = pick_run(folder, root, runs, outside)
    sig = data.signature(path) if path else None
    if auto:
        watch(str(folder), str(root), tuple(runs), path, sig)
    if path is None or sig is None:
        return None
    return Ctx(path, view_picker(path, sig), tuple(runs))


def view_picker(path: str, sig: tuple) -> tuple:
    """Mode, worker and eval batch to show, offered where the run has more than one; returns
    the signature every page reads with (``data.with_view``). One worker at a time: the pages
    plot one row per step."""
    try:
        run = data.get_run(path, sig)
    except InspectorError:
        return sig  # main() says what is wrong with the run
    sb, sessions = st.sidebar, run.sessions
    note = first_note(run.tensors["captured_on"])
    if note:   # every page's gradients and updates: not the ones the steps' updates came from
        sb.caption(f"**Gradients and updates: {plain(note)}** ({plain(gradient_meaning(note))})")
    if run.groups_note:   # every page lists group 'all' alone: say why
        sb.caption(f"**Groups: all only.** {plain(run.groups_note)}")
    modes = [m for m in MODES if m in set(sessions["mode"])] or ["train"]
    mode = sb.selectbox("Mode", modes, key="mode", bind="query-params") if len(modes) > 1 \
        else modes[0]
    workers = run.workers
    worker = sb.selectbox("Worker", workers, key="worker", bind="query-params") \
        if len(workers) > 1 else None
    batch = None
    if mode != "train":
        batch = int(sb.number_input("Batch of each evaluation", min_value=0, value=0, step=1,
                                    key="batch"))
    note = view_note(sessions, mode, worker or run._default_for(mode))
    if note:   # which session each step of the curves is from; an earlier training hidden
        sb.caption(plain(note))
    return data.with_view(sig, mode, worker, batch)


def page(title: str) -> StreamlitPage:
    """The ``st.Page`` of ``title`` (also what ``st.switch_page`` takes to open it from a page)."""
    return st.Page(page_runner(title), title=title, url_path=url_path(PAGES[title]),
                   default=title == next(iter(PAGES)))


page_links.register(page)   # a page opens another through page_links, never importing this module


def navigation() -> StreamlitPage:
    """The pages, one URL path each (Summary is the default: the root URL, not ``/summary``); an
    old link's ``?page=<title>`` switches to that page, keeping its other query parameters."""
    pages = {title: page(title) for title in PAGES}
    current = st.navigation(list(pages.values()), position="sidebar")
    legacy = st.query_params.get("page")
    if legacy in pages and pages[legacy].url_path != current.url_path:
        keep = {k: st.query_params.get_all(k) for k in st.query_params if k != "page"}
        st.switch_page(pages[legacy], query_params=keep)
    return current


def show() -> None:
    page = navigation()
    restore_sidebar(page.url_path)
    ctx = sidebar()
    remember_sidebar()
    history.install()  # Back/Forward reload the entry's URL: the view it names, history kept
    if ctx is not None:
        try:
            data.get_run(ctx.path, ctx.sig)
        except InspectorError as e:
            st.error(f"Cannot read run {plain(ctx.path)}: {plain(e)}")
            ctx = None
    token = _ctx.set(ctx)
    try:
        page.run()  # the page's own guard turns its errors into messages
    finally:
        _ctx.reset(token)


def main() -> None:
    """The page; whatever fails is a short message here and a traceback in the server log."""
    st.set_page_config(page_title="TF Inspector", layout="wide")
    # no "Deploy" button, rerun or clear-cache items (the theme menu stays): .streamlit/config.toml
    # beside the script sets it from the first page load; this covers a script started elsewhere
    st.set_option("client.toolbarMode", TOOLBAR_MODE)
    try:
        show()
    except Exception as e:  # st.rerun/st.stop are BaseExceptions: they pass
        log.exception("viewer: the page failed")
        st.error(f"The viewer could not draw this page ({type(e).__name__}); the details are in "
                 "the server log.")


if __name__ == "__main__":  # run as a script by `streamlit run` (see inspector.cli)
    main()
