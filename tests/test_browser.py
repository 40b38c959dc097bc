"""The viewer in a real browser: ``streamlit run app.py`` + headless Chromium (Playwright).

Skips (with the reason) only where /usr/bin/chromium or the playwright package is missing.
Each page's screenshot goes to ``$TF_INSPECTOR_SHOTS/viewer-<page module>.png`` if set (``make
screenshots``: docs/images/, the pages' docs), else ``<tmp>/.screenshots``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from browser_serve import free_port, serve, start, stop, wait_healthy  # noqa: F401 (also test_browser_graph's)

from inspector.format import manifest_name
from inspector.testing import make_synthetic_run

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# page -> (heading it shows, number of images it must show at least)
PAGES = {"Summary": ("Run exp1", 0), "Training overview": ("Training overview", 0),
         "Distributions": ("Distributions", 0), "Feature maps": ("Feature maps", 1),
         "Masks & templates": ("Masks & templates", 2), "Tensor browser": ("Tensor browser", 1),
         "Op graph": ("Op graph", 0), "Compare": ("Compare", 0)}
# page -> Vega-Lite charts it must draw at least, in its default tabs (Distributions: the in-graph histograms;
# Compare: steps A and B overlaid; Summary: the culprit's evidence, the loss and the gradient sizes; the Training
# overview's heatmap is an image, HEATMAPS, and its series is in another tab)
VEGA = {"Summary": 3, "Distributions": 1, "Compare": 1}
# page -> layer x step heatmaps (viewer/charts/heatmap.js) it must draw
HEATMAPS = {"Training overview": 1}
# page -> its URL path (st.navigation; the default page, Summary, is the app's root)
URLS = {"Summary": "", "Training overview": "overview", "Distributions": "distributions",
        "Feature maps": "featuremaps", "Masks & templates": "masks", "Tensor browser": "browser",
        "Op graph": "graph", "Compare": "compare"}

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    make_synthetic_run(runs / "exp1", steps=40, tensors=20, dump_every=20, nonfinite_at=35)
    make_synthetic_run(runs / "exp2", steps=30, tensors=20, dump_every=15, seed=1)
    make_synthetic_run(runs / "fm_img", steps=20, tensors=20, dump_every=10, seed=3, image=(32, 32, 3))
    hostile_run(runs / "zz_evil")
    catalog_out_of_order(shutil.copytree(runs / "exp2", runs / "zz_order"))
    with serve(runs) as url:
        yield url


EVIL = "![leak](http://leak.invalid/x.png)"
#: a bare URL in a run file (here the manifest's loss name): text, never a link
URL = "http://example.invalid/x"


def hostile_run(path: Path) -> None:
    """A run whose manifest strings are Markdown that would load an external image."""
    make_synthetic_run(path, steps=10, tensors=8, dump_every=5, seed=2, dropped_steps=(5,))
    m = path / manifest_name("chief", 1)
    man = json.loads(m.read_text())
    man["tensorflow_version"] = man["created"] = EVIL
    man["loss"] = URL
    man["dropped"] = [{"what": "dump", "reason": EVIL, "count": 1, "bytes": 1, "first_step": 5, "last_step": 5}]
    m.write_text(json.dumps(man))


def catalog_out_of_order(path: Path) -> None:
    """The catalog as the demo's hook lists it: the ICNN layer's role tensors after the loss."""
    m = path / manifest_name("chief", 1)
    man = json.loads(m.read_text())
    man["tensors"] = sorted(man["tensors"], key=lambda t: bool(t.get("icnn_role")))
    m.write_text(json.dumps(man))


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("TF_INSPECTOR_SHOTS") or tmp_path_factory.mktemp("tmp") / ".screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


IMAGE_SRCS = "() => [...document.querySelectorAll('[data-testid=\"stImage\"] img')].map(i => i.src)"


def _status(src: str) -> int:
    try:
        return urllib.request.urlopen(src, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def wait_rendered(page, min_images: int, timeout_ms: int = 60_000, attempts: int = 5) -> None:
    """Until the script run is over (no 'running' status) and the page's images have loaded.

    Each image the page shows must answer 200. A rerun that starts after the status check can
    replace the page's images, and Streamlit forgets the old ones (404): an image that failed
    and is no longer shown is no failure, the check starts over on what the page shows now."""
    idle = """n => !document.querySelector('[data-testid="stStatusWidget"]')
                   && document.querySelectorAll('[data-testid="stImage"] img').length >= n"""
    for _ in range(attempts):
        page.wait_for_function(idle, arg=min_images, timeout=timeout_ms, polling=200)
        failed = [(src, code) for src in page.evaluate(IMAGE_SRCS) if (code := _status(src)) != 200]
        shown = set(page.evaluate(IMAGE_SRCS))
        still = [(src, code) for src, code in failed if src in shown]
        if still:
            src, code = still[0]
            # Streamlit 1.60 with starlette >= 1.5 answers 500 for every image (gzip middleware
            # mismatch); say so instead of timing out below.
            hint = "; with Streamlit 1.60 this is the starlette>=1.5 gzip incompatibility: pin starlette==1.3.1"
            raise AssertionError(f"image {src} answered HTTP {code} and is still shown{hint if code == 500 else ''}")
        if not failed:   # else the page has new images since: check those
            break
    else:
        raise AssertionError(f"the page replaced its images {attempts} times while they were checked")
    page.wait_for_function(
        """n => !document.querySelector('[data-testid="stStatusWidget"]')
               && document.querySelectorAll('[data-testid="stImage"] img').length >= n
               && [...document.querySelectorAll('[data-testid="stImage"] img')].every(i => i.complete && i.naturalWidth > 0)""",
        arg=min_images, timeout=timeout_ms, polling=200)


def wait_charts(page, n: int, timeout_ms: int = 90_000) -> None:
    """Until the script run is over and ``n`` Vega-Lite charts are drawn."""
    wait_rendered(page, 0, timeout_ms)
    page.wait_for_function("n => document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length >= n",
                           arg=n, timeout=timeout_ms, polling=200)


HEATMAP_DRAWN = """n => [...document.querySelectorAll('.tfi-heatmap img')].filter(i => i.complete && i.naturalWidth > 0)
                         .length >= n"""


def wait_heatmaps(page, n: int, timeout_ms: int = 90_000) -> None:
    """Until the script run is over and ``n`` layer x step heatmap images are drawn."""
    wait_rendered(page, 0, timeout_ms)
    page.wait_for_function(HEATMAP_DRAWN, arg=n, timeout=timeout_ms, polling=200)


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_in_chromium(server, browser, shots, name):
    heading, images = PAGES[name]
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        page.goto(f"{server}/{URLS[name]}", wait_until="domcontentloaded")
        page.get_by_role("heading", name=heading).first.wait_for(timeout=90_000)
        wait_rendered(page, images)
        if name in VEGA:  # the interactive charts, drawn by Vega in the browser
            wait_charts(page, VEGA[name])
        wait_heatmaps(page, HEATMAPS.get(name, 0))
        page.screenshot(path=str(shots / f"viewer-{URLS[name] or 'summary'}.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.get_by_text("could not be drawn").count() == 0
        # the sidebar's navigation marks the page that is shown (the URL chose it)
        nav = page.locator('[data-testid="stSidebarNav"] a[aria-current="page"]')
        nav.first.wait_for(timeout=90_000)
        assert nav.first.inner_text().strip() == name
    finally:
        page.close()


def test_url_chooses_the_run(server, browser):
    """?run=<name> opens that run of the folder (the default would be the first, exp1)."""
    page = browser.new_page()
    try:
        page.goto(f"{server}/?page=Summary&run=exp2", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Run exp2").first.wait_for(timeout=90_000)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_not_a_run_shows_message(browser, tmp_path):
    """A folder without runs: a clear message in the page, no exception box."""
    with serve(tmp_path) as url:
        page = browser.new_page()
        page.goto(url, wait_until="domcontentloaded")
        page.get_by_text("No run in").first.wait_for(timeout=90_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.close()


def test_run_strings_load_nothing(server, browser):
    """Markdown in a run's manifest is shown as text: the browser never requests its image."""
    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    try:
        page.goto(f"{server}/?page=Summary&run=zz_evil", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Run zz_evil").first.wait_for(timeout=90_000)
        wait_rendered(page, 0)
        # shown, literally (a word joiner, invisible, inside "http:" keeps Markdown from linking it)
        page.get_by_text(re.compile(re.escape(EVIL).replace("http", "http\u2060?"))).first.wait_for(timeout=90_000)
        assert page.locator('img[src*="leak"]').count() == 0
        assert not [u for u in requested if "leak" in u], requested
    finally:
        page.close()


def test_unknown_run_in_the_url_is_a_message(server, browser):
    page = browser.new_page()
    try:
        page.goto(f"{server}/?page=Summary&run=nope", wait_until="domcontentloaded")
        page.get_by_text("No run named 'nope'").first.wait_for(timeout=90_000)
        assert page.get_by_role("heading", name="Run exp1").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_first_nan_loss_curve_and_dump_reason_in_chromium(server, browser):
    """Summary: the diagnosis names where the first NaN was born, and the loss curve is drawn; a
    dump picker shows why its step was dumped."""
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        page.goto(f"{server}/?page=Summary&run=exp1", wait_until="domcontentloaded")
        page.get_by_text("Most likely culprit: nonfinite").first.wait_for(timeout=90_000)   # the diagnosis first
        page.get_by_text("made the first non-finite values").first.wait_for(timeout=90_000)
        page.get_by_text("loss/Mean:0, forward mean").first.wait_for(timeout=90_000)
        page.wait_for_function("() => document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length >= 2",
                               timeout=90_000, polling=200)        # the loss curve and the op-type bars
        page.goto(f"{server}/?page={quote('Feature maps')}&run=exp1", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Feature maps").first.wait_for(timeout=90_000)
        wait_rendered(page, 1)
        assert page.get_by_role("combobox", name="Dump step").first.input_value() == "20 (schedule)"
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_feature_maps_overlay_renders_in_chromium(server, browser, shots):
    """A run holding the model input: the page opens on conv1/Conv2D:0 and draws the channel over
    the input image (the image right after "On the input image" has loaded)."""
    page = browser.new_page(viewport={"width": 1500, "height": 3000})
    try:
        page.goto(f"{server}/featuremaps?run=fm_img&fm_section=One+channel", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Feature maps").first.wait_for(timeout=90_000)
        wait_rendered(page, 3)        # the section's overlay, by group, top samples
        assert page.get_by_role("combobox", name="Layer").first.input_value() == "conv1/Conv2D:0"
        page.get_by_text("by bilinear interpolation (pixel centres aligned)").first.wait_for(timeout=90_000)
        width = page.evaluate("""() => {
            const m = [...document.querySelectorAll('[data-testid="stMarkdown"]')]
                .find(e => e.innerText.includes('On the input image'));
            const img = [...document.querySelectorAll('[data-testid="stImage"] img')]
                .find(i => m && (m.compareDocumentPosition(i) & Node.DOCUMENT_POSITION_FOLLOWING));
            return img && img.complete ? img.naturalWidth : 0; }""")
        assert width > 300, width
        page.screenshot(path=str(shots / "viewer-featuremaps-overlay.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.get_by_text("could not be drawn").count() == 0
    finally:
        page.close()


def vega_datasets(frames: list[bytes]) -> list[tuple[dict, dict]]:
    """Each Vega-Lite chart the server sent over the page's websocket (Streamlit's ForwardMsg
    protobufs, as the browser received them): (spec, {dataset name: DataFrame})."""
    import pyarrow as pa
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    out = []
    for raw in frames:
        msg = ForwardMsg()
        try:
            msg.ParseFromString(raw)
        except Exception:   # not a ForwardMsg (nothing else is expected): skipped, not guessed
            continue
        if msg.WhichOneof("type") != "delta" or msg.delta.WhichOneof("type") != "new_element":
            continue
        el = msg.delta.new_element
        if el.WhichOneof("type") == "vega_lite_chart":
            c = el.vega_lite_chart
            out.append((json.loads(c.spec), {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                                             for d in c.datasets}))
    return out


def colour_columns(png: bytes, rgb: tuple[int, int, int], below: float = 0.45) -> int:
    """How many pixel columns of a chart image hold ``rgb`` (within 40 per channel) under its
    top ``below`` share (the legend sits there)."""
    import io
    import numpy as np
    from PIL import Image
    im = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), np.int16)
    im = im[int(below * im.shape[0]):]
    hit = (np.abs(im - np.array(rgb, np.int16)) <= 40).all(-1)
    return int(hit.any(0).sum())


def test_distributions_draw_both_groups_on_the_log_axis_in_chromium(server, browser, shots):
    """The gradient of a run with positive and negative samples: the in-graph chart the browser
    receives holds more than one non-empty bar per group on the signed log axis, and Chromium
    draws both groups' outlines (red and blue pixels across the chart)."""
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    frames: list[bytes] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(f) if isinstance(f, bytes) else None))
    try:
        page.goto(f"{server}/distributions?run=exp1&di_tensor=conv3/Relu:0&di_step=30", wait_until="domcontentloaded")
        page.get_by_role("heading", name="Distributions").first.wait_for(timeout=90_000)
        wait_charts(page, VEGA["Distributions"])
        chart = page.locator(".vega-embed").first
        chart.scroll_into_view_if_needed()
        png = chart.screenshot(path=str(shots / "Distributions_log_axis.png"))
        spec, data = next((s, d) for s, d in vega_datasets(frames) if "@ step 30" in json.dumps(s.get("title")))
        gradient = spec["hconcat"][1]["layer"][0]
        assert "labelExpr" in gradient["encoding"]["x"]["axis"]       # the signed log axis's ticks
        bars = data[gradient["data"]["name"]]
        nonempty = bars[bars["count"] > 0].groupby("group").size()
        assert set(nonempty.index) == {"positive", "negative"} and (nonempty > 1).all(), nonempty
        for rgb in ((0xb2, 0x18, 0x2b), (0x67, 0xa9, 0xcf)):           # positive dark red, negative light blue, drawn
            assert colour_columns(png, rgb) > 40, rgb
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def heading_shown(page, name: str) -> None:
    page.get_by_role("heading", name=name).first.wait_for(timeout=90_000)
    wait_rendered(page, 0)


def history_move(page, move) -> None:
    """Back or Forward (``page.go_back`` / ``page.go_forward``), waiting until the viewer has
    loaded the entry's URL anew (a new document: the marker set before the move is gone), so
    nothing is read from the page left."""
    page.evaluate("window.__beforeMove = true")
    move(wait_until="commit")
    page.wait_for_function("() => !window.__beforeMove", timeout=90_000, polling=200)


def test_back_and_forward_move_between_pages(server, browser):
    """Each page is a history entry: the sidebar's links push URLs, Back and Forward walk them."""
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    try:
        page.goto(f"{server}/?run=exp2", wait_until="domcontentloaded")
        heading_shown(page, "Run exp2")
        nav = page.locator('[data-testid="stSidebarNav"]')
        nav.get_by_text("Distributions", exact=True).click()
        heading_shown(page, "Distributions")
        page.wait_for_url("**/distributions**", timeout=90_000)
        nav.get_by_text("Tensor browser", exact=True).click()
        heading_shown(page, "Tensor browser")
        page.wait_for_url("**/browser**", timeout=90_000)
        history_move(page, page.go_back)
        heading_shown(page, "Distributions")
        assert "/distributions" in page.url
        history_move(page, page.go_back)
        heading_shown(page, "Run exp2")                              # the run stays chosen
        assert page.get_by_text("Page not found").count() == 0
        history_move(page, page.go_forward)
        heading_shown(page, "Distributions")
        sync_api.expect(page.get_by_role("combobox", name="Run").first).to_have_value("exp2", timeout=90_000)
        assert parse_qs(urlsplit(page.url).query).get("run") == ["exp2"], page.url   # the URL names the run shown
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def choose(page, label: str, option: str, attempts: int = 3) -> None:
    """Pick ``option`` in the selectbox ``label`` as a user would, and wait until the app has it.
    On a loaded machine a script run still in flight can re-render the box and swallow the
    click (the list closes, nothing is chosen); a user then picks again, and so does this."""
    box = page.get_by_role("combobox", name=label).first
    for _ in range(attempts):
        wait_rendered(page, 0)
        box.click()
        page.get_by_role("option", name=option, exact=True).click()
        try:
            sync_api.expect(box).to_have_value(option, timeout=20_000)
        except AssertionError:
            continue
        wait_rendered(page, 0)
        return
    raise AssertionError(f"could not choose {option!r} in {label!r} in {attempts} attempts")


def test_a_copied_link_reproduces_the_view(server, browser):
    """Choose a tensor and a step: the URL takes them; opening that URL anew shows the same."""
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        page.goto(f"{server}/distributions?run=exp1", wait_until="domcontentloaded")
        heading_shown(page, "Distributions")
        wait_charts(page, VEGA["Distributions"])
        # a tensor above the op that turned NaN at step 35: its values at step 39 are finite, so drawn
        choose(page, "Tensor", "conv1/Conv2D:0")
        page.wait_for_url("**di_tensor=conv1**Conv2D**", timeout=90_000)
        wait_charts(page, VEGA["Distributions"])
        link = page.url
        other = browser.new_page(viewport={"width": 1500, "height": 2200})
        try:
            other.goto(link, wait_until="domcontentloaded")
            heading_shown(other, "Distributions")
            wait_charts(other, VEGA["Distributions"])
            assert other.get_by_role("combobox", name="Tensor").first.input_value() == "conv1/Conv2D:0"
            other.get_by_text("In-graph histograms at step 39").first.wait_for(timeout=90_000)
        finally:
            other.close()
    finally:
        page.close()


def shown_view(page) -> tuple[str, str, str]:
    """(page heading's URL path, run, tensor) the page shows once drawn."""
    wait_rendered(page, 0)
    run = page.get_by_role("combobox", name="Run").first.input_value()
    tensor = page.get_by_role("combobox", name="Tensor").first.input_value()
    return urlsplit(page.url).path, run, tensor


def test_back_and_forward_keep_the_url_and_the_view_together(server, browser):
    """Distributions (conv3) -> Tensor browser (conv2) -> Back -> Forward: each move shows the view
    as it was left, its URL names the run and tensor the page shows, and that exact URL loaded
    anew shows the same view. (Streamlit 1.60 alone reruns a move with the last view's query,
    pushes new entries over Forward, and leaves an entry of the page left without its tensor.)"""
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    fresh = browser.new_page(viewport={"width": 1500, "height": 1400})
    try:
        page.goto(f"{server}/distributions?run=exp2", wait_until="domcontentloaded")
        heading_shown(page, "Distributions")
        choose(page, "Tensor", "conv3/Relu:0")
        page.locator('[data-testid="stSidebarNav"]').get_by_text("Tensor browser", exact=True).click()
        heading_shown(page, "Tensor browser")
        page.wait_for_url("**/browser**", timeout=90_000)
        choose(page, "Tensor", "conv2/Relu:0")
        page.wait_for_url("**tb_tensor=conv2**", timeout=90_000)
        for move, heading, path, tensor, param in (
                (page.go_back, "Distributions", "/distributions", "conv3/Relu:0", "di_tensor"),   # as it was left
                (page.go_forward, "Tensor browser", "/browser", "conv2/Relu:0", "tb_tensor")):
            history_move(page, move)
            heading_shown(page, heading)
            view = shown_view(page)
            assert view == (path, "exp2", tensor), (page.url, view)
            query = parse_qs(urlsplit(page.url).query)
            assert query.get("run") == ["exp2"] and query.get(param) == [tensor], page.url
            fresh.goto(page.url, wait_until="domcontentloaded")
            heading_shown(fresh, heading)
            assert shown_view(fresh) == view, (page.url, view)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        fresh.close()
        page.close()


def test_no_deploy_button(server, browser):
    page = browser.new_page()
    try:
        page.goto(f"{server}/", wait_until="domcontentloaded")
        heading_shown(page, "Run exp1")
        wait_rendered(page, 0)
        page.locator('[data-testid="stToolbar"]').first.wait_for(state="attached", timeout=90_000)
        assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
        assert page.get_by_text("Deploy", exact=True).count() == 0
    finally:
        page.close()


# ---- the Training overview heatmap, charts' colours, run strings (issue 35) -----------------

def heatmap_page(browser, url: str):
    """A page on the Training overview at ``url``, its heatmap drawn."""
    page = browser.new_page(viewport={"width": 1500, "height": 1600})
    page.goto(url, wait_until="domcontentloaded")
    heading_shown(page, "Training overview")
    wait_heatmaps(page, 1)
    return page


#: the heatmap image's pixel (column, row) as [r, g, b, a], read back through a canvas
PIXELS = """() => { const img = document.querySelector('.tfi-heatmap img');
    const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    return {w: c.width, h: c.height, data: Array.from(g.getImageData(0, 0, c.width, c.height).data)}; }"""


def hover_text(page, fx: float, fy: float) -> str:
    """The heatmap tooltip's text with the pointer at fractions (fx, fy) of the image."""
    box = page.locator(".tfi-heatmap .plot").first.bounding_box()
    page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
    tip = page.locator(".tfi-heatmap .tip").first
    sync_api.expect(tip).to_be_visible(timeout=10_000)
    return tip.inner_text()


def test_nan_run_heatmap_is_red_at_the_nan_steps_and_runs_to_the_last_step(server, browser):
    """exp1 turns NaN at step 35 of 0..39: the gradient heatmap's columns from there hold red
    cells (NaN/Inf on hover), none before; the axis ends at step 39, not at the NaN."""
    page = heatmap_page(browser, f"{server}/overview?run=exp1")
    try:
        img = page.evaluate(PIXELS)
        px = [img["data"][i:i + 4] for i in range(0, len(img["data"]), 4)]
        red = [[px[r * img["w"] + c] == [228, 26, 28, 255] for c in range(img["w"])] for r in range(img["h"])]
        assert img["w"] == 40                                              # one column per statistics step
        nan_cols = {c for row in red for c, is_red in enumerate(row) if is_red}
        assert nan_cols and min(nan_cols) >= 35 and 39 in nan_cols
        ends = page.locator(".tfi-heatmap .tick.end").all_inner_texts()
        assert ends == ["0", "39"]
        row = next(r for r in range(img["h"]) if red[r][39])
        text = hover_text(page, 39.5 / 40, (row + 0.5) / img["h"])
        assert "step 39" in text and "NaN/Inf" in text
        text = hover_text(page, 10.5 / 40, (row + 0.5) / img["h"])
        assert "step 10" in text and "l2: " in text and "NaN" not in text
    finally:
        page.close()


def test_heatmap_rows_are_in_network_order(server, browser):
    """A catalog listing the ICNN layer after the loss (as the demo's does): its row is drawn
    between conv3 and the dense head, where the graph has it."""
    page = heatmap_page(browser, f"{server}/overview?run=zz_order")
    try:
        rows = [t.split(" ")[0] for t in page.locator(".tfi-heatmap .label").all_inner_texts()]
        # the loss op is no layer: left out unless "Loss and label ops" is on
        assert rows == ["conv1/Relu:0", "conv2/Relu:0", "conv3/Relu:0", "icnn/post_mask:0", "dense/BiasAdd:0"]
    finally:
        page.close()


#: per Vega chart: its legend's symbol colours and its lines' stroke colours
CHART_COLOURS = """() => [...document.querySelectorAll('.vega-embed svg')].map(svg => ({
    legend: [...svg.querySelectorAll('.role-legend-symbol path')].map(p => p.getAttribute('fill')
        && p.getAttribute('fill') !== 'none' ? p.getAttribute('fill') : p.getAttribute('stroke')),
    lines: [...new Set([...svg.querySelectorAll('.mark-line path')].map(p => p.getAttribute('stroke')))]}))"""


@pytest.mark.parametrize("where", ["", "overview"])
def test_no_chart_reuses_a_colour(server, browser, where):
    """Every chart's legend gives each series its own colour, and every line drawn has one of them."""
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        # the overview's series: its tab, opened by a link naming its tensor
        page.goto(f"{server}/{where}?run=exp1" + ("&ov_tensor=conv3/Relu:0" if where else ""),
                  wait_until="domcontentloaded")
        wait_charts(page, VEGA["Summary"] if not where else 1)
        charts = page.evaluate(CHART_COLOURS)
        with_lines = [c for c in charts if c["lines"]]
        assert with_lines
        for c in with_lines:
            assert len(set(c["legend"])) == len(c["legend"]) > 0, c
            assert set(c["lines"]) <= set(c["legend"]), c
    finally:
        page.close()


def test_a_url_in_a_run_file_is_text_not_a_link(server, browser):
    page = browser.new_page()
    try:
        page.goto(f"{server}/?run=zz_evil", wait_until="domcontentloaded")
        heading_shown(page, "Run zz_evil")
        caption = page.get_by_text("has no forward statistics").first
        caption.wait_for(timeout=90_000)
        assert URL in caption.inner_text().replace("\u2060", "")              # shown, as text
        assert page.locator('a[href*="example.invalid"]').count() == 0
    finally:
        page.close()
