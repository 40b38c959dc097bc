"""Step-binned summaries of statistics parts, for overviews of long runs (FORMAT.md, "Summaries").

The viewer's layer x step heatmap of a run of 10,000 statistics steps x 1,000 tensors would
need every row of one (kind, group): 10 million of 60 million. A compacted (or merged) part
gets a summary beside it, ``summary/<part name>``: per (tensor, kind, group) and bin of
``width`` steps (a power of two, at most ~32 bins per part, bins aligned on multiples of the
width: ``bin = step // width``), the number of rows, the first and last step, and per
statistic the sum and count of its finite values. Sums and counts merge exactly, so bins of
several parts combine into the wider bins of a chart (:func:`overview`): at most
``max_columns`` columns, each the **mean of the finite values of the rows in its bin**, NaN
where any of them is NaN/Inf (so a NaN is never averaged away).

A summary is used only when it names its part (``tf_inspector.summary_of``: the part's name,
rows and bytes) as the part is now; a missing one (small parts; a crash between a part's
rename and its summary's) means: read the part's rows and bin them, the same arithmetic. A
stale or damaged one is reported in ``run.problems`` and the part's rows are read instead, so
a summary never changes a number. A summary also lists its part's distinct steps per (kind,
group) as [first, last, stride] runs (:func:`part_step_set`, for ``Run.stats_steps``), its
footer metadata guarded by a CRC-32. When two sessions of one worker and mode recorded
overlapping steps (the later one wins a step, FORMAT.md "Sessions"), or the view picks one
eval batch, every row is read through the reader's rules and binned.

Example::

    ov = overview(run, "gradient", "all", "l2")
    ov.tensors, ov.steps, ov.matrix.shape, ov.width     # ov.width steps per column
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inspector.errors import DamagedFileError
from inspector.stats import nonfinite
from inspector.stats.parts import parquet_options
from inspector.storage.atomic import atomic_write
from inspector.storage.safety import check_regular, open_regular


class Run(Protocol):
    """What this module uses of an ``inspector.Run``, typed structurally: ``run.py`` imports this
    module (part skipping, step lists), so importing it here would make an import cycle."""
    path: Any
    problems: list[str]
    verify: bool
    store: Any
    manifests: dict[tuple[str, int], dict]

    @property
    def tensors(self) -> Any: ...

    @property
    def _stats_files(self) -> list[tuple[str, int, tuple[str, int | None, str]]]: ...

    def _selected(self, items: Any, mode: str | None, worker: str | None,
                  session: int | str | None) -> list[tuple[str, int, Any]]: ...

    def _read_part(self, worker: str, session: int, part: tuple[str, int | None, str],
                   columns: Any, filters: Any) -> pa.Table | None: ...

    def _mode_of(self, worker: str, session: int) -> str: ...

    def _where(self, mode: str | None, worker: str | None,
               batch: int | None = None) -> tuple[str, str | None, int | None]: ...

    def query_stats_table(self, tensors: Any = None, steps: Any = None, kinds: Any = None,
                          groups: Any = None, columns: Any = None, *, mode: Any = None,
                          worker: Any = None, session: Any = None,
                          batch: Any = None) -> pa.Table: ...

#: statistics a summary holds (the viewer overview's choices)
STATS = ("l2", "mean", "std", "min", "max", "zero_fraction", "nan", "inf")
KEYS = ("worker", "session", "mode", "tensor", "kind", "group")
SUMMARY_OF = b"tf_inspector.summary_of"
KIND_GROUP_INDEX = b"tf_inspector.kind_group_row_groups"
#: the distinct steps of the part's rows per "<kind>/<group>", as [first, last, stride] runs
STEP_RUNS = b"tf_inspector.steps"
#: CRC-32 of summary_of and steps (footer metadata has no page checksum: a flipped digit
#: there would skip a part or count a step silently)
META_CRC = b"tf_inspector.meta_crc32"
#: bins per part at most (about): the part's step span / this, rounded up to a power of two
PART_BINS = 32
ROW_GROUP_ROWS = 32768
FOLDER = "summary"


def summary_rel(part_rel: str) -> str:
    """``stats/chief.s0001.000001-000040.parquet`` ->
    ``summary/chief.s0001.000001-000040.parquet``."""
    return f"{FOLDER}/{part_rel.rsplit('/', 1)[-1]}"


def pow2_at_least(x: float) -> int:
    """The smallest power of two >= ``x`` (1 for x <= 1).

    >>> pow2_at_least(1), pow2_at_least(3), pow2_at_least(64.5)
    (1, 4, 128)
    """
    return 1 << max(0, int(np.ceil(np.log2(max(x, 1.0)))))


def bin_rows(table: pa.Table, width: int, stats: tuple[str, ...] = STATS) -> pa.Table:
    """Summary rows of statistics rows: per KEYS and ``bin = step // width``: ``rows``,
    ``first_step``, ``last_step``, and per statistic ``<stat>_sum`` / ``<stat>_finite``."""
    # dictionaries: grouped as such (fast), once every chunk has the same one (parts of sessions
    # with other catalogs bring their own, which Arrow's group_by cannot mix)
    table = table.unify_dictionaries()
    cols: dict[str, Any] = {k: table.column(k) for k in KEYS}
    step = table.column("step")
    cols["bin"] = pc.floor(pc.divide(pc.cast(step, pa.float64()), float(width))).cast(pa.int64()) \
        if width > 1 else step
    cols["step"] = step
    aggs: list[tuple[str, str]] = [("step", "count"), ("step", "min"), ("step", "max")]
    for s in stats:
        v = pc.cast(table.column(s), pa.float64())
        finite = pc.is_finite(v)
        cols[f"{s}_sum"] = pc.if_else(finite, v, 0.0)
        cols[f"{s}_finite"] = pc.cast(finite, pa.int64())
        aggs += [(f"{s}_sum", "sum"), (f"{s}_finite", "sum")]
    out = pa.table(cols).group_by([*KEYS, "bin"], use_threads=False).aggregate(aggs)
    names = {"step_count": "rows", "step_min": "first_step", "step_max": "last_step",
             **{f"{x}_sum": x for s in stats for x in (f"{s}_sum", f"{s}_finite")}}
    out = out.rename_columns([names.get(n, n) for n in out.column_names])
    for k in KEYS:  # names as plain strings: summaries of every part concatenate (few rows now)
        if pa.types.is_dictionary(out.column(k).type):
            out = out.set_column(out.schema.get_field_index(k), k, out.column(k).cast(pa.string()))
    return out.append_column("width", pa.array(np.full(out.num_rows, width, np.int64)))


def _rebin(summary: pa.Table, stats: tuple[str, ...]) -> pa.Table:
    """Merge summary rows of equal KEYS and bin (from several row-group chunks of one part)."""
    aggs = [("rows", "sum"), ("first_step", "min"), ("last_step", "max")] + [
        (f"{s}_{x}", "sum") for s in stats for x in ("sum", "finite")]
    out = summary.group_by([*KEYS, "bin", "width"], use_threads=False).aggregate(aggs)
    names = {f"{c}_{f}": c for c, f in aggs}
    return out.rename_columns([names.get(n, n) for n in out.column_names])


def summarize_part(run_dir: Path, part: Path, fsync: bool = False) -> Path:
    """Write ``summary/<part name>`` for the statistics part at ``part`` (read back in chunks of
    row groups: memory is one chunk's rows). Returns its path."""
    pf = pq.ParquetFile(part)
    steps = pf.read(columns=["step"]).column("step")
    lo, hi = (pc.min(steps).as_py(), pc.max(steps).as_py()) if len(steps) else (0, 0)
    width = pow2_at_least((hi - lo + 1) / PART_BINS)
    cols = [*KEYS, "step", *STATS]
    chunks, distinct = [], []
    for start in range(0, pf.num_row_groups, 16):
        t = pf.read_row_groups(range(start, min(start + 16, pf.num_row_groups)), columns=cols)
        chunks.append(bin_rows(t, width))
        distinct.append(_distinct_steps(t))
    summary = _rebin(pa.concat_tables(chunks), STATS) if chunks \
        else bin_rows(pf.schema_arrow.empty_table(), width)
    order = pc.sort_indices(summary, [(k, "ascending") for k in ("kind", "group", "tensor", "bin")])
    summary = summary.take(order)
    index: dict[str, list[int]] = {}
    kg = pc.binary_join_element_wise(summary.column("kind"), summary.column("group"),
                                     "/").to_pylist()
    for i, key in enumerate(kg):
        g = i // ROW_GROUP_ROWS
        index.setdefault(key, [g, g])[1] = g
    of = json.dumps({"part": part.name, "rows": pf.metadata.num_rows, "bytes": part.stat().st_size,
                     "first_step": lo, "last_step": hi, "width": width})
    runs = json.dumps(_step_runs_by_kind_group(distinct), separators=(",", ":"))
    meta = {SUMMARY_OF.decode(): of,
            KIND_GROUP_INDEX.decode(): json.dumps(index, separators=(",", ":")),
            STEP_RUNS.decode(): runs, META_CRC.decode(): str(_meta_crc(of.encode(), runs.encode()))}
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, summary.schema, **parquet_options(summary.schema)) as w:
        w.write_table(summary, row_group_size=ROW_GROUP_ROWS)
        w.add_key_value_metadata(meta)
    target = Path(run_dir) / FOLDER / part.name
    atomic_write(target, [sink.getvalue().to_pybytes()], fsync=fsync)
    return target


def _distinct_steps(t: pa.Table) -> pa.Table:
    """The distinct (kind, group, step) of statistics rows ``t``, names as plain strings."""
    d = t.select(["kind", "group", "step"]).group_by(["kind", "group", "step"],
                                                     use_threads=False).aggregate([])
    return pa.table({k: d.column(k).cast(pa.string()) if k != "step" else d.column(k)
                     for k in d.column_names})


def _step_runs_by_kind_group(distinct: list[pa.Table]) -> dict[str, list[list[int]]]:
    """{"<kind>/<group>": step runs} of the chunks' distinct steps."""
    if not distinct:
        return {}
    t = pa.concat_tables(distinct).group_by(["kind", "group", "step"],
                                            use_threads=False).aggregate([])
    kg = np.array(pc.binary_join_element_wise(t.column("kind"), t.column("group"), "/").to_pylist(),
                  dtype=object)
    steps = t.column("step").to_numpy()
    return {key: step_runs(np.unique(steps[kg == key])) for key in sorted(set(kg.tolist()))}


def step_runs(steps: np.ndarray) -> list[list[int]]:
    """Sorted distinct ``steps`` as [first, last, stride] runs (statistics every N steps: one run).

    >>> step_runs(np.array([10, 20, 30, 31, 32, 50]))
    [[10, 30, 10], [31, 32, 1], [50, 50, 1]]
    """
    out: list[list[int]] = []
    s = [int(x) for x in steps]
    i = 0
    while i < len(s):
        j, stride = i, 1
        if i + 1 < len(s):
            j, stride = i + 1, s[i + 1] - s[i]
            while j + 1 < len(s) and s[j + 1] - s[j] == stride:
                j += 1
        out.append([s[i], s[j], stride])
        i = j + 1
    return out


def _meta_crc(of: bytes, runs: bytes) -> int:
    return zlib.crc32(of + b"\n" + runs)


def remove_summary(run_dir: Path, part: Path) -> None:
    """Delete the summary of a part that was merged away (after the part itself)."""
    try:
        (Path(run_dir) / FOLDER / Path(part).name).unlink()
    except FileNotFoundError:
        pass


@dataclass
class Overview:
    """A layer x step matrix: ``matrix[i, j]`` is the mean of the finite values of
    ``tensors[i]``'s rows whose step lies in column j's bin (``width`` steps: ``bin * width``
    to ``(bin + 1) * width - 1``), NaN if any is NaN/Inf, or (for mean, std, min, max, l2) any
    of those rows counts a NaN/Inf in its tensor, or there is none; ``present[i, j]``:
    whether there is any (so a NaN cell with ``present`` false is a step without statistics, not
    a NaN); ``steps``: the last statistics step of each column, ``first_steps`` its first.
    ``summarized``/``scanned``: parts answered from their summary / by reading their rows."""
    tensors: list[str]
    steps: np.ndarray
    first_steps: np.ndarray
    matrix: np.ndarray
    width: int
    summarized: int = 0
    scanned: int = 0
    notes: list[str] = field(default_factory=list)
    present: np.ndarray | None = None


def overview(run: Run, kind: str, group: str, stat: str, max_columns: int = 300,
             coarsen: bool = False) -> Overview:
    """The (kind, group, stat) matrix of ``run``'s view, at most ``max_columns`` step bins.

    A part whose summary is coarser than the bins is read row by row (exact, but a merged part
    of a long run is millions of rows); ``coarsen``: widen the bins to the coarsest summary's
    instead, so every summarized part is answered from its summary (fewer columns than
    ``max_columns`` where that is coarser)."""
    if stat not in STATS:
        raise ValueError(f"stat={stat!r} must be one of {STATS}")
    mode, worker, batch = run._where(None, None)
    pieces: list[pa.Table] = []
    notes: list[str] = []
    files = run._selected(run._stats_files, mode, worker, None) \
        if batch is None and run.store.is_local else None
    summarized = 0
    if files is not None:
        have = set(os.listdir(Path(run.path) / FOLDER)) if (Path(run.path) / FOLDER).is_dir() \
            else set()
        opened = {p: o for _, _, p in files if p[0].rsplit("/", 1)[-1] in have
                  and (o := _open_summary(run, p)) is not None}
        todo = [(w, s, p) for w, s, p in files if p not in opened]
        pieces = [_binned_part(run, w, s, p, kind, group, stat) for w, s, p in todo]
        # the columns' width: summaries coarser than it are not used (their parts are read)
        ends = [(int(pc.min(t.column("first_step")).as_py()),
                 int(pc.max(t.column("last_step")).as_py()))
                for t in pieces if t.num_rows] \
            + [(m["first_step"], m["last_step"]) for _, m in opened.values()]
        width = pow2_at_least((max(b for _, b in ends) - min(a for a, _ in ends) + 1)
                              / max_columns) if ends else 1
        if coarsen:
            width = max([width, *(m["width"] for _, m in opened.values())])
        for (w, s, p) in files:
            if p in opened:
                got = _read_summary(run, p, *opened[p], kind, group, stat) \
                    if opened[p][1]["width"] <= width else None
                summarized += got is not None
                pieces.append(got if got is not None
                              else _binned_part(run, w, s, p, kind, group, stat))
        if _sessions_overlap(run, files, pieces):
            notes.append("sessions recorded overlapping steps: every row read (the later session "
                         "wins a step)")
            files = None
    if files is None:
        t = run.query_stats_table(kinds=[kind], groups=[group], columns=[stat])
        pieces, summarized = ([bin_rows(t, 1, (stat,))] if t.num_columns else []), 0
    return _matrix(run, pieces, stat, max_columns, summarized, len(run._stats_files) - summarized,
                   notes)


def _binned_part(run: Run, worker: str, session: int, part: tuple, kind: str, group: str,
                 stat: str) -> pa.Table:
    """A part's rows of (kind, group), binned one step per bin (exact)."""
    stats = (stat, *(c for c in nonfinite.COUNTS if c != stat)) if stat in nonfinite.VALUES \
        else (stat,)
    t = run._read_part(worker, session, part, [*KEYS, "step", "batch", *stats],
                       [("kind", "in", [kind]), ("group", "in", [group])])
    return bin_rows(t, 1, stats) if t is not None and t.num_rows else pa.table({})


def _count_sums(stat: str) -> list[str]:
    """The summary columns that say whether a bin of ``stat`` holds a row counting a NaN/Inf:
    such a cell is NaN (:mod:`inspector.stats.nonfinite`), whatever the finite part's value."""
    return [f"{c}_sum" for c in nonfinite.COUNTS] if stat in nonfinite.VALUES else []


def _usable_summary(run: Run, part: tuple) -> tuple[pq.ParquetFile, dict] | None:
    """:func:`_open_summary` of a part whose summary the reader uses (:func:`part_steps`), else
    None."""
    return None if part_steps(run, part) is None else _open_summary(run, part)


def _open_summary(run: Run, part: tuple) -> tuple[pq.ParquetFile, dict] | None:
    """(the summary file, its ``summary_of``) if it describes ``part`` as it is now; None (and
    a problem reported) if it is stale or damaged."""
    rel, size = part[0], part[1]
    root = Path(run.path)
    path = root / summary_rel(rel)
    try:
        # the part's footer is opened only if it is a regular file (a FIFO would block the open
        # forever); a part that is not is no summary's fault: reading it reports it
        with open_regular(root / rel, root) as f:
            rows = pq.read_metadata(f).num_rows
    except (OSError, pa.ArrowException, DamagedFileError):
        return None
    try:
        check_regular(path, root)  # a regular file inside the run, as every file read
        pf = pq.ParquetFile(path, page_checksum_verification=run.verify)
        meta = pf.metadata.metadata or {}
        of = json.loads(meta[SUMMARY_OF])
        if META_CRC in meta and meta[META_CRC] != str(
                _meta_crc(meta[SUMMARY_OF], meta.get(STEP_RUNS, b""))).encode():
            raise ValueError("its step range or step lists do not match their checksum")
        if not isinstance(of, dict) or {k: of.get(k) for k in ("part", "rows", "bytes")} != {
                "part": rel.rsplit("/", 1)[-1], "rows": rows, "bytes": size}:
            run.problems.append(f"stale statistics summary {path}: it describes {of}, not the part "
                                f"as it is ({rows} rows, {size} bytes); the part's rows were read "
                                "instead")
            return None
        for k in ("first_step", "last_step", "width"):
            if not isinstance(of.get(k), int) or isinstance(of.get(k), bool):
                raise ValueError(f"summary_of has no integer {k}")
        return pf, of
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException, DamagedFileError) as e:
        _damaged(run, path, e)
        return None


def part_steps(run: Run, part: tuple) -> tuple[int, int] | None:
    """(first, last) statistics step of a live ``part`` as its summary states them, or None if
    unknown (no summary, stale or damaged: then the part must be read). Read once per part.

    A reader may skip a part whose steps lie outside a query's step range: the summary is
    checked against the part as it is now (:func:`_open_summary`), so no row can be missed."""
    cache = run.__dict__.setdefault("_part_steps", {})
    if part not in cache:
        found = None
        if run.store.is_local and (Path(run.path) / summary_rel(part[0])).exists():
            opened = _open_summary(run, part)
            if opened is not None:
                a, b = opened[1]["first_step"], opened[1]["last_step"]
                # a step range no writer writes (a damaged summary) is not used to skip anything
                found = (a, b) if 0 <= a <= b < 2 ** 62 else None
        cache[part] = found
    return cache[part]


def nonfinite_bins(run: Run, part: tuple) -> list[tuple[int, int]] | None:
    """The step ranges of ``part``'s summary bins whose group ``all`` rows count a NaN or Inf
    (``nan``/``inf`` above 0): every such row of the part lies in one. None if the part has no
    usable summary (the part must be read whole); damaged summaries are reported.

    Counts are integers, so a bin's sum is above 0 exactly when one of its rows is; a bin
    whose counts are not all finite (a null) is listed too, to be read."""
    opened = _usable_summary(run, part)
    if opened is None:
        return None
    pf, of = opened
    cols = ["group", "bin", "width", "rows", "first_step", "last_step",
            "nan_sum", "nan_finite", "inf_sum", "inf_finite"]
    try:
        t = pf.read(columns=cols)
        t = t.filter(pc.equal(t.column("group"), "all"))
        _check_summary(t, "nan", of)
        _check_summary(t, "inf", of)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        _damaged(run, Path(run.path) / summary_rel(part[0]), e)
        return None
    c = {k: t.column(k).to_numpy() for k in cols[3:]}
    flag = (c["nan_sum"] > 0) | (c["inf_sum"] > 0) | (c["nan_finite"] < c["rows"]) \
        | (c["inf_finite"] < c["rows"])
    return sorted(zip(c["first_step"][flag].tolist(), c["last_step"][flag].tolist()))


def part_step_set(run: Run, part: tuple, kind: str, group: str) -> np.ndarray | None:
    """The sorted distinct steps of ``part``'s rows of (``kind``, ``group``), from its summary;
    None if the part has no usable summary or one written before summaries held step lists
    (then the part's rows must be read). Damaged step lists are reported."""
    opened = _usable_summary(run, part)
    if opened is None:
        return None
    pf, of = opened
    meta = pf.metadata.metadata or {}
    if STEP_RUNS not in meta or META_CRC not in meta:
        return None
    try:
        return _steps_of(json.loads(meta[STEP_RUNS]).get(f"{kind}/{group}", []), of)
    except (ValueError, TypeError, AttributeError) as e:
        _damaged(run, Path(run.path) / summary_rel(part[0]), e)
        return None


def _steps_of(runs: Any, of: dict) -> np.ndarray:
    """The steps of [first, last, stride] ``runs``; ValueError unless they are increasing, inside
    the part's step range and no more than its rows (so a damaged list cannot allocate more)."""
    if not isinstance(runs, list):
        raise ValueError("step lists are not lists")
    pieces, total = [np.array([], np.int64)], 0
    for r in runs:
        if not (isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r)):
            raise ValueError(f"step run {str(r)[:40]} is not three integers")
        a, b, k = r
        if not (of["first_step"] <= a <= b <= of["last_step"] and k >= 1 and (b - a) % k == 0):
            raise ValueError(f"step run {r} is outside steps {of['first_step']}..{of['last_step']} "
                             "or uneven")
        total += (b - a) // k + 1
        if total > of["rows"]:
            raise ValueError(f"more steps than the part's {of['rows']} rows")
        pieces.append(np.arange(a, b + 1, k, dtype=np.int64))
    steps = np.concatenate(pieces)
    if (np.diff(steps) <= 0).any():
        raise ValueError("step runs are not increasing")
    return steps


def _read_summary(run: Run, part: tuple, pf: pq.ParquetFile, of: dict, kind: str, group: str,
                  stat: str) -> pa.Table | None:
    """The summary rows of ``part`` for (kind, group); None (reported) if they are damaged."""
    cols = [*KEYS, "bin", "width", "rows", "first_step", "last_step", f"{stat}_sum",
            f"{stat}_finite", *_count_sums(stat)]
    try:
        span = json.loads(pf.metadata.metadata[KIND_GROUP_INDEX]).get(f"{kind}/{group}")
        if span is None:
            return pa.table({})
        t = pf.read_row_groups(range(span[0], span[1] + 1), columns=cols)
        t = t.filter(pc.and_(pc.equal(t.column("kind"), kind), pc.equal(t.column("group"), group)))
        _check_summary(t, stat, of)
        return t
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        _damaged(run, Path(run.path) / summary_rel(part[0]), e)
        return None


def _damaged(run: Run, path: Path, e: BaseException) -> None:
    msg = (f"damaged statistics summary {path}: {type(e).__name__}: {e}; the part's rows were read "
           "instead")
    if msg not in run.problems:
        run.problems.append(msg)


def _check_summary(t: pa.Table, stat: str, of: dict) -> None:
    """ValueError unless the summary's counts are consistent (a damaged one must not count)."""
    rows, fin = t.column("rows").to_numpy(), t.column(f"{stat}_finite").to_numpy()
    width, first, last = (t.column(c).to_numpy() for c in ("width", "first_step", "last_step"))
    b = t.column("bin").to_numpy()
    ok = (rows > 0) & (fin >= 0) & (fin <= rows) & (width >= 1) & ((width & (width - 1)) == 0) \
        & (first <= last) & (first // width == b) & (last // width == b) & (width == of["width"]) \
        & (first >= of["first_step"]) & (last <= of["last_step"])
    if not ok.all():
        raise ValueError("inconsistent counts, widths or steps")


def _sessions_overlap(run: Run, files: list, pieces: list[pa.Table]) -> bool:
    """True if two sessions of one worker and mode have overlapping step ranges: each session's
    range is its manifest's steps (every step it recorded, whichever group: a group with no
    sample at a step has no row there, so one group's rows can miss a later session's claim)
    widened by the rows read (a writer killed before its manifest's last update)."""
    spans: dict[tuple[str, str, int], list[int]] = {}
    for w, s, _ in files:
        steps = [x for x in (run.manifests.get((w, s), {}).get("steps") or [])
                 if isinstance(x, int)]
        if steps:
            spans[(w, run._mode_of(w, s), s)] = [min(steps), max(steps)]
    for p in pieces:
        if not p.num_rows:
            continue
        t = p.select(["worker", "mode", "session", "first_step", "last_step"]).group_by(
            ["worker", "mode", "session"], use_threads=False).aggregate([("first_step", "min"),
                                                                        ("last_step", "max")])
        for w, m, s, a, b in zip(*(t.column(c).to_pylist() for c in (
                "worker", "mode", "session", "first_step_min", "last_step_max"))):
            span = spans.setdefault((w, m, s), [a, b])
            span[0], span[1] = min(span[0], a), max(span[1], b)
    rows = sorted((w, m, a, b) for (w, m, _), (a, b) in spans.items())
    return any(x[:2] == y[:2] and y[2] <= x[3] for x, y in zip(rows, rows[1:]))


def _matrix(run: Run, pieces: list[pa.Table], stat: str, max_columns: int, summarized: int,
            scanned: int, notes: list[str]) -> Overview:
    pieces = [p for p in pieces if p.num_rows]
    counts = [c for c in _count_sums(stat) if all(c in p.column_names for p in pieces)]
    pieces = [p.select(["tensor", "bin", "width", "rows", "first_step", "last_step", f"{stat}_sum",
                        f"{stat}_finite", *counts]) for p in pieces]
    if not pieces:
        return Overview([], np.array([], np.int64), np.array([], np.int64), np.zeros((0, 0)), 1,
                        summarized, scanned, notes, np.zeros((0, 0), bool))
    t = pa.concat_tables(pieces)
    width = t.column("width").to_numpy()
    first = t.column("first_step").to_numpy()
    lo, hi = int(first.min()), int(t.column("last_step").to_numpy().max())
    d = max(int(width.max()), pow2_at_least((hi - lo + 1) / max_columns))
    # bins are aligned on multiples: one more may straddle
    while (hi // d) - (lo // d) + 1 > max_columns:
        d *= 2
    col_of = t.column("bin").to_numpy() * width // d
    enc = t.column("tensor").combine_chunks().dictionary_encode()  # hashing, not sorting strings
    uniq, inverse = enc.dictionary.to_pylist(), enc.indices.to_numpy()
    present = set(uniq)
    order = [n for n in run.tensors["name"] if n in present]
    row = {n: i for i, n in enumerate(order)}
    r = np.array([row.get(n, -1) for n in uniq], np.int64)[inverse]
    keep = r >= 0
    cols, c = np.unique(col_of[keep], return_inverse=True)
    shape = (len(order), len(cols))
    # bincount / reduceat, not np.add.at (unbuffered, far slower): the same sums, in the same order
    cell, size = r[keep] * len(cols) + c, shape[0] * shape[1]
    s, fin, n = (np.bincount(cell, weights=t.column(col).to_numpy()[keep].astype(np.float64),
                             minlength=size).reshape(shape)
                 for col in (f"{stat}_sum", f"{stat}_finite", "rows"))
    by_col = np.argsort(c, kind="stable")
    starts = np.flatnonzero(np.r_[True, c[by_col][1:] != c[by_col][:-1]]) if len(c) \
        else np.zeros(0, np.int64)
    first_m = np.minimum.reduceat(first[keep][by_col], starts) if len(c) else np.zeros(0, np.int64)
    last_m = (np.maximum.reduceat(t.column("last_step").to_numpy()[keep][by_col], starts) if len(c)
              else np.zeros(0, np.int64))
    bad = np.zeros(size).reshape(shape)
    # a bin holding a row that counts a NaN/Inf is NaN, not its finite part's mean
    for col in counts:
        bad += np.bincount(cell, weights=t.column(col).to_numpy()[keep].astype(np.float64),
                           minlength=size).reshape(shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where((fin == n) & (n > 0) & (bad == 0), s / np.where(fin > 0, fin, 1), np.nan)
    return Overview(order, last_m, first_m, m, d, summarized, scanned, notes, n > 0)
