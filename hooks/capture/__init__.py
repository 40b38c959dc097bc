"""The graph side of the capture, built once before the graph is finalized: which tensors
(``select``, ``fetchable``), their gradients (``gradients``), sample groups (``groups``), the
dump fetch (``dump``); and what the hook learns of the graph: per-sample axes (``batch_axis``,
``towers``), what each tensor feeds (``feeds``), the user's source lines (``source_lines``),
variables (``variables``). The loss and labels: hooks.recorders.loss_and_labels.
"""
from hooks.capture.select import (DEFAULT_EXCLUDE, DEFAULT_EXCLUDE_OP_TYPES, FLOAT_DTYPES, Captured,
                                  Selection, grouping_of, filters_of, as_dtypes, accountable,
                                  select_tensors, accounting, log_unfetchable, icnn_roles,
                                  icnn_fields, function_body_tensors)
from hooks.capture.fetchable import (V2_COND_OP_TYPES, IN_V1_BODY, ran_by_training, upstream,
                                     side_effects, FUNCTIONAL, functional_writes, write_target,
                                     written, ref_aliases, unordered_reads, CALL_OP_TYPES,
                                     IN_FUNCTION, backward_ops, ancestors)
from hooks.capture.gradients import (raw_gradients, gradient_stops, differentiable, dense_gradient,
                                     gradients, unscale, shared_gradients)
from hooks.capture.groups import (LabelsError, default_rule, not_class_ids, group_ids, Groups,
                                  from_positive, positive_groups, as_groups, kept_samples,
                                  GroupSpec, Refusals, all_rows_only, bad_rule)
from hooks.capture.dump import (ungrouped_dump, taken, pack_when, unpack, keeps_whole_batch,
                                build_dump)

__all__ = ["DEFAULT_EXCLUDE", "DEFAULT_EXCLUDE_OP_TYPES", "FLOAT_DTYPES", "Captured", "Selection",
           "grouping_of", "filters_of", "as_dtypes", "accountable", "select_tensors", "accounting",
           "log_unfetchable", "icnn_roles", "icnn_fields", "function_body_tensors",
           "V2_COND_OP_TYPES", "IN_V1_BODY", "ran_by_training", "upstream", "side_effects",
           "FUNCTIONAL", "functional_writes", "write_target", "written", "ref_aliases",
           "unordered_reads", "CALL_OP_TYPES", "IN_FUNCTION", "backward_ops", "ancestors",
           "raw_gradients", "gradient_stops", "differentiable", "dense_gradient", "gradients",
           "unscale", "shared_gradients", "LabelsError", "default_rule", "not_class_ids",
           "group_ids", "Groups", "from_positive", "positive_groups", "as_groups", "kept_samples",
           "GroupSpec", "Refusals", "all_rows_only", "bad_rule", "ungrouped_dump", "taken",
           "pack_when", "unpack", "keeps_whole_batch", "build_dump"]
