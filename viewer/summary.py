"""Page: the run's summary: status, first NaN/Inf, alerts beside the loss curve, hook settings,
dropped dumps, sessions."""
from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from inspector.analysis import NONFINITE_SOURCES, dropped_text, rerun_text, source_text
from inspector.errors import InspectorError
from inspector.units import human_bytes

from . import data
from .ui import Ctx, plain

ICONS = {"error": "🛑", "warning": "⚠️", "info": "ℹ️"}


STATUS_NOTES = {
    "crashed": "The training process that wrote this run is gone without closing it (crashed or killed). "
               "Every completed statistics part and dump is readable; the last steps may be missing.",
    "stalled": "This run's writer has not written for over 5 heartbeats: its process crashed on another "
               "machine, or hangs. Every completed file is readable.",
}


def render(ctx: Ctx) -> None:
    run = data.get_run(ctx.path, ctx.sig)
    m = run.manifest
    steps = data.stats_steps(ctx.path, ctx.sig)
    st.header(f"Run {plain(run.name)}")
    st.caption(plain(run.path))
    c = st.columns(5)
    c[0].metric("Status", plain(run.status))
    c[1].metric("Statistics steps", f"{len(steps)}", help="steps with in-graph statistics")
    c[2].metric("Last step", f"{int(steps[-1])}" if len(steps) else "–")
    c[3].metric("Tensors", f"{len(run.tensors)}")
    c[4].metric("Size on disk", human_bytes(run.size_bytes()))
    c = st.columns(5)
    c[0].metric("Dump steps", f"{len(run.steps)}")
    c[1].metric("Dropped", dropped_text(run.dropped), help="dumps and statistics steps the writers could not write")
    c[2].metric("Workers", plain(", ".join(run.workers)))
    c[3].metric("Format", f"v{plain(m.get('format_version'))}")
    c[4].metric("TensorFlow", plain(m.get("tensorflow_version") or "–"))
    st.caption(f"created {plain(m.get('created', '?'))}, updated {plain(m.get('updated', '?'))} "
               f"(viewer read it at {dt.datetime.now().strftime('%H:%M:%S')})")
    st.caption(nonfinite_text(data.first_nonfinite(ctx.path, ctx.sig), run.tensors))
    if run.status in STATUS_NOTES:
        st.warning(STATUS_NOTES[run.status])
    if run.tensors.empty:
        st.warning("This run's catalog is empty: the hook has not recorded any tensor yet.")
    elif not len(steps):
        st.warning("This run has no statistics yet (the hook writes them every few seconds while training).")

    left, right = st.columns([3, 2])
    with left:
        show_alerts(ctx)
    with right:
        loss_curve(ctx)

    left, right = st.columns(2)
    with left:
        st.subheader("Hook settings")
        cfg = run.config
        if cfg:
            st.dataframe(pd.DataFrame({"setting": list(cfg), "value": [str(v) for v in cfg.values()]}),
                         hide_index=True, width="stretch")
        else:
            st.caption("no hook settings recorded")
    with right:
        st.subheader("Tensors by op type")
        if not run.tensors.empty:
            counts = run.tensors["op_type"].value_counts().rename_axis("op type").reset_index(name="tensors")
            st.bar_chart(counts, x="op type", y="tensors", height=260)
    if not run.dropped.empty:
        st.subheader("Dropped writes")
        st.dataframe(run.dropped, hide_index=True, width="stretch")
    st.subheader("Sessions")
    st.caption("Each train/evaluate call or resume writes a session; a step two sessions recorded is "
               "shown from the later one.")
    st.dataframe(run.sessions, hide_index=True, width="stretch")


def nonfinite_text(first: dict | None, catalog: pd.DataFrame | None = None) -> str:
    """'First NaN/Inf: step 25, found by the statistics (forward of conv4/Relu:0), created at
    models.py:57 in conv_block' (Markdown-safe; the place where the catalog has it)."""
    if not first:
        return "First NaN/Inf: none seen (statistics and the hook's loss check)."
    source = NONFINITE_SOURCES.get(first.get("source"), first.get("source") or "the run")
    where = f"{first.get('kind')} of {first.get('tensor')}" if first.get("tensor") else "the loss"
    made = source_text(catalog, first.get("tensor")) if catalog is not None else None
    return (f"First NaN/Inf: step {int(first['step'])}, found by {plain(source)} ({plain(where)})"
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
    return [f"{plain(layer)}: filter(s) {', '.join(map(str, dead))} zero in every dumped sample at step "
            f"{steps[-1]} (mu pinned at (-1, -1)): dead, not tight part filters"
            for layer, dead in found.items() if dead]


def show_alerts(ctx: Ctx) -> None:
    """The run's alerts (``analysis.run_alerts``) and the viewer's dead-filter check."""
    st.subheader("Alerts")
    alerts = data.alerts(ctx.path, ctx.sig)
    dead = dead_filter_alerts(ctx)
    if alerts.empty and not dead:
        st.success("No alerts: no NaN/Inf, no dead ReLU, gradients within bounds, no dropped dumps.")
    for a in alerts.itertuples():
        text = f"{ICONS.get(a.severity, '')} **{plain(a.kind.replace('_', ' '))}**: {plain(a.message)}"
        {"error": st.error, "warning": st.warning}.get(a.severity, st.info)(text)
    for text in dead:
        st.warning(f"{ICONS['warning']} **dead filter**: {text}")


def loss_curve(ctx: Ctx) -> None:
    """The loss (the manifest's ``loss`` tensor, forward mean) over steps, or why there is none."""
    st.subheader("Loss")
    name, loss = data.loss_series(ctx.path, ctx.sig)
    if loss.empty:
        st.caption("No loss statistics: " + (f"the loss tensor {plain(name)} has no forward statistics in this view."
                                             if name else "the manifest names no loss tensor."))
        return
    st.line_chart(loss.rename("loss"), x_label="step", y_label="loss (mean)", height=260)
    st.caption(f"{plain(name)}, forward mean (group all); gaps: NaN/Inf")
