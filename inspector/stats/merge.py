"""Levels of compaction: roll ``MERGE_PARTS`` compacted parts of one writer session into one.

Compaction (:mod:`inspector.stats.parts`) leaves one part per ``compact_rows`` rows: 120 parts
for a run of 10,000 statistics steps x 1,000 tensors, and every part holds every tensor, so the
first query for one tensor would open all 120. Here, as in a log-structured merge tree,
every ``MERGE_PARTS`` consecutive parts of one level are merged into one part of the next
level, named for the whole sequence range it replaces (``<first>-<last>``, FORMAT.md,
"Compaction"): a run of N compacted parts keeps at most ``MERGE_PARTS - 1`` parts per level,
O(log N) parts in all, and a query for one tensor reads one or two row groups of each.

Crash safety is compaction's: the merged part is written complete under a temporary name and
renamed; only then are the parts it replaces deleted. Its range contains theirs, so a reader
(``stats_parts.live_parts``) ignores any of them left by a crash in between.

Memory stays bounded whatever the level: the merge streams, a batch of tensors at a time. The
inputs are sorted by tensor with a tensor -> row groups index (``stats_parts.INDEX_KEY``), so
a batch reads only the row groups holding its tensors (about ``BATCH_GROUPS`` row groups of
at most ``stats_parts.ROW_GROUP_ROWS`` rows), sorts them and appends them to the output file.

Example::

    levels = Levels(MERGE_PARTS)
    for first, last in compacted_ranges:              # as the writer compacts
        for todo in levels.add(first, last):          # a full level: merge it
            merge(run_dir, "chief", 1, [path_of(f, l) for f, l in todo])
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inspector.format import stats_range_name
from inspector.stats import parts as stats_parts
from inspector.stats.parts import INDEX_KEY, SORT_KEYS, _sort_keys, seq_range
from inspector.stats.summary import remove_summary, summarize_part
from inspector.storage.atomic import atomic_file

#: compacted parts of one level merged into one part of the next: with 10, the 60M-row run's
#: 120 compacted parts become 12 (bench/README.md, "Measurements behind design choices")
MERGE_PARTS = 10
#: input row groups read per batch of tensors (all inputs together): ~16 x 32,768 rows,
#: the memory of one ``compact_rows`` compaction
BATCH_GROUPS = 16


class Levels:
    """Which compacted ranges to merge next: a stack of (first, last, level); a run of ``k``
    consecutive entries of one level becomes one entry of the next.

    >>> lv = Levels(2)
    >>> lv.add(1, 4), lv.add(5, 8)
    ([], [[(1, 4), (5, 8)]])
    >>> lv.add(9, 12), lv.add(13, 16)
    ([], [[(9, 12), (13, 16)], [(1, 8), (9, 16)]])
    """

    def __init__(self, k: int = MERGE_PARTS) -> None:
        if k < 2:
            raise ValueError(f"merge_parts={k} must be >= 2")
        self.k = k
        self.stack: list[tuple[int, int, int]] = []

    def add(self, first: int, last: int) -> list[list[tuple[int, int]]]:
        """A compacted part [first, last] was written; returns the merges now due, in order
        (each a list of ranges; a later merge may include an earlier one's result)."""
        self.stack.append((first, last, 0))
        todo = []
        while len(self.stack) >= self.k and len({lv for *_, lv in self.stack[-self.k:]}) == 1:
            top = self.stack[-self.k:]
            del self.stack[-self.k:]
            todo.append([(f, la) for f, la, _ in top])
            self.stack.append((top[0][0], top[-1][1], top[0][2] + 1))
        return todo


def merge(run_dir: Path, worker: str, session: int, parts: Sequence[Path],
          fsync: bool = False) -> tuple[Path, int]:
    """Merge the compacted ``parts`` (consecutive sequence ranges, each with its tensor index)
    of one session into one part named for their whole range; then delete them. Returns the
    new part's path and size. Raises ValueError (nothing changed) for parts that are not
    consecutive, lack the index or differ in schema."""
    ranges = [seq_range(Path(p).name) for p in parts]
    if len(parts) < 2 or None in ranges \
            or any(a[1] + 1 != b[0] for a, b in zip(ranges, ranges[1:])):  # type: ignore[index]
        raise ValueError("merging needs two or more compacted parts with consecutive ranges, not "
                         f"{ranges}")
    files = [pq.ParquetFile(p) for p in parts]
    schema = files[0].schema_arrow.remove_metadata()
    if any(not f.schema_arrow.remove_metadata().equals(schema) for f in files[1:]):
        raise ValueError(f"parts {[Path(p).name for p in parts]} differ in schema; not merged")
    indexes = [_index(f, p) for f, p in zip(files, parts)]
    target = Path(run_dir) / stats_range_name(worker, session,
                                              ranges[0][0], ranges[-1][1])  # type: ignore[index]
    size = _write_streaming(target, schema, files, indexes, fsync)
    for p in parts:  # only now: a crash before this leaves parts the reader ignores (contained)
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return target, size


def _index(f: pq.ParquetFile, path: Path) -> dict[str, list[int]]:
    raw = (f.metadata.metadata or {}).get(INDEX_KEY)
    if raw is None:
        raise ValueError(f"{Path(path).name} has no tensor index: not a compacted part; not merged")
    index = json.loads(raw)
    if any(not (0 <= a <= b < f.num_row_groups) for a, b in index.values()):
        raise ValueError(f"{Path(path).name}: its tensor index does not fit its row groups; not "
                         "merged")
    return index


def _batches(indexes: list[dict[str, list[int]]]) -> list[list[str]]:
    """Tensors in first-seen order, cut into batches whose row groups (over every input) stay
    near BATCH_GROUPS; a tensor is never split."""
    order = list(dict.fromkeys(t for ix in indexes for t in ix))
    out: list[list[str]] = []
    batch: list[str] = []
    groups: set[tuple[int, int]] = set()
    for t in order:
        mine = {(i, g) for i, ix in enumerate(indexes) if t in ix
                for g in range(ix[t][0], ix[t][1] + 1)}
        if batch and len(groups | mine) > max(BATCH_GROUPS, len(indexes) + 1):
            out.append(batch)
            batch, groups = [], set()
        batch.append(t)
        groups |= mine
    return out + ([batch] if batch else [])


def _write_streaming(target: Path, schema: pa.Schema, files: list[pq.ParquetFile],
                     indexes: list[dict[str, list[int]]], fsync: bool) -> int:
    """Write the merged part batch by batch to a temporary file, then rename it to ``target``."""
    index: dict[str, list[int]] = {}
    with atomic_file(target, fsync) as f:
        with pq.ParquetWriter(f, schema, **stats_parts.parquet_options(schema)) as w:
            n_groups = 0
            fill = stats_parts.group_rows(sum(pf.metadata.num_rows for pf in files))
            for batch in _batches(indexes):
                table = _read_batch(batch, files, indexes, schema)
                order = pc.sort_indices(_sort_keys(table), [(k, "ascending") for k in SORT_KEYS
                                                            if k in table.column_names])
                table = table.take(order)
                if not table.num_rows:
                    continue
                # a batch starts a new row group, and no tensor spans two batches
                got, groups = stats_parts.write_groups(w, lambda a, b: table.slice(a, b - a),
                                                       table.column("tensor"), fill, n_groups)
                index.update(got)
                n_groups += groups
            w.add_key_value_metadata({INDEX_KEY.decode(): json.dumps(index, separators=(",", ":"))})
    return os.path.getsize(target)


def _read_batch(batch: list[str], files: list[pq.ParquetFile], indexes: list[dict[str, list[int]]],
                schema: pa.Schema) -> pa.Table:
    """Every input's rows of the tensors in ``batch`` (only the row groups holding them)."""
    wanted = pa.array(batch, pa.string())
    tables: list[Any] = []
    for f, ix in zip(files, indexes):
        groups = sorted({g for t in batch if t in ix for g in range(ix[t][0], ix[t][1] + 1)})
        if groups:
            t = f.read_row_groups(groups).replace_schema_metadata(None)
            tables.append(t.filter(pc.is_in(t.column("tensor").cast(pa.string()),
                                            value_set=wanted)))
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table.unify_dictionaries().combine_chunks()


def merge_due(levels: Levels, run_dir: Path, worker: str, session: int, first: int, last: int,
              fsync: bool = False) -> list[Path]:
    """Record the compacted part [first, last] in ``levels`` and do the merges now due; returns
    the merged parts. On an error the levels start afresh (the parts stay as they are, every
    row readable once) and the error is raised for the writer to record."""
    done = []
    try:
        for todo in levels.add(first, last):
            paths = [Path(run_dir) / stats_range_name(worker, session, a, b) for a, b in todo]
            done.append(merge(run_dir, worker, session, paths, fsync)[0])
            for p in paths:  # after the parts themselves: a summary alone is never read
                remove_summary(run_dir, p)
            summarize_part(run_dir, done[-1], fsync)
    except BaseException:
        levels.stack.clear()
        raise
    return done


def after_compaction(levels: Levels, run_dir: Path, worker: str, session: int, part: Path,
                     fsync: bool = False) -> list[Path]:
    """What the writer does once a compacted ``part`` is renamed into place: its summary
    (``inspector.stats.summary``), then the merges now due (:func:`merge_due`)."""
    r = seq_range(Path(part).name)
    if r is None:
        raise ValueError(f"{Path(part).name} is not a statistics part's name")
    try:
        summarize_part(run_dir, Path(part), fsync)
    finally:  # no summary (an error) only means the reader reads this part's rows
        done = merge_due(levels, run_dir, worker, session, r[0], r[1], fsync)
    return done


class LevelMerger:
    """The writer session's :func:`after_compaction`, with its levels: pass it as the
    ``after`` of ``stats_parts.Compactor``.

    Example::

        Compactor(run_dir, "chief", 1, after=LevelMerger(run_dir, "chief", 1))
    """

    def __init__(self, run_dir: Path, worker: str, session: int, fsync: bool = False,
                 merge_parts: int = MERGE_PARTS) -> None:
        self.run_dir, self.worker, self.session, self.fsync = Path(run_dir), worker, session, fsync
        self.levels = Levels(merge_parts)

    def __call__(self, part: "Path | str") -> list[Path]:
        part = Path(part)
        if not part.is_absolute():   # the compactor names the part relative to the run
            part = self.run_dir / part
        return after_compaction(self.levels, self.run_dir, self.worker, self.session,
                                part, self.fsync)
