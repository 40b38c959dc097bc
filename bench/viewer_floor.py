"""The Training overview's and the Summary's first paint in headless Chromium for any run,
without bench_viewer.py's tooltip and "Every op" steps (which need a large heatmap): run it on
a tiny run to see the page's own floor beside a large run's numbers.

    .venv/bin/python -c "from inspector.testing import make_synthetic_run as m; \
        m('/tmp/tiny/run', steps=10, tensors=3, dump_every=None)"
    .venv/bin/python bench/viewer_floor.py /tmp/tiny/run

Two new servers (empty caches), each: the overview cold then warm, the Summary warm; seconds to
the page's last change and the renderer main thread's CPU seconds (bench_viewer.open_page).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from bench_viewer import BROWSER_ARGS, CHROMIUM, HEATMAP_READY, SUMMARY_READY, open_page  # noqa: E402
from browser_serve import serve  # noqa: E402


def main(path: Path, servers: int = 2) -> dict[str, list[tuple[float, float]]]:
    from playwright.sync_api import sync_playwright
    res: dict[str, list[tuple[float, float]]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS, headless=True)
        for _ in range(servers):
            with serve(path.parent, app=ROOT / "app.py") as url:
                ctx = browser.new_context(viewport={"width": 1500, "height": 1100})
                for what in ("overview, cold", "overview, warm"):
                    page, t, busy = open_page(ctx, f"{url}/overview?run={path.name}", HEATMAP_READY)
                    res.setdefault(what, []).append((t, busy))
                    page.close()
                for what in ("summary, first visit", "summary, warm"):
                    page, t, busy = open_page(ctx, f"{url}/?run={path.name}", SUMMARY_READY, 2)
                    res.setdefault(what, []).append((t, busy))
                    page.close()
                ctx.close()
        browser.close()
    return res


if __name__ == "__main__":
    for what, got in main(Path(sys.argv[1])).items():
        print(f"{what:<22} first paint {' '.join(f'{t:.2f}' for t, _ in got)} s   "
              f"main thread CPU {' '.join(f'{c:.2f}' for _, c in got)} s")
