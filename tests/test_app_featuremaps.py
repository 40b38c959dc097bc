"""The Feature maps page with AppTest on demo-like runs (a model input, convolutions, an ICNN
layer): the default tensor, the channel pager, the overlay on the input image, the groups and
the top-activating samples, each checked against numpy / Pillow on the arrays the reader returns."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")  # first: the imports below (noqa: E402) need Streamlit
from PIL import Image  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import inspector  # noqa: E402
from inspector.analysis import plots  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEP = 10


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fm_runs")
    # demo-like: the input images first in the catalog, then conv1/Conv2D:0 ...; conv3 has 72 channels
    make_synthetic_run(root / "demo", steps=20, tensors=20, dump_every=10, image=(32, 32, 3), channels=72)
    make_synthetic_run(root / "noinput", steps=20, tensors=20, dump_every=10)
    return root


@pytest.fixture(autouse=True)
def _restore_runs_env(monkeypatch):
    monkeypatch.setenv("TF_INSPECTOR_RUNS", "")


def recorded_figures(monkeypatch, page) -> dict:
    """The Matplotlib figures the page module ``page`` shows, by widget key (its show_cached_figure,
    recorded)."""
    shown: dict = {}
    real = page.show_cached_figure

    def record(make, ident, name, key, caption=None):
        shown[key] = make()   # drawn here too: the page's own PNG may come from its cache
        return real(make, ident, name, key, caption)
    monkeypatch.setattr(page, "show_cached_figure", record)
    return shown


@pytest.fixture
def figures(monkeypatch) -> dict:
    import viewer.app_pages.featuremaps as fm
    return recorded_figures(monkeypatch, fm)


def start(run: Path, **state) -> AppTest:
    """The page on ``run`` with the widgets ``state`` (key: value) chosen."""
    os.environ["TF_INSPECTOR_RUNS"] = str(run.parent)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.switch_page("viewer/app_pages/featuremaps.py")
    at.query_params["run"] = run.name
    for k, v in state.items():
        at.session_state[k] = v
    return ok(at.run())


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error], [e.value for e in at.error]
    return at


def test_opens_on_the_first_convolution_output(runs):
    run = inspector.open_run(runs / "demo")
    cat = run.tensors
    four_d = [n for n in cat["name"] if len(cat.loc[n, "shape"] or []) == 4]
    assert cat.loc[four_d[0], "op_type"] == "IteratorGetNext"      # the old default: the input image
    first_conv = next(n for n in cat["name"] if cat.loc[n, "op_type"] == "Conv2D")
    at = start(runs / "demo")
    assert at.selectbox(key="fm_tensor").value == first_conv == "conv1/Conv2D:0"


def test_channel_pager_reaches_the_last_channel(runs, figures):
    x = np.asarray(inspector.open_run(runs / "demo").tensor("conv3/Relu:0", STEP))
    assert x.shape[-1] == 72 > 64
    at = start(runs / "demo", fm_tensor="conv3/Relu:0", fm_sample=2)
    pager = at.selectbox(key="fm_page")
    assert pager.options == ["0-63", "64-71"]
    assert pager.proto.query_param_key == "fm_page"
    assert labels(figures["fm_grid"].axes[0])[-1] == "ch 63"
    ok(pager.set_value(1).run())
    grid = figures["fm_grid"].axes[0]
    assert labels(grid) == [f"ch {c}" for c in range(64, 72)]
    sample = at.selectbox(key="fm_sample").value
    assert sample == 2
    np.testing.assert_array_equal(drawn(grid), plots.mosaic([x[sample, ..., c] for c in range(64, 72)], cols=8))
    at.radio(key="fm_section").set_value("One channel").run()            # the channel picker's section
    ok(at.selectbox(key="fm_channel").set_value(71).run())
    assert "channel 71" in figures["fm_top"].get_suptitle()


def labels(ax) -> list[str]:
    """The tile labels of a mosaic axes (plots.mosaic: one image, one label per tile)."""
    return [t.get_text() for t in ax.texts]


def drawn(ax) -> np.ndarray:
    """The mosaic image of ``ax``, NaN where nothing is drawn."""
    return np.ma.filled(ax.images[0].get_array().astype(np.float64), np.nan)


def pil_bilinear(m: np.ndarray, h: int, w: int) -> np.ndarray:
    """An independent reference: Pillow's bilinear resize of a float image (enlarging)."""
    return np.asarray(Image.fromarray(np.asarray(m, np.float32), mode="F").resize((w, h), Image.BILINEAR))


@pytest.mark.parametrize("shape,size", [((8, 8), (32, 32)), ((5, 7), (21, 30)), ((1, 2), (4, 4))])
def test_upsample_matches_pillow(shape, size):
    m = np.random.default_rng(0).normal(size=shape)
    np.testing.assert_allclose(plots.upsample(m, *size), pil_bilinear(m, *size), rtol=1e-5, atol=1e-5)


def test_overlay_on_the_input_image(runs, figures):
    run = inspector.open_run(runs / "demo")
    at = start(runs / "demo", fm_section="One channel", fm_sample=5, fm_channel=3)
    sample, ch = at.selectbox(key="fm_sample").value, at.selectbox(key="fm_channel").value
    assert (sample, ch) == (5, 3)
    heat = np.asarray(run.tensor("conv1/Conv2D:0", STEP))[sample, ..., ch]       # 16 x 16
    image = np.asarray(run.tensor("IteratorGetNext:0", STEP))[sample]              # 32 x 32 x 3
    fig = figures["fm_overlay"]
    under, over = fig.axes[2].images
    assert over.get_alpha() == 0.5
    np.testing.assert_allclose(np.asarray(over.get_array()), pil_bilinear(heat, 32, 32), rtol=1e-5, atol=1e-5)
    scaled = (image - image.min()) / (image.max() - image.min())
    np.testing.assert_allclose(np.asarray(under.get_array()), scaled, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(fig.axes[1].images[0].get_array(), heat)   # the channel as stored


def test_overlay_says_when_the_input_was_not_dumped(runs, figures):
    at = start(runs / "noinput", fm_section="One channel")
    assert any("The model input was not dumped" in i.value for i in at.info)
    assert "fm_overlay" not in figures and "fm_top" in figures


@pytest.mark.parametrize("stat", ["max", "mean"])
def test_top_samples_are_ranked_like_numpy(runs, figures, stat):
    x = np.asarray(inspector.open_run(runs / "demo").tensor("conv2/Relu:0", STEP))[..., 6]
    values = x.max(axis=(1, 2)) if stat == "max" else x.mean(axis=(1, 2))
    order = np.argsort(-values, kind="stable")
    at = start(runs / "demo", fm_section="One channel", fm_tensor="conv2/Relu:0", fm_channel=6, fm_rank=stat)
    assert at.radio(key="fm_rank").value == stat
    table = at.dataframe[0].value
    assert table["sample"].tolist() == order.tolist()
    np.testing.assert_allclose(table[stat].to_numpy(), values[order], rtol=1e-6)
    top = figures["fm_top"].axes[0]
    assert [t.split()[0] for t in labels(top)] == [f"#{i}" for i in order[:8]]
    assert labels(top)[0].endswith(f"{stat} {values[order[0]]:.3g}")
    np.testing.assert_array_equal(drawn(top), plots.mosaic([x[i] for i in order[:8]], cols=8, lines=2))


def test_every_sample_split_by_the_dumps_groups(runs, figures):
    run = inspector.open_run(runs / "demo")
    groups = run.samples(STEP)["group"].to_numpy()
    assert set(groups) == {"positive", "negative"}
    start(runs / "demo", fm_section="One channel", fm_channel=2)
    fig = figures["fm_groups"]
    blocks = {ax.get_title().split(" (")[0]: ax for ax in fig.axes if ax.get_title()}
    assert list(blocks) == ["positive", "negative"]           # side by side, in the run's group order
    x = np.asarray(run.tensor("conv1/Conv2D:0", STEP))[..., 2]
    for g, ax in blocks.items():
        members = np.flatnonzero(groups == g)
        assert labels(ax) == [f"#{i}" for i in members]
        np.testing.assert_array_equal(drawn(ax), plots.mosaic([x[i] for i in members], cols=min(4, len(members))))


def test_cached_figures_follow_every_choice(runs):
    """Figures are drawn once per choice (a PNG cache): each choice redraws exactly the figures
    that show it, and only those; one section is drawn at a time."""
    def images(at):
        return [u for im in at.image for u in im.value]
    at = start(runs / "demo")
    grid, = images(at)                                      # the default section: every channel
    at.radio(key="fm_section").set_value("One channel").run()
    over, groups, top = images(ok(at))                      # over the input, by group, top samples
    ok(at.selectbox(key="fm_channel").set_value(1).run())
    assert len({over, groups, top} & set(images(at))) == 0
    over, groups, top = images(at)
    ok(at.selectbox(key="fm_sample").set_value(4).run())
    new = images(at)
    assert new[0] != over and new[1:] == [groups, top]      # the sample: the overlay only
    ok(at.radio(key="fm_rank").set_value("mean").run())
    assert images(at)[2] != top and images(at)[:2] == new[:2]
    ok(at.radio(key="fm_kind").set_value("gradient").run())
    assert all(a != b for a, b in zip(images(at), new))
    at.radio(key="fm_section").set_value("Every channel of one sample").run()
    assert images(ok(at))[0] not in (grid, *new)            # sample 4's gradient, not sample 0's forward
    at.radio(key="fm_section").set_value("ICNN mask layers").run()
    icnn, = images(ok(at))
    assert icnn not in (grid, *new)
