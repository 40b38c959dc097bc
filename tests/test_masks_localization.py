"""Masks & templates: where a filter fires in every kept sample (its map over the input image, mu
marked, positives beside negatives), the tightness verdict with n and the negatives' spread, and
dead filters marked in every filter picker; AppTest on demo-like synthetic runs, checked against
numpy on the arrays the reader returns."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")  # first: the imports below (noqa: E402) need Streamlit
from test_app import captions, ok, start  # noqa: E402
from test_app_featuremaps import recorded_figures  # noqa: E402

import inspector  # noqa: E402
from inspector import analysis  # noqa: E402
from inspector.analysis import plots  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402

STEP = 30       # the newest dump: the page's default


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mt_runs")
    make_synthetic_run(root / "img", steps=40, tensors=20, dump_every=10, image=(32, 32, 3), dead_filter=3)
    make_synthetic_run(root / "noimg", steps=40, tensors=20, dump_every=10)
    return root


@pytest.fixture
def figures(monkeypatch) -> dict:
    import viewer.app_pages.masks as mt
    return recorded_figures(monkeypatch, mt)


def blocks(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_localization_draws_every_sample_over_its_input(runs, figures):
    run = inspector.open_run(runs / "img")
    at = ok(start(runs / "img", "Masks & templates", query={"mt_filter": "5"}))
    assert at.subheader[0].value.startswith("Where filter 5 fires")          # first on the page
    groups = run.samples(STEP)["group"].to_numpy()
    post = np.asarray(run.tensor("icnn/post_mask:0", STEP))[..., 5]
    mu = np.asarray(run.tensor("icnn/mu:0", STEP))[:, 5]
    image = np.asarray(run.tensor("IteratorGetNext:0", STEP))
    fig = figures["mt_local"]
    axes = blocks(fig)
    n = {g: int((groups == g).sum()) for g in ("positive", "negative")}
    assert list(axes) == [f"positive (n={n['positive']})", f"negative (n={n['negative']})"]
    for g, ax in zip(("positive", "negative"), axes.values()):
        members = np.flatnonzero(groups == g)
        assert [t.get_text().split()[0] for t in ax.texts] == [f"#{i}" for i in members]
        mosaic = ax.images[0].get_array()
        for k, i in enumerate(members):
            # + at the centre of mu's cell, in the 32x32 image's pixels (tiles 33 px apart)
            r, c = analysis.mu_to_cell(mu[i], 8, 8)
            x, y = ax.lines[k].get_xydata()[0]
            assert (x - k * 33, y) == pytest.approx(((c + 0.5) * 4 - 0.5, (r + 0.5) * 4 - 0.5))
            tile = np.asarray(mosaic[:32, k * 33:k * 33 + 32], np.float64)
            grey = image[i] @ np.array([0.299, 0.587, 0.114])                 # the input, in grey
            lum = 0.15 + 0.6 * (grey - image[i].min()) / (image[i].max() - image[i].min())
            silent = plots.upsample(post[i], 32, 32) == 0
            assert silent.any() and np.allclose(tile[silent], lum[silent, None], atol=1e-6)   # the image shows
            if post[i].max() > 0.5 * post.max():
                loud = plots.upsample(post[i], 32, 32) > 0.5 * post.max()
                assert np.abs(tile[loud] - lum[loud, None]).max() > 0.2            # coloured where it fires
    cap = captions(at)
    assert "4 positive, 4 negative kept sample(s)" in cap and "+ marks mu" in cap


def test_localization_without_an_input_image_draws_the_maps(runs, figures):
    at = ok(start(runs / "noimg", "Masks & templates"))
    assert any("The model input was not dumped" in i.value for i in at.info)
    ax = next(iter(blocks(figures["mt_local"]).values()))
    assert ax.images[0].get_array().shape[0] == 8                            # 8x8 maps, one row of tiles


def test_verdict_pools_every_dump_step_and_states_n_and_intervals(runs):
    """By default every dump step's samples are pooled (4 steps x 4 = 16 of each group): the
    table's spreads are numpy's over them, the verdict names n and each ranked filter's
    interval; one step's 4 samples are "not enough samples", ranking nothing."""
    run = inspector.open_run(runs / "img")
    at = ok(start(runs / "img", "Masks & templates"))
    assert not at.dataframe and "live filters localized (all dump steps" in captions(at)   # the table on demand
    at.toggle(key="mt_table").set_value(True).run()
    table = next(df.value for df in ok(at).dataframe if "dead" in df.value.columns)
    steps = run.steps
    mu = np.concatenate([np.asarray(run.tensor("icnn/mu:0", s)) for s in steps])
    groups = np.concatenate([run.samples(s)["group"].to_numpy() for s in steps])
    want = {}
    for g in ("positive", "negative"):
        m = mu[groups == g]
        want[g] = np.linalg.norm(m - m.mean(0), axis=2).mean(0)              # [C]
        assert (table[f"{g} n"] == (groups == g).sum()).all() and (groups == g).sum() == 16
    live = ~table["dead"].to_numpy()
    np.testing.assert_allclose(table["positive / negative"][live], want["positive"][live] / want["negative"][live],
                               rtol=1e-6)
    lo, hi = table["ratio low"][live].to_numpy(), table["ratio high"][live].to_numpy()
    ratio = table["positive / negative"][live].to_numpy()
    assert (lo < hi).all() and ((lo <= ratio * 1.05) & (ratio <= hi * 1.05)).all()
    judged = table["localized"][live]
    assert judged.notna().all() and table["localized"][~live].isna().all()
    localized = (hi < 1) & ~table["fires on negatives"][live].to_numpy(bool)
    assert (judged.to_numpy(bool) == localized).all()
    cap = captions(at)
    assert (f"{int(localized.sum())} of {live.sum()} live filters localized (all dump steps, n = 16 positive, "
            "16 negative)") in cap
    best = int(np.nanargmin(np.where(live, want["positive"], np.nan)))
    row = table.set_index("filter").loc[best]
    assert (f"{best}: positives {want['positive'][best]:.3f} (n=16) vs negatives {want['negative'][best]:.3f} "
            f"(n=16), ratio {row['positive / negative']:.2f} [{row['ratio low']:.2f}, {row['ratio high']:.2f}]") in cap
    at.toggle(key="mt_pool").set_value(False).run()                           # one step: n = 4
    table = next(df.value for df in ok(at).dataframe if "dead" in df.value.columns)
    assert (table["positive n"] == 4).all() and table["localized"].isna().all()
    cap = captions(at)
    assert "not enough samples to judge (step 30: 4 positive, 4 negative; at least 8 of each needed)" in cap
    assert "Tightest live filters" not in cap


def test_negatives_that_fire_like_positives_are_not_localized():
    """mu of positives tight, of negatives spread: localized while the negatives fire weakly; the
    same filter is not when the negatives fire as strongly (counted against it)."""
    from inspector.analysis import localization
    rng = np.random.default_rng(0)
    mu = np.concatenate([rng.normal(0.3, 0.02, (16, 1, 2)), rng.uniform(-1, 1, (16, 1, 2))])
    groups = np.array(["positive"] * 16 + ["negative"] * 16)
    peak = rng.uniform(5, 9, 16)
    weak = np.r_[peak, rng.uniform(0, 1, 16)][:, None]
    strong = np.r_[peak, peak[::-1] * 1.05][:, None]                         # negatives as strong
    ok_ = localization.judge(mu, groups, weak)
    bad = localization.judge(mu, groups, strong)
    assert ok_["ratio high"][0] < 1 and bool(ok_["localized"][0]) and not ok_["fires on negatives"][0]
    assert bad["ratio high"][0] < 1 and bad["fires on negatives"][0] and not bool(bad["localized"][0])
    text = localization.verdict_text(bad, "all dump steps")
    assert text.startswith("0 of 1 live filters localized") and "1 fire as strongly on negatives" in text
    few = localization.judge(mu[12:20], groups[12:20], weak[12:20])           # 4 of each
    assert few["localized"].isna().all() and "not enough samples" in localization.verdict_text(few, "step 1")


def test_dead_filters_are_marked_in_every_picker(runs):
    at = ok(start(runs / "img", "Masks & templates"))
    assert at.selectbox(key="mt_filter").options[3] == "3 (dead)"
    icnn = {"fm_section": "ICNN mask layers"}
    at = ok(start(runs / "img", "Feature maps", query=icnn))
    assert at.selectbox(key="fm_filter").options[2:5] == ["2", "3 (dead)", "4"]
    at = ok(start(runs / "img", "Feature maps", query={"fm_tensor": "icnn/post_mask:0", "fm_section": "One channel"}))
    assert at.selectbox(key="fm_channel").options[3] == "3 (dead)"
    at = ok(start(runs / "noimg", "Feature maps", query=icnn))
    assert "(dead)" not in " ".join(at.selectbox(key="fm_filter").options)
