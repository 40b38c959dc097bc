"""The TF Inspector viewer's entry: ``main()`` draws the page (a run, or a folder of runs).

Streamlit runs a script: ``app.py`` at the repository root (``streamlit run app.py -- runs/``)
calls :func:`main`, and ``python -m inspector app runs/`` runs this file itself (it ships in the
package, so the viewer works from an installed wheel too).

Reads runs only through ``inspector`` (no TensorFlow). The folder given at start (else the
environment variable ``TF_INSPECTOR_RUNS``, else ``runs``) is the viewer's *runs folder*: it
never reads outside it. The sidebar picks a run or sub-folder inside it, the run and the page;
each page lives in ``viewer/``. The page and the run are also in the URL
(``?page=Distributions&run=exp1``).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import streamlit as st

if __name__ == "__main__" and str(Path(__file__).resolve().parents[1]) not in sys.path:
    # run as a script (`streamlit run .../viewer/app_main.py`) from a checkout that is not
    # installed: import viewer/ and inspector/ from beside this file (hence noqa: E402 below)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inspector.errors import InspectorError  # noqa: E402
from inspector.format import MODES  # noqa: E402
from inspector.safepath import real  # noqa: E402
from inspector.storage import is_url  # noqa: E402
from viewer import browser, compare, data, distributions, featuremaps, masks, overview, summary  # noqa: E402
from viewer.paths import resolve_inside  # noqa: E402
from viewer.ui import Ctx, guard, plain  # noqa: E402

PAGES = {"Summary": summary, "Training overview": overview, "Distributions": distributions,
         "Feature maps": featuremaps, "Masks & templates": masks, "Tensor browser": browser, "Compare": compare}
log = logging.getLogger("tf_inspector.viewer")
#: The scripts ``streamlit run`` is given: their arguments after ``--`` are the viewer's.
SCRIPTS = ("app.py", "app_main.py")


def default_root() -> str:
    """The folder given after ``--`` on the command line, else $TF_INSPECTOR_RUNS, else ``runs``."""
    if len(sys.argv) > 1 and Path(sys.argv[0]).name in SCRIPTS:
        return sys.argv[1]
    return os.environ.get("TF_INSPECTOR_RUNS") or "runs"


@st.fragment(run_every=3)
def watch(path: str, sig: tuple) -> None:
    """Auto-refresh: rerun the whole app when the run's files change (checked every 3 s)."""
    if data.signature(path) != sig:  # the files' signature, without the view
        st.rerun()


def pick_run(folder: Path, root: Path) -> tuple[str, list[str]] | None:
    """The sidebar's run picker (``?run=<name>``) over the runs in ``folder``: (the chosen
    run's path, every run there), or None after a message (no run there, or ``?run=`` names
    none of them: never another run instead)."""
    runs, outside = data.list_runs(str(folder), str(root))
    if outside:
        st.sidebar.caption(f"{outside} entr{'y' if outside == 1 else 'ies'} leading outside the runs folder: skipped")
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
    return by_name[name], runs


def sidebar() -> Ctx | None:
    """Path inside the runs folder, run picker, refresh controls and page choice. None (after a
    message) if no run can be shown."""
    sb = st.sidebar
    sb.title("TF Inspector")
    given = default_root()
    root = given.rstrip("/") if is_url(given) else real(given)  # a URL: a folder of runs in a bucket
    data.set_root(root)
    sb.caption(f"Runs folder: {plain(root)}")
    text = sb.text_input("Run or folder inside it", key="path", placeholder="(the runs folder itself)",
                         help="a path relative to the runs folder (or an absolute path inside it)")
    sb.radio("Page", list(PAGES), key="page", bind="query-params")
    if sb.button("Refresh", help="re-read the run: shows new steps of a run still being written"):
        data.list_runs.clear()  # new runs in the folder; changed files are caught by the signature
    try:
        picked = pick_run(resolve_inside(root, text), root)
    except InspectorError as e:
        st.error(plain(e))
        return None
    if picked is None:
        return None
    path, runs = picked
    sig = data.signature(path)
    if sb.toggle("Auto-refresh (3 s)", key="auto", help="follow a run that is still being written"):
        watch(path, sig)
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
    modes = [m for m in MODES if m in set(sessions["mode"])] or ["train"]
    mode = sb.selectbox("Mode", modes, key="mode", bind="query-params") if len(modes) > 1 else modes[0]
    workers = run.workers
    worker = sb.selectbox("Worker", workers, key="worker", bind="query-params") if len(workers) > 1 else None
    batch = None
    if mode != "train":
        batch = int(sb.number_input("Batch of each evaluation", min_value=0, value=0, step=1, key="batch"))
    return data.with_view(sig, mode, worker, batch)


def show() -> None:
    ctx = sidebar()
    if ctx is None:
        return
    try:
        data.get_run(ctx.path, ctx.sig)
    except InspectorError as e:
        st.error(f"Cannot read run {plain(ctx.path)}: {plain(e)}")
        return
    page = st.session_state.get("page") or "Summary"
    with guard(page):
        PAGES[page].render(ctx)


def main() -> None:
    """The page; whatever fails is a short message here and a traceback in the server log."""
    st.set_page_config(page_title="TF Inspector", layout="wide")
    try:
        show()
    except Exception as e:  # st.rerun/st.stop are BaseExceptions: they pass
        log.exception("viewer: the page failed")
        st.error(f"The viewer could not draw this page ({type(e).__name__}); the details are in the server log.")


if __name__ == "__main__":  # run as a script by `streamlit run` (see inspector.cli)
    main()
