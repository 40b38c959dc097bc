"""The Streamlit viewer driven with AppTest on small synthetic runs: every page, the widgets
that change what is shown, live refresh, and bad input (shown as messages, never exceptions)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from inspector.format import manifest_name  # noqa: E402
from inspector.synthetic import SyntheticRun, make_synthetic_run  # noqa: E402
from inspector.writer import RunWriter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGES = ["Summary", "Training overview", "Distributions", "Feature maps", "Masks & templates", "Tensor browser",
         "Compare"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "exp1", steps=30, tensors=20, dump_every=10, nonfinite_at=25, dropped_steps=(20,))
    make_synthetic_run(root / "exp2", steps=20, tensors=20, dump_every=10, seed=1)
    return root


def start(root: Path | str, page: str = "Summary", **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["root"] = str(root)
    at.session_state["page"] = page
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def ok(at: AppTest) -> AppTest:
    """No exception element, no page-level failure message."""
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "could not be drawn" in e.value]
    return at


def images(at: AppTest) -> list[str]:
    return [u for im in at.image for u in im.value]


def captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


# ---- every page --------------------------------------------------------------------------

def test_summary(runs):
    at = ok(start(runs / "exp1"))
    assert at.header[0].value == "Run exp1"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Status"] == "finished"
    assert metrics["Statistics steps"] == "30" and metrics["Last step"] == "29"
    assert metrics["Dump steps"] == "2" and metrics["Dropped dumps"] == "1"       # step 20 dropped
    errors = " ".join(e.value for e in at.error)
    assert "first non-finite value at step 25" in errors
    warnings = " ".join(w.value for w in at.warning)
    assert "dead ReLU" in warnings and "dropped" in warnings
    assert any(df.value.shape[0] >= 5 for df in at.dataframe)                   # hook settings table


def test_overview_heatmaps_and_series(runs):
    at = ok(start(runs / "exp1", "Training overview"))
    assert len(images(at)) == 2                      # gradient and activation heatmaps
    assert len(at.get("vega_lite_chart")) == 1       # the interactive time series
    assert at.selectbox(key="ov_hm_grad_stat").value == "l2"
    assert "conv1/Relu:0 forward mean" in captions(at)
    before_img, before_cap = images(at), captions(at)
    at.selectbox(key="ov_tensor").select("conv3/Relu:0").run()
    ok(at)
    assert "conv3/Relu:0 forward mean" in captions(at) and captions(at) != before_cap
    at.selectbox(key="ov_hm_grad_stat").select("max").run()
    assert images(ok(at))[0] != before_img[0]        # the gradient heatmap changed
    assert ok(at).image[0].captions[0].startswith("14 tensors x 30 steps")   # 20 less 6 without gradient
    at.text_input(key="ov_filter").input("Relu").run()
    shown = ok(at).image[0].captions[0]
    assert shown.endswith("x 30 steps; grey = NaN/Inf or (log scale) zero") and not shown.startswith("14 ")


def test_overview_positive_negative_curves(runs):
    at = ok(start(runs / "exp1", "Training overview", ov_tensor="icnn/post_mask:0"))
    cap = next(c.value for c in at.caption if c.value.startswith("icnn/post_mask:0"))
    assert "positive" in cap and "negative" in cap
    pos = float(cap.split("positive ")[1].split(",")[0])
    neg = float(cap.split("negative ")[1].split(",")[0])
    assert pos > neg                                # the synthetic run separates the groups late in training


def test_distributions(runs):
    at = ok(start(runs / "exp1", "Distributions"))
    assert len(images(at)) == 3                     # in-graph, dumped samples, ridge
    assert "forward positive" in captions(at) and "gradient negative" in captions(at)
    before = images(at)
    at.select_slider(key="di_step").set_value(5).run()
    ok(at)
    assert images(at)[0] != before[0]
    assert "step 5" in " ".join(s.value for s in at.subheader)
    at.slider(key="di_ridge_n").set_value(4).run()
    assert images(ok(at))[2] != before[2]


def test_feature_maps_and_icnn(runs):
    at = ok(start(runs / "exp1", "Feature maps"))
    assert len(images(at)) == 2                     # channel grid + ICNN pre/mask/post
    assert "shape [8, 16, 16, 4]" in captions(at)
    assert "positive sample" in captions(at) and "negative sample" in captions(at)
    grid, icnn = images(at)
    at.selectbox(key="fm_sample").set_value(3).run()
    assert images(ok(at))[0] != grid
    at.selectbox(key="fm_filter").set_value(2).run()
    assert images(ok(at))[1] != icnn
    at.radio(key="fm_kind").set_value("gradient").run()
    assert "gradient" in " ".join(r.value for r in at.radio if r.key == "fm_kind")


def test_masks_and_templates(runs):
    at = ok(start(runs / "exp1", "Masks & templates"))
    assert len(images(at)) == 3                     # templates, beta/loss, mu scatter
    cap = captions(at)
    assert "template cell" in cap and "beta =" in cap
    before = images(at)
    at.selectbox(key="mt_filter").set_value(5).run()
    after = images(ok(at))
    assert after[0] != before[0] and after[1] != before[1] and after[2] != before[2]
    at.toggle(key="mt_pool").set_value(True).run()
    assert "all dump steps" in captions(ok(at)) or images(at)[2] != after[2]


def test_tensor_browser(runs):
    at = ok(start(runs / "exp1", "Tensor browser"))
    assert "20 of 20 tensors" in captions(at)
    at.text_input(key="tb_search").input("relu").run()
    cap = captions(ok(at))
    n = int(cap.split(" of ")[0])
    assert 0 < n < 20
    at.text_input(key="tb_search").input("icnn").run()
    at.selectbox(key="tb_tensor").select("icnn/mu:0").run()
    md = " ".join(m.value for m in ok(at).markdown)
    assert "ICNN mu" in md and "shape **[8, 8, 2]**" in md
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download .npz (forward, gradient, samples)" in labels and "Download PNG" in labels


def test_compare_two_steps_and_two_runs(runs):
    at = ok(start(runs, "Compare"))                 # the folder: exp1 is chosen, exp2 is there to compare
    assert at.selectbox(key="run").value.endswith("exp1")
    assert len(images(at)) == 2
    table = at.dataframe[0].value
    at.select_slider(key="cmp_step_A").set_value(10).run()
    assert not ok(at).dataframe[0].value.equals(table)
    at.radio(key="cmp_mode").set_value("Same tensor in two runs").run()
    ok(at)
    assert at.selectbox(key="cmp_run_b").value.endswith("exp2")
    assert len(at.get("vega_lite_chart")) == 1 and len(images(at)) == 2


def test_every_page_of_a_single_run_path(runs):
    """The root may be one run instead of a folder of runs."""
    for page in PAGES:
        at = ok(start(runs / "exp2", page))
        assert at.header, page


def test_viewer_never_imports_tensorflow(runs):
    """In a fresh interpreter (other tests here import TensorFlow): every page, then check."""
    code = textwrap.dedent(f"""
        import sys
        from streamlit.testing.v1 import AppTest
        for page in {PAGES!r}:
            at = AppTest.from_file({APP!r}, default_timeout=120)
            at.session_state["root"] = {str(runs)!r}
            at.session_state["page"] = page
            at.run()
            assert not at.exception, (page, [e.value for e in at.exception])
        print("TF_IMPORTED", "tensorflow" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TF_IMPORTED False" in out.stdout


# ---- live runs ---------------------------------------------------------------------------

def test_refresh_shows_new_steps_of_a_running_run(tmp_path):
    b = SyntheticRun(tmp_path / "live", tensors=15, steps_hint=40, dump_every=10, stats_flush_secs=0)
    b.write_steps(0, 10)
    b.sync()
    at = ok(start(tmp_path / "live"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Status"] == "running" and metrics["Last step"] == "9"
    assert any("still being written" in i.value for i in at.info)
    b.write_steps(10, 25)
    b.sync()
    at.button[0].click().run()                      # the sidebar's Refresh
    metrics = {m.label: m.value for m in ok(at).metric}
    assert metrics["Last step"] == "24" and metrics["Dump steps"] == "3"
    b.close()
    at.run()
    assert {m.label: m.value for m in ok(at).metric}["Status"] == "finished"


# ---- bad input ---------------------------------------------------------------------------

def test_missing_path_is_a_message(tmp_path):
    at = start(tmp_path / "nope")
    assert not at.exception
    assert any("does not exist" in e.value for e in at.error)
    assert at.text_input(key="root").value.endswith("nope")   # the sidebar stays usable


def test_folder_without_runs_is_a_message(tmp_path):
    (tmp_path / "not_a_run").mkdir()
    at = start(tmp_path)
    assert not at.exception
    assert any("No run in" in e.value for e in at.error)


@pytest.mark.parametrize("page", PAGES)
def test_empty_run_every_page(tmp_path, page):
    RunWriter(tmp_path / "empty", manifest={"tensors": []}).close()
    at = ok(start(tmp_path / "empty", page))
    text = " ".join(x.value for x in [*at.info, *at.warning])
    assert any(w in text for w in ("empty", "no statistics", "No full dumps", "no ICNN", "no statistics yet")), text


def damaged_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    dump = sorted((dst / "dumps").iterdir())[-1]
    dump.write_bytes(dump.read_bytes()[:200])                   # truncated dump
    (dst / "stats" / "chief.999999.parquet").write_bytes(b"PAR1 not really parquet")
    return dst


@pytest.mark.parametrize("page", PAGES)
def test_damaged_files_every_page(runs, tmp_path, page):
    path = damaged_copy(runs / "exp1", tmp_path / "damaged")
    at = start(path, page)
    assert not at.exception, [e.value for e in at.exception]
    if page == "Summary":
        assert any("damaged" in w.value for w in at.warning)
    if page in ("Feature maps", "Masks & templates", "Tensor browser"):
        # the last dump step is chosen by default and is the truncated one
        assert any("damaged dump file" in e.value for e in at.error), [e.value for e in at.error]


def test_damaged_manifest_is_a_message(tmp_path):
    run = tmp_path / "bad"
    run.mkdir()
    (run / manifest_name("chief", 1)).write_text("{not json")
    at = start(run)
    assert not at.exception
    assert any("damaged" in e.value for e in at.error)


def test_newer_format_is_a_message(runs, tmp_path):
    path = tmp_path / "future"
    shutil.copytree(runs / "exp2", path)
    m = path / manifest_name("chief", 1)
    m.write_text(json.dumps({**json.loads(m.read_text()), "format_version": 99}))
    at = start(path)
    assert not at.exception
    assert any("newer than this reader" in e.value for e in at.error)


def test_crashed_run_says_so(runs, tmp_path):
    """A manifest left 'running' by a process that is gone: the summary says crashed, and why."""
    import socket
    import subprocess
    import sys
    path = tmp_path / "crashed"
    shutil.copytree(runs / "exp2", path)
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)
    m = path / manifest_name("chief", 1)
    m.write_text(json.dumps({**json.loads(m.read_text()), "status": "running", "host": socket.gethostname(),
                             "pid": gone, "heartbeat_secs": 60}))
    at = ok(start(path))
    assert {mt.label: mt.value for mt in at.metric}["Status"] == "crashed"
    assert any("gone without closing it" in w.value for w in at.warning)


def test_mode_and_worker_pickers_show_one_view(tmp_path):
    """A run with eval sessions and two workers: the sidebar offers mode, worker and batch, and
    the pages show the chosen view (an eval batch's steps; another worker's)."""
    from test_sessions import session
    session(tmp_path / "r", range(1, 11), 0.0, dumps=(5,))
    session(tmp_path / "r", [10, 10], 5.0, dumps=(10,), mode="eval")
    session(tmp_path / "r", range(1, 4), 1.0, worker="worker-1")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["root"] = str(tmp_path / "r")
    at.run()
    assert not at.exception
    assert [s.label for s in at.sidebar.selectbox] == ["Run", "Mode", "Worker"]
    assert at.sidebar.selectbox(key="worker").options == ["chief", "worker-1"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Statistics steps"] == "10" and metrics["Dump steps"] == "1"
    at.sidebar.selectbox(key="mode").set_value("eval").run()
    metrics = {m.label: m.value for m in at.metric}
    assert not at.exception and metrics["Statistics steps"] == "1" and metrics["Last step"] == "10"
    assert metrics["Dump steps"] == "1"
    at.sidebar.selectbox(key="mode").set_value("train").run()
    at.sidebar.selectbox(key="worker").set_value("worker-1").run()
    metrics = {m.label: m.value for m in at.metric}
    assert not at.exception and metrics["Statistics steps"] == "3"
