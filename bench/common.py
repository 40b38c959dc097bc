"""Small helpers shared by the benchmark scripts: disk usage, tables, the import path.

Example::

    from bench.common import du_bytes, format_table
    print(format_table([("plain", 1.0)], ["config", "ratio"]))
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from inspector.sizes import human_bytes as human_bytes  # noqa: E402 - after the path set-up; re-exported


def du_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk under ``path``; 0 if missing. Per file the larger of its allocated blocks
    (what ``du -s --block-size=1`` says) and its size: ext4 allocates the blocks of data not
    yet written back (no fsync) only at writeback, so a fresh file can show fewer blocks."""
    total = 0
    if os.path.isfile(path):
        st = os.lstat(path)
        return max(st.st_blocks * 512, st.st_size)
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
                total += max(st.st_blocks * 512, st.st_size)
            except FileNotFoundError:  # a temporary file renamed away meanwhile
                pass
    return total


def format_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table with right-aligned columns (the first left-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])
