"""The viewer served as a user starts it, for the browser tests and bench/bench_viewer.py:
``streamlit run app.py -- <runs>`` on a free local port, stopped afterwards.

Example::

    with serve(Path("runs")) as url:       # http://127.0.0.1:<port>
        ...
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}: {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"streamlit did not answer {url}/_stcore/health within {timeout}s")


def start(runs: Path, port: int, address: str | None = "127.0.0.1", cwd: Path = ROOT,
          app: Path = ROOT / "app.py") -> subprocess.Popen:
    """``streamlit run app.py`` on ``port`` (``--server.address`` only where ``address`` is given:
    None starts it as the docs' short command does, the script's config deciding); ``app``:
    another checkout's app.py (a benchmark's baseline)."""
    where = ["--server.address", address] if address else []
    # this checkout's viewer as `python -m inspector app` serves it (its imports preloaded at
    # the start: viewer.start); anything else (the bare page, a baseline checkout) plainly
    entry = "viewer.start" if app == ROOT / "app.py" else "streamlit"
    return subprocess.Popen([sys.executable, "-m", entry, "run", str(app), "--server.headless",
                             "true", "--server.port", str(port), *where, "--browser.gatherUsageStats", "false",
                             "--", str(runs)], cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a server a test started, killed if it outlives ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def serve(runs: Path, address: str | None = "127.0.0.1", app: Path = ROOT / "app.py") -> Iterator[str]:
    """``streamlit run app.py -- runs`` on a free local port: its URL once it answers; stopped after."""
    port = free_port()
    proc = start(runs, port, address, app=app)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop(proc)
