"""Offline analysis of a run with numpy/pandas: alerts, positive-vs-negative comparisons, plots.

Everything here takes plain DataFrames / arrays (as returned by :class:`inspector.Run`), so it
works in notebooks, in the viewer and in tests alike. No TensorFlow. Modules: ``alerts``,
``compare``, ``plots`` (matplotlib figures), ``hist_view`` (how histograms are drawn),
``binning`` (dumped values' histograms), ``group_ratio`` (one group's statistic over the
other's, per tensor and step), ``localization`` (the ICNN part-filter verdict with its
uncertainty).

Example::

    import inspector
    from inspector import analysis
    run = inspector.open_run("runs/exp1")
    alerts = analysis.run_alerts(run)                 # list[Alert], most severe first
    analysis.alerts_frame(alerts)                     # as a DataFrame
    analysis.group_contrast(run.query_stats(kinds=["forward"]), "mean")
"""
from inspector.analysis.alerts import (SEVERITIES, LAYER_OP_TYPES, Thresholds, Alert,
                                       alerts_frame, NONFINITE_SOURCES, source_text,
                                       nonfinite_alert, rerun_text, dead_relus, layer_outputs,
                                       gradient_alerts, DROPPED, dropped_alerts, dropped_text,
                                       groups_refused_alerts, error_alerts, ICNN_BETA_RANGE,
                                       icnn_beta_alerts)
from inspector.analysis.compare import (update_ratios, rms, group_series, group_contrast,
                                        top_separating, split_by_group, common_bins)
from inspector.analysis.group_ratio import ratio_overview, most_different
from inspector.analysis.diagnosis import diagnose, diagnosis_text, run_alerts
from inspector.analysis.signals import Finding, SignalThresholds
from inspector.graph.origin import Origin, nonfinite_origin
from inspector.icnn.masks import icnn_mu, icnn_mask, mu_to_cell

__all__ = ["SEVERITIES", "LAYER_OP_TYPES", "Thresholds", "Alert", "alerts_frame",
           "NONFINITE_SOURCES", "source_text", "nonfinite_alert", "rerun_text", "dead_relus",
           "layer_outputs", "gradient_alerts", "DROPPED", "dropped_alerts", "dropped_text",
           "groups_refused_alerts", "error_alerts", "ICNN_BETA_RANGE", "icnn_beta_alerts",
           "update_ratios", "rms", "group_series", "group_contrast", "top_separating",
           "split_by_group", "common_bins", "ratio_overview", "most_different", "diagnose",
           "diagnosis_text", "run_alerts", "Finding",
           "SignalThresholds", "Origin", "nonfinite_origin", "icnn_mu", "icnn_mask", "mu_to_cell"]
