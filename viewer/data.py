"""Cached data access for the viewer: every read goes through the run reader, once.

Cache keys include a *signature* of the run directory (names, sizes and mtimes of its files),
so a run still being written shows new steps on the next rerun, while moving a slider on an
unchanged run never re-reads a file.

Example::

    sig = signature("runs/exp1")
    tensors, steps, m = stats_matrix("runs/exp1", sig, "gradient", "all", "l2")
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

import inspector
from inspector import analysis

from . import paths

Sig = tuple
_root: Path | None = None


def set_root(root: Path) -> None:
    """The runs folder this server shows (one per process: from its command line)."""
    global _root
    _root = root


def signature(path: str | Path) -> Sig:
    """(name, size, mtime_ns) of every entry of a run, its statistics and dumps: cheap
    (directory listings and lstat only, links not followed) and changes whenever the writer
    adds or replaces a file."""
    out = []
    for sub in ("", "stats", "dumps"):
        try:
            with os.scandir(os.path.join(path, sub)) as it:
                for e in it:
                    if not e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                        st_ = e.stat(follow_symlinks=False)
                        out.append((sub, e.name, st_.st_size, st_.st_mtime_ns))
        except OSError:
            continue
    return tuple(sorted(out))


def with_view(sig: Sig, mode: str = "train", worker: str | None = None, batch: int | None = None) -> Sig:
    """``sig`` plus the sidebar's choice of mode, worker and eval batch: every cached read is
    keyed by the signature, so one key serves both "files changed" and "another view"."""
    return tuple(sig) + ((_VIEW, mode, worker, batch),)


_VIEW = "view"


@st.cache_resource(max_entries=16, show_spinner=False)
def get_run(path: str, sig: Sig) -> inspector.Run:
    """The reader for ``path`` at signature ``sig`` (a new one when files changed), once
    :func:`viewer.paths.check_run` accepts it (every file it would open is a regular file
    inside the runs folder), seen through the view ``sig`` ends with (:func:`with_view`;
    default: training, the chief)."""
    paths.check_run(path, _root)
    run = inspector.open_run(path)
    if sig and isinstance(sig[-1], tuple) and sig[-1][:1] == (_VIEW,):
        run = run.view(*sig[-1][1:])
    return run


@st.cache_data(max_entries=32, show_spinner=False)
def list_runs(folder: str, root: str) -> tuple[list[str], int]:
    """(runs, links skipped) in ``folder``: see :func:`viewer.paths.list_runs`."""
    runs, outside = paths.list_runs(Path(folder), Path(root))
    return [str(p) for p in runs], outside


@st.cache_data(max_entries=16, show_spinner=False)
def stats_steps(path: str, sig: Sig) -> np.ndarray:
    """Steps that have statistics (read from the first tensor's rows only)."""
    run = get_run(path, sig)
    if run.tensors.empty:
        return np.array([], np.int64)
    df = run.query_stats(kinds=["forward"], groups=["all"], columns=[])
    return np.sort(df["step"].unique()).astype(np.int64)


@st.cache_data(max_entries=64, show_spinner=False)
def stats_matrix(path: str, sig: Sig, kind: str, group: str, stat: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(tensors in catalog order, steps, matrix [tensor, step]) of one statistic.

    Built from categorical codes, not a pandas pivot: 300 tensors x 1,000 steps in ~0.1 s."""
    run = get_run(path, sig)
    df = run.query_stats(kinds=[kind], groups=[group], columns=[stat])
    if df.empty:
        return [], np.array([], np.int64), np.zeros((0, 0))
    order = [t for t in run.tensors["name"] if t in set(df["tensor"].cat.categories)]
    row_of = pd.Series(np.arange(len(order)), index=order)
    tensors = df["tensor"].astype(str).map(row_of)
    keep = tensors.notna().to_numpy()
    steps, col = np.unique(df["step"].to_numpy()[keep], return_inverse=True)
    m = np.full((len(order), len(steps)), np.nan)
    m[tensors.to_numpy()[keep].astype(int), col] = df[stat].to_numpy(dtype=np.float64)[keep]
    present = ~np.all(np.isnan(m), axis=1)
    return [t for t, p in zip(order, present) if p], steps, m[present]


@st.cache_data(max_entries=64, show_spinner=False)
def series(path: str, sig: Sig, tensor: str, kind: str, stat: str) -> pd.DataFrame:
    """``stat`` of ``tensor`` over steps, one column per group."""
    run = get_run(path, sig)
    df = run.query_stats([tensor], kinds=[kind], columns=[stat])
    return analysis.group_series(df, tensor, stat, kind) if not df.empty else pd.DataFrame()


@st.cache_data(max_entries=64, show_spinner=False)
def histograms(path: str, sig: Sig, tensor: str, steps: tuple[int, ...], kind: str) -> dict:
    """{step: {group: (edges, counts)}} of the in-graph histograms (one read for all steps)."""
    run = get_run(path, sig)
    lo, hi = (min(steps), max(steps)) if steps else (0, -1)
    df = run.query_stats([tensor], steps=(lo, hi), kinds=[kind], columns=["hist_lo", "hist_hi", "histogram"])
    df = df[df["step"].isin(steps)]
    out: dict = {}
    for row in df.itertuples(index=False):
        counts = np.asarray(row.histogram, np.int64)
        out.setdefault(int(row.step), {})[str(row.group)] = (np.linspace(row.hist_lo, row.hist_hi, len(counts) + 1),
                                                             counts)
    order = {"all": 0, "positive": 1, "negative": 2}
    return {s: dict(sorted(g.items(), key=lambda kv: order.get(kv[0], 9))) for s, g in sorted(out.items())}


@st.cache_data(max_entries=64, show_spinner=False)
def dumped(path: str, sig: Sig, tensor: str, step: int, kind: str = "forward") -> np.ndarray:
    """A dumped tensor as an in-memory array (copied out of the memory map)."""
    return np.array(get_run(path, sig).tensor(tensor, step, kind))


@st.cache_data(max_entries=32, show_spinner=False)
def samples(path: str, sig: Sig, step: int) -> pd.DataFrame:
    return get_run(path, sig).samples(step)


@st.cache_data(max_entries=32, show_spinner=False)
def update_ratios(path: str, sig: Sig) -> pd.DataFrame:
    """Update / weight L2 ratio per variable record (columns) and statistics step (index)."""
    run = get_run(path, sig)
    variables = list(run.variables.index)
    if not variables:
        return pd.DataFrame()
    stats = run.query_stats(tensors=variables, kinds=["forward", "update"], groups=["all"], columns=["l2"])
    return analysis.update_ratios(stats, run.tensors)


@st.cache_data(max_entries=32, show_spinner=False)
def dump_keys(path: str, sig: Sig, step: int) -> list[str]:
    return get_run(path, sig).dump_keys(step)


@st.cache_data(max_entries=8, show_spinner=False)
def alerts(path: str, sig: Sig) -> pd.DataFrame:
    return analysis.alerts_frame(analysis.run_alerts(get_run(path, sig)))


@st.cache_data(max_entries=8, show_spinner=False)
def icnn_layers(path: str, sig: Sig) -> pd.DataFrame:
    """ICNN layers, index = layer name, one column per role (tensor name or None)."""
    return get_run(path, sig).icnn_layers().set_index("layer")
