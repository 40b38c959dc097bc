"""The ICNN conv-mask layer against a NumPy reference written here from ICNN.md."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
tf1 = tf.compat.v1

from inspector.format import layout as fmt  # noqa: E402
from inspector.icnn import layer as icnn  # noqa: E402

from icnn_ref import (A, random_maps, ref_beta_grad, ref_filter_grad, ref_forward, ref_mu,  # noqa: E402
                       run_layer)


SHAPES = [(6, 5, 5, 4), (5, 4, 7, 3), (4, 7, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide", "tall"])
@pytest.mark.parametrize("mode", ["centroid", "argmax"])
def test_forward_matches_reference(shape, mode):
    x = random_maps(*shape, seed=sum(shape))
    pos = np.arange(shape[0]) % 2 == 0
    beta = np.linspace(1.5, 3.0, shape[3])
    vals, _, _ = run_layer(x, pos, beta=beta, mu=mode)
    ref = ref_forward(x, beta, mode=mode)
    np.testing.assert_allclose(vals["mu"], ref["mu"], atol=1e-12)
    np.testing.assert_allclose(vals["sqrtvar"], ref["sqrtvar"], rtol=1e-10)
    np.testing.assert_allclose(vals["mask"], ref["mask"], atol=1e-12)
    np.testing.assert_allclose(vals["post_mask"], ref["post"], atol=1e-12)
    np.testing.assert_allclose(vals["strength"], ref["strength"], atol=1e-12)
    np.testing.assert_allclose(vals["pre_mask"], x)
    np.testing.assert_allclose(vals["beta"], beta)
    assert vals["mu"].shape == (shape[0], shape[3], 2) and vals["filter_loss"].shape == (shape[3],)
    # The mask is not trivial on these inputs: clipped at -1, peaked at 1, values between.
    m = ref["mask"]
    assert (m == -1).any() and (m == 1).any() and ((m > -1) & (m < 1)).any()


def test_centroid_rounds_half_up_and_maps_rows_and_cols_separately():
    x = np.zeros((1, 4, 6, 1))
    x[0, 1, 2, 0] = x[0, 2, 3, 0] = 1.0       # centroid (2.5, 3.5) 1-based -> rounds to (3, 4)
    vals, _, _ = run_layer(x, np.array([True]))
    np.testing.assert_allclose(vals["mu"][0, 0], [np.linspace(-1, 1, 4)[2], np.linspace(-1, 1, 6)[3]])


@pytest.mark.parametrize("shape", SHAPES, ids=["square", "wide", "tall"])
def test_backward_matches_reference(shape):
    x = random_maps(*shape, seed=7 * shape[2])
    pos = np.array([True, False, True, True, False, False][: shape[0]])
    rng = np.random.default_rng(1)
    up = rng.normal(size=x.shape)
    beta = np.linspace(1.8, 2.6, shape[3])
    epoch = 3.0
    vals, dx, db = run_layer(x, pos, epoch, beta=beta, upstream=up, reduction="sum", beta_lr_mult=1.0)
    ref = ref_forward(x, beta)
    expect = up * np.maximum(ref["mask"], 0) + ref_filter_grad(x, ref["mask"], pos, epoch)
    filt = ref_filter_grad(x, ref["mask"], pos, epoch)
    assert np.abs(filt[pos]).max() > 0 and np.abs(filt[~pos]).max() > 0
    np.testing.assert_allclose(dx, expect, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(db, ref_beta_grad(beta, ref["strength"], ref["sqrtvar"], pos), rtol=1e-10)


def test_filter_gradient_alone_matches_reference_per_group():
    """Zero upstream isolates the filter-loss term: subtracted on positives, added on negatives."""
    x = random_maps(6, 5, 5, 4, seed=3)
    pos = np.array([True, True, False, True, False, False])
    _, dx, _ = run_layer(x, pos, 1.0, upstream=np.zeros_like(x), reduction="sum")
    ref = ref_forward(x, np.full(4, 2.0))
    np.testing.assert_allclose(dx, ref_filter_grad(x, ref["mask"], pos, 1.0), rtol=1e-9, atol=1e-18)
    # Negatives: one value per (image, channel), uniform over h, w.
    neg = dx[~pos]
    assert np.allclose(neg, neg[:, :1, :1, :])


def test_mean_reduction_divides_injected_terms_by_batch_and_applies_lr_mult():
    x = random_maps(4, 5, 5, 3, seed=11)
    pos = np.array([True, False, True, False])
    up = np.zeros_like(x)
    _, dx_sum, db_sum = run_layer(x, pos, upstream=up, reduction="sum", beta_lr_mult=1.0)
    _, dx_mean, db_mean = run_layer(x, pos, upstream=up, reduction="mean", beta_lr_mult=0.05)
    np.testing.assert_allclose(dx_mean, dx_sum / 4, rtol=1e-12)
    np.testing.assert_allclose(db_mean, db_sum * 0.05 / 4, rtol=1e-12)


def test_part_filters_leave_other_channels_unmasked_and_untrained():
    x = random_maps(4, 5, 5, 3, seed=5)
    pos = np.array([True, False, True, False])
    vals, dx, db = run_layer(x, pos, upstream=np.zeros_like(x), part_filters=2, reduction="sum")
    assert np.all(vals["mask"][..., 2] == 1) and np.any(vals["mask"][..., :2] < 1)
    assert np.all(dx[..., 2] == 0) and db[2] == 0 and np.all(db[:2] != 0)
    ref = ref_forward(x, np.full(3, 2.0), part=np.array([True, True, False]))
    np.testing.assert_allclose(
        dx, ref_filter_grad(x, ref["mask"], pos, 2.0, part=np.array([True, True, False])), rtol=1e-9)


def test_without_filter_loss_gradient_is_upstream_times_relu_mask_and_matches_finite_differences():
    rng = np.random.default_rng(2)
    x = rng.uniform(0.1, 1.0, size=(3, 5, 6, 2))   # x > 0 everywhere: no ReLU kink at x = 0
    pos = np.array([True, False, True])
    up = rng.normal(size=x.shape)
    vals, dx, _ = run_layer(x, pos, upstream=up, filter_loss=False)
    np.testing.assert_allclose(dx, up * np.maximum(vals["mask"], 0), rtol=1e-12)

    def loss(xv):
        return float((ref_forward(xv, np.full(2, 2.0))["post"] * up).sum())

    mu0 = ref_mu(x)[:2]
    eps = 1e-6
    for idx in [(0, 0, 0, 0), (1, 2, 3, 1), (2, 4, 5, 0), (0, 3, 1, 1), (1, 0, 5, 1)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        # Away from a rounding boundary of mu the mask is locally constant.
        assert all(np.array_equal(a, b) for a, b in zip(ref_mu(xp)[:2], mu0))
        fd = (loss(xp) - loss(xm)) / (2 * eps)
        assert fd == pytest.approx(dx[idx], rel=1e-6, abs=1e-9)


def _bump(h, w, r, c, sigma=0.8):
    yy, xx = np.mgrid[0:h, 0:w]
    return np.exp(-((yy - r) ** 2 + (xx - c) ** 2) / (2 * sigma ** 2))


def _logsumexp(a, axis):
    top = np.max(a, axis=axis, keepdims=True)
    return np.log(np.sum(np.exp(a - top), axis=axis, keepdims=True)) + top


def ref_filter_loss(x, beta, pos):
    """-MI(X; T), X = the batch (uniform), T = {T-} + {T_mu on the grid}, as the docstring says."""
    n, h, w, c = x.shape
    gy, gx = np.linspace(-1, 1, h), np.linspace(-1, 1, w)
    mus = [(a, b) for a in gy for b in gx]
    alpha = pos.mean()
    prior = np.array([1 - alpha] + [alpha / len(mus)] * len(mus))
    out = np.zeros(c)
    for k in range(c):
        temps = [-np.ones((h, w))] + [
            np.maximum(1 - beta[k] * (np.abs(gy[:, None] - a) + np.abs(gx[None, :] - b)), -1) for a, b in mus]
        score = np.array([[(x[i, :, :, k] * t).mean() / A for t in temps] for i in range(n)])   # [N, T]
        log_p = score - _logsumexp(score, axis=0)                                             # p(x|T)
        with np.errstate(divide="ignore"):
            log_px = _logsumexp(log_p + np.log(prior), axis=1)                                # p(x)
        out[k] = -(prior * (np.exp(log_p) * (log_p - log_px)).sum(axis=0)).sum()
    return out


def test_monitoring_loss_prefers_a_filter_that_sits_on_the_part():
    """Channel 0 fires once, on the part (which moves), in positives only; channel 1 wanders
    over three places per image; channel 2 is diffuse. Same total activation per map."""
    rng = np.random.default_rng(0)
    n, h, w = 16, 8, 8
    pos = np.arange(n) < 8
    x = np.zeros((n, h, w, 3))
    for i in np.flatnonzero(pos):
        x[i, :, :, 0] = _bump(h, w, *rng.integers(1, 7, size=2))
        for _ in range(3):
            x[i, :, :, 1] += _bump(h, w, *rng.integers(0, 8, size=2))
        x[i, :, :, 2] = rng.uniform(0.5, 1.0, size=(h, w))
    x = 100.0 * x / np.maximum(x.sum(axis=(1, 2), keepdims=True), 1e-12)
    vals, _, _ = run_layer(x, pos)
    fl = vals["filter_loss"]
    np.testing.assert_allclose(fl, ref_filter_loss(x, np.full(3, 2.0), pos), rtol=1e-8, atol=1e-12)
    assert np.all(fl <= 1e-12)                       # -MI <= 0
    assert fl[0] < fl[1] < fl[2], fl


@pytest.mark.parametrize("case", ["zeros", "no_positives", "no_negatives", "batch_of_one", "zeros_one_pos"])
def test_degenerate_batches_are_defined(case):
    x = random_maps(4, 5, 5, 3, seed=9)
    pos = np.array([True, False, True, False])
    if case == "zeros":
        x = np.zeros_like(x)
    elif case == "no_positives":
        pos = np.zeros(4, bool)
    elif case == "no_negatives":
        pos = np.ones(4, bool)
    elif case == "batch_of_one":
        x, pos = x[:1], pos[:1]
    else:
        x, pos = np.zeros_like(x[:1]), pos[:1]
    for dtype in (np.float64, np.float32):
        vals, dx, db = run_layer(x, pos, upstream=np.ones_like(x), dtype=dtype, reduction="sum",
                                 beta_lr_mult=1.0)
        for role, v in vals.items():
            assert np.all(np.isfinite(v)), (case, role)
        assert np.all(np.isfinite(dx)) and np.all(np.isfinite(db)), case
    ref = ref_forward(x.astype(np.float64), np.full(3, 2.0))
    np.testing.assert_allclose(db, ref_beta_grad(np.full(3, 2.0), ref["strength"], ref["sqrtvar"], pos),
                               rtol=1e-5)
    if case == "zeros":
        np.testing.assert_allclose(vals["mu"], -1.0)           # all-zero map: mu = (1, 1) -> (-1, -1)
        np.testing.assert_allclose(vals["sqrtvar"], 0.0)
    if case == "no_positives":
        np.testing.assert_allclose(db, (2.0 - 3.0) * 1e4)      # NaN ratio -> target 3 (MATLAB min/max)
        np.testing.assert_allclose(vals["filter_loss"], 0.0, atol=1e-6)


def test_float32_matches_float64():
    x = random_maps(6, 6, 6, 4, seed=21)
    pos = np.arange(6) % 3 == 0
    v64, dx64, db64 = run_layer(x, pos, upstream=np.ones_like(x))
    v32, dx32, db32 = run_layer(x, pos, upstream=np.ones_like(x), dtype=np.float32)
    np.testing.assert_allclose(v32["mask"], v64["mask"], atol=1e-5)
    np.testing.assert_allclose(dx32, dx64, rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(db32, db64, rtol=1e-4)


def test_registers_every_role_with_named_float_tensors_and_excludes_beta_from_decay():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 6, 4, 5])
        w = tf1.get_variable("w", [3], initializer=tf1.zeros_initializer())
        icnn.conv_mask(tf.nn.relu(x), tf1.placeholder(tf.bool, [None]), 1.0, name="top")
        entries = icnn.registered(g)
        assert [r for _, r, _ in entries] == list(fmt.ICNN_ROLES)
        names = {r: t.name for _, r, t in entries}
        assert names["mask"] == "top/mask:0" and names["post_mask"] == "top/post_mask:0"
        assert names["beta"] == "top/beta_value:0"
        assert all(t.dtype == tf.float32 and layer == "top" for layer, _, t in entries)
        shapes = {r: t.shape.as_list() for _, r, t in entries}
        assert shapes["mu"] == [None, 5, 2] and shapes["sqrtvar"] == [None, 5]
        assert shapes["beta"] == [5] and shapes["filter_loss"] == [5] and shapes["mask"] == [None, 6, 4, 5]
        assert icnn.weight_decay_variables() == [w]
        assert not tf1.get_collection(tf1.GraphKeys.REGULARIZATION_LOSSES)


def test_bad_inputs_raise_clear_errors():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="static H, W, C"):
            icnn.conv_mask(tf1.placeholder(tf.float32, [None, None, 4, 2]), tf.constant([True]), 1.0)
        with pytest.raises(ValueError, match="mu must be"):
            icnn.conv_mask(tf.zeros([1, 3, 3, 2]), tf.constant([True]), 1.0, mu="mean")
        with pytest.raises(ValueError, match="epoch"):
            icnn.conv_mask(tf.zeros([1, 3, 3, 2]), tf.constant([True]))
        with pytest.raises(ValueError, match="part_filters"):
            icnn.conv_mask(tf.zeros([1, 3, 3, 2]), tf.constant([True]), 1.0, part_filters=5)


def test_overflowing_exponentials_are_replaced_like_the_release():
    """float32 maps with large activations: exp(s / a) overflows to Inf; the release replaces
    Inf by the largest finite value and NaN by 0, and so must the layer."""
    rng = np.random.default_rng(4)
    x = rng.uniform(0.0, 1.0, size=(4, 5, 5, 3)).astype(np.float32)
    x[..., 0] *= 0.01
    x[:, 2, 2, 0] = 2000.0                      # channel 0: s = 80 at the peak, exp(s / a) = Inf in float32
    pos = np.array([True, False, True, False])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ref = ref_forward(x, np.full(3, 2.0, np.float32))
        m = ref["mask"].astype(np.float32)
        expect = ref_filter_grad(x, m, pos, 2.0)
    assert np.all(np.isfinite(expect)) and np.abs(expect[..., 0]).max() > 0
    _, dx, _ = run_layer(x, pos, upstream=np.zeros_like(x), dtype=np.float32, reduction="sum")
    assert np.all(np.isfinite(dx))
    np.testing.assert_allclose(dx, expect, rtol=1e-3, atol=1e-9)
