"""The viewer's server imports what the pages need when it starts, before the first browser
connects (viewer/start.py): the first page view after a start does not pay the imports. Both
ways of starting it through viewer.start (the tests' and ``make demo``'s ``python -m
viewer.start run app.py``, and ``python -m inspector app``) are checked on the server process itself, before any page was viewed: its memory maps hold pyarrow's and
Matplotlib's compiled libraries (which Streamlit itself does not load) and it serves the page."""
from __future__ import annotations

import os
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
    read_ahead = threading.Event()

    def follow() -> None:   # the server's console, line by line
        for line in proc.stdout:
            lines.append(line)
            if "read ahead" in line:
                read_ahead.set()
    threading.Thread(target=follow, daemon=True).start()
    try:
        check_preloaded(proc, f"http://127.0.0.1:{port}")
        assert read_ahead.wait(60), "".join(lines)[-3000:]
    finally:
        stop(proc)
    log = "".join(lines)
    assert f"the Summary of {(runs / 'exp').resolve()} read ahead" in log
    # neither the imports before the runtime nor the page drawn without a browser fill the log
    assert "No runtime found" not in log and "missing ScriptRunContext" not in log, log[-2000:]
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


def test_the_first_runs_summary_is_read_ahead_into_the_pages_cache(tmp_path, monkeypatch):
    """viewer.warmup draws the Summary of the folder's first run without a browser: the reads the
    page makes are then cached under the same arguments (the view the sidebar opens on), so the
    first visit does not make them again."""
    import inspector.analysis
    from viewer import app_main, data, warmup
    from viewer.app_pages import summary
    from viewer.ui import Ctx

    make_synthetic_run(tmp_path / "b", steps=6, tensors=4, dump_every=3)
    make_synthetic_run(tmp_path / "a", steps=6, tensors=4, dump_every=3, nonfinite_at=4)
    calls = []
    real = inspector.analysis.diagnose
    monkeypatch.setattr(inspector.analysis, "diagnose", lambda run: calls.append(run.path) or real(run))
    data.diagnosis.clear()
    assert warmup.summary(str(tmp_path)) == str((tmp_path / "a").resolve())   # the sidebar's first run
    assert len(calls) == 1
    path = str((tmp_path / "a").resolve())
    sig = app_main.view_picker(path, data.signature(path))
    assert data.diagnosis(path, sig)[0]["kind"] == "nonfinite" and len(calls) == 1     # cached, not read again
    summary.render(Ctx(path, sig, (path, str((tmp_path / "b").resolve()))))
    assert len(calls) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert warmup.summary(str(empty)) is None


def test_only_the_viewers_script_is_read_ahead():
    from viewer.start import runs_folder
    assert runs_folder(["run", "/x/app.py", "--server.port", "1", "--", "runs/"]) == "runs/"
    assert runs_folder(["run", "viewer/app_main.py", "--", "s3://b/runs"]) == "s3://b/runs"
    assert runs_folder(["run", "bench/bare_app.py", "--", "runs/"]) is None
    assert runs_folder(["version"]) is None
