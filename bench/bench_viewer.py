"""Viewer benchmark: a synthetic 1,000-step x 300-tensor run, opened and rendered.

Prints one table: generation, reader open, first statistics query, one dumped tensor read,
overview data preparation (the layer x step matrix) and figure rendering, and the whole
Training overview page through Streamlit's AppTest, cold (empty caches) and warm (a widget
change on cached data).

    python bench/bench_viewer.py                  # 1000 steps x 300 tensors in a temp dir
    python bench/bench_viewer.py --steps 200 --tensors 60 --keep /tmp/bench_run
    python bench/bench_viewer.py --long --steps 10000 --tensors 1000   # a long run, no dumps (target: page < 2 s)

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
    args = ap.parse_args()
    tmp = None
    if args.keep:
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
                                                    dump_every=args.dump_every))
            rows.append(("generate synthetic run", t, f"{args.steps} steps x {args.tensors} tensors"))
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

        from streamlit.testing.v1 import AppTest
        import os
        os.environ["TF_INSPECTOR_RUNS"] = str(path)  # the viewer's runs folder (here: the run itself)
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.switch_page("viewer/overview.py")  # st.navigation: a page is chosen by its module file
        _, t = timed(at.run)
        assert not at.exception, [e.value for e in at.exception]
        rows.append(("app: Training overview, cold", t, "AppTest, empty caches, 2 heatmaps + series"))
        _, t = timed(lambda: at.selectbox(key="ov_tensor").select_index(5).run())
        rows.append(("app: change tensor, warm", t, "cached matrices; only the series is read"))
        _, t = timed(lambda: at.selectbox(key="ov_hm_grad_stat").select("mean").run())
        rows.append(("app: change heatmap statistic", t, "one new statistics column read + render"))
        at.switch_page("viewer/summary.py")
        _, t = timed(at.run)
        rows.append(("app: Summary page", t, "alerts over all statistics"))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'seconds':>8}  notes")
    print("-" * (width + 40))
    for what, secs, note in rows:
        print(f"{what:<{width}}  {secs:8.3f}  {note}")


if __name__ == "__main__":
    main()
