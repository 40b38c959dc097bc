"""Statistics parts an object store did not take yet, kept on local disk until it does.

A writer on a remote run (``s3://...``) hands each statistics part to the store from its own
thread; when the store is slow or down (a timeout, a refused connection, HTTP 5xx) the part's
bytes go to a spill folder in this machine's cache instead of memory, and later parts follow
them there, so parts reach the store in their order. Once the store answers again the writer
uploads them oldest first, each under the next sequence number of its session (numbers are
given at upload: the session's parts stay consecutive, as compaction needs). The folder is
bounded (``max_bytes``): beyond it the oldest part is dropped, and the writer records its steps
as dropped. Parts still here when the session ends stay on disk; the writer records and logs
where.

The folder is ``$TF_INSPECTOR_CACHE/spill`` (else ``$XDG_CACHE_HOME/tf-inspector/spill``, else
``~/.cache/tf-inspector/spill``), one subfolder per run URL and writer session, created 0700.

Example::

    spill = Spill(spill_folder("s3://bucket/runs/x", "chief", 3), max_bytes=256 << 20)
    dropped = spill.add(part_bytes, rows=606, steps=[10, 11])
    first = spill.oldest()          # upload first.path's bytes, then:
    spill.remove(first)
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

#: Bytes of statistics parts a session keeps on local disk while its store is unreachable
#: (zstd Parquet: ~40 bytes a row, so ~6 million rows).
SPILL_BYTES = 256 << 20


def cache_root() -> Path:
    """This user's tf-inspector cache: $TF_INSPECTOR_CACHE, else the XDG cache folder."""
    env = os.environ.get("TF_INSPECTOR_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tf-inspector"


def spill_folder(url: str, worker: str, session: int) -> Path:
    """The spill folder of one writer session of the run at ``url``."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return cache_root() / "spill" / digest / f"{worker}.s{session:04d}"


@dataclass(frozen=True)
class Spilled:
    """One part on local disk: its file, its rows and steps, its size."""
    path: Path
    rows: int
    steps: tuple[int, ...]
    size: int


class Spill:
    """Parts on local disk, oldest first, at most ``max_bytes`` (see the module docstring)."""

    def __init__(self, folder: Path, max_bytes: int = SPILL_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"spill_bytes={max_bytes} must be >= 0")
        self.folder, self.max_bytes = folder, max_bytes
        self.parts: list[Spilled] = []
        self._count = 0

    @property
    def size(self) -> int:
        """Bytes of the parts kept."""
        return sum(p.size for p in self.parts)

    def add(self, data: bytes, rows: int, steps: list[int]) -> list[Spilled]:
        """Keep ``data`` (a part of ``rows`` rows at ``steps``); returns the parts dropped to
        stay within ``max_bytes`` (the oldest; ``data`` itself if it alone is too large).
        OSError if it cannot be written (a full local disk): the caller drops it."""
        part = Spilled(self.folder / f"{self._count:06d}.parquet", rows,
                       tuple(sorted(set(steps))), len(data))
        if part.size > self.max_bytes:
            return [part]
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        part.path.write_bytes(data)
        self._count += 1
        self.parts.append(part)
        dropped = []
        while self.size > self.max_bytes:
            dropped.append(self.parts[0])
            self.remove(self.parts[0])
        return dropped

    def oldest(self) -> Spilled | None:
        return self.parts[0] if self.parts else None

    def remove(self, part: Spilled) -> None:
        """Forget ``part`` and delete its file (uploaded, or dropped)."""
        self.parts.remove(part)
        part.path.unlink(missing_ok=True)
        if not self.parts:
            try:
                self.folder.rmdir()
            except OSError:
                pass
