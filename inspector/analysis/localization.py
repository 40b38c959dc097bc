"""Is an ICNN filter a part filter? Its evidence with its uncertainty (the Masks & templates
verdict). NumPy only.

A part filter keeps its positives' mu (where the mask centres) tighter than its negatives' and
fires on positives more than on negatives. Per filter, :func:`judge` gives:

- the spread ratio positive / negative (:func:`inspector.icnn.templates.mu_spread` of each) and
  a bootstrap interval of it: samples of each group drawn again with replacement
  (:data:`BOOTSTRAP` times, a fixed seed: the same run reads the same interval), the
  2.5th and 97.5th percentiles;
- whether it fires as strongly on negatives: the negatives' median peak activation (each
  sample's map maximum) at least the positives' median;
- ``localized``: the whole interval below 1 and not firing as strongly on negatives.

Below :data:`MIN_SAMPLES` samples of either group nothing is judged: the verdict says "not
enough samples" (with 4 samples a spread of 0.000 ranks a filter first by chance).

Example::

    table = judge(mu, groups, peaks)       # mu [N, C, 2], groups [N], peaks [N, C] or None
    verdict_text(table, "all dump steps")  # "5 of 7 live filters localized (..., n = 16 ...)"
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from inspector.icnn.templates import mu_spread

#: Fewer samples of a group than this: no verdict ("not enough samples")
MIN_SAMPLES = 8
#: Bootstrap draws of each filter's spread ratio
BOOTSTRAP = 400


def ratio_interval(pos: np.ndarray, neg: np.ndarray, draws: int = BOOTSTRAP,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) [C]: the 95% bootstrap interval of mu_spread(positives) / mu_spread(negatives)
    per filter; ``pos`` [Np, C, 2], ``neg`` [Nn, C, 2]. Each draw resamples both groups.

    >>> rng = np.random.default_rng(1)
    >>> lo, hi = ratio_interval(rng.normal(0, 0.1, (30, 1, 2)), rng.normal(0, 1, (30, 1, 2)))
    >>> bool(hi[0] < 1)
    True
    """
    rng = np.random.default_rng(seed)
    ip = rng.integers(0, len(pos), (draws, len(pos)))
    ineg = rng.integers(0, len(neg), (draws, len(neg)))
    ratios = np.empty((draws, pos.shape[1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        for d in range(draws):
            ratios[d] = mu_spread(pos[ip[d]]) / mu_spread(neg[ineg[d]])
    return np.nanpercentile(ratios, 2.5, axis=0), np.nanpercentile(ratios, 97.5, axis=0)


def judge(mu: np.ndarray, groups: np.ndarray, peaks: np.ndarray | None = None,
          dead: np.ndarray | None = None, draws: int = BOOTSTRAP) -> pd.DataFrame:
    """Per filter: ``positive n``, ``negative n``, the ``ratio`` and its interval (``ratio low``,
    ``ratio high``), ``fires on negatives`` (None without ``peaks``), ``localized`` (None where
    not judged: a dead filter, or fewer than :data:`MIN_SAMPLES` samples of a group).
    ``mu`` [N, C, 2]; ``groups`` [N] ('positive' / 'negative'); ``peaks`` [N, C]: each sample's
    strongest activation of each filter."""
    mu = np.asarray(mu, np.float64)
    c = mu.shape[1]
    dead = np.zeros(c, bool) if dead is None else np.asarray(dead, bool)
    pos, neg = mu[groups == "positive"], mu[groups == "negative"]
    enough = len(pos) >= MIN_SAMPLES and len(neg) >= MIN_SAMPLES
    out = pd.DataFrame({"filter": np.arange(c), "positive n": len(pos), "negative n": len(neg)})
    with np.errstate(divide="ignore", invalid="ignore"):
        out["ratio"] = (mu_spread(pos) / mu_spread(neg)) if len(pos) and len(neg) else np.nan
    lo, hi = ratio_interval(pos, neg, draws) if enough else (np.full(c, np.nan),) * 2
    out["ratio low"], out["ratio high"] = lo, hi
    if peaks is not None:
        p = np.asarray(peaks, np.float64)
        fires = np.median(p[groups == "negative"], 0) >= np.median(p[groups == "positive"], 0) \
            if len(pos) and len(neg) else np.zeros(c, bool)
        out["fires on negatives"] = fires
    else:
        fires = np.zeros(c, bool)
        out["fires on negatives"] = None
    judged = enough & ~dead
    out["localized"] = pd.array(np.where(judged, (hi < 1) & ~fires, False), dtype="boolean")
    out.loc[~judged, "localized"] = pd.NA
    return out


def verdict_text(table: pd.DataFrame, where: str) -> str:
    """The verdict in words: n, how many filters are localized with their interval below 1, how
    many fire as strongly on negatives, or "not enough samples".

    >>> t = pd.DataFrame({"filter": [0], "positive n": [4], "negative n": [4], "ratio": [0.1],
    ...                   "ratio low": [np.nan], "ratio high": [np.nan],
    ...                   "fires on negatives": [False], "localized": pd.array([pd.NA], "boolean")})
    >>> verdict_text(t, "step 10")
    'not enough samples to judge (step 10: 4 positive, 4 negative; at least 8 of each needed)'
    """
    n_pos, n_neg = int(table["positive n"].iloc[0]), int(table["negative n"].iloc[0])
    judged = table[table["localized"].notna()]
    if judged.empty:
        return (f"not enough samples to judge ({where}: {n_pos} positive, {n_neg} negative; at "
                f"least {MIN_SAMPLES} of each needed)")
    loc = int(judged["localized"].sum())
    fires = judged["fires on negatives"]
    against = int(fires.fillna(False).astype(bool).sum())
    return (f"{loc} of {len(judged)} live filters localized ({where}, n = {n_pos} positive, "
            f"{n_neg} negative): positives' mu tighter than negatives' with the 95% bootstrap "
            "interval of the spread ratio below 1"
            + (f", and firing more on positives; {against} fire as strongly on negatives "
               "(median peak), counted against them" if fires.notna().any() else
               "; no map dumped to compare how strongly they fire"))
