"""Issue 47 in a real browser (``streamlit run`` + headless Chromium, as tests/test_browser.py):
the two groups' heatmaps share one colour scale and the ratio view is drawn; a 60-step run's
heatmap has 60 columns; a labels cast is not drawn among the layers; and no text of any page's
SVG figure (Vega-Lite charts, Graphviz graphs; tabs opened by a click) is drawn smaller than 11 CSS px at the default
width. Skips where /usr/bin/chromium or playwright is missing (via tests/test_browser.py)."""
from __future__ import annotations


import pytest
from test_browser import (URLS, browser, serve, wait_charts,  # noqa: F401
                          wait_rendered)
from test_browser import heatmap_page as overview
from test_viewer_groups import CAST, with_labels_cast

from inspector.stats.summary import summarize_part
from inspector.testing import make_synthetic_run

#: The smallest text a figure may draw, in CSS pixels
MIN_PX = 11
#: Each SVG text's drawn size: its font size times the SVG's scale to the page (a Graphviz graph
#: fitted to the page width shrinks its labels with it)
SVG_TEXT = """() => [...document.querySelectorAll('svg text')].filter(t => t.textContent.trim()
        && t.getClientRects().length).map(t => {
    const m = t.getScreenCTM(), px = parseFloat(getComputedStyle(t).fontSize);
    return [t.textContent.trim().slice(0, 40), px * Math.hypot(m.a, m.b)]; })"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    try:
        with_labels_cast(mp)
        make_synthetic_run(runs / "exp1", steps=60, tensors=20, dump_every=20, image=(32, 32, 3))
    finally:
        mp.undo()
    for part in sorted((runs / "exp1" / "stats").glob("*.parquet")):
        summarize_part(runs / "exp1", part)        # 2-step summary bins: not the columns drawn
    make_synthetic_run(runs / "exp2", steps=30, tensors=20, dump_every=15, seed=1)
    with serve(runs) as url:
        yield url


HEATMAP = """() => { const img = document.querySelector('.tfi-heatmap img');
    return {w: img.naturalWidth, labels: [...document.querySelectorAll('.tfi-heatmap .label')].map(e => e.textContent),
            ticks: [...document.querySelectorAll('.tfi-heatmap .btick')].map(e => e.textContent),
            note: document.querySelector('.tfi-heatmap .legend .note').textContent,
            title: document.querySelector('.tfi-heatmap .title').textContent}; }"""


def test_groups_share_a_scale_and_the_ratio_is_drawn_and_sixty_steps_are_sixty_columns(server, browser):  # noqa: F811
    seen = {}
    for group in ("positive", "negative", "negative+%2F+positive"):
        page = overview(browser, f"{server}/overview?run=exp1&ov_group={group}")
        try:
            seen[group] = page.evaluate(HEATMAP)
        finally:
            page.close()
    pos, neg, ratio = seen["positive"], seen["negative"], seen["negative+%2F+positive"]
    assert pos["w"] == neg["w"] == ratio["w"] == 60                       # one column per statistics step
    assert len(pos["ticks"]) >= 3 and pos["ticks"] == neg["ticks"]        # one labelled scale for both
    assert "one scale for positive and negative" in pos["note"]
    assert ratio["title"] == "gradient l2 (negative / positive)" and "orange where negatives'" in ratio["note"]
    assert ratio["ticks"] != pos["ticks"]


def test_a_labels_cast_is_not_drawn_among_the_layers(server, browser):  # noqa: F811
    page = overview(browser, f"{server}/overview?run=exp1")
    try:
        rows = [lb.split(" ")[0] for lb in page.evaluate(HEATMAP)["labels"]]
        assert "dense/BiasAdd:0" in rows and CAST not in rows and "loss/Mean:0" not in rows
    finally:
        page.close()
    page = overview(browser, f"{server}/overview?run=exp1&ov_plumbing=true")
    try:
        rows = [lb.split(" ")[0] for lb in page.evaluate(HEATMAP)["labels"]]
        assert CAST in rows                                               # drawn when asked for
    finally:
        page.close()


#: page -> the query that opens its SVG figures, how many there are at least, and the tab clicked
#: before reading them (None: the page as opened). A page draws only its open tab's figures: a link
#: naming the Training overview's tensor opens its series, one naming the ridge plot's kind the
#: ridge plot; the Summary's op types, the dumped samples and the percentile bands are reached by
#: their tab here
SVG_PAGES = {"Summary": ("", 3, None), "Summary (Run details)": ("", 2, "Run details"),
             "Training overview": ("ov_tensor=conv3/Relu:0", 1, None), "Distributions": ("", 1, None),
             "Distributions (Dumped samples)": ("", 1, "Dumped samples"),
             "Distributions (ridge)": ("di_ridge_kind=forward", 1, None),
             "Distributions (Across steps)": ("", 1, "Across steps"),
             "Distributions (Percentile bands)": ("", 1, "Percentile bands"), "Compare": ("", 1, None),
             "Op graph": ("", 0, None), "Op graph (whole model)": ("gr_view=Whole+model", 0, None)}


def open_tab(page, label: str) -> None:
    """Click the tab ``label`` and wait until its panel shows a drawn SVG figure (the tab's
    content is drawn by the rerun the click starts, not before)."""
    page.get_by_role("tab", name=label).click()
    panel = page.get_by_role("tabpanel", name=label)
    panel.locator(".vega-embed svg text").first.wait_for(timeout=90_000)
    wait_rendered(page, 0, 90_000)


@pytest.mark.parametrize("name", list(SVG_PAGES))
def test_no_figure_text_is_smaller_than_11_px(server, browser, name):  # noqa: F811
    query, charts, tab = SVG_PAGES[name]
    path = URLS[name.split(" (")[0]]
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        page.goto(f"{server}/{path}?run=exp1&{query}", wait_until="domcontentloaded")
        wait_rendered(page, 0, 90_000)
        if tab:
            open_tab(page, tab)
        if charts:
            wait_charts(page, charts)
        if name.startswith("Op graph"):
            page.locator('[data-testid="stGraphVizChart"] svg text').first.wait_for(timeout=90_000)
        sizes = page.evaluate(SVG_TEXT)
        assert sizes
        small = [(t, round(px, 1)) for t, px in sizes if px < MIN_PX - 0.05]
        assert not small, small[:10]
    finally:
        page.close()


#: page (and section) -> its URL path and query, and the Matplotlib images it shows at least
#: (tests/test_readable_figures.py checks their texts at the width viewer.ui.FIGURE_WIDTH_PX: here,
#: that the page draws them unshrunk); the pages with sections draw one at a time
IMAGE_PAGES = {"Feature maps": ("featuremaps?", 1), "Feature maps, one channel": ("featuremaps?fm_section=One+channel&", 2),
               "Feature maps, ICNN": ("featuremaps?fm_section=ICNN+mask+layers&", 1),
               "Masks & templates": ("masks?", 2), "Masks, beta": ("masks?mt_section=beta+and+filter+loss&", 2),
               "Masks, templates": ("masks?mt_section=Templates+T_mu&", 2), "Tensor browser": ("browser?", 1)}
IMAGE_SCALES = """() => [...document.querySelectorAll('[data-testid="stImage"] img')]
    .map(i => [i.naturalWidth, i.getBoundingClientRect().width])"""


@pytest.mark.parametrize("name", list(IMAGE_PAGES))
def test_matplotlib_figures_are_drawn_at_their_own_size(server, browser, name):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 3000})
    try:
        where, n = IMAGE_PAGES[name]
        page.goto(f"{server}/{where}run=exp1", wait_until="domcontentloaded")
        wait_rendered(page, n, 120_000)
        scales = page.evaluate(IMAGE_SCALES)
        assert len(scales) >= n
        shrunk = [(w, round(shown)) for w, shown in scales if shown < w - 1]
        assert not shrunk, shrunk              # (PNG width, drawn width): its labels shrunk with it
    finally:
        page.close()
