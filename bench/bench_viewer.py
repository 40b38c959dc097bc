"""Viewer benchmark: a synthetic, demo-like run (1,000 steps x 300 tensors, the model's
input images, dumps every 100 steps), opened and rendered.

Prints one table: generation, reader open, first statistics query, one dumped tensor read,
overview data preparation (the layer x step matrix) and figure rendering, then every viewer
page through Streamlit's AppTest (the pages of ``viewer.app_main.PAGES``):

- **cold**: a new AppTest session on empty caches (``st.cache_data`` / ``st.cache_resource``
  cleared), the page's first render: what the first visitor of a run waits for;
- **rerun**: the same session rendered again, nothing changed (every widget interaction pays
  at least this: Streamlit reruns the whole page script);
- **change**: the same session after changing one widget (:data:`CHANGES`: a tensor, a
  heatmap statistic, a channel ...): cached reads, new figures.

The issue's target is every page under 2 s warm (rerun and change). Python's imports are paid
once, before the first cold page, by a warm-up render that is not counted.

    python bench/bench_viewer.py                  # 1000 steps x 300 tensors in a temp dir
    python bench/bench_viewer.py --steps 200 --tensors 60 --keep /tmp/bench_run
    python bench/bench_viewer.py --reps 3         # median of 3 of each app measurement
    python bench/bench_viewer.py --run runs/icnn  # an existing run (e.g. examples.train_demo's)
    python bench/bench_viewer.py --long --steps 10000 --tensors 1000   # a long run, no dumps (target: page < 2 s)
    python bench/bench_viewer.py --compact --keep /tmp/bench_c   # statistics laid out as the writer compacts them

``--long``: the run is ``inspector.testing.make_long_run`` (compacted parts, 100 real steps
repeated; no dumps, so the dumped-tensor row is skipped).

``--browser``: the pages as a user sees them instead of AppTest's script times: ``streamlit run
app.py -- <the run's folder>`` and headless Chromium (Playwright, /usr/bin/chromium), timing

- the Training overview's **first paint, cold** (a new server, so empty caches, and a new
  browser profile) and **warm** (the same server and profile, the page opened again): from
  navigation until the page stops changing (no DOM change, image load or running script for
  1 s: the time of the last change is reported);
- a **tooltip**: from the pointer event over a heatmap cell to the next frame after the tooltip
  shows that cell (20 cells; median and worst);
- **"Every op"**: from the toggle's click until the page stops changing;
- the **Summary**, on its first visit and warm (opened once before);

``--floor`` leaves out the tooltip and "Every op" (they need a heatmap of many rows): on a
tiny run (``make_synthetic_run(path, steps=10, tensors=3, dump_every=None)``) the rest is the
pages' own cost whatever the run;

- **every page, warm, against the bare page**: a bare Streamlit page (``bench/bare_app.py``:
  ``st.title`` + ``st.write``, the same Streamlit and flags, its own server) and each viewer
  page opened warm (the page opened once before in the same browser profile) alternately, page
  then bare, ``--reps`` times: the median of each page's ratio to the bare page beside it (the
  target: 1.5); the ratio is what holds on a loaded machine, not the seconds; a row "no run
  (chrome)" is the viewer on a folder without runs (the sidebar and navigation every page pays),
  a row "bare + one chart" the bare page with one small Vega-Lite chart (the floor of any page
  that draws a chart: the first chart loads and runs Vega's code in the browser), a row "bare +
  three charts" with three (the Summary's), a row "bare + one graph" with one small Graphviz
  graph (likewise for the Op graph), and with ``--baseline`` the other checkout's pages are
  timed the same way, each right after this checkout's;
- **the first visit after a server start, against the bare page's** (:data:`FIRST_VISIT_PAGES`:
  each a new server and browser profile, then the bare page's new server and profile, ``--reps``
  times; the target: 2);

each page load also with its main thread's CPU time (on this shared 2-core machine the wall
clock moves with other processes' load, the CPU time much less; the settling second and the
browser's other threads are not in it). ``--baseline
DIR`` times another checkout's Training overview (first paint) and Summary in the same run,
alternating with this checkout's, and its pages against the bare page.

    python bench/bench_viewer.py --browser --long --steps 10000 --tensors 1000 --keep /tmp/bench_long
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first: the imports below (noqa: E402) from this checkout

import numpy as np  # noqa: E402

import inspector  # noqa: E402
from inspector.analysis import plots  # noqa: E402
from inspector.testing import make_long_run, make_synthetic_run  # noqa: E402
from inspector.sizes import human_bytes  # noqa: E402


#: the demo's input images (examples/train_demo.py: 48 x 48)
IMAGE = (48, 48, 3)
#: channels of the last conv stage and the ICNN layer (the demo's conv3: 32 filters)
CHANNELS = 32
#: page module -> the widget change measured warm: (widget key, option index or value); a page
#: not listed (a new one) changes its first select box with more than one option
CHANGES: dict[str, tuple[str, object]] = {
    "summary": ("", None), "overview": ("ov_hm_grad_stat", "mean"), "distributions": ("di_tensor", 5),
    "featuremaps": ("fm_tensor", 3), "masks": ("mt_filter", 2), "browser": ("tb_tensor", 5),
    "compare": ("cmp_tensor", 5)}
SIDEBAR_KEYS = {"run", "mode", "worker"}
TARGET_S = 2.0  # the target: every page under 2 s warm
#: --browser: what each measurement must stay under (seconds)
BROWSER_TARGETS = {"overview, cold": 6.0, "overview, warm": 3.0, "tooltip, median": 0.3, "tooltip, worst": 0.3,
                   "overview, Every op": 10.0, "summary, warm": 3.0}
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUIET_MS = 1000
#: records the time of the page's last change: a DOM mutation or an image load
WATCH = """window.__last = 0;
new MutationObserver(() => { window.__last = performance.now(); })
    .observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
document.addEventListener('load', () => { window.__last = performance.now(); }, true);"""
SETTLED = """q => !document.querySelector('[data-testid="stStatusWidget"]') && window.__last > 0
    && performance.now() - window.__last > q"""


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--tensors", type=int, default=300)
    ap.add_argument("--dump-every", type=int, default=100)
    ap.add_argument("--long", action="store_true", help="make_long_run: compacted parts, no dumps")
    ap.add_argument("--keep", type=Path, help="write the run here and keep it (reused if it exists)")
    ap.add_argument("--run", type=Path, help="bench this existing run instead of a synthetic one")
    ap.add_argument("--reps", type=int, default=1, help="median of this many of each app measurement")
    ap.add_argument("--pages", nargs="*", help="only these pages (URL paths: featuremaps distributions ...)")
    ap.add_argument("--browser", action="store_true", help="time the Training overview and the Summary in "
                    "headless Chromium (first paint cold and warm, a tooltip, 'Every op') instead of through AppTest")
    ap.add_argument("--baseline", type=Path, help="--browser: also time this other checkout's Training overview "
                    "and Summary (e.g. `git archive <commit> | tar -x -C DIR`), each repetition beside this one's")
    ap.add_argument("--floor", action="store_true", help="--browser without the tooltip and 'Every op' (they need "
                    "a heatmap of many rows): on a tiny run, the pages' cost whatever the run")
    ap.add_argument("--compact", action="store_true", help="lay the synthetic run's statistics out as the writer's "
                    "compaction does (sorted by tensor, a per-tensor row-group index): a one-tensor read then "
                    "reads its row groups only, as on a trained run, not the whole part")
    args = ap.parse_args()
    tmp = None
    if args.run:
        path = args.run
    elif args.keep:
        path = args.keep
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench_viewer_"))
        path = tmp / "run"
    rows: list[tuple[str, float, str]] = []
    try:
        if not inspector.is_run(path) and args.long:
            _, t = timed(lambda: make_long_run(path, steps=args.steps, tensors=args.tensors))
            rows.append(("generate long synthetic run", t, f"{args.steps} steps x {args.tensors} tensors"))
        elif not inspector.is_run(path):
            _, t = timed(lambda: make_synthetic_run(path, steps=args.steps, tensors=args.tensors,
                                                    dump_every=args.dump_every, image=IMAGE, channels=CHANNELS))
            rows.append(("generate synthetic run", t, f"{args.steps} steps x {args.tensors} tensors"))
        if args.compact and not args.run:
            n, t = timed(lambda: compact_parts(path))
            rows.append(("compact statistics parts", t, f"{n} part(s) rewritten sorted, with the tensor index"))
        if args.browser:
            for what, secs, note in rows:
                print(f"{what}: {secs:.1f} s ({note})")
            print_browser(browser_times(path, args.reps, args.baseline, extras=not args.floor))
            print_ratios(page_ratios(path, args.reps, args.baseline))
            print_ratios(first_visits(path, args.reps), "first visit", FIRST_VISIT_TARGET)
            return
        run, t = timed(lambda: inspector.open_run(path))
        rows.append(("reader: open_run", t, f"{human_bytes(run.size_bytes())} on disk, {len(run.steps)} dumps"))
        df, t = timed(lambda: run.query_stats(kinds=["gradient"], groups=["all"], columns=["l2"]))
        rows.append(("reader: first statistics query", t, f"gradient l2, {len(df):,} rows"))
        if run.steps:
            name = next(n for n in run.tensors["name"] if n.endswith("Relu:0"))
            step = run.steps[len(run.steps) // 2]
            x, t = timed(lambda: np.array(run.tensor(name, step, "gradient")))
            rows.append(("reader: one dumped tensor", t, f"{name} @ {step}, shape {list(x.shape)}"))

        from viewer import data  # imports streamlit; its caches work outside a script run
        for name_ in ("streamlit", "streamlit.runtime.caching.cache_data_api"):
            logging.getLogger(name_).setLevel(logging.ERROR)
        sig = data.signature(str(path))
        ov, t = timed(lambda: data.overview.__wrapped__(str(path), sig, "gradient", "all", "l2"))
        rows.append(("overview: layer x step matrix", t, f"{ov.matrix.shape[0]} x {ov.matrix.shape[1]}"))
        from viewer.charts import heatmap, raster
        drawn, t = timed(lambda: heatmap.payload(raster.raster(ov.matrix, ov.present, ov.first_steps, ov.steps,
                                                               ov.width, True), ov.tensors, ov.tensors, "l2", "l2"))
        rows.append(("overview: raster + PNG sent", t, f"{len(drawn['png']) // 1024} KiB image, "
                     f"{len(drawn['values']) // 1024} KiB values"))
        fig, t1 = timed(lambda: plots.heatmap(ov.matrix, ov.tensors, ov.steps, log=True))
        png, t2 = timed(lambda: plots.to_png(fig))
        rows.append(("overview: heatmap figure + PNG (download)", t1 + t2, f"{len(png) / 1024:.0f} KiB PNG"))

        pages = page_times(path, args.reps, args.pages)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'seconds':>8}  notes")
    print("-" * (width + 40))
    for what, secs, note in rows:
        print(f"{what:<{width}}  {secs:8.3f}  {note}")
    print_pages(pages)


def settle(page, since: float = 0.0, timeout_s: float = 300) -> float:
    """Seconds from ``since`` (ms on the page's clock; 0: navigation) to the page's last change,
    once it has not changed for ``QUIET_MS``."""
    page.wait_for_function(SETTLED, arg=QUIET_MS, timeout=timeout_s * 1000, polling=100)
    return (page.evaluate("window.__last") - since) / 1000


def open_page(context, url: str, ready: str, arg: int = 1) -> tuple[object, float, float]:
    """A new page at ``url``: (the page, seconds to its first paint, CPU seconds of the page's
    main thread meanwhile: less moved by the machine's load than the wall clock), ``ready`` (a
    JS predicate of ``arg``) true at the end."""
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")

    def cpu() -> float:  # the renderer main thread's CPU seconds so far
        return next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "ThreadTime")
    page.add_init_script(WATCH)
    before = cpu()
    page.goto(url, wait_until="commit")
    page.wait_for_function(ready, arg=arg, timeout=300_000, polling=100)
    t = settle(page)
    return page, t, cpu() - before


#: the Training overview's heatmap drawn: this checkout's image, or a baseline's Vega chart
HEATMAP_READY = """n => [...document.querySelectorAll('.tfi-heatmap img')].filter(i => i.complete && i.naturalWidth)
    .length >= n || document.querySelectorAll('.vega-embed svg').length > n"""
SUMMARY_READY = "n => document.querySelectorAll('.vega-embed svg').length >= n"
#: in-page: each pointer event's time and the next frame after the tooltip changed
TIP_WATCH = """() => { window.__moves = []; window.__tips = [];
    const plot = document.querySelector('.tfi-heatmap .plot'), tip = document.querySelector('.tfi-heatmap .tip');
    plot.addEventListener('pointermove', e => window.__moves.push(e.timeStamp), true);
    new MutationObserver(() => requestAnimationFrame(() => window.__tips.push(performance.now())))
        .observe(tip, {childList: true, characterData: true, subtree: true}); }"""


def tooltip_times(page, n: int = 20) -> list[float]:
    """Seconds from a pointer event over a heatmap cell to the frame showing its tooltip."""
    page.locator(".tfi-heatmap .plot").first.scroll_into_view_if_needed()
    page.evaluate(TIP_WATCH)
    box = page.locator(".tfi-heatmap .plot").first.bounding_box()
    # cells the window shows, below Streamlit's toolbar (a pointer event needs the plot as its target)
    top, bottom = max(box["y"], 80) + 2, min(box["y"] + box["height"], page.viewport_size["height"]) - 2
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        fx, fy = rng.uniform(0.02, 0.98, 2)
        page.mouse.move(box["x"] + fx * box["width"], top + fy * (bottom - top))
        page.wait_for_function("k => window.__tips.length > k && window.__moves.length > k", arg=k, timeout=10_000)
        moves, tips = page.evaluate("[window.__moves, window.__tips]")
        out.append((tips[k] - moves[k]) / 1000)
    return out


def browser_times(path: Path, reps: int, baseline: Path | None = None,
                  extras: bool = True) -> list[tuple[str, float, str]]:
    """The --browser measurements on the run at ``path`` (its folder served, the run picked by
    ``?run=``): (what, seconds, notes), medians of ``reps``; with ``baseline`` (another checkout),
    its Training overview's first paint too, each repetition beside this checkout's;
    ``extras``: the tooltip and "Every op" too (they need a heatmap of many rows)."""
    import statistics

    from playwright.sync_api import sync_playwright
    sys.path.insert(0, str(ROOT / "tests"))
    from browser_serve import serve

    args = BROWSER_ARGS
    got: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        for _ in range(reps):
            for app in ([baseline] if baseline else []) + [ROOT]:
                with serve(path.parent, app=app / "app.py") as url:        # a new server: empty caches
                    one_server(browser, url, path.name, "" if app == ROOT else "baseline ", got, cpu, notes, extras)
        browser.close()
    med = statistics.median
    return [(k, med(v), f"main thread CPU {med(cpu[k]):.1f} s" if k in cpu else notes.get(k, ""))
            for k, v in got.items()]


#: the viewer's pages by URL path (st.navigation's; the Summary is the root)
PAGE_PATHS = {"summary": "", "overview": "overview", "distributions": "distributions",
              "featuremaps": "featuremaps", "masks": "masks", "browser": "browser", "graph": "graph",
              "compare": "compare"}
#: the row of the viewer on a folder without runs: what every page pays (sidebar, navigation)
NO_RUN = "no run (chrome)"
#: the row of the bare page with one Vega-Lite chart (``bench/bare_app.py?chart=1``)
ONE_CHART = "bare + one chart"
#: the bare page with three (``?chart=3``): the charts the Summary draws
THREE_CHARTS = "bare + three charts"
#: the row of the bare page with one Graphviz graph (``bench/bare_app.py?graph=1``)
ONE_GRAPH = "bare + one graph"
#: a Streamlit page drawn: its first heading shown and no script running
PAGE_READY = """n => document.querySelectorAll('h1').length >= n
    && !document.querySelector('[data-testid="stStatusWidget"]')"""
#: the most a page's warm first paint may take, in bare pages
RATIO_TARGET = 1.5


def page_ratios(path: Path, reps: int, baseline: Path | None = None) -> list[tuple[str, float, str]]:
    """Each page's warm first paint over the bare page's, timed alternately in one browser:
    (page, median ratio, 'warm s vs bare s' medians); with ``baseline`` (another checkout), its
    pages too, each right after this checkout's."""
    import contextlib
    import statistics

    from playwright.sync_api import sync_playwright
    sys.path.insert(0, str(ROOT / "tests"))
    from browser_serve import serve

    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    with sync_playwright() as p, contextlib.ExitStack() as stack:
        bare = stack.enter_context(serve(path.parent, app=ROOT / "bench" / "bare_app.py"))
        empty = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        urls = {}
        for app, tag in [(ROOT, "")] + ([(baseline, " @ baseline")] if baseline else []):
            url = stack.enter_context(serve(path.parent, app=app / "app.py"))
            chrome = stack.enter_context(serve(empty, app=app / "app.py"))
            for name, sub in PAGE_PATHS.items():
                urls[name + tag] = f"{url}/{sub}?run={path.name}"
            urls[NO_RUN + tag] = chrome            # a folder without runs: the sidebar and navigation
        urls[ONE_CHART] = f"{bare}/?chart=1"          # Streamlit's floor for a page with a chart
        urls[THREE_CHARTS] = f"{bare}/?chart=3"
        urls[ONE_GRAPH] = f"{bare}/?graph=1"          # and for a page with a Graphviz graph
        urls = dict(sorted(urls.items(), key=lambda kv: list(PAGE_PATHS).index(kv[0].split(" @")[0])
                           if kv[0].split(" @")[0] in PAGE_PATHS else len(PAGE_PATHS)))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        for u in [*urls.values(), bare]:                   # once each: caches and imports warm
            open_page(context, u, PAGE_READY)[0].close()
        for _ in range(reps):
            for name, page_url in urls.items():
                for key, u in ((name, page_url), ("bare:" + name, bare)):
                    page, t, busy = open_page(context, u, PAGE_READY)
                    times.setdefault(key, []).append(t)
                    cpu.setdefault(key, []).append(busy)
                    page.close()
        browser.close()
    med = statistics.median
    return [(name, med([a / b for a, b in zip(times[name], times["bare:" + name])]),
             f"{med(times[name]):.2f} s vs bare {med(times['bare:' + name]):.2f} s; main thread CPU "
             f"{med(cpu[name]):.2f} s vs {med(cpu['bare:' + name]):.2f} s")
            for name in urls]


def print_ratios(rows: list[tuple[str, float, str]], what: str = "warm", target: float = RATIO_TARGET) -> None:
    """The per-page table: first paint in bare pages (over the target: *)."""
    print(f"\n{'page, ' + what:<28}  {'x bare':>7}  {'target':>6}  medians")
    print("-" * 100)
    for name, ratio, note in rows:
        print(f"{name:<28}  {ratio:7.2f}  {target:6.1f}{'*' if ratio > target else ' '} {note}")


#: the most the first visit after a server start may take, in bare pages (the bare page's own
#: first visit after its server start)
FIRST_VISIT_TARGET = 2.0
#: the pages --browser times on their first visit after a server start (a new server each time)
FIRST_VISIT_PAGES = ("summary", "overview", "featuremaps")


def first_visits(path: Path, reps: int, pages: tuple[str, ...] = FIRST_VISIT_PAGES) -> list[tuple[str, float, str]]:
    """Each of ``pages`` on the first visit after a server start (a new server: its imports and
    caches; a new browser profile) over the bare page's first visit after its own server start,
    alternately: (page, median ratio, 'seconds vs bare seconds' medians)."""
    import statistics

    from playwright.sync_api import sync_playwright
    sys.path.insert(0, str(ROOT / "tests"))
    from browser_serve import serve

    times: dict[str, list[float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS, headless=True)
        for _ in range(reps):
            for name in pages:
                for key, app, sub in ((name, ROOT / "app.py", PAGE_PATHS[name]),
                                      ("bare:" + name, ROOT / "bench" / "bare_app.py", "")):
                    with serve(path.parent, app=app) as url:
                        context = browser.new_context(viewport={"width": 1500, "height": 1100})
                        page, t, _ = open_page(context, f"{url}/{sub}?run={path.name}", PAGE_READY)
                        times.setdefault(key, []).append(t)
                        page.close()
                        context.close()
        browser.close()
    med = statistics.median
    return [(name, med([a / b for a, b in zip(times[name], times["bare:" + name])]),
             f"{med(times[name]):.2f} s vs bare {med(times['bare:' + name]):.2f} s") for name in pages]


def one_server(browser, url: str, run: str, prefix: str, got: dict, cpu: dict, notes: dict,
               extras: bool = True) -> None:
    """One server's measurements into ``got`` (seconds) and ``cpu`` (main-thread seconds)."""
    def put(what: str, secs: float, busy: float | None = None) -> None:
        got.setdefault(prefix + what, []).append(secs)
        if busy is not None:
            cpu.setdefault(prefix + what, []).append(busy)

    context = browser.new_context(viewport={"width": 1500, "height": 1100})   # a new profile: nothing cached
    overview = f"{url}/overview?run={run}"
    page, t, busy = open_page(context, overview, HEATMAP_READY)
    put("overview, cold", t, busy)
    page.close()
    page, t, busy = open_page(context, overview, HEATMAP_READY)
    put("overview, warm", t, busy)
    if extras and not prefix:
        tips = tooltip_times(page)
        put("tooltip, median", float(np.median(tips)))
        put("tooltip, worst", max(tips))
        since = page.evaluate("performance.now()")
        page.get_by_text("Every op", exact=True).click()
        page.wait_for_function(f"() => window.__last > {since}", timeout=60_000)
        put("overview, Every op", settle(page, since))
        notes["overview, Every op"] = page.get_by_text(" rows x ").first.inner_text().split(",")[0]
    page.close()
    charts = 2                               # the loss and the gradient sizes (or, before, the op types)
    page, t, busy = open_page(context, f"{url}/?run={run}", SUMMARY_READY, charts)   # its first visit
    put("summary, first visit", t, busy)
    page.close()
    page, t, busy = open_page(context, f"{url}/?run={run}", SUMMARY_READY, charts)
    put("summary, warm", t, busy)
    page.close()
    context.close()


def print_browser(rows: list[tuple[str, float, str]]) -> None:
    """The --browser table: seconds and the target (over it: *)."""
    width = max(len(r[0]) for r in rows)
    print(f"{'in headless Chromium':<{width}}  {'seconds':>8}  {'target':>6}")
    print("-" * (width + 30))
    for what, secs, note in rows:
        target = BROWSER_TARGETS.get(what)
        mark = "" if target is None else f"{target:6.1f} {'*' if secs > target else ' '}"
        print(f"{what:<{width}}  {secs:8.3f}  {mark:>8} {note}")


def compact_parts(path: Path) -> int:
    """Rewrite every statistics part of ``path`` that has no per-tensor row-group index as the
    writer's compaction writes one (``stats_parts.write_sorted``). make_synthetic_run writes its
    rows in one flush, one part of one row group; a training run's writer flushes small parts
    every few seconds and compacts them into sorted parts. Returns how many were rewritten."""
    import pyarrow.parquet as pq

    from inspector.stats.parts import INDEX_KEY, write_sorted
    n = 0
    for part in sorted((path / "stats").glob("*.parquet")):
        if INDEX_KEY not in (pq.ParquetFile(part).metadata.metadata or {}):
            write_sorted(pq.read_table(part), part)
            n += 1
    return n


def print_pages(pages: list[dict]) -> None:
    """The per-page table (seconds); warm times over the 2 s target are marked."""
    width = max(len(p["page"]) for p in pages)
    print(f"\n{'page':<{width}}  {'cold':>7}  {'rerun':>7}  {'change':>7}  changed widget (warm > 2 s: *)")
    print("-" * (width + 70))
    for p in pages:
        slow = "*" if max(p["rerun"], p["change"]) > TARGET_S else " "
        print(f"{p['page']:<{width}}  {p['cold']:7.2f}  {p['rerun']:7.2f}  {p['change']:7.2f} {slow} {p['what']}")


def change_widget(at, page: str) -> str:
    """Change the page's widget of :data:`CHANGES` (unless there is none); its description."""
    key, how = CHANGES.get(page, (None, None))
    if key is None:  # a page this bench does not know: its first select box with a choice
        key = next((w.key for w in at.selectbox if w.key and w.key not in SIDEBAR_KEYS and len(w.options) > 1), "")
        how = 1
    if not key:
        return "(no widget: rerun)"
    box = at.selectbox(key=key)
    if isinstance(how, int):
        box.select_index(min(how, len(box.options) - 1))
    else:
        box.select(how)
    return f"{key} -> {box.value}"


def page_times(path: Path, reps: int, only: list[str] | None = None) -> list[dict]:
    """cold / rerun / change seconds of every viewer page (median of ``reps`` each)."""
    import os
    import statistics

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from viewer.app_main import PAGES, url_path
    os.environ["TF_INSPECTOR_RUNS"] = str(path)  # the viewer's runs folder (here: the run itself)

    def app(page: str):
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
        at.switch_page(f"viewer/app_pages/{page}.py")  # st.navigation: a page is chosen by its module file
        return at

    def checked(at):
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        failed = [e.value for e in at.error if "could not be drawn" in e.value]
        assert not failed, failed
        return at

    checked(app("summary"))  # warm-up: imports, not counted
    rows = []
    for title, module in PAGES.items():
        page = url_path(module)
        if only and page not in only:
            continue
        cold, rerun, change, what = [], [], [], ""
        for _ in range(reps):
            st.cache_data.clear()
            st.cache_resource.clear()
            at = app(page)
            cold.append(timed(lambda: checked(at))[1])
            rerun.append(timed(lambda: checked(at))[1])
            what = change_widget(at, page)
            change.append(timed(lambda: checked(at))[1])
        med = statistics.median
        rows.append({"page": title, "cold": med(cold), "rerun": med(rerun), "change": med(change), "what": what})
    return rows


if __name__ == "__main__":
    main()
