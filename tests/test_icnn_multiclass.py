"""Multi-class ICNN (the release's class-specific filter slices and per-class weights) against
a NumPy reference that follows our_vl_simplenn.m's loop over classes (``Div``)."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
tf1 = tf.compat.v1

from inspector.icnn import layer as icnn  # noqa: E402
from icnn_ref import random_maps, ref_beta_grad, ref_filter_grad, ref_forward, run_layer  # noqa: E402


def ref_multiclass(x, m, labels, fclass, density, epoch, beta):
    """(filter-loss term at x, beta pseudo-gradient): per class lab, dList = its filters,
    list = its positives, list_neg = every other image; weights 0.5/density, 0.5/(1-density)."""
    ref = ref_forward(x, beta)
    d, dbeta = np.zeros_like(x), np.zeros(x.shape[3])
    for lab in range(labels.shape[1]):
        part, pos = fclass == lab, labels[:, lab]
        d += ref_filter_grad(x, m, pos, epoch, part, 0.5 / density[lab], 0.5 / (1 - density[lab]))
        dbeta += ref_beta_grad(beta, ref["strength"], ref["sqrtvar"], pos, part)
    return d, dbeta


def _run(x, labels, epoch, beta, **kw):
    """mask, the filter-loss term alone at x (zero upstream) and d beta, at the release's scale."""
    vals, dx, db = run_layer(x, labels, epoch, beta=beta, upstream=np.zeros_like(x), name="m", reduction="sum",
                             beta_lr_mult=1.0, **kw)
    return vals["mask"], dx, db


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


def test_multiclass_layer_registers_its_labels_and_filter_slices():
    from inspector.format import ICNN_COLLECTION, icnn_catalog_fields, icnn_entry, parse_icnn_entry
    x = random_maps(6, 4, 4, 4, seed=6)
    labels = np.zeros((6, 2), bool)
    labels[[0, 2], 0] = labels[[1], 1] = True
    with tf.Graph().as_default() as g:
        icnn.conv_mask(tf.constant(x), tf.constant(labels), 1.0, name="m", part_filters=3, filter_class=[1, 0, 1, 0],
                       class_density=[0.3, 0.2])
        entries = {parse_icnn_entry(e)[1]: e for e in g.get_collection(ICNN_COLLECTION)}
        assert icnn_catalog_fields(entries["class_positive"]) == {"icnn_filter_class": [1, 0, 1, -1]}
        assert all(icnn_catalog_fields(e) == {} for r, e in entries.items() if r != "class_positive")
        with tf1.Session() as sess:
            np.testing.assert_array_equal(sess.run("m/class_positive:0"), labels.astype(np.float64))
    with tf.Graph().as_default() as g:     # single class: no class role
        icnn.conv_mask(tf.constant(x), tf.constant(labels[:, 0]), 1.0, name="m")
        assert "class_positive" not in {parse_icnn_entry(e)[1] for e in g.get_collection(ICNN_COLLECTION)}
    with pytest.raises(ValueError, match="filter_class goes with role 'class_positive'"):
        icnn_entry("m", "mask", "m/mask:0", [0])
