"""The run directory's format: the contract between writer and reader (FORMAT.md).

- ``layout``: names, file patterns, versions, the groups and statistics columns (re-exported here);
- ``manifest``: the manifest's keys, defaults and type checks;
- ``steps``: the step-range grammar; ``loghist``: the log-magnitude histograms;
- ``provenance``: what a recorded tensor's values were computed on (the batch notes);
- ``accounting``: where every float op output went (the default exclusion rules).
"""
from inspector.format.layout import (FORMAT_NAME, FORMAT_VERSION, TOOL_VERSION, MANIFEST_RE,
                                     STATS_RE, DUMP_RE, MANIFEST_V1_RE, STATS_V1_RE, DUMP_V1_RE,
                                     WORKER_RE, LOCK_RE, MODES, KINDS, INPUT_OP_TYPES, GROUPS,
                                     DEFAULT_GROUPS, GROUP_NAME_RE, check_group_name, STAT_COLUMNS,
                                     HIST_MAX_ELEMENTS, LEGACY_HIST_MAX_ELEMENTS, HIST_BLOCK,
                                     histogram_sample, hist_stride, hist_sample, HEARTBEAT_SECS,
                                     STALE_HEARTBEATS, ALIASES_KEY, ICNN_COLLECTION, ICNN_ROLES,
                                     ICNN_CLASS_ROLES, LOSS_COLLECTION, LABELS_COLLECTION,
                                     POSITIVE_COLLECTION, icnn_entry, parse_icnn_entry,
                                     icnn_catalog_fields, SHARED_GRADIENTS_COLLECTION,
                                     shared_gradient_entry, parse_shared_gradient_entry,
                                     manifest_name, graph_name, stats_name, stats_range_name,
                                     dump_name, lock_name, is_temporary, parse_manifest_name,
                                     parse_stats_name, parse_dump_name, check_worker, RUN_FILES,
                                     run_entries, special_entries, has_manifest)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "TOOL_VERSION", "MANIFEST_RE", "STATS_RE", "DUMP_RE",
           "MANIFEST_V1_RE", "STATS_V1_RE", "DUMP_V1_RE", "WORKER_RE", "LOCK_RE", "MODES", "KINDS",
           "INPUT_OP_TYPES", "GROUPS", "DEFAULT_GROUPS", "GROUP_NAME_RE", "check_group_name",
           "STAT_COLUMNS", "HIST_MAX_ELEMENTS", "LEGACY_HIST_MAX_ELEMENTS", "HIST_BLOCK",
           "histogram_sample", "hist_stride", "hist_sample", "HEARTBEAT_SECS", "STALE_HEARTBEATS",
           "ALIASES_KEY", "ICNN_COLLECTION", "ICNN_ROLES", "ICNN_CLASS_ROLES", "LOSS_COLLECTION",
           "LABELS_COLLECTION", "POSITIVE_COLLECTION",
           "icnn_entry", "parse_icnn_entry", "icnn_catalog_fields", "SHARED_GRADIENTS_COLLECTION",
           "shared_gradient_entry", "parse_shared_gradient_entry", "manifest_name", "graph_name",
           "stats_name", "stats_range_name", "dump_name", "lock_name", "is_temporary",
           "parse_manifest_name", "parse_stats_name", "parse_dump_name", "check_worker",
           "RUN_FILES", "run_entries", "special_entries", "has_manifest"]
