"""numpy: an ICNN filter's mu (the peak location) and its mask, as the layer computes them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from inspector.icnn.templates import template_at

if TYPE_CHECKING:  # the reader is only needed for run_alerts; keep the import light
    pass


def icnn_mu(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mu [N,C,2] (row, col) in [-1, 1] and sqrtvar [N,C] (pixels) of maps x [N,H,W,C] (getMu).

    >>> x = np.zeros((1, 5, 5, 1)); x[0, 4, 0, 0] = 1
    >>> icnn_mu(x)[0][0, 0].tolist()
    [1.0, -1.0]
    """
    n, h, w, c = x.shape
    rows = np.arange(1, h + 1, dtype=np.float64)[None, :, None, None]
    cols = np.arange(1, w + 1, dtype=np.float64)[None, None, :, None]
    s = np.maximum(x.sum(axis=(1, 2)), 1e-9)                                # [N,C]
    mr = np.maximum(np.floor((rows * x).sum(axis=(1, 2)) / s + 0.5), 1)     # MATLAB round, v >= 0
    mc = np.maximum(np.floor((cols * x).sum(axis=(1, 2)) / s + 0.5), 1)
    d2 = (rows - mr[:, None, None, :]) ** 2 + (cols - mc[:, None, None, :]) ** 2
    sqrtvar = np.sqrt((d2 * x).sum(axis=(1, 2)) / s)
    gy, gx = np.linspace(-1, 1, h), np.linspace(-1, 1, w)
    mu = np.stack([gy[mr.astype(int) - 1], gx[mc.astype(int) - 1]], axis=-1)
    return mu.astype(np.float32), sqrtvar.astype(np.float32)


def icnn_mask(mu: np.ndarray, beta: np.ndarray, h: int, w: int) -> np.ndarray:
    """Masks [N,H,W,C] for mu [N,C,2] and beta [C] (getMask):
    ``max(1 - beta * (|gy - mu_row| + |gx - mu_col|), -1)``."""
    return template_at(mu, beta, h, w).transpose(0, 2, 3, 1).astype(np.float32)  # [N,C,H,W] -> NHWC


def mu_to_cell(mu: np.ndarray, h: int, w: int) -> np.ndarray:
    """Map mu in [-1, 1] coordinates back to 0-based (row, col) grid cells."""
    mu = np.asarray(mu, np.float64)
    return np.stack([np.rint((mu[..., 0] + 1) / 2 * (h - 1)),
                     np.rint((mu[..., 1] + 1) / 2 * (w - 1))],
                    -1).astype(int)
