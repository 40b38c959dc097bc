"""hooks.stats.fast agrees with the reference exact_stats.build_stats, on every path: the fused
kernels (hooks/native), and the stock-op small- and big-tensor paths."""
from __future__ import annotations

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
from hooks import capture, native  # noqa: E402
from hooks.stats import exact as exact_stats, fast as fast_stats  # noqa: E402
from inspector.format import STAT_COLUMNS  # noqa: E402
from inspector.format.loghist import LogHistogram  # noqa: E402

v1 = tf.compat.v1


def rows(fetched) -> list[tuple[list[int], list[int]]]:
    """Each row's (bucket indices, counts) from a fetched (values, splits, index, count)."""
    _, splits, index, count = fetched
    return [(index[a:b].tolist(), count[a:b].tolist()) for a, b in zip(splits[:-1], splits[1:])]


@pytest.fixture(params=["native", "stock"])
def use_native(request) -> bool:
    """Both implementations; the fused kernels must build wherever a C++ compiler exists."""
    if request.param == "stock":
        return False
    if native._compiler() is None:
        pytest.skip("no C++ compiler: the fused kernels cannot be built here")
    assert native.library() is not None, "the fused statistics kernels failed to build or load (see the log)"
    return True


def _tensors(rng, nonfinite: bool) -> list[np.ndarray]:
    a = rng.normal(3.0, 0.01, size=(6, 5, 4)).astype(np.float32)       # |mean| >> std
    b = np.maximum(rng.normal(size=(6, 40)), 0).astype(np.float32)       # ReLU-like: zeros
    c = rng.normal(size=(7,)).astype(np.float32)                         # not batched
    e = np.zeros((6, 0), np.float32)                                     # empty
    d = rng.normal(size=(6, 2, 64)).astype(np.float32)                   # blocks of 64 elements
    if nonfinite:
        b[1, 3], b[4, 0], a[2, 0, 0], d[0, 1, 5] = np.nan, np.inf, -np.inf, np.nan
    return [a, b, c, e, d]


@pytest.mark.parametrize("hist_max", [1 << 16, 50])  # 50: b's histograms count every 5th element
@pytest.mark.parametrize("small_max", [0, 1 << 30])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_fast_stats_match_reference(monkeypatch, small_max, nonfinite, hist_max, use_native):
    from inspector.format import layout as fmt
    monkeypatch.setattr(fast_stats, "SMALL_MAX", small_max)
    monkeypatch.setattr(fmt, "HIST_MAX_ELEMENTS", hist_max)
    arrays = _tensors(np.random.default_rng(0), nonfinite)
    with tf.Graph().as_default():
        gid = tf.constant([1, 0, 0, 1, 1, 0], tf.int32)
        caps = [capture.Captured(tf.constant(a), batched=a.ndim > 1, gradient=None) for a in arrays]
        ref, fast = exact_stats.build_stats(caps, gid), fast_stats.build_stats(caps, gid, use_native)
        assert ref.rows == fast.rows
        kernels = [op for op in v1.get_default_graph().get_operations() if op.type == "InspectorLogStats"]
        # one op per tensor (and the groups): each can run as soon as its own tensor is ready
        inputs = [[i.op.name for i in op.inputs[:-1]] for op in kernels]
        assert all(len(i) == 1 for i in inputs) and len(inputs) == len({n for n, in inputs})
        if small_max == 0:  # every tensor takes the kernel
            assert sorted(inputs) == (sorted([c.tensor.op.name] for c in caps) if use_native else [])
        with v1.Session() as s:
            r, f = s.run([ref.tensors(), fast.tensors()])
    np.testing.assert_allclose(f[0], r[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert rows(f) == rows(r)   # bucket indices come from bit patterns: exactly equal
    from inspector.format import hist_sample
    groups = np.array([1, 0, 0, 1, 1, 0])
    for row, x in ((0, arrays[0]), (3, arrays[1]), (10, arrays[4])):  # all rows: a 0, b 3, c 6, e 7, d 10
        sub = hist_sample(x, len(x))
        if hist_max == 50:  # b [6, 40]: every 5th element; d [6, 128]: every 16th block of 64, i.e. the first
            assert sub.size == 6 * {0: 7, 3: 8, 10: 64}[row]
        for k, members in enumerate((np.ones(6, bool), groups == 1, groups == 0)):  # all, positive, negative
            want = LogHistogram.of(sub[members])
            assert rows(f)[row + k] == (want.index.tolist(), want.count.tolist()), (row, k)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_native_dtypes_dynamic_batch_and_padding(dtype):
    """Fused kernels: every float dtype, a batch dimension unknown until run time, and more
    samples than labels (the extra samples count in 'all' only), against the reference."""
    if native._compiler() is None:
        pytest.skip("no C++ compiler")
    rng = np.random.default_rng(1)
    x_val = rng.normal(size=(5, 3, 70)).astype(np.float32)  # 210 per sample: not a multiple of 64
    x_val[2, 0, :5] = 0.0
    with tf.Graph().as_default():
        x = v1.placeholder(dtype, [None, 3, 70])
        gid = tf.constant([1, 0, 1, 0], tf.int32)  # 4 labels for 5 samples: sample 4 is padding
        caps = [capture.Captured(x, batched=True, gradient=None),
                capture.Captured(tf.reduce_mean(x, 0), batched=False, gradient=None)]
        ref, fast = exact_stats.build_stats(caps, gid), fast_stats.build_stats(caps, gid, True)
        assert [op.type for op in v1.get_default_graph().get_operations() if op.type == "InspectorLogStats"]
        with v1.Session() as s:
            feed = {x: x_val.astype(dtype.as_numpy_dtype)}
            r, f = s.run([ref.tensors(), fast.tensors()], feed)
    tol = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-5
    np.testing.assert_allclose(f[0], r[0], rtol=tol, atol=tol, equal_nan=True)
    assert rows(f) == rows(r)
    typed = x_val.astype(dtype.as_numpy_dtype)   # each value's bucket is its own dtype's value's
    want = LogHistogram.of(typed.astype(np.float64) if dtype == tf.float64 else typed.astype(np.float32))
    assert rows(f)[0] == (want.index.tolist(), want.count.tolist())
    assert f[0][0, 0] == 5 * 210 and f[0][1, 0] + f[0][2, 0] == 4 * 210  # padding: in 'all' only
    assert f[0][0, 6] == pytest.approx(5 / (5 * 210))  # zero fraction


def test_one_tensor_under_several_names_is_computed_once(use_native):
    """The rows of a tensor captured twice (once behind an Identity) equal the reference, and
    the statistics read it once: the graph has the same statistics ops as for one capture,
    and only ops that join or gather rows besides."""
    x = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32)

    def build(twice: bool):
        with tf.Graph().as_default() as g:
            gid = tf.constant([1, 0, 0, 1, 1, 0], tf.int32)
            t = tf.constant(x)
            caps = [capture.Captured(t, batched=True, gradient=tf.identity(t) if twice else None)]
            fetch = fast_stats.build_stats(caps, gid, use_native)
            with v1.Session() as s:
                out = s.run(fetch.tensors())
            ops = [op for op in g.get_operations() if op.name.startswith("tf_inspector")]
            kernels = [len(op.inputs) for op in ops if op.type == "InspectorLogStats"]
            return out, fetch.rows, collections.Counter(op.type for op in ops), kernels
    # rows repeated by a gather (of the values; of the sparse histograms' rows: a ragged gather of
    # the stacked index and count, cut apart and cast) or by a concat listing a part twice (the
    # sparse rows' offsets: a cumulative sum, repeated per row)
    joins = {"GatherV2", "RaggedGather", "Const", "Pack", "StridedSlice", "Cast", "ConcatV2",
             "Cumsum", "AddV2", "Reshape", "Tile", "ExpandDims", "Shape", "BroadcastTo", "Fill",
             "Range", "Mul", "Sub", "Maximum", "Size", "Transpose", "Prod", "ZerosLike", "Less"}
    twice, rows2, ops2, kernels2 = build(True)
    once, rows1, ops1, kernels1 = build(False)
    assert len(rows2) == 2 * len(rows1) == 6 and rows2[3:] == [(n, "gradient", g) for n, _, g in rows1]
    np.testing.assert_array_equal(twice[0][:3], twice[0][3:])
    np.testing.assert_array_equal(twice[0][:3], once[0])
    assert rows(twice)[3:] == rows(twice)[:3] == rows(once)
    assert kernels2 == kernels1
    assert set(ops2 - ops1) <= joins and set(ops1 - ops2) <= joins, (ops2 - ops1, ops1 - ops2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_nonfinite_chunks_match_reference(monkeypatch, dtype):
    """The kernel's masked pass (a chunk holding NaN/Inf) on chunk-sized rows: NaN every 7th
    value; NaN every 5th among values with |mean| >> std; a chunk whose first 100 values are
    NaN before such values (the pivot must be one of the finite values, not 0); a chunk of
    +-Inf only and one of NaN only; against the stock-op reference."""
    if native._compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(fast_stats, "SMALL_MAX", 0)  # every tensor through the kernel
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 3 * 2048)).astype(np.float32)
    x[0, ::7] = np.nan
    x[4] = rng.normal(-500.0, 0.01, size=3 * 2048)
    x[4, 3::5] = np.nan
    x[1] = rng.normal(1000.0, 0.01, size=3 * 2048)
    x[1, 2048:2148] = np.nan
    x[2, :2048] = np.where(np.arange(2048) % 2, np.inf, -np.inf)
    x[3, 4096:] = np.nan
    with tf.Graph().as_default():
        gid = tf.constant([0], tf.int32)
        # one tensor per case, unbatched: a row of its own (in a group, another case's values
        # would hide a wrong min or std)
        caps = [capture.Captured(tf.constant(row.astype(dtype)), batched=False, gradient=None) for row in x]
        ref, fast = exact_stats.build_stats(caps, gid), fast_stats.build_stats(caps, gid, True)
        assert "InspectorLogStats" in {op.type for op in v1.get_default_graph().get_operations()}
        with v1.Session() as s:
            r, f = s.run([ref.tensors(), fast.tensors()])
    np.testing.assert_allclose(f[0], r[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert rows(f) == rows(r)


def test_native_extremes_match_numpy(monkeypatch):
    """Values where the kernel's arithmetic could overflow: float64 values near 1e160, whose
    merge into an empty accumulator must not square the whole mean (the all row's std), and a
    float32 range wider than the largest float. Against numpy in float64, every element
    histogrammed (float64 values by their own bits: beyond float32's range, in bucket CEIL)."""
    if native._compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(fast_stats, "SMALL_MAX", 0)
    rng = np.random.default_rng(0)
    cases = [1e160 + rng.normal(size=(4, 300)) * 1e150, rng.uniform(-3e38, 3e38, (4, 1000)).astype(np.float32)]
    std, l2 = STAT_COLUMNS.index("std"), STAT_COLUMNS.index("l2")
    for x in cases:
        with tf.Graph().as_default():
            fetch = fast_stats.build_stats([capture.Captured(tf.constant(x), batched=True)],
                                           tf.constant([1, 0, 1, 0], tf.int32), True)
            with v1.Session() as s:
                out = s.run(fetch.tensors())
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(out[0][0, std], x64.std(), rtol=1e-6)
        np.testing.assert_allclose(out[0][0, l2], np.sqrt(np.sum(x64 ** 2)), rtol=1e-6)   # inf at 1e160, as numpy's
        want = LogHistogram.of(x)
        assert rows(out)[0] == (want.index.tolist(), want.count.tolist())


def test_native_op_refuses_inputs_sharing_leaves():
    """Threads write each input's leaves unlocked: bases that overlap are an error, not a race."""
    lib = native.library() if native._compiler() is not None else None
    if lib is None:
        pytest.skip("no C++ compiler")
    x, y = tf.constant(np.arange(8, dtype=np.float32)), tf.constant(np.arange(4, dtype=np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="overlap at leaf 0"):
        lib.inspector_log_stats([x, y], tf.zeros([0], tf.int32), batched=[False, False], base=[0, 0], leaves=1,
                                max_elements=16384, block=64)


def test_concatenated_histograms_of_static_parts_equal_the_part_by_part_concat():
    """Concatenated in a fixed handful of ops (one op per part made tracing cost seconds), with
    row counts static or known at run time: every part's rows in order, parts with no rows
    included."""
    from hooks.stats import exact
    rng = np.random.default_rng(0)

    def part(rows):
        sizes = rng.integers(0, 4, size=rows)
        splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n = int(splits[-1])
        return exact.Sparse(tf.constant(splits), tf.constant(rng.integers(-9, 9, n).astype(np.int32)),
                            tf.constant(rng.integers(1, 5, n).astype(np.int64)))
    parts = [part(r) for r in (3, 0, 1, 5, 2)]
    sizes = np.concatenate([np.diff(p.splits.numpy()) for p in parts])   # every row's entries
    want = (np.concatenate([[0], np.cumsum(sizes)]), np.concatenate([p.index.numpy() for p in parts]),
            np.concatenate([p.count.numpy() for p in parts]))
    dynamic = [exact.Sparse(tf.compat.v1.placeholder_with_default(p.splits, [None]), p.index, p.count)
               for p in parts]
    for got in (exact.concat_sparse(parts), exact.concat_sparse(dynamic)):   # static, run-time row counts
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.numpy(), b)


@pytest.mark.parametrize("per_input", [False, True])
def test_native_finish_records_the_same_bits_as_the_graph_finish(per_input):
    """finish=True (the rows fast_stats fetches) is fast_stats._finish of the raw moments, bit
    for bit, with each batched input's none row left out of the values and the histograms:
    groups, samples in no group, NaN/Inf, an all-NaN sample, an empty tensor, float16, float64
    values whose squares overflow float32, an unbatched tensor."""
    lib = native.library() if native._compiler() is not None else None
    if lib is None:
        pytest.skip("no C++ compiler")
    rng = np.random.default_rng(3)
    a = rng.normal(3.0, 0.01, size=(6, 5, 4)).astype(np.float32)
    a[2, 0, 0], a[4, 1, 1] = np.nan, np.inf
    b = np.maximum(rng.normal(size=(6, 200)), 0).astype(np.float16)
    b[5] = np.nan
    c = (rng.normal(size=(9,)) * 1e30).astype(np.float64)
    e = np.zeros((6, 0), np.float32)
    xs, batched = [a, b, c, e], [True, True, False, True]
    ids = tf.constant([0, 1, 1, 0, 2], tf.int32)   # ngroups 2: sample 2 in none, sample 5 past the ids
    k = 2
    spans = [(i, i + 1) for i in range(len(xs))] if per_input else [(0, len(xs))]
    for i, j in spans:
        sizes = [k + 2 if bt else 1 for bt in batched[i:j]]
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
        kw = dict(batched=batched[i:j], base=base, leaves=sum(sizes), ngroups=k, max_elements=64, block=8)
        raw = lib.inspector_log_stats([tf.constant(x) for x in xs[i:j]], ids, **kw)
        done = lib.inspector_log_stats([tf.constant(x) for x in xs[i:j]], ids, finish=True, **kw)
        keep = [bs + r for bs, n, bt in zip(base, sizes, batched[i:j]) for r in range(n - 1 if bt else n)]
        ec, c_, mean, m2, mn, mx, zeros, nans = tf.unstack(raw[0], 8, axis=1)
        want = tf.gather(fast_stats._finish(ec, c_, c_ * mean, m2, mn, mx, zeros, nans, ec - c_), keep)
        assert done[0].shape == (len(keep), len(STAT_COLUMNS))
        np.testing.assert_array_equal(done[0].numpy().view(np.int64), want.numpy().view(np.int64))
        want_h = exact_stats.take_sparse(exact_stats.Sparse(*raw[1:]), np.asarray(keep))
        for got, w in zip(done[1:], want_h):
            np.testing.assert_array_equal(got.numpy(), w.numpy())
