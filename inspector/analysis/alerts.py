"""Offline analysis of a run with numpy/pandas: alerts, positive-vs-negative comparisons, ICNN
maths.

Everything here takes plain DataFrames / arrays (as returned by :class:`inspector.Run`), so it
works in notebooks, in the viewer and in tests alike. No TensorFlow.

Example::

    import inspector
    from inspector import analysis
    run = inspector.open_run("runs/exp1")
    alerts = analysis.run_alerts(run)                 # list[Alert], most severe first
    analysis.alerts_frame(alerts)                     # as a DataFrame
    analysis.group_contrast(run.query_stats(kinds=["forward"]), "mean")
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pandas as pd

from inspector.format.manifest import source_where

if TYPE_CHECKING:  # a Run is only read (by _beta_stats): no import of the reader here
    from inspector.run import Run


SEVERITIES = ("error", "warning", "info")


#: Ops whose first output is a layer's activations (or pre-activations): the gradients that
#: vanishing/exploding alerts compare. Variable reads, biases, batch-norm statistics, losses
#: and shape plumbing have gradients on other scales and are left out.
LAYER_OP_TYPES = frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "MatMul", "BatchMatMul",
    "BatchMatMulV2", "BatchMatMulV3", "BiasAdd", "Add", "AddV2", "Relu", "Relu6", "Elu", "Selu",
    "LeakyRelu", "Softplus", "Tanh", "Sigmoid", "Gelu", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "MaxPool", "AvgPool",
})


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds. Every one is a documented knob; defaults suit float32 training.

    - ``dead_zero_fraction``: a ReLU whose forward ``zero_fraction`` is at least this over the
      last ``window`` statistics steps is "dead" (almost no unit ever fires).
    - ``vanishing_l2``: a gradient whose L2 norm (median over the window) is below this vanishes.
      The gradient thresholds judge layer outputs only (:func:`layer_outputs`).
    - ``exploding_l2``: a gradient whose L2 norm (median over the window) is above this explodes.
    - ``layer_ratio``: the largest over the smallest non-zero gradient L2 across tensors at one
      step; above it, gradients vanish/explode *across depth* even if each looks fine alone.
    - ``window``: how many of the last statistics steps the medians above use.
    """
    dead_zero_fraction: float = 0.99
    vanishing_l2: float = 1e-7
    exploding_l2: float = 1e3
    layer_ratio: float = 1e4
    window: int = 10


@dataclass(frozen=True)
class Alert:
    """One finding: how bad, what kind, a readable message, and where (step/tensor) if known."""
    severity: str
    kind: str
    message: str
    step: int | None = None
    tensor: str | None = None


def alerts_frame(alerts: Iterable[Alert]) -> pd.DataFrame:
    """Alerts as a DataFrame (columns severity, kind, message, step, tensor)."""
    return pd.DataFrame([asdict(a) for a in alerts],
                        columns=["severity", "kind", "message", "step", "tensor"])


def _last_window(stats: pd.DataFrame, window: int) -> pd.DataFrame:
    steps = np.sort(stats["step"].unique())
    return stats[stats["step"] >= steps[-min(window, len(steps))]] if len(steps) else stats


#: ``Run.first_nonfinite()['source']`` in words.
NONFINITE_SOURCES = {"statistics": "the statistics",
                     "loss check": "the hook's every-step loss check"}


def source_text(catalog: pd.DataFrame, tensor: str | None) -> str | None:
    """Where the user's code created ``tensor``'s op (catalog ``source_*``, FORMAT.md), or None.

    >>> cat = pd.DataFrame({"source_file": ["m.py"], "source_line": [57],
    ...                     "source_function": ["block"]}, index=["a:0"])
    >>> source_text(cat, "a:0")
    'm.py:57 in block'
    """
    if tensor is None or "source_file" not in catalog or tensor not in catalog.index:
        return None
    return source_where(catalog.loc[tensor])


def nonfinite_alert(first: dict | None, catalog: pd.DataFrame | None = None) -> list[Alert]:
    """Alert for the first NaN/Inf (``Run.first_nonfinite()``'s result), or nothing; with the
    ``catalog``, where the user's code created that tensor's op."""
    if not first:
        return []
    if first.get("text"):   # the origin (Run.first_nonfinite walked the graph): its own sentence
        return [Alert("error", "nonfinite", f"first non-finite value: {first['text']}"
                      + rerun_text(first), first["step"], first.get("tensor"))]
    made = source_text(catalog, first.get("tensor")) if catalog is not None else None
    what = ", ".join(f"{first[k]} {k.upper() if k == 'nan' else 'Inf'}" for k in ("nan", "inf")
                     if first.get(k))
    source = str(first.get("source") or "the run")
    source = NONFINITE_SOURCES.get(source, source)
    return [Alert("error", "nonfinite", f"first non-finite value at step {first['step']} (seen by "
                  f"{source}): {first.get('kind')} of {first.get('tensor')}"
                  + (f" ({what})" if what else "")
                  + (f", created at {made}" if made else "") + rerun_text(first),
                  first["step"], first.get("tensor"))]


def rerun_text(first: dict) -> str:
    """'; seen by session 1, whose step session 2 ran again: ...' for evidence whose step a later
    session re-ran (``Run.nonfinite_evidence``'s ``rerun_by``): the rows the reader shows at that
    step are the later session's, which may well be finite. '' otherwise.

    >>> text = rerun_text({"session": 1, "rerun_by": 2})
    >>> text.startswith("; seen by session 1, whose step session 2 ran again (the rows shown at")
    True
    >>> text.endswith("that step are session 2's)")
    True
    """
    if first.get("rerun_by") is None:
        return ""
    return (f"; seen by session {first.get('session')}, whose step session {first['rerun_by']} ran "
            f"again (the rows shown at that step are session {first['rerun_by']}'s)")


def dead_relus(stats: pd.DataFrame, catalog: pd.DataFrame,
               th: Thresholds = Thresholds()) -> list[Alert]:
    """ReLU outputs whose zero fraction stays >= ``th.dead_zero_fraction`` over the last window.

    >>> # stats: columns step, tensor, kind, group, zero_fraction; catalog: name, op_type
    """
    df = _relu_rows(stats, catalog)
    if df.empty:
        return []
    zf = _last_window(df, th.window).groupby("tensor", observed=True)["zero_fraction"].min()
    dead = zf[zf >= th.dead_zero_fraction]
    return [Alert("warning", "dead_relu", f"{t}: {zf[t]:.1%} of activations are zero over the last "
                  f"{th.window} steps (dead ReLU)", int(df["step"].max()), str(t))
            for t in dead.index]


def _relu_tensors(catalog: pd.DataFrame) -> set[str]:
    return set(catalog.loc[catalog["op_type"].astype(str).str.contains("Relu", na=False), "name"])


def _relu_rows(stats: pd.DataFrame, catalog: pd.DataFrame) -> pd.DataFrame:
    """The rows :func:`dead_relus` judges: forward, group all, of ReLU outputs."""
    relu = _relu_tensors(catalog)
    return stats[(stats["kind"] == "forward") & (stats["group"] == "all")
                 & stats["tensor"].isin(relu)]


def _gradient_rows(stats: pd.DataFrame, catalog: pd.DataFrame | None) -> pd.DataFrame:
    """The rows :func:`gradient_alerts` judges: gradient, group all, of layer outputs (with a
    catalog)."""
    df = stats[(stats["kind"] == "gradient") & (stats["group"] == "all")]
    if catalog is not None and not catalog.empty:
        df = df[df["tensor"].isin(layer_outputs(catalog))]
    return df


def layer_outputs(catalog: pd.DataFrame) -> set[str]:
    """Names of the tensors whose gradients the gradient alerts compare: the first output of a
    layer op (``LAYER_OP_TYPES``) that carries the batch, is no variable record, and whose
    gradient is not ~0 by construction (``zero_gradient_expected``: a bias before batch norm).

    >>> cat = pd.DataFrame({"name": ["c/Conv2D:0", "c/ReadVariableOp:0", "bn:1"], "batched": True,
    ...                     "op_type": ["Conv2D", "ReadVariableOp", "FusedBatchNormV3"]})
    >>> sorted(layer_outputs(cat))
    ['c/Conv2D:0']
    """
    def col(name: str, default) -> pd.Series:
        values = catalog[name] if name in catalog else pd.Series(default, index=catalog.index)
        return values.where(values.notna(), default)

    names = catalog["name"].astype(str)
    keep = (col("op_type", "").isin(LAYER_OP_TYPES) & names.str.endswith(":0")
            & col("batched", True).astype(bool) & (col("kind", "tensor") != "variable")
            & ~col("zero_gradient_expected", False).astype(bool))
    return set(names[keep])


def gradient_alerts(stats: pd.DataFrame, th: Thresholds = Thresholds(),
                    catalog: pd.DataFrame | None = None) -> list[Alert]:
    """Vanishing / exploding gradients, per tensor and as a ratio across tensors (layers).

    Uses the gradient L2 norm of group ``all``; medians over the last ``th.window`` steps make
    one noisy step harmless. Tensors with an exactly-zero gradient (e.g. dead ReLUs, reported
    elsewhere) are left out of the vanishing test and of the ratio. With a ``catalog``, only
    :func:`layer_outputs` are judged, so like is compared with like (a weight-decay read's or a
    BN-fed bias's tiny gradient is not a vanishing gradient).
    """
    df = _gradient_rows(stats, catalog)
    if df.empty:
        return []
    win = _last_window(df, th.window)
    last = int(win["step"].max())
    med = win.groupby("tensor", observed=True)["l2"].median().dropna()
    out: list[Alert] = []
    for t, v in med.items():
        if 0 < v < th.vanishing_l2:
            out.append(Alert("warning", "vanishing_gradient",
                             f"{t}: gradient L2 {v:.2e} < {th.vanishing_l2:g} "
                             f"(median of the last {th.window} steps)", last, str(t)))
        elif v > th.exploding_l2:
            out.append(Alert("error", "exploding_gradient",
                             f"{t}: gradient L2 {v:.2e} > {th.exploding_l2:g} "
                             f"(median of the last {th.window} steps)", last, str(t)))
    pos = med[(med > 0) & np.isfinite(med)]
    if len(pos) >= 2 and pos.max() / pos.min() > th.layer_ratio:
        lo, hi = pos.idxmin(), pos.idxmax()
        out.append(Alert("warning", "gradient_ratio",
                         f"gradient L2 spans {pos.max() / pos.min():.1e}x across "
                         f"tensors (> {th.layer_ratio:g}): smallest {lo} ({pos.min():.1e}), "
                         f"largest {hi} ({pos.max():.1e})", last, str(lo)))
    return out


#: what a dropped record counts, and the alert's kind when only that was dropped
DROPPED = {"dump": ("dump(s)", "dropped_dumps"),
           "stats": ("statistics step(s)", "dropped_statistics")}


def dropped_alerts(dropped: pd.DataFrame) -> list[Alert]:
    """One alert summarising what the writers dropped (``Run.dropped``: aggregated records), of
    kind ``dropped_dumps`` or ``dropped_statistics`` when only that was dropped, else
    ``dropped_data``.

    >>> a = dropped_alerts(pd.DataFrame({"what": ["stats"], "reason": ["write error: disk full"],
    ...                                  "count": [3], "first_step": [10], "last_step": [30]}))[0]
    >>> a.kind
    'dropped_statistics'
    >>> a.message.startswith("3 statistics step(s) dropped: write error: disk full (3 statistics")
    True
    """
    if dropped is None or dropped.empty:
        return []
    reasons = "; ".join(f"{r.reason} ({int(r.count)} "
                        f"{DROPPED.get(r.what, (f'{r.what} record(s)',))[0]}, steps "
                        f"{r.first_step}..{r.last_step})" for r in dropped.itertuples())
    first = dropped["first_step"].dropna()
    whats = set(dropped["what"])
    kind = DROPPED[next(iter(whats))][1] if len(whats) == 1 and whats <= set(DROPPED) \
        else "dropped_data"
    return [Alert("warning", kind, f"{dropped_text(dropped)} dropped: {reasons}",
                  int(first.min()) if len(first) else None)]


def dropped_text(dropped: pd.DataFrame) -> str:
    """What ``Run.dropped`` counts, by what it is: a dump record counts dump files, a stats
    record statistics steps.

    >>> dropped_text(pd.DataFrame({"what": ["dump", "stats", "stats"], "count": [2, 3, 4]}))
    '2 dump(s), 7 statistics step(s)'
    """
    if dropped is None or dropped.empty:
        return "0 dump(s)"
    counts = dropped.groupby("what")["count"].sum()
    order = [w for w in DROPPED if w in counts] \
        + sorted(w for w in counts.index if w not in DROPPED)
    return ", ".join(f"{int(counts[w])} {DROPPED[w][0] if w in DROPPED else f'{w} record(s)'}"
                     for w in order)


def groups_refused_alerts(refused: pd.DataFrame) -> list[Alert]:
    """One warning per session whose group rule was broken (``Run.groups_refused``): its
    groups' rows are missing from those steps on purpose, not lost."""
    return [Alert("warning", "groups_refused",
                  f"{r.worker} session {r.session} ({r.mode}): " + (
                      f"{int(r.steps)} statistics step(s), {r.first_step}..{int(r.last_step)}, "
                      if pd.notna(r.steps) and pd.notna(r.last_step)
                      else f"from step {r.first_step}, statistics steps ")
                  + f"whose samples broke the group rule have group 'all' only ({r.why})",
                  int(r.first_step))
            for r in refused.itertuples()]


def error_alerts(errors: pd.DataFrame, sessions: pd.DataFrame) -> list[Alert]:
    """Write errors, hook errors and sessions that ended with an error or crashed: errors."""
    out = [Alert("error", "writer_error", f"{r.what}: {r.reason} ({int(r.count)}x)"
                 + (f", steps {r.first_step}..{r.last_step}" if pd.notna(r.first_step) else ""),
                 int(r.first_step) if pd.notna(r.first_step) else None)
           for r in errors.itertuples()]
    for r in sessions.itertuples():
        if r.state in ("failed", "crashed"):
            out.append(Alert("error", f"session_{r.state}",
                             f"{r.worker} session {r.session} ({r.mode}) {r.state}"
                             + (f": {r.error}" if isinstance(r.error, str) and r.error else ""),
                             int(r.last_step) if pd.notna(r.last_step) else None))
    return out


#: Every target of ICNN's beta lies here (the release's ``min(max(3 ./ t, 1.5), 3)``).
ICNN_BETA_RANGE = (1.5, 3.0)


def icnn_beta_alerts(stats: pd.DataFrame, catalog: pd.DataFrame) -> list[Alert]:
    """ICNN beta that left its targets' range: an update overshooting its target (step > 1).

    Reads the forward ``min``/``max`` of each tensor with ``icnn_role == "beta"``. The range is
    ``[min(1.5, first min), max(3.0, first max)]`` (a beta started outside [1.5, 3] may sit
    there). An update with a step below 1 never leaves it. Oscillation around the target
    within the range is only visible to the layer's own watch (the log), not in statistics
    sampled every few steps.

    >>> cat = pd.DataFrame({"name": ["m/beta_value:0"], "icnn_role": ["beta"], "icnn_layer": ["m"]})
    >>> st = pd.DataFrame({"step": [0, 5], "tensor": "m/beta_value:0", "kind": "forward",
    ...                    "group": "all", "min": [2.0, -3.3], "max": [2.0, 11.7]})
    >>> [a.kind for a in icnn_beta_alerts(st, cat)]
    ['icnn_beta_diverged']
    """
    if "icnn_role" not in catalog or not {"min", "max"} <= set(stats.columns):
        return []
    names = set(catalog.loc[catalog["icnn_role"] == "beta", "name"])
    df = stats[(stats["kind"] == "forward") & (stats["group"] == "all")
               & stats["tensor"].isin(names)]
    out = []
    for tensor, rows in df.sort_values("step").groupby("tensor", observed=True):
        low = min(ICNN_BETA_RANGE[0], float(rows["min"].iloc[0]))
        high = max(ICNN_BETA_RANGE[1], float(rows["max"].iloc[0]))
        bad = rows[~((rows["min"] >= low) & (rows["max"] <= high))]   # NaN counts as bad
        if bad.empty:
            continue
        first = bad.iloc[0]
        out.append(Alert("error", "icnn_beta_diverged",
                         f"{tensor}: ICNN beta left [{low:g}, {high:g}] (the range of its targets) "
                         f"at step {int(first['step'])} (min {first['min']:.3g}, max "
                         f"{first['max']:.3g}): its update overshoots (with SGD, lr * 0.05 * 1e4 / "
                         "batch > 1), so masks leave [-1, 1]. Lower the learning rate or use "
                         "conv_mask(beta_update='stable').",
                         int(first["step"]), str(tensor)))
    return out


def _beta_stats(run: "Run") -> pd.DataFrame:
    """The rows :func:`icnn_beta_alerts` judges (every step of the ICNN betas only)."""
    cat = run.tensors
    names = sorted(set(cat.loc[cat["icnn_role"] == "beta", "name"])) if "icnn_role" in cat else []
    if not names:
        return pd.DataFrame(columns=["step", "tensor", "kind", "group", "min", "max"])
    return run.query_stats(names, kinds=["forward"], groups=["all"], columns=["min", "max"])
