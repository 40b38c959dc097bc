"""What went wrong, where and when: the run's findings, the most likely culprit first.

``diagnose(run)`` reads what it needs (the rows of the first non-finite step, the last finite
window of statistics steps, the loss, the update rows, the group counts) and asks each detector
(:mod:`inspector.graph.origin`, :mod:`inspector.analysis.signals`, the gradient and ReLU
alerts of :mod:`inspector.analysis.alerts`). The ranking puts first what explains the others:

1. the origin of the first NaN/Inf, where it is an op (forward, backward, the input data) and
   nothing before it already went wrong;
2. what multiplies gradients (a jump across one op), frozen weights;
3. exploding/vanishing layers before the NaN, updates too large (one layer; most of them: the
   learning rate), a loss that diverged;
4. the origin when it only shows weights already non-finite (a consequence of 2-3);
5. saturated tanh/sigmoid layers, ops that kill units, dead ReLUs, empty groups; a stalled loss.

Example::

    from inspector import open_run
    from inspector.analysis import diagnose, diagnosis_text
    findings = diagnose(open_run("runs/exp1"))
    print(diagnosis_text(findings))       # the paragraph `python -m inspector info` prints
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from inspector.analysis import alerts, signals
from inspector.analysis.alerts import Thresholds, dead_relus, gradient_alerts
from inspector.graph.origin import Origin
from inspector.analysis.signals import Finding, SignalThresholds, layer_of
from inspector.errors import InspectorError
from inspector.graph.graphdef import OpGraph

if TYPE_CHECKING:
    from inspector.run import Run

#: what to try, by where the first NaN/Inf was born
ORIGIN_ADVICE = {
    "forward": "guard the op's input (a log or sqrt of a non-positive value, a division by zero, "
               "an overflow): clip it, add an epsilon, or compute it in a stabler form",
    "backward": "the op's gradient is infinite at its input (sqrt or norm at 0, log at 0, pow with "
                "a negative exponent): add an epsilon inside it or use a safe form (tf.norm of x + "
                "eps, tf.math.xlogy)",
    "input": "the training data holds NaN/Inf: check the input pipeline (a division by zero in "
             "preprocessing, a missing value)",
    "weights": "an update made the weights non-finite before this step: see the findings below for "
               "what grew (gradients, update sizes); statistics on every step "
               "(stats_every_n_steps=1) show the step",
}
#: ranks of finding kinds (lower first); the origin's rank depends on what preceded it
RANK = {"nonfinite": 0, "gradient_jump": 1, "frozen": 2, "exploding_gradient": 3, "diverging": 4,
        "loss_diverges": 5, "update_ratio_high": 13, "nonfinite_weights": 9, "nonfinite_after": 9,
        "saturated": 10, "dead_units": 11, "dead_relu": 12, "vanishing_gradient": 13,
        "gradient_ratio": 14, "empty_group": 15, "constant_group": 15, "loss_stalls": 20}
SEVERITIES = ("error", "warning", "info")


def origin_finding(o: Origin) -> Finding:
    kind = "nonfinite_weights" if o.where == "weights" else "nonfinite"
    return Finding(kind, "error", o.text(), ORIGIN_ADVICE[o.where], o.layer, o.op, o.tensor, o.step,
                   "graph" if o.where in ("forward", "backward") else "summary",
                   {"where": o.where, "loss_check_step": o.loss_check_step, "source": o.source})


def _graph(run: "Run", worker: str | None = None, session: int | None = None) -> OpGraph | None:
    """``run.op_graph`` (the origin's, parsed once), or None where the session has none."""
    try:
        return run.op_graph(worker, session)
    except (OSError, InspectorError, KeyError):
        return None


def _steps(run: "Run") -> np.ndarray:
    try:
        return np.asarray(run.stats_steps(), np.int64)
    except InspectorError:
        return np.zeros(0, np.int64)


def _window_steps(steps: np.ndarray, bad_step: int | None, window: int) -> list[int]:
    """The last ``window`` statistics steps before ``bad_step`` (the run's last ones when
    ``bad_step`` is None)."""
    finite = steps[steps < bad_step] if bad_step is not None else steps
    return [int(x) for x in finite[-window:]]


def _loss_series(run: "Run", first: int | None, window: pd.DataFrame) -> pd.Series:
    """The loss's forward mean at the ``first`` statistics step (its baseline, read apart: one
    query spanning it and the window would open every part in between) and in the ``window``'s
    rows."""
    names = {str(m["loss"]) for m in run.manifests.values() if isinstance(m.get("loss"), str)}
    names &= set(run.tensors["name"])
    if not names:
        return pd.Series(dtype=float)
    name = sorted(names)[0]
    rows = [window[(window["tensor"] == name) & (window["kind"] == "forward")][["step", "mean"]]] \
        if not window.empty and "mean" in window else []
    if first is not None and (window.empty or first not in set(window["step"])):
        rows.append(run.query_stats([name], groups=["all"], kinds=["forward"], columns=["mean"],
                                    at_steps=[first]))
    rows = [r[["step", "mean"]] for r in rows if not r.empty]
    if not rows:
        return pd.Series(dtype=float)
    return pd.concat(rows).drop_duplicates("step").set_index("step")["mean"].sort_index()


def _group_counts(run: "Run", steps: list[int]) -> pd.DataFrame:
    """step x group of how many forward rows each group has (group ``all`` included)."""
    if not steps:
        return pd.DataFrame()
    df = run.query_stats(at_steps=steps, kinds=["forward"], columns=[])
    if df.empty:
        return pd.DataFrame()
    return df.groupby(["step", "group"], observed=True).size().unstack("group").fillna(0)


def _declared_groups(run: "Run") -> list[str]:
    """The groups a session's rule declared (its manifest's ``groups``): without a rule (no
    labels) no group is expected, so none can be empty."""
    names: list[str] = []
    for m in run.manifests.values():
        g = m.get("groups")
        if isinstance(g, dict) and isinstance(g.get("names"), list):
            names += [str(n) for n in g["names"] if str(n) not in names]
    return names


def _alert_findings(stats: pd.DataFrame, catalog: pd.DataFrame, th: Thresholds) -> list[Finding]:
    """The gradient and dead-ReLU alerts (judged on the rows given) as findings with a layer."""
    meta = signals.rows_by_name(catalog)
    out = []
    for a in gradient_alerts(stats, th, catalog) + dead_relus(stats, catalog, th):
        row = meta.get(str(a.tensor), {"name": a.tensor}) if a.tensor else None
        advice = {"exploding_gradient": "lower the learning rate, clip gradients, or normalise "
                                        "this layer's input",
                  "vanishing_gradient": "this layer barely learns: a saturated activation before "
                                        "it, or too deep without residual connections or "
                                        "normalisation",
                  "gradient_ratio": "gradients shrink or grow across depth: normalisation or "
                                    "residual connections",
                  "dead_relu": "its pre-activations are negative for every sample: a large "
                               "negative bias, too high a learning rate, or a bad "
                               "initialisation"}.get(a.kind, "")
        out.append(Finding(a.kind, a.severity, a.message, advice,
                           layer_of(row) if row is not None else None,
                           str(row["op"]) if row is not None and isinstance(row.get("op"), str)
                           else None, a.tensor, a.step, "overview"))
    return out


def diagnose(run: "Run", th: SignalThresholds = SignalThresholds(),
             alerts: Thresholds = Thresholds()) -> list[Finding]:
    """The findings of ``run``'s view, most likely culprit first (see the module docstring).
    Reads the first non-finite step's rows, the last ``alerts.window`` finite statistics steps
    and the loss; never the whole run."""
    catalog = run.tensors
    if catalog.empty:
        return []
    origin = run.nonfinite_origin()
    steps = _steps(run)
    window = _window_steps(steps, origin.step if origin else None, alerts.window)
    stats = run.query_stats(at_steps=window, groups=["all"]) if window else pd.DataFrame()
    graph = _graph(run, origin.worker, origin.session) if origin else _graph(run)
    found: list[Finding] = []
    if not stats.empty:
        found += signals.update_findings(stats, catalog, th)
        found += signals.gradient_jump_findings(stats, catalog, graph, th)
        found += signals.saturation_findings(stats, catalog, th, graph)
        found += signals.dead_unit_findings(stats, catalog, graph, th)
        found += _alert_findings(stats, catalog, alerts)
    found += signals.loss_findings(
        _loss_series(run, int(steps[0]) if len(steps) else None, stats), th)
    found += signals.group_findings(_group_counts(run, window), _declared_groups(run))
    return rank(found, origin)


def rank(found: list[Finding], origin: Origin | None) -> list[Finding]:
    """``found`` and the origin's finding in the order of the module docstring."""
    out = list(found)
    if origin is not None:
        f = origin_finding(origin)
        earlier = [x for x in found
                   if x.severity == "error" and x.step is not None and x.step < origin.step
                   and x.kind != "frozen"]
        if f.kind == "nonfinite" and earlier:   # a consequence of what went wrong before it
            f.kind, f.numbers["after"] = "nonfinite_after", earlier[0].kind
        out.append(f)
    return sorted(out, key=_order)


#: what goes wrong before a NaN: among errors these come in the order they began
PRECURSORS = frozenset({"gradient_jump", "exploding_gradient", "update_ratio_high", "diverging",
                        "loss_diverges"})


def _order(f: Finding) -> tuple:
    """Errors before warnings before info; among errors a localized NaN origin first, then the
    precursors by the step they began (a learning rate too high from step 20 explains the
    exploding gradients of step 35), then the rest by RANK."""
    severity = SEVERITIES.index(f.severity) if f.severity in SEVERITIES else 3
    if f.severity == "error" and f.kind in PRECURSORS:
        return severity, 1, f.step if f.step is not None else 1 << 62, RANK.get(f.kind, 15)
    return severity, 0 if f.kind == "nonfinite" else 2, 0, RANK.get(f.kind, 15)


#: alert kinds whose message stands as it was (the gradient and ReLU alerts): no advice appended
_OWN_TEXT = frozenset({"exploding_gradient", "vanishing_gradient", "gradient_ratio", "dead_relu"})


def run_alerts(run: "Run", th: Thresholds = Thresholds()) -> list[alerts.Alert]:
    """Every alert for ``run``, errors first: the origin of the first NaN/Inf, the findings of
    :func:`diagnose` (judged on the last ``th.window`` statistics steps before the first
    NaN/Inf), the ICNN betas, write errors, drops, damaged files."""
    out = alerts.nonfinite_alert(run.first_nonfinite(), run.tensors)
    out += [alerts.Alert(f.severity, f.kind, f.evidence
                         + (f"; try: {f.advice}" if f.advice and f.kind not in _OWN_TEXT else ""),
                         f.step, f.tensor)
            for f in diagnose(run, alerts=th) if not f.kind.startswith("nonfinite")]
    beta = alerts._beta_stats(run)
    if not beta.empty:
        out += alerts.icnn_beta_alerts(beta, run.tensors)
    out += alerts.error_alerts(run.errors, run.sessions) + alerts.dropped_alerts(run.dropped)
    out += alerts.groups_refused_alerts(run.groups_refused)
    out += [alerts.Alert("warning", "damaged_file", p) for p in run.problems]
    if run.status == "running":
        out.append(alerts.Alert("info", "running",
                                "the run is still being written; press Refresh for new steps"))
    return sorted(out, key=lambda a: alerts.SEVERITIES.index(a.severity))


def diagnosis_text(findings: list[Finding], most: int = 3) -> str:
    """A paragraph: the most likely culprit with its evidence and what to try, then the next
    ones in a line each ('' when nothing was found)."""
    serious = [f for f in findings if f.severity in ("error", "warning")]
    if not serious:
        return ""
    first = serious[0]
    where = ", ".join(x for x in (f"layer {first.layer}" if first.layer else "",
                                  f"op {first.op}" if first.op else "",
                                  f"step {first.step}" if first.step is not None else "") if x)
    lines = [f"Most likely culprit ({first.kind}{': ' + where if where else ''}): "
             f"{_sentence(first.evidence)}"
             + (f" Try: {_sentence(first.advice)}" if first.advice else "")]
    for f in serious[1:most]:
        lines.append(f"Also ({f.kind}{', layer ' + f.layer if f.layer else ''}): "
                     f"{_sentence(f.evidence)}")
    if len(serious) > most:
        lines.append(f"... and {len(serious) - most} more finding(s).")
    return "\n".join(lines)


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."
