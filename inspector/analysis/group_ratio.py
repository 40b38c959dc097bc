"""Two sample groups compared cell by cell: the ratio of one group's statistic to the other's
per tensor and statistics column (:func:`ratio_overview`, the Training overview's
"negative / positive" heatmap), and the tensors where the two differ most over the run
(:func:`most_different`, named on the Summary). NumPy only.

A ratio is defined where both groups have a finite value at that column; it is NaN (a NaN/Inf
cell) where either group's is NaN/Inf, and absent where either has no statistics there. A
ratio <= 0 (a zero in the numerator, or statistics of opposite signs) has no place on a log
scale: it is kept as it is, for the chart to mark.

Example::

    ratio = ratio_overview(overview(run, "gradient", "negative", "l2"),
                           overview(run, "gradient", "positive", "l2"))
    ratio.matrix[i, j]        # negative / positive of tensor i at column j
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from inspector.stats.summary import Overview


def ratio_overview(num: Overview, den: Overview) -> Overview:
    """``num`` / ``den`` on the tensors and columns both have (columns matched by their first
    statistics step; tensors in ``num``'s order); ``present`` where both have statistics."""
    rows = [t for t in num.tensors if t in set(den.tensors)]
    cols = np.intersect1d(np.asarray(num.first_steps), np.asarray(den.first_steps))
    a = _take(num, rows, cols)
    b = _take(den, rows, cols)
    present = a[1] & b[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        m = a[0] / b[0]
    # 0/0 and x/0 are no ratio a chart can place: NaN/Inf would read as a fault, so absent
    m = np.where(np.isfinite(a[0]) & np.isfinite(b[0]) & (b[0] == 0), np.nan, m)
    present &= ~(np.isfinite(a[0]) & np.isfinite(b[0]) & (b[0] == 0))
    last = np.asarray(num.steps)[np.searchsorted(np.asarray(num.first_steps), cols)] \
        if len(cols) else np.zeros(0, np.int64)
    return Overview(rows, last, cols, m, max(num.width, den.width), present=present,
                    notes=[*num.notes, *den.notes])


def _take(ov: Overview, rows: list[str], cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(matrix, present) of ``ov`` on ``rows`` x the columns starting at ``cols``."""
    index = {t: i for i, t in enumerate(ov.tensors)}
    ri = np.array([index[t] for t in rows], np.int64)
    ci = np.searchsorted(np.asarray(ov.first_steps), cols)
    present = ov.present if ov.present is not None else np.isfinite(ov.matrix)
    return ov.matrix[np.ix_(ri, ci)], np.asarray(present, bool)[np.ix_(ri, ci)]


def most_different(ratio: Overview, tensors: list[str] | None = None, top: int = 5
                   ) -> pd.DataFrame:
    """The ``top`` tensors (of ``tensors``, default all) whose groups differ most: by the median
    over the run of |log10 ratio| (one odd step does not rank a tensor first). Columns:
    ``tensor``, ``median`` ratio, ``peak`` (the ratio furthest from 1), ``peak_step``, ``steps``
    (columns with a ratio). Tensors without a positive finite ratio are left out.

    >>> ov = Overview(["a", "b"], np.array([1, 2]), np.array([1, 2]),
    ...               np.array([[1.0, 1.1], [100.0, 0.01]]), 1, present=np.ones((2, 2), bool))
    >>> most_different(ov)[["tensor", "peak", "peak_step"]].values.tolist()
    [['b', 100.0, 1], ['a', 1.1, 2]]
    """
    index = {t: i for i, t in enumerate(ratio.tensors)}
    out = []
    for t in (ratio.tensors if tensors is None else tensors):
        i = index.get(t)
        if i is None:
            continue
        v = ratio.matrix[i]
        ok = np.asarray(ratio.present[i], bool) & np.isfinite(v) & (v > 0) \
            if ratio.present is not None else np.isfinite(v) & (v > 0)
        if not ok.any():
            continue
        logs = np.log10(v[ok])
        j = int(np.argmax(np.abs(logs)))
        out.append({"tensor": t, "median": float(10 ** np.median(logs)),
                    "peak": float(v[ok][j]), "peak_step": int(np.asarray(ratio.steps)[ok][j]),
                    "steps": int(ok.sum()), "score": float(np.median(np.abs(logs)))})
    df = pd.DataFrame(out, columns=["tensor", "median", "peak", "peak_step", "steps", "score"])
    return df.sort_values("score", ascending=False, kind="stable").head(top) \
        .drop(columns="score").reset_index(drop=True)
