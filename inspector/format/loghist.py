"""Log-magnitude histograms: the buckets of the statistics' histograms (FORMAT.md, "Histograms").

A value's bucket follows its sign and the binary exponent of its magnitude, with 8 buckets per
power of two (the magnitude's three leading mantissa bits). The edges are fixed and global, the
same for every tensor, group, step and run, so histograms compare directly and merge by adding
counts; a row stores only its non-empty buckets. Signed indices sort like the values they hold:

====================  =======================================================================
index ``b``           values
====================  =======================================================================
0                     exactly zero (``-0.0`` too)
1                     ``0 < x < 2**-126`` (below float32's smallest normal number)
2 .. 2033             ``2**e * (1 + m/8) <= x < 2**e * (1 + (m+1)/8)`` with ``k = b - 2``,
                      ``e = k // 8 - 126``, ``m = k % 8``: ``[1, 1.125)`` is bucket 1010
2034                  ``x >= 2**128`` (float64 values beyond float32's range)
``-b``                the negative values whose magnitude is in bucket ``b``
====================  =======================================================================

NaN and +-Inf are in no bucket (the statistics' ``nan`` and ``inf`` count them). A float16,
bfloat16 or float32 value has the bucket of its exact float32 value: ``b = (bits >> 20) - 6``
on the float32 bit pattern's magnitude, which is how the graph computes it.

Quantiles: the q-quantile of the counted values (numpy's ``method="lower"``: the value of rank
``floor(q * (n - 1))``) lies in one bucket; :func:`quantiles` returns that bucket's harmonic
midpoint ``2 lo hi / (lo + hi)``, within :data:`RELATIVE_ERROR` (1/17, 5.9%) of the true value
for every bucket but 1 and 2034 (and exactly 0 for bucket 0). This is DDSketch's guarantee
(Masson et al., VLDB 2019), with its linearly interpolated index.

Example::

    >>> h = LogHistogram.of(np.array([0.0, 1.0, 1.1, -3.0]))
    >>> h.index.tolist(), h.count.tolist()
    ([-1022, 0, 1010], [1, 1, 2])
    >>> float(h.quantiles([0.5])[0])   # rank floor(0.5 * 3) = 1: the zero
    0.0
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

#: Buckets per power of two.
PER_OCTAVE = 8
#: The bucket of values in (0, 2**-126) and the bucket of values >= 2**128 (float64 only).
FLOOR, CEIL = 1, 2034
#: Largest index; indices lie in [-MAX_INDEX, MAX_INDEX].
MAX_INDEX = CEIL
#: The relative error bound of :func:`quantiles` (every bucket but FLOOR and CEIL).
RELATIVE_ERROR = 1 / 17
#: The smallest float32 normal number: FLOOR's upper edge.
TINY = 2.0 ** -126
#: The bucket holding 1.0 (for readers decoding by hand).
ONE = 1010
#: The columns of a statistics part (format version 4) that hold a row's histogram.
COLUMNS = ("hist_bucket", "hist_count")


def bucket_index(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket index int16, finite mask) of every value of ``x`` (any float dtype). A
    non-finite value's index is meaningless: mask it out."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        bits = np.ascontiguousarray(x).view(np.uint64)
        mag = bits & np.uint64(0x7FFF_FFFF_FFFF_FFFF)
        # the same index for a double: 8 * (exponent - 1023 + 126) + m + 2, clamped to FLOOR..CEIL
        k = np.clip((mag >> np.uint64(49)).astype(np.int64) - 7174, FLOOR, CEIL)
        finite = (mag >> np.uint64(52)) != 0x7FF
        negative = (bits >> np.uint64(63)).astype(bool)
    else:
        bits = np.ascontiguousarray(x.astype(np.float32, copy=False)).view(np.uint32)
        mag = bits & np.uint32(0x7FFF_FFFF)
        k = np.maximum((mag >> np.uint32(20)).astype(np.int64) - 6, FLOOR)  # subnormals: FLOOR
        finite = (mag >> np.uint32(23)) != 0xFF
        negative = (bits >> np.uint32(31)).astype(bool)
    k = np.where(mag == 0, 0, k)
    return np.where(negative, -k, k).astype(np.int16), finite


def bucket_edges(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) value edges of buckets ``index``, low < high except bucket 0 ([0, 0]).
    A positive bucket holds [low, high); a negative one (low, high]; FLOOR's low is 0
    (exclusive), CEIL's high is inf."""
    b = np.asarray(index, np.int64)
    a = np.abs(b)
    k = np.maximum(a - 2, 0)
    e, m = k // PER_OCTAVE - 126, k % PER_OCTAVE
    lo = np.where(a >= 2, np.ldexp(1.0 + m / PER_OCTAVE, e), 0.0)
    hi = np.where(a >= 2, np.ldexp(1.0 + (m + 1) / PER_OCTAVE, e), 0.0)
    lo = np.where(a == CEIL, 2.0 ** 128, lo)
    hi = np.where(a == CEIL, np.inf, np.where(a == FLOOR, TINY, hi))
    return np.where(b < 0, -hi, lo), np.where(b < 0, -lo, hi)


def bucket_value(index: np.ndarray) -> np.ndarray:
    """The value that stands for each bucket: the harmonic midpoint of its magnitude edges (0
    for bucket 0, half of 2**-126 for FLOOR, 2**128 for CEIL), signed."""
    b = np.asarray(index, np.int64)
    lo, hi = bucket_edges(np.abs(b))
    with np.errstate(invalid="ignore", divide="ignore"):
        mid = np.where(hi > lo, 2 * lo * hi / (lo + hi), lo)
    mid = np.where(np.abs(b) == FLOOR, TINY / 2, np.where(np.abs(b) == CEIL, 2.0 ** 128, mid))
    return np.sign(b) * mid


@dataclass(frozen=True)
class LogHistogram:
    """The non-empty buckets of one histogram: ``index`` (int16, ascending) and ``count``
    (int64, > 0), as a statistics row's ``hist_bucket`` / ``hist_count`` hold them."""
    index: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray) -> "LogHistogram":
        """The histogram of the finite values of ``x``."""
        idx, finite = bucket_index(np.ravel(x))
        index, count = np.unique(idx[finite], return_counts=True)
        return cls(index.astype(np.int16), count.astype(np.int64))

    @classmethod
    def from_lists(cls, index: Iterable[int] | None, count: Iterable[int] | None) -> "LogHistogram":
        """From a statistics row's lists (None: no histogram, empty), sorted and merged, so
        rows from any writer or query compare."""
        i = np.asarray([] if index is None else list(index), np.int64)
        c = np.asarray([] if count is None else list(count), np.int64)
        if len(i) != len(c):
            raise ValueError(f"a histogram's buckets ({len(i)}) and counts ({len(c)}) differ in "
                             "length")
        return merge([cls(i.astype(np.int16), c)])

    @property
    def total(self) -> int:
        return int(self.count.sum())

    def __add__(self, other: "LogHistogram") -> "LogHistogram":
        return merge([self, other])

    def quantiles(self, q: Sequence[float] | np.ndarray) -> np.ndarray:
        """See :func:`quantiles`."""
        return quantiles(self.index, self.count, q)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of each non-empty bucket."""
        return bucket_edges(self.index)


def merge(hists: Iterable[LogHistogram]) -> LogHistogram:
    """The sum of ``hists`` (counts of equal buckets added),
    buckets ascending, empty ones dropped."""
    hs = list(hists)
    if not hs:
        return LogHistogram(np.zeros(0, np.int16), np.zeros(0, np.int64))
    i = np.concatenate([np.asarray(h.index, np.int64) for h in hs])
    c = np.concatenate([np.asarray(h.count, np.int64) for h in hs])
    keys, inv = np.unique(i, return_inverse=True)
    sums = np.bincount(inv, weights=c, minlength=len(keys)).astype(np.int64)
    keep = sums > 0
    return LogHistogram(keys[keep].astype(np.int16), sums[keep])


def quantiles(index: np.ndarray, count: np.ndarray, q: Sequence[float] | np.ndarray) -> np.ndarray:
    """The ``q``-quantiles (each in [0, 1]) of the values counted in buckets ``index`` with
    ``count``: the stand-in value (:func:`bucket_value`) of the bucket holding the value of
    rank ``floor(q * (n - 1))``, within :data:`RELATIVE_ERROR` of it (not for FLOOR or CEIL
    buckets). NaN where the histogram is empty. ``index`` need not be sorted."""
    qs = np.asarray(q, np.float64)
    if qs.size and (not np.all(np.isfinite(qs)) or qs.min() < 0 or qs.max() > 1):
        raise ValueError(f"quantiles must lie in [0, 1], got {np.asarray(q).tolist()}")
    i = np.asarray(index, np.int64)
    c = np.asarray(count, np.int64)
    order = np.argsort(i, kind="stable")
    i, c = i[order], c[order]
    n = int(c.sum())
    if n <= 0:
        return np.full(qs.shape, np.nan)
    rank = np.floor(qs * (n - 1)).astype(np.int64)
    # the first bucket whose running count passes rank
    at = np.searchsorted(np.cumsum(c), rank, side="right")
    return bucket_value(i[np.minimum(at, len(i) - 1)])


def rows_of(splits: np.ndarray, *arrays: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows ``rows`` of ragged arrays (``arrays`` cut by ``splits``, R + 1 offsets): the new
    splits, then each array's values of those rows in that order."""
    splits = np.asarray(splits, np.int64)
    rows = np.asarray(rows, np.int64)
    starts, ends = splits[rows], splits[rows + 1]
    lengths = ends - starts
    new = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    take = np.repeat(starts - new[:-1], lengths) + np.arange(new[-1], dtype=np.int64)
    return (new, *(np.asarray(a)[take] for a in arrays))


def concat_rows(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Statistics rows one after another: each part is (values [R, ...], splits [R + 1],
    bucket index [N], count [N]), as the hook fetches them."""
    values = np.concatenate([np.asarray(p[0]) for p in parts])
    sizes = np.concatenate([np.diff(np.asarray(p[1], np.int64)) for p in parts])
    splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return (values, splits, np.concatenate([np.asarray(p[2]) for p in parts]),
            np.concatenate([np.asarray(p[3]) for p in parts]))


def sparse_of(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(splits [n + 1], bucket index int16 [N], count int32 [N]): the histograms of the finite
    values of each of ``arrays``, one row each, in one ``np.unique`` (no loop over arrays).

    >>> [a.tolist() for a in sparse_of([np.array([1.0, -1.0, 1.0]), np.zeros(0)])]
    [[0, 2, 2], [-1010, 1010], [1, 2]]
    """
    flat = [np.ravel(a) for a in arrays]
    row = np.repeat(np.arange(len(flat), dtype=np.int64), [a.size for a in flat])
    both = [a.astype(np.float64) for a in flat] if any(a.dtype == np.float64 for a in flat) \
        else flat
    index, finite = bucket_index(np.concatenate(both) if both else np.zeros(0, np.float32))
    width = 2 * MAX_INDEX + 1
    keys, count = np.unique(row[finite] * width + index[finite] + MAX_INDEX, return_counts=True)
    splits = np.concatenate(
        [[0], np.cumsum(np.bincount(keys // width, minlength=len(flat)))]).astype(np.int64)
    return splits, (keys % width - MAX_INDEX).astype(np.int16), count.astype(np.int32)


def empty_rows(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` empty histograms in the form of :func:`sparse_of`."""
    return np.zeros(n + 1, np.int64), np.zeros(0, np.int16), np.zeros(0, np.int32)
