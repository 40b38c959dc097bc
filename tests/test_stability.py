"""Location instability (computeStability) and the TF-free template helpers."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from inspector.icnn import stability, templates
from inspector.format import ICNN_CLASS_ROLES, ICNN_ROLES


def _one_hot_maps(peaks, h=6, w=6):
    """maps [N, H, W, C] with a single activation at peaks[n][c] = (row, col, value)."""
    n, c = len(peaks), len(peaks[0])
    maps = np.zeros((n, h, w, c))
    for i in range(n):
        for k in range(c):
            r, q, v = peaks[i][k]
            maps[i, r, q, k] = v
    return maps


def test_filter_that_follows_the_part_is_perfectly_stable_and_one_that_stays_put_is_not():
    # Part k=0 moves along the diagonal; filter 0 follows it (constant offset), filter 1 stays at (0, 0).
    stride, center = 8.0, 4.0
    rows = [0, 1, 2, 3, 4]
    parts = np.array([[[center + stride * r + 3, center + stride * r + 4]] for r in rows])
    maps = _one_hot_maps([[(r, r, 1.0), (0, 0, 1.0)] for r in rows])
    per = stability.filter_instability(maps, parts, stride=stride, center=center)
    assert per[0] == pytest.approx(0.0, abs=1e-12)
    # Filter 1: distance from (4, 4) to the part = |(8r+3, 8r+4)| grows with r: std (ddof=1) known.
    d = np.hypot(8.0 * np.array(rows) + 3, 8.0 * np.array(rows) + 4)
    assert per[1] == pytest.approx(d.std(ddof=1))
    value = stability.location_instability(maps, parts, image_size=(40, 30), stride=stride, center=center)
    assert value == pytest.approx((0.0 + d.std(ddof=1)) / 2 / 50.0)   # diagonal of 40 x 30 is 50


def test_top_k_picks_the_images_with_the_largest_activation_and_parts_are_averaged():
    # 4 images; filter's activation at the part in the 3 strongest images, off in the weakest one.
    parts = np.array([[[0, 0], [3, 0]], [[1, 1], [4, 1]], [[2, 2], [5, 2]], [[0, 5], [3, 5]]], float)
    maps = _one_hot_maps([[(0, 0, 5.0)], [(1, 1, 4.0)], [(2, 2, 3.0)], [(5, 0, 0.5)]])
    per_all = stability.filter_instability(maps, parts, top_k=100)
    per_top3 = stability.filter_instability(maps, parts, top_k=3)
    assert per_top3[0] == pytest.approx(0.0)     # distance 0 to part 0 and 3 to part 1, always
    assert per_all[0] > 0.5
    # Averaged over parts: with the weak image, part 0 distance {0,0,0,5.39}, part 1 {3,3,3,5.39}.
    d0, d1 = np.array([0, 0, 0, np.hypot(5, 5)]), np.array([3, 3, 3, np.hypot(2, 5)])
    assert per_all[0] == pytest.approx((d0.std(ddof=1) + d1.std(ddof=1)) / 2)


def test_invalid_parts_are_skipped_and_too_few_images_give_nan():
    parts = np.array([[[0, 0]], [[1, 1]], [[np.nan, np.nan]], [[3, 3]]])
    maps = _one_hot_maps([[(0, 0, 1.0)], [(1, 1, 1.0)], [(5, 5, 9.0)], [(3, 3, 1.0)]])
    assert stability.filter_instability(maps, parts)[0] == pytest.approx(0.0)
    valid = np.array([[True], [False], [True], [False]])
    assert np.isnan(stability.filter_instability(maps, parts, valid=valid)[0])   # one usable image
    assert np.isnan(stability.location_instability(maps, parts, valid=valid, image_size=(6, 6)))


def test_select_ratio_averages_the_most_stable_filters():
    rows = [0, 1, 2, 3]
    parts = np.array([[[r, r]] for r in rows], float)
    maps = _one_hot_maps([[(r, r, 1.0), (0, 0, 1.0)] for r in rows])
    full = stability.location_instability(maps, parts, image_size=(3, 4))
    best = stability.location_instability(maps, parts, image_size=(3, 4), select_ratio=0.5)
    assert best == pytest.approx(0.0) and full > 0


def test_peak_positions_use_matlabs_column_major_first_maximum_and_separate_strides():
    # The release: [v, idx] = max(x, [], 1); [v, col] = max(v, [], 2): the lowest column wins,
    # then the lowest row in it. Row-major order would pick (1, 2).
    maps = np.zeros((1, 3, 4, 1))
    maps[0, 1, 2, 0] = maps[0, 2, 0, 0] = 2.0
    pos, score = stability.peak_positions(maps, stride=(2.0, 3.0), center=(0.5, 1.0))
    np.testing.assert_allclose(pos[0, 0], [0.5 + 2 * 2, 1.0 + 3 * 0])
    assert score[0, 0] == 2.0


def _hand_example():
    """3 x 3 raw conv maps (negative values included), 2 filters, 3 images, 2 parts; stride 4,
    center 2, so map cell (r, c) is pixel (2 + 4r, 2 + 4c). Peaks worked out by hand:
    filter 0: img0 tie 3 at (0,2) and (2,1) -> column-major first (2,1) = px (10, 6);
              img1 5 at (1,1) = (6, 6); img2 all negative, tie -0.2 at (0,0), (2,0) -> (0,0) = (2, 2).
    filter 1: img0 1 at (0,0) = (2, 2); img1 2 at (2,2) = (10, 10); img2 4 at (1,0) = (6, 2)."""
    maps = np.full((3, 3, 3, 2), -1.0)
    maps[2, :, :, 0] = -0.5
    maps[0, 0, 2, 0] = maps[0, 2, 1, 0] = 3.0
    maps[1, 1, 1, 0] = 5.0
    maps[2, 0, 0, 0] = maps[2, 2, 0, 0] = -0.2
    maps[0, 0, 0, 1], maps[1, 2, 2, 1], maps[2, 1, 0, 1] = 1.0, 2.0, 4.0
    nan = np.nan
    parts = np.array([[[10, 6], [2, 14]], [[6, 10], [nan, nan]], [[2, 2], [10, 2]]], float)
    return maps, parts


def test_location_instability_matches_a_hand_computed_example():
    maps, parts = _hand_example()
    kw = dict(stride=4.0, center=2.0)
    # Distances peak -> part, by hand (part 1 is missing in image 1).
    f0 = (np.std([0, 4, 0], ddof=1) + np.std([np.hypot(8, 8), 8], ddof=1)) / 2
    f1 = (np.std([np.hypot(8, 4), 4, 4], ddof=1) + np.std([12, 4], ddof=1)) / 2
    np.testing.assert_allclose(stability.filter_instability(maps, parts, **kw), [f0, f1], rtol=1e-12)
    value = stability.location_instability(maps, parts, image_size=(12, 16), **kw)   # diagonal 20
    assert value == pytest.approx((f0 + f1) / 2 / 20.0, rel=1e-12)
    assert value == pytest.approx(0.16455, abs=5e-5)
    # top-2 by raw peak: filter 0 keeps images 1 (5) and 0 (3) for part 0; the all-negative
    # image 2 (-0.2) still counts for part 1, where only images 0 and 2 are annotated.
    top2 = stability.filter_instability(maps, parts, top_k=2, **kw)
    assert top2[0] == pytest.approx((np.std([4, 0], ddof=1) + np.std([np.hypot(8, 8), 8], ddof=1)) / 2)
    # select_ratio 0.5 of 2 filters keeps round(1) = 1: the more stable filter 0.
    best = stability.location_instability(maps, parts, image_size=(12, 16), select_ratio=0.5, **kw)
    assert best == pytest.approx(f0 / 20.0)


def test_part_consistency_counts_the_part_each_peak_lands_on():
    maps, parts = _hand_example()
    cons, part = stability.part_consistency(maps, parts, stride=4.0, center=2.0, radius=3.0)
    # filter 0: img0 (10,6) on part 0 (0 px); img1 (6,6): part 0 is 4 px away -> no part;
    #           img2 (2,2) on part 0 (0 px). Part 0 in 2 of 3 images.
    # filter 1: img0 (2,2) -> nearest part 0 at 8.9 px, part 1 at 12 px: none; img1 (10,10) -> part 0 at
    #           4 px: none; img2 (6,2) -> 4 px from both: none. No peak on a part: 0, part -1.
    np.testing.assert_allclose(cons, [2 / 3, 0.0])
    assert part.tolist() == [0, -1]
    cons, part = stability.part_consistency(maps, parts, stride=4.0, center=2.0, radius=4.5)
    # radius 4.5: filter 1 img1 -> part 0 (4 px); img2 -> tie at 4 px, argmin takes part 0: part 0 in 2 of 3.
    np.testing.assert_allclose(cons, [1.0, 2 / 3])
    with pytest.raises(ValueError, match="radius must be > 0"):
        stability.part_consistency(maps, parts, radius=0)


@pytest.mark.parametrize("maps_shape,parts_shape,match", [
    ((4, 5, 5), (4, 1, 2), "maps must be"),
    ((4, 5, 5, 2), (3, 1, 2), "parts must be"),
    ((4, 5, 5, 2), (4, 1, 3), "parts must be"),
])
def test_bad_shapes_raise_value_errors_naming_the_shape(maps_shape, parts_shape, match):
    with pytest.raises(ValueError, match=match):
        stability.location_instability(np.zeros(maps_shape), np.zeros(parts_shape), image_size=(8, 8))


def test_bad_options_raise():
    maps, parts = np.zeros((3, 2, 2, 1)), np.zeros((3, 1, 2))
    with pytest.raises(ValueError, match="valid must be"):
        stability.filter_instability(maps, parts, valid=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="image_size"):
        stability.location_instability(maps, parts, image_size=(0, 5))
    with pytest.raises(ValueError, match="top_k"):
        stability.filter_instability(maps, parts, top_k=0)


# ----------------------------------------------------------------------------- templates
def test_positive_templates_follow_the_mask_formula_on_non_square_maps():
    h, w, beta = 3, 5, 1.5
    t = templates.positive_templates(h, w, beta=beta)
    assert t.shape == (h * w, h, w)
    gy, gx = np.linspace(-1, 1, h), np.linspace(-1, 1, w)
    idx = 1 * w + 3                          # mu = (gy[1], gx[3])
    for r in range(h):
        for c in range(w):
            expect = max(1 - beta * (abs(gy[r] - gy[1]) + abs(gx[c] - gx[3])), -1)
            assert t[idx, r, c] == pytest.approx(expect)
    assert t[idx, 1, 3] == 1.0 and t.min() == -1.0
    scaled = templates.positive_templates(h, w, beta=beta, scale=True)
    np.testing.assert_allclose(scaled, t * 0.5 / (h * w))
    np.testing.assert_allclose(templates.negative_template(h, w, scale=True), -0.5 / (h * w))


def test_positive_templates_for_dumped_mu():
    mu = np.array([[-1.0, 1.0]])
    t = templates.positive_templates(4, 4, beta=2.0, mu=mu)
    assert t.shape == (1, 4, 4) and t[0, 0, 3] == 1.0 and t[0, 3, 0] == -1.0
    with pytest.raises(ValueError, match=r"\[M, 2\]"):
        templates.positive_templates(4, 4, mu=np.zeros(3))


def test_icnn_layers_lists_one_row_per_layer_with_a_column_per_role():
    rows = [("a/pre_mask:0", "a", "pre_mask"), ("a/mask:0", "a", "mask"), ("conv/Relu:0", None, None),
            ("b/mu:0", "b", "mu"), ("a/mu:0", "a", "mu")]
    cat = pd.DataFrame(rows, columns=["name", "icnn_layer", "icnn_role"])
    out = templates.icnn_layers(cat)
    assert list(out.columns) == ["layer", *ICNN_ROLES, *ICNN_CLASS_ROLES]
    assert out["layer"].tolist() == ["a", "b"]
    a = out.set_index("layer").loc["a"]
    assert a["mask"] == "a/mask:0" and a["mu"] == "a/mu:0" and a["beta"] is None
    assert templates.icnn_layers(cat.iloc[2:3]).empty
    with pytest.raises(ValueError, match="icnn_role"):
        templates.icnn_layers(cat.drop(columns=["icnn_role"]))
