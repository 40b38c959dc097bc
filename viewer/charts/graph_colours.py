"""Node colours of the op graph page: a robust value scale with its legend, and what each op shows.

The value scale spans the 2nd to 98th percentile of the chosen statistic over **every captured
op of the model** at the step (not only the ops on screen), so one op's colour means the same in
every view, and values beyond it are clipped (the legend marks its ends ``≤`` / ``≥``). Sizes
and spreads (rms, l2, std) use a log scale of at least one decade: ops that differ by a few percent
(147.4 and 150.5) get nearly the same colour instead of the palette's two ends. Signed statistics
(mean, min, max) use a linear scale at least a tenth of their magnitude wide; ``zero_fraction``
spans [0, 1]. NaN/Inf, dead (every element zero) and the capture states have colours of their own
(:data:`STATES`).

Example::

    s = Scale.robust(values_of_every_captured_op, "rms")
    s.fill(0.12)            # '#3b528b'
    s.ticks()               # [(0.01, '#440154'), ..., (1.0, '#fde725')]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: viridis at 5 stops: dark (low) to yellow (high)
PALETTE = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")
NONFINITE, DEAD, UNCAPTURED, FORWARD_ONLY, NO_STATS = \
    "#d62728", "#9e9e9e", "#ffffff", "#f3e3c3", "#e4e4e4"
#: an op's state -> (fill, legend text); "value" ops are filled from the scale
STATES = {"nonfinite": (NONFINITE, "NaN/Inf"), "dead": (DEAD, "dead (every element zero)"),
          "forward_only": (FORWARD_ONLY, "captured, forward only (no gradient)"),
          "no_stats": (NO_STATS, "captured, no statistics at this step"),
          "uncaptured": (UNCAPTURED, "not captured")}
#: statistics drawn on a log scale (sizes and spreads: positive, and spanning decades)
LOG_STATS = {"rms", "l2", "std"}
#: the percentiles the scale spans
PERCENTILES = (2.0, 98.0)


def palette(t: float) -> str:
    """The colour at ``t`` in [0, 1] along :data:`PALETTE` (linear in RGB between stops).

    >>> palette(0.0), palette(1.0)
    ('#440154', '#fde725')
    """
    t = min(max(float(t), 0.0), 1.0) * (len(PALETTE) - 1)
    i = min(int(t), len(PALETTE) - 2)
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in PALETTE[i:i + 2])
    f = t - i
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def text_colour(fill: str) -> str:
    """Black on light fills, white on dark ones."""
    r, g, b = (int(fill[k:k + 2], 16) for k in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


@dataclass(frozen=True)
class Scale:
    """A value scale: ``lo`` and ``hi`` (the palette's ends), ``log``, and ``n`` the values it was
    made from (0: none, so nothing is filled from it)."""
    lo: float
    hi: float
    log: bool
    stat: str
    n: int = 0

    @classmethod
    def robust(cls, values, stat: str) -> "Scale":
        """The scale of ``stat`` over ``values`` (see the module docstring; non-finite ones are left
        out).

        >>> s = Scale.robust([147.4, 150.5], "rms")
        >>> round(s.hi / s.lo, 6), s.log
        (10.0, True)
        """
        v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
        if stat == "zero_fraction":
            return cls(0.0, 1.0, False, stat, int(v.size))
        if stat in LOG_STATS:
            v = v[v > 0]
        if not v.size:
            return cls(0.0, 1.0, stat in LOG_STATS, stat, 0)
        if stat in LOG_STATS:
            a, b = np.percentile(np.log10(v), PERCENTILES)
            mid, half = (a + b) / 2, max((b - a) / 2, 0.5)             # at least one decade
            return cls(10 ** (mid - half), 10 ** (mid + half), True, stat, int(v.size))
        lo, hi = (float(x) for x in np.percentile(v, PERCENTILES))
        # at least a tenth of the magnitude
        width = max(hi - lo, 0.1 * max(abs(lo), abs(hi)), 1e-12)
        mid = (lo + hi) / 2
        return cls(mid - width / 2, mid + width / 2, False, stat, int(v.size))

    def position(self, value: float) -> float:
        """Where ``value`` lies on the scale, clipped to [0, 1]."""
        if self.log:
            if value <= 0:
                return 0.0
            a, b, x = math.log10(self.lo), math.log10(self.hi), math.log10(value)
        else:
            a, b, x = self.lo, self.hi, value
        return min(max((x - a) / (b - a), 0.0), 1.0) if b > a else 0.5

    def fill(self, value: float) -> str:
        return palette(self.position(value))

    def ticks(self, k: int = 5) -> list[tuple[float, str]]:
        """``k`` (value, colour) pairs evenly along the scale, its ends first and last."""
        out = []
        for i in range(k):
            t = i / (k - 1)
            v = 10 ** (math.log10(self.lo) + t * (math.log10(self.hi) - math.log10(self.lo))) \
                if self.log \
                else self.lo + t * (self.hi - self.lo)
            out.append((v, palette(t)))
        return out

    def describe(self) -> str:
        """What the scale spans, for the legend and the caption."""
        if self.stat == "zero_fraction":
            return "zero_fraction from 0 to 1"
        how = "log scale" if self.log else "linear scale"
        wide = " (at least one decade)" if self.log else " (at least a tenth of their magnitude)"
        return (f"{how} from percentile {PERCENTILES[0]:g} to {PERCENTILES[1]:g} of {self.n} "
                f"captured ops' {self.stat}{wide}")


@dataclass(frozen=True)
class Look:
    """What a node shows: its tensor (None: not captured), the statistic's value, its state
    ('value', or a key of :data:`STATES`), and whether the tensor was captured with its gradient
    (None: unknown, or not a tensor)."""
    tensor: str | None = None
    value: float | None = None
    state: str = "uncaptured"
    gradient: bool | None = None

    @property
    def nonfinite(self) -> bool:
        return self.state == "nonfinite"

    @property
    def dead(self) -> bool:
        return self.state == "dead"


def fill_of(look: Look, scale: Scale) -> str:
    """The fill of a node: its state's colour, else the scale's colour of its value."""
    if look.state == "value" and look.value is not None and math.isfinite(look.value) and scale.n:
        return scale.fill(look.value)
    return STATES.get(look.state, STATES["no_stats"])[0]


def state_text(look: Look, stat: str) -> str:
    """The line a node's label gives its state or value; a forward value of a tensor captured
    without its gradient says so (its gradient view shows nothing).

    >>> state_text(Look("a:0", 0.5, "value", gradient=False), "rms")
    'rms = 0.5 (forward only)'
    """
    if look.state == "value" and look.value is not None:
        return f"{stat} = {look.value:.4g}" + (" (forward only)" if look.gradient is False else "")
    return STATES.get(look.state, STATES["no_stats"])[1]


def legend_items(scale: Scale, states: set[str] | None = None) -> list[tuple[str, str]]:
    """(text, fill) of the legend: the scale's ticks (ends marked ≤ / ≥: values beyond are
    clipped), then the states (those in ``states``; all when None)."""
    items = []
    if scale.n:
        ticks = scale.ticks()
        for i, (v, c) in enumerate(ticks):
            mark = "≤ " if i == 0 and scale.stat != "zero_fraction" else \
                "≥ " if i == len(ticks) - 1 and scale.stat != "zero_fraction" else ""
            items.append((f"{mark}{scale.stat} {v:.3g}", c))
    return items \
        + [(text, fill) for key, (fill, text) in STATES.items() if states is None or key in states]
