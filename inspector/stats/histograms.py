"""A statistics row's histogram, whichever scheme wrote it, and quantiles from histograms.

Runs of format version 4 store log-magnitude histograms (``hist_bucket``, ``hist_count``:
:mod:`inspector.format.loghist`); older runs equal-width ones (``hist_lo``, ``hist_hi``,
``histogram``). :func:`of_row` reads either; :func:`edges_and_counts` gives both as numpy-style
(edges, counts) for plotting; :func:`quantile_frame` needs the log-magnitude scheme, whose
quantiles carry a stated error (an equal-width bin's do not: it is refused, not guessed).

Example::

    df = run.query_stats(["conv1/Relu:0"], kinds=["gradient"], columns=list(COLUMNS))
    h = of_row(df.iloc[0])                     # LogHistogram, or (edges, counts) for older runs
    quantile_frame(df, [0.5, 0.99])            # one row per step and group: columns q0.5, q0.99
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from inspector.errors import InspectorError
from inspector.format.loghist import CEIL, RELATIVE_ERROR, TINY, LogHistogram, bucket_edges

#: Every histogram column of either scheme: ask a query for these to read any run's.
COLUMNS = ("hist_bucket", "hist_count", "hist_lo", "hist_hi", "histogram")


def _present(row: Any, name: str) -> Any:
    v = row.get(name) if hasattr(row, "get") else getattr(row, name, None)
    # None, NaN, pd.NA: a row of the other scheme
    if v is None or (not hasattr(v, "__len__") and pd.isna(v)):
        return None
    return v


def of_row(row: Any) -> LogHistogram | tuple[np.ndarray, np.ndarray] | None:
    """The histogram of a statistics row (a Series, namedtuple or dict with :data:`COLUMNS`):
    a :class:`~inspector.format.loghist.LogHistogram`, (edges, counts) of an equal-width one, or
    None when the row has neither."""
    buckets = _present(row, "hist_bucket")
    if buckets is not None:
        return LogHistogram.from_lists(buckets, _present(row, "hist_count"))
    counts = _present(row, "histogram")
    if counts is not None:
        c = np.asarray(counts, np.int64)
        return np.linspace(float(_present(row, "hist_lo")),
                           float(_present(row, "hist_hi")), len(c) + 1), c
    return None


def edges_and_counts(h: LogHistogram | tuple[np.ndarray, np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """numpy-style (edges [B + 1], counts [B]) of either scheme. A log-magnitude histogram's
    bins are its non-empty buckets and the gaps between them (count 0), in value order, except
    that ``|x| < 2**-126`` (bucket 0, the zeros, and the floor buckets of subnormal values) is
    one bin ``[-2**-126, 2**-126]``: edges must rise, and bucket 0 has no width."""
    if not isinstance(h, LogHistogram):
        return h
    idx = np.asarray(h.index, np.int64)
    small = np.abs(idx) <= 1
    lo, hi = bucket_edges(idx[~small])
    counts, bounds = list(h.count[~small].astype(np.int64)), list(zip(lo, hi))
    if small.any():
        bounds.append((-TINY, TINY))
        counts.append(int(h.count[small].sum()))
    if not bounds:
        return np.array([0.0, 1.0]), np.zeros(1, np.int64)
    order = np.argsort([b[0] for b in bounds], kind="stable")
    edges, out = [bounds[order[0]][0]], []
    for i in order:
        a, b = bounds[i]
        if a > edges[-1]:   # a gap between two non-empty buckets
            edges.append(a)
            out.append(0)
        edges.append(b)
        out.append(counts[i])
    return np.asarray(edges, np.float64), np.asarray(out, np.int64)


def quantile_frame(df: pd.DataFrame, q: Sequence[float]) -> pd.DataFrame:
    """One row per row of ``df`` (statistics rows with :data:`COLUMNS`): its identity columns
    (step, group, ... as present) and one column per quantile in ``q`` (``q0.5`` for 0.5),
    from its log-magnitude histogram (:func:`~inspector.loghist.quantiles`: within
    ``RELATIVE_ERROR`` of the exact quantile of the values the histogram counts). Rows with
    equal-width histograms (runs before format version 4) are refused: their quantiles have
    no bound."""
    qs = [float(x) for x in q]
    keep = [c for c in ("worker", "session", "mode", "step", "batch", "tensor", "kind", "group",
                        "count")
            if c in df.columns]
    out = df[keep].reset_index(drop=True).copy()
    if df.empty:
        return out.assign(**{qname(x): pd.Series(dtype=float) for x in qs})
    if "hist_bucket" not in df.columns or df["hist_bucket"].isna().any():
        old = df["step"][df["hist_bucket"].isna()] if "hist_bucket" in df.columns else df["step"]
        steps = sorted(int(s) for s in pd.unique(old))
        raise InspectorError(
            f"quantiles need log-magnitude histograms (format version 4); the rows at steps "
            f"{', '.join(map(str, steps[:5]))}{', ...' if len(steps) > 5 else ''} hold equal-width "
            "histograms, written before them, whose quantiles have no error bound: pass steps= "
            f"outside them, or read run.histogram() for those steps")
    values = np.stack([LogHistogram.from_lists(b, c).quantiles(qs)
                       for b, c in zip(df["hist_bucket"], df["hist_count"])])
    out = pd.concat([out, pd.DataFrame(values, columns=[qname(x) for x in qs])], axis=1)
    out.attrs["relative_error"] = RELATIVE_ERROR
    return out


def qname(q: float) -> str:
    """The column of quantile ``q``: ``qname(0.5) == "q0.5"``."""
    return f"q{float(q):g}"


def invalid_rows(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Which rows of a statistics table hold a histogram no writer writes (a bool mask), and
    why (one reason per such row, in row order): a log-magnitude bucket outside
    [-CEIL, CEIL], buckets not strictly ascending, bucket and count lists of different
    lengths, a negative count; an equal-width histogram with a negative count or
    ``hist_lo > hist_hi``. The reader's queries clear these histograms
    (:func:`clear_invalid`), so the viewer, the export and notebooks never draw them. Checked
    in Arrow (bitmaps; only the offending values' places come to numpy): a query's memory
    stays that of its rows."""
    n = table.num_rows
    bad = np.zeros(n, bool)
    why = np.full(n, "", object)
    if "hist_bucket" in table.column_names and "hist_count" in table.column_names:
        b = table.column("hist_bucket").combine_chunks()
        c = table.column("hist_count").combine_chunks()
        lengths = pc.not_equal(pc.fill_null(pc.list_value_length(b), 0),
                               pc.fill_null(pc.list_value_length(c), 0))
        _mark(bad, why, np.asarray(lengths, bool), "bucket and count lists of different lengths")
        idx, starts = _values(b)
        _mark(bad, why, _rows_of(b, pc.indices_nonzero(pc.greater(pc.abs(idx), CEIL))),
              f"a bucket outside [-{CEIL}, {CEIL}]")
        if len(idx) > 1:
            down = pc.indices_nonzero(pc.less_equal(idx.slice(1), idx.slice(0, len(idx) - 1)))
            at = np.asarray(down, np.int64) + 1   # the later of the two, if in the same row
            _mark(bad, why, _rows_of(b, pa.array(at[~np.isin(at, starts)])),
                  "buckets not ascending")
        counts, _ = _values(c)
        _mark(bad, why, _rows_of(c, pc.indices_nonzero(pc.less(counts, 0))), "a negative count")
    if "histogram" in table.column_names:
        h = table.column("histogram").combine_chunks()
        size = max(h.type.list_size, 1)
        values = h.values.slice(h.offset * size, len(h) * size)   # null rows' too: places match
        hits = np.asarray(pc.indices_nonzero(pc.less(values, 0)), np.int64)
        rows = np.zeros(n, bool)
        rows[hits // size] = True
        _mark(bad, why, rows & ~np.asarray(h.is_null(), bool), "a negative count")
        if "hist_lo" in table.column_names and "hist_hi" in table.column_names:
            lo = np.asarray(table.column("hist_lo").to_numpy(), np.float64)
            hi = np.asarray(table.column("hist_hi").to_numpy(), np.float64)
            _mark(bad, why, ~np.asarray(h.is_null(), bool) & ~(lo <= hi),
                  "hist_lo above hist_hi")
    return bad, list(why[bad])


def _values(lists: pa.ListArray) -> tuple[pa.Array, np.ndarray]:
    """The values of ``lists`` (those its offsets span, null rows' too: positions match the
    offsets) and where each row but the first starts among them."""
    off = np.asarray(lists.offsets, np.int64)
    first = int(off[0]) if len(off) else 0
    values = lists.values.slice(first, int(off[-1]) - first if len(off) else 0)
    return values, off[1:-1] - first


def _rows_of(lists: pa.ListArray, at: pa.Array) -> np.ndarray:
    """A row mask of ``lists``: the rows holding the values at positions ``at``."""
    rows = np.zeros(len(lists), bool)
    at = np.asarray(at, np.int64)
    if len(at):
        off = np.asarray(lists.offsets, np.int64)
        rows[np.searchsorted(off - off[0], at, "right") - 1] = True
    return rows


def _mark(bad: np.ndarray, why: np.ndarray, rows: np.ndarray, reason: str) -> None:
    why[rows & ~bad] = reason
    bad |= rows


def clear_invalid(table: pa.Table) -> tuple[pa.Table, list[str]]:
    """``table`` with the histograms of :func:`invalid_rows` cleared (no buckets; an
    equal-width one null), and one problem line describing them (none if every row is valid)."""
    bad, why = invalid_rows(table)
    if not bad.any():
        return table, []
    mask = pa.array(bad)
    for name in ("hist_bucket", "hist_count", "histogram"):
        if name in table.column_names:
            col = table.column(name)
            empty = pa.scalar(None if name == "histogram" else [], col.type)
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pc.if_else(mask, empty, col))
    first = int(np.flatnonzero(bad)[0])
    row = {c: table.column(c)[first].as_py() for c in ("tensor", "kind", "group", "step")
           if c in table.column_names}
    where = " ".join(f"{k}={v!r}" for k, v in row.items())
    return table, [f"{int(bad.sum()):,} statistics row(s) hold a histogram no writer writes "
                   f"(first: {where}: {why[0]}); their histograms are left out"]
