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
    if data.signature(path) != sig:
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
    return Ctx(path, sig, tuple(runs))


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
