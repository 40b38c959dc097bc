"""Is a writer still alive? Judged from what it wrote: its host, pid and last heartbeat.

Shared by the reader (a manifest's state) and the writer (a lock's holder), so both apply
one rule (FORMAT.md): a 'running' writer is 'crashed' when its process is gone (same host,
pid not alive) and 'stalled' when its heartbeat is STALE_HEARTBEATS beats late (at least
10 s): a crash on another host, or a hung process.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
import time
from typing import Mapping

from inspector.format import STALE_HEARTBEATS


def now_iso() -> str:
    """The current UTC time, ISO 8601, whole seconds (the manifests' ``created``/``updated``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def writer_state(record: Mapping, now: float | None = None) -> str:
    """'running', 'crashed' or 'stalled' for a record with ``host``, ``pid``, ``updated`` and
    ``heartbeat_secs`` (a manifest or a lock); its own ``status`` when that is not 'running'."""
    status = record.get("status", "running")
    if status != "running":
        return status
    pid, host = record.get("pid"), record.get("host")
    if isinstance(pid, int) and not isinstance(pid, bool) and host == socket.gethostname() \
            and not alive(pid):
        return "crashed"
    beat = record.get("heartbeat_secs")
    try:
        updated = _dt.datetime.fromisoformat(record["updated"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return status
    if isinstance(beat, (int, float)) and beat > 0:
        if (now if now is not None else time.time()) - updated > stale_after(beat):
            return "stalled"
    return status


def stale_after(heartbeat_secs: float) -> float:
    """Seconds without a heartbeat after which a writer beating every ``heartbeat_secs`` is
    judged gone: STALE_HEARTBEATS beats, at least 10 s (``updated`` has whole seconds, and the
    clocks of two hosts differ a little). A lock's lease lasts as long
    (``inspector.sessions.lease``)."""
    return max(STALE_HEARTBEATS * heartbeat_secs, 10.0)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's process, or cannot tell: do not call it crashed
    return True
