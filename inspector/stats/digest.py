"""What the reader's run-wide answers need of a statistics part without a summary, from one read.

``Run.stats_steps`` (the steps of a (kind, group), and of any row) and
``Run.nonfinite_evidence`` (where a NaN/Inf may be) read each such part: a live session's
small parts, or an object store's compacted ones (FORMAT.md, "Summaries"). Each question
asked of the part itself costs a footer parse, a check and a read, and `info` asks
three of them per part; a digest is read once per part version and answers all of them
exactly, as the rows read through the reader's rules would.

Example::

    d = digest(run_part_table)                 # columns step, tensor, kind, group, nan, inf
    d.steps[("gradient", "all")], d.every, d.nonfinite   # nonfinite: [(first, last)] or []
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The columns a digest is made from (tensor: read so the reader's table checks see it, as a
#: query's rows would be).
COLUMNS = ("step", "tensor", "kind", "group", "nan", "inf")


@dataclass(frozen=True)
class Digest:
    """One part's steps per (kind, group), its steps of any row, and the step span of its rows
    of group ``all`` that count a NaN or Inf (``[(first, last)]``, or ``[]``: none), in the form
    of ``stats_summary.nonfinite_bins``."""
    steps: dict[tuple[str, str], np.ndarray]
    every: np.ndarray
    nonfinite: list[tuple[int, int]]


def digest(table: pa.Table) -> Digest:
    """The digest of a part's rows (:data:`COLUMNS`, as the reader returns them: checked)."""
    step = table.column("step")
    has_step = pc.is_valid(step).to_numpy(zero_copy_only=False)  # a row without a step is at none
    steps = step.to_numpy(zero_copy_only=False)
    every = np.unique(steps[has_step].astype(np.int64))
    kind, kinds = _codes(table.column("kind"))
    group, groups = _codes(table.column("group"))
    code = kind * len(groups) + group
    keep = has_step & (kind >= 0) & (group >= 0)   # a null kind or group is in no (kind, group)
    by = {(kinds[c // len(groups)], groups[c % len(groups)]): v
          for c, v in _steps_by_code(code[keep], steps[keep].astype(np.int64), every).items()}
    # as the NaN scan reads them: every row of group all, whatever its kind
    bad = has_step & (group == (groups.index("all") if "all" in groups else -2)) \
        & ((_counts(table.column("nan")) > 0) | (_counts(table.column("inf")) > 0))
    hit = steps[bad].astype(np.int64)
    return Digest(by, every, [(int(hit.min()), int(hit.max()))] if len(hit) else [])


def _steps_by_code(code: np.ndarray, steps: np.ndarray, every: np.ndarray
                   ) -> dict[int, np.ndarray]:
    """The sorted distinct steps of each code's rows (``every``: the steps of all rows, these
    among them)."""
    present = np.unique(code)
    if len(every) == 1:   # a part of one step (a small part's usual case): each code has it
        return {int(c): every.copy() for c in present}
    order = np.lexsort((steps, code))
    code, steps = code[order], steps[order]
    first = np.ones(len(code), bool)   # the first row of each distinct (code, step)
    first[1:] = (code[1:] != code[:-1]) | (steps[1:] != steps[:-1])
    code, steps = code[first], steps[first]
    bounds = np.searchsorted(code, present, "left"), np.searchsorted(code, present, "right")
    return {int(c): steps[a:b] for c, a, b in zip(present, *bounds)}


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A dictionary column's indices into one dictionary (-1 where null), and that dictionary."""
    col = column.unify_dictionaries().combine_chunks() if column.num_chunks != 1 \
        else column.chunk(0)
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    return _filled(col.indices, -1), [str(v) for v in col.dictionary.to_pylist()]


def _counts(column: pa.ChunkedArray) -> np.ndarray:
    """An integer column as int64 numbers, 0 where null (a null count counts nothing)."""
    return _filled(column, 0)


def _filled(values: pa.Array | pa.ChunkedArray, null: int) -> np.ndarray:
    """Integers as int64, ``null`` where null (fill_null only where there is one: it is most
    of the cost of a small part's digest)."""
    return (values.fill_null(null) if values.null_count else values).to_numpy().astype(np.int64)
