"""The training faults a run's statistics show before (or without) a NaN, each with the threshold
that judges it (:class:`SignalThresholds`, docs/guide/diagnose.md).

Every detector takes plain frames: ``stats`` (group ``all`` rows: step, tensor, kind and the
columns it names), the catalog, and where it needs one the op graph. They judge the steps they
are given; :mod:`inspector.analysis.diagnosis` hands them the last *finite* window (the steps
before the first NaN/Inf), so a run that ended in NaN is judged on what led there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from inspector.analysis.compare import update_ratios
from inspector.graph.origin import captured_ops, layer_of, nearest_captured
from inspector.format.loghist import ONE, bucket_edges
from inspector.graph.graphdef import OpGraph


@dataclass(frozen=True)
class SignalThresholds:
    """The thresholds of the detectors below. Every one is a documented knob.

    - ``update_ratio_high``: a weight matrix whose update L2 over its value L2 reaches this at a
      statistics step moves too far in one step (healthy SGD/Adam training sits near 1e-3 to
      1e-2); when most weight matrices do at once, the learning rate is too high.
    - ``diverging_share``: the share of weight matrices above ``update_ratio_high`` at one step
      that makes the finding "diverging" (the learning rate) rather than one layer's.
    - ``loss_rise``: the loss diverges once a finite value exceeds this many times its first.
    - ``loss_stall``: the loss stalls when its last value is within this fraction of its first
      after ``stall_steps`` statistics steps.
    - ``gradient_jump``: an op whose derivative is at most about 1 (identity, ReLU, tanh,
      sigmoid...) cannot make its input's gradient larger than its output's; this many times
      larger (median over the window) means a custom gradient or a bug multiplies it there.
    - ``saturated_share``: a tanh/sigmoid output with at least this share of its values in the
      log histogram's buckets at |x| >= 0.9375 (the bucket holding 0.99; for a sigmoid also
      below 2**-7), or a softmax with this share of its rows peaking there, is saturated: its
      gradient is ~0.
    - ``dead_share`` / ``dead_rise``: an op output (not a ReLU:
      :func:`~inspector.analysis.alerts.dead_relus` judges those) with at least ``dead_share``
      zeros, ``dead_rise`` above its input's share: the op kills units (a dropout given its keep
      probability as its rate).
    """
    update_ratio_high: float = 0.1
    diverging_share: float = 0.8
    loss_rise: float = 10.0
    loss_stall: float = 1e-3
    stall_steps: int = 10
    gradient_jump: float = 4.0
    saturated_share: float = 0.75
    dead_share: float = 0.9
    dead_rise: float = 0.3


@dataclass
class Finding:
    """One fault: its ``kind``, how sure (``severity`` error, warning or info), where (``layer``,
    ``op``, ``tensor``, ``step``), the ``evidence`` (numbers) and what to try (``advice``);
    ``page``: the viewer page that shows the evidence."""
    kind: str
    severity: str
    evidence: str
    advice: str = ""
    layer: str | None = None
    op: str | None = None
    tensor: str | None = None
    step: int | None = None
    page: str | None = None
    numbers: dict = field(default_factory=dict)


#: ops whose derivative is at most about 1 in magnitude (Selu: 1.05; Gelu: 1.13)
UNIT_DERIVATIVE = frozenset({"Identity", "IdentityN", "Snapshot", "Relu", "Relu6", "LeakyRelu",
                             "Elu", "Selu", "Tanh", "Sigmoid", "Softsign", "Softplus", "Gelu",
                             "Neg", "StopGradient"})
RELU_TYPES = frozenset({"Relu", "Relu6", "LeakyRelu", "Elu", "Selu"})
SATURATING = frozenset({"Tanh", "Sigmoid", "Softmax"})
#: the bucket holding 0.99 starts at 0.9375 (8 buckets per power of two)
SATURATION_BUCKET = ONE - 1


def rows_by_name(catalog: pd.DataFrame) -> dict[str, pd.Series]:
    """The catalog's rows by tensor name."""
    return {str(r["name"]): r for _, r in catalog.iterrows()}


def _series(stats: pd.DataFrame, kind: str, column: str) -> pd.DataFrame:
    """step x tensor of ``column`` for ``kind``."""
    df = stats[stats["kind"] == kind]
    if df.empty or column not in df:
        return pd.DataFrame()
    return df.pivot_table(index="step", columns="tensor", values=column, observed=True,
                          aggfunc="last")


#: variable names (their last part) that are offsets: they start at 0, so their update is a large
#: share of their value in healthy training (a multi-head attention's bias has two dimensions)
OFFSET_NAMES = frozenset({"bias", "beta", "b", "offset"})


def weight_matrices(catalog: pd.DataFrame) -> list[str]:
    """The variable records judged by the update-ratio detectors: those of two or more
    dimensions that are not offsets (OFFSET_NAMES)."""
    if "kind" not in catalog:
        return []
    var = catalog[catalog["kind"] == "variable"]
    shapes = var["shape"] if "shape" in var else pd.Series([None] * len(var), index=var.index)
    out = [str(n) for n, s in zip(var["name"], shapes)
           if isinstance(s, (list, tuple, np.ndarray)) and len(s) >= 2
           and str(n).rsplit("/", 1)[-1].split(":")[0] not in OFFSET_NAMES]
    return out or [str(n) for n in var["name"]]


def weighted_ops(catalog: pd.DataFrame, graph: OpGraph) -> set[str]:
    """The ops that take a variable's value as an input (a layer's MatMul, Conv2D, BiasAdd...)."""
    reads = {str(op)
             for op, v, k in zip(catalog["op"], catalog.get("variable", pd.Series(dtype=object)),
                                 catalog.get("kind", pd.Series(dtype=object)))
             if isinstance(v, str) and k != "variable"}
    reads |= {n for n, node in graph.nodes.items() if node.op in ("ReadVariableOp", "VariableV2")}
    return {c for r in reads for c in graph.consumers.get(r, [])}


def feeds_a_layer(graph: OpGraph, op: str, weighted: set[str], limit: int = 400) -> bool:
    """True if ``op``'s output reaches an op with weights downstream: a hidden activation, whose
    saturation or zeros starve the layers that learn from it. A model's output (its
    probabilities) and the loss's own ops reach none."""
    seen, todo = {op}, list(graph.consumers.get(op, []))
    while todo and len(seen) < limit:
        name = todo.pop()
        if name in weighted:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph.consumers.get(name, []))
    return False


def update_findings(stats: pd.DataFrame, catalog: pd.DataFrame,
                    th: SignalThresholds) -> list[Finding]:
    """Frozen weights (update exactly 0 at every step, gradient not), and updates too large
    for one layer, or for most of them at once (diverging: the learning rate)."""
    meta = rows_by_name(catalog)
    upd, grad = _series(stats, "update", "l2"), _series(stats, "gradient", "l2")
    if upd.empty:
        return []
    out: list[Finding] = []
    for v in upd.columns:
        u = upd[v].dropna()
        g = grad[v].dropna() if v in grad else pd.Series(dtype=float)
        if len(u) >= 2 and (u == 0).all() and (g > 0).any():
            row = meta.get(str(v), {"name": v})
            out.append(Finding("frozen", "error", f"{v}: its update is exactly 0 at all {len(u)} "
                               f"statistics steps ({int(u.index.min())}..{int(u.index.max())}) "
                               f"while its gradient is not (L2 {float(g.median()):.3g})",
                               "the optimizer does not apply this variable's gradient: is it left "
                               "out of var_list, or its layer set trainable=False?", layer_of(row),
                               tensor=str(v), step=int(u.index.min()), page="overview"))
    ratios = update_ratios(stats, catalog)
    judged = [v for v in weight_matrices(catalog) if v in ratios.columns]
    if not judged:
        return out
    ratio = ratios[judged].replace([np.inf, -np.inf], np.nan)
    high = ratio >= th.update_ratio_high
    share = high.sum(axis=1) / max(len(judged), 1)
    wide = share[share >= th.diverging_share]
    if len(wide):
        step = int(wide.index[0])
        r = ratio.loc[step]
        out.append(Finding("diverging", "error", f"at step {step} the update of "
                           f"{int(high.loc[step].sum())} of {len(judged)} weight matrices is "
                           f"{float(r.min()):.2g}-{float(r.max()):.2g} of their value "
                           f"(update/weight L2; at or above {th.update_ratio_high:g}, where "
                           "healthy training sits near 1e-3 to 1e-2)",
                           "the learning rate is too high from this step on (a schedule's jump, a "
                           "warm-up that ended): lower it, or clip gradients", None, step=step,
                           page="overview",
                           numbers={"ratios": {str(k): float(x) for k, x in r.items()}}))
        return out
    for v in judged:
        hits = ratio[v][high[v]]
        if len(hits):
            row = meta.get(str(v), {"name": v})
            step = int(hits.index[0])
            out.append(Finding("update_ratio_high", "warning", f"{v}: its update is "
                               f"{float(hits.iloc[0]):.2g} of its value at step {step} "
                               f"(update/weight L2 >= {th.update_ratio_high:g}; the run's other "
                               "weight matrices: median "
                               f"{float(ratio.drop(columns=[v]).median().median()):.2g})",
                               "this layer's weights move too far in one step: a larger gradient "
                               "than its neighbours' (see its gradient), or a per-layer learning "
                               "rate", layer_of(row), tensor=str(v), step=step, page="overview"))
    return out


def loss_findings(loss: pd.Series, th: SignalThresholds) -> list[Finding]:
    """The loss (its forward mean by step) diverging far above its first value, or stalled."""
    finite = loss[np.isfinite(loss)]
    if len(finite) < 2:
        return []
    first = float(finite.iloc[0])
    base = max(abs(first), 1e-12)
    up = finite[finite > th.loss_rise * base]
    if len(up):
        step = int(up.index[0])
        return [Finding("loss_diverges", "error", f"the loss rose from {first:.4g} (step "
                        f"{int(finite.index[0])}) to {float(up.iloc[0]):.4g} at step {step}, over "
                        f"{th.loss_rise:g}x its first value",
                        "training diverged: lower the learning rate, clip gradients, or look for "
                        "the layer the other findings name", step=step, page="summary")]
    if len(finite) >= th.stall_steps \
            and abs(float(finite.iloc[-1]) - first) <= th.loss_stall * base:
        return [Finding("loss_stalls", "info", f"the loss is {float(finite.iloc[-1]):.4g} at step "
                        f"{int(finite.index[-1])}, within {th.loss_stall:g} of its first value "
                        f"{first:.4g}",
                        "nothing is learned: a learning rate of 0, frozen layers, or labels the "
                        "model cannot see", step=int(finite.index[-1]), page="summary")]
    return []


def _producer_tensors(graph: OpGraph, op: str, captured: set[str],
                      tensor_of_op: dict[str, str]) -> list[str]:
    return sorted(tensor_of_op[p] for p in nearest_captured(graph, op, captured, up=True)
                  if p in tensor_of_op)


#: the name scope of the ops the hooks add to a graph
HOOK_SCOPE = "tf_inspector/"
#: ops that pass their input through unchanged (walked back to the tensor whose gradient is
#: recorded)
PASS_THROUGH = frozenset({"Identity", "Snapshot", "IdentityN"})


def _gradient_source(graph: OpGraph, op: str, grad: set[str], tensor_of_op: dict[str, str],
                     captured: set[str]) -> str | None:
    """The tensor whose gradient is ``op``'s output's gradient times ``op``'s derivative: its
    first data input, walked back through pass-through ops without a recorded gradient. None
    where that tensor's gradient may also come from elsewhere (another consumer on the loss's
    path, or one whose gradient is not recorded)."""
    chain = {op}
    src = graph.producers(op)[0] if graph.producers(op) else None
    while src is not None and tensor_of_op.get(src) not in grad:
        if src not in graph.nodes or graph.nodes[src].op not in PASS_THROUGH \
                or not graph.producers(src):
            return None
        chain.add(src)
        src = graph.producers(src)[0]
    if src is None:
        return None
    for c in graph.consumers.get(src, []):
        if c not in chain and not _hook_op(c) \
                and (c not in captured or tensor_of_op.get(c) in grad):
            return None
    return tensor_of_op[src]


def _hook_op(name: str) -> bool:
    """An op the hooks added (their statistics and dump reads): never on the loss's path."""
    return name.startswith(HOOK_SCOPE) or f"/{HOOK_SCOPE}" in name


def gradient_jump_findings(stats: pd.DataFrame, catalog: pd.DataFrame, graph: OpGraph | None,
                           th: SignalThresholds) -> list[Finding]:
    """Ops whose derivative is at most ~1 (UNIT_DERIVATIVE) whose input's gradient is
    ``th.gradient_jump`` times their output's or more: something multiplies the gradient there.
    The input must reach the loss through this op alone (else its gradient sums several)."""
    if graph is None:
        return []
    grad = _series(stats, "gradient", "l2")
    if grad.empty:
        return []
    captured, tensor_of_op = captured_ops(catalog, graph)
    recorded = set(map(str, grad.columns))
    out = []
    for _, row in catalog.iterrows():
        name, op = str(row["name"]), row["op"]
        if not name.endswith(":0") or row.get("op_type") not in UNIT_DERIVATIVE \
                or name not in recorded or op not in graph.nodes:
            continue
        source = _gradient_source(graph, op, recorded, tensor_of_op, captured)
        if source is None:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            r = (grad[source] / grad[name]).replace([np.inf, -np.inf], np.nan).dropna()
        if len(r) and float(r.median()) >= th.gradient_jump:
            out.append(Finding("gradient_jump", "error", "the gradient grows "
                               f"{float(r.median()):.3g}x across {op} ({row['op_type']}, an op "
                               "whose derivative is at most ~1): d loss / d "
                               f"{source} has L2 {float(grad[source].median()):.3g}, d loss / d "
                               f"{name} {float(grad[name].median()):.3g} (median over steps "
                               f"{int(r.index.min())}..{int(r.index.max())})",
                               "a custom gradient or gradient hook multiplies the gradient here; "
                               "every layer before it trains on amplified gradients and diverges",
                               layer_of(row), str(op), name, int(r.index.min()), "graph",
                               {"factor": float(r.median()), "input": source}))
    return sorted(out, key=lambda f: -f.numbers["factor"])


def _last_dim(row: pd.Series | dict) -> int | None:
    shape = row.get("shape")
    if isinstance(shape, (list, tuple, np.ndarray)) and len(shape) \
            and isinstance(shape[-1], (int, np.integer)):
        return int(shape[-1])
    return None


def _flat_share(op_type: str, buckets, counts, classes: int | None) -> float | None:
    """The share of a saturating op's outputs at its flat ends, from one histogram row: values
    in the bucket holding 0.99 or above (tanh: either sign; sigmoid: also below 2**-7); for a
    softmax over ``classes`` values, the share of its rows whose top value is there (the values
    there times ``classes``; None without a known ``classes``)."""
    b, c = np.asarray(buckets, np.int64), np.asarray(counts, np.float64)
    flat = np.abs(b) >= SATURATION_BUCKET
    if op_type == "Sigmoid":
        lo, _ = bucket_edges(np.abs(b))
        flat |= (b >= 0) & (lo < 2.0 ** -7)
    share = float(c[flat].sum() / c.sum())
    if op_type == "Softmax":
        return min(1.0, share * classes) if classes else None
    return share


def saturation_findings(stats: pd.DataFrame, catalog: pd.DataFrame, th: SignalThresholds,
                        graph: OpGraph | None = None) -> list[Finding]:
    """Hidden tanh/sigmoid/softmax outputs (on the loss's path, feeding a layer with weights
    where the graph says) whose values sit at the flat ends (from the log histograms): for a
    softmax, rows whose top value is ~1 (one-hot attention). A confident model's output
    probabilities sit there by design."""
    if "hist_bucket" not in stats:
        return []
    weighted = weighted_ops(catalog, graph) if graph is not None else set()
    meta = rows_by_name(catalog)
    out = []
    fwd = stats[(stats["kind"] == "forward")]
    for name, rows in fwd.groupby("tensor", observed=True):
        row = meta.get(str(name))
        if row is None or row.get("op_type") not in SATURATING or row.get("has_gradient") is False \
                or graph is not None and not feeds_a_layer(graph, str(row["op"]), weighted):
            continue
        shares = [_flat_share(str(row["op_type"]), b, c, _last_dim(row))
                  for b, c in zip(rows["hist_bucket"], rows["hist_count"])
                  if b is not None and c is not None and len(c)]
        shares = [x for x in shares if x is not None]
        if shares and float(np.median(shares)) >= th.saturated_share:
            out.append(Finding("saturated", "warning",
                               f"{name}: {float(np.median(shares)):.0%} of its "
                               f"{'rows peak' if row['op_type'] == 'Softmax' else 'values are'} "
                               f"at the flat ends of the {row['op_type'].lower()} (|x| >= 0.94; "
                               f"median over {len(shares)} steps), where its derivative is ~0",
                               "its inputs are too large: normalise the inputs, lower the initial "
                               "weights, or add normalisation before it", layer_of(row),
                               str(row["op"]), str(name), int(rows["step"].min()), "distributions"))
    return out


def dead_unit_findings(stats: pd.DataFrame, catalog: pd.DataFrame, graph: OpGraph | None,
                       th: SignalThresholds) -> list[Finding]:
    """Hidden op outputs (beyond ReLUs; feeding a layer with weights) that are mostly zeros, far
    more than their inputs."""
    if graph is None:
        return []
    zf = _series(stats, "forward", "zero_fraction")
    if zf.empty:
        return []
    med = zf.median()
    weighted = weighted_ops(catalog, graph)
    captured, tensor_of_op = captured_ops(catalog, graph)
    out = []
    for _, row in catalog.iterrows():
        name = str(row["name"])
        if name not in med or med[name] < th.dead_share or row.get("op_type") in RELU_TYPES \
                or not bool(row.get("batched", True)) or not bool(row.get("has_gradient", True)):
            continue
        ins = [t for t in _producer_tensors(graph, row["op"], captured, tensor_of_op) if t in med]
        # the loss's own ops: structural zeros
        if not ins or not feeds_a_layer(graph, str(row["op"]), weighted):
            continue
        before = float(max(med[t] for t in ins))
        if med[name] >= before + th.dead_rise:
            out.append(Finding("dead_units", "warning",
                               f"{name}: {float(med[name]):.0%} of its values are zero "
                               f"(median over {int(zf[name].notna().sum())} steps), against "
                               f"{before:.0%} in its input {max(ins, key=lambda t: med[t])}",
                               "this op zeroes most units: a dropout given its keep probability as "
                               "its rate (rate=0.9 drops 90%), or a mask that is almost all zeros",
                               layer_of(row), str(row["op"]), name, int(zf.index.min()),
                               "overview"))
    return out


def group_findings(counts: pd.DataFrame, groups: list[str]) -> list[Finding]:
    """A sample group that never had a sample, or that holds every sample: labels all one
    class, or a rule that does not split them. ``counts``: step x group of row counts (group
    ``all`` included), from the forward rows."""
    if "all" not in counts or counts["all"].sum() == 0:
        return []
    out = []
    for g in groups:
        if g == "all":
            continue
        n = counts[g] if g in counts else pd.Series(0, index=counts.index)
        if (n.fillna(0) == 0).all():
            out.append(Finding("empty_group", "warning", f"group {g!r} has no sample at any of "
                               f"{len(counts)} statistics steps",
                               "the labels are all one class (or the group rule never matches): "
                               "check the labels the hook reads, or pass positive= / groups=",
                               step=int(counts.index.min()), page="summary"))
        elif len(counts) >= 2 and (n.fillna(0) == counts["all"]).all():
            out.append(Finding("constant_group", "warning", f"group {g!r} holds every sample at "
                               "every statistics step: the other groups are empty",
                               "the labels are all one class (or the group rule matches "
                               "everything)", step=int(counts.index.min()), page="summary"))
    return out
