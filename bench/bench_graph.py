"""Op graph page benchmark: the whole-model view against the neighbourhood view on one synthetic
model of 1,000 captured tensors (~2,300 ops in the forward graph; ``inspector.testing``).

Rows, each the median of ``--reps``, the two views side by side in one process:

- **DOT text**: building what Graphviz draws (``collapse`` + ``model_dot``, or the neighbourhood
  and ``dot``), from the parsed graph and every op's look;
- **page cold / change**: the page through AppTest, a new session on empty caches, then a search
  typed into the same session (the whole model opens the matches' scopes);
- **browser** (``--browser``; needs /usr/bin/chromium and playwright): ``streamlit run`` and
  headless Chromium, from loading the page's URL to Graphviz's SVG holding every box: what a
  user waits for, layout in the browser included.

    python bench/bench_graph.py                 # 1000 tensors, 3 reps
    python bench/bench_graph.py --browser       # and the browser's drawing time
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                # first: the imports below (noqa: E402) from this checkout
sys.path.insert(1, str(ROOT / "tests"))

from bench.common import format_table  # noqa: E402
import inspector  # noqa: E402
from inspector.graph.scopes import collapse  # noqa: E402
from inspector.graph.graphdef import OpGraph, parse_graph_def  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def dot_rows(path: Path, reps: int) -> tuple[list[tuple], dict[str, int]]:
    """The DOT text rows, and how many boxes each view draws (the browser waits for them)."""
    from viewer.app_pages import graph as page
    from viewer.charts.graph_colours import Look, Scale
    from viewer.charts.graph_dot import dot, model_dot
    from viewer.charts.graph_model import MAX_UNITS, revealed
    run = inspector.open_run(path)
    graph = OpGraph(parse_graph_def(run.graph_def_bytes()))
    by_op = {op: t for op, t in page.tensor_of_op(run.tensors).items() if op in graph.nodes}
    looks = {op: Look(t, 1.0 + i % 7, "value") for i, (op, t) in enumerate(by_op.items())}
    scale = Scale.robust([lk.value for lk in looks.values()], "rms")

    def keep(name: str) -> bool:
        return not page.HIDDEN.search(name)
    centre = next(op for op in by_op if op.endswith("Relu"))

    def whole() -> str:
        view = collapse(graph, revealed(centre, []), keep, MAX_UNITS)
        return model_dot(view, graph, looks, scale, "rms", set(), centre)

    def near() -> str:
        return dot(graph.neighbourhood(centre, 2, 60, keep), graph, looks, scale, "rms")

    view = collapse(graph, revealed(centre, []), keep, MAX_UNITS)
    boxes = {"Whole model": len(view.units), "Neighbourhood": len(graph.neighbourhood(centre, 2, 60, keep).nodes)}
    tw, tn = median_time(whole, reps), median_time(near, reps)
    return [("graph", f"{len(graph.nodes)} ops, {len(by_op)} captured", "", ""),
            ("DOT text (s)", f"{tw:.4f} ({boxes['Whole model']} boxes)", f"{tn:.4f} ({boxes['Neighbourhood']})",
             f"{tw / tn:.1f}")], boxes


def app_rows(root: Path, name: str, reps: int) -> list[tuple]:
    import streamlit as st
    from test_app import ok, start

    def cold(view: str):
        st.cache_data.clear()
        st.cache_resource.clear()
        return ok(start(root / name, "Op graph", query={"gr_view": view}))

    def search(view: str) -> float:
        at = cold(view)
        t = time.perf_counter()
        ok(at.text_input(key="gr_find").set_value("BiasAdd").run())
        return time.perf_counter() - t

    cold("Neighbourhood")                    # imports, not counted
    rows = []
    c = {v: median_time(lambda v=v: cold(v), reps) for v in ("Whole model", "Neighbourhood")}
    rows.append(("page cold (s)", f"{c['Whole model']:.2f}", f"{c['Neighbourhood']:.2f}",
                 f"{c['Whole model'] / c['Neighbourhood']:.2f}"))
    s = {v: statistics.median(search(v) for _ in range(reps)) for v in ("Whole model", "Neighbourhood")}
    rows.append(("page search 'BiasAdd' (s)", f"{s['Whole model']:.2f}", f"{s['Neighbourhood']:.2f}",
                 f"{s['Whole model'] / s['Neighbourhood']:.2f}"))
    return rows


def browser_rows(root: Path, name: str, reps: int, boxes: dict[str, int]) -> list[tuple]:
    try:
        from test_browser import ARGS, CHROMIUM, serve, sync_api, wait_rendered
    except BaseException as e:          # the test module skips (pytest's Skipped) without Chromium
        return [("browser", f"not measured: {e}", "", "")]
    drawn = "n => document.querySelectorAll('[data-testid=\"stGraphVizChart\"] svg g.node').length >= n"
    out = {}
    with serve(root) as url, sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        for view in ("Whole model", "Neighbourhood"):
            times = []
            for _ in range(reps + 1):          # the first load warms the server's caches: not counted
                page = b.new_page(viewport={"width": 1500, "height": 2000})
                t = time.perf_counter()
                page.goto(f"{url}/graph?run={name}&gr_view={view.replace(' ', '+')}", wait_until="domcontentloaded")
                page.wait_for_function(drawn, arg=boxes[view], timeout=600_000, polling=100)
                wait_rendered(page, 0)
                times.append(time.perf_counter() - t)
                page.close()
            out[view] = statistics.median(times[1:])
        b.close()
    return [("browser: load to SVG drawn (s)", f"{out['Whole model']:.2f}", f"{out['Neighbourhood']:.2f}",
             f"{out['Whole model'] / out['Neighbourhood']:.2f}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    ap.add_argument("--quick", action="store_true", help="smoke run: 60 tensors, 1 rep (numbers meaningless)")
    args = ap.parse_args()
    tensors, reps = (60, 1) if args.quick else (args.tensors, args.reps)
    logging.getLogger("streamlit").setLevel(logging.ERROR)   # AppTest outside a server warns on every cache
    with tempfile.TemporaryDirectory(prefix="bench_graph_") as tmp:
        root = Path(tmp)
        make_synthetic_run(root / "model", steps=20, tensors=tensors, dump_every=None, nonfinite_at=15)
        rows, boxes = dot_rows(root / "model", reps)
        rows += app_rows(root, "model", reps)
        if args.browser:
            rows += browser_rows(root, "model", reps, boxes)
    print(format_table(rows, ["measure", "whole model", "neighbourhood", "ratio"]))


if __name__ == "__main__":
    main()
