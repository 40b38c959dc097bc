"""A run's statistics as TensorBoard event files, once or live
(``tf-inspector export --tensorboard``).

Layout (docs/tensorboard.md): ``<logdir>/<run name>/<group>/train`` and
``.../<group>/validation`` (an evaluation, its batches merged), one TensorBoard run each, so
the run selector compares the groups (``all``, ``positive``, ``negative`` or the run's own)
and the experiments exported into one logdir. Tags:

* ``<kind>/<tensor>/<stat>``: stat one of :data:`STATS` (``gradient/conv3/Relu:0/rms``; with
  ``per_layer``, ``gradient/conv3/rms``: the layer's output tensor, as the Training overview
  folds a layer); ``nan`` and ``inf`` from the first step a tensor had one;
* ``<kind>/<tensor>``: its histogram, every stored bucket as one TensorBoard bucket;
* ``loss`` (the mean of the manifest's loss tensor) and ``update_ratio/<variable>`` (group
  ``all``, training).

Example::

    ex = Exporter(lambda: open_run("runs/exp1"), Path("tb"))
    ex.poll()            # what is new since the last poll
    follow(ex, 5.0)      # poll every 5 s until the run ends
    ex.close()
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from inspector.analysis.compare import update_ratios
from inspector.errors import InspectorError
from inspector.export.tfevents import EventFile
from inspector.format.loghist import CEIL, bucket_edges
from inspector.run import Run

#: The scalars of each (tensor, kind, group), in tag order.
STATS = ("rms", "mean", "std", "zero_fraction", "nan", "inf")
#: Scalars written from the first step they are non-zero (a NaN count of 0 at every step of
#: every tensor would be a third of the export).
SPARSE = ("nan", "inf")
#: TensorBoard's run folder of each exported mode (Keras's convention); predict is not exported.
MODE_DIRS = {"train": "train", "eval": "validation"}
#: Statistics read per chunk of steps (bounded memory).
CHUNK_STEPS = 1000
#: About this many histogram steps per tag when no stride is given (a power-of-two stride
#: that doubles as a followed run grows).
HISTOGRAMS = 100
#: Histograms are read in this many batches of tensors (memory: a part's histogram columns
#: over this, for the same decoding work: each row group is read by one batch).
HISTOGRAM_BATCHES = 8
#: The run's problems that leave exported rows out: a statistics part damaged or missing,
#: histogram rows no writer writes.
_LEFT_OUT_RE = re.compile(r"statistics|histogram")
#: A run in one of these states writes no more.
ENDED = ("finished", "failed", "crashed")
_READ = ["count", "mean", "std", "l2", "zero_fraction", "nan", "inf"]
_KEYS = ["step", "tensor", "kind", "group"]
_EVENTS_RE = re.compile(r"^events\.out\.tfevents\.")
#: A path component the export may create: not empty, ``.`` or ``..``, no separator, no
#: control character (a group, the run's name).
_UNSAFE_RE = re.compile(r"[/\\\x00-\x1f\x7f]")


def safe_component(name: str, what: str) -> str:
    """``name`` if it can be one folder's name under ``--logdir``, else InspectorError naming it
    (``what``: what it names)."""
    if not name or name in (".", "..") or _UNSAFE_RE.search(name):
        raise InspectorError(f"{what} {name!r} cannot name a folder of the export (empty, '.', "
                             "'..', a path separator or a control character); not exported")
    return name


def confined(logdir: Path, path: Path) -> Path:
    """``path`` (under ``logdir``) if no folder from ``logdir`` down to it is a symlink and it
    resolves inside ``logdir``; InspectorError naming the link otherwise (as the run reader
    refuses links out of a run)."""
    base = logdir.resolve()
    at = logdir
    for part in path.relative_to(logdir).parts:
        at = at / part
        if at.is_symlink():
            raise InspectorError(f"{at} is a symlink; the export writes only real folders under "
                                 f"--logdir {logdir}, refusing to write through it")
    if not path.resolve().is_relative_to(base):
        raise InspectorError(f"{path} resolves outside --logdir {logdir}; refusing to write it")
    return path


def layer_labels(catalog: pd.DataFrame, names: Sequence[str]) -> dict[str, str]:
    """{output tensor: layer} for the layers of ``names``: a tensor's layer is its ICNN layer,
    else its Keras layer (``keras_layer``: Keras 3's op scopes carry call suffixes, ``net_1/d1_1``,
    and a variable read's scope is its own, ``d1_1/Cast``), else its name scope, a scope TF
    opened under an op's own name counting as that op's
    (``conv1/Conv2D/ReadVariableOp`` is ``conv1``'s); a layer's output is its ICNN
    ``post_mask``, else its last op output in graph order (variables are no outputs). The
    rule the Training overview folds by (viewer/layers.py), kept here so the core package
    needs no viewer.

    >>> cat = pd.DataFrame({"name": ["c/Conv2D:0", "c/Relu:0", "d:0"],
    ...                     "op": ["c/Conv2D", "c/Relu", "d"], "scope": ["c", "c", ""],
    ...                     "icnn_layer": None, "icnn_role": None, "kind": "tensor"})
    >>> layer_labels(cat.set_index("name", drop=False), ["c/Conv2D:0", "c/Relu:0", "d:0"])
    {'c/Relu:0': 'c', 'd:0': 'd'}
    """
    cat = catalog.loc[list(names)]
    ops = dict(zip(catalog["op"], catalog["scope"].fillna("")))
    icnn = sorted({str(v) for v in catalog["icnn_layer"].dropna()})
    out: dict[str, str] = {}
    by_layer: dict[str, list[tuple[str, bool, bool]]] = {}
    keras = cat["keras_layer"] if "keras_layer" in cat \
        else pd.Series(None, index=cat.index, dtype=object)
    for name, scope, op, layer, role, kind, k in zip(cat.index, cat["scope"].fillna(""),
                                                     cat["op"], cat["icnn_layer"],
                                                     cat["icnn_role"], cat["kind"].fillna("tensor"),
                                                     keras):
        if isinstance(k, str) and k and not (isinstance(layer, str) and layer):
            by_layer.setdefault(k, []).append((name, role == "post_mask", kind != "variable"))
            continue
        seen = set()
        while scope in ops and scope not in seen:   # a scope under an op's name is that op's
            seen.add(scope)
            scope = ops[scope]
        under = [L for L in icnn if scope == L or scope.startswith(L + "/")]
        label = layer if isinstance(layer, str) and layer else max(under, key=len) if under \
            else scope or str(op)
        by_layer.setdefault(label, []).append((name, role == "post_mask", kind != "variable"))
    for label, members in by_layer.items():
        post = [n for n, is_post, _ in members if is_post]
        ops_out = [n for n, _, is_op in members if is_op]
        out[post[0] if post else ops_out[-1] if ops_out else members[-1][0]] = label
    return out


def _edges() -> tuple[np.ndarray, np.ndarray]:
    """(left, right) of every bucket index + CEIL, as TensorBoard gets them: the bucket of
    |x| >= 2**128, unbounded, with zero width at its finite edge."""
    idx = np.arange(-CEIL, CEIL + 1)
    lo, hi = bucket_edges(idx)
    return np.where(idx == -CEIL, hi, lo), np.where(idx == CEIL, lo, hi)


_EDGES = _edges()   # one lookup per bucket, not the edges computed again for each of millions


def tensorboard_buckets(index: np.ndarray, count: np.ndarray,
                        splits: np.ndarray) -> list[np.ndarray]:
    """Per row (``splits``: R + 1 offsets into ``index``/``count``, each row's buckets
    ascending) the [k, 3] TensorBoard buckets (left, right, count): each stored log-magnitude
    bucket with its exact edges (:func:`inspector.format.loghist.bucket_edges`; bucket 0, the zeros,
    as the zero-width [0, 0]; the bucket of |x| >= 2**128 with zero width at its finite edge),
    and a bucket of count 0 over each gap between two, so that TensorBoard's interpolation
    (the distributions' percentiles) stays inside stored buckets.

    >>> [b.tolist()
    ...  for b in tensorboard_buckets(np.array([0, 1010]), np.array([3, 2]), np.array([0, 2]))]
    [[[0.0, 0.0, 3.0], [0.0, 1.0, 0.0], [1.0, 1.125, 2.0]]]
    """
    idx = np.asarray(index, np.int64)
    lo, hi = _EDGES[0][idx + CEIL], _EDGES[1][idx + CEIL]
    row = np.repeat(np.arange(len(splits) - 1), np.diff(splits))
    gap = np.zeros(len(idx), bool)
    gap[1:] = (row[1:] == row[:-1]) & (lo[1:] > hi[:-1])
    # each bucket's place, after the gaps before it
    at = np.arange(len(idx)) + np.cumsum(gap)
    out = np.zeros((len(idx) + int(gap.sum()), 3))
    out[at] = np.stack([lo, hi, np.asarray(count, np.float64)], 1)
    g = np.flatnonzero(gap)
    out[at[g] - 1, 0], out[at[g] - 1, 1] = hi[g - 1], lo[g]
    sizes = np.diff(splits) + np.bincount(row[gap], minlength=len(splits) - 1)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def linear_buckets(lo: float, hi: float, counts: Sequence[int]) -> np.ndarray:
    """The [bins, 3] TensorBoard buckets of an equal-width histogram (runs before format
    version 4): edges ``np.linspace(lo, hi, bins + 1)``, as the reader gives them."""
    c = np.asarray(counts, np.float64)
    edges = np.linspace(float(lo), float(hi), len(c) + 1)
    return np.stack([edges[:-1], edges[1:], c], 1)


def merge_batches(df: pd.DataFrame) -> pd.DataFrame:
    """An evaluation's statistics rows, one per (step, tensor, kind, group): the rows of its
    batches combined as the statistics of all their values (count-weighted mean and zero
    fraction, pooled std, summed counts, L2 of the L2s). A step of one batch keeps its row."""
    dup = df.duplicated(_KEYS, keep=False)
    if not dup.any():
        return df
    m = df[dup].copy()
    c = m["count"].astype(np.float64)
    m["_cm"], m["_cz"], m["_l2"] = c * m["mean"], c * m["zero_fraction"], m["l2"] ** 2
    g = m.groupby(_KEYS, observed=True, sort=False)
    total = g["count"].transform("sum").astype(np.float64)
    mean = g["_cm"].transform("sum") / total
    m["_var"] = c * (m["std"] ** 2 + (m["mean"] - mean) ** 2)
    g = m.groupby(_KEYS, observed=True, sort=False)
    merged = g[["count", "nan", "inf"]].sum()
    tot = merged["count"].astype(np.float64)
    merged["mean"] = g["_cm"].sum() / tot
    merged["std"] = np.sqrt(g["_var"].sum() / tot)
    merged["zero_fraction"] = g["_cz"].sum() / tot
    merged["l2"] = np.sqrt(g["_l2"].sum())
    out = pd.concat([df[~dup], merged.reset_index()], ignore_index=True)
    for col in ("tensor", "kind", "group"):
        out[col] = out[col].astype("category")
    return out


@dataclass
class _ModeState:
    last: int = -1                      # the last step exported
    first: int | None = None            # the first step seen (the auto stride's span)
    last_hist: int | None = None        # the last step given histograms
    files: dict[str, EventFile] = field(default_factory=dict)   # group -> its event file


class Exporter:
    """Exports the statistics of the run ``open()`` returns (called again at each poll: a live
    run's new files) into ``logdir``; see the module docstring."""

    def __init__(self, open: Callable[[], Run], logdir: Path, *, first: Run | None = None,
                 tensors: str | None = None, per_layer: bool = False, histogram_every: int = 0,
                 worker: str | None = None, force: bool = False) -> None:
        """``first``: the run as ``open()`` just returned it (not opened again); ``tensors``: a
        regex on tensor names; ``force``: replace an earlier export of this run in ``logdir``."""
        if worker == "all":
            raise InspectorError("--worker all: a TensorBoard run holds one value per step and "
                                 "tag; export one worker at a time (--worker NAME, into one "
                                 "--logdir each)")
        if histogram_every < 0:
            raise InspectorError(f"--histogram-every {histogram_every} must be >= 0 (0: about "
                                 f"{HISTOGRAMS} histogram steps per tag)")
        self.open, self.per_layer, self.every, self.worker = \
            open, per_layer, histogram_every, worker
        self.pattern = re.compile(tensors) if tensors else None
        run = first or open()
        if worker is not None:
            # an InspectorError naming the run's workers if it has no such one
            run.view(worker=worker)
        self.logdir = Path(logdir)
        self.root = self.logdir / safe_component(run.name, "the run's name")
        self.modes = {m: _ModeState() for m in MODE_DIRS}
        self.steps = 0                   # statistics steps exported (all modes)
        self.histogram_steps = 0         # of which with histograms
        self.tags: set[str] = set()
        #: what was left out, each said once: damaged parts, missing parts, invalid histogram
        #: rows, unsafe group names (the CLI exits non-zero when there are any)
        self.problems: list[str] = []
        self._claim(run.path, force)

    def _claim(self, run_path: object, force: bool) -> None:
        """Refuse a logdir inside the run, or one already holding an export of it (``force``:
        its event files are deleted, nothing else)."""
        if isinstance(run_path, Path) and self.root.resolve().is_relative_to(run_path.resolve()):
            raise InspectorError(f"--logdir {self.root.parent} is inside the run {run_path}; write "
                                 "it elsewhere")
        confined(self.logdir, self.root)
        old = [p for p in self.root.rglob("*") if _EVENTS_RE.match(p.name) and p.is_file()
               and not p.is_symlink()] if self.root.is_dir() else []
        if old and not force:
            raise InspectorError(f"{self.root} holds an export already ({len(old)} event files); "
                                 f"pass --force to replace them, or another --logdir")
        for p in old:
            p.unlink()

    # ---- one poll ------------------------------------------------------------------------
    def poll(self, run: Run | None = None) -> int:
        """Export the steps recorded since the last poll; returns how many (over all modes)."""
        run = run or self.open()
        done = 0
        for mode in MODE_DIRS:
            done += self._export_mode(run, mode)
        self._report([m for m in run.problems if _LEFT_OUT_RE.search(m)])
        for st in self.modes.values():
            for f in st.files.values():
                f.flush()
        self.steps += done
        return done

    def _report(self, problems: list[str]) -> None:
        """Keep each new problem once (a followed run reports it at the poll that finds it)."""
        self.problems += [m for m in dict.fromkeys(problems) if m not in self.problems]

    def close(self) -> None:
        for st in self.modes.values():
            for f in st.files.values():
                f.close()

    def _names(self, run: Run) -> list[str]:
        names = list(run.tensors.index)
        return [n for n in names if self.pattern.search(n)] if self.pattern else names

    def _export_mode(self, run: Run, mode: str) -> int:
        st = self.modes[mode]
        if self.worker is None and run.default_worker is None:
            raise InspectorError(f"{run.path} has workers {', '.join(run.workers)} and no chief: "
                                 "pass --worker NAME (a TensorBoard run holds one worker's "
                                 "values)")
        try:
            view = run.view(mode=mode, worker=self.worker)
        except InspectorError:      # this worker wrote nothing (yet)
            return 0
        steps = view.stats_steps()
        if mode == "eval" and _evaluating(run):    # an evaluation's batches may still come
            steps = steps[:0]
        new = steps[steps > st.last]
        if not len(new):
            return 0
        st.first = int(steps[0]) if st.first is None else st.first
        names = self._names(run)
        labels = layer_labels(run.tensors, names) if self.per_layer else {n: n for n in names}
        variables = list(run.tensors.index[run.tensors["kind"] == "variable"])
        loss = run.manifest.get("loss")
        loss = loss if isinstance(loss, str) and loss in run.tensors.index else None
        read = sorted(set(labels) | set(variables) | ({loss} if loss else set()))
        for a in range(0, len(new), CHUNK_STEPS):
            chunk = new[a:a + CHUNK_STEPS]
            table = view.query_stats_table(read, steps=(int(chunk[0]), int(chunk[-1])),
                                           columns=_READ, mode=mode, worker=self.worker)
            self._scalars(run, mode, Run.to_pandas(table), labels,
                          loss if mode == "train" else None, variables if mode == "train" else [])
        hist_steps = self._histogram_steps(st, new, int(steps[-1]))
        if len(hist_steps):
            self._histograms(view, mode, labels, hist_steps)
        st.last = int(new[-1])
        return len(new)

    def _file(self, mode: str, group: str) -> EventFile | None:
        """The event file of ``group`` in ``mode``; None (reported) for a group whose name is
        no safe folder name."""
        st = self.modes[mode]
        if group not in st.files:
            try:
                folder = self.root / safe_component(group, "the sample group") / MODE_DIRS[mode]
            except InspectorError as e:
                self._report([str(e)])
                return None
            st.files[group] = EventFile(confined(self.logdir, folder))
        return st.files[group]

    # ---- scalars -------------------------------------------------------------------------
    def _scalars(self, run: Run, mode: str, df: pd.DataFrame, labels: dict[str, str],
                 loss: str | None, variables: list[str]) -> None:
        if df.empty:
            return
        if mode == "eval":
            df = merge_batches(df)
        extras = _extras(df, run.tensors, loss, variables)
        keep, series, prefixes = _series(df, labels)
        group = df["group"].cat.codes.to_numpy(np.int64)[keep]
        step = df["step"].to_numpy(np.int64)[keep]
        rows = np.column_stack([df["l2"] / np.sqrt(df["count"].astype(np.float64)),
                                *(df[c].astype(np.float64) for c in STATS[1:])])[keep]
        names = list(df["group"].cat.categories.astype(str))
        for name in sorted(set(np.asarray(names)[np.unique(group)])
                           | ({"all"} if len(extras.columns) else set())):
            m = group == (names.index(name) if name in names else -1)
            steps = np.union1d(step[m], extras.index.to_numpy(np.int64) if name == "all"
                               else np.zeros(0, np.int64))
            used, col = np.unique(series[m], return_inverse=True)
            tags = [f"{prefixes[u]}/{s}" for u in used for s in STATS]
            values = np.full((len(steps), len(used), len(STATS)), np.nan)
            present = np.zeros(values.shape, bool)
            at = np.searchsorted(steps, step[m])
            values[at, col], present[at, col] = rows[m], True
            values, present = values.reshape(len(steps), -1), present.reshape(len(steps), -1)
            f = self._file(mode, name)
            if f is None:
                continue
            sparse = np.tile([s in SPARSE for s in STATS], len(used)) \
                & ~np.isin(tags, list(f.described))
            # a sparse scalar starts at its first non-zero value (NaN counts as one)
            present[:, sparse] &= np.maximum.accumulate(
                np.nan_to_num(values[:, sparse], nan=1.0) != 0, axis=0)
            if name == "all" and len(extras.columns):
                tags += list(extras.columns)
                values = np.concatenate([values, extras.reindex(steps).to_numpy(np.float64)], 1)
                present = np.concatenate(
                    [present, extras.notna().reindex(steps, fill_value=False).to_numpy()], 1)
            f.scalars(tags, steps, values, present)
            self.tags.update(tags)

    # ---- histograms ----------------------------------------------------------------------
    def _histogram_steps(self, st: _ModeState, new: np.ndarray, last: int) -> np.ndarray:
        chosen = histogram_steps(new, self.every, st.first or 0, last, st.last_hist)
        if len(chosen):
            st.last_hist = int(chosen[-1])
        self.histogram_steps += len(chosen)
        return chosen

    def _histograms(self, view: Run, mode: str, labels: dict[str, str], steps: np.ndarray) -> None:
        """The histograms of ``steps``, read a batch of tensors at a time: a compacted part
        decodes only the row groups of the batch's tensors (its rows are sorted by tensor),
        so memory holds 1/HISTOGRAM_BATCHES of a part's histogram columns, not all of them."""
        names = list(labels)
        size = max(1, -(-len(names) // HISTOGRAM_BATCHES))
        for a in range(0, len(names), size):
            table = view.query_stats_table(names[a:a + size], at_steps=steps.tolist(), mode=mode,
                                           worker=self.worker,
                                           columns=["hist_bucket", "hist_count", "hist_lo",
                                                    "hist_hi", "histogram"])
            if not table.num_rows:
                continue
            for group, per_step in _histogram_rows(table, labels, merge=mode == "eval").items():
                if (f := self._file(mode, group)) is not None:
                    f.histograms(sorted(per_step.items()))


def histogram_steps(new: np.ndarray, every: int, first: int, last: int,
                    last_hist: int | None) -> np.ndarray:
    """Of the ``new`` steps (ascending), those given histograms: the first of each block of
    ``every`` steps that has none yet (``last_hist``: the last step given some). ``every`` 0:
    the power of two that makes about :data:`HISTOGRAMS` blocks of the steps ``first`` to
    ``last`` seen so far, so it doubles as a followed run grows (earlier histograms stay).

    >>> histogram_steps(np.arange(10, 20), 4, 0, 19, 9).tolist()
    [12, 16]
    """
    every = every or 1 << max(0, int(np.ceil(np.log2(max(1.0, (last - first + 1) / HISTOGRAMS)))))
    block = np.asarray(new, np.int64) // every
    keep = block > (last_hist // every if last_hist is not None else -1)
    _, at = np.unique(block[keep], return_index=True)
    return np.asarray(new)[keep][at]


def _evaluating(run: Run) -> bool:
    s = run.sessions
    return bool(((s["mode"] == "eval") & (s["state"] == "running")).any())


def _extras(df: pd.DataFrame, catalog: pd.DataFrame, loss: str | None,
            variables: list[str]) -> pd.DataFrame:
    """The step-indexed scalars of group ``all`` beside the statistics: ``loss``,
    ``update_ratio/<variable>``."""
    out = pd.DataFrame(index=pd.Index(np.zeros(0, np.int64), name="step"))
    if variables:
        ratios = update_ratios(df, catalog)
        if len(ratios.columns):
            out = ratios.rename(columns=lambda v: f"update_ratio/{v}")
    if loss:
        rows = df[(df["tensor"] == loss) & (df["kind"] == "forward") & (df["group"] == "all")]
        if len(rows):
            out = out.join(rows.groupby("step")["mean"].last().rename("loss"), how="outer")
    out.index = out.index.astype(np.int64)
    return out.sort_index()


def _series(df: pd.DataFrame, labels: dict[str, str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(rows of ``df`` whose tensor has a label, each such row's series, the series' tag
    prefixes ``<kind>/<label>``), from the categorical codes: no string work per row."""
    tensors = list(df["tensor"].cat.categories.astype(str))
    label = np.array([labels.get(t, "") for t in tensors] + [""], object)   # code -1 (missing): ""
    tcode = df["tensor"].cat.codes.to_numpy(np.int64)
    kinds = list(df["kind"].cat.categories.astype(str))
    keep = label[tcode] != ""
    pair = df["kind"].cat.codes.to_numpy(np.int64)[keep] * len(label) \
        + np.where(tcode < 0, len(tensors), tcode)[keep]
    uniq, series = np.unique(pair, return_inverse=True)
    return keep, series.ravel(), [f"{kinds[u // len(label)]}/{label[u % len(label)]}" for u in uniq]


def _histogram_rows(table: pa.Table, labels: dict[str, str],
                    merge: bool) -> dict[str, dict[int, list]]:
    """{group: {step: [(tag, buckets)]}} of a statistics table's histograms (``merge``: the
    rows of one (step, tensor, kind, group), an evaluation's batches, added; equal-width
    histograms of several batches have no common edges and are left out)."""
    lists = [c for c in ("hist_bucket", "hist_count", "histogram") if c in table.column_names]
    df = Run.to_pandas(table.drop_columns(lists))
    keep, series, prefixes = _series(df, labels)
    rows = np.flatnonzero(keep)
    groups = np.asarray(df["group"].cat.categories.astype(str))[
        df["group"].cat.codes.to_numpy(np.int64)]
    steps = df["step"].to_numpy(np.int64)
    tags = np.full(len(df), "", object)
    tags[rows] = np.asarray(prefixes, object)[series]
    key = pd.MultiIndex.from_arrays([steps, tags, groups]).factorize()[0] if merge \
        else np.arange(len(df))
    out: dict[str, dict[int, list]] = {}

    def put(r: int, buckets: np.ndarray) -> None:
        if tags[r]:
            out.setdefault(groups[r], {}).setdefault(int(steps[r]), []).append((tags[r], buckets))

    if "hist_bucket" in table.column_names:
        bucket = table.column("hist_bucket").combine_chunks()
        index = np.asarray(bucket.values, np.int64)
        count = np.asarray(table.column("hist_count").combine_chunks().values, np.float64)
        splits = np.asarray(bucket.offsets, np.int64)
        owners = np.arange(len(df))
        if merge:   # add the buckets of one key's rows: sorted by (key, bucket)
            width = 2 * CEIL + 1
            merged, inv = np.unique(np.repeat(key, np.diff(splits)) * width + index + CEIL,
                                    return_inverse=True)
            count = np.bincount(inv.ravel(), weights=count, minlength=len(merged))
            index = merged % width - CEIL
            owned, starts = np.unique(merged // width, return_index=True)
            owners = np.unique(key, return_index=True)[1][owned]
            splits = np.append(starts, len(merged))
        for r, buckets in zip(owners, tensorboard_buckets(index, count, splits)):
            if len(buckets):
                put(int(r), buckets)
    if "histogram" in table.column_names:
        hist = table.column("histogram").to_pylist()
        alone = np.bincount(key)[key] == 1
        for r, h in enumerate(hist):
            if h is not None and alone[r]:
                put(r, linear_buckets(df["hist_lo"].iat[r], df["hist_hi"].iat[r], h))
    return out


def follow(exporter: Exporter, interval: float, log: Callable[[str], None] = print,
           stop: threading.Event | None = None) -> None:
    """Poll every ``interval`` seconds until the run ends (:data:`ENDED`; one last poll then)
    or ``stop`` is set."""
    stop = stop or threading.Event()
    while True:
        run = exporter.open()
        ended = run.status in ENDED    # read first: rows flushed before the end are in this poll
        known = len(exporter.problems)
        n = exporter.poll(run)
        for m in exporter.problems[known:]:
            log(f"left out: {m}")
        if n:
            log(f"exported {n} new step(s); {exporter.steps} in all")
        if ended:
            log(f"the run is {run.status}: done")
            return
        if stop.wait(interval):
            return


def describe(exporter: Exporter) -> str:
    """One line: what was written where."""
    runs = sorted(f"{g}/{MODE_DIRS[m]}" for m, st in exporter.modes.items() for g in st.files)
    return (f"wrote {exporter.steps} steps ({exporter.histogram_steps} with histograms), "
            f"{len(exporter.tags)} scalar tags, to {exporter.root} (runs "
            f"{', '.join(runs) or 'none'})")
