"""TF Inspector viewer: ``streamlit run app.py -- runs/`` (a run, or a folder of runs).

Reads runs only through ``inspector`` (no TensorFlow). The sidebar picks the run and the
page; each page lives in ``viewer/``. The page and the run are also in the URL
(``?page=Distributions&run=exp1``).
The folder can also come from the environment variable ``TF_INSPECTOR_RUNS``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run from any directory

from inspector.errors import InspectorError  # noqa: E402
from inspector.format import MODES  # noqa: E402
from viewer import browser, compare, data, distributions, featuremaps, masks, overview, summary  # noqa: E402
from viewer.ui import Ctx, guard  # noqa: E402

PAGES = {"Summary": summary, "Training overview": overview, "Distributions": distributions,
         "Feature maps": featuremaps, "Masks & templates": masks, "Tensor browser": browser, "Compare": compare}


def default_root() -> str:
    """The folder given after ``--`` on the command line, else $TF_INSPECTOR_RUNS, else ``runs``."""
    if len(sys.argv) > 1 and Path(sys.argv[0]).name == "app.py":
        return sys.argv[1]
    return os.environ.get("TF_INSPECTOR_RUNS", "runs")


@st.fragment(run_every=3)
def watch(path: str, sig: tuple) -> None:
    """Auto-refresh: rerun the whole app when the run's files change (checked every 3 s)."""
    if data.signature(path) != sig:  # the files' signature, without the view
        st.rerun()


def sidebar() -> Ctx | None:
    """Root folder, run picker, refresh controls and page choice. None if no run can be shown."""
    sb = st.sidebar
    sb.title("TF Inspector")
    if "root" not in st.session_state:
        st.session_state.root = default_root()
    root = sb.text_input("Run, or folder of runs", key="root")
    page = sb.radio("Page", list(PAGES), key="page", bind="query-params")
    if sb.button("Refresh", help="re-read the run: shows new steps of a run still being written"):
        data.find_runs.clear()  # new runs in the folder; changed files are caught by the signature
    try:
        runs = data.find_runs(root)
    except InspectorError as e:
        st.error(f"Cannot open {root!r}: {e}")
        return None
    if not runs:
        st.error(f"No run in {root!r}: a run is a directory holding manifest.<worker>.json "
                 f"(written by DumpHook). Give a run or a folder of runs in the sidebar.")
        return None
    by_name = {Path(p).name: p for p in runs}  # the runs directly inside the folder: unique names
    path = by_name[sb.selectbox("Run", list(by_name), key="run", bind="query-params")]  # ?run=<name>
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


def main() -> None:
    st.set_page_config(page_title="TF Inspector", layout="wide")
    ctx = sidebar()
    if ctx is None:
        return
    try:
        data.get_run(ctx.path, ctx.sig)
    except InspectorError as e:
        st.error(f"Cannot read run {ctx.path}: {e}")
        return
    page = st.session_state.get("page") or "Summary"
    with guard(page):
        PAGES[page].render(ctx)


main()
