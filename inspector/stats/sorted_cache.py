"""Tensor-sorted copies of large statistics parts that have no row-group index, kept in the
local cache so a one-tensor query reads one or two row groups instead of decoding the part.

A part the writer compacts is sorted by tensor with a per-tensor row-group index in its footer
(:mod:`inspector.stats.parts`). Any other part (an older writer's, a copied or hand-made one, a
crash before compaction) interleaves every tensor's rows in every row group, and Parquet has no
row selection within a row group: one tensor's rows cost decoding every row's histogram lists
(~6 s per million rows on 2 busy cores). So the first query that would decode
:data:`SORT_ROWS` rows or more of such a part, histograms included, writes a copy of it in the
compacted layout (sorted by tensor, the same index) and answers from the copy; every later query
of that part version reads the copy's few row groups.

Where: ``<cache>/sorted/<key>.parquet`` (the cache folder of
:func:`inspector.storage.spill.cache_root`, 0700; never the run directory, which may be
read-only, an object store, or a live writer's). ``key``: the SHA-256 of the part's size, its
mtime (ns) and its Parquet footer, so a part that changes (rewritten, appended, touched) gets
a new copy. The copy's footer names its key, row count and schema; a copy whose footer does not
match the part (a foreign, truncated or damaged file) is deleted and written again, never
read. At most :func:`max_bytes` of copies (``$TF_INSPECTOR_SORTED_BYTES``, default 16 GiB;
0: no copies), the least recently used deleted first. Clear: delete ``<cache>/sorted/``.

Memory: one batch of the part at a time while it is split into buckets of tensors
(:data:`BUCKET_ROWS` rows each, zstd Arrow IPC files beside the copy), then one bucket at a time
while it is sorted and written.

Example::

    got = sorted_copy(path, os.stat(path), pq.ParquetFile(path), verify=True,
                      check=schema.check_stats_table)
    # got: (the copy's path, its ParquetFile with the index), or None (read the part itself)
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inspector.errors import DamagedFileError
from inspector.stats.parts import (INDEX_KEY, MIN_GROUP_ROWS, SORT_KEYS, _sort_keys,
                                   parquet_options, row_groups_for, write_groups)
from inspector.storage.spill import cache_root

#: rows a query would decode (histograms included) from which a part gets a sorted copy: at
#: ~6 s per million rows on a busy machine, below it the part is read as it is
SORT_ROWS = 500_000
#: rows of tensors sorted in memory together while the copy is written (~1 KB a row with
#: log-magnitude histograms: ~65 MB, twice that while its chunks are combined; on a 1M-row
#: part 131,072 peaked at 630 MiB of RSS, 65,536 at 480 MiB, in about the same time)
BUCKET_ROWS = 65_536
#: rows decoded from the part at a time while it is split into buckets
SPLIT_ROWS = 16_384
#: default bytes of copies kept; ``$TF_INSPECTOR_SORTED_BYTES`` overrides it (0: none)
MAX_BYTES = 16 << 30
#: bumped when the copy's layout changes: copies of another version are rebuilt
VERSION = 1
SOURCE_KEY = b"tf_inspector.sorted_copy_of"


def max_bytes() -> int:
    """Bytes of sorted copies kept at most (``$TF_INSPECTOR_SORTED_BYTES``, else MAX_BYTES)."""
    raw = os.environ.get("TF_INSPECTOR_SORTED_BYTES")
    try:
        return max(int(raw), 0) if raw else MAX_BYTES
    except ValueError:
        return MAX_BYTES


def folder() -> Path:
    return cache_root() / "sorted"


def part_key(path: Path, st: os.stat_result) -> str:
    """The key of this version of the part at ``path``: its size, mtime and footer hashed."""
    h = hashlib.sha256(f"v{VERSION}|{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(path, "rb") as f:
        f.seek(max(st.st_size - 8, 0))
        tail = f.read(8)
        n = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
        if 0 < n <= st.st_size - 8:
            f.seek(st.st_size - 8 - n)
            h.update(f.read(n))
        h.update(tail)
    return h.hexdigest()


def wants_copy(pf: pq.ParquetFile, columns: Sequence[str] | None, rows: int,
               build: bool = True) -> bool:
    """Whether a query decoding ``rows`` rows of ``columns`` (None: all) of the part ``pf``
    should read a sorted copy: SORT_ROWS rows or more; to write one (``build``), a list column
    (a histogram) among them too (scalar columns decode ~30 times faster: an existing copy
    is read for them, none is written)."""
    if rows < SORT_ROWS or max_bytes() == 0:
        return False
    if not build:
        return True
    schema = pf.schema_arrow
    names = schema.names if columns is None else [c for c in columns if c in schema.names]
    return any(pa.types.is_list(schema.field(c).type)
               or pa.types.is_fixed_size_list(schema.field(c).type) for c in names)


#: a batch of the part checked (``schema.check_stats_table``, passed in: the reader imports
#: this module, so it cannot import the reader's checks)
Check = Callable[[pa.Table, Path], pa.Table]


def sorted_copy(path: Path, st: os.stat_result, pf: pq.ParquetFile, verify: bool,
                build: bool = True, *, check: Check) -> tuple[Path, pq.ParquetFile] | None:
    """The sorted copy of the part ``pf`` (at ``path``, stat ``st``) from the cache, written
    first (``build``) if there is none or it does not match the part; None where none can be
    written
    (too large for the cache, no space, a read-only cache folder): read the part itself.
    DamagedFileError where the part's own rows are damaged."""
    try:
        key = part_key(path, st)
        target = folder() / f"{key}.parquet"
        copy = _open_checked(target, key, pf, verify)
        if copy is None and build and st.st_size <= max_bytes():
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _make_room(target.parent, st.st_size)
            _write(pf, path, target, key, check)
            copy = _open_checked(target, key, pf, verify)
    # the cache cannot be used (not a folder, read-only, full), or the part failed to read
    # (pyarrow's IOError): the caller reads the part itself, which reports what it finds
    except OSError:
        return None
    return None if copy is None else (target, copy)


def _open_checked(target: Path, key: str, pf: pq.ParquetFile,
                  verify: bool) -> pq.ParquetFile | None:
    """The copy at ``target`` if its footer says it is the copy of this part version (key, rows,
    schema, an index fitting its row groups); else None, the file deleted."""
    try:
        copy = pq.ParquetFile(str(target), page_checksum_verification=verify)
        meta = copy.metadata.metadata or {}
        ok = (meta.get(SOURCE_KEY) == key.encode()
              and copy.metadata.num_rows == pf.metadata.num_rows
              and copy.schema_arrow.remove_metadata().equals(pf.schema_arrow.remove_metadata())
              and row_groups_for(copy, list(json.loads(meta[INDEX_KEY]))) is not None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, pa.ArrowException):
        ok = False
    if ok:
        os.utime(target)   # recently used: evicted last
        return copy
    target.unlink(missing_ok=True)
    return None


def _make_room(where: Path, size: int) -> None:
    """Delete the least recently used copies until ``size`` more bytes fit max_bytes()."""
    files = sorted((f.stat().st_mtime, f.stat().st_size, f) for f in where.glob("*.parquet"))
    total = sum(s for _, s, _ in files)
    for _, s, f in files:
        if total + size <= max_bytes():
            break
        f.unlink(missing_ok=True)
        total -= s


def _write(pf: pq.ParquetFile, path: Path, target: Path, key: str, check: Check) -> None:
    """Write the sorted copy of ``pf`` at ``target`` (temporary files beside it, then a rename),
    each batch of the part passed through ``check``."""
    from tqdm import tqdm

    rows = pf.metadata.num_rows
    buckets = _buckets(pf)
    schema = pf.schema_arrow.remove_metadata()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    bar = tqdm(total=2 * rows, unit="row", unit_scale=True, file=sys.stderr, disable=None,
               desc=f"indexing {path.name} once (no row-group index; later queries read "
                    "a sorted copy)")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
        files = [Path(tmp) / f"{b}.arrows" for b in range(max(buckets.values(), default=0) + 1)]
        writers = [pa.ipc.new_stream(str(f), schema, options=options) for f in files]
        seen = 0
        try:
            for batch in pf.iter_batches(SPLIT_ROWS, use_threads=True):
                t = check(pa.Table.from_batches([batch]), path)
                seen += t.num_rows
                _split(t, buckets, writers)
                bar.update(t.num_rows)
        finally:
            for w in writers:
                w.close()
        if seen != rows:
            raise DamagedFileError(f"damaged statistics file {path}: {seen:,} rows decoded where "
                                   f"its footer counts {rows:,}")
        index: dict[str, list[int]] = {}
        groups = 0
        out = Path(tmp) / "copy.parquet"
        with pq.ParquetWriter(str(out), schema, **parquet_options(schema)) as w:
            for f in files:
                # no reference kept here: _write_bucket's sorted copy replaces the rows read
                got, n, done = _write_bucket(w, pa.ipc.open_stream(str(f)).read_all(), rows,
                                             groups)
                f.unlink()
                index.update(got)
                groups += n
                bar.update(done)
                pa.default_memory_pool().release_unused()   # RSS: one bucket at a time
            w.add_key_value_metadata({INDEX_KEY.decode(): json.dumps(index, separators=(",", ":")),
                                      SOURCE_KEY.decode(): key})
        os.chmod(out, 0o600)   # a copy of the user's data: theirs alone, as the folder
        os.replace(out, target)
    bar.close()


def _buckets(pf: pq.ParquetFile) -> dict[str, int]:
    """{tensor: bucket}: tensors in name order, cut into buckets of about BUCKET_ROWS rows,
    from the ``tensor`` column read alone."""
    counts: dict[str, int] = {}
    for g in range(pf.num_row_groups):
        for chunk in pf.read_row_group(g, columns=["tensor"]).column("tensor").chunks:
            n = np.bincount(chunk.indices.to_numpy(zero_copy_only=False),
                            minlength=len(chunk.dictionary))
            for name, k in zip(chunk.dictionary.to_pylist(), n.tolist()):
                if k:
                    counts[name] = counts.get(name, 0) + k
    out, bucket, held = {}, 0, 0
    for name in sorted(counts):
        if held and held + counts[name] > BUCKET_ROWS:
            bucket, held = bucket + 1, 0
        out[name] = bucket
        held += counts[name]
    return out


def _split(t: pa.Table, buckets: dict[str, int], writers: list) -> None:
    """Append each of ``t``'s rows to its tensor's bucket file."""
    col = t.column("tensor").combine_chunks()
    of_name = np.array([buckets.get(n, -1) for n in col.dictionary.to_pylist()], np.int64)
    if (of_name < 0).any():
        raise DamagedFileError("a tensor appeared that its tensor column did not hold")
    ids = of_name[col.indices.to_numpy(zero_copy_only=False)]
    order = np.argsort(ids, kind="stable")
    cuts = np.flatnonzero(np.diff(ids[order])) + 1
    for rows in np.split(order, cuts):
        if len(rows):
            writers[int(ids[rows[0]])].write_table(t.take(pa.array(rows)))


def _write_bucket(w: pq.ParquetWriter, table: pa.Table, rows: int,
                  first_group: int) -> tuple[dict[str, list[int]], int, int]:
    """One bucket's rows sorted by SORT_KEYS and written as row groups (parts.write_groups):
    the index of its tensors, its row groups, its rows."""
    done = table.num_rows
    if not done:
        return {}, 0, 0
    table = table.unify_dictionaries().combine_chunks()
    keys = [(k, "ascending") for k in SORT_KEYS if k in table.column_names]
    order = pc.sort_indices(_sort_keys(table), keys)
    # row groups of about a tensor's rows: a query decodes little beside its tensor's rows
    # (the footer, ~3 KB a row group, stays a few MB)
    target = max(MIN_GROUP_ROWS, rows // 1024)
    index, groups = write_groups(w, lambda a, b: table.take(order[a:b]),
                                 table.column("tensor").take(order), target, first_group)
    return index, groups, done
