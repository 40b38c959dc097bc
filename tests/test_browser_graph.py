"""The op graph page and op source locations in a real browser (``streamlit run`` + headless
Chromium, as tests/test_browser.py): Graphviz draws the SVG with the NaN ops red, the step slider
starts at the first NaN, the whole-model view draws its scopes, the op picker opens the tensor
browser, and the first NaN's source location is on the Summary. With ``TF_INSPECTOR_SHOTS`` set,
the page's screenshots for docs/viewer/op-graph.md are written there (``viewer-graph.png``,
``viewer-graph-model.png``). Skips where /usr/bin/chromium or playwright is missing (via
tests/test_browser.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# browser: test_browser's fixture (hence noqa: F811 where a test takes it)
from test_browser import browser, heading_shown, serve, sync_api, wait_rendered  # noqa: F401

import inspector
from inspector.format import manifest_name
from inspector.testing import make_synthetic_run
from viewer.app_pages.graph import NONFINITE

NAN_AT = 25


def doc_shot(page, name: str) -> None:
    """A screenshot for the docs (docs/images/<name>) where ``TF_INSPECTOR_SHOTS`` names a folder."""
    folder = os.environ.get("TF_INSPECTOR_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    path = make_synthetic_run(runs / "nan", steps=30, tensors=20, dump_every=10, nonfinite_at=NAN_AT)
    tensor = inspector.open_run(path).first_nonfinite()["tensor"]
    m = path / manifest_name("chief", 1)
    man = json.loads(m.read_text())
    for t in man["tensors"]:
        if t["name"] == tensor:
            t.update(source_file="examples/models.py", source_line=57, source_function="conv_block",
                     source_stack=[["examples/models.py", 57, "conv_block"]])
    m.write_text(json.dumps(man))
    with serve(runs) as url:
        yield url, tensor


def test_graph_page_draws_the_nan_ops_red_and_opens_the_browser(server, browser, tmp_path):  # noqa: F811
    url, tensor = server
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    try:
        page.goto(f"{url}/graph?run=nan", wait_until="domcontentloaded")
        heading_shown(page, "Op graph")
        svg = page.locator('[data-testid="stGraphVizChart"] svg')
        svg.first.wait_for(timeout=90_000)
        # Graphviz drew the centre (the first NaN's op, at the first NaN's step) and the legend's swatch red
        page.wait_for_function("c => document.querySelectorAll("
                               "`[data-testid=\"stGraphVizChart\"] svg g.node path[fill=\"${c}\"],"
                               " [data-testid=\"stGraphVizChart\"] svg g.node polygon[fill=\"${c}\"]`).length >= 2",
                               arg=NONFINITE, timeout=90_000, polling=200)
        titles = page.locator('[data-testid="stGraphVizChart"] svg g.node text').all_text_contents()
        assert tensor.split(":")[0] in titles and "NaN/Inf" in titles
        # the step slider starts at the first NaN's step, not at the last step (29)
        thumb = page.locator('[data-testid="stSliderThumbValue"]').first
        sync_api.expect(thumb).to_have_text(str(NAN_AT), timeout=90_000)
        page.screenshot(path=str(tmp_path / "graph.png"), full_page=True)
        doc_shot(page, "viewer-graph.png")
        assert page.locator('[data-testid="stException"]').count() == 0
        page.get_by_role("button", name="Open in tensor browser").click()
        page.wait_for_url("**/browser**", timeout=90_000)
        heading_shown(page, "Tensor browser")
        sync_api.expect(page.get_by_role("combobox", name="Tensor").first).to_have_value(tensor, timeout=90_000)
        page.get_by_text("examples/models.py:57 in conv_block").first.wait_for(timeout=90_000)
    finally:
        page.close()


def test_summary_names_where_the_first_nan_was_created(server, browser):  # noqa: F811
    url, _ = server
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    try:
        page.goto(f"{url}/?run=nan", wait_until="domcontentloaded")
        heading_shown(page, "Run nan")
        page.get_by_text("created at examples/models.py:57 in conv_block.").first.wait_for(timeout=90_000)
        assert page.get_by_text("created at examples/models.py:57 in conv_block").count() >= 2   # caption and alert
    finally:
        page.close()


def test_whole_model_view_draws_scopes_and_finds_an_op(server, browser):  # noqa: F811
    """The whole-model view in Chromium: closed scopes drawn as boxes (the NaN ones red), and a
    search opens the match's scope and outlines it."""
    url, tensor = server
    page = browser.new_page(viewport={"width": 1500, "height": 2400})
    try:
        page.goto(f"{url}/graph?run=nan&gr_view=Whole+model&gr_step=29", wait_until="domcontentloaded")
        heading_shown(page, "Op graph")
        svg = '[data-testid="stGraphVizChart"] svg'
        page.wait_for_function("s => [...document.querySelectorAll(s + ' g.node text')]"
                               ".some(t => t.textContent.startsWith('icnn/ ('))", arg=svg, timeout=90_000,
                               polling=200)
        red = page.locator(f'{svg} g.node path[fill="{NONFINITE}"], {svg} g.node polygon[fill="{NONFINITE}"]')
        assert red.count() >= 2                                             # the centre and a later scope
        box = page.get_by_role("textbox", name="Search ops").first
        box.fill("dense/MatMul")
        box.press("Enter")
        page.wait_for_function("s => [...document.querySelectorAll(s + ' g.node text')]"
                               ".some(t => t.textContent === 'MatMul')", arg=svg, timeout=90_000, polling=200)
        wait_rendered(page, 0)
        assert page.locator(f'{svg} g.cluster text', has_text="dense/").count() >= 1   # its scope opened
        doc_shot(page, "viewer-graph-model.png")
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()
