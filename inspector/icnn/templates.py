"""ICNN templates and layer listing, in NumPy only (no TensorFlow).

The paper's positive template for a peak at mu, on an H x W map, is the mask formula of the
layer (see ``inspector.icnn.layer``)::

    T_mu[h, w] = tau * max(1 - beta * (|gy[h] - mu_row| + |gx[w] - mu_col|), -1)
    gy = linspace(-1, 1, H),  gx = linspace(-1, 1, W)

and the negative template is ``T-[h, w] = -tau``. The paper scales both by
``tau = 0.5 / (H * W)``; the release (and ``icnn``'s gradient and monitoring value) uses the
unscaled shape with ``mean_hw(x * T) / a``, a = 0.5, i.e. an effective tau of 2 / (H * W).
``scale=False`` (default) returns the shape in [-1, 1]; ``scale=True`` multiplies by tau.

Example::

    >>> t = positive_templates(4, 4, beta=2.0)        # all mu on the grid: [16, 4, 4]
    >>> t.shape, float(t[0, 0, 0])
    ((16, 4, 4), 1.0)
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..format import ICNN_CLASS_ROLES, ICNN_ROLES


def paper_tau(h: int, w: int) -> float:
    """The paper's template scale ``tau = 0.5 / (H * W)``."""
    return 0.5 / (h * w)


def _check_hw(h: int, w: int) -> None:
    if int(h) < 1 or int(w) < 1:
        raise ValueError(f"map size must be at least 1 x 1, got H={h}, W={w}")


def grid_mu(h: int, w: int) -> np.ndarray:
    """Every position on the H x W grid as (row, col)
    in [-1, 1] coordinates, row-major: [H*W, 2]."""
    _check_hw(h, w)
    gy, gx = np.linspace(-1.0, 1.0, h), np.linspace(-1.0, 1.0, w)
    rows, cols = np.meshgrid(gy, gx, indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()], axis=1)


def positive_templates(h: int, w: int, beta: float = 2.0, mu: Optional[np.ndarray] = None,
                       scale: bool = False) -> np.ndarray:
    """Templates T_mu, one per mu: returns [M, H, W] (M = H*W when ``mu`` is None).

    ``mu``: [M, 2] (row, col) in [-1, 1] map coordinates, e.g. the ``mu`` tensor dumped by the
    hook for one channel (``mu[:, c, :]``). ``beta``: that channel's beta.
    """
    _check_hw(h, w)
    mu = grid_mu(h, w) if mu is None else np.asarray(mu, dtype=np.float64)
    if mu.ndim != 2 or mu.shape[1] != 2:
        raise ValueError(f"mu must be [M, 2] (row, col) in [-1, 1], got shape {mu.shape}")
    t = template_at(mu, float(beta), h, w)
    return t * paper_tau(h, w) if scale else t


def template_at(mu: np.ndarray, beta, h: int, w: int) -> np.ndarray:
    """``max(1 - beta * (|gy - mu_row| + |gx - mu_col|), -1)`` on the H x W grid (getMask).

    ``mu``: [..., 2] (row, col) in [-1, 1]; ``beta`` broadcasts against ``mu[..., 0]``.
    Returns [..., H, W]: a template T_mu, or the ICNN mask of one map and channel."""
    mu = np.asarray(mu, dtype=np.float64)
    gy, gx = np.linspace(-1.0, 1.0, h), np.linspace(-1.0, 1.0, w)
    dist = np.abs(gy[:, None] - mu[..., 0, None, None]) \
        + np.abs(gx[None, :] - mu[..., 1, None, None])
    return np.maximum(1.0 - np.asarray(beta, np.float64)[..., None, None] * dist, -1.0)


def negative_template(h: int, w: int, scale: bool = False) -> np.ndarray:
    """The negative template T-: -1 everywhere (times tau with ``scale=True``): [H, W]."""
    _check_hw(h, w)
    t = -np.ones((h, w))
    return t * paper_tau(h, w) if scale else t


def icnn_layers(catalog: pd.DataFrame) -> pd.DataFrame:
    """ICNN layers of a run catalog: one row per layer, one column per role (tensor name or None).

    ``catalog`` needs columns ``name``, ``icnn_layer`` and ``icnn_role`` (null where none),
    as ``inspector.open_run(path).tensors`` has. Columns of the result: ``layer``, then
    ``inspector.format.ICNN_ROLES`` and ``ICNN_CLASS_ROLES`` in order (None where a layer
    lacks the role: single-class layers have no ``class_positive``).

    >>> cat = pd.DataFrame({"name": ["m/mask:0", "c/Relu:0"], "icnn_layer": ["m", None],
    ...                     "icnn_role": ["mask", None]})
    >>> icnn_layers(cat)[["layer", "mask", "mu"]].values.tolist()
    [['m', 'm/mask:0', None]]
    """
    missing = {"name", "icnn_layer", "icnn_role"} - set(catalog.columns)
    if missing:
        raise ValueError(f"catalog lacks column(s) {sorted(missing)}; it needs name, icnn_layer, "
                         "icnn_role")
    roles = (*ICNN_ROLES, *ICNN_CLASS_ROLES)
    columns = ["layer", *roles]
    rows = catalog[catalog["icnn_layer"].notna() & catalog["icnn_role"].notna()]
    out = []
    for layer in sorted(rows["icnn_layer"].astype(str).unique()):
        sub = rows[rows["icnn_layer"].astype(str) == layer]
        by_role = dict(zip(sub["icnn_role"].astype(str), sub["name"].astype(str)))
        out.append([layer] + [by_role.get(role) for role in roles])
    return pd.DataFrame(out, columns=columns, dtype=object)


def dead_filters(pre_mask: Optional[np.ndarray] = None,
                 mu: Optional[np.ndarray] = None) -> np.ndarray:
    """Dead filters of an ICNN layer in a dump: bool [C], True where the filter never fires.

    With ``pre_mask`` ([N, H, W, C], the ReLU map the mask is applied to): its values are
    zero in every dumped sample (NaN/Inf count as firing). Without it, from ``mu``
    ([N, C, 2]): mu is pinned at (-1, -1) in every sample, which is where an all-zero map
    puts it (``getMu``). A dead filter has no part: its mu spread of 0 is not a "tight" filter.

    >>> x = np.ones((2, 3, 3, 2)); x[..., 1] = 0
    >>> dead_filters(x).tolist()
    [False, True]
    """
    if pre_mask is not None:
        x = np.asarray(pre_mask)
        if x.ndim != 4:
            raise ValueError(f"pre_mask must be [N, H, W, C], got shape {x.shape}")
        return ~(x != 0).any(axis=(0, 1, 2)) if x.shape[0] else np.zeros(x.shape[-1], bool)
    if mu is None:
        raise ValueError("give pre_mask or mu")
    m = np.asarray(mu, np.float64)
    if m.ndim != 3 or m.shape[2] != 2:
        raise ValueError(f"mu must be [N, C, 2], got shape {m.shape}")
    return (m == -1.0).all(axis=(0, 2)) if m.shape[0] else np.zeros(m.shape[1], bool)


def mu_spread(mu: np.ndarray) -> np.ndarray:
    """How tightly mu clusters: the mean distance of each filter's mu to its mean over the samples,
    in [-1, 1] map units. ``mu``: [N, C, 2] (returns [C]) or [N, 2] (returns a scalar array);
    NaN for no sample. A part filter keeps its positives' spread well below its negatives'.

    >>> float(mu_spread(np.array([[0.0, 0.0], [0.0, 1.0]])))
    0.5
    """
    m = np.asarray(mu, np.float64)
    if m.ndim not in (2, 3) or m.shape[-1] != 2:
        raise ValueError(f"mu must be [N, 2] or [N, C, 2] (row, col), got shape {m.shape}")
    if not len(m):
        return np.full(m.shape[1:-1], np.nan)
    return np.linalg.norm(m - m.mean(0), axis=-1).mean(0)
