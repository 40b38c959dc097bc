"""A harder synthetic object-part dataset for the ICNN study, in NumPy, deterministic from a seed.

Why not ``parts_data``: there each part kind appears once per image on a clean background,
so a plain CNN's filters are already part detectors and the ICNN has nothing to add. Here,
in the spirit of the paper's object-part setting, part kinds recur outside the object:

- **Object** (positive images): four parts, a ring on top, a plus on the left, a bar on the
  right and a square outline at the bottom, around a random centre, at a random scale
  (0.75 to 1.3), rotated by up to 25 degrees, each part jittered by ~1.5 px and given its own
  brightness.
- **Negatives**: the same four part kinds, placed independently at random: classifying needs
  the arrangement.
- **Distractors** (both classes): 2 to 4 loose parts of random kind, size and brightness, so
  a filter that detects "a ring" finds one off the object in many positive images.
- **Textured background**: two or three random oriented sinusoidal gratings plus noise.

``parts[n, k]`` is the (row, col) pixel centre (0-based) of part ``k`` (``PART_NAMES``) of the
object in image ``n``; NaN for negatives. Distractors are not landmarks.

Example::

    >>> images, labels, parts = make_scene_dataset(6, seed=0)
    >>> images.shape, images.dtype, labels.tolist(), parts.shape
    ((6, 40, 40, 1), dtype('float32'), [1, 0, 1, 0, 1, 0], (6, 4, 2))
    >>> bool(np.isnan(parts[1]).all()), bool(np.isfinite(parts[0]).all())
    (True, True)
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from examples.parts_data import _stamp, _stroke

PART_NAMES = ("ring", "plus", "bar", "square")
# Offsets of the parts from the object centre (row, col) at scale 1, in pixels.
LAYOUT = np.array([[-7.0, 0.0], [1.0, -7.5], [1.0, 7.5], [8.0, 0.0]])
STROKE_SIZES = (5, 7, 9)


def _square(size: int) -> np.ndarray:
    """A square outline on a size x size patch, values in [0, 1]."""
    r = size // 2
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1].astype(np.float64)
    edge = np.abs(np.maximum(np.abs(yy), np.abs(xx)) - 0.75 * r)
    return np.clip(1.2 - edge * 1.5, 0, 1).astype(np.float32)


def _patch(kind: int, size: int) -> np.ndarray:
    return _square(size) if kind == 3 else _stroke(kind, size)


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """Two or three random oriented gratings (periods 3 to 12 px) plus pixel noise, in [0, ~0.45]."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    out = np.zeros((size, size))
    for _ in range(int(rng.integers(2, 4))):
        theta, period, phase = rng.uniform(0, np.pi), rng.uniform(3.0, 12.0), rng.uniform(0, 2 * np.pi)
        wave = np.sin(2 * np.pi * (yy * np.cos(theta) + xx * np.sin(theta)) / period + phase)
        out += rng.uniform(0.04, 0.12) * (wave + 1)
    return out + rng.normal(0, 0.04, size=(size, size))


def make_scene_dataset(n: int, *, seed: int = 0, size: int = 40, distractors: Tuple[int, int] = (2, 4)
                       ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` images: (images float32 [n, size, size, 1] in [0, 1], labels int64 [n] (1 = object,
    alternating 1, 0, ...), parts float32 [n, 4, 2] (row, col), NaN for negatives).

    ``distractors``: the inclusive range of loose parts added to every image.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if size < 32:
        raise ValueError(f"size must be >= 32 so the object fits, got {size}")
    lo, hi = distractors
    if not 0 <= lo <= hi:
        raise ValueError(f"distractors must be (low, high) with 0 <= low <= high, got {distractors!r}")
    rng = np.random.default_rng(seed)
    patches = {(k, s): _patch(k, s) for k in range(len(PART_NAMES)) for s in STROKE_SIZES}
    labels = (np.arange(n) % 2 == 0).astype(np.int64)
    images = np.zeros((n, size, size), np.float32)
    parts = np.full((n, len(PART_NAMES), 2), np.nan, np.float32)
    for i in range(n):
        canvas = np.zeros((size, size), np.float32)
        scale = rng.uniform(0.75, 1.3)
        stroke = STROKE_SIZES[int(np.clip(round((scale - 0.75) / 0.55 * 2), 0, 2))]
        if labels[i]:
            angle = np.deg2rad(rng.uniform(-25, 25))
            rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            offsets = LAYOUT @ rot.T * scale
            margin = np.abs(offsets).max(axis=0) + stroke / 2 + 1
            centre = rng.uniform(margin, size - 1 - margin)
            pos = centre + offsets + rng.normal(0, 1.5, size=offsets.shape)
            parts[i] = pos
        else:
            pos = rng.uniform(stroke / 2 + 1, size - 2 - stroke / 2, size=(len(PART_NAMES), 2))
        for k in range(len(PART_NAMES)):
            _stamp(canvas, patches[(k, stroke)] * rng.uniform(0.6, 1.0), *pos[k])
        for _ in range(int(rng.integers(lo, hi + 1))):
            kind, s = int(rng.integers(len(PART_NAMES))), STROKE_SIZES[int(rng.integers(len(STROKE_SIZES)))]
            at = rng.uniform(s / 2 + 1, size - 2 - s / 2, size=2)
            _stamp(canvas, patches[(kind, s)] * rng.uniform(0.6, 1.0), *at)
        images[i] = np.maximum(canvas, _texture(rng, size))
    return np.clip(images, 0, 1)[..., None], labels, parts
