"""hooks.fast_stats agrees with the reference capture.build_stats, on both of its paths."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from hooks import capture, fast_stats  # noqa: E402

v1 = tf.compat.v1


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
def test_fast_stats_match_reference(monkeypatch, small_max, nonfinite, hist_max):
    from inspector import format as fmt
    monkeypatch.setattr(fast_stats, "SMALL_MAX", small_max)
    monkeypatch.setattr(fmt, "HIST_MAX_ELEMENTS", hist_max)
    arrays = _tensors(np.random.default_rng(0), nonfinite)
    with tf.Graph().as_default():
        gid = tf.constant([1, 0, 0, 1, 1, 0], tf.int32)
        caps = [capture.Captured(tf.constant(a), batched=a.ndim > 1, gradient=None) for a in arrays]
        ref, fast = capture.build_stats(caps, gid, 8), fast_stats.build_stats(caps, gid, 8)
        assert ref.rows == fast.rows
        with v1.Session() as s:
            r, f = s.run([(ref.values, ref.hist_range, ref.hist), (fast.values, fast.hist_range, fast.hist)])
    np.testing.assert_allclose(f[0], r[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(f[1], r[1], rtol=1e-6)
    assert np.abs(f[2] - r[2]).sum(axis=1).max() <= 2  # float rounding at bin edges
    if hist_max == 50:  # b [6, 40]: every 5th element; d [6, 128]: every 16th block of 64, i.e. the first
        from inspector.format import hist_sample
        for row, x in ((3, arrays[1]), (10, arrays[4])):  # all rows: a 0, b 3, c 6, e 7, d 10
            sub = hist_sample(x, len(x))
            assert sub.size == 6 * (8 if row == 3 else 64)
            assert f[2][row].sum() == r[2][row].sum() == np.isfinite(sub).sum() < np.isfinite(x).sum()
