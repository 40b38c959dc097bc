"""Exact in-graph statistics in stock TensorFlow ops: the reference ``hooks.fast_stats`` matches.

``tensor_stats`` computes one tensor's [G, 9] statistics (STAT_COLUMNS order) and histograms
per group, masked for NaN/Inf with centered second moments; ``build_stats`` fuses them for
every captured tensor into one ``StatsFetch`` (tests compare ``fast_stats`` against it), and
``fast_stats`` falls back to ``tensor_stats`` when a big tensor holds NaN/Inf. ``segments``
(the group of each sample) and ``hist_sample`` (what a histogram counts, FORMAT.md) are the
pieces both paths share, so the two agree by construction.

Example::

    values, hist_range, hist = tensor_stats(x, groups, bins=30)   # G = 1 + K rows: all, each group
    fetch = build_stats(captured, groups, bins=30)                 # StatsFetch, rows in capture order
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import tensorflow as tf

from inspector import format as fmt
from inspector.format import STAT_COLUMNS

from .capture import Captured, Groups, as_groups, grouping_of


def segments(n: tf.Tensor, groups: Groups | None) -> tuple[tf.Tensor, int]:
    """Segment id per sample: its group 0..K-1, K for samples in no group or past the labels'
    batch (a tensor whose batch differs); K + 1 segments. Without groups: 0, one segment."""
    if groups is None:
        return tf.zeros([n], tf.int32), 1
    k = groups.count
    seg = tf.concat([groups.ids, tf.fill([n], k)], 0)[:n]  # never fails, whatever n is
    return seg, k + 1


def tensor_stats(x: tf.Tensor, groups: Groups | tf.Tensor | None, bins: int
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Statistics of ``x`` per group, computed in the graph.

    Returns ``values`` [G, 9] float64 in STAT_COLUMNS order, ``hist_range`` [G, 2] and
    ``hist`` [G, bins] int32, with G = 1 + K (all, then each of the K groups) when ``groups``
    is given (x's leading dim is the batch; a ``capture.group_ids`` tensor: positive,
    negative) else 1 (all). mean/std/min/max/l2 cover finite values;
    histograms use the 'all' group's finite range for every group so they overlay, and
    count finite values only, so each sums to count - nan - inf (of a subsample of each
    sample for tensors above ``HIST_MAX_ELEMENTS``, see ``format.hist_sample``).
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
    centered = tf.where(finite, xr - tf.cast(tf.gather(mean_seg, seg), xr.dtype)[:, None], tf.zeros_like(xr))
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
    values = tf.stack([count, tf.where(has, mean, nanv), std, tf.where(has, mins, nanv), tf.where(has, maxs, nanv),
                       l2, zs / tf.maximum(count, 1.0), nans, nonfinite - nans], axis=1)
    # Histogram over the 'all' group's finite range (numpy's convention for an empty range).
    lo = tf.where(has[0], mins[0], 0.0)
    hi = tf.where(has[0], maxs[0], 1.0)
    lo, hi = tf.where(hi > lo, lo, lo - 0.5), tf.where(hi > lo, hi, hi + 0.5)
    # large tensors: every k-th block of each sample (FORMAT.md)
    xf, finite = hist_sample(xf), hist_sample(finite)
    scaled = (tf.cast(xf, f64) - lo) / (hi - lo) * bins
    idx = tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0, bins - 1) + bins * seg[:, None]
    idx = tf.where(finite, idx, tf.fill(tf.shape(idx), nseg * bins))  # non-finite: a discarded bin
    counts = tf.math.bincount(tf.reshape(idx, [-1]), minlength=nseg * bins + 1, maxlength=nseg * bins + 1)
    hist = tf.reshape(counts[: nseg * bins], [nseg, bins])
    if nseg > 1:
        hist = tf.concat([tf.reduce_sum(hist, 0, keepdims=True), hist[:-1]], 0)
    hist_range = tf.tile(tf.stack([lo, hi])[None], [nseg, 1])
    return values, hist_range, tf.cast(hist, tf.int32)


@dataclass
class StatsFetch:
    """The fused statistics fetch and what each of its rows is."""
    values: tf.Tensor
    hist_range: tf.Tensor
    hist: tf.Tensor
    rows: list[tuple[str, str, str]]  # (tensor, kind, group)


def build_stats(captured: Sequence[Captured], groups: Groups | tf.Tensor | None, bins: int) -> StatsFetch | None:
    """One [R, 9] matrix, [R, 2] ranges and [R, bins] histograms for every tensor, kind and group
    (tensors with their own ``Captured.grouping``, a tower's, by it)."""
    parts, rows = [], []
    groups = as_groups(groups)
    with tf.name_scope("tf_inspector/stats"):
        for cap in captured:
            for kind, t in (("forward", cap.tensor), ("gradient", cap.gradient)):
                if t is None:
                    continue
                g = grouping_of(cap, groups)
                parts.append(tensor_stats(t, g, bins))
                rows += [(cap.name, kind, grp) for grp in ("all", *(g.names if g is not None else ()))]
        if not parts:
            return None
        values, ranges, hists = (tf.concat([p[i] for p in parts], 0) for i in range(3))
    assert len(STAT_COLUMNS) == 9
    return StatsFetch(values, ranges, hists, rows)


def hist_sample(rows: tf.Tensor) -> tf.Tensor:
    """[n, e] -> what the histogram counts: every k-th block of HIST_BLOCK elements of each row
    (every k-th element if e is not a multiple of HIST_BLOCK), k = ceil(n * e / HIST_MAX_ELEMENTS);
    see ``inspector.format.hist_sample``. k = 1 (small tensors) slices nothing: StridedSlice then
    forwards its input, no copy."""
    k = tf.maximum((tf.size(rows) + fmt.HIST_MAX_ELEMENTS - 1) // fmt.HIST_MAX_ELEMENTS, 1)
    n, b = tf.shape(rows)[0], fmt.HIST_BLOCK

    def blocks():  # a gather of whole blocks: memcpy per block (a strided slice copies element-wise)
        r3 = tf.reshape(rows, tf.stack([n, -1, b]))
        return tf.reshape(tf.gather(r3, tf.range(0, tf.shape(r3)[1], k), axis=1), tf.stack([n, -1]))

    e = rows.shape[1]
    if e is not None:  # decided when the graph is built, as it mostly can be
        return blocks() if e % b == 0 else rows[:, ::k]
    return tf.cond(tf.equal(tf.shape(rows)[1] % b, 0), blocks, lambda: rows[:, ::k])
