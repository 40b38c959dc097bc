"""Positive-vs-negative comparisons and update/weight ratios of a run's statistics (pandas).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # the reader is only needed for run_alerts; keep the import light
    pass


def update_ratios(stats: pd.DataFrame, catalog: pd.DataFrame) -> pd.DataFrame:
    """Per variable and statistics step: L2 of the step's update over L2 of the variable record's
    ``forward`` value: the weights before the step (after it in a Keras probe run, whose probe
    runs after the update); a healthy SGD run sits around 1e-3. One column per variable record,
    indexed by step.

    >>> stats = pd.DataFrame({"step": [1, 1], "tensor": ["w", "w"], "kind": ["forward", "update"],
    ...                       "group": "all", "l2": [2.0, 0.002]})
    >>> update_ratios(stats, pd.DataFrame({"name": ["w"], "kind": ["variable"]}))["w"].tolist()
    [0.001]
    """
    if "kind" not in catalog:
        return pd.DataFrame()
    names = set(catalog.loc[catalog["kind"] == "variable", "name"])
    df = stats[stats["tensor"].isin(names) & (stats["group"] == "all")
               & stats["kind"].isin(["forward", "update"])]
    if df.empty:
        return pd.DataFrame()
    wide = df.pivot_table(index="step", columns=["kind", "tensor"], values="l2", observed=True,
                          aggfunc="last")
    if "update" not in wide.columns.get_level_values(0):
        return pd.DataFrame()
    ratio = wide["update"] / wide["forward"].reindex(columns=wide["update"].columns).replace(
        0, np.nan)
    return ratio.rename_axis(columns=None)


def rms(mean, std):
    """Root mean square of a tensor from its recorded statistics: ``sqrt(mean**2 + std**2)`` (the
    hook's std is the population one, so this is ``l2 / sqrt(count)``). Unlike l2 it does not grow
    with the tensor's size: a 12x12x32 map and a 3x3x3 kernel of like values get like RMS.
    Takes scalars, arrays or Series.

    >>> float(rms(3.0, 4.0))
    5.0
    """
    return np.sqrt(np.square(mean) + np.square(std))


def group_series(stats: pd.DataFrame, tensor: str, stat: str,
                 kind: str = "forward") -> pd.DataFrame:
    """One statistic of one tensor over steps, one column per group (all/positive/negative).

    >>> group_series(run.stats, "conv1/Relu:0", "mean").plot()   # doctest: +SKIP
    """
    df = stats[(stats["tensor"] == tensor) & (stats["kind"] == kind)]
    wide = df.pivot_table(index="step", columns="group", values=stat, observed=True, aggfunc="last")
    return wide.reindex(columns=[g for g in ("all", "positive", "negative") if g in wide.columns])


def group_contrast(stats: pd.DataFrame, stat: str = "mean", kind: str = "forward") -> pd.DataFrame:
    """Per (step, tensor): positive minus negative value of ``stat`` and, for ``mean``, the
    standardised difference ``(mean_pos - mean_neg) / pooled std`` (an effect size).

    Columns: step, tensor, positive, negative, diff[, effect].
    """
    df = stats[(stats["kind"] == kind) & stats["group"].isin(["positive", "negative"])]
    cols = [stat] + (["std"] if stat == "mean" and "std" in df else [])
    wide = df.pivot_table(index=["step", "tensor"], columns="group", values=cols, observed=True,
                          aggfunc="last")
    # a group with no row (no sample of it in any batch read): its columns NaN, not a KeyError
    wide = wide.reindex(columns=pd.MultiIndex.from_product([cols, ["positive", "negative"]]))
    out = pd.DataFrame({"positive": wide[(stat, "positive")], "negative": wide[(stat, "negative")]})
    out["diff"] = out["positive"] - out["negative"]
    if len(cols) == 2:
        pooled = np.sqrt((wide[("std", "positive")] ** 2 + wide[("std", "negative")] ** 2) / 2)
        out["effect"] = out["diff"] / pooled.replace(0, np.nan)
    return out.reset_index()


def top_separating(stats: pd.DataFrame, step: int | None = None, n: int = 10,
                   kind: str = "forward") -> pd.DataFrame:
    """The ``n`` tensors whose positive and negative means differ most (|effect|) at ``step``
    (default: the last step)."""
    c = group_contrast(stats, "mean", kind)
    if c.empty:
        return c
    c = c[c["step"] == (c["step"].max() if step is None else step)]
    return c.reindex(c["effect"].abs().sort_values(ascending=False).index).head(n)


def split_by_group(values: np.ndarray, groups: np.ndarray,
                   order: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Split a dumped batched tensor by sample group: ``groups`` holds each sample's group name
    (``Run.samples``), or a dump's legacy codes (1 positive, 0 negative). Groups come in
    ``order`` (``Run.groups``), then as they first appear.

    >>> split_by_group(np.arange(3.0), np.array([1, 0, 1]))["positive"]
    array([0., 2.])
    >>> list(split_by_group(np.arange(3.0), np.array(["b", "a", "b"]), ["a", "b"]))
    ['a', 'b']
    """
    groups = np.asarray(groups)
    if groups.dtype.kind in "iub":
        groups = np.where(groups.astype(int) == 1, "positive", "negative")
        order = ("positive", "negative", *order)
    names = [g for g in dict.fromkeys([*order, *groups.tolist()]) if g in set(groups.tolist())]
    return {str(g): np.asarray(values)[groups == g] for g in names}


def common_bins(*arrays: np.ndarray, bins: int = 40) -> np.ndarray:
    """Bin edges covering the finite values of every array (one shared axis for overlays)."""
    finite = [a[np.isfinite(a)] for a in (np.ravel(x) for x in arrays) if a.size]
    finite = [a for a in finite if a.size]
    if not finite:
        return np.linspace(0.0, 1.0, bins + 1)
    lo, hi = min(float(a.min()) for a in finite), max(float(a.max()) for a in finite)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, bins + 1)
