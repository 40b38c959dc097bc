"""Digests of summary-less statistics parts (:mod:`inspector.stats.digest`) kept on local disk,
so a second ``info`` (or viewer start) on a run of many small parts reads none of them again.

One JSON file per run, ``<cache>/digests/<sha256 of the run's path or URL>.json`` (the cache
folder of :func:`inspector.storage.spill.cache_root`, created 0700, files 0600): never in the
run directory, which may be read-only, an object store, or a live writer's. An entry is used
only for the part version it was made from: its name, size and stamp (mtime in ns locally, the
ETag remotely; ``storage.Entry``), so a replaced part is read again. Only parts that read
without error get an entry (a damaged one is read, and reported, each time). An unreadable,
foreign or damaged cache file is ignored and rewritten; one that cannot be written (a
read-only home) leaves the reader as it was, reading every part.

Example::

    cache = DigestCache.for_run("/runs/x")
    d = cache.get(("stats/chief.s0001.000007.parquet", 31_000, "1733462400123456789"))
    cache.put(part, digest); cache.save(live_parts)
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from inspector.stats.digest import Digest
from inspector.storage.spill import cache_root

#: Bumped when an entry's layout changes: files of another version are ignored.
VERSION = 1
#: Bytes a cache file may have to be read (~150 bytes a one-step part: 1M parts).
MAX_BYTES = 256 << 20
#: Steps one entry may expand to (a part of more is read, not cached).
MAX_STEPS = 10_000_000


class DigestCache:
    """The cached digests of one run's parts (see the module docstring)."""

    def __init__(self, file: Path, run: str) -> None:
        self.file, self.run = file, run
        self._entries: dict[str, list] = _load(file, run)
        self._dirty = False

    @classmethod
    def for_run(cls, run: str) -> "DigestCache":
        """The cache of the run at ``run`` (its local path or URL, as the reader shows it)."""
        name = hashlib.sha256(str(run).encode()).hexdigest()[:32]
        return cls(cache_root() / "digests" / f"{name}.json", str(run))

    def get(self, part: tuple) -> Digest | None:
        """The digest of ``part`` (name, size, stamp) if this version of it has one."""
        e = self._entries.get(part[0])
        if e is None or e[0] != part[1] or e[1] != part[2]:
            return None
        try:
            return _decode(e[2:])
        except (TypeError, ValueError, IndexError):
            return None   # a damaged entry: the part is read again

    def put(self, part: tuple, d: Digest) -> None:
        """Remember ``d`` as the digest of ``part``'s version."""
        self._entries[part[0]] = [part[1], part[2], *_encode(d)]
        self._dirty = True

    def save(self, live: Iterable[tuple]) -> None:
        """Write the entries of the parts ``live`` (others, compacted away, are dropped) if any
        was added; atomically (a reader beside never sees half a file). An OSError (no space,
        a read-only cache folder) leaves the file as it was: the cache only saves reads."""
        if not self._dirty:
            return
        names = {p[0] for p in live}
        self._entries = {k: v for k, v in self._entries.items() if k in names}
        body = json.dumps({"version": VERSION, "run": self.run, "parts": self._entries},
                          separators=(",", ":"))
        try:
            self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".tmp-")  # 0600
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(body)
                os.replace(tmp, self.file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            return
        self._dirty = False


def _load(file: Path, run: str) -> dict[str, list]:
    """The entries of ``file`` if it is this version's cache of ``run``, else none."""
    try:
        if file.stat().st_size > MAX_BYTES:
            return {}
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    if not (isinstance(data, dict) and data.get("version") == VERSION and data.get("run") == run
            and isinstance(data.get("parts"), dict)):
        return {}
    return {k: v for k, v in data["parts"].items()
            if isinstance(k, str) and isinstance(v, list) and len(v) == 5}


def _encode(d: Digest) -> list:
    """[steps by "kind/group", every step, nonfinite span] as step runs (JSON numbers)."""
    from inspector.stats.summary import step_runs
    return [{f"{k}\0{g}": step_runs(v) for (k, g), v in d.steps.items()}, step_runs(d.every),
            [list(x) for x in d.nonfinite]]


def _decode(e: list) -> Digest:
    """The Digest of an entry's last three fields; ValueError/TypeError if damaged."""
    by, every, nonfinite = e
    steps = {tuple(k.split("\0")): _steps(v) for k, v in by.items()}
    if any(len(k) != 2 for k in steps):
        raise ValueError("a kind/group key without its two parts")
    spans = [(int(a), int(b)) for a, b in nonfinite]
    return Digest(steps, _steps(every), spans)


def _steps(runs: Any) -> np.ndarray:
    """The steps of ``[first, last, stride]`` runs (summary.step_runs's form); ValueError where
    they would be more than MAX_STEPS (a damaged entry must not fill memory)."""
    if sum((int(b) - int(a)) // max(int(s), 1) + 1 for a, b, s in runs) > MAX_STEPS:
        raise ValueError("more steps than a part holds")
    out = [np.arange(int(a), int(b) + 1, int(s), dtype=np.int64) for a, b, s in runs
           if int(s) > 0 and int(b) >= int(a)]
    return np.concatenate(out) if out else np.zeros(0, np.int64)
