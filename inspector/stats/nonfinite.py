"""How the reader shows a statistics row that counts a NaN or an Inf.

A part stores mean, std, min, max and l2 of a tensor's *finite* values and counts the rest in
``nan`` and ``inf`` (FORMAT.md "Statistics"), so an all-NaN gradient is stored with ``l2 = 0``:
read as it is, it looks like a gradient that vanished. The reader shows such a row as what it
is: mean, std, min and max NaN, and l2 NaN, or +Inf where the row counts an Inf and no NaN
(the norm overflowed). ``zero_fraction`` stays: the share of exact zeros among all values.
``Run.query_stats(..., finite_part=True)`` returns the stored values instead.
"""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

#: the columns that describe the finite values only, shown NaN (l2: NaN or Inf) on a non-finite row
VALUES = ("mean", "std", "min", "max", "l2")
COUNTS = ("nan", "inf")


def columns_to_read(columns: Sequence[str] | None) -> tuple[list[str] | None, list[str]]:
    """(the columns to read, those read only to judge rows and to drop after) for a query of
    ``columns`` (None: every column)."""
    if columns is None:
        return None, []
    extra = [c for c in COUNTS if c not in columns] if any(c in VALUES for c in columns) else []
    return [*columns, *extra], extra


def mark(table: pa.Table, drop: Sequence[str] = ()) -> pa.Table:
    """``table`` with the VALUES of every row that counts a NaN or Inf shown as such (see the
    module docstring), then the columns ``drop`` removed.

    >>> t = pa.table({"l2": [0.0, 2.0, 3.0], "mean": [1.0, 1.0, 1.0], "nan": [5, 0, 0],
    ...               "inf": [0, 0, 1]})
    >>> mark(t).column("l2").to_pylist(), mark(t).column("mean").to_pylist()
    ([nan, 2.0, inf], [nan, 1.0, nan])
    """
    names = table.column_names
    if all(c in names for c in COUNTS) and table.num_rows:
        nan = pc.greater(pc.fill_null(table.column("nan"), 0), 0)
        inf = pc.greater(pc.fill_null(table.column("inf"), 0), 0)
        bad = pc.or_(nan, inf)
        if pc.any(bad).as_py():
            for c in VALUES:
                if c not in names:
                    continue
                col = table.column(c)
                shown = pc.if_else(nan, float("nan"), float("inf")) if c == "l2" \
                    else pa.scalar(float("nan"))
                table = table.set_column(names.index(c), c,
                                         pc.if_else(bad, pc.cast(shown, col.type), col))
    return table.drop_columns([c for c in drop if c in table.column_names])
