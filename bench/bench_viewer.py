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
from inspector import plots  # noqa: E402
from inspector.testing import make_long_run, make_synthetic_run  # noqa: E402
from inspector.units import human_bytes  # noqa: E402


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
        (tensors, steps, m), t = timed(lambda: data.stats_matrix.__wrapped__(str(path), sig, "gradient", "all", "l2"))
        rows.append(("overview: layer x step matrix", t, f"{m.shape[0]} x {m.shape[1]}"))
        fig, t1 = timed(lambda: plots.heatmap(m, tensors, steps, log=True))
        png, t2 = timed(lambda: plots.to_png(fig))
        rows.append(("overview: heatmap figure + PNG", t1 + t2, f"{len(png) / 1024:.0f} KiB PNG"))

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


def compact_parts(path: Path) -> int:
    """Rewrite every statistics part of ``path`` that has no per-tensor row-group index as the
    writer's compaction writes one (``stats_parts.write_sorted``). make_synthetic_run writes its
    rows in one flush, one part of one row group; a training run's writer flushes small parts
    every few seconds and compacts them into sorted parts. Returns how many were rewritten."""
    import pyarrow.parquet as pq

    from inspector.stats_parts import INDEX_KEY, write_sorted
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
        at.switch_page(f"viewer/{page}.py")  # st.navigation: a page is chosen by its module file
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
