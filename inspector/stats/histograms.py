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

from inspector.errors import InspectorError
from inspector.format.loghist import RELATIVE_ERROR, TINY, LogHistogram, bucket_edges

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
