"""Checks of a dump's ``samples/*`` arrays (see FORMAT.md) before they become a table.

Example::

    index, group, label = check_samples(path, index, group, label)
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from inspector.errors import DamagedFileError


def _fail(path: Path | str, what: str) -> DamagedFileError:
    return DamagedFileError(f"damaged dump file {path}: {what}")


def check_samples(path: Path | str, index: np.ndarray | None, group: np.ndarray | None,
                  label: np.ndarray | None, codes: Mapping[int, str] | None = None) -> None:
    """DamagedFileError naming ``path`` unless ``samples/index`` is a 1-D integer array,
    ``samples/group`` a 1-D integer (or bool) array of ``codes`` (the manifest's group codes;
    default 1 positive, 0 negative), ``samples/label`` a numeric
    or bool array, with one row per sample each (absent arrays are not checked)."""
    rows = {}
    for key, arr in (("index", index), ("group", group), ("label", label)):
        if arr is None:
            continue
        if arr.ndim < 1:
            raise _fail(path, f"samples/{key} is a scalar; it must have one row per sample")
        rows[key] = len(arr)
    if len(set(rows.values())) > 1:
        raise _fail(path, f"the samples/* arrays have different numbers of rows: {rows}")
    if index is not None and (index.ndim != 1 or not np.issubdtype(index.dtype, np.integer)):
        raise _fail(path, f"samples/index must be 1-D integers, not {index.dtype} {index.shape}")
    if group is not None:
        if group.ndim != 1 or not (np.issubdtype(group.dtype, np.integer) or group.dtype == bool):
            raise _fail(path, f"samples/group must be 1-D integers, not {group.dtype} "
                              f"{group.shape}")
        codes = {1: "positive", 0: "negative"} if codes is None else codes
        bad = np.setdiff1d(np.unique(np.asarray(group, np.int64)), sorted(codes))
        if bad.size:
            named = ", ".join(f"{c} ({n})" for c, n in sorted(codes.items())) or "none (no groups)"
            raise _fail(path, f"samples/group must hold the group codes {named}, not "
                              f"{bad[:5].tolist()}")
    if label is not None and not (np.issubdtype(label.dtype, np.number) or label.dtype == bool):
        raise _fail(path, f"samples/label must be numbers, not {label.dtype}")
