"""The op graph page and op source locations in a real browser (``streamlit run`` + headless
Chromium, as tests/test_browser.py): Graphviz draws the SVG with the NaN ops red, the op picker
opens the tensor browser, and the first NaN's source location is on the Summary.
Skips where /usr/bin/chromium or playwright is missing (via tests/test_browser.py)."""
from __future__ import annotations

import json

import pytest

from test_browser import ARGS, CHROMIUM, heading_shown, serve, sync_api  # noqa: F401

import inspector
from inspector.format import manifest_name
from inspector.testing import make_synthetic_run
from viewer.graph import NONFINITE

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    path = make_synthetic_run(runs / "nan", steps=30, tensors=20, dump_every=10, nonfinite_at=25)
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


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def test_graph_page_draws_the_nan_ops_red_and_opens_the_browser(server, browser, tmp_path):
    url, tensor = server
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    try:
        page.goto(f"{url}/graph?run=nan", wait_until="domcontentloaded")
        heading_shown(page, "Op graph")
        svg = page.locator('[data-testid="stGraphVizChart"] svg')
        svg.first.wait_for(timeout=90_000)
        # Graphviz drew the centre (the first NaN's op) and its consumers filled red
        page.wait_for_function("c => document.querySelectorAll("
                               "`[data-testid=\"stGraphVizChart\"] svg g.node path[fill=\"${c}\"],"
                               " [data-testid=\"stGraphVizChart\"] svg g.node polygon[fill=\"${c}\"]`).length >= 3",
                               arg=NONFINITE, timeout=90_000, polling=200)
        titles = page.locator('[data-testid="stGraphVizChart"] svg g.node text').all_text_contents()
        assert tensor.split(":")[0] in titles and "NaN/Inf" in titles
        page.screenshot(path=str(tmp_path / "graph.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.get_by_role("button", name="Open in tensor browser").click()
        page.wait_for_url("**/browser**", timeout=90_000)
        heading_shown(page, "Tensor browser")
        sync_api.expect(page.get_by_role("combobox", name="Tensor").first).to_have_value(tensor, timeout=90_000)
        page.get_by_text("examples/models.py:57 in conv_block").first.wait_for(timeout=90_000)
    finally:
        page.close()


def test_summary_names_where_the_first_nan_was_created(server, browser):
    url, _ = server
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    try:
        page.goto(f"{url}/?run=nan", wait_until="domcontentloaded")
        heading_shown(page, "Run nan")
        page.get_by_text("created at examples/models.py:57 in conv_block.").first.wait_for(timeout=90_000)
        assert page.get_by_text("created at examples/models.py:57 in conv_block").count() >= 2   # caption and alert
    finally:
        page.close()
