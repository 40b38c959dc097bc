"""A writer's claim on its worker name in a run directory.

Before a writer writes anything it takes ``lock.<worker>.json`` (created exclusively), so
two live writers with one identity never interleave: the second is refused with
:class:`RunLockedError`. A lock whose holder is gone (its process died on this host, or its
heartbeat is late: see :mod:`inspector.liveness`) is taken over. Holding the lock, the writer
picks the next session number of its worker, and removes the temporary files that a killed
writer of that worker left behind (no live writer of that worker can own them).

Example::

    claim = Claim.take(Path("runs/x"), "chief", heartbeat_secs=60)
    claim.session        # 1 in a new run, then 2, 3, ... for each later writer of 'chief'
    claim.release()
"""
from __future__ import annotations

import json
import os
import socket
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from .errors import InspectorError
from .format import (LOCK_RE, is_temporary, lock_name, parse_dump_name, parse_manifest_name, parse_stats_name,
                     check_worker)
from .liveness import now_iso, writer_state

#: Locks held by writers of this process: a lock naming this pid is live only if it is here
#: (a notebook may start a second hook while the first one's writer is still open).
_HELD: "weakref.WeakValueDictionary[str, Claim]" = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()


class RunLockedError(InspectorError):
    """Another live writer holds this worker name in the run directory."""


@dataclass(eq=False)
class Claim:
    """The lock of one writer session on ``worker`` in ``run_dir``."""
    run_dir: Path
    worker: str
    session: int
    heartbeat_secs: float

    @property
    def path(self) -> Path:
        return self.run_dir / lock_name(self.worker)

    @classmethod
    def take(cls, run_dir: Path, worker: str, heartbeat_secs: float) -> "Claim":
        """Take the lock of ``worker`` (RunLockedError if a live writer holds it), pick the next
        session number and clean the worker's leftover temporary files."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        claim = cls(run_dir, check_worker(worker), 0, heartbeat_secs)
        claim._acquire()
        claim.session = next_session(run_dir, worker)
        claim.refresh()
        remove_leftovers(run_dir, worker)
        return claim

    def _record(self) -> dict:
        return {"worker": self.worker, "session": self.session, "host": socket.gethostname(), "pid": os.getpid(),
                "updated": now_iso(), "heartbeat_secs": self.heartbeat_secs}

    def _acquire(self) -> None:
        key = str(self.path.resolve())
        with _HELD_LOCK:
            for _ in range(3):
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    holder = _read_lock(self.path)
                    if holder is not None and _live(holder, key):
                        raise RunLockedError(_locked_message(self.run_dir, self.worker, holder)) from None
                    try:  # the holder is gone: take its lock over
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                    continue
                with os.fdopen(fd, "w") as f:
                    json.dump(self._record(), f)
                _HELD[key] = self
                return
        raise RunLockedError(f"could not take {self.path}: other writers keep taking it")

    def refresh(self) -> None:
        """Rewrite the lock with a fresh heartbeat (and the session number), if it is still ours."""
        holder = _read_lock(self.path)
        if holder is None or holder.get("pid") != os.getpid() or holder.get("host") != socket.gethostname():
            return  # taken over (we were judged dead): never touch another writer's lock
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._record()))
        os.replace(tmp, self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        with _HELD_LOCK:
            key = str(self.path.resolve())
            if _HELD.get(key) is self:
                del _HELD[key]
            holder = _read_lock(self.path)
            if holder and holder.get("pid") == os.getpid() and holder.get("session") == self.session:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def _read_lock(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None  # unreadable or half-written by a killed writer: not a live holder


def _live(holder: dict, key: str) -> bool:
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        return key in _HELD  # this process: live only while one of its writers holds it
    return writer_state(holder) == "running"


def _locked_message(run_dir: Path, worker: str, holder: dict) -> str:
    return (f"{run_dir} already has a live writer for worker {worker!r} (session {holder.get('session')}, "
            f"pid {holder.get('pid')} on {holder.get('host')}, heartbeat {holder.get('updated')}): two writers "
            f"with one identity would interleave. End that session first, give this hook another name "
            f"(DumpHook(..., worker='name')), or write to another run directory. A writer that died is "
            f"taken over once its heartbeat is late.")


def next_session(run_dir: Path, worker: str) -> int:
    """1 + the highest session number of ``worker`` found in any file of the run."""
    found = [0]
    for folder, parse in ((run_dir, parse_manifest_name), (run_dir / "stats", parse_stats_name),
                          (run_dir / "dumps", parse_dump_name)):
        if folder.is_dir():
            for entry in os.scandir(folder):
                ids = parse(entry.name)
                if ids and ids[0] == worker:
                    found.append(ids[1])
    return max(found) + 1


def remove_leftovers(run_dir: Path, worker: str) -> int:
    """Delete temporary files a killed writer of ``worker`` left (``.<name>.<random>.tmp``)."""
    removed = 0
    prefixes = (f".manifest.{worker}.", f".graph.{worker}.", f".{worker}.", f".lock.{worker}.")
    for folder in (run_dir, run_dir / "stats", run_dir / "dumps"):
        if not folder.is_dir():
            continue
        for entry in os.scandir(folder):
            if is_temporary(entry.name) and entry.name.startswith(prefixes) and entry.is_file(follow_symlinks=False):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def run_bytes(run_dir: Path) -> int:
    """Bytes of the run's files (temporary files and locks excluded): what a byte budget starts from."""
    total = 0
    for folder in (run_dir, run_dir / "stats", run_dir / "dumps"):
        if folder.is_dir():
            for entry in os.scandir(folder):
                if entry.is_file(follow_symlinks=False) and not is_temporary(entry.name) \
                        and not LOCK_RE.match(entry.name):
                    total += entry.stat(follow_symlinks=False).st_size
    return total
