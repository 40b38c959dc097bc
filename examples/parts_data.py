"""A synthetic "parts" dataset for the ICNN demo, in NumPy, deterministic from a seed.

Three distinct strokes (a ring, a plus, a bar) are the parts. A positive image holds the
object: the three strokes in a fixed triangle arrangement (ring on top, plus lower left, bar
lower right), placed at a random position and scale, with small per-part jitter. A negative
image holds the same strokes (three to four of them) at random positions, so classifying
needs the arrangement, not the strokes. Both get background noise and a few specks.

Example::

    >>> images, labels, parts = make_parts_dataset(8, seed=0)
    >>> images.shape, images.dtype, labels.tolist(), parts.shape
    ((8, 48, 48, 1), dtype('float32'), [1, 0, 1, 0, 1, 0, 1, 0], (8, 3, 2))

``parts[n, k]`` is the (row, col) pixel centre (0-based) of part k in image n, NaN for negatives.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

PART_NAMES = ("ring", "plus", "bar")
# Offsets of the parts from the object centre (row, col) at scale 1, in pixels.
LAYOUT = np.array([[-7.0, 0.0], [5.0, -7.0], [5.0, 7.0]])


def _stroke(kind: int, size: int) -> np.ndarray:
    """A stroke drawn on a size x size patch (size odd), values in [0, 1]."""
    r = size // 2
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1].astype(np.float64)
    d = np.hypot(yy, xx)
    if kind == 0:    # ring
        img = np.clip(1.2 - np.abs(d - 0.7 * r) * 1.2, 0, 1)
    elif kind == 1:  # plus
        img = np.clip(1.2 - np.minimum(np.abs(yy), np.abs(xx)) * 1.2, 0, 1) * (np.maximum(
            np.abs(yy), np.abs(xx)) <= r)
    else:            # bar, tilted 45 degrees
        img = np.clip(1.2 - np.abs(yy - xx) / np.sqrt(2) * 1.5, 0, 1) * (d <= r)
    return img.astype(np.float32)


def _stamp(canvas: np.ndarray, patch: np.ndarray, row: float, col: float) -> None:
    """Add ``patch`` to ``canvas`` centred at (row, col), clipped at the border."""
    h, w = canvas.shape
    s = patch.shape[0] // 2
    r0, c0 = int(round(row)) - s, int(round(col)) - s
    r1, c1 = r0 + patch.shape[0], c0 + patch.shape[1]
    pr0, pc0 = max(0, -r0), max(0, -c0)
    pr1, pc1 = patch.shape[0] - max(0, r1 - h), patch.shape[1] - max(0, c1 - w)
    if pr1 <= pr0 or pc1 <= pc0:
        return
    canvas[max(r0, 0):min(r1, h), max(c0, 0):min(c1, w)] = np.maximum(
        canvas[max(r0, 0):min(r1, h), max(c0, 0):min(c1, w)], patch[pr0:pr1, pc0:pc1])


def make_parts_dataset(n: int, *, seed: int = 0, size: int = 48, channels: int = 1,
                       positive_fraction: float = 0.5, noise: float = 0.08
                       ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` images: returns (images float32 [n, size, size, channels] in [0, 1],
    labels int64 [n] (1 = object), parts float32 [n, 3, 2] (row, col), NaN for negatives).

    Labels alternate positive/negative for ``positive_fraction=0.5`` (exact balance); other
    fractions draw labels at random.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if size < 32:
        raise ValueError(f"size must be >= 32 so the object fits, got {size}")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    rng = np.random.default_rng(seed)
    sizes = (7, 9, 11)
    strokes = {(k, s): _stroke(k, s) for k in range(3) for s in sizes}
    if positive_fraction == 0.5:
        labels = (np.arange(n) % 2 == 0).astype(np.int64)
    else:
        labels = (rng.random(n) < positive_fraction).astype(np.int64)
    images = np.zeros((n, size, size), np.float32)
    parts = np.full((n, 3, 2), np.nan, np.float32)
    for i in range(n):
        canvas = images[i]
        scale = rng.uniform(0.8, 1.25)
        stroke_size = sizes[int(np.clip(round((scale - 0.8) / 0.45 * 2), 0, 2))]
        if labels[i]:
            margin = 9.0 * scale + stroke_size / 2 + 1
            centre = rng.uniform(margin, size - 1 - margin, size=2)
            pos = centre + LAYOUT * scale + rng.normal(0, 0.7, size=(3, 2))
            for k in range(3):
                _stamp(canvas, strokes[(k, stroke_size)], *pos[k])
            parts[i] = pos
        else:
            kinds = rng.permutation(3).tolist() + ([int(rng.integers(3))] if rng.random() < 0.5 else [])
            for k in kinds:
                at = rng.uniform(stroke_size / 2 + 1, size - 2 - stroke_size / 2, size=2)
                _stamp(canvas, strokes[(k, stroke_size)], *at)
        for _ in range(rng.integers(2, 6)):   # specks
            r, c = rng.integers(0, size, size=2)
            canvas[r, c] = max(canvas[r, c], rng.uniform(0.3, 0.8))
    images += rng.normal(0, noise, size=images.shape).astype(np.float32)
    images = np.clip(images, 0, 1)[..., None]
    if channels == 3:
        images = np.repeat(images, 3, axis=3)
    return images, labels, parts
