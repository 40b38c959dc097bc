"""The schema of a statistics part (``stats/*.parquet``, see FORMAT.md), checked before use.

A foreign Parquet file, or one whose columns have other types, is refused with a
DamagedFileError naming it, so the reader can skip it and still concatenate the others.
Columns the writer does not write are allowed (newer writers may add some).

Example::

    check_stats_table(pq.read_table(path), path)
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from .errors import DamagedFileError
from .format import GROUPS, KINDS, STAT_COLUMNS

_INT = ("count", "nan", "inf")
#: Each column the writer writes (``writer.RunWriter._stats_batch``) and a test of its type.
COLUMNS = {
    "step": pa.types.is_int64,
    **{c: (lambda t: pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))
       for c in ("tensor", "kind", "group")},
    **{c: (pa.types.is_int64 if c in _INT else pa.types.is_float64) for c in STAT_COLUMNS},
    "hist_lo": pa.types.is_float64,
    "hist_hi": pa.types.is_float64,
    "histogram": lambda t: pa.types.is_fixed_size_list(t) and pa.types.is_int32(t.value_type),
}
#: Columns every part must have.
REQUIRED = ("step", "tensor", "kind", "group")
#: The values ``kind`` and ``group`` may hold (checked on their dictionaries: cheap).
VALUES = {"kind": KINDS, "group": GROUPS}


def check_stats_schema(schema: pa.Schema, path: Path) -> None:
    """DamagedFileError naming ``path`` unless ``schema`` has the REQUIRED columns and every
    known column (COLUMNS) has the writer's type."""
    missing = [c for c in REQUIRED if c not in schema.names]
    if missing:
        raise DamagedFileError(f"damaged statistics file {path}: not a statistics part (no column "
                               f"{', '.join(missing)}; has {', '.join(schema.names[:8]) or 'none'})")
    if len(set(schema.names)) != len(schema.names):
        raise DamagedFileError(f"damaged statistics file {path}: a column name appears twice")
    for field in schema:
        test = COLUMNS.get(field.name)
        if test is not None and not test(field.type):
            raise DamagedFileError(f"damaged statistics file {path}: column {field.name!r} has type "
                                   f"{field.type}, not the type the writer writes (see FORMAT.md)")


def check_stats_table(table: pa.Table, path: Path) -> pa.Table:
    """``table`` (read from ``path``) without its schema metadata (a damaged ``pandas`` entry
    would break ``to_pandas``), if its schema passes :func:`check_stats_schema`, its data is
    valid (``Table.validate(full=True)``: with ``verify=False`` a damaged page can decode to
    dictionary indices out of range) and ``kind`` and ``group`` hold only the values of VALUES
    (so swapped columns are caught)."""
    try:
        check_stats_schema(table.schema, path)
        table.validate(full=True)  # dictionary indices in range, valid UTF-8, list sizes
        for name in REQUIRED[1:]:
            for chunk in table.column(name).chunks:
                allowed = VALUES.get(name)
                bad = set(chunk.dictionary.to_pylist()) - set(allowed) if allowed else set()
                if bad:
                    raise DamagedFileError(f"damaged statistics file {path}: column {name!r} holds "
                                           f"{sorted(map(str, bad))[:3]}, not one of {allowed}")
    except (ValueError, pa.ArrowException) as e:  # invalid UTF-8 in names or values
        raise DamagedFileError(f"damaged statistics file {path}: {type(e).__name__}: {e}") from None
    return table.replace_schema_metadata(None)
