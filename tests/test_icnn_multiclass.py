"""Multi-class ICNN (the release's class-specific filter slices and per-class weights) against
a NumPy reference that follows our_vl_simplenn.m's loop over classes (``Div``)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
tf1 = tf.compat.v1

from inspector.icnn import layer as icnn  # noqa: E402
from test_icnn_layer import A, _fix_inf, random_maps, ref_forward  # noqa: E402


def ref_multiclass(x, m, labels, fclass, density, epoch, beta):
    """(filter-loss term at x, beta pseudo-gradient): per class lab, dList = its filters,
    list = its positives, list_neg = every other image; weights 0.5/density, 0.5/(1-density)."""
    n, h, w, c = x.shape
    s = (x * m).mean(axis=(1, 2))
    sv = ref_forward(x, beta)["sqrtvar"]
    lzp = _fix_inf(A * np.log(np.mean(np.exp((x * m[::-1, :, :, ::-1]).mean(axis=(1, 2)) / A), axis=0)))
    lzn = _fix_inf(A * np.log(np.mean(np.exp((-x).mean(axis=(1, 2)) / A), axis=0)))
    mag = max(epoch, 1.0) / 0.1
    d, dbeta = np.zeros_like(x), np.zeros(c)
    for lab in range(labels.shape[1]):
        w_pos, w_neg = 0.5 / density[lab], 0.5 / (1 - density[lab])
        dl = np.flatnonzero(fclass == lab)
        pos, neg = np.flatnonzero(labels[:, lab]), np.flatnonzero(~labels[:, lab])
        for rows, sign in ((pos, -1), (neg, +1)):
            if rows.size == 0 or dl.size == 0:
                continue
            if sign < 0:
                ss = s[np.ix_(rows, dl)]
                g = np.exp(ss / A) * (ss - lzp[dl] + A)
            else:
                sn = x[rows][..., dl].mean(axis=(1, 2))
                g = np.exp(-sn / A) * (-sn - lzn[dl] + A)
            g = _fix_inf(g)
            g[np.isnan(g)] = 0
            with np.errstate(divide="ignore", invalid="ignore"):
                g = g / (g.mean(axis=0, keepdims=True) * mag)
            g[np.isnan(g)] = 0
            g = _fix_inf(g)
            for a_, i in enumerate(rows):
                for b_, k in enumerate(dl):
                    if sign < 0:
                        d[i, :, :, k] -= m[i, :, :, k] * g[a_, b_] * 1e-5 * w_pos
                    else:
                        d[i, :, :, k] += g[a_, b_] * 1e-5 * w_neg
        for k in dl:
            t = (s[pos, k] * sv[pos, k]).sum() / s[pos, k].sum()
            dbeta[k] = (beta[k] - min(max(3.0 / t, 1.5), 3.0)) * 1e4
    return d, dbeta


def _run(x, labels, epoch, beta, **kw):
    with tf.Graph().as_default():
        xt = tf.constant(x)
        post = icnn.conv_mask(xt, tf.constant(labels), tf.constant(epoch, tf.float32), name="m",
                              reduction="sum", beta_lr_mult=1.0, **kw)
        (bv,) = tf1.get_collection(icnn.BETA_COLLECTION)
        grads = tf.gradients(tf.reduce_sum(post * 0.0), [xt, bv])   # the filter-loss term alone
        mask = tf1.get_default_graph().get_tensor_by_name("m/mask:0")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(bv.assign(beta))
            return sess.run([mask, *grads])


def test_three_classes_with_filter_slices_match_the_release_loop():
    x = random_maps(9, 5, 5, 6, seed=4)
    labels = np.zeros((9, 3), bool)
    labels[[0, 3, 6], 0] = labels[[1, 4], 1] = labels[[2, 7], 2] = True    # image 5, 8: background
    fclass = np.array([0, 1, 2, 0, 1, 2])
    density = np.array([0.2, 0.3, 0.25])
    beta = np.linspace(1.6, 2.8, 6)
    m, dx, db = _run(x, labels, 2.0, beta, filter_class=fclass, class_density=density)
    ref_dx, ref_db = ref_multiclass(x, m, labels, fclass, density, 2.0, beta)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-9, atol=1e-18)
    np.testing.assert_allclose(db, ref_db, rtol=1e-9)
    # Not the single-class result on "any class": the slices and weights matter.
    single = _run(x, labels.any(axis=1), 2.0, beta)[1]
    assert np.abs(single - dx).max() > 1e-3 * np.abs(dx).max()


def test_more_than_ten_classes_use_uniform_weights_and_bad_arguments_are_refused():
    x = random_maps(12, 4, 4, 12, seed=5)
    labels = np.eye(12, dtype=bool)
    fclass = np.arange(12)
    m, dx, _ = _run(x, labels, 1.0, np.full(12, 2.0), filter_class=fclass)
    ref_dx, _ = ref_multiclass(x, m, labels, fclass, np.full(12, 1 / 12), 1.0, np.full(12, 2.0))
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-9, atol=1e-18)
    with tf.Graph().as_default():
        xt = tf.constant(x[:, :, :, :3])
        lab3 = tf.constant(labels[:, :3])
        with pytest.raises(ValueError, match="class_density must be K shares"):
            icnn.conv_mask(xt, lab3, 1.0, filter_class=[0, 1, 2])
        with pytest.raises(ValueError, match="filter_class must be an int vector"):
            icnn.conv_mask(xt, lab3, 1.0, filter_class=[0, 1, 3], class_density=[0.3, 0.3, 0.3])
        with pytest.raises(ValueError, match="need labels_positive of shape"):
            icnn.conv_mask(xt, tf.constant(labels[:, 0]), 1.0, filter_class=[0, 1, 2])
