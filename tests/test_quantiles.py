"""Quantiles from the log-magnitude histograms within their stated error (1/17) of numpy's, on
values of every kind a network produces: zeros, negatives, NaN, a single value, tiny and huge
magnitudes, float16 and bfloat16; in numpy (inspector.format.loghist) and from a DumpHook run, where
the graph's histograms (fused kernel and stock ops) are compared with the dumped tensors."""
from __future__ import annotations

import numpy as np
import pytest

from inspector.format.loghist import (CEIL, FLOOR, RELATIVE_ERROR, LogHistogram, bucket_edges, bucket_index, merge,
                                      quantiles)

QS = np.linspace(0, 1, 101)


def check(est: np.ndarray, values: np.ndarray, what: str = "") -> None:
    """Every estimate within RELATIVE_ERROR of numpy's quantile (rank floor(q (n - 1)))."""
    v = np.asarray(values, np.float64).ravel()
    want = np.quantile(v[np.isfinite(v)], QS, method="lower")
    err = np.abs(est - want)
    bound = RELATIVE_ERROR * np.abs(want) * (1 + 1e-12)
    assert np.all(err <= bound), (what, float(np.max(err / np.maximum(np.abs(want), 1e-300))))


def cases(rng) -> dict[str, np.ndarray]:
    relu_grad = rng.laplace(0, 1e-6, 5000) * (rng.random(5000) < 0.4)         # mostly exact zeros
    return {
        "normal": rng.normal(size=3000).astype(np.float32),
        "negatives only": -np.exp(rng.uniform(-30, 5, 2000)).astype(np.float32),
        "zeros and signs": relu_grad.astype(np.float32),
        "wide magnitudes": (rng.normal(size=4000) * np.exp(rng.uniform(-60, 60, 4000))).astype(np.float32),
        "with NaN and Inf": np.r_[rng.normal(size=500), [np.nan, np.inf, -np.inf, np.nan]].astype(np.float32),
        "a single value": np.float32([-2.5]),
        "all equal": np.full(300, 0.1, np.float32),
        "float16": (rng.normal(size=2000) * 1e-3).astype(np.float16),
        "bfloat16": _bfloat16(rng.normal(size=2000) * 30),
        "float64 beyond float32": rng.normal(size=1000) * np.exp(rng.uniform(-700, 700, 1000)),
    }


def _bfloat16(x: np.ndarray) -> np.ndarray:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return x.astype(ml_dtypes.bfloat16)


def test_every_value_lies_in_its_bucket():
    rng = np.random.default_rng(0)
    for name, x in cases(rng).items():
        idx, finite = bucket_index(x)
        v = np.asarray(x, np.float64)[finite]
        lo, hi = bucket_edges(idx[finite])
        b = idx[finite].astype(np.int64)
        inside = np.where(b > 0, (v >= lo) & (v < hi), np.where(b < 0, (v > lo) & (v <= hi), v == 0))
        assert inside.all() and np.abs(b).max(initial=0) <= CEIL, name
    tiny = bucket_index(np.array([1e-40, -1e-40], np.float32))[0]     # float32 subnormals: the floor bucket
    assert tiny.tolist() == [FLOOR, -FLOOR]


@pytest.mark.parametrize("name", list(cases(np.random.default_rng(0))))
def test_quantiles_within_the_bound(name):
    x = cases(np.random.default_rng(1))[name]
    if name == "float64 beyond float32":   # the floor and ceiling buckets carry no bound: leave them out
        x = x[(np.abs(x) >= 2.0 ** -126) & (np.abs(x) < 2.0 ** 128)]
    check(LogHistogram.of(x).quantiles(QS), x, name)


def test_an_empty_histogram_has_no_quantiles_and_bad_q_is_refused():
    assert np.isnan(quantiles([], [], [0.5])).all()
    assert np.isnan(LogHistogram.of(np.array([np.nan, np.inf])).quantiles([0, 1])).all()
    with pytest.raises(ValueError, match=r"quantiles must lie in \[0, 1\], got \[1.5\]"):
        LogHistogram.of(np.ones(3)).quantiles([1.5])


def test_merged_histograms_are_the_histogram_of_the_union():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=700), rng.laplace(0, 1e-4, 900)
    m = merge([LogHistogram.of(a), LogHistogram.of(b)])
    u = LogHistogram.of(np.r_[a, b])
    assert m.index.tolist() == u.index.tolist() and m.count.tolist() == u.count.tolist()
    check(m.quantiles(QS), np.r_[a, b])


# ---- from the graph: a DumpHook run -----------------------------------------------------------
@pytest.mark.parametrize("native", [True, False], ids=["fused kernel", "stock ops"])
def test_hook_quantiles_match_numpy_on_dumped_tensors(tmp_path, native):
    tf = pytest.importorskip("tensorflow")
    import inspector
    from hooks import DumpHook, native as native_lib
    if native and native_lib._compiler() is None:
        pytest.skip("no C++ compiler: the fused kernel cannot be built here")
    v1 = tf.compat.v1
    rng = np.random.default_rng(3)
    batch = 8
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [batch, 40], name="x")
        y = v1.placeholder(tf.int64, [batch], name="y")
        w = v1.get_variable("w", initializer=tf.constant(rng.normal(size=(40, 3)).astype(np.float32)))
        h = tf.nn.relu(tf.matmul(x, w), name="relu")                       # zeros; its gradient: zeros too
        nan = tf.where(x > 2.5, tf.fill(tf.shape(x), np.nan), x, name="with_nan")   # NaN where x > 2.5
        half = tf.cast(tf.cast(x * 1e-3, tf.float16), tf.float32, name="via_half")
        half16 = tf.identity(tf.cast(x * 1e-3, tf.float16), name="half")
        bf16 = tf.identity(tf.cast(x * 30.0, tf.bfloat16), name="bf16")
        single = tf.reduce_max(tf.abs(x), name="single")                    # one value, not batched
        logits = h + tf.reduce_mean(tf.where(tf.math.is_finite(nan), nan, 0.0), 1, keepdims=True) \
            + tf.cast(tf.reduce_mean(half16), tf.float32) + tf.cast(tf.reduce_mean(bf16), tf.float32) \
            + 0.0 * single + 0.0 * tf.reduce_mean(half)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
        hook = DumpHook(tmp_path / "run", loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=1,
                        samples_per_group=batch, native_stats=native, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
            for _ in range(2):
                sess.run(train, {x: rng.normal(size=(batch, 40)).astype(np.float32),
                                 y: rng.integers(0, 2, batch)})
    run = inspector.open_run(tmp_path / "run")
    groups = run.samples(2)["group"].to_numpy()
    checked = 0
    for name in ("relu:0", "with_nan:0", "half:0", "bf16:0", "single:0", "via_half:0", "w"):
        kinds = ["forward"] + (["gradient"] if run.tensors.loc[name, "has_gradient"] else [])
        for kind in kinds:
            a = np.asarray(run.tensor(name, 2, kind))
            batched = bool(run.tensors.loc[name, "batched"])
            for group in ("all", "positive", "negative") if batched else ("all",):
                rows = slice(None) if group == "all" else groups == group
                q = run.quantiles(name, (2, 2), kind, group, QS)
                check(q[[f"q{v:g}" for v in QS]].to_numpy()[0], a[rows] if batched else a, f"{name} {kind} {group}")
                checked += 1
    assert checked >= 20
