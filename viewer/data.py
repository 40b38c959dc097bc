"""Cached data access for the viewer: every read goes through the run reader, once.

Cache keys include a *signature* of the run directory (names, sizes and mtimes of its files),
so a run still being written shows new steps on the next rerun, while moving a slider on an
unchanged run never re-reads a file.

Example::

    sig = signature("runs/exp1")
    ov = overview("runs/exp1", sig, "gradient", "all", "l2")
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import streamlit as st

import inspector
from inspector import analysis
from inspector.stats import summary as stats_summary
from inspector.stats import histograms as inspector_histograms
from inspector.icnn import templates
from inspector.errors import InspectorError
from inspector.graph.graphdef import OpGraph
from inspector.storage import is_url, open_storage

from . import paths
from .layers import layer_rows
from .layers import plumbing as loss_and_labels
from .layers import network_order as order_of
from .charts.raster import MAX_COLUMNS

Sig = tuple
_root: Path | str | None = None


def set_root(root: Path | str) -> None:
    """The runs folder this server shows (one per process: from its command line)."""
    global _root
    _root = root


def signature(path: str | Path) -> Sig:
    """(name, size, mtime_ns) of every entry of a run, its statistics and dumps: cheap
    (directory listings and lstat only, links not followed) and changes whenever the writer
    adds or replaces a file. In an object store: the listings' sizes and ETags."""
    if isinstance(path, str) and is_url(path):
        store = open_storage(path)
        return tuple(sorted((sub, e.name, e.size, e.stamp) for sub in ("", "stats", "dumps")
                            for e in store.list(sub)
                            if e.size is not None and not e.name.startswith(".")))
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


def with_view(sig: Sig, mode: str = "train", worker: str | None = None,
              batch: int | None = None) -> Sig:
    """``sig`` plus the sidebar's choice of mode, worker and eval batch: every cached read is
    keyed by the signature, so one key serves both "files changed" and "another view"."""
    return tuple(sig) + ((_VIEW, mode, worker, batch),)


_VIEW = "view"


def same_view(sig: Sig, like: Sig) -> Sig:
    """``sig`` (another run's) seen through the view ``like`` ends with: its mode and eval
    batch, and its worker where one was chosen. A second run read without it would show its
    training rows beside the first run's evaluation rows under one chart's labels.

    >>> same_view(("b",), with_view(("a",), "eval", None, 0))
    ('b', ('view', 'eval', None, 0))
    """
    if like and isinstance(like[-1], tuple) and like[-1][:1] == (_VIEW,):
        return with_view(sig, *like[-1][1:])
    return tuple(sig)


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
    runs, outside = paths.list_runs(folder if is_url(folder) else Path(folder),
                                    root if is_url(root) else Path(root))
    return [str(p) for p in runs], outside


@st.cache_data(max_entries=16, show_spinner=False)
def stats_steps(path: str, sig: Sig) -> np.ndarray:
    """Steps that have statistics (forward, group all: :meth:`inspector.Run.stats_steps`)."""
    run = get_run(path, sig)
    if run.tensors.empty:
        return np.array([], np.int64)
    return run.stats_steps()


@st.cache_data(max_entries=64, show_spinner=False)
def overview(path: str, sig: Sig, kind: str, group: str, stat: str,
             exact: bool = False) -> stats_summary.Overview:
    """The layer x step matrix of one statistic: one column per statistics step whenever the run
    has at most ``raster.MAX_COLUMNS`` of them (or ``exact``: every step, for a chart that
    aggregates them itself, e.g. to a bin's extreme); else, on a long run, at most that many
    columns of ``width`` steps (the mean of the bin's values, NaN if any is NaN/Inf) read from
    the parts' summaries, never finer than they are (see
    :func:`inspector.stats.summary.overview`), not from a long run's millions of rows."""
    run = get_run(path, sig)
    steps = stats_steps(path, sig)
    if exact or len(steps) <= MAX_COLUMNS:
        # bins one step wide: each statistics step its own column, read exactly (a summary's
        # bins, coarser, are not used)
        span = int(steps[-1] - steps[0] + 1) if len(steps) else 1
        return stats_summary.overview(run, kind, group, stat, max_columns=max(span, MAX_COLUMNS))
    return stats_summary.overview(run, kind, group, stat, max_columns=MAX_COLUMNS, coarsen=True)


def binned(path: str, sig: Sig) -> bool:
    """Whether :func:`overview` bins this run's statistics steps (more than fit a chart)."""
    return len(stats_steps(path, sig)) > MAX_COLUMNS


@st.cache_data(max_entries=32, show_spinner=False)
def group_ratio(path: str, sig: Sig, kind: str, stat: str, num: str = "negative",
                den: str = "positive", exact: bool = False) -> stats_summary.Overview:
    """``num`` / ``den`` of one statistic per tensor and column (:func:`overview`'s columns)."""
    return analysis.ratio_overview(overview(path, sig, kind, num, stat, exact),
                                   overview(path, sig, kind, den, stat, exact))


@st.cache_data(max_entries=64, show_spinner=False)
def stats_matrix(path: str, sig: Sig, kind: str, group: str,
                 stat: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(tensors in catalog order, steps, matrix [tensor, step]) of one statistic: :func:`overview`'s
    matrix, without the tensors that have no statistics of ``kind`` (a NaN-only tensor is kept)."""
    ov = overview(path, sig, kind, group, stat)
    have = ov.present.any(axis=1) if ov.present is not None and ov.present.size \
        else np.zeros(len(ov.tensors), bool)
    return [t for t, p in zip(ov.tensors, have) if p], ov.steps, ov.matrix[have]


@st.cache_data(max_entries=32, show_spinner=False)
def layer_table(path: str, sig: Sig, tensors: tuple[str, ...]) -> pd.DataFrame:
    """:func:`viewer.layers.layer_rows` of ``tensors`` in the run's network order, each with its
    part (model, loss or labels: :func:`plumbing`), once per choice."""
    return layer_rows(get_run(path, sig).tensors, list(tensors), network_order(path, sig),
                      plumbing(path, sig))


def plumbing(path: str, sig: Sig) -> dict[str, str]:
    """{op: "loss" / "labels"} of the run's loss and label ops (:func:`viewer.layers.plumbing`,
    from its graph and the manifest's loss and labels tensors)."""
    return _plumbing(path, graph_key(sig), sig)


@st.cache_data(max_entries=8, show_spinner=False)
def _plumbing(path: str, key: Sig, _sig: Sig) -> dict[str, str]:
    m = get_run(path, _sig).manifest
    try:
        graph = op_graph(path, _sig)
    except InspectorError:
        graph = None
    return loss_and_labels(graph, m.get("loss"), m.get("labels"))


def graph_key(sig: tuple) -> tuple:
    """The part of ``sig`` the graph depends on: the graph files and the view."""
    return tuple(e for e in sig
                 if e[0] == "view" or (e[0] == "" and str(e[1]).startswith("graph.")))


def op_graph(path: str, sig: tuple, worker: str | None = None,
             session: int | None = None) -> OpGraph:
    """The graph of ``worker``'s ``session`` (default: the run's default manifest's), parsed once
    per graph file (``InspectorError`` if unreadable or over ``graphdef.MAX_GRAPH_BYTES``)."""
    return _op_graph(path, graph_key(sig), sig, worker, session)


@st.cache_resource(max_entries=8, show_spinner=False)
def _op_graph(path: str, key: tuple, _sig: tuple, worker: str | None,
              session: int | None) -> OpGraph:
    try:
        return get_run(path, _sig).op_graph(worker, session)   # bounded by MAX_GRAPH_BYTES
    except OSError as e:
        raise InspectorError("this run's session has no readable graph file "
                             f"({type(e).__name__})") from None


def network_order(path: str, sig: Sig) -> dict[str, int] | None:
    """Each op's place in the forward graph's topological order
    (:func:`viewer.layers.network_order`) from the run's graph; None when the run has no readable
    graph (rows keep the catalog's order)."""
    return _network_order(path, graph_key(sig), sig)


@st.cache_data(max_entries=8, show_spinner=False)
def _network_order(path: str, key: Sig, _sig: Sig) -> dict[str, int] | None:
    try:
        return order_of(op_graph(path, _sig))
    except InspectorError:
        return None


@st.cache_data(max_entries=64, show_spinner=False)
def series(path: str, sig: Sig, tensor: str, kind: str, stat: str) -> pd.DataFrame:
    """``stat`` of ``tensor`` over steps, one column per group."""
    run = get_run(path, sig)
    df = run.query_stats([tensor], kinds=[kind], columns=[stat])
    return analysis.group_series(df, tensor, stat, kind) if not df.empty else pd.DataFrame()


def tensor_histograms(path: str, sig: Sig, tensor: str, kind: str) -> pd.DataFrame:
    """Every statistics row of ``tensor`` / ``kind`` with its histogram and element count, cut
    from :func:`_tensor_histograms`."""
    df = _tensor_histograms(path, sig, tensor)
    return df[df["kind"] == kind]


@st.cache_data(max_entries=16, show_spinner=False)
def _tensor_histograms(path: str, sig: Sig, tensor: str) -> pd.DataFrame:
    """Every statistics row of ``tensor`` (every kind) with its histogram and element count: one
    read that :func:`histograms` and :func:`histogram_totals` slice. A Parquet read of one step
    or one kind costs about as much as of all (the column chunks are read whole), so a page
    asking for one step, a few and every step, forward and gradient, reads the tensor once."""
    return get_run(path, sig).query_stats([tensor], columns=[*inspector_histograms.COLUMNS,
                                                             "count", "mean", "min", "max"])


@st.cache_data(max_entries=64, show_spinner=False)
def histograms(path: str, sig: Sig, tensor: str, steps: tuple[int, ...], kind: str) -> dict:
    """{step: {group: histogram}} of the in-graph histograms (from :func:`tensor_histograms`),
    groups in the run's order: a :class:`~inspector.format.loghist.LogHistogram`, or ``(edges,
    counts)`` of the equal-width bins of a run before format version 4
    (:func:`inspector.stats.histograms.of_row`)."""
    run = get_run(path, sig)
    df = tensor_histograms(path, sig, tensor, kind)
    df = df[df["step"].isin(steps)]
    out: dict = {}
    for row in df.itertuples(index=False):
        h = inspector_histograms.of_row(row)
        if h is not None:
            out.setdefault(int(row.step), {})[str(row.group)] = h
    order = {g: i for i, g in enumerate(run.groups)}
    return {s: dict(sorted(g.items(), key=lambda kv: order.get(kv[0], 9)))
            for s, g in sorted(out.items())}


def extent(path: str, sig: Sig, tensor: str, steps: tuple[int, ...], kind: str,
           groups: Iterable[str]) -> tuple[float, float] | None:
    """The exact (min, max) of ``groups``' finite values over ``steps`` (the statistics' own):
    a linear histogram axis's range. None where the statistics hold none."""
    lows, highs = (histogram_totals(path, sig, tensor, steps, kind, c) for c in ("min", "max"))
    gs = set(groups)
    lo = [v for by in lows.values() for g, v in by.items() if g in gs and np.isfinite(v)]
    hi = [v for by in highs.values() for g, v in by.items() if g in gs and np.isfinite(v)]
    return (min(lo), max(hi)) if lo and hi else None


@st.cache_data(max_entries=64, show_spinner=False)
def dumped(path: str, sig: Sig, tensor: str, step: int, kind: str = "forward") -> np.ndarray:
    """A dumped tensor as an in-memory array (copied out of the memory map)."""
    return np.array(get_run(path, sig).tensor(tensor, step, kind))


@st.cache_data(max_entries=64, show_spinner=False)
def peaks(path: str, sig: Sig, tensor: str, step: int) -> np.ndarray:
    """Each dumped sample's strongest activation per channel of a [N, H, W, C] map: [N, C]."""
    a = np.asarray(dumped(path, sig, tensor, step), np.float64)
    return a.reshape(len(a), -1, a.shape[-1]).max(axis=1) if a.ndim >= 3 \
        else a.reshape(len(a), -1)


@st.cache_data(max_entries=32, show_spinner=False)
def samples(path: str, sig: Sig, step: int, tensor: str | None = None) -> pd.DataFrame:
    """The dump's kept samples; with ``tensor``, those of its rows (a tower's tensor: its tower's;
    none for a tensor that is not per-sample, dumped whole)."""
    run = get_run(path, sig)
    if tensor is not None and not bool(run.tensors.loc[tensor, "batched"]):
        return run.samples(step).iloc[:0]
    return run.samples(step, tensor=tensor)


def sample_groups(kept: pd.DataFrame, fill: str | None = None) -> np.ndarray | None:
    """Each kept sample's group name (:func:`samples`' ``group``). A dump without one (a run
    without labels, a step whose samples broke the group rule): ``fill`` for every sample,
    or None when no ``fill`` is given.

    >>> sample_groups(pd.DataFrame({"index": [0, 1]}), "kept").tolist()
    ['kept', 'kept']
    """
    if "group" in kept:
        return kept["group"].to_numpy()
    return None if fill is None else np.full(len(kept), fill)


@st.cache_data(max_entries=32, show_spinner=False)
def update_ratios(path: str, sig: Sig) -> pd.DataFrame:
    """Update / weight L2 ratio per variable record (columns) and statistics step (index)."""
    run = get_run(path, sig)
    variables = list(run.variables.index)
    if not variables:
        return pd.DataFrame()
    stats = run.query_stats(tensors=variables, kinds=["forward", "update"], groups=["all"],
                            columns=["l2"])
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


@st.cache_data(max_entries=64, show_spinner=False)
def histogram_totals(path: str, sig: Sig, tensor: str, steps: tuple[int, ...], kind: str,
                     column: str = "count") -> dict:
    """{step: {group: the rows' ``column``}}: by default the real element count, to state beside
    histograms that count a subsample (tensors over 16,384 elements, FORMAT.md); ``"mean"``: the
    exact mean over every element, which a histogram's bins can only approximate (``"min"``,
    ``"max"``: the exact extremes)."""
    df = tensor_histograms(path, sig, tensor, kind)
    out: dict = {}
    for step, group, value in zip(*(df.loc[df["step"].isin(steps), c]
                                    for c in ("step", "group", column))):
        out.setdefault(int(step), {})[str(group)] = int(value) if column == "count" \
            else float(value)
    return out


def dumps_key(sig: Sig) -> Sig:
    """The part of ``sig`` that what dumps hold depends on: the dump files, the names of the
    manifests (sessions; not their heartbeat rewrites) and the view. New statistics parts of a
    live run leave it unchanged, so the dump headers are not re-read for them."""
    out = []
    for e in sig:
        if e[0] in ("dumps", _VIEW):
            out.append(e)
        elif e[0] == "" and str(e[1]).startswith("manifest."):
            out.append(e[:2])
    return tuple(out)


def explicit(step: int, config: dict) -> bool:
    """True if ``step`` is in one of ``config['dump_steps']`` ([first, last] inclusive ranges)
    and not a multiple of ``dump_every_n_steps``: the hook dumped it because it was listed.

    >>> explicit(25, {"dump_every_n_steps": 10, "dump_steps": [[25, 25]]})
    True
    """
    every = config.get("dump_every_n_steps")
    if isinstance(every, int) and every > 0 and step % every == 0:
        return False
    ranges = config.get("dump_steps")
    return any(isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, int) for v in r)
               and r[0] <= step <= r[1] for r in (ranges if isinstance(ranges, list) else []))


def reason_of(meta: dict, step: int, run) -> str:
    """Why ``step`` was dumped, from its ``__metadata__`` (``meta``): the hook's reason ('schedule'
    when the key is absent: older runs), with 'schedule' told apart into 'explicit step' by the
    writing session's ``dump_steps`` (the hook writes 'schedule' for both)."""
    reason = str(meta.get("reason") or "schedule")
    if reason != "schedule":
        return reason
    try:
        manifest = run.manifests.get((meta.get("worker"), int(meta.get("session", -1))),
                                     run.manifest)
    except (TypeError, ValueError):
        manifest = run.manifest
    config = manifest.get("config") if isinstance(manifest, dict) else None
    return "explicit step" if explicit(int(step), config if isinstance(config, dict) else {}) \
        else "schedule"


def dump_infos(path: str, sig: Sig) -> list[dict]:
    """One ``{step, reason, damaged}`` per dump step of the view, from the dump headers only
    (``reason``: why the hook dumped it, see :func:`reason_of`; ``damaged``: the
    reader's message for a file that cannot be read, else None)."""
    return _dump_infos(path, dumps_key(sig), sig)


@st.cache_data(max_entries=16, show_spinner=False)
def _dump_infos(path: str, key: Sig, _sig: Sig) -> list[dict]:
    """:func:`dump_infos`, cached by :func:`dumps_key` (``_sig``, not hashed, opens the run)."""
    sig = _sig
    run = get_run(path, sig)
    out = []
    for step in run.steps:
        try:
            meta = run.dump_metadata(step)
        except InspectorError as e:
            out.append({"step": int(step), "reason": None, "damaged": str(e)})
            continue
        out.append({"step": int(step), "reason": reason_of(meta, step, run), "damaged": None})
    return out


@st.cache_data(max_entries=8, show_spinner=False)
def loss_series(path: str, sig: Sig) -> tuple[str | None, pd.Series]:
    """(the manifest's loss tensor, its forward ``mean`` of group ``all`` over steps); an empty
    series if the manifest names no loss or the run has no statistics of it."""
    run = get_run(path, sig)
    name = run.manifest.get("loss")
    if not isinstance(name, str) or name not in set(run.tensors["name"]):
        return (name if isinstance(name, str) else None), pd.Series(dtype=float)
    df = run.query_stats([name], kinds=["forward"], groups=["all"], columns=["mean"])
    return name, df.groupby("step")["mean"].last() if not df.empty else pd.Series(dtype=float)


def readable_steps(path: str, sig: Sig) -> list[int]:
    """Dump steps whose file header reads (damaged ones left out)."""
    return [d["step"] for d in dump_infos(path, sig) if not d["damaged"]]


def dead_filters(path: str, sig: Sig, step: int | None = None) -> dict[str, list[int]]:
    """{ICNN layer: dead filters} at dump ``step`` (default: the newest readable dump), see
    :func:`inspector.icnn.templates.dead_filters`; layers whose maps that dump lacks (or holds in an
    unexpected shape) are left out. Cached by :func:`dumps_key`: new statistics read nothing."""
    return _dead_filters(path, dumps_key(sig), step, sig)


@st.cache_data(max_entries=16, show_spinner=False)
def _dead_filters(path: str, key: Sig, step: int | None, _sig: Sig) -> dict[str, list[int]]:
    sig = _sig
    steps = readable_steps(path, sig)
    step = steps[-1] if step is None and steps else step
    if step is None:
        return {}
    keys = set(dump_keys(path, sig, step))
    out = {}
    for layer, roles in icnn_layers(path, sig).iterrows():
        have = {r: roles.get(r) for r in ("pre_mask", "mu")
                if isinstance(roles.get(r), str) and f"forward/{roles.get(r)}" in keys}
        if not have:
            continue
        try:
            dead = templates.dead_filters(**{r: dumped(path, sig, name, step)
                                             for r, name in have.items()})
        except ValueError:  # maps of an unexpected shape: no verdict for this layer
            continue
        out[str(layer)] = [int(c) for c in np.flatnonzero(dead)]
    return out


@st.cache_data(max_entries=8, show_spinner=False)
def diagnosis(path: str, sig: Sig) -> list[dict]:
    """``analysis.diagnose(run)``: the run's findings, the most likely culprit first."""
    return [dict(f.__dict__) for f in analysis.diagnose(get_run(path, sig))]


@st.cache_data(max_entries=8, show_spinner=False)
def first_nonfinite(path: str, sig: Sig) -> dict | None:
    """``Run.first_nonfinite()``: the earliest NaN/Inf evidence, with its ``source``."""
    return get_run(path, sig).first_nonfinite()
