"""The viewer's server imports what the pages need when it starts, before the first browser
connects (viewer/start.py): the first page view after a start does not pay the imports. Both
ways of starting it through viewer.start (the tests' and ``make demo``'s ``python -m
viewer.start run app.py``, and ``python -m inspector app``) are checked on the server process itself, before any page was viewed: its memory maps hold pyarrow's and
Matplotlib's compiled libraries (which Streamlit itself does not load) and it serves the page."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from browser_serve import free_port, start, stop, wait_healthy  # noqa: E402

from inspector.testing import make_synthetic_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: a library file of each preloaded package: mapped in a process that imported it
LIBRARIES = ("libarrow.so", "matplotlib/_path.")

if not Path("/proc/self/maps").exists():
    pytest.skip("reads Linux's /proc/<pid>/maps", allow_module_level=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "exp", steps=4, tensors=3, dump_every=None)
    return root


def loaded(pid: int) -> set[str]:
    """Which of :data:`LIBRARIES` the process ``pid`` has mapped."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {lib for lib in LIBRARIES if lib in maps}


def server_pid(proc: subprocess.Popen) -> int:
    """The Streamlit server's pid: ``proc`` itself, or its one child (``inspector app`` runs the
    server as a subprocess)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(children[0]) if children else proc.pid


def check_preloaded(proc: subprocess.Popen, url: str) -> None:
    wait_healthy(url, proc)
    assert loaded(server_pid(proc)) == set(LIBRARIES)   # no page viewed yet
    import urllib.request
    with urllib.request.urlopen(url + "/", timeout=30) as r:   # and it serves the app
        assert r.status == 200 and b"<div id=\"root\">" in r.read()


def test_viewer_start_run_app_imports_at_start(runs):
    import threading
    port = free_port()
    proc = start(runs, port)
    lines: list[str] = []
    done = threading.Event()

    def follow() -> None:   # the server's console, line by line
        for line in proc.stdout:
            lines.append(line)
        done.set()
    threading.Thread(target=follow, daemon=True).start()
    try:
        check_preloaded(proc, f"http://127.0.0.1:{port}")
    finally:
        stop(proc)
    assert done.wait(30)
    log = "".join(lines)
    assert re.search(r"viewer: modules preloaded in [0-9.]+ s", log), log[-2000:]   # the console says so
    # the preload's cache decorators, run before Streamlit's runtime exists, do not fill the log
    assert "No runtime found" not in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]


def test_inspector_app_imports_at_start(runs):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "app", str(runs), "--port", str(port)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        check_preloaded(proc, f"http://127.0.0.1:{port}")
    finally:
        stop(proc)
