"""Modules that moved, importable under their old names: ``import inspector.plots`` gives
``inspector.analysis.plots`` itself (one module object, so a patch or a setting applies to both),
with a DeprecationWarning naming the new path.

A finder on ``sys.meta_path`` answers only the names listed; every other import is untouched.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Mapping

#: old module -> where it lives now (the tree's layout: docs/ARCHITECTURE.md)
INSPECTOR = {
    "inspector.manifest_schema": "inspector.format.manifest",
    "inspector.steps":           "inspector.format.steps",
    "inspector.loghist":         "inspector.format.loghist",
    "inspector.batch_note":      "inspector.format.provenance",
    "inspector.accounting":      "inspector.format.accounting",
    "inspector.spill":           "inspector.storage.spill",
    "inspector.safepath":        "inspector.storage.safety",
    "inspector.safe_files":      "inspector.storage.safety",
    "inspector.claim":           "inspector.sessions.lease",
    "inspector.liveness":        "inspector.sessions.liveness",
    "inspector.trainings":       "inspector.sessions.trainings",
    "inspector.crosscheck":      "inspector.sessions.crosscheck",
    "inspector.stats_schema":    "inspector.stats.schema",
    "inspector.stats_parts":     "inspector.stats.parts",
    "inspector.stats_merge":     "inspector.stats.merge",
    "inspector.stats_summary":   "inspector.stats.summary",
    "inspector.part_digest":     "inspector.stats.digest",
    "inspector.histograms":      "inspector.stats.histograms",
    "inspector.safetensors_io":  "inspector.dumps.files",
    "inspector.dump_schema":     "inspector.dumps.schema",
    "inspector.graphdef":        "inspector.graph.graphdef",
    "inspector.graph_scopes":    "inspector.graph.scopes",
    "inspector.plots":           "inspector.analysis.plots",
    "inspector.hist_view":       "inspector.analysis.hist_view",
    "inspector.binning":         "inspector.analysis.binning",
    "inspector.tb_export":       "inspector.export.tensorboard",
    "inspector.tfevents":        "inspector.export.tfevents",
    "inspector.crc32c":          "inspector.export.crc32c",
    "inspector.units":           "inspector.sizes",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old name as the module now at its new name."""

    def __init__(self, moved: Mapping[str, str]):
        self.moved = dict(moved)
        self._own: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec) -> ModuleType:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._own[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set __spec__ and __loader__ to the old name's:
        # give the module back its own
        own = self._own.pop(module.__spec__.name if module.__spec__ else "", None)
        if own is not None:
            module.__spec__ = own
            module.__loader__ = own.loader


def install(moved: Mapping[str, str]) -> None:
    """Make the old names in ``moved`` importable (once per table)."""
    if not any(isinstance(f, MovedModules) and f.moved == dict(moved) for f in sys.meta_path):
        sys.meta_path.append(MovedModules(moved))
