"""Fast in-graph statistics: the same [R, 9] matrix and histograms as ``exact_stats.tensor_stats``,
with far fewer ops and fewer passes over memory.

Why: one ``tensor_stats`` subgraph is ~80 ops and ~10 passes (some in float64) per tensor.
On a ResNet the hook captures ~400 tensors and gradients: 30k ops whose per-op executor
cost, Python construction time and memory passes dwarf the arithmetic. So:

- **fused kernel** (``hooks/native``, compiled once per machine): one op per tensor reads
  it once for per-sample moments (count, mean, squared deviations, min, max, zeros, NaNs;
  NaN/Inf masked), buckets its histogram subsample and returns its all / group rows final
  (``finish=True``); a concat joins them. Several times less op time than the
  stock-op paths below (bench/README.md), which are the fallback where no C++ compiler is available:
- **small tensors** (static shape, <= ``SMALL_MAX`` elements) are concatenated into one
  float64 vector and reduced with sorted segment ops: a fixed ~60 ops for all of them, exact
  (masked for NaN/Inf, centered second moments);
- **big tensors** take one pass per statistic in their own dtype: per-sample sums of
  deviations from a per-sample pivot (the sample's first element, so the variance does not
  cancel when |mean| >> std), min, max, zero count, and one bincount of every sample's
  bucket slots (``exact_stats.bucket_slots``) offset by its group's row.
  If any big tensor holds a NaN/Inf (its sums are not finite), one ``tf.cond`` switches all
  of them to the exact masked ``exact_stats.tensor_stats``.

Example::

    fetch = build_stats(captured, groups)   # StatsFetch, rows in capture order
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import tensorflow as tf

from hooks import native
from hooks.capture.feeds import accelerator, value_source
from hooks.capture.groups import Groups, as_groups
from hooks.capture.select import grouping_of
from hooks.stats.exact import (Sparse, StatsFetch, bucket_slots, concat_sparse, dense_hist,
                               hist_sample, segments, take_sparse, tensor_stats, to_sparse)
from inspector.format import layout as fmt

#: Tensors with at most this many elements go through the fused (concatenated) path.
SMALL_MAX = 1 << 15
F64 = tf.float64
#: dtypes the fused kernels read (stats_ops.cc)
NATIVE_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class _Item:
    """One (tensor, kind): its value, the groups of its samples (None: not split), its rows."""

    def __init__(self, x: tf.Tensor, grouping: Groups | None, name: str, kind: str) -> None:
        self.x, self.grouping, self.name, self.kind = x, grouping, name, kind
        self.batched = grouping is not None
        self.groups = ("all", *grouping.names) if grouping is not None else ("all",)

    @property
    def small(self) -> bool:
        s = self.x.shape
        # never above HIST_MAX_ELEMENTS: the fused path histograms every element
        return (s.is_fully_defined() and s.num_elements() <= min(SMALL_MAX, fmt.HIST_MAX_ELEMENTS)
                and (not self.batched or s.rank >= 1))


def build_stats(captured: Sequence, groups: Groups | tf.Tensor | None, use_native: bool = True):
    """One [R, 9] float64 matrix and R sparse histograms; see exact_stats.build_stats.

    ``groups``: the run's groups (or a ``capture.group_ids`` tensor: positive/negative);
    tensors with their own (``Captured.grouping``: a tower's) are computed in a pass of their
    own per grouping. ``use_native=False`` forces the stock-op paths (tests compare the two)."""
    groups = as_groups(groups)
    items = [_Item(t, grouping_of(cap, groups), cap.name, kind)
             for cap in captured
             for kind, t in (("forward", cap.tensor), ("gradient", cap.gradient)) if t is not None]
    if not items:
        return None
    rows = [(it.name, it.kind, g) for it in items for g in it.groups]
    # One tensor under several names (a gradient passed through an add, gate_gradients'
    # Identity ops): computed once, its rows repeated.
    first: dict[tuple[str, int], _Item] = {}
    source = {id(it): first.setdefault((value_source(it.x).name, id(it.grouping)), it)
              for it in items}
    unique = list(first.values())
    lib = native.library() if use_native else None
    # Tensors on an accelerator (or anywhere, unpinned, on a machine with a GPU) never go
    # through the CPU-only fused kernel: that would copy each of them to the host every
    # statistics step. Stock ops beside them reduce them there; only the rows cross.
    gpu = gpu_visible()
    with tf.name_scope("tf_inspector/stats"):
        parts, order = [], []
        # one pass per grouping: the run's, each tower's (items without groups join the first)
        by_grouping: dict[int, list[_Item]] = {}
        for it in unique:
            by_grouping.setdefault(id(it.grouping) if it.batched else 0, []).append(it)
        batches = list(by_grouping.values())
        # unsplit tensors ride along with one grouping
        if 0 in by_grouping and len(by_grouping) > 1:
            batches = [by_grouping[0] + by_grouping[k] if i == 0 else by_grouping[k]
                       for i, k in enumerate(k for k in by_grouping if k != 0)]
        for batch in batches:
            g = next((it.grouping for it in batch if it.batched), None)
            on_host = [it for it in batch
                       if accelerator(it.x) is None and not (gpu and not it.x.device)]
            devices: dict[str, list[_Item]] = {}
            for it in batch:
                if it not in on_host:
                    devices.setdefault(accelerator(it.x) or "", []).append(it)
            fused = [it for it in on_host if lib is not None and it.x.dtype in NATIVE_DTYPES]
            rest = [it for it in on_host if not (lib is not None and it.x.dtype in NATIVE_DTYPES)]
            if fused:
                parts += _native_stats(fused, g, lib)
                order += fused
            for dev, items_here in [("", rest), *devices.items()]:
                with tf.device(dev) if dev else contextlib.nullcontext():
                    parts += _stock_stats(items_here, g, order)
        # the rows' assembly runs on the host: only rows cross from a device, and ragged gathers are
        # host ops
        with tf.device("/cpu:0"):
            if len(parts) == len(order):
                # a part per item (every part covers one or more, in `order`): joined in capture
                # order, a repeated tensor's part listed again, so no gather runs after the concat
                part_of = {id(it): p for it, p in zip(order, parts)}
                parts = [part_of[id(source[id(it)])] for it in items]
                values = tf.concat([p[0] for p in parts], 0) if len(parts) > 1 else parts[0][0]
                return StatsFetch(values, concat_sparse([p[1] for p in parts]), rows)
            values = tf.concat([p[0] for p in parts], 0) if len(parts) > 1 else parts[0][0]
            hist = concat_sparse([p[1] for p in parts])
            # rows come out grouped by path; put them back in capture order
            start, pos = {}, 0
            for it in order:
                start[id(it)] = pos
                pos += len(it.groups)
            perm = np.concatenate([start[id(source[id(it)])] + np.arange(len(it.groups))
                                   for it in items]).astype(np.int32)
            if not np.array_equal(perm, np.arange(len(perm))):
                values, hist = tf.gather(values, perm), take_sparse(hist, perm)
    return StatsFetch(values, hist, rows)


def gpu_visible() -> bool:
    """Whether this process sees a GPU: unpinned ops are then placed on it by TensorFlow."""
    return bool(tf.config.list_physical_devices("GPU"))


def _stock_stats(items: list[_Item], groups: Groups | None, order: list[_Item]) -> list:
    """The stock-op paths for ``items`` (small ones concatenated, big ones one by one), in the
    current device scope; appends to ``order`` the items in the order of the returned parts."""
    small = [it for it in items if it.small]
    big = [it for it in items if not it.small]
    order += small + big
    return ([_small_stats(small, groups)] if small else []) \
        + ([_big_stats(big, groups)] if big else [])


# ---- shared finishing: per-leaf partials -> the statistics matrix ---------------------------
def _finish(count, c, s, m2, mn, mx, zeros, nans, nonfinite):
    """[O, 9] float64 in STAT_COLUMNS order from per-row aggregates (float64 [O] each)."""
    has = c > 0
    nanv = tf.fill(tf.shape(c), tf.constant(float("nan"), F64))
    mean = s / tf.maximum(c, 1.0)
    std = tf.where(has, tf.sqrt(tf.maximum(m2, 0.0) / tf.maximum(c, 1.0)), nanv)
    l2 = tf.sqrt(tf.maximum(m2, 0.0) + c * tf.square(mean))
    return tf.stack([count, tf.where(has, mean, nanv), std, tf.where(has, mn, nanv),
                     tf.where(has, mx, nanv), l2, zeros / tf.maximum(count, 1.0), nans,
                     nonfinite - nans], axis=1)


# ---- output rows: leaves (one group of one item) combine into each batched item's all row --
class _Layout:
    """Static output rows of some items: a batched item has [all, group 0 .. group K-1, none]
    rows (none: samples in no group or past the labels' batch, dropped at the end), an
    unbatched one [all]. Every row's parent is its item's all row."""

    def __init__(self, items: list[_Item], ngroups: int) -> None:
        self.base, keep, parent, n_out = [], [], [], 0
        for it in items:
            self.base.append(n_out)
            k = ngroups + 2 if it.batched else 1
            keep += list(range(n_out, n_out + k - 1)) if it.batched else [n_out]
            parent += [n_out] * k
            n_out += k
        self.n_out, self.keep = n_out, np.asarray(keep, np.int32)
        self.parent = np.asarray(parent, np.int32)
        self.combine = np.zeros(n_out, bool)  # the all rows of batched items
        self.combine[[b for b, it in zip(self.base, items) if it.batched]] = True

    def up(self, v: tf.Tensor, op=tf.math.unsorted_segment_sum) -> tf.Tensor:
        """Each combined (all) row: ``op`` over its leaves; other rows unchanged."""
        return tf.where(tf.constant(self.combine), op(v, tf.constant(self.parent), self.n_out), v)

    def finish(self, values: tf.Tensor, dense: tf.Tensor) -> tuple[tf.Tensor, Sparse]:
        """Drop padding rows: (values, sparse histograms) of the rows kept. ``dense``: [n_out,
        SLOTS] counts in which every all row already holds its leaves'."""
        return tf.gather(values, tf.constant(self.keep)), to_sparse(dense, self.keep)


def _combine_leaves(lay: _Layout, c, s, m2, mn, mx, zeros, nans, elems):
    """Per-leaf float64 aggregates ([n_out] each: finite count, sum, centred m2, min, max, zeros,
    NaNs, elements) -> values [n_out, 9]."""
    parent = tf.constant(lay.parent)
    leaf_mean = s / tf.maximum(c, 1.0)
    c_all, s_all = lay.up(c), lay.up(s)
    mean_all = s_all / tf.maximum(c_all, 1.0)
    # Chan et al.'s parallel variance
    spread = c * tf.square(leaf_mean - tf.gather(mean_all, parent))
    m2_all = tf.where(tf.constant(lay.combine),
                      tf.math.unsorted_segment_sum(m2 + spread, parent, lay.n_out), m2)
    mn_all, mx_all = lay.up(mn, tf.math.unsorted_segment_min), \
        lay.up(mx, tf.math.unsorted_segment_max)
    nans_all, zeros_all, elems_all = lay.up(nans), lay.up(zeros), lay.up(elems)
    # count: samples x per-sample elements (what exact_stats.tensor_stats reports, padding included)
    return _finish(elems_all, c_all, s_all, m2_all, mn_all, mx_all, zeros_all, nans_all,
                   elems_all - c_all)


def _leaf_of_row(lay: _Layout, items: list[_Item], item: tf.Tensor, sample: tf.Tensor,
                 groups: Groups | None) -> tf.Tensor:
    """The output row of each data row: its item's group row or none row (batched) or its all
    row (the stock-op path; the fused kernel returns the same ids itself)."""
    base = tf.gather(tf.constant(np.asarray(lay.base, np.int32)), item)
    batched = np.asarray([it.batched for it in items])
    if groups is None or not batched.any():
        return base
    gid = groups.ids
    # past the labels: none
    seg = tf.gather(tf.concat([gid, [groups.count]], 0), tf.minimum(sample, tf.size(gid)))
    return base + tf.where(tf.gather(tf.constant(batched), item), 1 + seg, tf.zeros_like(seg))


# ---- fused kernel: one pass for moments, one over the (cached) histogram subsample ---------
#: one kernel op per captured tensor (False: one op over all of them, for bench_hook's comparison)
PER_TENSOR_OPS = True


def _native_stats(items: list[_Item], groups: Groups | None,
                  lib) -> list[tuple[tf.Tensor, Sparse]]:
    """(values, histograms) of ``items``: one part per item (``PER_TENSOR_OPS``) or one for all."""
    k = groups.count if groups is not None else 2
    lay = _Layout(items, k)
    xs, batched = [it.x for it in items], [bool(it.batched) for it in items]
    ids = tf.cast(groups.ids, tf.int32) if groups is not None else tf.zeros([0], tf.int32)
    # One op per tensor, not one over all: each runs as soon as its tensor is ready, beside
    # the rest of the step, while the tensor is still in cache, and the tensor's buffer can
    # be reused as in plain training. One op had to wait for the last gradient and kept every
    # captured tensor alive until then (bench_hook's stats-every-one-op row). Each op returns
    # its tensor's output rows whole (groups combined into all, sparse histograms).
    spans = [(i, i + 1) for i in range(len(xs))] if PER_TENSOR_OPS else [(0, len(xs))]
    ends = [*lay.base[1:], lay.n_out]
    parts = [lib.inspector_log_stats(
        xs[i:j], ids, batched=batched[i:j], base=[b - lay.base[i] for b in lay.base[i:j]],
        leaves=ends[j - 1] - lay.base[i], ngroups=k, max_elements=fmt.HIST_MAX_ELEMENTS,
        block=fmt.HIST_BLOCK, finish=True)
        for i, j in spans]
    # finish=True: each op's rows are final (STAT_COLUMNS, the none rows dropped): the parts
    # are joined by build_stats' concat alone
    return [(p[0], Sparse(*p[1:])) for p in parts]


# ---- small tensors: one concatenated float64 vector ----------------------------------------
def _small_stats(items: list[_Item], groups: Groups | None) -> tuple[tf.Tensor, Sparse]:
    # Static data rows: one per sample (batched) or one per tensor, each mapped to a leaf row.
    lay = _Layout(items, groups.count if groups is not None else 2)
    lengths, item_of_row, sample_of_row = [], [], []
    for i, it in enumerate(items):
        shape = it.x.shape.as_list()
        n = shape[0] if it.batched else 1
        lengths += [int(np.prod(shape[1:] if it.batched else shape, dtype=np.int64))] * n
        item_of_row += [i] * n
        sample_of_row += list(range(n))
    lengths_np = np.asarray(lengths, np.int32)
    n_rows, n_out = len(lengths), lay.n_out
    leaf = _leaf_of_row(lay, items, tf.constant(np.asarray(item_of_row, np.int32)),
                        tf.constant(np.asarray(sample_of_row, np.int32)), groups)
    # one float64 vector of every element, in data-row order
    flat = tf.concat([tf.reshape(tf.cast(it.x, F64), [-1]) for it in items], 0)
    row_id = tf.repeat(tf.range(n_rows), tf.constant(lengths_np))
    finite = tf.math.is_finite(flat)
    xf = tf.where(finite, flat, tf.zeros_like(flat))
    inf = tf.constant(np.inf, F64)

    # unsorted ops with an explicit count: sorted segment ops drop trailing empty rows
    def _rows_sum(v, ids):
        return tf.math.unsorted_segment_sum(v, ids, n_rows)

    def _rows_min(v, ids):
        return tf.math.unsorted_segment_min(v, ids, n_rows)

    def _rows_max(v, ids):
        return tf.math.unsorted_segment_max(v, ids, n_rows)

    def rows_to_leaves(v, op=tf.math.unsorted_segment_sum):
        return op(v, leaf, n_out)

    c_r = _rows_sum(tf.cast(finite, F64), row_id)
    c = rows_to_leaves(c_r)
    s = rows_to_leaves(_rows_sum(xf, row_id))
    nans = rows_to_leaves(_rows_sum(tf.cast(tf.math.is_nan(flat), F64), row_id))
    zeros = rows_to_leaves(_rows_sum(tf.cast(tf.equal(flat, 0.0), F64), row_id))
    elems = rows_to_leaves(tf.constant(lengths_np.astype(np.float64)))
    mn = rows_to_leaves(_rows_min(tf.where(finite, flat, tf.fill(tf.shape(flat), inf)), row_id),
                        tf.math.unsorted_segment_min)
    mx = rows_to_leaves(_rows_max(tf.where(finite, flat, tf.fill(tf.shape(flat), -inf)), row_id),
                        tf.math.unsorted_segment_max)
    leaf_mean = s / tf.maximum(c, 1.0)
    elem_leaf = tf.gather(leaf, row_id)
    dev = tf.where(finite, flat - tf.gather(leaf_mean, elem_leaf), tf.zeros_like(flat))
    m2 = rows_to_leaves(_rows_sum(tf.square(dev), row_id))
    values = _combine_leaves(lay, c, s, m2, mn, mx, zeros, nans, elems)
    # histograms: each element counts in its leaf and, for a batched item, in its all row too
    slots = bucket_slots(flat)
    parent = tf.gather(tf.constant(lay.parent), elem_leaf)
    again = tf.not_equal(parent, elem_leaf)
    dense = dense_hist(tf.concat([slots, tf.boolean_mask(slots, again)], 0),
                       tf.concat([elem_leaf, tf.boolean_mask(parent, again)], 0), n_out)
    return lay.finish(values, dense)


# ---- big tensors: few passes in the tensor's own dtype -------------------------------------
def _big_stats(items: list[_Item], groups: Groups | None) -> tuple[tf.Tensor, Sparse]:
    firsts = [_first_pass(it) for it in items]
    # NaN/Inf anywhere makes a row's sums non-finite: then the exact (masked) path for all.
    sums = tf.add_n([tf.reduce_sum(tf.cast(f["s1"], F64)) + tf.reduce_sum(tf.cast(f["s2"], F64))
                     for f in firsts])
    ok = tf.math.is_finite(sums)

    def joined(outs: list[tuple[tf.Tensor, Sparse]]) -> tuple[tf.Tensor, ...]:
        return (tf.concat([o[0] for o in outs], 0), *concat_sparse([o[1] for o in outs]))

    def fast():
        return joined([_fast_tail(it, f, groups) for it, f in zip(items, firsts)])

    def exact():
        return joined([tensor_stats(it.x, groups if it.batched else None) for it in items])

    values, *hist = tf.cond(ok, fast, exact)
    return values, Sparse(*hist)


def _as_rows(it: _Item) -> tf.Tensor:
    x = it.x
    if x.dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    n = tf.shape(x)[0] if it.batched else 1
    return tf.reshape(x, tf.stack([n, -1]))


def _first_pass(it: _Item) -> dict:
    """Per-row sums of deviations from a pivot (each a single pass), min, max, zero count."""
    x = _as_rows(it)
    pivot = x[:, :1]  # [n, 1], or [n, 0] for an empty tensor
    pivot_r = tf.reduce_sum(pivot, 1)
    e = tf.cast(tf.shape(x)[1], x.dtype)
    # s1 = sum(x - pivot) from sum(x): one pass; its rounding barely moves m2 = s2 - s1^2 / e
    # as long as the pivot (a value of the sample) is within a few std of the mean.
    return {"x": x, "pivot": pivot_r, "s1": tf.reduce_sum(x, 1) - e * pivot_r,
            "s2": tf.reduce_sum(tf.math.squared_difference(x, pivot), 1),
            "mn": tf.reduce_min(x, 1), "mx": tf.reduce_max(x, 1),
            "zeros": tf.reduce_sum(tf.cast(tf.equal(x, 0), tf.int32), 1)}


def _fast_tail(it: _Item, f: dict, groups: Groups | None) -> tuple[tf.Tensor, Sparse]:
    """All values finite: combine per-sample partials into groups, then one histogram pass."""
    x = f["x"]
    n, e = tf.shape(x)[0], tf.cast(tf.shape(x)[1], F64)
    s1, s2 = tf.cast(f["s1"], F64), tf.cast(f["s2"], F64)
    mean_r = tf.cast(f["pivot"], F64) + s1 / tf.maximum(e, 1.0)
    m2_r = tf.maximum(s2 - tf.square(s1) / tf.maximum(e, 1.0), 0.0)
    mn_r, mx_r, z_r = (tf.cast(f[k], F64) for k in ("mn", "mx", "zeros"))
    seg, nseg = segments(n, groups if it.batched else None)
    ones = tf.ones_like(s1)

    def ssum(v):
        return tf.math.unsorted_segment_sum(v, seg, nseg)

    c, s = ssum(e * ones), ssum(e * mean_r)
    mean = s / tf.maximum(c, 1.0)
    m2 = ssum(m2_r + e * tf.square(mean_r - tf.gather(mean, seg)))
    mn, mx = tf.math.unsorted_segment_min(mn_r, seg, nseg), \
        tf.math.unsorted_segment_max(mx_r, seg, nseg)
    z = ssum(z_r)
    if nseg > 1:  # [group 0 .. K-1, none] -> [all, group 0 .. K-1]
        c_all = tf.reduce_sum(c)
        mean_all = tf.reduce_sum(s) / tf.maximum(c_all, 1.0)
        m2_all = tf.reduce_sum(m2 + c * tf.square(mean - mean_all))

        def pick(v, total):
            return tf.concat([[total], v[:-1]], 0)
        c, mean, m2 = pick(c, c_all), pick(mean, mean_all), pick(m2, m2_all)
        mn, mx = pick(mn, tf.reduce_min(mn)), pick(mx, tf.reduce_max(mx))
        z = pick(z, tf.reduce_sum(z))
    zero = tf.zeros_like(c)
    values = _finish(c, c, mean * c, m2, mn, mx, z, zero, zero)
    dense = dense_hist(bucket_slots(hist_sample(x)), seg[:, None], nseg)
    if nseg > 1:
        dense = tf.concat([tf.reduce_sum(dense, 0, keepdims=True), dense[:-1]], 0)
    return values, to_sparse(dense)
