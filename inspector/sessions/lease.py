"""A writer's claim on its worker name in a run directory: a lease.

Before a writer writes anything it takes ``lock.<worker>.json`` (created exclusively), so
two live writers with one identity never interleave: the second is refused with
:class:`RunLockedError`. Holding the lock, the writer picks the next session number of its
worker, and removes the temporary files that a killed writer of that worker left behind (no
live writer of that worker can own them).

The lock is a lease (FORMAT.md, "The lock"): its holder rewrites it every heartbeat, and
another writer takes it over only when its holder is provably gone: its process is dead
(same host), or the lock is older than ``liveness.stale_after`` by the store's own clock
(S3: the response's ``Date`` minus the object's ``Last-Modified``; on disk its mtime). A lock
that cannot be read (a timeout, HTTP 5xx) is never taken over: that is a StorageError. The
takeover replaces only the version judged dead (S3 ``If-Match``; on disk a rename), so of two
writers taking one dead lock over, one wins. The holder checks the lock before each write
(:meth:`Claim.ensure`): a lock deleted under it is recreated (and recorded), one another writer
holds now ends the session (:class:`LeaseLostError`); a lock it cannot read is trusted only
while its lease, counted from its own last heartbeat, cannot have run out.

The lock goes through the run's storage (``inspector.storage``): locally an exclusive link;
in S3 a conditional PUT (``If-None-Match: *``), which the store refuses if the lock exists;
elsewhere check-then-write (FORMAT.md says what that leaves open). Every lock holds a random
``token``, read back after taking it, so a writer never mistakes another's lock for its own.

Example::

    claim = Claim.take(Path("runs/x"), "chief", heartbeat_secs=60)
    claim.session        # 1 in a new run, then 2, 3, ... for each later writer of 'chief'
    claim.ensure()       # before each write: still ours (recreated if it was deleted)
    claim.release()
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from inspector.errors import InspectorError, StorageError
from inspector.format import (LOCK_RE, check_worker, is_temporary, lock_name, parse_dump_name,
                              parse_manifest_name, parse_stats_name)
from inspector.sessions.liveness import alive, now_iso, stale_after, writer_state
from inspector.storage import Storage, Version, normalize, open_storage

log = logging.getLogger("tf_inspector")

#: Locks held by writers of this process: a lock naming this pid is live only if it is here
#: (a notebook may start a second hook while the first one's writer is still open).
_HELD: "weakref.WeakValueDictionary[str, Claim]" = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()
#: The part of a lease its holder uses without reading the lock back: a store that cannot be
#: read is trusted until this fraction of ``stale_after`` has passed since the last heartbeat
#: written, less LEASE_MARGIN_SECS (the store's clock and ours run at slightly different rates,
#: and its ``Last-Modified`` has whole seconds).
LEASE_SAFE_FRACTION = 0.8
LEASE_MARGIN_SECS = 2.0


class RunLockedError(InspectorError):
    """Another live writer holds this worker name in the run directory."""


class LeaseLostError(InspectorError):
    """This session's lock is held by another writer now: the session stops writing."""


@dataclass(eq=False)
class Claim:
    """The lock of one writer session on ``worker`` in ``run_dir``
    (a folder, a URL or a Storage)."""
    run_dir: Path | str | Storage
    worker: str
    session: int
    heartbeat_secs: float
    bytes_before: int = 0   # the run's bytes when the session started (scan)

    def __post_init__(self) -> None:
        self.run_dir = normalize(self.run_dir)
        self.store = open_storage(self.run_dir)
        self.token = secrets.token_hex(8)  # tells our lock from another writer's, on any backend
        #: why this session lost its lock (another writer holds it), or None
        self.lost: str | None = None
        #: called with a sentence for each thing the holder did to its lock that a user should
        #: know (recreated, lost): the writer records it in the manifest's ``errors``
        self.on_event: Callable[[str], None] | None = None
        # time.monotonic() just before our last write of the lock
        self._written: float | None = None

    @property
    def rel(self) -> str:
        return lock_name(self.worker)

    @property
    def path(self) -> Path | str:
        """The lock file: a Path on local disk, a URL in an object store."""
        return Path(self.store.display(self.rel)) if self.store.is_local \
            else self.store.display(self.rel)

    @classmethod
    def take(cls, run_dir: Path | str | Storage, worker: str, heartbeat_secs: float) -> "Claim":
        """Take the lock of ``worker`` (RunLockedError if a live writer holds it, StorageError if
        it cannot be read), pick the next session number and clean the worker's leftovers."""
        claim = cls(run_dir, check_worker(worker), 0, heartbeat_secs)
        claim.store.makedirs("")
        claim._acquire()
        try:
            found = scan(claim.store, worker)
            claim.session, claim.bytes_before = found.session, found.bytes
            claim.refresh()
        except BaseException:   # the store failed us halfway: leave no lock behind
            try:
                claim.release()
            except Exception as e:  # noqa: BLE001 - the first error is the one to report
                log.warning("tf_inspector: could not remove %s: %s", claim.path, e)
            raise
        _remove(claim.store, found.leftovers)
        try:   # no live writer of this worker: its unfinished uploads are a killed writer's
            aborted = claim.store.abort_uploads(lambda rel: _owner(rel) == claim.worker)
        except StorageError as e:
            log.warning("tf_inspector: could not abort the unfinished uploads of %s (%s)",
                        claim.store.display(), e.cause or e)
        else:
            if aborted:
                log.info("tf_inspector: aborted %d unfinished upload(s) of worker %s in %s",
                         aborted, claim.worker, claim.store.display())
        return claim

    def _record(self) -> bytes:
        return json.dumps({"worker": self.worker, "session": self.session,
                           "host": socket.gethostname(), "pid": os.getpid(), "updated": now_iso(),
                           "heartbeat_secs": self.heartbeat_secs, "token": self.token}).encode()

    def _key(self) -> str:
        return str(Path(str(self.path)).resolve()) if self.store.is_local else str(self.path)

    def _acquire(self) -> None:
        key = self._key()
        with _HELD_LOCK:
            for _ in range(3):
                started = time.monotonic()
                if self.store.create(self.rel, self._record()):
                    self._won(key, started, None)
                    return
                version = self._read("take")
                if version is None:
                    continue  # removed meanwhile: create it again
                holder = _parse(version.data)
                why = _gone(holder, version.age, key, self.heartbeat_secs)
                if why is None and holder is not None:
                    raise RunLockedError(_locked_message(self.store.display(), self.worker, holder))
                started = time.monotonic()
                # only the version judged gone
                if self.store.replace(self.rel, self._record(), version.tag):
                    self._won(key, started, why)
                    return
        raise RunLockedError(f"could not take {self.path}: other writers keep taking it")

    def _won(self, key: str, started: float, took_over: str | None) -> None:
        """After our create or replace: read it back (a check-then-write backend may have let
        another writer in meanwhile: refuse rather than guess which one holds the worker)."""
        version = self._read("take")
        if version is None or not self._ours(_parse(version.data)):
            raise RunLockedError(f"{self.path}: another writer took the lock of worker "
                                 f"{self.worker!r} at the same moment; end it or give this hook "
                                 "another worker name")
        self._written = started
        _HELD[key] = self
        if took_over:
            log.warning("tf_inspector: took over %s: %s", self.path, took_over)

    def _read(self, doing: str) -> Version | None:
        """The lock's current version (None: there is none); StorageError naming the lock and
        saying that nothing was taken over when it cannot be read."""
        try:
            return self.store.read_version(self.rel)
        except StorageError as e:
            what = ("it is not taken over: a lock that cannot be read may be a live writer's; try "
                    "again once the store answers" if doing == "take"
                    else "this session does not write until it can")
            raise StorageError(f"{self.path}: the lock could not be read ({e.cause or e}); {what}",
                               self.store.display(self.rel), e.cause) from None

    def _ours(self, holder: dict | None) -> bool:
        return holder is not None and holder.get("token", self.token) == self.token and \
            holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()

    def _lease_left(self) -> float:
        """Seconds this session may still write without reading its lock: no other writer can
        judge the lock stale before its lease, counted from our last write of it, runs out."""
        if self._written is None:
            return 0.0
        safe = LEASE_SAFE_FRACTION * stale_after(self.heartbeat_secs) - LEASE_MARGIN_SECS
        return safe - (time.monotonic() - self._written)

    def ensure(self) -> None:
        """Before each write: return if the lock is still ours (recreated if it was gone: a
        delete by hand, a wiped bucket); LeaseLostError if another writer holds it now;
        StorageError if it cannot be read and the lease may have run out meanwhile."""
        self._check()

    def _check(self) -> Version | None:
        """ensure(); the lock's version when it was read and is ours (None: recreated, or
        unreadable within the lease)."""
        if self.lost:
            raise LeaseLostError(self.lost)
        try:
            version = self._read("hold")
        except StorageError:
            if self._lease_left() > 0:
                return None  # ours by the lease, whatever the store says now
            raise
        if version is None:
            self._recreate()
            return None
        holder = _parse(version.data)
        if not self._ours(holder):
            self._lose(holder)
        return version

    def _recreate(self) -> None:
        """The lock is gone while we hold it: create it again, unless a later session of this
        worker started meanwhile (we could not renew the lease, it took over, then ended)."""
        later = [ids for e in self.store.list("") if (ids := parse_manifest_name(e.name))
                 and ids[0] == self.worker and ids[1] > self.session]
        if later:
            self._lose(None, f"a later session ({max(s for _, s in later)}) of worker "
                             f"{self.worker!r} wrote into the run while this one could not renew "
                             "its lock")
        started = time.monotonic()
        if not self.store.create(self.rel, self._record()):
            version = self._read("hold")
            if version is None or not self._ours(_parse(version.data)):
                self._lose(None if version is None else _parse(version.data))
            return
        self._written = started
        self._event(f"{self.rel} was gone while session {self.session} held it (deleted, or the "
                    f"store lost it); recreated")

    def _lose(self, holder: dict | None, why: str | None = None) -> None:
        """Give the worker name up: from now on this session writes nothing (LeaseLostError)."""
        if why is None:
            who = (f"session {holder.get('session')}, pid {holder.get('pid')} on "
                   f"{holder.get('host')}"
                   if holder else "a writer whose lock is not a lock record")
            why = (f"{self.rel} is held by another writer ({who}): this session's lease ran out "
                   "(its heartbeat could not be written for "
                   f"{stale_after(self.heartbeat_secs):.0f} s) or the lock was replaced")
        self.lost = f"{why}; session {self.session} stopped writing"
        with _HELD_LOCK:
            key = self._key()
            if _HELD.get(key) is self:
                del _HELD[key]
        self._event(self.lost)
        raise LeaseLostError(self.lost)

    def _event(self, text: str) -> None:
        log.warning("tf_inspector: %s: %s", self.store.display(), text)
        if self.on_event is not None:
            self.on_event(text)

    def refresh(self) -> None:
        """The heartbeat: rewrite the lock with a fresh ``updated`` (and the session number),
        after :meth:`ensure`. Where the store compares and swaps (S3 ``If-Match``,
        ``memory://``) only the version just read is replaced; elsewhere the lock is rewritten
        (a taker waits out the lease first, which this write renews)."""
        version = self._check()
        started = time.monotonic()
        if version is not None and self.store.exclusive == "atomic" and not self.store.is_local:
            if not self.store.replace(self.rel, self._record(), version.tag):
                self._check()  # replaced or removed meanwhile: lost, or recreated
                return
        elif version is not None or self._lease_left() > 0:
            self.store.write(self.rel, [self._record()])
        else:
            return  # recreated just now by _check
        self._written = started

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        with _HELD_LOCK:
            key = self._key()
            if _HELD.get(key) is self:
                del _HELD[key]
            try:
                version = self.store.read_version(self.rel)
            except StorageError as e:
                log.warning("tf_inspector: could not remove %s (%s); it is taken over once its "
                            "heartbeat is late", self.path, e.cause or e)
                return
            # the token is this claim's alone
            if version is not None and self._ours(_parse(version.data)):
                self.store.delete(self.rel)


def _parse(data: bytes) -> dict | None:
    """A lock's record, or None for bytes that are not one."""
    try:
        d = json.loads(data)
        return d if isinstance(d, dict) else None
    except (ValueError, UnicodeDecodeError):
        return None


def _gone(holder: dict | None, age: float | None, key: str, heartbeat_secs: float) -> str | None:
    """Why the lock's holder is provably gone, or None while it may be alive. ``age``: the
    lock's age by the store's clock (None: the store does not say; then the holder's own
    ``updated`` is compared with this host's clock, as before leases)."""
    # every writer writes its lock whole (an exclusive link, one PUT): none is live
    if holder is None:
        return "its lock is not a lock record"
    pid, host = holder.get("pid"), holder.get("host")
    if pid == os.getpid() and host == socket.gethostname():
        return None if key in _HELD else "its writer, in this process, has ended"
    if isinstance(pid, int) and not isinstance(pid, bool) and host == socket.gethostname() \
            and not alive(pid):
        return f"its process {pid} on this host is gone"
    beat = holder.get("heartbeat_secs")
    beat = beat if isinstance(beat, (int, float)) and not isinstance(beat, bool) and beat > 0 \
        else heartbeat_secs
    if age is not None:
        limit = stale_after(beat)
        return (f"its last heartbeat is {age:.0f} s old by the store's clock (more than "
                f"{limit:.0f} s)"
                if age > limit else None)
    return "its heartbeat is late" if writer_state(holder) == "stalled" else None


def _locked_message(run_dir: Path | str, worker: str, holder: dict) -> str:
    here = holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
    where = (" It is a writer of this process: a DumpHook or InspectCallback still open (a Keras "
             "fit that ended by an exception keeps its session ~2 s, until its writer sees the fit "
             "gone, or until that callback's next fit: wait, or call its close() first)." if here
             else " A writer that died is taken over once its lock is older than its lease "
             "(STALE_HEARTBEATS heartbeats, by the store's clock).")
    return (f"{run_dir} already has a live writer for worker {worker!r} (session "
            f"{holder.get('session')}, pid {holder.get('pid')} on {holder.get('host')}, heartbeat "
            f"{holder.get('updated')}): two writers with one identity would interleave. End that "
            "session first, give this writer another name (DumpHook(..., worker='name') or "
            f"InspectCallback(..., worker='name')), or write to another run directory.{where}")


_FOLDERS = (("", parse_manifest_name), ("stats", parse_stats_name), ("dumps", parse_dump_name))


def _owner(rel: str) -> str | None:
    """The worker whose file ``rel`` (a name in the run: ``dumps/chief.s0001...``) is, or None."""
    sub, _, name = rel.rpartition("/")
    parse = dict(_FOLDERS).get(sub)
    ids = parse(name) if parse else None
    if ids is None and sub == "" and name.startswith("graph."):
        ids = (name.split(".")[1], 0)
    return ids[0] if ids else None


@dataclass
class Scan:
    """What one listing of a run tells a writer session that is starting."""
    session: int            # 1 + the highest session number of the worker in any file of the run
    # temporary files a killed writer of the worker left (``.<name>.<random>.tmp``)
    leftovers: list[str]
    bytes: int              # the run's bytes (temporary files, locks and links excluded)


def scan(run_dir: Path | str | Storage, worker: str) -> Scan:
    """One pass over the run's folders for everything a session's start asks of them (each
    ``fit`` starts one, and on an object store each listing is requests). Object stores have
    no temporary files (an unfinished multipart upload is no object; :meth:`Claim.take` aborts
    the worker's own: ``Storage.abort_uploads``)."""
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
        if store.is_local and (os.path.islink(store.display(rel))
                               or not os.path.isfile(store.display(rel))):
            continue
        store.delete(rel)
