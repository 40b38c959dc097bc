"""The Streamlit viewer driven with AppTest on small synthetic runs: every page, the widgets
that change what is shown, live refresh, and bad input (shown as messages, never exceptions)."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("streamlit")  # first: the imports below (noqa: E402) need Streamlit
from streamlit.testing.v1 import AppTest  # noqa: E402

import inspector  # noqa: E402
from inspector.format.loghist import LogHistogram, empty_rows# noqa: E402
from inspector.format import manifest_name  # noqa: E402
from inspector.testing import SyntheticRun, make_synthetic_run  # noqa: E402
from inspector.writer import RunWriter  # noqa: E402
from viewer.ui import WORD_JOINER  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGES = ["Summary", "Training overview", "Distributions", "Feature maps", "Masks & templates", "Tensor browser",
         "Op graph", "Compare"]
# page title -> its module file (AppTest.switch_page takes the file; its stem is the URL path)
PAGE_FILES = {"Summary": "viewer/app_pages/summary.py", "Training overview": "viewer/app_pages/overview.py",
              "Distributions": "viewer/app_pages/distributions.py", "Feature maps": "viewer/app_pages/featuremaps.py",
              "Masks & templates": "viewer/app_pages/masks.py", "Tensor browser": "viewer/app_pages/browser.py",
              "Op graph": "viewer/app_pages/graph.py", "Compare": "viewer/app_pages/compare.py"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_synthetic_run(root / "exp1", steps=30, tensors=20, dump_every=10, nonfinite_at=25, dropped_steps=(20,))
    make_synthetic_run(root / "exp2", steps=20, tensors=20, dump_every=10, seed=1)
    return root


@pytest.fixture(autouse=True)
def _restore_runs_env(monkeypatch):
    monkeypatch.setenv("TF_INSPECTOR_RUNS", "")   # start() sets it; restored after each test


def start(root: Path | str, page: str = "Summary", query: dict | None = None, **state) -> AppTest:
    """The viewer started on the runs folder ``root`` (as ``streamlit run app.py -- root``)."""
    os.environ["TF_INSPECTOR_RUNS"] = str(root)
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page(PAGE_FILES[page])
    for k, v in (query or {}).items():
        at.query_params[k] = v
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def unescape(text: str) -> str:
    """What a Markdown body shows: backslash escapes removed."""
    return re.sub(r"\\(.)", r"\1", text)


def ok(at: AppTest) -> AppTest:
    """No exception element, no page-level failure message."""
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "could not be drawn" in e.value]
    return at


def images(at: AppTest) -> list[str]:
    return [u for im in at.image for u in im.value]


def vega(at: AppTest) -> list[tuple[dict, list]]:
    """Every Vega-Lite chart of the page: (its spec, its datasets as DataFrames)."""
    import pyarrow as pa
    return [(json.loads(c.proto.spec), [pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                                        for d in c.proto.datasets]) for c in at.get("vega_lite_chart")]


def vega_hists(at: AppTest) -> list[tuple[dict, list]]:
    """The histogram charts (side-by-side panels, viewer.charts.hist_charts.histogram_chart)."""
    return [(s, d) for s, d in vega(at) if "hconcat" in s]


def vega_ridge(at: AppTest) -> tuple[dict, list]:
    return next((s, d) for s, d in vega(at) if "histograms over steps" in json.dumps(s.get("title")))


def facts(at: AppTest) -> dict[str, str]:
    """The Summary's facts table (one Markdown table: a column per fact) as {what: value}."""
    table = next(m.value for m in at.markdown if m.value.startswith("| Status |"))
    head, _, row = table.splitlines()

    def cells(line: str) -> list[str]:
        return [unescape(c.strip()) for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    return dict(zip(cells(head), cells(row)))


def captions(at: AppTest) -> str:
    return "\n".join(unescape(c.value) for c in at.caption)


# ---- every page --------------------------------------------------------------------------

def test_summary(runs):
    at = ok(start(runs / "exp1"))
    assert at.header[0].value == "Run exp1"
    metrics = facts(at)
    assert metrics["Status"] == "finished"
    assert metrics["Statistics steps"] == "30" and metrics["Last step"] == "29"
    assert metrics["Dump steps"] == "2" and metrics["Dropped"] == "1 dump(s)"       # step 20 dropped
    errors = unescape(" ".join(e.value for e in at.error))
    assert "first non-finite value: conv2/Relu (Relu, layer conv2) made the first non-finite values" in errors \
        and "at step 25" in errors
    warnings = " ".join(w.value for w in at.warning)
    assert "dead ReLU" in warnings and "dropped" in warnings
    # hook settings and sessions: static tables, every row and column shown (no scrolling frame),
    # drawn when their tab is opened
    sessions = list(inspector.open_run(runs / "exp1").sessions.columns)
    assert not [t for t in at.table if list(t.value.columns) in (["setting", "value"], sessions)]
    at.session_state["sm_tab"] = "Run details"
    tables = [t.value for t in ok(at.run()).table]
    assert any(t.shape[0] >= 5 and list(t.columns) == ["setting", "value"] for t in tables)
    assert any(list(t.columns) == sessions for t in tables)


def heatmaps(at: AppTest) -> list[dict]:
    """What the page's layer x step heatmap components draw (viewer.charts.heatmap.payload)."""
    return [json.loads(c.proto.json) for c in at.get("bidi_component")
            if c.proto.component_name.endswith("tf_inspector_heatmap")]


def heatmap_data(at: AppTest) -> list[str]:
    """The heatmaps' images and values, as sent."""
    return [h["png"] + h["values"] for h in heatmaps(at)]


def test_overview_heatmaps_and_series(runs):
    at = ok(start(runs / "exp1", "Training overview"))
    (grad,) = heatmaps(at)                           # the open tab only: Gradients
    assert grad["title"] == "gradient l2 (group all)" and grad["log"] and grad["png"].startswith("data:image/png")
    assert not at.get("vega_lite_chart")             # the time series: in its own tab
    assert at.selectbox(key="ov_hm_grad_stat").value == "l2"
    at.session_state["ov_tab"] = "One tensor over steps"
    assert "conv1/Relu:0 forward mean" in captions(ok(at.run())) and not heatmaps(at)
    assert len(at.get("vega_lite_chart")) == 1
    before_cap = captions(at)
    at.selectbox(key="ov_tensor").select("conv3/Relu:0")
    at.session_state["ov_tab"] = "One tensor over steps"   # AppTest sends a tab bar's default with a widget's change
    ok(at.run())
    assert "conv3/Relu:0 forward mean" in captions(at) and captions(at) != before_cap
    at.session_state["ov_tab"] = "Gradients"
    ok(at.run()).selectbox(key="ov_hm_grad_stat").select("max").run()
    after = heatmaps(ok(at))[0]
    assert after["stat"] == "max" and not after["log"] and after["values"] != grad["values"]
    # 14 tensors with gradients, in 6 layers (conv1-3, icnn, dense, loss): one row each, folded; the
    # loss's is no model layer: left out
    assert "5 rows x 30 statistics columns" in captions(at) and "1 loss and label op(s) left out" in captions(at)
    assert "layers folded into their output row" in captions(at)
    assert "rows in network order" in captions(at)
    at.toggle(key="ov_all_ops").set_value(True).run()
    assert "13 rows x 30 statistics columns" in captions(ok(at)) and len(heatmaps(at)[0]["labels"]) == 13
    at.toggle(key="ov_all_ops").set_value(False).run()
    at.text_input(key="ov_filter").input("Relu").run()
    assert "3 rows x 30 statistics columns" in captions(ok(at))   # conv1-3/Relu: the filter is on names
    assert len(images(at)) == 0                      # no static image: PNG on demand
    assert "Download PNG" in [b.proto.label for b in at.get("download_button")]
    at.session_state["ov_tab"] = "Activations"
    (fwd,) = heatmaps(ok(at.run()))
    # activations on one scale too: the colour bar's ticks give numbers
    assert fwd["title"] == "forward mean (group all)" and not any(fwd["own"]) and len(fwd["ticks"]) >= 2


def test_overview_positive_negative_curves(runs):
    at = ok(start(runs / "exp1", "Training overview", ov_tensor="icnn/post_mask:0", ov_tab="One tensor over steps"))
    cap = next(c for c in captions(at).splitlines() if c.startswith("icnn/post_mask:0"))
    assert "positive" in cap and "negative" in cap
    pos = float(cap.split("positive ")[1].split(",")[0])
    neg = float(cap.split("negative ")[1].split(",")[0])
    assert pos > neg                                # the synthetic run separates the groups late in training


def test_distributions(runs):
    at = ok(start(runs / "exp1", "Distributions"))
    assert len(images(at)) == 0                     # one Vega-Lite chart: the open tab's in-graph histograms
    assert len(vega_hists(at)) == 1 and len(vega(at)) == 1
    assert "forward positive" in captions(at) and "gradient negative" in captions(at)
    assert "From dumped samples" not in " ".join(s.value for s in at.subheader)
    hist = vega_hists(at)[0][1]
    at.select_slider(key="di_step").set_value(5).run()
    ok(at)
    assert not vega_hists(at)[0][1][0].equals(hist[0])
    assert "step 5" in " ".join(s.value for s in at.subheader)
    at.session_state["di_tab"] = "Dumped samples"   # the dump nearest step 5, alone
    ok(at.run())
    assert len(vega_hists(at)) == 1 and at.selectbox(key="di_dump_step").value is not None
    assert "From dumped samples" in " ".join(s.value for s in at.subheader)
    at.session_state["di_tab"] = "Across steps"     # the ridge plot alone
    ridge = vega_ridge(ok(at.run()))[1]
    assert len(vega(at)) == 1 and not vega_hists(at)
    at.slider(key="di_ridge_n").set_value(4)
    at.session_state["di_tab"] = "Across steps"     # AppTest sends a tab bar's default with a widget's change
    at.run()
    assert vega_ridge(ok(at))[1][0]["step"].nunique() == 4 != ridge[0]["step"].nunique()


def test_feature_maps_and_icnn(runs):
    at = ok(start(runs / "exp1", "Feature maps"))
    assert len(images(at)) == 1     # one section at a time: the channel grid
    assert "shape [8, 16, 16, 4]" in captions(at)
    grid = images(at)[0]
    at.selectbox(key="fm_sample").set_value(3).run()
    assert images(ok(at))[0] != grid
    at.radio(key="fm_section").set_value("One channel").run()
    assert len(images(ok(at))) == 2  # by group, top samples (no overlay: exp1 has no model input; test_app_featuremaps)
    at.radio(key="fm_section").set_value("ICNN mask layers").run()
    assert "positive sample" in captions(ok(at)) and "negative sample" in captions(at)
    icnn = images(at)[-1]
    at.selectbox(key="fm_filter").set_value(2).run()
    assert images(ok(at))[-1] != icnn
    at.radio(key="fm_section").set_value("One channel").run()
    at.radio(key="fm_kind").set_value("gradient").run()
    assert "gradient" in " ".join(r.value for r in at.radio if r.key == "fm_kind")


def test_masks_and_templates(runs):
    at = ok(start(runs / "exp1", "Masks & templates"))
    assert len(images(at)) == 2                     # every sample's map, mu scatter: one section below at a time
    before = images(at)
    at.selectbox(key="mt_filter").set_value(5).run()
    after = images(ok(at))
    assert all(a != b for a, b in zip(after, before))
    assert "Filter 5 (all dump steps)" in captions(at)                  # pooled by default
    at.toggle(key="mt_pool").set_value(False).run()
    assert "Filter 5 (step" in captions(ok(at)) and images(at)[1] != after[1]
    at.radio(key="mt_section").set_value("beta and filter loss").run()
    assert len(images(ok(at))) == 2 and images(at)[1] not in after      # every sample's map, beta/loss
    at.radio(key="mt_section").set_value("Templates T_mu").run()
    cap = captions(ok(at))
    assert "template cell" in cap and "beta =" in cap and len(images(at)) == 2


@pytest.mark.parametrize("key,value", [("mt_filter", 5), ("mt_step", 0), ("mt_sample", 3), ("mt_pool", False)])
def test_masks_figures_are_never_stale_after_a_change(runs, key, value):
    """The page's figures are cached by what they show: after a widget change, each equals the
    figure a new session on empty caches draws for the same view (a cache key missing the
    widget would show the previous view's figure)."""
    import streamlit as st
    section = {"mt_section": "Templates T_mu"} if key == "mt_sample" else {}   # its picker's section
    at = ok(start(runs / "exp1", "Masks & templates", **section))
    widget = at.toggle(key=key) if key == "mt_pool" else at.selectbox(key=key)
    assert widget.value != value
    widget.set_value(value).run()
    changed = images(ok(at))
    st.cache_data.clear()
    fresh = images(ok(start(runs / "exp1", "Masks & templates", **section, **{key: value})))
    assert changed == fresh


def test_tensor_browser(runs):
    at = ok(start(runs / "exp1", "Tensor browser"))
    assert "20 of 20 tensors" in captions(at) and not at.dataframe      # the catalog's grid on demand
    at.text_input(key="tb_search").input("relu").run()
    cap = captions(ok(at))
    n = int(cap.split(" of ")[0])
    assert 0 < n < 20 and len(at.selectbox(key="tb_tensor").options) == n
    at.toggle(key="tb_catalog").set_value(True).run()
    assert list(ok(at).dataframe[0].value["name"]) == at.selectbox(key="tb_tensor").options
    at.text_input(key="tb_search").input("icnn").run()
    at.selectbox(key="tb_tensor").select("icnn/mu:0").run()
    md = unescape(" ".join(m.value for m in ok(at).markdown))
    assert "ICNN mu" in md and "shape **[8, 8, 2]**" in md
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download .npz (forward, gradient, update, samples)" in labels and "Download PNG" in labels


def overlay_sides(at: AppTest) -> set:
    """The (side, group) pairs the Compare page's histogram overlay draws."""
    (spec, datasets), = vega_hists(at)
    return {(r.side, r.group) for d in datasets if {"side", "x0", "fraction"} <= set(d.columns)
            for r in d.itertuples()}


def test_compare_two_steps_and_two_runs(runs):
    at = ok(start(runs, "Compare"))                 # the folder: exp1 is chosen, exp2 is there to compare
    assert at.selectbox(key="run").value.endswith("exp1")
    assert at.selectbox(key="cmp_tensor").value == "loss/Mean:0"        # opens on the loss
    at.selectbox(key="cmp_tensor").select("conv1/Relu:0").run()
    (spec, _), = vega_hists(at)                     # steps A and B on one axis: one panel
    assert len(spec["hconcat"]) == 1
    dash = spec["hconcat"][0]["layer"][1]["encoding"]["strokeDash"]
    assert dash["scale"]["domain"] == ["A: step 0", "B: step 29"]   # A solid, B dashed
    assert overlay_sides(at) == {(s, g) for s in ("A: step 0", "B: step 29") for g in ("positive", "negative")}
    table = at.table[0].value                       # a static table: every column shown, none cut
    assert list(table.columns) == [f"{g} @ {s}" for g in ("all", "positive", "negative") for s in (0, 29)]
    assert "zero_fraction" in table.index and not at.dataframe
    at.select_slider(key="cmp_step_A").set_value(10).run()
    assert not ok(at).table[0].value.equals(table)
    assert {s for s, _ in overlay_sides(at)} == {"A: step 10", "B: step 29"}
    at.radio(key="cmp_kind").set_value("gradient").run()             # exp1's gradients after its NaN: all NaN
    assert "B: step 29: no histogram (no finite value counted)" in captions(ok(at))
    assert {s for s, _ in overlay_sides(at)} == {"A: step 10"}
    at.radio(key="cmp_mode").set_value("Same tensor in two runs").run()
    ok(at)
    assert at.selectbox(key="cmp_run_b").value.endswith("exp2")
    assert at.selectbox(key="cmp_run_tensor").value == "loss/Mean:0"
    at.selectbox(key="cmp_run_tensor").select("conv1/Relu:0").run()
    assert len(at.get("vega_lite_chart")) == 2 and len(vega_hists(at)) == 1       # series, A and B overlaid
    from viewer.charts.lines import RUNS
    series = next(s for s, _ in vega(at) if "hconcat" not in s)
    assert RUNS[0] != RUNS[1] and set(RUNS) <= set(json.dumps(series).replace('"', " ").split())   # the runs' pair
    assert {s for s, _ in overlay_sides(at)} == {"A exp1", "B exp2"}
    assert "Median non-zero |value|, B / A: positive" in captions(at)


def test_compare_b_over_a_is_per_group_and_says_when_groups_read_alike():
    """Each group's B / A is its own; a median is a bucket's stand-in, so groups whose medians
    share buckets at A and B print the same figures, and the line says why."""
    import numpy as np
    from viewer.app_pages.compare import side_ratios
    h = LogHistogram.of
    text = side_ratios({"A": {"positive": h(np.full(9, 1.0)), "negative": h(np.full(9, 1.0))},
                        "B": {"positive": h(np.full(9, 4.0)), "negative": h(np.full(9, 0.5))}}, "value")
    assert "positive 4x" in text and "negative 0.5x" in text and "same buckets" not in text
    text = side_ratios({"A": {"positive": h(np.full(9, 1.0)), "negative": h(np.full(9, 1.01))},
                        "B": {"positive": h(np.full(9, 2.0)), "negative": h(np.full(9, 2.01))}}, "value")
    assert "positive and negative have their medians in the same buckets at A and at B" in text


def test_compare_two_runs_reads_run_b_in_the_sidebar_view(tmp_path):
    """With the sidebar on eval (batch 0), run B's series is its evaluation too: read in the
    training view, B's training means sat beside A's evaluation means under one chart."""
    from test_sessions import session
    for name in ("a", "b"):   # the same run twice: A and B must draw the same line
        session(tmp_path / name, range(1, 11), 0.0)                   # train: mean = step
        session(tmp_path / name, [10, 10], 5.0, mode="eval")          # eval at step 10: mean 15, 15
    at = ok(start(tmp_path, "Compare", cmp_mode="Same tensor in two runs"))
    at.sidebar.selectbox(key="mode").set_value("eval").run()
    _, (df,) = vega(ok(at))[0]                                        # the series chart: step, run, value
    df = df.dropna()
    values = {str(c): sorted(v.iloc[:, -1]) for c, v in df.groupby(df.columns[1])}
    assert values == {"A a": [15.0], "B b": [15.0]}, values


def variable_run(path: Path, manifest: dict | None = None) -> Path:
    """A run of one variable record ``w`` with forward and update statistics (l2 2 and 0.002)
    at steps 1 and 2, and no gradient rows."""
    import numpy as np
    from inspector.writer import StatsLayout
    cat = [{"name": "w", "op": "w", "op_type": "VarHandleOp", "dtype": "float32", "shape": [3], "scope": "",
            "has_gradient": True, "batched": False, "icnn_layer": None, "icnn_role": None, "kind": "variable",
            "has_update": True}]
    w = RunWriter(path, manifest={"tensors": cat, "is_chief": True, **(manifest or {})},
                  stats_layout=StatsLayout(("w", "w"), ("forward", "update"), ("all", "all")), stats_flush_secs=1000)
    for step in (1, 2):
        vals = np.zeros((2, 9))
        vals[:, 0], vals[:, 5] = 3, [2.0, 0.002]   # count, l2
        w.add_stats(step, vals, empty_rows(2))
    w.close()
    return path


def test_training_overview_of_a_run_without_gradient_statistics(tmp_path):
    """No gradient rows (gradients=False, or no loss found): the gradient heatmap says so; the
    page failed with a KeyError (layer rows of no tensor)."""
    at = ok(start(variable_run(tmp_path / "r"), "Training overview"))
    assert any("No gradient statistics match this filter" in i.value for i in at.info)


@pytest.mark.parametrize("probe, when", [({"source": "probe", "samples": 4}, "after it"),
                                         ({"samples": 4, "training": False}, "after it"),
                                         ({"source": "train_batch", "samples": None}, "before it"),
                                         (None, "before it")])
def test_update_ratio_caption_says_which_weights_it_divides_by(tmp_path, probe, when):
    """A Keras probe run's variable records hold the weights after the step (the probe runs after
    the update): the ratio's caption says "after it" there, also for a Keras run from before
    ``source='train_batch'`` existed, which has no ``probe.source`` (FORMAT.md: absent means
    "probe")."""
    extra = {"probe": probe} if probe else {}
    at = ok(start(variable_run(tmp_path / "r", extra), "Training overview", ov_tab="Update / weight ratio"))
    assert f"L2 of the step's update over L2 of the variable {when}" in captions(at)


def test_update_ratio_draws_a_picked_variable_bold_and_the_others_faint(tmp_path):
    at = ok(start(variable_run(tmp_path / "r"), "Training overview", ov_tab="Update / weight ratio"))
    at.selectbox(key="ov_ratio_pick").select("w")
    at.session_state["ov_tab"] = "Update / weight ratio"   # AppTest sends a tab bar's default with a widget's change
    at.run()
    spec = next(s for s, _ in vega(ok(at)) if "L2 update / L2 weights" in json.dumps(s))
    drawn = [la["encoding"] for la in spec["layer"] if la["mark"]["type"] == "line"]
    assert any(e.get("opacity", {}).get("condition", {}).get("test") == 'datum.series === "w"'
               for e in drawn)


def test_every_page_of_a_single_run_path(runs):
    """The root may be one run instead of a folder of runs."""
    for page in PAGES:
        at = ok(start(runs / "exp2", page))
        assert at.header, page


def test_viewer_never_imports_tensorflow(runs):
    """In a fresh interpreter (other tests here import TensorFlow): every page, then check."""
    code = textwrap.dedent(f"""
        import os, sys
        from streamlit.testing.v1 import AppTest
        for page in {list(PAGE_FILES.values())!r}:
            os.environ["TF_INSPECTOR_RUNS"] = {str(runs)!r}
            at = AppTest.from_file({APP!r}, default_timeout=120)
            at.switch_page(page)
            at.run()
            assert not at.exception, (page, [e.value for e in at.exception])
        print("TF_IMPORTED", "tensorflow" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TF_IMPORTED False" in out.stdout


def test_the_first_page_view_imports_no_matplotlib(runs):
    """Matplotlib is over half of the viewer's imports after a server start: the Summary, the
    page a first visit opens, draws no Matplotlib figure and does not import it; a page that
    draws one imports it then (a fresh interpreter: other tests here import it)."""
    code = textwrap.dedent(f"""
        import os, sys
        from streamlit.testing.v1 import AppTest
        os.environ["TF_INSPECTOR_RUNS"] = {str(runs / "exp1")!r}
        at = AppTest.from_file({APP!r}, default_timeout=120).run()
        assert not at.exception, [e.value for e in at.exception]
        print("SUMMARY", "matplotlib.figure" in sys.modules, "inspector.analysis.plots" in sys.modules)
        at.switch_page({PAGE_FILES["Feature maps"]!r}).run()
        assert not at.exception and at.image, [e.value for e in at.exception]
        print("FEATURE_MAPS", "matplotlib.figure" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SUMMARY False False" in out.stdout and "FEATURE_MAPS True" in out.stdout, out.stdout


# ---- live runs ---------------------------------------------------------------------------

def test_refresh_shows_new_steps_of_a_running_run(tmp_path):
    b = SyntheticRun(tmp_path / "live", tensors=15, steps_hint=40, dump_every=10, stats_flush_secs=0)
    b.write_steps(0, 10)
    b.sync()
    at = ok(start(tmp_path / "live"))
    metrics = facts(at)
    assert metrics["Status"] == "running" and metrics["Last step"] == "9"
    assert any("still being written" in i.value for i in at.info)
    b.write_steps(10, 25)
    b.sync()
    at.button[0].click().run()                      # the sidebar's Refresh
    metrics = facts(ok(at))
    assert metrics["Last step"] == "24" and metrics["Dump steps"] == "3"
    b.close()
    at.run()
    assert facts(ok(at))["Status"] == "finished"


# ---- bad input ---------------------------------------------------------------------------

def test_missing_path_is_a_message(tmp_path):
    at = start(tmp_path / "nope")
    assert not at.exception
    assert any("does not exist" in e.value for e in at.error)
    assert at.text_input(key="path").value == ""                # the sidebar stays usable


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
    at = start(path, page, **({"di_tab": "Dumped samples"} if page == "Distributions" else {}))
    assert not at.exception, [e.value for e in at.exception]
    if page == "Summary":
        assert any("damaged" in w.value for w in at.warning)
    pickers = {"Distributions": "di_dump_step", "Feature maps": "fm_step", "Masks & templates": "mt_step",
               "Tensor browser": "tb_step"}
    if page in pickers:
        # the newest dump (step 10) is the truncated one: the page shows the newest readable
        # dump instead, and the picker marks the damaged one
        assert not [e.value for e in at.error if "damaged dump file" in e.value]
        box = at.selectbox(key=pickers[page])
        assert box.value == 0 and box.format_func(10) == "10 (damaged: unreadable)"
        assert box.format_func(0) == "0 (schedule)"
        # the dump's figure is drawn (Distributions: its histograms, a Vega-Lite chart)
        assert (len(vega_hists(at)) == 1) if page == "Distributions" else images(at), page


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
    assert facts(at)["Status"] == "crashed"
    assert any("gone without closing it" in w.value for w in at.warning)


def test_mode_and_worker_pickers_show_one_view(tmp_path):
    """A run with eval sessions and two workers: the sidebar offers mode, worker and batch, and
    the pages show the chosen view (an eval batch's steps; another worker's)."""
    from test_sessions import session
    session(tmp_path / "r", range(1, 11), 0.0, dumps=(5,))
    session(tmp_path / "r", [10, 10], 5.0, dumps=(10,), mode="eval")
    session(tmp_path / "r", range(1, 4), 1.0, worker="worker-1")
    at = ok(start(tmp_path / "r"))
    assert [s.label for s in at.sidebar.selectbox] == ["Run", "Mode", "Worker"]
    assert at.sidebar.selectbox(key="worker").options == ["chief", "worker-1"]
    metrics = facts(at)
    assert metrics["Statistics steps"] == "10" and metrics["Dump steps"] == "1"
    at.sidebar.selectbox(key="mode").set_value("eval").run()
    metrics = facts(at)
    assert not at.exception and metrics["Statistics steps"] == "1" and metrics["Last step"] == "10"
    assert metrics["Dump steps"] == "1"
    at.sidebar.selectbox(key="mode").set_value("train").run()
    at.sidebar.selectbox(key="worker").set_value("worker-1").run()
    metrics = facts(at)
    assert not at.exception and metrics["Statistics steps"] == "3"


# ---- hostile input: the viewer never reads outside its runs folder ---------------------

def outside_message(at: AppTest) -> str:
    """The path box's refusal with the echoed input removed (to compare two refusals)."""
    (msg,) = [unescape(e.value) for e in at.error if "outside the runs folder" in unescape(e.value)]
    return msg.split(" is outside", 1)[1]


@pytest.fixture
def jail(runs, tmp_path) -> Path:
    """A runs folder holding a run, a link to a run outside it, and a run beside it outside."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(runs / "exp2", root / "inside")
    shutil.copytree(runs / "exp2", tmp_path / "outside_run")
    (root / "evil").symlink_to(tmp_path / "outside_run")
    return root


@pytest.mark.parametrize("text", ["/etc/passwd", "/etc", "../outside_run", "evil", "inside/../../outside_run",
                                  "/nonexistent/x", "../nonexistent"])
def test_path_box_refuses_outside_paths_alike(jail, text):
    at = start(jail, path=text)
    assert not at.exception, [e.value for e in at.exception]
    assert outside_message(at) == outside_message(start(jail, path="/no/such/place"))
    assert not at.header                                            # no page drawn
    assert not [m for m in at.markdown if "outside_run" in unescape(m.value) and "outside the" not in m.value]


def test_path_box_accepts_a_run_inside(jail):
    at = ok(start(jail, path="inside"))
    assert at.header[0].value == "Run inside"
    at = ok(start(jail, path=str(jail / "inside")))                # absolute, inside
    assert at.header[0].value == "Run inside"


def test_listing_skips_links_leading_outside(jail):
    at = ok(start(jail))
    assert at.selectbox(key="run").options == ["inside"]
    assert "1 entry leading outside the runs folder: skipped" in captions(at)


def test_run_holding_a_link_out_is_refused(jail, tmp_path):
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"\0" * 64)
    (jail / "inside" / "dumps" / "chief.step-0000000099.safetensors").symlink_to(secret)
    at = start(jail)
    assert not at.exception
    assert any("leads outside" in unescape(e.value) for e in at.error)
    assert not at.header


def test_fifo_named_like_a_run_file_is_never_opened(jail):
    os.mkfifo(jail / "inside" / "dumps" / "chief.step-0000000099.safetensors")
    os.mkdir(jail / "fifo_only")
    os.mkfifo(jail / "fifo_only" / "manifest.chief.json")
    at = start(jail)                                                # would block if either were opened
    assert not at.exception
    assert at.selectbox(key="run").options == ["inside"]            # a FIFO manifest makes no run
    assert any("is not a regular file" in unescape(e.value) for e in at.error)


def test_unknown_run_in_the_url_is_a_message(runs):
    at = start(runs, query={"run": "nope"})
    assert not at.exception
    assert any("No run named 'nope'" in unescape(e.value) for e in at.error)
    assert not at.header                                            # not silently another run
    assert at.selectbox(key="run").value is None
    at.selectbox(key="run").select("exp2").run()
    assert ok(at).header[0].value == "Run exp2"


@pytest.mark.parametrize("page", list(PAGE_FILES))
def test_unknown_run_in_the_url_is_a_message_on_every_page(runs, page):
    at = start(runs, page, query={"run": "nope"})
    assert not at.exception
    assert any("No run named 'nope'" in unescape(e.value) for e in at.error), page
    assert not [h.value for h in at.header if "exp" in h.value]    # no other run's view


def test_the_url_keeps_the_folder_inside_the_runs_folder(tmp_path):
    """?path= names the sub-folder (a copied link, or the fresh load of Back/Forward, opens the
    same run of the same folder), and the page carries the Back/Forward script."""
    make_synthetic_run(tmp_path / "group" / "deep", steps=10, tensors=8, dump_every=5)
    make_synthetic_run(tmp_path / "top", steps=10, tensors=8, dump_every=5, seed=1)
    at = ok(start(tmp_path, query={"path": "group", "run": "deep"}))
    assert at.text_input(key="path").value == "group"
    assert at.header[0].value == "Run deep"
    scripts = [e.proto.body for e in at.get("html") if "__tfInspectorHistory" in e.proto.body]
    assert scripts and all(e.proto.unsafe_allow_javascript for e in at.get("html") if e.proto.body in scripts)


def test_known_run_in_the_url_is_shown(runs):
    assert ok(start(runs, query={"run": "exp2"})).header[0].value == "Run exp2"


def test_unexpected_error_is_a_short_message(runs, monkeypatch):
    import viewer.app_pages.summary
    import viewer.data

    def boom(*a, **k):
        raise RuntimeError("/very/secret/path exists")
    monkeypatch.setattr(viewer.app_pages.summary, "render", boom)
    at = start(runs / "exp1")
    assert not at.exception
    (msg,) = [e.value for e in at.error]
    assert "could not be drawn (RuntimeError)" in msg and "secret" not in msg
    monkeypatch.setattr(viewer.data, "list_runs", boom)             # outside any page's guard
    at = start(runs)
    assert not at.exception
    assert [e.value for e in at.error] == ["The viewer could not draw this page (RuntimeError); "
                                           "the details are in the server log."]


EVIL = "![x](http://127.0.0.1:9/leak.png)"
#: a bare URL in a run file: shown as text, never as a link (viewer.ui.plain)
URL = "http://example.invalid/x"


def markdown_bodies(at: AppTest) -> list[str]:
    """The Markdown source of every element that renders Markdown."""
    kinds = ("markdown", "caption", "error", "warning", "info", "success", "title", "header", "subheader")
    out = [el.value for k in kinds for el in at.get(k)]
    return out


def test_run_strings_are_rendered_as_text(runs, tmp_path):
    root = tmp_path / "md"
    path = root / "exp"
    shutil.copytree(runs / "exp1", path)
    m = path / manifest_name("chief", 1)
    man = json.loads(m.read_text())
    man["tensorflow_version"] = man["created"] = EVIL
    man["loss"] = URL
    man["dropped"] = [{"what": "dump", "reason": EVIL, "count": 1, "bytes": 1, "first_step": 20, "last_step": 20}]
    entry = dict(man["tensors"][0], name=f"a{EVIL}:0", op=EVIL, op_type=EVIL, scope=EVIL, icnn_role=None)
    man["tensors"].append(entry)
    m.write_text(json.dumps(man))
    bodies = []
    for page, state in (("Summary", {}), ("Tensor browser", {"tb_search": "leak", "tb_tensor": entry["name"]})):
        at = ok(start(root, page, **state))
        bodies += markdown_bodies(at)
    shown = "\n".join(unescape(b) for b in bodies)
    assert shown.replace(WORD_JOINER, "").count(EVIL) >= 5          # the strings are there, as text
    assert not [b for b in bodies if "](" in b or "![" in b]        # and never as Markdown
    assert URL in shown.replace(WORD_JOINER, "") and "http:" not in shown   # nor a bare URL Markdown would link


def test_write_errors_and_failed_sessions_are_errors_on_the_summary(tmp_path):
    from test_sessions import session
    w = session(tmp_path / "r", range(1, 4), 0.0, close=None)
    w._failed("dump", OSError(28, "No space left on device"), step=2, nbytes=10)
    w.close("failed", error="the session ended with an error before DumpHook.end() (training raised)")
    at = ok(start(tmp_path / "r"))
    errors = [unescape(e.value) for e in at.error]
    assert any("writer error" in e and "Errno 28" in e for e in errors), errors
    assert any("session failed" in e and "training raised" in e for e in errors), errors


# ---- issue 14: first NaN, loss, dump reasons, log axes, dead filters, damaged dumps -----

@pytest.fixture(scope="module")
def reasons_run(tmp_path_factory) -> Path:
    """Dumps at 0, 10, 20 (schedule, no reason key: an older run), 7 (listed in dump_steps),
    25 (NaN/Inf in the loss) and 26 (the step after)."""
    path = tmp_path_factory.mktemp("reasons") / "r"
    b = SyntheticRun(path, tensors=20, steps_hint=30, dump_every=10)
    b.write_steps(0, 30)
    for step, why in ((7, "schedule"), (25, "NaN/Inf in the loss"), (26, "after NaN/Inf")):
        b.writer.add_dump(step, b.dump_arrays(step), {"reason": why})
    b.writer.update_manifest(config={"stats_every_n_steps": 1, "dump_every_n_steps": 10, "dump_steps": [[7, 7]]})
    b.close()
    return path


@pytest.mark.parametrize("page,key", [("Distributions", "di_dump_step"), ("Feature maps", "fm_step"),
                                      ("Masks & templates", "mt_step"), ("Tensor browser", "tb_step")])
def test_dump_pickers_say_why_a_step_was_dumped(reasons_run, page, key):
    at = ok(start(reasons_run, page, **({"di_tab": "Dumped samples"} if page == "Distributions" else {})))
    box = at.selectbox(key=key)
    assert box.options == ["0 (schedule)", "7 (explicit step)", "10 (schedule)", "20 (schedule)",
                           "25 (NaN/Inf in the loss)", "26 (after NaN/Inf)"]
    assert box.value == 26                                      # the newest (distributions: nearest step 29)


def panel_axes(spec: dict) -> list[str]:
    """Each panel's x axis: "log" where it has the signed log axis's tick labels, else "linear"."""
    return ["log" if "labelExpr" in p["layer"][0]["encoding"]["x"].get("axis", {}) else "linear"
            for p in spec["hconcat"]]


def test_distributions_axis_choice_and_log_y_change_the_figures(runs):
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_step=24))

    def both() -> tuple[dict, dict, str]:
        """The in-graph panels' spec, then the dumped samples' (their tab opened), and both tabs' captions."""
        ((spec, _),), text = vega_hists(ok(at)), captions(at)
        at.session_state["di_tab"] = "Dumped samples"
        ((samples, _),) = vega_hists(ok(at.run()))
        text += captions(at)
        at.session_state["di_tab"] = "At the step"
        ok(at.run())
        return spec, samples, text
    spec, samples, _ = both()
    assert panel_axes(spec)[1] == "log"                         # auto: gradients on the signed log axis
    assert spec["hconcat"][1]["layer"][0]["encoding"]["y"]["title"] == "fraction of values per bucket"
    assert panel_axes(samples) == panel_axes(spec)              # dumped samples on the same kind of axis
    at.radio(key="di_xaxis").set_value("linear")
    at.session_state["di_tab"] = "At the step"      # AppTest sends a tab bar's default with a widget's change
    at.run()
    spec, samples, text = both()
    assert panel_axes(spec) == panel_axes(samples) == ["linear", "linear"]
    assert text.count("40 equal bins over the exact min..max") >= 4     # in-graph and dumped, both kinds
    assert spec["hconcat"][0]["layer"][0]["encoding"]["y"]["title"] == "fraction of values per bin"
    at.radio(key="di_xaxis").set_value("log").run()
    assert panel_axes(vega_hists(ok(at))[0][0]) == ["log", "log"]
    at.session_state["di_tab"] = "Across steps"
    ridge = vega_ridge(ok(at.run()))
    at.toggle(key="di_log").set_value(True)
    at.session_state["di_tab"] = "Across steps"     # AppTest sends a tab bar's default with a widget's change
    log_ridge = vega_ridge(ok(at.run()))
    at.session_state["di_tab"] = "At the step"
    log_spec, log_data = vega_hists(ok(at.run()))[0]
    # a real log y axis on every panel, starting at the floor the empty bins are drawn at
    for panel in log_spec["hconcat"]:
        scale = panel["layer"][0]["encoding"]["y"]["scale"]
        assert scale["type"] == "log" and 0 < scale["domainMin"]
    bars = [d for d in log_data if "fraction" in d.columns]
    assert all(d["fraction"][d["fraction"] > 0].min() / 2 in [p["layer"][0]["encoding"]["y"]["scale"]["domainMin"]
                                                            for p in log_spec["hconcat"]] for d in bars)
    assert "log10 fraction" in json.dumps(log_ridge[0]["title"])
    assert not log_ridge[1][0]["top"].equals(ridge[1][0]["top"])  # the ridge follows the toggle


def test_distributions_read_off_the_groups_median_magnitudes(runs):
    """'negative / positive: 0.5x' from the stored buckets: the median of the non-zero |x|, here
    recomputed from the buckets' stand-in values with numpy."""
    import re
    import numpy as np
    import inspector
    from inspector.format.loghist import bucket_value
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_step=24))
    run = inspector.open_run(runs / "exp1")
    medians = {}
    for g in ("positive", "negative"):
        h = run.log_histogram("conv3/Relu:0", 24, "gradient", g)
        v = np.abs(np.repeat(bucket_value(h.index), h.count))
        medians[g] = np.quantile(v[v > 0], 0.5, method="lower")
    text = unescape(next(m.value for m in at.markdown if "gradient**" in m.value))   # the in-graph panels'
    got = float(re.search(r"\|gradient\|: [^\n]*?negative / positive: ([\d.]+)x", text).group(1))
    assert np.isclose(got, medians["negative"] / medians["positive"], rtol=5e-3), text


def test_distributions_caption_gives_real_counts(runs, monkeypatch):
    """n is the statistics row's count; where the histogram counts a subsample, the caption says so."""
    import numpy as np
    import inspector
    import viewer.app_pages.distributions
    df = inspector.open_run(runs / "exp1").query_stats(["conv3/Relu:0"], steps=(29, 29), kinds=["forward"])
    n = dict(zip(df["group"].astype(str), df["count"]))
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0"))
    assert f"forward positive: n={n['positive']:,}," in captions(at) and "subsample" not in captions(at)
    early = inspector.open_run(runs / "exp1").query_stats(["conv3/Relu:0"], steps=(20, 20), kinds=["forward"])
    at20 = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_step=20))
    for g, count, mean in zip(early["group"].astype(str), early["count"], early["mean"]):
        if g != "all":  # the exact means (the groups drawn), not a histogram's bin centres
            assert np.isfinite(mean) and f"forward {g}: n={count:,}, mean={mean:.4g}" in captions(at20)
    # the chart's legend states the same count, and the histogram's own where it differs (at a
    # step before the run's NaN: at step 29 no value is finite, and no histogram is drawn)
    df = inspector.open_run(runs / "exp1").query_stats(["conv3/Relu:0"], steps=(24, 24), kinds=["forward"])
    n = dict(zip(df["group"].astype(str), df["count"]))
    counted = {g: int(np.sum(h)) for g, h in zip(df["group"].astype(str), df["hist_count"])}
    assert counted["positive"] > 0
    labels = set(vega_hists(ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_step=24)))[0][1][0]["label"])
    want = (f"positive (n={n['positive']:,})" if counted["positive"] == n["positive"]
            else f"positive (n={n['positive']:,}; histogram of {counted['positive']:,})")
    assert want in labels
    # the note's size is the run's (its config's histogram_sample; 65,536 for older runs)
    seen = []
    monkeypatch.setattr(viewer.app_pages.distributions, "histogram_sample", lambda cfg: seen.append(cfg) or 1000)
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0"))
    assert "the histogram counts a subsample of about 1,000 values; n is every element" in captions(at)
    assert seen and seen[-1] == inspector.open_run(runs / "exp1").config


@pytest.fixture(scope="module")
def dead_run(tmp_path_factory) -> Path:
    return make_synthetic_run(tmp_path_factory.mktemp("dead") / "d", steps=20, tensors=20, dump_every=10,
                              dead_filter=3)


def test_dead_icnn_filter_is_flagged_and_not_judged(dead_run):
    at = ok(start(dead_run, "Masks & templates", mt_table=True))
    table = next(df.value for df in at.dataframe if "dead" in df.value.columns)
    assert table["dead"].tolist() == [c == 3 for c in range(8)]
    assert table.loc[3, ["positive mu spread", "negative mu spread"]].isna().all()   # no tightness for it
    cap = captions(at)
    assert "1 dead filter(s) at step 10: 3 (zero in every dumped sample; left out of the judgement)" in cap
    assert "Tightest live filters" in cap and "3: positives" not in cap and "of 7 live filters localized" in cap
    assert at.selectbox(key="mt_filter").options[2:5] == ["2", "3 (dead)", "4"]
    at.selectbox(key="mt_filter").set_value(3).run()
    assert any("Filter 3 is dead at step 10" in w.value for w in ok(at).warning)
    assert "Filter 3 (" not in captions(at)              # no spread for a dead filter


def test_overview_rows_of_a_run_without_its_graph_keep_the_catalogs_order(runs, tmp_path):
    path = shutil.copytree(runs / "exp2", tmp_path / "nograph")
    for g in path.glob("graph.*"):
        g.unlink()
    at = ok(start(path, "Training overview"))
    assert "rows in the catalog's order (the run has no readable graph)" in captions(at)
    assert heatmaps(at)[0]["labels"][0].startswith("conv1/Relu:0")


def line_layers(at: AppTest, i: int) -> list[dict]:
    """The layers of the page's i-th Vega-Lite chart (viewer.charts.lines: a layered chart)."""
    return json.loads(at.get("vega_lite_chart")[i].proto.spec)["layer"]


def test_overview_log_y_is_a_log_axis(runs):
    at = ok(start(runs / "exp1", "Training overview", ov_tensor="conv1/Relu:0", ov_series_stat="max",
                  ov_tab="One tensor over steps"))
    assert '"log"' not in at.get("vega_lite_chart")[0].proto.spec           # the series (the heatmap is no Vega chart)
    at.toggle(key="ov_logy").set_value(True)
    at.session_state["ov_tab"] = "One tensor over steps"   # AppTest sends a tab bar's default with a widget's change
    at.run()
    line = line_layers(ok(at), 0)[0]
    assert line["encoding"]["y"]["scale"]["type"] == "log"
    assert line["encoding"]["y"]["title"] == "max (log scale)"  # the values, not log10 of them


def test_line_chart_data_reaches_the_browser_as_plain_strings(runs):
    """pandas 3 strings become Arrow large_string, which Streamlit's Vega-Lite frontend cannot
    read (a chart came out empty in Chromium): the line chart's datasets hold plain strings."""
    import pyarrow as pa
    at = ok(start(runs / "exp1", "Training overview", ov_tab="One tensor over steps"))
    chart = at.get("vega_lite_chart")[0]
    tables = [pa.ipc.open_stream(d.data.data).read_all() for d in chart.proto.datasets]
    series = next(t for t in tables if "series" in t.column_names)
    assert series.num_rows == 3 * 30 and pa.types.is_string(series.schema.field("series").type)


def test_overview_series_smoothing_is_tensorboards(runs):
    """Smoothing draws the debiased moving average over the raw line (kept faint behind it)."""
    at = ok(start(runs / "exp1", "Training overview", ov_tensor="conv1/Relu:0", ov_tab="One tensor over steps"))
    assert len(line_layers(at, 0)) == 3                          # line, hover points, hover rules
    at.slider(key="ov_smooth").set_value(0.6)
    at.session_state["ov_tab"] = "One tensor over steps"   # AppTest sends a tab bar's default with a widget's change
    at.run()
    (spec, data) = vega(ok(at))[0]
    raw, smoothed = spec["layer"][0], spec["layer"][1]
    assert raw["mark"]["opacity"] < 1 and raw["encoding"]["y"]["field"] == "value"
    assert smoothed["encoding"]["y"]["field"] == "smoothed"
    frame = next(d for d in data if "smoothed" in d)
    one = frame[frame["series"] == "all"]
    from viewer.charts.lines import smooth
    np.testing.assert_allclose(one["smoothed"], smooth(one["value"].to_numpy(), 0.6))


def edit_manifest(path: Path, **fields) -> Path:
    m = path / manifest_name("chief", 1)
    m.write_text(json.dumps({**json.loads(m.read_text()), **fields}))
    return path


def test_summary_first_nonfinite_with_its_source_and_the_loss_curve(runs, tmp_path):
    at = ok(start(runs / "exp1"))
    assert "First NaN/Inf: conv2/Relu (Relu, layer conv2) made the first non-finite values: conv2/Relu:0 " \
        "(163 Inf of 16384 values) from finite conv2/BiasAdd:0 at step 25" in captions(at)
    errors = unescape(" ".join(e.value for e in at.error))
    assert "Most likely culprit: nonfinite** (layer **conv2**, op **conv2/Relu**, step **25**)" in errors
    assert "loss/Mean:0, forward mean (group all)" in captions(at)
    # the diagnosis' evidence (NaN/Inf counts), the loss curve, gradient sizes (the open tab's)
    assert len(at.get("vega_lite_chart")) == 3
    # the hook's every-step loss check saw it a step earlier: that is the earliest evidence
    path = edit_manifest(shutil.copytree(runs / "exp1", tmp_path / "losscheck"),
                         first_nonfinite={"step": 24, "tensor": "loss/Mean:0", "kind": "forward"})
    at = ok(start(path))
    assert "at step 25; the loss was already non-finite at step 24 (the hook's every-step check)" in captions(at)
    assert "the loss was already non-finite at step 24" in unescape(" ".join(e.value for e in at.error))


def test_summary_gradient_size_per_layer(runs):
    """Each layer's gradient L2 at its last statistics step and its first, in network order; a
    layer that ends NaN/Inf or zero (the dead ReLU) is named, its dot the last value before."""
    import inspector
    at = ok(start(runs / "exp1"))
    spec, data = next((s, d) for s, d in vega(at) if "gradient L2" in json.dumps(s))
    (sizes,) = data                                   # the 5 model layers of the Training overview (no loss op)
    assert sizes["label"].str.split(" ").str[0].tolist() == ["conv1/Relu:0", "conv2/Relu:0", "conv3/Relu:0",
                                                          "icnn/post_mask:0", "dense/BiasAdd:0"]
    run = inspector.open_run(runs / "exp1")
    l2 = run.query_stats(kinds=["gradient"], groups=["all"], columns=["l2"]).pivot_table(
        index="step", columns="tensor", values="l2", observed=True, dropna=False)
    for r in sizes.itertuples():
        col = l2[r.tensor]
        good = col[np.isfinite(col) & (col > 0)]
        if len(good):
            assert (r.first, r.first_step, r.last, r.last_step) == (good.iloc[0], good.index[0], good.iloc[-1],
                                                                    good.index[-1])
        end = col.iloc[-1]
        assert r.state == ("NaN/Inf" if not np.isfinite(end) else "zero" if end <= 0 else "finite")
    assert "end zero or NaN/Inf" in captions(at)
    (healthy,) = next(d for s, d in vega(ok(start(runs / "exp2"))) if "gradient L2" in json.dumps(s))
    assert healthy.set_index("tensor")["state"].to_dict() == {**{t: "finite" for t in healthy["tensor"]},
                                                              "conv2/Relu:0": "zero"}     # the dead ReLU


def test_summary_without_loss_statistics_says_so(runs, tmp_path):
    at = ok(start(edit_manifest(shutil.copytree(runs / "exp2", tmp_path / "noloss"), loss=None)))
    assert "No loss statistics: the manifest names no loss tensor." in captions(at)
    assert "First NaN/Inf: none seen" in captions(at)
    at = ok(start(edit_manifest(shutil.copytree(runs / "exp2", tmp_path / "other"), loss="gone:0")))
    assert "the loss tensor gone:0 has no forward statistics" in captions(at)


def test_summary_warns_of_dead_filters(dead_run):
    at = ok(start(dead_run))
    warnings = unescape(" ".join(w.value for w in at.warning))
    n = len(inspector.open_run(dead_run).samples(10))
    assert "dead filter" in warnings and f"icnn: filter(s) 3 zero in all {n} dumped samples at step 10" in warnings


def test_no_dead_filter_alert_on_a_healthy_run(runs):
    at = ok(start(runs / "exp2"))
    assert "dead filter" not in " ".join(w.value for w in at.warning)


def test_dump_headers_are_not_reread_for_new_statistics(tmp_path):
    """A live run's new statistics parts and manifest heartbeats change the signature but not
    what the dump pickers read (their cache key); a new dump does."""
    from viewer.data import dumps_key, signature, with_view
    b = SyntheticRun(tmp_path / "live", tensors=15, steps_hint=40, dump_every=10, stats_flush_secs=0)
    b.write_steps(0, 11)
    b.sync()
    s1 = with_view(signature(tmp_path / "live"))
    b.write_steps(11, 15)
    b.sync()
    s2 = with_view(signature(tmp_path / "live"))
    assert s1 != s2 and dumps_key(s1) == dumps_key(s2)
    assert dumps_key(with_view(s2, "eval")) != dumps_key(s2)
    b.write_steps(15, 21)
    b.sync()
    assert dumps_key(with_view(signature(tmp_path / "live"))) != dumps_key(s2)
    b.close()


def named_groups_copy(src: Path, dst: Path, names: dict[str, str]) -> Path:
    """A copy of run ``src`` whose positive/negative groups are renamed by ``names`` (a format 3
    run with named groups, as DumpHook(groups=fn) writes), without TensorFlow."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    shutil.copytree(src, dst)
    for part in (dst / "stats").glob("*.parquet"):
        table = pq.read_table(part)
        i = table.schema.get_field_index("group")
        groups = [names.get(g, g) for g in table.column("group").to_pylist()]
        table = table.set_column(i, "group", pa.array(groups).dictionary_encode())
        pq.write_table(table, part)
    for m in dst.glob("manifest.*.json"):
        data = json.loads(m.read_text())
        data.update(format_version=3, groups={"rule": "test", "names": [names["positive"], names["negative"]],
                                              "codes": [1, 0]})
        m.write_text(json.dumps(data))
    return dst


def test_named_groups_on_every_group_page(runs, tmp_path):
    root = tmp_path / "named"
    root.mkdir()
    named_groups_copy(runs / "exp1", root / "exp1", {"positive": "correct", "negative": "misclassified"})
    shutil.copytree(runs / "exp2", root / "exp2")
    at = ok(start(root / "exp1", "Distributions"))
    assert "forward correct" in captions(at) and "gradient misclassified" in captions(at)
    at = ok(start(root / "exp1", "Training overview"))
    assert at.selectbox(key="ov_group").options == ["all", "correct", "misclassified"]
    before = heatmap_data(at)
    at.selectbox(key="ov_group").select("misclassified").run()
    assert heatmap_data(ok(at))[0] != before[0]      # the heatmap of that group's rows
    at = ok(start(root, "Compare"))
    at.radio(key="cmp_mode").set_value("Same tensor in two runs").run()
    assert {"correct", "positive"} <= set(ok(at).selectbox(key="cmp_run_group").options)


# ---- issue 14: navigation, URL state, live folders ------------------------------------------

def test_each_page_has_its_own_url_path():
    """st.navigation's pages: one URL path per page, the page module's name (the browser's
    history then holds one entry per page; tests/test_browser.py drives Back and Forward)."""
    from viewer import app_main
    assert [app_main.url_path(m) for m in app_main.PAGES.values()] == [
        Path(f).stem for f in PAGE_FILES.values()]
    assert len(set(app_main.url_path(m) for m in app_main.PAGES.values())) == len(app_main.PAGES)


def test_old_page_links_open_their_page(runs):
    at = ok(start(runs, "Summary", query={"page": "Distributions", "run": "exp2"}))
    assert at.header[0].value == "Distributions"
    assert at.selectbox(key="run").value.endswith("exp2")              # the other parameters kept


def test_url_query_reproduces_the_view(runs):
    """A link's query chooses run, tensor, kind, statistic, group and filter, as the widgets would."""
    query = {"run": "exp2", "ov_filter": "conv", "ov_group": "positive", "ov_tensor": "conv3/Relu:0",
             "ov_series_stat": "max"}
    at = ok(start(runs, "Training overview", query=query))
    assert at.selectbox(key="run").value.endswith("exp2")
    assert at.text_input(key="ov_filter").value == "conv"
    assert at.selectbox(key="ov_group").value == "positive" and at.selectbox(key="ov_tensor").value == "conv3/Relu:0"
    assert "conv3/Relu:0 forward max" in captions(at)
    at2 = ok(start(runs / "exp1", "Tensor browser", query={"tb_tensor": "icnn/mu:0", "tb_step": "0 (schedule)"}))
    assert at2.selectbox(key="tb_tensor").value == "icnn/mu:0" and at2.selectbox(key="tb_step").value == 0


def test_page_choices_are_bound_to_the_url(runs):
    """The browser writes a bound widget's value into the URL (tests/test_browser.py sees it);
    here: every page's main choices are bound, under their key."""
    bound = {"Training overview": ["ov_filter", "ov_group", "ov_tensor"], "Distributions": ["di_tensor", "di_step",
             "di_dump_step"], "Feature maps": ["fm_step", "fm_sample", "fm_tensor", "fm_page"],
             "Masks & templates": ["mt_layer", "mt_step", "mt_filter"],
             "Tensor browser": ["tb_search", "tb_tensor", "tb_step", "tb_sample"], "Compare": ["cmp_tensor", "cmp_step_A"]}
    for page, keys in bound.items():
        at = ok(start(runs / "exp1", page, **({"ov_tab": "One tensor over steps"} if page == "Training overview" else
                                              {"tb_values": "table"} if page == "Tensor browser" else
                                              {"di_tab": "Dumped samples"} if page == "Distributions" else {})))
        widgets = {w.key: w for k in ("selectbox", "select_slider", "text_input", "number_input") for w in at.get(k)}
        for key in keys:
            assert widgets[key].proto.query_param_key == key, (page, key)
    assert ok(start(runs)).selectbox(key="run").proto.query_param_key == "run"
    one = ok(start(runs / "exp1", "Feature maps", query={"fm_section": "One channel"}))   # a section of its own
    assert one.selectbox(key="fm_channel").proto.query_param_key == "fm_channel"
    assert one.radio(key="fm_section").proto.query_param_key == "fm_section"


def test_compare_two_runs_needs_two_runs(runs):
    at = ok(start(runs / "exp1", "Compare", cmp_mode="Same tensor in two runs"))
    assert any("Comparing runs needs two runs" in i.value and "holds 1" in unescape(i.value) for i in at.info)
    assert not at.get("vega_lite_chart") and not images(at)
    at = ok(start(runs, "Compare", cmp_mode="Same tensor in two runs", query={"run": "exp2"}))
    assert at.selectbox(key="cmp_run_b").options == ["exp1"]             # B is never A itself


def test_auto_refresh_shows_new_runs_in_the_folder(runs, tmp_path):
    shutil.copytree(runs / "exp2", tmp_path / "a")
    at = ok(start(tmp_path, auto=True))
    still = ok(start(tmp_path))                                         # auto-refresh off
    assert at.selectbox(key="run").options == ["a"] == still.selectbox(key="run").options
    shutil.copytree(runs / "exp2", tmp_path / "b")
    assert ok(at.run()).selectbox(key="run").options == ["a", "b"]       # seen without Refresh
    at.toggle(key="auto").set_value(False).run()
    shutil.copytree(runs / "exp2", tmp_path / "c")
    assert ok(at.run()).selectbox(key="run").options == ["a", "b"]       # off: until Refresh
    next(b for b in at.button if b.label == "Refresh").click().run()
    assert ok(at).selectbox(key="run").options == ["a", "b", "c"]


def test_figures_follow_the_theme(runs):
    """Matplotlib figures made under the dark theme get a dark background (and the cached
    heatmap is drawn per theme, not served from the other theme's cache)."""
    import numpy as np
    import pandas as pd
    from matplotlib.colors import to_rgb
    from viewer import ui
    from inspector.analysis import plots
    with ui.figure_theme("dark"):
        dark = plots.time_series(pd.DataFrame({"all": [1.0, 2.0]}), "t", "v")
    with ui.figure_theme("light"):
        light = plots.time_series(pd.DataFrame({"all": [1.0, 2.0]}), "t", "v")
    assert np.mean(to_rgb(dark.get_facecolor())) < 0.2 < 0.8 < np.mean(to_rgb(light.get_facecolor()))


def test_png_download_drawn_on_click_follows_the_theme(monkeypatch):
    """download_figure (charts shown by Vega, PNG drawn on click) draws in the page's theme,
    read when the page ran: the click's callable runs outside the script."""
    import io
    import numpy as np
    import pandas as pd
    from PIL import Image
    from viewer import ui
    from inspector.analysis import plots
    clicked = {}
    monkeypatch.setattr(ui.st, "download_button", lambda label, data, **kw: clicked.setdefault(kw["key"], data))
    for kind in ("dark", "light"):
        monkeypatch.setattr(ui, "theme", lambda kind=kind: kind)
        ui.download_figure(lambda: plots.time_series(pd.DataFrame({"all": [1.0, 2.0]}), "t", "v"), "x", key=kind)
    monkeypatch.setattr(ui, "theme", lambda: "light")             # the click comes later, in no theme
    mean = {k: np.asarray(Image.open(io.BytesIO(f())).convert("L")).mean() for k, f in clicked.items()}
    assert mean["png_dark"] < 80 < 170 < mean["png_light"]

def test_layer_rows_fold_an_icnn_layers_helper_ops():
    import pandas as pd
    from viewer import layers
    names = ["c/Conv2D:0", "c/Relu:0", "ic/pre_mask:0", "ic/helper/sub:0", "ic/helper/mul:0", "ic/post_mask:0",
             "ic/filter_loss:0"]
    cat = pd.DataFrame({"name": names, "scope": ["c", "c", "ic", "ic/helper", "ic/helper", "ic", "ic"],
                        "icnn_layer": [None, None, "ic", None, None, "ic", "ic"],
                        "icnn_role": [None, None, "pre_mask", None, None, "post_mask", "filter_loss"]}).set_index(
        "name", drop=False)
    rows = layers.layer_rows(cat, names)
    assert rows["layer"].tolist() == ["c", "c", "ic", "ic", "ic", "ic", "ic"]     # helpers under the ICNN scope
    folded = layers.shown_rows(rows)
    assert folded["tensor"].tolist() == ["c/Relu:0", "ic/post_mask:0"]           # the ICNN output, not the last op
    assert folded["label"].tolist() == ["c/Relu:0 (+1 ops of c)", "ic/post_mask:0 (+4 ops of ic)"]
    assert layers.shown_rows(rows, unfold=["ic"])["tensor"].tolist() == ["c/Relu:0"] + names[2:]
    assert len(layers.shown_rows(rows, all_ops=True)) == 7


def test_layer_rows_fold_a_conv_layer_into_its_activation_not_a_variable():
    """As a TF graph lists them: the kernel read opens a scope under the conv op's name, and the
    catalog lists variables after the ops. The folded row is the layer's last op output."""
    import pandas as pd
    from viewer import layers
    rows = [("conv1/Conv2D/ReadVariableOp:0", "conv1/Conv2D/ReadVariableOp", "conv1/Conv2D", "tensor"),
            ("conv1/Conv2D:0", "conv1/Conv2D", "conv1", "tensor"), ("conv1/Relu:0", "conv1/Relu", "conv1", "tensor"),
            ("dense/MatMul:0", "dense/MatMul", "dense", "tensor"),
            ("conv1/biases", "conv1/biases", "conv1", "variable"), ("dense/w", "dense/w", "dense", "variable")]
    cat = pd.DataFrame(rows, columns=["name", "op", "scope", "kind"]).assign(icnn_layer=None, icnn_role=None)
    cat = cat.set_index("name", drop=False)
    got = layers.layer_rows(cat, list(cat.index))
    assert got["layer"].tolist() == ["conv1", "conv1", "conv1", "dense", "conv1", "dense"]
    assert layers.shown_rows(got)["label"].tolist() == ["conv1/Relu:0 (+3 ops of conv1)", "dense/MatMul:0 (+1 ops of dense)"]


def test_overview_says_columns_aggregate_steps_only_where_one_does():
    """Columns of one statistics step each are not called an aggregate; binned columns name
    their bin's width and what a cell shows of it (the mean, or the extreme picked)."""
    from viewer.app_pages.overview import binned_note
    assert binned_note(False, 2, "mean") == ""
    assert "a bin of 2 steps" in binned_note(True, 2, "mean") and "the mean" in binned_note(True, 2, "mean")
    assert binned_note(True, 16, "max").endswith("its max")


def test_heatmap_cells_hold_the_statistics_at_their_steps(runs):
    """Every drawn cell's value is the statistics row of (tensor, step), sent beside the image for
    hover; NaN/Inf cells are drawn red and named, the dead ReLU's zero gradient grey, not blank."""
    import base64
    import inspector
    from viewer.charts import raster
    at = ok(start(runs / "exp1", "Training overview", ov_all_ops=True))
    (h,) = heatmaps(at)
    run = inspector.open_run(runs / "exp1")
    df = run.query_stats(kinds=["gradient"], groups=["all"], columns=["l2"])
    values = np.frombuffer(base64.b64decode(h["values"]), np.float32).reshape(len(h["labels"]), -1)
    state = np.frombuffer(base64.b64decode(h["state"]), np.uint8).reshape(values.shape)
    assert h["first"] == list(range(30)) == h["last"]             # one column per statistics step
    for i, tensor in enumerate(h["labels"]):
        rows = df[df["tensor"] == tensor].set_index("step")["l2"]
        fin = state[i] == raster.FINITE
        np.testing.assert_allclose(values[i][fin], rows.loc[np.flatnonzero(fin)].to_numpy(), rtol=1e-6)
        assert (state[i][~fin] != raster.MISSING).all()           # every step has statistics
        assert ((state[i] == raster.NONFINITE) == ~np.isfinite(rows.to_numpy())).all()
    dead = h["labels"].index("conv2/Relu:0")                      # the synthetic run's dead ReLU, until the NaN
    assert (state[dead, :25] == raster.NONPOSITIVE).all()
    assert (state[:, 25:] == raster.NONFINITE).any() and "red = NaN/Inf" in captions(at)
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(h["png"].split(",", 1)[1]))).convert("RGBA"))
    assert pixels.shape[:2] == values.shape
    assert (pixels[state == raster.NONFINITE] == raster.NAN_RGBA).all()
    assert (pixels[dead, :25] == raster.ZERO_RGBA).all()


def test_percentiles_from_a_histogram_match_numpy_within_a_bin():
    import numpy as np
    from viewer.charts import bands
    x = np.random.default_rng(0).standard_normal(20_000) ** 3          # long-tailed
    edges = np.linspace(x.min(), x.max(), 2001)
    counts, _ = np.histogram(x, edges)
    got = bands.hist_percentiles(edges, counts)
    want = np.percentile(x, bands.PERCENTILES)
    assert np.all(np.abs(got - want) <= np.diff(edges)[0] + 1e-12), (got, want)
    assert got[0] == x.min() and got[-1] == x.max()
    assert np.isnan(bands.hist_percentiles(edges, np.zeros(2000))).all()
    frame = bands.percentile_frame({3: {"positive": (edges, counts), "negative": (edges, counts * 0)}})
    assert frame["group"].tolist() == ["positive", "negative"] and frame.loc[0, "p50"] == got[3]


def test_the_run_follows_a_page_switch(runs):
    """A page switch drops the old page's query and widgets: the sidebar keeps its run anyway.
    (AppTest keeps widgets across pages, so only tests/test_browser.py's Back/Forward test
    fails without viewer.app_main.restore_sidebar; this one checks the URL-less switch and
    that a choice made on the new page holds.)"""
    at = ok(start(runs, query={"run": "exp2"}))
    assert at.header[0].value == "Run exp2"
    del at.query_params["run"]                                      # the new page's URL has no run=
    at.switch_page(PAGE_FILES["Distributions"]).run()
    assert ok(at).selectbox(key="run").value.endswith("exp2")
    at.selectbox(key="run").select("exp1").run()                    # a choice on the new page holds
    at.switch_page(PAGE_FILES["Summary"]).run()
    assert ok(at).header[0].value == "Run exp1"


def bands_data(at: AppTest):
    """The percentile bands chart's spec and its bands (step, group, band, lo, hi, p50)."""
    import pyarrow as pa
    chart = next(c for c in at.get("vega_lite_chart") if '"band"' in c.proto.spec)
    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
    return json.loads(chart.proto.spec), next(f for f in frames if "band" in f.columns)


def test_distributions_percentile_bands(runs):
    import numpy as np
    import inspector
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_tab="Percentile bands"))
    assert "the stored log-magnitude histograms' quantiles (each within 5.9%" in captions(at)
    spec, table = bands_data(at)
    area, median = spec["layer"]
    assert area["mark"]["type"] == "area" and area["encoding"]["y2"]["field"] == "hi"
    assert median["mark"]["type"] == "line" and median["encoding"]["y"]["field"] == "p50"   # the median line
    # the median drawn at step 24 (before the run's NaN) for positive: the stored histogram's own quantile
    run = inspector.open_run(runs / "exp1")
    want = run.quantiles("conv3/Relu:0", steps=(24, 24), group="positive", q=[0.5])["q0.5"].item()
    got = table[(table["step"] == 24) & (table["group"] == "positive")]["p50"].iloc[0]
    assert got == want and set(table["group"]) == {"positive", "negative"}
    # y: the 7th-93rd percentiles padded, unless the 0-100 band fits in FITS times that
    from viewer.charts import bands
    inner, outer = (table[table["band"] == b] for b in ("7-93", "0-100"))
    span = inner["hi"].max() - inner["lo"].min()
    robust = [inner["lo"].min() - bands.PAD * span, inner["hi"].max() + bands.PAD * span]
    whole = [outer["lo"].min(), outer["hi"].max()]
    fits = whole[1] - whole[0] <= bands.FITS * (robust[1] - robust[0])
    want = [min(robust[0], whole[0]), max(robust[1], whole[1])] if fits else robust
    assert np.allclose(area["encoding"]["y"]["scale"]["domain"], want)
    at.toggle(key="di_bands_symlog").set_value(True).run()          # every band, on a symmetric-log axis
    scale = bands_data(ok(at))[0]["layer"][0]["encoding"]["y"]["scale"]
    assert scale["type"] == "symlog" and "domain" not in scale and 0 < scale["constant"] <= table["p50"].abs().max()


def test_bands_y_range_clips_extremes_that_would_flatten_the_bands():
    import numpy as np
    from viewer.charts import bands
    x = np.random.default_rng(0).standard_normal(20_000)
    x[0] = 1000.0                                                    # one extreme value
    frame = bands.percentile_frame({1: {"all": LogHistogram.of(x)}}, extremes={1: {"all": (x.min(), x.max())}})
    lo, hi, clipped = bands.y_range(frame)
    assert clipped and hi < 10 and frame["p100"].item() == 1000.0
    assert not bands.y_range(bands.percentile_frame({1: {"all": LogHistogram.of(x[1:])}}))[2]


def test_percentile_bands_end_at_the_exact_min_and_max():
    """A histogram that counts a subsample (a tensor over 16,384 elements) misses the extremes
    of the values it skipped: the 0-100 band ends at the statistics' min and max instead."""
    import numpy as np
    from inspector.format import hist_sample
    from viewer.charts import bands
    x = np.random.default_rng(0).standard_normal((32, 640))
    x[0, 100] = 9.0                                                  # in a block the subsample skips
    edges = np.linspace(x.min(), x.max(), 31)
    counts, _ = np.histogram(hist_sample(x, 32, 16_384), edges)
    assert bands.hist_percentiles(edges, counts)[-1] < 9.0 - np.diff(edges)[0]   # a bin short, or more
    frame = bands.percentile_frame({5: {"all": (edges, counts)}}, extremes={5: {"all": (x.min(), 9.0)}})
    p = frame.iloc[0][[f"p{q}" for q in bands.PERCENTILES]].to_numpy(float)
    assert p[0] == x.min() and p[-1] == 9.0 and np.all(np.diff(p) >= 0)


def test_distributions_percentile_bands_use_each_groups_min_and_max(runs):
    import numpy as np
    import inspector
    at = ok(start(runs / "exp1", "Distributions", di_tensor="conv3/Relu:0", di_ridge_kind="gradient",
                  di_tab="Percentile bands"))
    _, drawn = bands_data(at)
    df = inspector.open_run(runs / "exp1").query_stats(["conv3/Relu:0"], kinds=["gradient"], columns=["min", "max"])
    assert set(drawn["group"]) == {"positive", "negative"}
    for r in df[(df["group"] != "all") & np.isfinite(df["min"])].itertuples():   # (exp1 has NaN steps)
        row = drawn[(drawn["step"] == r.step) & (drawn["group"] == r.group) & (drawn["band"] == "0-100")].iloc[0]
        assert (row["lo"], row["hi"]) == (r.min, r.max), (r.step, r.group)
    assert "exact min and max" in captions(at)


def test_distributions_caption_uses_the_subsample_of_the_steps_session(tmp_path, monkeypatch):
    """A run resumed by another version mixes subsample sizes: the caption reads the config of
    the session that wrote the step shown (session 1 here, as an older version wrote it, has
    no histogram_sample: 65,536), not the latest session's."""
    import json
    import inspector
    import viewer.app_pages.distributions
    from inspector.testing import SyntheticRun
    path = tmp_path / "r"
    for first, last in ((0, 3), (3, 6)):
        b = SyntheticRun(path, tensors=6, steps_hint=6, dump_every=None)
        b.write_steps(first, last)
        b.close()
    (m,) = path.glob("manifest.*.s0001.json")
    doc = json.loads(m.read_text())
    del doc["config"]["histogram_sample"]
    m.write_text(json.dumps(doc))
    seen = []
    monkeypatch.setattr(viewer.app_pages.distributions, "histogram_sample", lambda cfg: seen.append(cfg) or 7)
    tensor = inspector.open_run(path).tensors.index[-1]
    steps = inspector.open_run(path).query_stats([tensor], columns=["count"])
    for step, session in sorted(set(zip(steps["step"], steps["session"]))):
        seen.clear()
        ok(start(path, "Distributions", di_tensor=tensor, di_step=int(step)))
        assert seen and ("histogram_sample" in seen[-1]) == (session == 2), (step, session)


@pytest.mark.parametrize("page", ["Masks & templates", "Feature maps", "Distributions", "Tensor browser"])
def test_pages_read_dumps_without_groups(tmp_path, monkeypatch, page):
    """A step whose samples break the group rule dumps its first samples without samples/group
    (no 'group' column): every page that reads dumps shows such a dump."""
    from inspector import testing
    dump_arrays = testing.SyntheticRun.dump_arrays

    def ungrouped(self, step):
        out = dump_arrays(self, step)
        out.pop("samples/group")
        return out
    monkeypatch.setattr(testing.SyntheticRun, "dump_arrays", ungrouped)
    make_synthetic_run(tmp_path / "r", steps=20, tensors=15, dump_every=10)
    at = start(tmp_path / "r", page, **({"di_tab": "Dumped samples"} if page == "Distributions" else {}))
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "could not be drawn" in e.value], [e.value for e in at.error]


def test_tensor_browser_says_why_an_op_was_not_captured(runs):
    """A search for ops the catalog lacks lists them with their status and rule (the run's
    accounting) instead of nothing: the weights' reads of a synthetic run, the backward pass."""
    at = ok(start(runs / "exp1", "Tensor browser"))
    at.text_input(key="tb_search").input("/read").run()
    assert "0 of 20 tensors" in captions(ok(at))
    expander = next(e for e in at.expander if "not captured" in e.label)
    table = expander.dataframe[0].value
    assert len(table) and set(table["rule"]) == {"synthetic"} and table["name"].str.endswith("/read").all()
    at.text_input(key="tb_search").input("relu").run()
    table = next(e for e in ok(at).expander if "not captured" in e.label).dataframe[0].value
    assert (table["rule"] == "backward").all() and table["name"].str.startswith("gradients/").all()


def listening(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP ``port`` (Linux's /proc/net)."""
    out = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        for line in (path.read_text().splitlines()[1:] if path.exists() else []):
            local, state = line.split()[1], line.split()[3]
            host, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:     # 0A: LISTEN
                raw = bytes.fromhex(host)
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))   # little-endian words
                out.add(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words))
    return out


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_streamlit_run_app_listens_on_this_machine_only(runs, tmp_path):
    """`streamlit run app.py -- runs/` as the docs give it (no --server.address, started from
    another directory): the config beside app.py binds 127.0.0.1, not every interface."""
    from browser_serve import free_port, start, stop, wait_healthy
    port = free_port()
    proc = start(runs, port, address=None, cwd=tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert listening(port) == {"127.0.0.1"}
    finally:
        stop(proc)


def test_a_kind_without_finite_values_is_said_not_drawn_as_an_empty_panel(tmp_path):
    """After the run turns NaN every gradient value is NaN: the step's gradient panel would be
    empty (Vega-Lite then collapses the whole chart). The page draws the forward panel alone
    and says why the gradient has none; Compare at such steps on both sides says so too."""
    import inspector
    make_synthetic_run(tmp_path / "nan", steps=40, tensors=20, dump_every=20, nonfinite_at=35)
    run = inspector.open_run(tmp_path / "nan")
    hist = run.query_stats(["conv1/Relu:0"], steps=(39, 39), kinds=["gradient"], columns=["hist_count"])
    assert all(np.sum(h) == 0 for h in hist["hist_count"])             # the case: nothing counted
    at = ok(start(tmp_path / "nan", "Distributions", di_tensor="conv1/Relu:0", di_step=39))
    (spec, _), = vega_hists(at)
    assert [p["title"] for p in spec["hconcat"]] == ["forward"]
    assert any("**gradient**: no histogram: no finite value counted" in w.value for w in at.warning)
    at = ok(start(tmp_path / "nan", "Compare", cmp_tensor="conv1/Relu:0", cmp_kind="gradient",
                  cmp_step_A=39, cmp_step_B=38))
    assert not vega_hists(at) and any("no finite value counted" in i.value for i in at.info)
