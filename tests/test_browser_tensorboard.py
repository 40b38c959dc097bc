"""TensorBoard itself on an export: ``tensorboard --logdir`` (this environment's, offline, on
127.0.0.1, its default loader: the Rust data server) serves the exported scalars with the
reader's values, and headless Chromium finds its scalars and histograms dashboards populated
with the per-layer tags of each group. The screenshots go where tests/test_browser.py puts
its own (``$TF_INSPECTOR_SHOTS``); docs/images/tensorboard.png is one of them.
Skips where /usr/bin/chromium, playwright or tensorboard is missing."""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from test_browser import browser, free_port, shots, stop, sync_api  # noqa: F401  (browser, shots: fixtures)

import inspector
from inspector.export import tensorboard as tb_export
from inspector.testing import make_synthetic_run

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'tf-inspector[tensorboard]'")


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def tensorboard(logdir: Path, runs: set[str]) -> Iterator[str]:
    """``tensorboard --logdir`` on a free port: its URL once it lists ``runs``; stopped after."""
    exe = Path(sys.executable).with_name("tensorboard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
    port = free_port()
    proc = subprocess.Popen([*cmd, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited with {proc.returncode}: {proc.stdout.read()[-3000:]}")
            with contextlib.suppress(OSError, ValueError):
                if runs <= set(_get(f"{url}/data/runs")):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensorboard did not list {sorted(runs)} within 180 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)   # its Ctrl-C: TensorBoard may sit out a SIGTERM
        stop(proc, 20)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tb")
    path = make_synthetic_run(tmp / "runs" / "demo", steps=40, tensors=20, dump_every=None)
    ex = tb_export.Exporter(lambda: inspector.open_run(path), tmp / "logs", per_layer=True)
    ex.poll()
    ex.close()
    runs = {f"demo/{g}/train" for g in ("all", "positive", "negative")}
    with tensorboard(tmp / "logs", runs) as url:
        yield url, inspector.open_run(path)


def test_tensorboards_data_server_serves_the_readers_values(server):
    url, run = server
    query = urllib.parse.urlencode({"run": "demo/negative/train", "tag": "gradient/conv3/rms"})
    points = _get(f"{url}/data/plugin/scalars/scalars?{query}")
    row = run.query_stats(["conv3/Relu:0"], kinds=["gradient"], groups=["negative"])   # conv3's output
    expect = dict(zip(row["step"], np.float32(row["l2"] / np.sqrt(row["count"])).tolist()))
    assert {step: value for _, step, value in points} == expect and len(expect) == 40


def test_scalars_dashboard_shows_a_layers_gradients_per_group(server, browser, shots):  # noqa: F811 (fixtures)
    url, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{url}/#scalars&tagFilter=gradient%2Fconv3%2F", wait_until="domcontentloaded")
        dash = page.locator("tf-scalar-dashboard")
        cards = dash.locator("tf-scalar-card")
        for stat in tb_export.STATS[:4]:
            cards.filter(has_text=f"gradient/conv3/{stat}").first.wait_for(timeout=120_000)
        # one line per run (all, positive, negative), each drawn smoothed and raw
        sync_api.expect(cards.filter(has_text="gradient/conv3/rms").first.locator("path.line")).to_have_count(
            6, timeout=120_000)
        page.screenshot(path=str(shots / "tensorboard-scalars.png"))
    finally:
        page.close()


def test_histograms_dashboard_shows_positive_and_negative_samples(server, browser, shots):  # noqa: F811 (fixtures)
    url, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{url}/#histograms&tagFilter=gradient%2Fconv3%24", wait_until="domcontentloaded")
        cards = page.locator("tf-histogram-dashboard tf-histogram-loader").filter(has_text="gradient/conv3")
        cards.first.wait_for(timeout=120_000)
        for group in ("positive", "negative"):
            card = cards.filter(has_text=f"demo/{group}/train").first
            # a slice per histogram step (40: every step of a 40-step run)
            sync_api.expect(card.locator("g.histogram")).to_have_count(40, timeout=120_000)
        page.screenshot(path=str(shots / "tensorboard-histograms.png"))
    finally:
        page.close()
