"""The schema of a statistics part (``stats/*.parquet``, see FORMAT.md), checked before use.

A foreign Parquet file, or one whose columns have other types, is refused with a
DamagedFileError naming it, so the reader can skip it and still concatenate the others.
Columns the writer does not write are allowed (newer writers may add some).

Example::

    # a regular file inside the run, its footer's schema the writer's, its data valid
    table = read_part(path, root, ["step", "tensor", "kind", "group", "mean"], [("step", ">=", 10)],
                      verify=True)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inspector.errors import DamagedFileError, MemoryBudgetError, StorageError
from inspector.format import GROUP_NAME_RE, KINDS, STAT_COLUMNS
from inspector.format.loghist import COLUMNS as LOG_HIST
from inspector.sizes import human_bytes
from inspector.stats import sorted_cache
from inspector.stats.parts import row_groups_for
from inspector.storage.safety import check_regular

if TYPE_CHECKING:
    from inspector.storage import Ranged

_INT = ("count", "nan", "inf")
#: Each column the writer writes (``writer.RunWriter._stats_table``) and a test of its type.
COLUMNS = {
    "step": pa.types.is_int64,
    "session": pa.types.is_int64,
    "batch": pa.types.is_int64,
    **{c: (lambda t: pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))
       for c in ("worker", "mode")},
    **{c: (lambda t: pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)
           and pa.types.is_int32(t.index_type) and not t.ordered)  # as dictionary_encode() makes
       for c in ("tensor", "kind", "group")},
    **{c: (pa.types.is_int64 if c in _INT else pa.types.is_float64) for c in STAT_COLUMNS},
    # the log-magnitude histogram (format version 4, inspector/format/loghist.py)
    "hist_bucket": lambda t: pa.types.is_list(t) and pa.types.is_int16(t.value_type),
    "hist_count": lambda t: pa.types.is_list(t) and pa.types.is_int32(t.value_type),
    # the equal-width histogram of runs written before it
    "hist_lo": pa.types.is_float64,
    "hist_hi": pa.types.is_float64,
    "histogram": lambda t: pa.types.is_fixed_size_list(t) and pa.types.is_int32(t.value_type),
}
#: The two histogram schemes: a part has every column of one of them (and none of the other).
LINEAR_HIST = ("hist_lo", "hist_hi", "histogram")
HISTOGRAMS = (LOG_HIST, LINEAR_HIST)
#: Columns every part must have.
REQUIRED = ("step", "tensor", "kind", "group")
#: Columns a version 1 part lacks (the reader adds them from the file name); a version 2 part
#: (a session in its file name) must have them.
OPTIONAL = ("worker", "session", "mode", "batch")
#: The values ``kind`` may hold, and a test of every ``group`` value (``all`` or a group name,
#: format.GROUP_NAME_RE), checked on their dictionaries: cheap.
VALUES = {"kind": KINDS}
TESTS = {"group": lambda v: v == "all" or bool(GROUP_NAME_RE.match(v))}


def check_stats_schema(schema: pa.Schema, path: Path, columns: Sequence[str] | None = None,
                       version1: bool = False) -> None:
    """DamagedFileError naming ``path`` unless ``schema`` has the REQUIRED columns and every
    known column (COLUMNS) has the writer's type. ``columns``: the columns read (None: all,
    so every column of COLUMNS must be there, of one histogram scheme: a damaged name would
    else read as missing). A histogram column of the scheme a part does not have is never
    missing: a query for one scheme's columns reads the other's parts without them."""
    key = (None if columns is None else tuple(columns), version1)
    if any(s == schema for s in _PASSED.get(key, ())):
        return   # the verdict is the names' and types' alone (== compares both, not metadata)
    _check_schema(schema, path, columns, version1)
    passed = _PASSED.setdefault(key, [])
    if len(passed) >= PASSED_SCHEMAS:
        passed.pop(0)
    passed.append(schema)


#: Schemas that passed :func:`check_stats_schema`, by (columns, version1): a run's thousands of
#: small parts share a few schemas, each checked once
_PASSED: dict[tuple, list[pa.Schema]] = {}
PASSED_SCHEMAS = 8


def _check_schema(schema: pa.Schema, path: Path, columns: Sequence[str] | None,
                  version1: bool) -> None:
    """:func:`check_stats_schema`'s checks, made."""
    scheme = next((h for h in HISTOGRAMS if any(c in schema.names for c in h)), LOG_HIST)
    other = {c for h in HISTOGRAMS if h is not scheme for c in h}
    wanted = [c for c in (COLUMNS if columns is None else columns) if c in COLUMNS
              and c not in other]
    if any(c in schema.names for c in other):
        raise DamagedFileError(
            f"damaged statistics file {path}: it has columns of both histogram schemes "
            f"({', '.join(c for c in schema.names if c in LOG_HIST + LINEAR_HIST)})")
    missing = [c for c in dict.fromkeys([*REQUIRED, *wanted]) if c not in schema.names
               and not (version1 and c in OPTIONAL)]
    if missing:
        raise DamagedFileError(
            f"damaged statistics file {path}: no column {', '.join(missing)} "
            f"(has {', '.join(schema.names[:8]) or 'none'}{', ...' * (len(schema) > 8)})")
    if len(set(schema.names)) != len(schema.names):
        raise DamagedFileError(f"damaged statistics file {path}: a column name appears twice")
    for field in schema:
        test = COLUMNS.get(field.name)
        if test is not None and not test(field.type):
            raise DamagedFileError(f"damaged statistics file {path}: column {field.name!r} has "
                                   f"type {field.type}, not the type the writer writes (see "
                                   "FORMAT.md)")


# (path, inode, size, mtime) -> error message or column names
_checked: dict[tuple, str | tuple[str, ...]] = {}
CHECKED_FILES = 200_000   # ~40 MB of keys and names at most


def read_part(path: Path, root: Path | None, columns: Sequence[str] | None, filters: Any,
              verify: bool, version1: bool = False, budget: int | None = None) -> pa.Table:
    """The statistics part at ``path``, a regular file (inside ``root``) whose footer's full
    schema passes :func:`check_stats_schema` with every column of COLUMNS (so a part is skipped
    or not whatever columns a query reads; the verdict is cached per file version): those of
    ``columns`` it has (None: all), rows matching ``filters`` (``pq.read_table``'s form),
    checked by :func:`check_stats_table`; ``verify``: check the Parquet page checksums.
    DamagedFileError otherwise; MemoryBudgetError where the rows kept pass ``budget`` bytes.
    A compacted part reads the row groups its index names; any other part is read in batches
    of BATCH_ROWS rows (:func:`read_bounded`), so memory follows the answer, not the part.
    No row group's metadata is looked at: pyarrow 24 aborts the process (an uncaught C++
    exception) on some damaged footers when filtering by row-group statistics or listing
    column chunks (``FileMetaData.row_group(i).column(j)``), where reading the data raises a
    Python exception or reads correctly."""
    st = check_regular(path, root)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, version1)
    known = _checked.get(key)
    if isinstance(known, str):
        raise DamagedFileError(known)
    try:
        # one footer parse serves the schema check and the read (a separate read_schema would
        # double a small part's cost); not pq.read_table: its datasets layer's fixed cost is
        # paid again for every part. buffer_size: a column chunk is read page by page, so one
        # huge row group is not read into memory whole
        with pa.OSFile(str(path)) as f:
            pf = pq.ParquetFile(f, page_checksum_verification=verify, buffer_size=READ_BUFFER)
            if known is None:
                schema = pf.schema_arrow
                check_stats_schema(schema, path, version1=version1)
                known = _remember(key, tuple(schema.names))
            wanted = None if columns is None else [c for c in columns if c in known]
            # a compacted part reads only the row groups its index names
            raw = _indexed(pf, wanted, filters)
            if raw is None:
                return read_bounded(pf, wanted, filters, path, budget,
                                    lambda build: sorted_cache.sorted_copy(
                                        path, st, pf, verify, build, check=check_stats_table))
    except MemoryError:
        raise   # not the file's fault: never remembered as damaged
    except (OSError, ValueError, pa.ArrowException) as e:  # ValueError: invalid UTF-8 names
        msg = f"damaged statistics file {path}: {type(e).__name__}: {e}"
        if known is None:
            _remember(key, msg)
        raise DamagedFileError(msg) from None
    except DamagedFileError as e:
        _remember(key, str(e))
        raise
    return within_budget(apply_filters(check_stats_table(raw, path), filters), path, budget)


#: rows decoded at a time from a part without a row-group index: ~1 KB a row with a
#: log-magnitude histogram, several times that while its pages are decompressed and decoded
#: (~100 MB a batch at the peak; 65,536 rows peaked near 1 GB)
BATCH_ROWS = 16384
#: rows of a part at most that decode on the calling thread: dispatching a small part's columns
#: to pyarrow's pool costs more than it saves (296 rows, 6 columns: 0.41 ms of CPU serially,
#: 0.52 ms through the pool, no sooner; 4,144 rows of every column: 9 ms either way, the pool
#: done in two thirds of the time where a core is free)
SERIAL_ROWS = 2048
#: bytes a column chunk is read through at a time (pages stream; a row group is never whole)
READ_BUFFER = 1 << 20
#: bytes of rows one statistics read may hold (the reader's default ``memory_budget``)
MEMORY_BUDGET = 2 << 30


def read_bounded(pf: pq.ParquetFile, columns: Sequence[str] | None, filters: Any,
                 path: Any, budget: int | None,
                 copy: Callable[[bool], tuple[Path, pq.ParquetFile] | None] | None = None
                 ) -> pa.Table:
    """Rows of ``pf`` (a part without an index) that ``filters`` keep, ``columns`` of them:
    the row groups whose ``tensor`` column holds none of the filters' tensors are skipped
    after reading that column alone; the others are decoded BATCH_ROWS rows at a time, each
    batch checked (:func:`check_stats_table`) and filtered before the next is read. Memory:
    one batch plus the rows kept; MemoryBudgetError once those pass ``budget``. ``copy``:
    where the tensors' rows to decode are many (``sorted_cache.wants_copy``), called for a
    tensor-sorted copy of the part with an index (:mod:`inspector.stats.sorted_cache`),
    read instead when it has one: ``copy(False)`` an existing one (before the ``tensor``
    column is read), ``copy(True)`` one written now if need be."""
    total = pf.metadata.num_rows
    # a part of one batch is read in one go: looking for its tensors first would read it twice
    tensors = _tensors(filters) if total > BATCH_ROWS else None
    if tensors is None:   # no row group's metadata read (see read_part): the total is checked
        plan: list[tuple[int, int | None]] = [(g, None) for g in range(pf.num_row_groups)]
    else:
        if copy is not None and sorted_cache.wants_copy(pf, columns, total, build=False):
            got = _from_copy(copy(False), columns, filters, path)
            if got is not None:
                return within_budget(got, path, budget)
        rows = [_rows_of(pf, g, tensors, path) for g in range(pf.num_row_groups)]
        _check_rows(sum(n for n, _ in rows), total, path)
        plan = [(g, n) for g, (n, holds) in enumerate(rows) if holds]
        to_decode = sum(n for n, holds in rows if holds)
        if copy is not None and sorted_cache.wants_copy(pf, columns, to_decode):
            got = _from_copy(copy(True), columns, filters, path)
            if got is not None:
                return within_budget(got, path, budget)
    kept: list[pa.Table] = []
    size = seen = 0
    for g, n in plan:
        decoded = 0
        whole = total <= BATCH_ROWS or (n is not None and n <= BATCH_ROWS)
        for chunk in _batches(pf, g, whole, columns, total > SERIAL_ROWS):
            decoded += chunk.num_rows
            chunk = apply_filters(check_stats_table(chunk, path), filters)
            if chunk.num_rows:
                kept.append(chunk)
                size += chunk.nbytes
                within_budget(size, path, budget)
        # a damaged page can end a column's batches early without an error
        if n is not None:
            _check_rows(decoded, n, path)
        seen += decoded
    if tensors is None:
        _check_rows(seen, total, path)
    if not kept:
        empty = pf.schema_arrow.empty_table()
        return check_stats_table(empty.select(columns) if columns is not None else empty, path)
    return pa.concat_tables(kept)


def _from_copy(copy: tuple[Path, pq.ParquetFile] | None, columns: Sequence[str] | None,
               filters: Any, path: Any) -> pa.Table | None:
    """The rows ``filters`` keep from a part's sorted ``copy`` (its path and file), read
    through its index and checked as the part's would be; None (the copy deleted) where it
    cannot be read: the caller reads the part itself."""
    if copy is None:
        return None
    try:
        raw = _indexed(copy[1], columns, filters)
        if raw is not None:
            return apply_filters(check_stats_table(raw, path), filters)
    except MemoryError:
        raise
    except (OSError, ValueError, pa.ArrowException, DamagedFileError):
        pass
    copy[0].unlink(missing_ok=True)
    return None


def _batches(pf: pq.ParquetFile, group: int, whole: bool, columns: Sequence[str] | None,
             threads: bool = True) -> Iterator[pa.Table]:
    """Row group ``group`` as tables of BATCH_ROWS rows at most, or ``whole`` (it holds no more
    than that): ``read_row_group`` checks the footer's size statistics of its column chunks
    (damage it refuses, as a whole-part read does, whichever columns are asked for); a larger
    group streams (``iter_batches``, which does not check them). ``threads``: a whole group's
    columns decoded on pyarrow's pool (a small part's cost more so: SERIAL_ROWS)."""
    if whole:
        yield pf.read_row_group(group, columns=columns, use_threads=threads)
        return
    for batch in pf.iter_batches(BATCH_ROWS, row_groups=[group], columns=columns,
                                 use_threads=True):
        yield pa.Table.from_batches([batch])


def _check_rows(got: int, expected: int, path: Any) -> None:
    if got != expected:
        raise DamagedFileError(f"damaged statistics file {path}: {got:,} rows decoded where its "
                               f"footer counts {expected:,}")


def _rows_of(pf: pq.ParquetFile, group: int, tensors: Sequence[str] | None,
             path: Any) -> tuple[int, bool]:
    """Row group ``group``'s rows, and whether one is of ``tensors`` (None: any tensor), from
    its ``tensor`` column read alone (dictionary indices, a few bytes a row)."""
    column = pf.read_row_group(group, columns=["tensor"]).column("tensor")
    if tensors is None:
        return len(column), True
    wanted = pa.array(list(tensors), pa.string())
    holds = False
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            raise DamagedFileError(f"damaged statistics file {path}: column 'tensor' has type "
                                   f"{chunk.type}, not the type the writer writes (see FORMAT.md)")
        hit = pc.is_in(chunk.dictionary, value_set=wanted)
        holds = holds or (pc.any(hit).as_py() and pc.any(pc.is_in(
            chunk.indices, value_set=pc.indices_nonzero(hit).cast(chunk.indices.type))).as_py())
    return len(column), bool(holds)


def within_budget(rows: "pa.Table | int", path: Any, budget: int | None) -> Any:
    """``rows`` (a table, or its size in bytes) if it fits ``budget`` (None: no budget);
    MemoryBudgetError naming what to ask for instead otherwise."""
    size = rows if isinstance(rows, int) else rows.nbytes
    if budget is not None and size > budget:
        raise MemoryBudgetError(
            f"reading {path} keeps more than the reader's memory budget of "
            f"{human_bytes(budget)}: ask for less (run.query_stats([tensor], "
            "steps=(first, last), columns=['mean', ...]) reads one tensor's rows, a step range, "
            "the columns named), or raise the budget: open_run(path, memory_budget=bytes) or "
            "run.memory_budget = bytes (None: no budget)")
    return rows


def _remember(key: tuple, verdict: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """Cache a part's schema verdict: its column names, or why it is damaged."""
    # bounded far above a run's parts: a bound below them would re-check every footer of such
    # a run on each pass over its parts
    if len(_checked) > CHECKED_FILES:
        _checked.clear()
    _checked[key] = verdict
    return verdict


#: The comparisons :func:`apply_filters` makes with a boolean mask.
_COMPARE = {">=": pc.greater_equal, "<=": pc.less_equal, "==": pc.equal,
            ">": pc.greater, "<": pc.less}


def apply_filters(table: pa.Table, filters: Any) -> pa.Table:
    """The rows of ``table`` that ``filters`` (``pq.read_table``'s list of (column, op, value)
    triples, all of them to hold) keep: as one boolean mask (``Table.filter(expression)``
    builds an Acero plan per part, which costs more); other forms as an expression."""
    if not filters:
        return table
    mask = None
    for f in filters:
        if not (isinstance(f, tuple) and len(f) == 3 and (f[1] == "in" or f[1] in _COMPARE)):
            return table.filter(pq.filters_to_expression(filters))
        column, op, value = f
        col = table.column(column)
        if op == "in":
            kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
            m = pc.is_in(col, value_set=pa.array(list(value), kind))   # typed: an empty list too
        else:
            m = _COMPARE[op](col, value)
        mask = m if mask is None else pc.and_(mask, m)
    return table.filter(mask)


def _tensors(filters: Any) -> list[str] | None:
    """The tensors a query's filters keep (``("tensor", "in", [...])``), or None."""
    return next((v for c, op, v in filters if c == "tensor" and op == "in"), None) if filters \
        else None


def _indexed(pf: pq.ParquetFile, columns: Sequence[str] | None, filters: Any) -> pa.Table | None:
    """The row groups of a compacted part that hold the filters' tensors (its footer's index,
    ``stats_parts.row_groups_for``), ``columns`` of them; None where the part has no index (or
    the query names no tensor): then it is read whole."""
    tensors = _tensors(filters)
    groups = None if tensors is None else row_groups_for(pf, tensors)
    if groups is None:
        return None
    raw = pf.read_row_groups(groups, columns=columns) if groups else pf.schema_arrow.empty_table()
    if not groups and columns is not None:
        raw = raw.select([c for c in columns if c in raw.column_names])
    return raw


def check_stats_table(table: pa.Table, path: Path) -> pa.Table:
    """``table`` (read from ``path``) without its schema metadata (a damaged ``pandas`` entry
    would break ``to_pandas``), if its schema passes :func:`check_stats_schema`, its data is
    valid (``Table.validate(full=True)``: with ``verify=False`` a damaged page can decode to
    dictionary indices out of range) and ``kind`` and ``group`` hold only the values of VALUES
    (so swapped columns are caught)."""
    try:
        check_stats_schema(table.schema, path, table.schema.names)
        table.validate(full=True)  # dictionary indices in range, valid UTF-8, list sizes
        for name in (*VALUES, *TESTS):
            for chunk in table.column(name).chunks:
                allowed, test = VALUES.get(name), TESTS.get(name)
                values = set(chunk.dictionary.to_pylist())
                bad = values - set(allowed) if allowed \
                    else {v for v in values if test and not test(v)}
                if bad:
                    what = f"one of {allowed}" if allowed \
                        else f"'all' or a group name ({GROUP_NAME_RE.pattern})"
                    raise DamagedFileError(f"damaged statistics file {path}: column {name!r} holds "
                                           f"{sorted(map(str, bad))[:3]}, not {what}")
    except MemoryError:
        raise   # pyarrow's ArrowMemoryError is an ArrowException too: not damage
    except (ValueError, pa.ArrowException) as e:  # invalid UTF-8 in names or values
        raise DamagedFileError(f"damaged statistics file {path}: {type(e).__name__}: {e}") from None
    return table.replace_schema_metadata(None)


def read_ranged_part(r: "Ranged", columns: Sequence[str] | None, filters: Any, verify: bool,
                     version1: bool = False, metadata: Any = None,
                     budget: int | None = None) -> tuple[pa.Table, Any]:
    """(table, footer metadata) of a part in an object store, open as ``r`` (``storage.Ranged``):
    the footer is read once (or ``metadata`` from an earlier call is reused), then only the
    column chunks of ``columns``, each a range request. The same checks as a local part:
    the footer's full schema (:func:`check_stats_schema`), then :func:`check_stats_table`."""
    name: Any = Path(r.name) if "://" not in r.name else r.name
    try:
        pf = pq.ParquetFile(pa.PythonFile(r.pyfile(), mode="r"), metadata=metadata,
                            page_checksum_verification=verify, pre_buffer=True)
        schema = pf.schema_arrow
        check_stats_schema(schema, name, version1=version1)
        names = set(schema.names)
        wanted = None if columns is None else [c for c in columns if c in names]
        table = _indexed(pf, wanted, filters)   # one tensor: the byte ranges of its row groups only
        if table is None:
            return read_bounded(pf, wanted, filters, r.name, budget), pf.metadata
    except (StorageError, MemoryError):
        # the store did not answer (pyarrow passes the reader's own error through), no memory:
        # not damage
        raise
    except (OSError, ValueError, pa.ArrowException) as e:
        raise DamagedFileError(f"damaged statistics file {r.name}: {type(e).__name__}: "
                               f"{e}") from None
    table = check_stats_table(table, name)
    return within_budget(apply_filters(table, filters), r.name, budget), pf.metadata
