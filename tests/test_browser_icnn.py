"""The ICNN pages in a real browser (``streamlit run`` + headless Chromium, as tests/test_browser.py):
Masks & templates opens on the filter's map over every kept sample's input image, before the
other figures, and marks dead filters in its picker; Feature maps marks them too. With
``TF_INSPECTOR_SHOTS`` set, the screenshots for docs/viewer/ are written there
(``viewer-masks.png``, ``viewer-featuremaps.png``). Skips where /usr/bin/chromium or playwright is
missing (via tests/test_browser.py)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

# browser: test_browser's fixture (hence noqa: F811 where a test takes it)
from test_browser import browser, heading_shown, serve, wait_rendered  # noqa: F401
from test_browser_graph import doc_shot

from inspector.testing import make_synthetic_run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    make_synthetic_run(runs / "icnn", steps=40, tensors=20, dump_every=10, image=(48, 48, 3), dead_filter=3)
    with serve(runs) as url:
        yield url


@contextlib.contextmanager
def shown(chromium, url: str, heading: str, images: int, height: int) -> Iterator:
    """A page at ``url``, drawn (its heading and ``images`` images loaded); checked for exceptions after."""
    page = chromium.new_page(viewport={"width": 1500, "height": height})
    try:
        page.goto(url, wait_until="domcontentloaded")
        heading_shown(page, heading)
        wait_rendered(page, images)
        yield page
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def dead_option_listed(page) -> None:
    """The "Filter" picker offers filter 3 as "3 (dead)"."""
    box = page.get_by_role("combobox", name="Filter").first
    box.scroll_into_view_if_needed()
    box.click()
    page.get_by_role("option", name="3 (dead)", exact=True).wait_for(timeout=90_000)


def test_masks_page_leads_with_every_sample_and_marks_dead_filters(server, browser):  # noqa: F811
    with shown(browser, f"{server}/masks?run=icnn&mt_filter=5", "Masks & templates", 2, 2600) as page:
        order = page.evaluate("""() => [...document.querySelectorAll('h2, h3, [data-testid="stImage"] img')]
            .map(e => e.tagName === 'IMG' ? 'img:' + e.naturalWidth : e.innerText.trim())""")
        first_heading = next(i for i, e in enumerate(order) if e.startswith("Where filter 5 fires"))
        scatter = next(i for i, e in enumerate(order) if e.startswith("mu of positive"))
        assert order[first_heading + 1].startswith("img:") and int(order[first_heading + 1][4:]) > 600, order
        assert first_heading < scatter
        page.get_by_text("4 positive, 4 negative kept sample(s)").first.wait_for(timeout=90_000)
        doc_shot(page, "viewer-masks.png")
        dead_option_listed(page)


def test_feature_maps_marks_dead_filters(server, browser):  # noqa: F811
    with shown(browser, f"{server}/featuremaps?run=icnn&fm_section=ICNN+mask+layers", "Feature maps", 1, 3000) as page:
        doc_shot(page, "viewer-featuremaps.png")
        dead_option_listed(page)
