"""Statistics parts of one writer session: which to read, and rolling small parts into one.

A writer flushes a small part every ``stats_flush_secs`` (``<worker>.s<session>.<seq>.parquet``);
a long run would leave thousands. The writer rolls each run of consecutive small parts that
together hold ``compact_rows`` rows into one compacted part named for the sequence numbers it
replaces, ``<worker>.s<session>.<first>-<last>.parquet`` (FORMAT.md, "Compaction"):

1. the new part is written complete: on local disk under a temporary name, then renamed
   (``atomic_write``); on an object store as one object whose upload completes only at the
   end (``Storage.write``), so it too appears under its name whole or not at all;
2. only then are the small parts it covers deleted.

A crash between 1 and 2 leaves both the compacted part and (some of) the parts it covers: the
reader keeps, per writer session, only parts whose sequence range no other part's range
contains (:func:`live_parts`), so no row is counted twice and none is lost. Two ranges that
overlap without one containing the other are never written; a reader that finds them keeps the
one starting first and reports the other (its rows may duplicate some of the first's).

Rows of a compacted part are sorted by (tensor, kind, group, step, batch) and written in row
groups that end at a tensor's end (:func:`row_group_cuts`); the footer's metadata
``tf_inspector.tensor_row_groups`` maps each tensor to the [first, last] row group holding its
rows, so a query for one tensor reads only those row groups (:func:`row_groups_for`).

Example::

    live, problems = live_parts([("chief", 1, Path("stats/chief.s0001.000001-000040.parquet")),
                                 ("chief", 1, Path("stats/chief.s0001.000007.parquet"))])
    # live: the compacted part only (000007 lies in 1-40); problems: []
"""
from __future__ import annotations

import json
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inspector.format import STATS_RE, STATS_V1_RE, stats_name, stats_range_name
from inspector.storage import Storage, open_storage
from inspector.storage.atomic import atomic_write

P = TypeVar("P", Path, Any)  # a part: its Path, or a (name in the run, ...) tuple

#: rows per row group of a compacted part at most. Larger groups decode more rows per query,
#: smaller ones grow the footer every query parses (~150 bytes per column and group)
ROW_GROUP_ROWS = 32768
#: a row group ends at the first end of a tensor's rows once it holds 1/GROUPS_PER_PART of the
#: part (at least MIN_GROUP_ROWS): a query for one tensor reads its own rows and few others'
#: (on an object store the bytes it fetches are those of the row groups it reads), and the
#: footer of a part up to GROUPS_PER_PART x ROW_GROUP_ROWS rows stays near GROUPS_PER_PART groups
GROUPS_PER_PART = 64
MIN_GROUP_ROWS = 2048
#: rows per compacted part (the writer's default ``compact_rows``): ~250 bytes a row (30 bins)
#: of Arrow memory while it is built (~125 MB, on its own thread); 120 parts for a run of
#: 10,000 statistics steps x 1,000 tensors (60 million rows)
COMPACT_ROWS = 500_000
#: small parts per compaction at most, whatever their rows: a small model's parts (a few
#: hundred rows each, one per ``stats_flush_secs``) would take 1,000s of them to reach
#: COMPACT_ROWS, and a reader opens each small part separately (a footer parse and a read
#: each), where a compacted part's summary answers for all of them
COMPACT_PARTS = 256
#: a failed compaction is tried again at the next flush, then after 1, 2, 4 ... flushes more
#: while it keeps failing, at most this many
RETRY_FLUSHES = 32
INDEX_KEY = b"tf_inspector.tensor_row_groups"
SORT_KEYS = ("tensor", "kind", "group", "step", "batch")


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Keyword arguments for every statistics Parquet file (parts, compacted parts, summaries):
    zstd, page checksums (the reader verifies them), and dictionary pages only for the columns
    that repeat: strings and integers (not the floats, not the histogram's counts). Why: a float
    statistic rarely repeats, so Parquet tries a dictionary, gives it up after the first page
    and writes plain; the try is a large share of a part's encoding (on the writer thread,
    which shares the training machine's cores) and leaves parts larger."""
    repeat = [f.name for f in schema if pa.types.is_integer(f.type)
              or pa.types.is_dictionary(f.type)
              or pa.types.is_string(f.type)]
    return {"compression": "zstd", "write_page_checksum": True, "use_dictionary": repeat}


def seq_range(name: str) -> tuple[int, int] | None:
    """[first, last] sequence numbers a part's file name covers (a small part: [seq, seq])."""
    m = STATS_RE.match(name) or STATS_V1_RE.match(name)
    if m is None:
        return None
    first = int(m["seq"])
    last = int(m["last"]) if m.groupdict().get("last") else first
    return first, last


def live_parts(files: Iterable[tuple[str, int, P]]) -> tuple[list[tuple[str, int, P]], list[str]]:
    """The parts to read from (worker, session, part) triples, ``part`` a Path or a tuple whose
    first item is the part's name in the run: per session, those whose range no other part's
    range contains; plus problems (ranges that overlap without containing)."""
    by_session: dict[tuple[str, int], list[tuple[tuple[int, int], P]]] = {}
    for w, s, p in files:
        r = seq_range(PurePosixPath(p if isinstance(p, Path) else p[0]).name)
        if r is not None and r[0] <= r[1]:
            by_session.setdefault((w, s), []).append((r, p))
    kept, problems = [], []
    for (w, s), parts in by_session.items():
        # widest first among equal starts: a compacted part precedes the small parts it covers
        parts.sort(key=lambda rp: (rp[0][0], -rp[0][1]))
        end = 0  # the highest sequence number covered by a kept part so far
        for (first, last), p in parts:
            if last <= end:
                continue  # contained in a kept part: superseded by compaction
            if first <= end:
                problems.append(f"statistics part {p} overlaps another part's sequence numbers "
                                f"(up to {end:06d}) without being contained in it; skipped so no "
                                "row counts twice")
                continue
            kept.append((w, s, p))
            end = last
    return sorted(kept), problems


def compact(run_dir: "Path | Storage", worker: str, session: int, parts: Sequence[tuple[int, Any]],
            fsync: bool = False, guard: Callable[[], None] | None = None) -> tuple[str, int]:
    """Roll the small ``parts`` ((seq, name), consecutive) of one session into one part.

    ``run_dir``: a local path or a :class:`~inspector.storage.Storage` (an object store too: the
    new part is one object written whole, so no rename is needed); a part's name is a path
    under ``run_dir`` or a name relative to it. Writes the new part complete, then deletes the
    small parts. Returns the new part's name in the run and its size in bytes. Raises (leaving
    every small part in place) if a part cannot be read or the new one cannot be written.
    ``guard``: called before the write and before the deletes (the writer's lock check)."""
    seqs = [seq for seq, _ in parts]
    if len(parts) < 2 or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        raise ValueError(f"compaction needs two or more consecutive sequence numbers, not {seqs}")
    store = open_storage(run_dir)
    rels = [_relative(store, p) for _, p in parts]
    table = pa.concat_tables([_read_part(store, rel) for rel in rels])
    target = stats_range_name(worker, session, seqs[0], seqs[-1])
    data = sorted_part(table)
    if guard is not None:
        guard()
    size = store.write(target, [data], fsync=fsync)
    if guard is not None:
        guard()
    for rel in rels:  # only now: a crash before this leaves duplicates the reader ignores
        store.delete(rel)
    return target, size


def _consecutive(parts: list[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """``parts`` ((seq, ...) sorted by seq) cut into runs of consecutive sequence numbers.

    >>> [[s for s, _ in run] for run in _consecutive([(1, 0), (2, 0), (5, 0), (6, 0)])]
    [[1, 2], [5, 6]]
    """
    runs: list[list[tuple[int, Any]]] = []
    for p in parts:
        if runs and runs[-1][-1][0] + 1 == p[0]:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _relative(store: Storage, part: Any) -> str:
    """A part's name relative to the run (a local Path under it, or such a name already)."""
    if isinstance(part, Path) and part.is_absolute():
        return Path(part).relative_to(Path(store.display())).as_posix()
    return PurePosixPath(part).as_posix()


def _read_part(store: Storage, rel: str) -> pa.Table:
    # local: pyarrow reads the file itself; an object store: one GET of the (small) part
    if store.is_local:
        return pq.read_table(Path(store.display(rel)))
    return pq.read_table(pa.BufferReader(store.read(rel)))


def write_sorted(table: pa.Table, target: Path, fsync: bool = False) -> int:
    """Write ``table`` as a compacted part at the local path ``target`` (temporary name, then
    rename; see :func:`sorted_part`). Returns its size."""
    return atomic_write(target, [sorted_part(table)], fsync=fsync)


def sorted_part(table: pa.Table) -> bytes:
    """``table`` as a compacted part's bytes: sorted by SORT_KEYS, row groups cut at tensor
    boundaries (:func:`row_group_cuts`), the tensor -> row groups index in the footer."""
    table = table.replace_schema_metadata(None).unify_dictionaries().combine_chunks()
    order = pc.sort_indices(_sort_keys(table),
                            [(k, "ascending") for k in SORT_KEYS if k in table.column_names])
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, **parquet_options(table.schema)) as w:
        # sorted one row group at a time: memory is the parts' rows once, not twice
        index, _ = write_groups(w, lambda a, b: table.take(order[a:b]),
                                table.column("tensor").take(order), group_rows(table.num_rows))
        # the Parquet footer's key-value metadata only: in the Arrow schema it would be stored twice
        w.add_key_value_metadata({INDEX_KEY.decode(): json.dumps(index, separators=(",", ":"))})
    return sink.getvalue().to_pybytes()


def group_rows(rows: int) -> int:
    """The rows a row group of a part of ``rows`` rows holds before it ends at a tensor's end."""
    return min(max(rows // GROUPS_PER_PART, MIN_GROUP_ROWS), ROW_GROUP_ROWS)


def write_groups(w: pq.ParquetWriter, rows: Callable[[int, int], pa.Table], tensor: pa.ChunkedArray,
                 target: int, first_group: int = 0) -> tuple[dict[str, list[int]], int]:
    """Write rows sorted by tensor (``rows(a, b)``: rows a..b-1; ``tensor``: their tensor
    column) as the row groups of :func:`row_group_cuts`. Returns the index {tensor: [first, last]
    row group}, numbered from ``first_group``, and the number of row groups written."""
    names = _names(tensor)
    runs = _runs(names)
    cuts = row_group_cuts(runs, len(names), target)
    ends = [*cuts[1:], len(names)]
    for a, b in zip(cuts, ends):
        w.write_table(rows(a, b), row_group_size=max(b - a, 1))
    group = np.asarray(cuts)
    index = {str(names[a]): [first_group + int(np.searchsorted(group, a, "right")) - 1,
                             first_group + int(np.searchsorted(group, b - 1, "right")) - 1]
             for a, b in runs}
    return index, len(cuts)


def row_group_cuts(runs: list[tuple[int, int]], rows: int, target: int) -> list[int]:
    """First rows of the row groups of ``rows`` rows whose tensors' rows are ``runs`` ([a, b)):
    a group ends where a tensor's rows end once it holds ``target`` rows, and holds at most
    ROW_GROUP_ROWS (a tensor with more spans several).

    >>> row_group_cuts([(0, 3), (3, 5), (5, 9)], 9, target=4)
    [0, 5]
    """
    cuts = [0]
    for _, b in runs:
        while b - cuts[-1] > ROW_GROUP_ROWS:
            cuts.append(cuts[-1] + ROW_GROUP_ROWS)
        if b - cuts[-1] >= target and b < rows:
            cuts.append(b)
    return cuts


def _names(tensor: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(tensor.to_numpy(zero_copy_only=False), dtype=object)


def _runs(names: np.ndarray) -> list[tuple[int, int]]:
    """[a, b) of each run of equal names (rows sorted by tensor)."""
    if not len(names):
        return []
    starts = np.concatenate([[0], np.flatnonzero(names[1:] != names[:-1]) + 1])
    ends = np.concatenate([starts[1:], [len(names)]])
    return [(int(a), int(b)) for a, b in zip(starts, ends)]


def _sort_keys(table: pa.Table) -> pa.Table:
    """The sort columns, dictionary columns as their indices (Arrow cannot sort dictionaries;
    one shared dictionary per column, so equal names have equal indices: rows stay grouped)."""
    cols = {}
    for k in SORT_KEYS:
        if k in table.column_names:
            col = table.column(k).combine_chunks()
            cols[k] = col.indices if pa.types.is_dictionary(col.type) else col
    return pa.table(cols)


def row_groups_for(pf: pq.ParquetFile, tensors: Sequence[str]) -> list[int] | None:
    """The row groups of a compacted part that hold ``tensors``' rows, or None (not compacted,
    or an index that does not fit the file: then read it whole)."""
    meta = pf.metadata.metadata or {}
    raw = meta.get(INDEX_KEY)
    if raw is None:
        return None
    try:
        index = json.loads(raw)
        groups = sorted({g for t in tensors if t in index
                         for g in range(index[t][0], index[t][1] + 1)})
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return groups if all(0 <= g < pf.num_row_groups for g in groups) else None


class Compactor:
    """A writer session's small parts, compacted once they hold ``rows`` rows or number
    ``max_parts`` (and, at the final flush, whatever is left), on a background thread so the
    writer thread keeps taking statistics; one compaction at a time. ``rows=None``: never compact.

    Example::

        c = Compactor(run_dir, "chief", 1, rows=250_000, on_error=print)
        c.added(seq=1, rows=3000)          # after each small part is written
        c.added(seq=2, rows=3000)
        c.finish()                         # at close: compacts 1-2, waits for it
    """

    def __init__(self, run_dir: "Path | Storage", worker: str, session: int,
                 rows: int | None = COMPACT_ROWS, fsync: bool = False,
                 on_error: Callable[[BaseException], None] | None = None,
                 after: Callable[[str], Any] | None = None, guard: Callable[[], None] | None = None,
                 max_parts: int = COMPACT_PARTS) -> None:
        if rows is not None and rows < 1:
            raise ValueError(f"compact_rows={rows} must be >= 1 or None")
        if max_parts < 2:
            raise ValueError(f"max_parts={max_parts} must be >= 2 (a compaction rolls two parts or "
                             "more)")
        self.run_dir, self.worker, self.session, self.rows = \
            open_storage(run_dir), worker, session, rows
        self.max_parts = max_parts
        self.fsync, self.on_error, self.guard = fsync, on_error, guard
        self._parts: list[tuple[int, int]] = []  # (seq, rows) written since the last compaction
        self._thread: threading.Thread | None = None
        # the parts of a compaction that failed (a full disk, an outage): tried again with the
        # next flush's, after 1, 2, 4 ... RETRY_FLUSHES flushes while it keeps failing
        self._lock = threading.Lock()
        self._failed: list[tuple[int, int]] = []
        self._backoff = 0   # flushes to wait after the next failure
        self._wait = 0      # flushes left before the failed parts are tried again
        #: called with each compacted part's path once it is in place (the writer passes
        #: ``stats_merge.LevelMerger``: its summary, then merges by levels); errors go to on_error
        self.after = after

    def added(self, seq: int, rows: int) -> None:
        """Small part ``seq`` of ``rows`` rows was written."""
        if self.rows is None:
            return
        retry = self._take_failed(next_seq=seq)
        self._parts.append((seq, rows))
        if retry or sum(r for _, r in self._parts) >= self.rows \
                or len(self._parts) >= self.max_parts:
            self._start()

    def finish(self) -> None:
        """At close: compact what is left (two parts or more, a failed compaction's too) and
        wait for it."""
        self.join()
        self._take_failed(now=True)
        self._start()
        self.join()

    def _take_failed(self, now: bool = False, next_seq: int | None = None) -> bool:
        """Put a failed compaction's parts back before the new ones (the waiting ones, else
        part ``next_seq``) once its back-off has passed (``now``: whatever it is); whether it
        did. Failed parts that do not precede them (a later compaction took the parts between)
        are compacted on their own."""
        with self._lock:
            if not self._failed:
                return False
            if self._wait > 0 and not now:
                self._wait -= 1
                return False
            failed, self._failed = self._failed, []
        *alone, last = _consecutive(failed)
        following = self._parts[0][0] if self._parts else next_seq
        if following is not None and last[-1][0] + 1 != following:
            alone.append(last)
            last = []
        for run in alone:   # a later compaction succeeded between them: each on its own
            self._launch(run)
        self._parts = last + self._parts
        return bool(last)

    def _start(self) -> None:
        if len(self._parts) < 2:
            return
        todo, self._parts = self._parts, []
        self._launch(todo)

    def _launch(self, todo: list[tuple[int, int]]) -> None:
        self.join()
        self._thread = threading.Thread(target=self._run, args=(todo,), daemon=True,
                                        name=f"tf-inspector-compact-{self.worker}-s{self.session}")
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, todo: list[tuple[int, int]]) -> None:
        paths = [(seq, stats_name(self.worker, self.session, seq)) for seq, _ in todo]
        try:
            target, _ = compact(self.run_dir, self.worker, self.session, paths,
                                self.fsync, self.guard)
        except BaseException as e:  # the small parts stay, every row readable: tried again
            with self._lock:
                self._failed = sorted(self._failed + todo)
                self._wait, self._backoff = self._backoff, min(2 * self._backoff or 1,
                                                               RETRY_FLUSHES)
            if self.on_error is not None:
                self.on_error(e)
            return
        with self._lock:
            self._backoff = 0
        try:
            if self.after is not None:
                self.after(target)
        except BaseException as e:   # the compacted part is in place: nothing to try again
            if self.on_error is not None:
                self.on_error(e)
