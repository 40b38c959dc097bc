"""Histograms of dumped values, NumPy only.

:func:`value_histograms` counts them in the statistics' log-magnitude buckets
(:class:`~inspector.format.loghist.LogHistogram`), so a dump's histogram draws on the same axes as
the in-graph ones (:mod:`inspector.analysis.hist_view`). The equal-width and symmetric-log bin edges
below are for a plain ``np.histogram`` of values.

Gradients and many activations are long-tailed: most values sit within 1e-6 of zero and a
few reach 1e-2, so 40 equal bins show one spike. Like TensorBoard's exponential buckets,
:func:`symlog_edges` spaces bins geometrically in ``|x|`` on both sides of a small linear
zone ``[-linthresh, linthresh]`` around 0; plot such bins on a ``symlog`` x axis with the same
``linthresh``.

Example::

    >>> b = value_bins(np.random.default_rng(0).laplace(0, 1e-4, 10_000) ** 3)
    >>> b.scale, len(b.edges) > 2
    ('symlog', True)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inspector.format.loghist import LogHistogram

SCALES = ("auto", "linear", "symlog")


@dataclass(frozen=True)
class Bins:
    """Histogram edges and how to draw their x axis: ``scale`` 'linear' or 'symlog' (then
    ``linthresh`` is the half-width of the linear zone around 0)."""
    edges: np.ndarray
    scale: str = "linear"
    linthresh: float = 0.0


def _finite(arrays) -> np.ndarray:
    v = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in arrays]) if arrays \
        else np.zeros(0)
    return v[np.isfinite(v)]


def linear_edges(v: np.ndarray, bins: int = 40) -> np.ndarray:
    """``bins`` equal bins over the finite values ``v`` (widened by 0.5 each side if constant)."""
    if not v.size:
        return np.linspace(0.0, 1.0, bins + 1)
    lo, hi = float(v.min()), float(v.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)


def long_tailed(v: np.ndarray, ratio: float = 30.0) -> bool:
    """True when the largest ``|x|`` is over ``ratio`` times the 90th percentile of the
    non-zero ``|x|``: linear bins would put nearly every value in one or two bins.

    >>> long_tailed(np.r_[np.ones(99), 1e3]), long_tailed(np.linspace(-1, 1, 100))
    (True, False)
    """
    a = np.abs(v[np.isfinite(v)])
    a = a[a > 0]
    return bool(a.size >= 10 and a.max() > ratio * np.percentile(a, 90))


def symlog_edges(v: np.ndarray, bins: int = 40) -> tuple[np.ndarray, float]:
    """(edges, linthresh): one bin ``[-linthresh, linthresh]`` around 0 (holding the zeros),
    then geometric bins up to the largest ``|x|`` on each side that has values.
    ``linthresh`` is the 1st percentile of the non-zero ``|x|`` (at least 1e-6 of the largest)."""
    a = np.abs(v)
    nz = a[a > 0]
    if not nz.size:
        return linear_edges(v, bins), 0.0
    top = float(nz.max())
    lin = max(float(np.percentile(nz, 1)), top * 1e-6)
    if lin >= top:
        return linear_edges(v, bins), 0.0
    neg, pos = bool((v < -lin).any()), bool((v > lin).any())
    per_side = max((bins - 1) // (int(neg) + int(pos) or 1), 1)
    ladder = np.geomspace(lin, top, per_side + 1)[1:]
    edges = np.r_[-ladder[::-1] if neg else [], -lin, lin, ladder if pos else []]
    return edges, lin


def value_bins(*arrays: np.ndarray, bins: int = 40, scale: str = "auto") -> Bins:
    """Shared bins for the finite values of ``arrays``: ``scale`` 'linear', 'symlog', or
    'auto' (symlog when :func:`long_tailed`)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    v = _finite(arrays)
    if scale == "linear" or (scale == "auto" and not long_tailed(v)):
        return Bins(linear_edges(v, bins))
    edges, lin = symlog_edges(v, bins)
    return Bins(edges, "symlog", lin) if lin > 0 else Bins(edges)


def value_histograms(groups: dict[str, np.ndarray]) -> tuple[dict[str, LogHistogram],
                                                             tuple[float, float] | None]:
    """({group: log-magnitude histogram of its finite values}, the exact (min, max) of them
    all, None without any), for groups that hold values.

    >>> hists, ext = value_histograms({"positive": np.array([1.0, -2.0, np.nan]),
    ...                                "negative": np.zeros(0)})
    >>> list(hists), hists["positive"].total, ext
    (['positive'], 2, (-2.0, 1.0))
    """
    hists = {g: LogHistogram.of(v) for g, v in groups.items() if np.size(v)}
    v = _finite(list(groups.values()))
    return hists, ((float(v.min()), float(v.max())) if v.size else None)
