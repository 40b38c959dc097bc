"""Exact in-graph statistics in stock TensorFlow ops: the reference ``hooks.stats.fast`` matches.

``tensor_stats`` computes one tensor's [G, 9] statistics (STAT_COLUMNS order) and log-magnitude
histograms per group, masked for NaN/Inf with centered second moments; ``build_stats`` fuses
them for every captured tensor into one ``StatsFetch`` (tests compare ``fast_stats`` against
it), and ``fast_stats`` falls back to ``tensor_stats`` when a big tensor holds NaN/Inf.
``segments`` (the group of each sample), ``hist_sample`` (what a histogram counts, FORMAT.md),
``bucket_slots`` (each value's bucket, inspector/format/loghist.py) and the sparse-row helpers are
the pieces both paths share, so the two agree by construction.

A histogram leaves the graph sparse, as statistics parts store it: ``Sparse(splits, index,
count)``, row r's non-empty buckets ascending in ``index/count[splits[r]:splits[r + 1]]``.
Only the graph sees a row's dense counts (SLOTS per row), never the session's fetch.

Example::

    values, hist = tensor_stats(x, groups)      # G = 1 + K rows: all, each group; hist: Sparse
    fetch = build_stats(captured, groups)       # StatsFetch, rows in capture order
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from hooks.capture.groups import Groups, as_groups
from hooks.capture.select import grouping_of
from hooks.capture.select import Captured
from inspector.format import layout as fmt
from inspector.format import STAT_COLUMNS
from inspector.format.loghist import MAX_INDEX


def segments(n: tf.Tensor, groups: Groups | None) -> tuple[tf.Tensor, int]:
    """Segment id per sample: its group 0..K-1, K for samples in no group or past the labels'
    batch (a tensor whose batch differs); K + 1 segments. Without groups: 0, one segment."""
    if groups is None:
        return tf.zeros([n], tf.int32), 1
    k = groups.count
    seg = tf.concat([groups.ids, tf.fill([n], k)], 0)[:n]  # never fails, whatever n is
    return seg, k + 1


#: Dense histogram slots per row in the graph: bucket index + MAX_INDEX; slot SLOTS (one past
#: the last) takes NaN/Inf and is dropped.
SLOTS = 2 * MAX_INDEX + 1


class Sparse(NamedTuple):
    """Histograms of R rows, only non-empty buckets: ``splits`` int64 [R + 1], ``index``
    int32 [N] (inspector/format/loghist.py's signed bucket index), ``count`` int32 [N]."""
    splits: tf.Tensor
    index: tf.Tensor
    count: tf.Tensor


def bucket_slots(x: tf.Tensor) -> tf.Tensor:
    """Each value's histogram slot (int32, same shape): its bucket (inspector/format/loghist.py:
    sign, exponent and three leading mantissa bits of the magnitude) + MAX_INDEX, or SLOTS for
    NaN/Inf. Bit operations only, so it runs on any device and matches numpy exactly. A
    float16/bfloat16 value is taken as its exact float32 value."""
    if x.dtype == tf.float64:
        bits = tf.bitcast(x, tf.int64)
        mag = tf.bitwise.bitwise_and(bits, tf.constant(0x7FFF_FFFF_FFFF_FFFF, tf.int64))
        k = tf.clip_by_value(tf.bitwise.right_shift(mag, 49) - 7174, 1, MAX_INDEX)
        finite = mag < 0x7FF0_0000_0000_0000
    else:
        bits = tf.bitcast(tf.cast(x, tf.float32), tf.int32)
        mag = tf.bitwise.bitwise_and(bits, tf.constant(0x7FFF_FFFF, tf.int32))
        k = tf.maximum(tf.bitwise.right_shift(mag, 20) - 6, 1)  # subnormals: the floor bucket
        finite = mag < 0x7F80_0000
    k = tf.cast(tf.where(tf.equal(mag, 0), tf.zeros_like(k), k), tf.int32)
    slot = tf.where(bits < 0, MAX_INDEX - k, MAX_INDEX + k)
    return tf.where(finite, slot, tf.fill(tf.shape(slot), tf.constant(SLOTS, tf.int32)))


def dense_hist(slots: tf.Tensor, rows: tf.Tensor, n_rows: int) -> tf.Tensor:
    """[n_rows, SLOTS] int32 counts of ``slots`` (any shape) into row ``rows`` (broadcast to it);
    NaN/Inf slots dropped."""
    rows = tf.broadcast_to(rows, tf.shape(slots))
    key = tf.where(tf.equal(slots, SLOTS), tf.fill(tf.shape(slots), n_rows * SLOTS),
                   rows * SLOTS + slots)
    counts = tf.math.bincount(tf.reshape(key, [-1]), minlength=n_rows * SLOTS + 1,
                              maxlength=n_rows * SLOTS + 1, dtype=tf.int32)
    return tf.reshape(counts[: n_rows * SLOTS], [n_rows, SLOTS])


def to_sparse(dense: tf.Tensor, rows: np.ndarray | None = None) -> Sparse:
    """The non-empty buckets of ``dense`` [R, SLOTS] counts, of rows ``rows`` (ascending; None:
    all) only, row by row in that order."""
    n_rows = int(dense.shape[0]) if dense.shape[0] is not None else None
    at = tf.where(dense > 0)   # [N, 2] (row, slot), row-major: rows ascending, buckets ascending
    row = tf.cast(at[:, 0], tf.int32)
    count = tf.gather_nd(dense, at)
    index = tf.cast(at[:, 1], tf.int32) - MAX_INDEX
    if rows is not None:
        assert n_rows is not None, "rows= needs a static row count"
        new = np.full(n_rows, -1, np.int32)
        new[np.asarray(rows)] = np.arange(len(rows), dtype=np.int32)
        row = tf.gather(tf.constant(new), row)
        kept = row >= 0
        row, count, index = (tf.boolean_mask(v, kept) for v in (row, count, index))
        n_rows = len(rows)
    sizes = tf.math.bincount(row, minlength=n_rows, maxlength=n_rows, dtype=tf.int64) \
        if n_rows is not None \
        else tf.math.bincount(row, minlength=tf.shape(dense)[0], maxlength=tf.shape(dense)[0],
                              dtype=tf.int64)
    return Sparse(tf.concat([tf.zeros([1], tf.int64), tf.cumsum(sizes)], 0), index, count)


def concat_sparse(parts: Sequence[Sparse]) -> Sparse:
    """The rows of ``parts`` one after another."""
    if len(parts) == 1:
        return parts[0]
    lengths = [p.splits.shape[0] for p in parts]
    if None not in lengths:
        return _concat_static(parts, lengths)
    # the same with the lengths known at run time: one Size op per part, the rest a fixed few
    sizes = tf.stack([tf.size(p.splits, out_type=tf.int64) for p in parts])
    ends = tf.cumsum(sizes)
    joined = tf.concat([p.splits for p in parts], 0)
    lasts = tf.gather(joined, ends - 1)
    offsets = tf.cumsum(lasts, exclusive=True)
    shifted = joined + tf.repeat(offsets, sizes)
    starts = ends[:-1]   # where parts after the first begin: their leading 0 is dropped
    drop = tf.scatter_nd(starts[:, None], tf.ones_like(starts, tf.bool), ends[-1:])
    return Sparse(tf.boolean_mask(shifted, tf.logical_not(drop)),
                  tf.concat([p.index for p in parts], 0), tf.concat([p.count for p in parts], 0))


def _concat_static(parts: Sequence[Sparse], lengths: Sequence[int]) -> Sparse:
    """:func:`concat_sparse` of parts whose row counts are static: a fixed handful of ops
    whatever the number of parts (ops per part made tracing a model's capture cost seconds)."""
    ends = np.cumsum(lengths)
    joined = tf.concat([p.splits for p in parts], 0)
    lasts = tf.gather(joined, tf.constant(ends - 1))
    offsets = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(lasts)[:-1]], 0)
    # each row's part is static: one gather of the offsets (tf.repeat is some 15 ops)
    part_of_row = np.repeat(np.arange(len(parts), dtype=np.int32), np.asarray(lengths, np.int64))
    shifted = joined + tf.gather(offsets, tf.constant(part_of_row))
    # every part's splits start with 0, the end of the part before: kept for the first only
    firsts = np.concatenate([[0], ends[:-1]])
    keep = np.setdiff1d(np.arange(ends[-1]), firsts[1:])
    return Sparse(tf.gather(shifted, tf.constant(keep)), tf.concat([p.index for p in parts], 0),
                  tf.concat([p.count for p in parts], 0))


def concat_stats(parts: Sequence[Sequence[tf.Tensor]]) -> tuple[tf.Tensor, ...]:
    """Statistics fetches one after another: each part (values, hist splits, index, count),
    as ``StatsFetch.tensors`` gives them."""
    return (tf.concat([p[0] for p in parts], 0), *concat_sparse([Sparse(*p[1:]) for p in parts]))


def take_sparse(h: Sparse, rows: np.ndarray) -> Sparse:
    """Rows ``rows`` (a static int array, any order, repeats allowed) of ``h``."""
    rt = tf.RaggedTensor.from_row_splits(tf.stack([h.index, h.count], 1), h.splits, validate=False)
    got = tf.gather(rt, tf.constant(np.asarray(rows, np.int64)))
    return Sparse(tf.cast(got.row_splits, tf.int64), got.values[:, 0], got.values[:, 1])


def tensor_stats(x: tf.Tensor, groups: Groups | tf.Tensor | None) -> tuple[tf.Tensor, Sparse]:
    """Statistics of ``x`` per group, computed in the graph.

    Returns ``values`` [G, 9] float64 in STAT_COLUMNS order and the G rows' log-magnitude
    histograms (:class:`Sparse`), with G = 1 + K (all, then each of the K groups) when ``groups``
    is given (x's leading dim is the batch; a ``capture.group_ids`` tensor: positive,
    negative) else 1 (all). mean/std/min/max/l2 cover finite values; histograms count finite
    values only, so each sums to count - nan - inf (of a subsample of each sample for tensors
    above ``HIST_MAX_ELEMENTS``, see ``format.hist_sample``).
    """
    if x.dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    f64 = tf.float64
    groups = as_groups(groups)
    n = tf.shape(x)[0] if groups is not None else tf.constant(1)
    xr = tf.reshape(x, tf.stack([n, -1]))
    seg, nseg = segments(n, groups)
    finite = tf.math.is_finite(xr)
    xf = tf.where(finite, xr, tf.zeros_like(xr))
    per_elems = tf.cast(tf.shape(xr)[1], f64)
    c = tf.cast(tf.math.count_nonzero(finite, 1), f64)
    s = tf.cast(tf.reduce_sum(xf, 1), f64)
    nan = tf.cast(tf.math.count_nonzero(tf.math.is_nan(xr), 1), f64)
    zeros = tf.cast(tf.math.count_nonzero(tf.equal(xr, 0), 1), f64)
    big = tf.constant(float("inf"), xr.dtype)
    mn = tf.cast(tf.reduce_min(tf.where(finite, xr, tf.fill(tf.shape(xr), big)), 1), f64)
    mx = tf.cast(tf.reduce_max(tf.where(finite, xr, tf.fill(tf.shape(xr), -big)), 1), f64)

    def ssum(v):
        return tf.math.unsorted_segment_sum(v, seg, nseg)

    samples, cs, ss = ssum(tf.ones_like(c)), ssum(c), ssum(s)
    mean_seg = ss / tf.maximum(cs, 1.0)
    # Two passes (deviation from the segment mean) keep std exact when |mean| >> std.
    centered = tf.where(finite, xr - tf.cast(tf.gather(mean_seg, seg), xr.dtype)[:, None],
                        tf.zeros_like(xr))
    m2s = ssum(tf.cast(tf.reduce_sum(tf.square(centered), 1), f64))
    mins = tf.math.unsorted_segment_min(mn, seg, nseg)
    maxs = tf.math.unsorted_segment_max(mx, seg, nseg)
    nans, zs = ssum(nan), ssum(zeros)
    nonfinite = ssum(per_elems - c)
    if nseg > 1:  # rows: all, then each group (the last segment, in no group, only in all)
        c_all, s_all = tf.reduce_sum(cs), tf.reduce_sum(ss)
        mean_all = s_all / tf.maximum(c_all, 1.0)
        m2_all = tf.reduce_sum(m2s + cs * tf.square(mean_seg - mean_all))
        pick = lambda v, total: tf.concat([[total], v[:-1]], 0)  # noqa: E731
        samples = pick(samples, tf.reduce_sum(samples))
        cs, mean, m2 = pick(cs, c_all), pick(mean_seg, mean_all), pick(m2s, m2_all)
        mins, maxs = pick(mins, tf.reduce_min(mins)), pick(maxs, tf.reduce_max(maxs))
        nans, zs, nonfinite = (pick(v, tf.reduce_sum(v)) for v in (nans, zs, nonfinite))
    else:
        mean, m2 = mean_seg, m2s
    has = cs > 0
    nanv = tf.fill(tf.shape(cs), tf.constant(float("nan"), f64))
    count = samples * per_elems
    std = tf.where(has, tf.sqrt(m2 / tf.maximum(cs, 1.0)), nanv)
    l2 = tf.sqrt(m2 + cs * tf.square(mean))
    values = tf.stack([count, tf.where(has, mean, nanv), std, tf.where(has, mins, nanv),
                       tf.where(has, maxs, nanv), l2, zs / tf.maximum(count, 1.0), nans,
                       nonfinite - nans], axis=1)
    # large tensors: every k-th block of each sample (FORMAT.md); each segment's own rows
    dense = dense_hist(bucket_slots(hist_sample(xr)), seg[:, None], nseg)
    if nseg > 1:
        dense = tf.concat([tf.reduce_sum(dense, 0, keepdims=True), dense[:-1]], 0)
    return values, to_sparse(dense)


@dataclass
class StatsFetch:
    """The fused statistics fetch and what each of its rows is."""
    values: tf.Tensor
    hist: Sparse
    rows: list[tuple[str, str, str]]  # (tensor, kind, group)

    def tensors(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """What a session fetches: (values, hist splits, hist index, hist count)."""
        return (self.values, *self.hist)


def build_stats(captured: Sequence[Captured],
                groups: Groups | tf.Tensor | None) -> StatsFetch | None:
    """One [R, 9] matrix and R histograms for every tensor, kind and group (tensors with their
    own ``Captured.grouping``, a tower's, by it)."""
    parts, rows = [], []
    groups = as_groups(groups)
    with tf.name_scope("tf_inspector/stats"):
        for cap in captured:
            for kind, t in (("forward", cap.tensor), ("gradient", cap.gradient)):
                if t is None:
                    continue
                g = grouping_of(cap, groups)
                parts.append(tensor_stats(t, g))
                rows += [(cap.name, kind, grp)
                         for grp in ("all", *(g.names if g is not None else ()))]
        if not parts:
            return None
        values = tf.concat([p[0] for p in parts], 0)
        hist = concat_sparse([p[1] for p in parts])
    assert len(STAT_COLUMNS) == 9
    return StatsFetch(values, hist, rows)


def hist_sample(rows: tf.Tensor) -> tf.Tensor:
    """[n, e] -> what the histogram counts: every k-th block of HIST_BLOCK elements of each row
    (every k-th element if e is not a multiple of HIST_BLOCK), k = ceil(n * e / HIST_MAX_ELEMENTS);
    see ``inspector.format.hist_sample``. k = 1 (small tensors) slices nothing: StridedSlice then
    forwards its input, no copy."""
    k = tf.maximum((tf.size(rows) + fmt.HIST_MAX_ELEMENTS - 1) // fmt.HIST_MAX_ELEMENTS, 1)
    n, b = tf.shape(rows)[0], fmt.HIST_BLOCK

    # a gather of whole blocks: memcpy per block (a strided slice copies element-wise)
    def blocks():
        r3 = tf.reshape(rows, tf.stack([n, -1, b]))
        return tf.reshape(tf.gather(r3, tf.range(0, tf.shape(r3)[1], k), axis=1), tf.stack([n, -1]))

    e = rows.shape[1]
    if e is not None:  # decided when the graph is built, as it mostly can be
        return blocks() if e % b == 0 else rows[:, ::k]
    return tf.cond(tf.equal(tf.shape(rows)[1] % b, 0), blocks, lambda: rows[:, ::k])
