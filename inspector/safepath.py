"""Path checks for hostile folders, shared by the CLI and the viewer (standard library only).

A run folder may come from someone else: a file named like a manifest may be a FIFO (opening
it blocks forever), a symlink may lead out of the folder the viewer serves. These helpers
look with ``lstat``/``stat`` and never open a file.

Example::

    inside("/srv/runs/exp1", "/srv/runs")                    # True (symlinks resolved)
    special_entries(Path("runs/exp1"))                       # [] or the names a reader must not open
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .format import parse_dump_name, parse_manifest_name, parse_stats_name

#: (sub-folder, name parser) of the files a reader opens (every format version's names).
RUN_FILES = (("", parse_manifest_name), ("stats", parse_stats_name), ("dumps", parse_dump_name))


def is_regular_file(path: str | Path, follow: bool = True) -> bool:
    """True if ``path`` is a regular file (after following symlinks unless ``follow`` is false);
    False for FIFOs, sockets, devices, folders and missing paths. Never opens ``path``."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode)


def real(path: str | Path) -> Path:
    """``path`` absolute with every symlink resolved (as far as it exists)."""
    return Path(os.path.realpath(path))


def inside(path: str | Path, root: str | Path) -> bool:
    """True if ``path``, symlinks resolved, is ``root`` (resolved) or lies below it."""
    p, r = real(path), real(root)
    return p == r or r in p.parents


def run_entries(run_dir: str | Path) -> list[Path]:
    """The entries of ``run_dir`` named like files a reader opens (manifests, statistics, dumps)."""
    out = []
    for sub, pattern in RUN_FILES:
        try:
            with os.scandir(os.path.join(run_dir, sub)) as it:
                out += [Path(e.path) for e in it if pattern(e.name)]
        except OSError:
            continue
    return sorted(out)


def special_entries(run_dir: str | Path, root: str | Path | None = None) -> list[str]:
    """Why each file of ``run_dir`` that a reader would open must not be opened: not a regular
    file (FIFO, socket, device, folder), or, with ``root``, a symlink leading outside ``root``."""
    bad = []
    for p in run_entries(run_dir):
        if root is not None and not inside(p, root):
            bad.append(f"{p.name} leads outside {root}")
        elif not is_regular_file(p):
            bad.append(f"{p.name} is not a regular file")
    return bad


def has_manifest(folder: str | Path) -> bool:
    """True if ``folder`` holds a manifest that is a regular file (checked without opening it)."""
    try:
        with os.scandir(folder) as it:
            return any(parse_manifest_name(e.name) and is_regular_file(e.path) for e in it)
    except OSError:
        return False


__all__ = ["is_regular_file", "real", "inside", "run_entries", "special_entries", "has_manifest"]
