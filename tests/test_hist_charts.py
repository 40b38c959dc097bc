"""viewer.charts.hist_charts: the Vega-Lite histograms, overlay and ridge plot hold the bars of
inspector.analysis.hist_view, with the axis, ticks and outlines the page promises."""
from __future__ import annotations

import numpy as np

from inspector.analysis import hist_view
from inspector.format.loghist import LogHistogram
from viewer.charts import hist_charts


def groups(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"positive": LogHistogram.of(rng.laplace(0, 1e-3, 20_000)),
            "negative": LogHistogram.of(rng.laplace(0, 1e-4, 20_000))}


def layers(spec: dict, panel: int = 0) -> list[dict]:
    return spec["hconcat"][panel]["layer"]


def data_of(spec: dict, layer: dict) -> list[dict]:
    return spec["datasets"][layer["data"]["name"]]


def lookup(label_expr: str) -> dict:
    """The tick-label table of a labelExpr ("{'3425':'1e-8',...}[round(datum.value * 1000) + ''] || ''")."""
    import ast
    return ast.literal_eval(label_expr[:label_expr.index("}[") + 1])


def test_panel_draws_every_group_as_outline_over_a_light_fill_on_the_log_axis():
    g = groups()
    axis = hist_view.choose_axis(g.values(), kind="gradient")
    frame = hist_view.panel_frame({"": g}, axis, {"": {"positive": 70_000}})
    spec = hist_charts.histogram_chart({"gradient": (frame, axis)}, title="t").to_dict()
    fill, line = layers(spec)[:2]
    assert fill["mark"]["type"] == "rect" and fill["mark"]["fillOpacity"] == 0.2
    assert line["mark"] == {"type": "line", "interpolate": "step-after", "strokeWidth": 1.5, "clip": True}
    bars = data_of(spec, fill)
    assert {r["group"] for r in bars} == {"positive", "negative"}
    for grp in ("positive", "negative"):     # each bucket one bar: counts and fractions as stored
        mine = [r for r in bars if r["group"] == grp]
        assert sum(r["count"] for r in mine) == g[grp].total and np.isclose(sum(r["fraction"] for r in mine), 1)
    assert {r["label"] for r in bars} == {"positive (n=70,000; histogram of 20,000)", "negative (n=20,000)"}
    outline = data_of(spec, line)
    assert {r["group"] for r in outline} == {"positive", "negative"}
    # y: the fraction per bucket, one scale for both groups; x: powers of ten labelled with their values
    assert fill["encoding"]["y"]["title"] == "fraction of values per bucket"
    x = fill["encoding"]["x"]
    xs, labels = hist_view.ticks(axis, frame["x0"].min(), frame["x1"].max())
    assert x["axis"]["values"] == xs and "1e-4" in labels and "-1e-4" in labels
    table = lookup(x["axis"]["labelExpr"])
    assert [table[str(int(np.floor(v * 1000 + 0.5)))] for v in xs] == labels   # JavaScript's Math.round
    assert "signed log" in x["title"]


def test_overlay_draws_a_dashed_second_side_in_the_same_colours():
    a, b = groups(0), groups(1)
    axis = hist_view.choose_axis([*a.values(), *b.values()], kind="gradient")
    frame = hist_view.panel_frame({"A: step 1": a, "B: step 9": b}, axis)
    spec = hist_charts.histogram_chart({"gradient": (frame, axis)}).to_dict()
    fill, line = layers(spec)[:2]
    dash = line["encoding"]["strokeDash"]
    assert dash["field"] == "side" and dash["scale"] == {"domain": ["A: step 1", "B: step 9"],
                                                         "range": hist_charts.DASHES}
    assert fill["encoding"]["fill"]["field"] == "group"                 # a colour per group, both sides
    assert {(r["side"], r["group"]) for r in data_of(spec, line)} == {
        (s, g) for s in ("A: step 1", "B: step 9") for g in ("positive", "negative")}


def test_log_y_axis_floor_and_clipped_zeros():
    x = np.r_[np.zeros(6_000), np.random.default_rng(4).exponential(1, 4_000)]
    h = {"all": LogHistogram.of(x)}
    axis = hist_view.choose_axis(h.values(), kind="forward", extent=(0, x.max()))
    frame = hist_view.panel_frame({"": h}, axis)
    spec = hist_charts.histogram_chart({"forward": (frame, axis)}).to_dict()
    top = hist_view.y_top(frame["fraction"], frame["zero"])
    assert layers(spec)[0]["encoding"]["y"]["scale"] == {"domain": [0, top]}
    assert "zeros (clipped" in str(data_of(spec, layers(spec)[2]))
    log = hist_charts.histogram_chart({"forward": (frame, axis)}, log=True).to_dict()
    scale = layers(log)[0]["encoding"]["y"]["scale"]
    assert scale["type"] == "log" and scale["domainMin"] == frame["fraction"][frame["fraction"] > 0].min() / 2
    assert len(layers(log)) == 2                                        # no clipping on a log axis


def test_ridge_chart_rows_and_axis():
    rows = {s: groups(s) for s in (10, 20, 30)}
    axis = hist_view.choose_axis([h for g in rows.values() for h in g.values()], kind="gradient")
    frame = hist_view.ridge_frame(rows, axis)
    spec = hist_charts.ridge_chart(frame, axis, list(rows), title="r").to_dict()
    fill, line = spec["layer"]
    assert fill["encoding"]["y"]["axis"]["labelExpr"].startswith("{'2':'10','1':'20','0':'30'}")
    assert "labelExpr" in fill["encoding"]["x"]["axis"]                 # the step panel's signed log ticks
    assert {r["step"] for r in spec["datasets"][line["data"]["name"]]} == {10, 20, 30}


def test_ridge_labels_every_row():
    rows = {s: groups(s) for s in range(0, 80, 10)}
    axis = hist_view.choose_axis([h for g in rows.values() for h in g.values()], kind="gradient")
    spec = hist_charts.ridge_chart(hist_view.ridge_frame(rows, axis), axis, list(rows)).to_dict()
    y = spec["layer"][0]["encoding"]["y"]["axis"]
    assert y["labelOverlap"] is False and len(y["values"]) == 8        # Vega hides none of them
    assert y["labelFontSize"] >= 11 and hist_charts.ROW_PX >= y["labelFontSize"] + 4   # and they fit their rows
