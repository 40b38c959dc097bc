"""Byte counts for people: one style everywhere (CLI, viewer, hook log, benchmarks).

Binary units, labelled as such (KiB = 1024 bytes), so a size printed by ``info`` matches
the viewer's and ``du -h``'s.
"""
from __future__ import annotations


def human_bytes(n: float) -> str:
    """``human_bytes(1536) == '1.5 KiB'``; whole bytes below 1 KiB, TiB at most."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
