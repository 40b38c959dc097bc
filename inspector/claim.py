"""A writer's claim on its worker name in a run directory.

Before a writer writes anything it takes ``lock.<worker>.json`` (created exclusively), so
two live writers with one identity never interleave: the second is refused with
:class:`RunLockedError`. A lock whose holder is gone (its process died on this host, or its
heartbeat is late: see :mod:`inspector.liveness`) is taken over. Holding the lock, the writer
picks the next session number of its worker, and removes the temporary files that a killed
writer of that worker left behind (no live writer of that worker can own them).

The lock goes through the run's storage (``inspector.storage``): locally an ``O_EXCL``
create; in S3 a conditional PUT (``If-None-Match: *``), which the store refuses if the lock
exists; elsewhere check-then-write (FORMAT.md says what that leaves open). Every lock holds a
random ``token``, read back after taking it, so a writer never mistakes another's lock for its own.

Example::

    claim = Claim.take(Path("runs/x"), "chief", heartbeat_secs=60)
    claim.session        # 1 in a new run, then 2, 3, ... for each later writer of 'chief'
    claim.release()
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from .errors import InspectorError
from .format import (LOCK_RE, is_temporary, lock_name, parse_dump_name, parse_manifest_name, parse_stats_name,
                     check_worker)
from .liveness import now_iso, writer_state
from .storage import Storage, normalize, open_storage

#: Locks held by writers of this process: a lock naming this pid is live only if it is here
#: (a notebook may start a second hook while the first one's writer is still open).
_HELD: "weakref.WeakValueDictionary[str, Claim]" = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()


class RunLockedError(InspectorError):
    """Another live writer holds this worker name in the run directory."""


@dataclass(eq=False)
class Claim:
    """The lock of one writer session on ``worker`` in ``run_dir`` (a folder, a URL or a Storage)."""
    run_dir: Path | str | Storage
    worker: str
    session: int
    heartbeat_secs: float
    bytes_before: int = 0   # the run's bytes when the session started (scan)

    def __post_init__(self) -> None:
        self.run_dir = normalize(self.run_dir)
        self.store = open_storage(self.run_dir)
        self.token = secrets.token_hex(8)  # tells our lock from another writer's, on any backend

    @property
    def rel(self) -> str:
        return lock_name(self.worker)

    @property
    def path(self) -> Path | str:
        """The lock file: a Path on local disk, a URL in an object store."""
        return Path(self.store.display(self.rel)) if self.store.is_local else self.store.display(self.rel)

    @classmethod
    def take(cls, run_dir: Path | str | Storage, worker: str, heartbeat_secs: float) -> "Claim":
        """Take the lock of ``worker`` (RunLockedError if a live writer holds it), pick the next
        session number and clean the worker's leftover temporary files."""
        claim = cls(run_dir, check_worker(worker), 0, heartbeat_secs)
        claim.store.makedirs("")
        claim._acquire()
        found = scan(claim.store, worker)
        claim.session, claim.bytes_before = found.session, found.bytes
        claim.refresh()
        _remove(claim.store, found.leftovers)
        return claim

    def _record(self) -> dict:
        return {"worker": self.worker, "session": self.session, "host": socket.gethostname(), "pid": os.getpid(),
                "updated": now_iso(), "heartbeat_secs": self.heartbeat_secs, "token": self.token}

    def _key(self) -> str:
        return str(Path(str(self.path)).resolve()) if self.store.is_local else str(self.path)

    def _acquire(self) -> None:
        key = self._key()
        with _HELD_LOCK:
            for _ in range(3):
                if not self.store.create(self.rel, json.dumps(self._record()).encode()):
                    holder = _read_lock(self.store, self.rel)
                    if holder is not None and _live(holder, key):
                        raise RunLockedError(_locked_message(self.store.display(), self.worker, holder)) from None
                    self.store.delete(self.rel)  # the holder is gone: take its lock over
                    continue
                if not self._ours(_read_lock(self.store, self.rel)):
                    # a backend whose create is check-then-write let another writer in meanwhile:
                    # refuse rather than guess which of the two holds the worker name
                    raise RunLockedError(f"{self.path}: another writer took the lock of worker {self.worker!r} "
                                         f"at the same moment; end it or give this hook another worker name")
                _HELD[key] = self
                return
        raise RunLockedError(f"could not take {self.path}: other writers keep taking it")

    def _ours(self, holder: dict | None) -> bool:
        return holder is not None and holder.get("token", self.token) == self.token and \
            holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()

    def refresh(self) -> None:
        """Rewrite the lock with a fresh heartbeat (and the session number), if it is still ours."""
        if not self._ours(_read_lock(self.store, self.rel)):
            return  # taken over (we were judged dead): never touch another writer's lock
        self.store.write(self.rel, [json.dumps(self._record()).encode()])

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        with _HELD_LOCK:
            key = self._key()
            if _HELD.get(key) is self:
                del _HELD[key]
            holder = _read_lock(self.store, self.rel)
            if holder is not None and self._ours(holder) and holder.get("session") == self.session:
                self.store.delete(self.rel)


def _read_lock(store: Storage, rel: str) -> dict | None:
    try:
        d = json.loads(store.read(rel, limit=1 << 20))
        return d if isinstance(d, dict) else None
    except (OSError, ValueError, InspectorError):
        return None  # unreadable or half-written by a killed writer: not a live holder


def _live(holder: dict, key: str) -> bool:
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        return key in _HELD  # this process: live only while one of its writers holds it
    return writer_state(holder) == "running"


def _locked_message(run_dir: Path | str, worker: str, holder: dict) -> str:
    here = holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
    where = (" It is a writer of this process: a DumpHook or InspectCallback still open (a Keras fit that ended by "
             "an exception keeps its session ~2 s, until its writer sees the fit gone, or until that callback's "
             "next fit: wait, or call its close() first)." if here else
             " A writer that died is taken over once its heartbeat is late.")
    return (f"{run_dir} already has a live writer for worker {worker!r} (session {holder.get('session')}, "
            f"pid {holder.get('pid')} on {holder.get('host')}, heartbeat {holder.get('updated')}): two writers "
            f"with one identity would interleave. End that session first, give this writer another name "
            f"(DumpHook(..., worker='name') or InspectCallback(..., worker='name')), or write to another run "
            f"directory.{where}")


_FOLDERS = (("", parse_manifest_name), ("stats", parse_stats_name), ("dumps", parse_dump_name))


@dataclass
class Scan:
    """What one listing of a run tells a writer session that is starting."""
    session: int            # 1 + the highest session number of the worker in any file of the run
    leftovers: list[str]    # temporary files a killed writer of the worker left (``.<name>.<random>.tmp``)
    bytes: int              # the run's bytes (temporary files, locks and links excluded)


def scan(run_dir: Path | str | Storage, worker: str) -> Scan:
    """One pass over the run's folders (a session used to list them three times: at 1,900
    files, 28 ms of every ``fit``'s start on local disk, and three times the requests on an
    object store). Object stores have no temporary files (an unfinished multipart upload is no
    object: the bucket's lifecycle rule for incomplete uploads removes it)."""
    store = open_storage(normalize(run_dir))
    found = Scan(1, [], 0)
    prefixes = (f".manifest.{worker}.", f".graph.{worker}.", f".{worker}.", f".lock.{worker}.")
    for sub, parse in _FOLDERS:
        for entry in store.list(sub):
            ids = parse(entry.name)   # a link's name counts too: the new session never reuses it
            if ids and ids[0] == worker:
                found.session = max(found.session, ids[1] + 1)
            if entry.size is None or entry.link:
                continue
            if is_temporary(entry.name):
                if entry.name.startswith(prefixes):
                    found.leftovers.append(f"{sub}/{entry.name}" if sub else entry.name)
            elif not LOCK_RE.match(entry.name):
                found.bytes += entry.size
    return found


def next_session(run_dir: Path | str | Storage, worker: str) -> int:
    """1 + the highest session number of ``worker`` found in any file of the run."""
    return scan(run_dir, worker).session


def _remove(store: Storage, leftovers: list[str]) -> None:
    for rel in leftovers:
        if store.is_local and (os.path.islink(store.display(rel)) or not os.path.isfile(store.display(rel))):
            continue
        store.delete(rel)
