"""The benchmark scripts run to completion with --quick and print their tables (no timing checks)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", *args], capture_output=True,
                         text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_bench_reader_quick():
    out = _run("bench_reader.py")
    assert "open + first query" in out and "peak RSS" in out


def test_bench_hook_quick():
    pytest.importorskip("tensorflow")
    out = _run("bench_hook.py")
    assert "(1) plain training" in out and "(4) statistics every step" in out and "ratio" in out
    assert "(4b) statistics every step, hooks.minimize" in out and "(5b) full dump, hooks.minimize" in out
    assert "(7) always-on: layer statistics every step" in out and "hook py ms" in out


def test_bench_hook_floors():
    """With the touch configurations named, each statistics target states its floor: the touch
    configuration's ratio plus one read of what the statistics read, so above the touch's own."""
    pytest.importorskip("tensorflow")
    out = _run("bench_hook.py", "--model", "resnet-nobn",
               "--configs", "plain", "stats-every", "layers-every", "touch-every", "touch-layers")

    def p50_ratio(label: str) -> float:
        return float(re.search(re.escape(label) + r".*?\s+[0-9.]+\s+([0-9.]+)\s", out).group(1))
    every = float(re.search(r"p50 <= max\(1\.25, floor ([0-9.]+) \+ 0\.05\)", out).group(1))
    always = float(re.search(r"p50 <= 1\.10 \(floor ([0-9.]+)\)", out).group(1))
    assert every > p50_ratio("(4g) every captured tensor read by one element"), out
    assert always > p50_ratio("(7g) always-on, each layer tensor read by one element"), out


def test_bench_first_step_quick():
    pytest.importorskip("tensorflow")
    out = _run("bench_first_step.py")
    assert "\nbuilt in the step " in out and "\npre-built " in out and "first - later ms" in out


def test_bench_storage_quick():
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    out = _run("bench_storage.py")
    assert "write one 8 MiB dump (MB/s)" in out and "first query, one tensor" in out and "S3 (moto)" in out


def test_bench_keras_quick():
    pytest.importorskip("tensorflow")
    out = _run("bench_keras.py")
    for config in ("plain", "idle", "idle/probe", "defaults", "defaults/probe", "stats-every/train-batch",
                   "stats-every/probe", "dump-full/probe", "tensorboard", "debugger-v2 FULL_HEALTH"):
        assert f"\n{config} " in out, config


def test_bench_loops_quick():
    pytest.importorskip("tensorflow")
    out = _run("bench_loops.py")
    for row in ("fixed (tracing) s", "sampled step / plain step", "idle step / plain step", "whole loop / plain loop"):
        assert f"\n{row} " in out, row


def test_bench_diagnosis_quick():
    """Real models with one fault each (a forward NaN, a backward Inf, a frozen layer, a saturated
    tanh; graph mode and Keras) and two healthy ones: the tool names every culprit, no alarm."""
    pytest.importorskip("tensorflow")
    out = _run("bench_diagnosis.py")
    assert "| mode | case | expected (layer, step) | named (layer/op, step, kind) | verdict |" in out
    assert "| graph | nan_forward | fc2, 20 | fc2 (fc2/Log), 20, nonfinite | hit |" in out
    assert "answered by: inspector.analysis.diagnose" in out
    assert "4 of 4 localized, 0 false alarms on 2 healthy runs" in out


def test_bench_graph_quick():
    pytest.importorskip("streamlit")
    out = _run("bench_graph.py")
    assert "DOT text (s)" in out and "page cold (s)" in out and "page search 'BiasAdd' (s)" in out


def test_bench_export_quick():
    pytest.importorskip("tensorboard")
    out = _run("bench_export.py")
    assert "export --tensorboard of 200 steps x 10 tensors" in out and "histogram columns (CPU s)" in out
    assert "tensorboard RecordWriter (pure-Python CRC)" in out


def test_bench_viewer_browser_small(tmp_path):
    """bench_viewer.py --browser on a small run: every measurement of its table is printed."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium not installed")
    pytest.importorskip("playwright")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_viewer.py"), "--browser", "--steps", "20",
                          "--tensors", "12", "--keep", str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    for what in ("overview, cold", "overview, warm", "tooltip, median", "overview, Every op", "summary, first visit",
                 "summary, warm"):
        assert f"\n{what} " in out.stdout, what
    # every page's warm first paint in bare Streamlit pages, a positive ratio each
    warm, first = out.stdout.split("page, warm")[1].split("page, first visit")

    def ratios(table: str) -> dict[str, float]:   # a row: the page (may hold spaces), then its ratio
        rows = (re.match(r"(.+?)\s+([0-9.]+)\s", line) for line in table.splitlines()[2:] if line.strip())
        return {m.group(1): float(m.group(2)) for m in rows if m}
    assert set(ratios(warm)) == {"summary", "overview", "distributions", "featuremaps", "masks", "browser", "graph",
                                 "compare", "no run (chrome)", "bare + one chart", "bare + three charts",
                                 "bare + one graph"} and all(r > 0 for r in ratios(warm).values()), out.stdout
    # the first visit after a server start, beside the bare page's first visit after its own
    assert set(ratios(first)) == {"summary", "overview", "featuremaps"} and all(r > 0 for r in ratios(first).values())
