"""Positive vs negative at a glance, an honest heatmap, and layers that are layers (issue 47),
driven with AppTest on small synthetic runs: the two groups' heatmaps share one colour scale,
their ratio is drawn on a diverging log scale, a 60-step run summarized in 2-step bins still
draws 60 columns, the Summary names the layers where the groups differ, and a labels cast is
not drawn among the model's layers.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from test_app import ok, start as app_start  # noqa: E402

from inspector import testing  # noqa: E402
from inspector.stats.summary import summarize_part  # noqa: E402
from inspector.testing import make_synthetic_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAST = "Cast_1:0"


def with_labels_cast(monkeypatch) -> None:
    """Synthetic runs written from now on record the labels' cast (``Cast_1``, read by the loss
    beside the model's output), as a TF1 model_fn that casts its labels does."""
    catalog, graph = testing.build_catalog, testing.synthetic_graph

    def build(*a, **k):
        # the cast's values grow over the run (depth 1: the synthetic run's largest gradients)
        return catalog(*a, **k) + [testing.Tensor(CAST, "Cast", (), True, True, 1.0)]

    def wired(cat):
        nodes = graph(cat)
        out = []
        for n in nodes:
            if n.name == "Cast_1":
                n = testing.Node("Cast_1", "Cast", ("labels",))
            elif n.name == "loss/Mean":
                n = testing.Node("loss/Mean", "Mean", ("dense/BiasAdd", "Cast_1"))
            out.append(n)
        return out
    monkeypatch.setattr(testing, "build_catalog", build)
    monkeypatch.setattr(testing, "synthetic_graph", wired)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    mp = pytest.MonkeyPatch()
    try:
        with_labels_cast(mp)
        make_synthetic_run(root / "cast", steps=20, tensors=20, dump_every=None)
    finally:
        mp.undo()
    long = make_synthetic_run(root / "sixty", steps=60, tensors=12, dump_every=None, seed=4)
    # summaries in bins of 2 steps (as a finished run's compacted parts have): the overview must
    # not draw its columns from them
    for part in sorted((Path(long) / "stats").glob("*.parquet")):
        summarize_part(Path(long), part)
    return root


@pytest.fixture(autouse=True)
def _runs_env(monkeypatch):
    monkeypatch.setenv("TF_INSPECTOR_RUNS", "")


def start(root: Path, page: str, query: dict | None = None, **state) -> AppTest:
    """test_app's start, the page checked free of errors."""
    return ok(app_start(root, page, query, **state))


def heatmap(at: AppTest) -> dict:
    (h,) = [json.loads(c.proto.json) for c in at.get("bidi_component")
            if c.proto.component_name.endswith("tf_inspector_heatmap")]
    return h


def values(h: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(h["values"]), np.float32).reshape(len(h["labels"]), -1)


def shared_domain(h: dict) -> list[float]:
    return h["domain"][h["own"].index(False)]


def test_positive_and_negative_share_one_colour_scale_and_their_ratio_is_drawn(runs):
    pos = heatmap(start(runs, "Training overview", {"run": "sixty", "ov_group": "positive"}))
    neg = heatmap(start(runs, "Training overview", {"run": "sixty", "ov_group": "negative"}))
    # the synthetic groups differ (positives' gradients larger): one scale spans both
    assert np.nanmax(values(pos)) != pytest.approx(np.nanmax(values(neg)), rel=1e-3)
    assert shared_domain(pos) == shared_domain(neg)
    lo, hi = shared_domain(pos)
    both = np.concatenate([values(pos).ravel(), values(neg).ravel()])
    assert lo == pytest.approx(np.nanmin(both), rel=1e-5) and hi == pytest.approx(np.nanmax(both), rel=1e-5)
    assert "one scale for positive and negative" in pos["scale_note"]

    ratio = heatmap(start(runs, "Training overview", {"run": "sixty", "ov_group": "negative / positive"}))
    assert ratio["title"] == "gradient l2 (negative / positive)" and ratio["log"]
    assert ratio["labels"] == pos["labels"]
    np.testing.assert_allclose(values(ratio), values(neg) / values(pos), rtol=1e-5)
    lo, hi = shared_domain(ratio)
    assert lo == pytest.approx(1 / hi)                       # centred on 1 on the log scale
    stops = ratio["stops"]
    mid = stops[len(stops) // 2]
    assert stops != pos["stops"] and all(int(mid[i:i + 2], 16) > 240 for i in (1, 3, 5))   # white at 1


def test_sixty_statistics_steps_draw_sixty_columns_with_a_ticked_colour_bar(runs):
    at = start(runs, "Training overview", {"run": "sixty"})
    h = heatmap(at)
    assert h["first"] == list(range(60)) == h["last"]
    assert values(h).shape[1] == 60
    ticks = [t for _, t in h["ticks"]]
    lo, hi = shared_domain(h)
    assert len(ticks) >= 3 and float(ticks[0]) == pytest.approx(lo, rel=1e-3) \
        and float(ticks[-1]) == pytest.approx(hi, rel=1e-3)
    assert [x for x, _ in h["ticks"]] == sorted(x for x, _ in h["ticks"])
    assert "a bin of" not in " ".join(c.value for c in at.caption)


def test_a_labels_cast_is_not_drawn_among_the_layers(runs):
    at = start(runs, "Training overview", {"run": "cast"})
    rows = [lb.split(" ")[0] for lb in heatmap(at)["labels"]]
    assert CAST not in rows and "loss/Mean:0" not in rows and "dense/BiasAdd:0" in rows
    assert "2 loss and label op(s) left out" in " ".join(c.value for c in at.caption)
    shown = [lb.split(" ")[0] for lb in
             heatmap(start(runs, "Training overview", {"run": "cast", "ov_plumbing": "true"}))["labels"]]
    assert CAST in shown and "loss/Mean:0" in shown

    summary = start(runs, "Summary", {"run": "cast"})
    (sizes,) = [c for c in summary.get("vega_lite_chart") if "gradient L2" in c.proto.spec]
    datasets = json.dumps([d.data.data.hex() for d in sizes.proto.datasets])
    assert CAST.encode().hex() not in datasets and "conv1".encode().hex() in datasets


def test_summary_names_the_layers_where_the_groups_differ_most(runs):
    at = start(runs, "Summary", {"run": "sixty"})
    assert any(s.value == "Where positive and negative differ most" for s in at.subheader)
    (df,) = [t.value for t in at.table if "negative / positive (median)" in t.value.columns]
    assert len(df) > 0 and set(df["statistic"]) <= {"gradient L2", "activation L2"}
    far = np.abs(np.log(df["negative / positive (median)"].to_numpy()))
    grad = far[(df["statistic"] == "gradient L2").to_numpy()]
    assert list(grad) == sorted(grad, reverse=True)          # furthest from 1 first


def test_summary_op_type_chart_names_every_op_type(runs):
    """One bar per op type, and the axis may not drop labels (Vega's default drops every other
    one on a crowded band axis)."""
    import pyarrow as pa
    import inspector
    at = start(runs, "Summary", {"run": "cast"}, sm_tab="Run details")        # the run details' tab
    (chart,) = [c for c in at.get("vega_lite_chart") if '"op type' in c.proto.spec]
    spec = json.loads(chart.proto.spec)
    assert spec["encoding"]["y"]["axis"]["labelOverlap"] is False
    (frame,) = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
    types = inspector.open_run(runs / "cast").tensors["op_type"]
    assert sorted(frame["op type"]) == sorted(types.unique()) and frame["tensors"].sum() == len(types)


def test_a_recorded_graph_sets_apart_exactly_its_loss_and_label_ops():
    """The stored run of tests/data (the demo's TF1 model_fn: weight decay, a logistic and a
    cross-entropy loss, the labels cast): the ops the issue names are the loss's and labels',
    every other catalogued op, the ICNN layer's helpers included, is the model's."""
    import inspector
    from inspector.graph.graphdef import OpGraph, parse_graph_def
    from viewer.layers import layer_rows, plumbing
    run_dir = ROOT / "tests" / "data" / "old_run" / "icnn"
    run = inspector.open_run(run_dir)
    graph = OpGraph(parse_graph_def((run_dir / "graph.chief.s0001.pb").read_bytes()))
    parts = plumbing(graph, run.manifest["loss"], run.manifest["labels"])
    rows = layer_rows(run.tensors, list(run.tensors["name"]), None, parts)
    apart = dict(zip(rows["tensor"].str.rsplit(":", n=1).str[0], rows["part"]))
    apart = {op: part for op, part in apart.items() if part != "model"}
    assert apart == {"Cast_1": "labels", "AddN": "loss", "mul": "loss", "xent": "loss", "loss": "loss",
                     "logistic_loss": "loss", **{f"L2Loss{s}": "loss" for s in ("", "_1", "_2", "_3", "_4")}} \
        | {op: "loss" for op in apart if op.startswith("logistic_loss/")}
    assert all(p == "model" for t, p in zip(rows["tensor"], rows["part"]) if t.startswith(("conv", "icnn_mask/")))


def test_binned_columns_show_the_mean_or_the_extreme_picked_and_say_so(runs, monkeypatch, tmp_path):
    """With more statistics steps than fit (here: more than 16), columns are bins: their mean by
    default (from the summaries), or each bin's max as picked, equal to numpy's max over the
    bin's steps; the caption names the bin and the choice."""
    import shutil

    import inspector
    import viewer.data
    monkeypatch.setattr(viewer.data, "MAX_COLUMNS", 16)
    root = tmp_path / "binned"
    shutil.copytree(runs / "sixty", root / "sixty")          # its own path: nothing cached for it
    at = start(root, "Training overview", {"run": "sixty"})
    mean = heatmap(at)
    caption = " ".join(c.value for c in at.caption)
    assert values(mean).shape[1] <= 16 and "each column is a bin of" in caption and "the mean of" in caption
    at.selectbox(key="ov_hm_grad_agg").set_value("max").run()
    peak = heatmap(at)
    assert "its max" in " ".join(c.value for c in at.caption)
    run = inspector.open_run(root / "sixty")
    l2 = run.query_stats(kinds=["gradient"], groups=["all"], columns=["l2"]).pivot_table(
        index="tensor", columns="step", values="l2", observed=True)
    tensor = peak["labels"][0].split(" ")[0]                  # a folded row draws its output tensor
    got = values(peak)[0]
    assert len(got) <= 16 and any(b > a for a, b in zip(peak["first"], peak["last"]))
    for j, (a, b) in enumerate(zip(peak["first"], peak["last"])):
        want = l2.loc[tensor, a:b].max()
        assert got[j] == pytest.approx(want, rel=1e-5)
