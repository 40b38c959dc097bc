"""Page: the run's summary: the diagnosis (the most likely culprit first), status, first NaN/Inf,
alerts beside the loss curve, each layer's gradient size (last step, and its change over the
run), hook settings, dropped writes, sessions."""
from __future__ import annotations

import datetime as dt

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from inspector import analysis
from inspector.analysis import NONFINITE_SOURCES, dropped_text, rerun_text, source_text
from inspector.errors import InspectorError
from inspector.stats.summary import Overview
from inspector.sizes import human_bytes

from .. import data, layers, page_links
from ..charts import lines
from ..ui import Ctx, plain, show_chart

ICONS = {"error": "🛑", "warning": "⚠️", "info": "ℹ️"}


STATUS_NOTES = {
    "crashed": "The training process that wrote this run is gone without closing it (crashed or "
               "killed). Every completed statistics part and dump is readable; the last steps may "
               "be missing.",
    "stalled": "This run's writer has not written for over 5 heartbeats: its process crashed on "
               "another machine, or hangs. Every completed file is readable.",
}


def facts(run, steps: np.ndarray) -> list[tuple[str, str]]:
    """The run at a glance: (what, value) pairs, the facts table's columns."""
    m = run.manifest
    return [("Status", str(run.status)), ("Statistics steps", f"{len(steps)}"),
            ("Last step", f"{int(steps[-1])}" if len(steps) else "–"),
            ("Tensors", f"{len(run.tensors)}"), ("Size on disk", human_bytes(run.size_bytes())),
            ("Dump steps", f"{len(run.steps)}"), ("Dropped", dropped_text(run.dropped)),
            ("Workers", ", ".join(run.workers)), ("Format", f"v{m.get('format_version')}"),
            ("TensorFlow", str(m.get("tensorflow_version") or "–"))]


def facts_table(rows: list[tuple[str, str]]) -> str:
    """``rows`` as one Markdown table, a column each (every value through :func:`plain`, which
    also escapes ``|``): one element where ten metrics cost the browser ten.

    >>> print(facts_table([("Status", "finished"), ("Format", "v4")]))
    | Status | Format |
    |---|---|
    | finished | v4 |
    """
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(plain(c).replace("\n", " ") for c in cells) + " |"
    return "\n".join([row([k for k, _ in rows]), "|" + "---|" * len(rows),
                      row([v for _, v in rows])])


def render(ctx: Ctx) -> None:
    run = data.get_run(ctx.path, ctx.sig)
    m = run.manifest
    steps = data.stats_steps(ctx.path, ctx.sig)
    st.header(f"Run {plain(run.name)}")
    st.markdown(facts_table(facts(run, steps)))
    st.caption(f"{plain(run.path)}: created {plain(m.get('created', '?'))}, updated "
               f"{plain(m.get('updated', '?'))} (viewer read it at "
               f"{dt.datetime.now().strftime('%H:%M:%S')}). Statistics steps: steps with in-graph "
               "statistics; dropped: dumps and statistics steps the writers could not write. "
               + nonfinite_text(data.first_nonfinite(ctx.path, ctx.sig), run.tensors))
    show_diagnosis(ctx)
    if run.status in STATUS_NOTES:
        st.warning(STATUS_NOTES[run.status])
    if run.tensors.empty:
        st.warning("This run's catalog is empty: the hook has not recorded any tensor yet.")
    elif not len(steps):
        st.warning("This run has no statistics yet (the hook writes them every few seconds while "
                   "training).")

    left, right = st.columns([3, 2])
    with left:
        show_alerts(ctx)
    with right:
        loss_curve(ctx)
    # only the open tab is drawn: the browser renders one of them, not every table and chart
    grads, details = st.tabs(["Gradient size per layer", "Run details"], key="sm_tab",
                             on_change="rerun")
    if grads.open:
        with grads:
            gradient_health(ctx)
    if details.open:
        with details:
            run_details(ctx)


def run_details(ctx: Ctx) -> None:
    """Hook settings, tensors by op type, dropped writes, sessions."""
    run = data.get_run(ctx.path, ctx.sig)
    left, right = st.columns(2)
    with left:
        st.subheader("Hook settings")
        cfg = run.config
        if cfg:
            # a static table: every row and the whole value shown, not a frame that scrolls
            st.table(pd.DataFrame({"setting": list(cfg), "value": [str(v) for v in cfg.values()]}),
                     hide_index=True, border="horizontal")
        else:
            st.caption("no hook settings recorded")
    with right:
        st.subheader("Tensors by op type")
        if not run.tensors.empty:
            counts = run.tensors["op_type"].value_counts().rename_axis("op type").reset_index(
                name="tensors")
            show_chart(lambda: op_type_chart(counts), ("op_types", ctx.path, ctx.sig),
                       width="stretch")
    if not run.dropped.empty:
        st.subheader("Dropped writes")
        st.table(run.dropped, hide_index=True, border="horizontal")
    st.subheader("Sessions")
    st.caption("Each train/evaluate call or resume writes a session; a step two sessions recorded "
               "is shown from the later one.")
    st.table(run.sessions, hide_index=True, border="horizontal")   # every column, none cut


def op_type_chart(counts: pd.DataFrame) -> alt.Chart:
    """Tensors per op type as horizontal bars, every op type named (a vertical bar chart's axis
    dropped every other label of a crowded band)."""
    counts = counts.astype({"op type": object})
    return alt.Chart(counts).mark_bar().encode(
        y=alt.Y("op type:N", sort="-x", title=None,
                axis=alt.Axis(labelOverlap=False, labelFontSize=11, labelLimit=240)),
        x=alt.X("tensors:Q", title="tensors"),
        tooltip=["op type:N", "tensors:Q"]).properties(height=18 * len(counts) + 40)


#: the page that shows a finding's evidence, by the finding's ``page``: its title and the query
#: parameter of its tensor picker
EVIDENCE_PAGES = {"graph": ("Op graph", "gr_tensor"),
                  "overview": ("Training overview", "ov_tensor"),
                  "distributions": ("Distributions", "di_tensor")}
#: the statistic a finding's evidence chart draws, by kind: (kind of rows, column, title)
EVIDENCE_SERIES = {"frozen": ("update", "l2", "update L2 (0: never changed)"),
                   "gradient_jump": ("gradient", "l2", "gradient L2"),
                   "exploding_gradient": ("gradient", "l2", "gradient L2"),
                   "vanishing_gradient": ("gradient", "l2", "gradient L2"),
                   "dead_units": ("forward", "zero_fraction", "share of zeros"),
                   "dead_relu": ("forward", "zero_fraction", "share of zeros"),
                   "saturated": ("forward", "max", "max"),
                   "update_ratio_high": ("update", "l2", "update L2"),
                   "nonfinite": ("forward", "nonfinite", "NaN/Inf values"),
                   "nonfinite_after": ("forward", "nonfinite", "NaN/Inf values")}


def show_diagnosis(ctx: Ctx) -> None:
    """The most likely culprit first (``analysis.diagnose``): what, where, when, the evidence
    (its numbers, and a chart of the statistic that shows it), what to try, and the page that
    shows more; the other findings ranked below it."""
    found = [f for f in data.diagnosis(ctx.path, ctx.sig) if f["severity"] in ("error", "warning")]
    if not found:
        st.success("**Diagnosis**: nothing went wrong that the statistics show: no NaN/Inf, no "
                   "frozen, saturated or dead layer, gradients and update sizes within bounds "
                   "(thresholds: docs/guide/diagnose.md).")
        return
    first = found[0]
    where = ", ".join(x for x in (f"layer **{plain(first['layer'])}**" if first["layer"] else "",
                                  f"op **{plain(first['op'])}**" if first["op"] else "",
                                  f"step **{first['step']}**" if first["step"] is not None else "")
                      if x)
    box = st.error if first["severity"] == "error" else st.warning
    with st.container(border=True):
        box(f"{ICONS[first['severity']]} **Most likely culprit: "
            f"{plain(first['kind'].replace('_', ' '))}**"
            + (f" ({where})" if where else "") + f"\n\n{plain(first['evidence'])}"
            + (f"\n\n**Try**: {plain(first['advice'])}" if first["advice"] else ""))
        evidence_chart(ctx, first)
        if (page := EVIDENCE_PAGES.get(first.get("page") or "")) is not None:
            title, key = page
            tensor = first.get("tensor")
            page_links.link(title, f"Open the {title}",
                            {key: tensor} if tensor and ":" in tensor else {})
    if len(found) > 1:
        with st.expander(f"{len(found) - 1} more finding(s), ranked"):
            for f in found[1:]:
                loc = ", ".join(x for x in (f"layer {f['layer']}" if f["layer"] else "",
                                            f"step {f['step']}" if f["step"] is not None else "")
                                if x)
                st.markdown(f"{ICONS[f['severity']]} **{plain(f['kind'].replace('_', ' '))}**"
                            + (f" ({plain(loc)})" if loc else "") + f": {plain(f['evidence'])}")


def evidence_chart(ctx: Ctx, finding: dict) -> None:
    """The statistic that shows ``finding`` over the steps, for its tensor (and, for a gradient
    that jumps across an op, the op's input beside it)."""
    spec = EVIDENCE_SERIES.get(finding["kind"])
    tensor = finding.get("tensor")
    if spec is None or not tensor:
        return
    kind, column, title = spec
    if (finding.get("numbers") or {}).get("where") == "backward":
        kind = "gradient"   # the gradient turned non-finite, not the value
    names = [tensor]
    source = (finding.get("numbers") or {}).get("input")   # a gradient jump's input, beside it
    if isinstance(source, str):
        names.insert(0, source)
    run = data.get_run(ctx.path, ctx.sig)
    counts = column == "nonfinite"   # NaN and Inf counted together: an Inf is as much a fault
    try:
        df = run.query_stats([n for n in names if n in set(run.tensors["name"])], kinds=[kind],
                             groups=["all"], columns=["nan", "inf"] if counts else [column],
                             finite_part=counts)
    except InspectorError:
        return
    if df.empty:
        return
    if counts:
        df = df.assign(nonfinite=df["nan"] + df["inf"])
    wide = df.pivot_table(index="step", columns="tensor", values=column, observed=True,
                          aggfunc="last")
    wide.columns = [str(c) for c in wide.columns]
    show_chart(lambda: lines.line_chart(wide, title, height=180, legend_title="tensor",
                                        log=column == "l2" and bool((wide > 0).all().all())),
               ("evidence", ctx.path, ctx.sig, kind, column, tuple(names)), width="stretch")


def nonfinite_text(first: dict | None, catalog: pd.DataFrame | None = None) -> str:
    """'First NaN/Inf: step 25, seen by the statistics (forward of conv4/Relu:0), created at
    models.py:57 in conv_block' (Markdown-safe; the place where the catalog has it)."""
    if not first:
        return "First NaN/Inf: none seen (statistics and the hook's loss check)."
    if first.get("text"):   # the origin: the op that made it, from finite inputs
        return f"First NaN/Inf: {plain(first['text'])}{plain(rerun_text(first))}."
    source = NONFINITE_SOURCES.get(first.get("source"), first.get("source") or "the run")
    where = f"{first.get('kind')} of {first.get('tensor')}" if first.get("tensor") else "the loss"
    made = source_text(catalog, first.get("tensor")) if catalog is not None else None
    return (f"First NaN/Inf: step {int(first['step'])}, seen by {plain(source)} ({plain(where)})"
            + (f", created at {plain(made)}" if made else "") + plain(rerun_text(first)) + ".")


def dead_filter_alerts(ctx: Ctx) -> list[str]:
    """One warning per ICNN layer with dead filters at the newest readable dump."""
    if data.icnn_layers(ctx.path, ctx.sig).empty:
        return []
    steps = data.readable_steps(ctx.path, ctx.sig)
    try:
        found = data.dead_filters(ctx.path, ctx.sig)
    except InspectorError as e:  # a dump whose header reads but whose data does not
        return [f"could not check the newest dump for dead filters: {plain(e)}"]
    if not any(found.values()):
        return []
    # the count says how little a dump's verdict rests on: a filter silent in a few dumped
    # samples may fire on a held-out set (the demo's own count is over 1,000 test images)
    n = len(data.samples(ctx.path, ctx.sig, steps[-1]))
    return [f"{plain(layer)}: filter(s) {', '.join(map(str, dead))} zero in all {n} dumped samples "
            f"at step {steps[-1]} (mu pinned at (-1, -1)): dead there, not tight part filters"
            for layer, dead in found.items() if dead]


def show_alerts(ctx: Ctx) -> None:
    """The run's alerts (``analysis.run_alerts``) and the viewer's dead-filter check."""
    st.subheader("Alerts")
    alerts = data.alerts(ctx.path, ctx.sig)
    dead = dead_filter_alerts(ctx)
    if alerts.empty and not dead:
        st.success("No alerts: no NaN/Inf, no dead ReLU, gradients within bounds, nothing dropped.")
    for a in alerts.itertuples():
        text = (f"{ICONS.get(a.severity, '')} **{plain(a.kind.replace('_', ' '))}**: "
                f"{plain(a.message)}")
        {"error": st.error, "warning": st.warning}.get(a.severity, st.info)(text)
    for text in dead:
        st.warning(f"{ICONS['warning']} **dead filter**: {text}")


def loss_curve(ctx: Ctx) -> None:
    """The loss (the manifest's ``loss`` tensor, forward mean) over steps, or why there is none."""
    st.subheader("Loss")
    name, loss = data.loss_series(ctx.path, ctx.sig)
    if loss.empty:
        st.caption("No loss statistics: "
                   + (f"the loss tensor {plain(name)} has no forward statistics in this view."
                      if name else "the manifest names no loss tensor."))
        return
    smoothing = float(st.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key="sm_smooth",
                                help="exponential moving average, debiased (as TensorBoard); the "
                                     "raw line stays faint"))
    show_chart(lambda: lines.line_chart(loss.rename("loss").to_frame(), "loss (mean)",
                                        smoothing=smoothing, height=260, legend_title="tensor"),
               ("loss", ctx.path, ctx.sig, name, smoothing), width="stretch")
    st.caption(f"{plain(name)}, forward mean (group all); gaps: NaN/Inf or steps without "
               "statistics")


def gradient_sizes(ov: Overview, rows: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``rows`` (a layer's output, network order): its gradient L2 at its last
    statistics column, ``state`` there (``finite``, ``zero``: an all-zero gradient, a dead
    layer; or ``NaN/Inf``), and its ``last`` and ``first`` finite positive values with their
    steps (``last_step``, ``first_step``) and ``change`` (last / first). On a run that ended in
    NaN, ``last`` is the last value before it."""
    index = {t: i for i, t in enumerate(ov.tensors)}
    out = []
    for tensor, label, layer in zip(rows["tensor"], rows["label"], rows["layer"]):
        i = index[tensor]
        present = np.flatnonzero(ov.present[i])
        if not len(present):
            continue
        end = float(ov.matrix[i, present[-1]])
        state = "NaN/Inf" if not np.isfinite(end) else "zero" if end <= 0 else "finite"
        good = np.flatnonzero(ov.present[i] & np.isfinite(ov.matrix[i]) & (ov.matrix[i] > 0))
        a, b = (good[0], good[-1]) if len(good) else (None, None)
        first, last = (float(ov.matrix[i, a]), float(ov.matrix[i, b])) if len(good) \
            else (np.nan, np.nan)
        out.append({"layer": str(layer), "tensor": str(tensor), "label": str(label), "state": state,
                    "end_step": int(ov.steps[present[-1]]), "first": first, "last": last,
                    "first_step": int(ov.steps[a]) if a is not None else -1,
                    "last_step": int(ov.steps[b]) if b is not None else -1, "change": last / first})
    cols = ["layer", "tensor", "label", "state", "end_step", "first", "last", "first_step",
            "last_step", "change"]
    # object, not pandas 3's Arrow strings: Vega-Lite cannot read large_string
    return pd.DataFrame(out, columns=cols).astype({c: object
                                                   for c in ("layer", "tensor", "label", "state")})


def gradient_chart(sizes: pd.DataFrame) -> alt.LayerChart:
    """Each layer's gradient L2 at its last step (a filled dot) and at its first (a ring), joined:
    the line's length and direction are its change over the run, on a log axis, layers in
    network order; a layer that ends zero
    or NaN/Inf says so in red at the axis' left end (its dot: the last value before)."""
    order = list(sizes["label"])
    # every layer named: Vega's default drops every other label of a crowded band axis, and
    # the ones dropped were the layers a user looks for
    y = alt.Y("label:N", sort=order, title=None,
              axis=alt.Axis(labelLimit=320, labelOverlap=False, labelFontSize=11))
    tips = [alt.Tooltip("tensor:N"), alt.Tooltip("layer:N"),
            alt.Tooltip("state:N", title="at the end"),
            alt.Tooltip("last:Q", title="last L2", format=".4~g"),
            alt.Tooltip("last_step:Q", title="at step"),
            alt.Tooltip("first:Q", title="first L2", format=".4~g"),
            alt.Tooltip("first_step:Q", title="at step"),
            alt.Tooltip("change:Q", title="last / first", format=".3~g")]
    data = sizes.assign(note=[f"{s} at step {e}" if s != "finite" else ""
                              for s, e in zip(sizes["state"], sizes["end_step"])])
    chart = alt.Chart(data).encode(y=y, tooltip=tips)
    base = chart.transform_filter("datum.last > 0")
    x = alt.X("last:Q", scale=alt.Scale(type="log"),
              title="gradient L2 (log scale): ● last step, ○ first step")
    span = base.mark_rule(color="#9e9e9e").encode(x=x, x2="first:Q")
    first = base.mark_point(shape="circle", filled=False, color="#7f7f7f",
                            size=40).encode(x=alt.X("first:Q"))
    last = base.mark_point(shape="circle", filled=True, size=60, opacity=1,
                           color="#1f4e9a").encode(x=x)
    bad = chart.transform_filter("datum.state != 'finite'").mark_text(
        align="left", dx=4, color="#e41a1c", fontWeight="bold").encode(x=alt.value(0),
                                                                       text="note:N")
    # the height is the whole chart's (Streamlit fits the chart to it): 20 pixels a layer plus the
    # axis, its title and the legend; a very deep network's rows get closer, never unnamed
    return alt.layer(span, first, last, bad).properties(height=min(20 * len(order), 1200) + 90)


def gradient_health(ctx: Ctx) -> None:
    """Each layer's gradient size at the last step and how it changed over the run: a vanishing
    or exploding layer stands out at a glance."""
    st.subheader("Gradient size per layer")
    ov = data.overview(ctx.path, ctx.sig, "gradient", "all", "l2")
    if ov.present is None or not ov.present.any():
        st.caption("No gradient statistics in this view.")
        return
    have = [t for t, p in zip(ov.tensors, ov.present.any(axis=1)) if p]
    table = data.layer_table(ctx.path, ctx.sig, tuple(have))
    plumbing = st.toggle("Loss and label ops", key="sm_plumbing",
                         help="also draw the ops of the loss (cross-entropy, weight decay, their "
                         "sum) and of the labels (a cast): they are not the model's layers")
    left_out = int((table["part"] != "model").sum())
    rows = layers.shown_rows(table if plumbing else
                             table[table["part"] == "model"].reset_index(drop=True))
    sizes = gradient_sizes(ov, rows)
    if sizes.empty:
        st.caption("No gradient statistics of the model's layers in this view.")
        return
    show_chart(lambda: gradient_chart(sizes), ("gradient_sizes", ctx.path, ctx.sig, plumbing),
               width="stretch")
    bad = sizes[sizes["state"] != "finite"]
    st.caption("L2 of each layer's output gradient (group all; rows in network order, a layer "
               "folded into its output as on the Training overview) at its last statistics step "
               f"({int(sizes['end_step'].max())}) and at its first (the line between: its change "
               "over the run; hover for last / first)"
               + (f"; {len(bad)} layer(s) end zero or NaN/Inf (in red; the dot: the last value "
                  "before)"
                  if len(bad) else "")
               + (f"; {left_out} loss and label op(s) left out (not the model's layers)"
                  if left_out and not plumbing else ""))
    group_difference(ctx, table)


#: How much the groups must differ (median factor over the run) for the Summary to name a layer
DIFFER_FACTOR = 2.0


def group_difference(ctx: Ctx, table: pd.DataFrame) -> None:
    """The model's layers whose positive and negative groups differ most (gradient L2 and
    activation L2: the median over the run of negative / positive, furthest from 1 first)."""
    run = data.get_run(ctx.path, ctx.sig)
    if not {"positive", "negative"} <= set(run.groups):
        return
    st.subheader("Where positive and negative differ most")
    found = []
    for kind, what in (("gradient", "gradient L2"), ("forward", "activation L2")):
        ratio = data.group_ratio(ctx.path, ctx.sig, kind, "l2")
        model = layers.shown_rows(data.layer_table(ctx.path, ctx.sig, tuple(ratio.tensors)))
        model = model[model["part"] == "model"]
        top = analysis.most_different(ratio, list(model["tensor"]), top=3)
        for r in top.itertuples():
            found.append({"layer": str(model.set_index("tensor").loc[r.tensor, "layer"]),
                          "statistic": what, "negative / positive (median)": r.median,
                          "furthest from 1": r.peak, "at step": r.peak_step,
                          "steps": r.steps})
    if not found:
        st.caption("No step where both groups have statistics.")
        return
    df = pd.DataFrame(found)
    big = df[(df["negative / positive (median)"] >= DIFFER_FACTOR)
             | (df["negative / positive (median)"] <= 1 / DIFFER_FACTOR)]
    st.markdown(("Layers whose groups differ by over "
                 f"{DIFFER_FACTOR:g}x (median over the run): "
                 + ", ".join(f"**{plain(ly)}** ({what}, x{v:.3g})" for ly, what, v in
                             zip(big["layer"], big["statistic"],
                                 big["negative / positive (median)"]))) if len(big) else
                f"No layer's groups differ by over {DIFFER_FACTOR:g}x (median over the run); the "
                "largest differences:")
    # six rows at most: a static table, not a scrolling frame (half its browser cost)
    st.table(df.style.format("{:.3g}", subset=["negative / positive (median)", "furthest from 1"]),
             hide_index=True, border="horizontal")
    st.caption("negative / positive of each statistic per step, its median over the run (> 1: "
               "negatives larger); the Training overview's \"negative / positive\" group draws "
               "it per layer and step")
