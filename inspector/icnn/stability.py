"""Location instability of conv filters (the ICNN release's ``computeStability``), NumPy only.

For filter f and image I: take the position of f's largest activation (on ties the first in
MATLAB's column-major order, as the release's ``max(max(x, [], 1), [], 2)`` picks it), map
it to image pixels through the receptive field ``p = center + index * stride`` (0-based index
and pixel coordinates), and measure its Euclidean distance to each ground-truth part k. Over
f's top-K images (largest max activation, among images where the part is valid) take the standard
deviation of that distance (``ddof=1``, MATLAB ``var``), average over parts, then over filters, and
divide by the image diagonal. Lower is better: an interpretable filter keeps a constant distance to
its part. The release measures a conv layer's raw output (before its ReLU, and in an ICNN
before the mask): pass those maps, so that every filter has a peak that means something.
:func:`part_consistency` is a second reading: how often a filter's peak lands on one part.

Example::

    >>> import numpy as np
    >>> maps = np.zeros((3, 4, 4, 1)); parts = np.zeros((3, 1, 2))
    >>> for n in range(3):                       # the filter follows the part exactly
    ...     maps[n, n, n, 0] = 1.0; parts[n, 0] = (n * 8 + 4, n * 8 + 4)
    >>> location_instability(maps, parts, image_size=(32, 32), stride=8, center=4)
    0.0
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np


def peak_positions(maps: np.ndarray, stride: Sequence[float] | float,
                   center: Sequence[float] | float
                   ) -> Tuple[np.ndarray, np.ndarray]:
    """Image-pixel position of each map's largest activation and that activation.

    Returns ``(pos [N, C, 2] (row, col), score [N, C])``. Ties go to the first maximum in
    column-major order (lowest column, then lowest row), as the release's
    ``[v, idx] = max(x, [], 1); [v, col] = max(v, [], 2)`` resolves them.

    >>> m = np.zeros((1, 2, 2, 1)); m[0, 0, 1, 0] = m[0, 1, 0, 0] = 1.0
    >>> peak_positions(m, 1.0, 0.0)[0][0, 0].tolist()          # (1, 0), not (0, 1)
    [1.0, 0.0]
    """
    maps = np.asarray(maps)
    if maps.ndim != 4:
        raise ValueError(f"maps must be [N, H, W, C], got shape {maps.shape}")
    n, h, w, c = maps.shape
    flat = maps.transpose(0, 3, 2, 1).reshape(n, c, w * h)   # column-major: rows vary fastest
    idx = np.argmax(flat, axis=2)                              # the first maximum
    score = np.take_along_axis(flat, idx[..., None], axis=2)[..., 0]
    stride = np.broadcast_to(np.asarray(stride, dtype=np.float64), (2,))
    center = np.broadcast_to(np.asarray(center, dtype=np.float64), (2,))
    rc = np.stack([idx % h, idx // h], axis=2).astype(np.float64)
    return center + rc * stride, score


def filter_instability(maps: np.ndarray, parts: np.ndarray, *,
                       stride: Sequence[float] | float = 1.0, center: Sequence[float] | float = 0.0,
                       valid: Optional[np.ndarray] = None, top_k: int = 100) -> np.ndarray:
    """Per-filter mean over parts of the std of the peak-to-part distance, in pixels: [C].

    A filter with fewer than 2 usable images for some part gets NaN (as in the release).
    """
    maps = np.asarray(maps, dtype=np.float64)
    parts = np.asarray(parts, dtype=np.float64)
    if maps.ndim != 4:
        raise ValueError(f"maps must be [N, H, W, C], got shape {maps.shape}")
    if parts.ndim != 3 or parts.shape[2] != 2 or parts.shape[0] != maps.shape[0]:
        raise ValueError(f"parts must be [N, P, 2] (row, col) with N={maps.shape[0]} like maps, "
                         f"got shape {parts.shape}")
    n, p = parts.shape[:2]
    if valid is None:
        valid = np.isfinite(parts).all(axis=2)
    else:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != (n, p):
            raise ValueError(f"valid must be [N, P] = {(n, p)}, got shape {valid.shape}")
        valid = valid & np.isfinite(parts).all(axis=2)
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    pos, score = peak_positions(maps, stride, center)               # [N, C, 2], [N, C]
    c = maps.shape[3]
    out = np.zeros(c)
    for f in range(c):
        # descending, stable like MATLAB sort
        order = np.argsort(-score[:, f], kind="stable")
        total = 0.0
        for k in range(p):
            chosen = order[valid[order, k]][: int(top_k)]
            if chosen.size < 2:
                total = np.nan
                break
            dist = np.linalg.norm(parts[chosen, k, :] - pos[chosen, f, :], axis=1)
            total += dist.std(ddof=1)
        out[f] = total / p
    return out


def location_instability(maps: np.ndarray, parts: np.ndarray, *, image_size: Sequence[int],
                         stride: Sequence[float] | float = 1.0,
                         center: Sequence[float] | float = 0.0, valid: Optional[np.ndarray] = None,
                         top_k: int = 100, select_ratio: float = 1.0) -> float:
    """Location instability of a layer (lower is better).

    Args:
      maps: feature maps [N, H, W, C], e.g. dumped post-mask maps or a held-out set's outputs.
      parts: ground-truth part positions [N, P, 2] as (row, col) image pixels; NaN = absent.
      image_size: (height, width) of the input images; the result is divided by their diagonal.
      stride, center: receptive-field mapping ``p = center + index * stride`` (scalars or
        (row, col) pairs; 0-based index and pixels).
      valid: optional bool [N, P]; False drops that image for that part.
      top_k: images per filter (largest max activation first); fewer if fewer exist.
      select_ratio: average over this fraction of the most stable filters (the release's
        ``selectedPatternRatio``; 1.0 = all filters). Filters with NaN are left out.

    Returns NaN when no filter has at least 2 usable images per part.
    """
    if len(image_size) != 2 or min(image_size) <= 0:
        raise ValueError(f"image_size must be (height, width) > 0, got {image_size!r}")
    if not 0.0 < select_ratio <= 1.0:
        raise ValueError(f"select_ratio must be in (0, 1], got {select_ratio}")
    per_filter = filter_instability(maps, parts, stride=stride, center=center,
                                    valid=valid, top_k=top_k)
    good = np.sort(per_filter[np.isfinite(per_filter)])
    if good.size == 0:
        return float("nan")
    keep = max(1, int(np.floor(per_filter.size * select_ratio + 0.5)))   # MATLAB round
    return float(good[:keep].mean() / np.hypot(*image_size))


def part_consistency(maps: np.ndarray, parts: np.ndarray, *, stride: Sequence[float] | float = 1.0,
                     center: Sequence[float] | float = 0.0, radius: float, top_k: int = 100
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """How often each filter's peak falls on the same part: ``(consistency [C], part [C])``.

    For filter f, over its top-K images (largest peak, among images with at least one part),
    each peak is assigned the nearest part if that part's landmark lies within ``radius``
    pixels, else no part. ``part[f]`` is the part assigned most often (the lowest index on
    ties; -1 when no peak lands on any part) and ``consistency[f]`` the fraction of the K
    images whose peak lands on it. Higher is better: a part detector scores 1. Filters with
    fewer than 2 usable images get NaN.

    >>> maps = np.zeros((3, 4, 4, 1)); parts = np.array([[[0., 0.], [3., 3.]]] * 3)
    >>> maps[0, 0, 0, 0] = maps[1, 0, 0, 0] = maps[2, 3, 3, 0] = 1.0
    >>> c, k = part_consistency(maps, parts, radius=1.0)
    >>> round(float(c[0]), 3), int(k[0])
    (0.667, 0)
    """
    maps = np.asarray(maps, dtype=np.float64)
    parts = np.asarray(parts, dtype=np.float64)
    if parts.ndim != 3 or parts.shape[2] != 2 or maps.ndim != 4 or parts.shape[0] != maps.shape[0]:
        raise ValueError("maps must be [N, H, W, C] and parts [N, P, 2] with the same N, got "
                         f"{maps.shape} and {parts.shape}")
    if not radius > 0:
        raise ValueError(f"radius must be > 0 pixels, got {radius!r}")
    pos, score = peak_positions(maps, stride, center)
    usable = np.isfinite(parts).all(axis=2).any(axis=1)              # images with some part
    n_parts, c = parts.shape[1], maps.shape[3]
    consistency, best = np.full(c, np.nan), np.full(c, -1)
    for f in range(c):
        order = np.argsort(-score[:, f], kind="stable")
        chosen = order[usable[order]][: int(top_k)]
        if chosen.size < 2:
            continue
        d = np.linalg.norm(parts[chosen] - pos[chosen, f, None, :], axis=2)   # [K, P], NaN = absent
        d = np.where(np.isfinite(d), d, np.inf)
        near = np.argmin(d, axis=1)
        # n_parts = no part
        near = np.where(d[np.arange(len(chosen)), near] <= radius, near, n_parts)
        counts = np.bincount(near, minlength=n_parts + 1)[:n_parts]
        k = int(np.argmax(counts))
        best[f], consistency[f] = (k if counts[k] else -1), counts[k] / chosen.size
    return consistency, best
