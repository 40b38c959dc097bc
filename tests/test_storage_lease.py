"""The writer's lock is a lease: taken over only when its holder is provably gone (its
process dead on this host, or the lock older than its lease by the store's own clock), never
because the lock could not be read; the holder checks it before each write, recreates it when
it is gone and stops writing when another writer holds it.

Faults are injected by a proxy in front of the S3 test server (``tests/faultproxy.py``: HTTP
500 answers, requests never answered), so botocore's retries and timeouts run as against a
bucket; the lock's age on S3 is the server's ``Date`` minus its ``Last-Modified``."""
from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import pytest

import inspector
from inspector.sessions.lease import Claim, LeaseLostError, RunLockedError
from inspector.errors import StorageError
from inspector.sessions.liveness import now_iso
from inspector.storage import open_storage
from inspector.writer import RunWriter
from faultproxy import FaultProxy
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

pytest.importorskip("fsspec")
LOCK = r"/lock\.chief\.json"


@pytest.fixture(name="proxy")
def proxy_fixture(s3):
    p = FaultProxy(s3.endpoint)
    yield p
    p.close()


def _memory_url(name: str) -> str:
    import uuid
    return f"memory://tfi-{name}-{uuid.uuid4().hex[:8]}"


def _lock(store, rel: str = "lock.chief.json") -> dict:
    return json.loads(store.read(rel))


def _other_host_lock(**fields) -> bytes:
    record = {"worker": "chief", "session": 1, "host": "another-host", "pid": 4242, "updated": now_iso(),
              "heartbeat_secs": 60, "token": "theirs"}
    return json.dumps({**record, **fields}).encode()


def test_a_lock_that_cannot_be_read_is_never_taken_over(s3, proxy):
    """The live writer's lock answers HTTP 500 to every GET, or never answers: a second writer
    of the worker gets a StorageError saying nothing was taken over, and the first writer's lock
    is untouched (before: an unreadable lock counted as a dead writer's, was deleted and taken,
    and two sessions of one worker wrote at once). A few 500s are retried by the client: the
    second writer then sees the live lock and is refused."""
    url = s3.url("unreadable")
    first = RunWriter(url, manifest={"tensors": []}, storage_options=s3.options)
    direct = open_storage(url, s3.options)
    mine = _lock(direct)["token"]
    try:
        via = proxy.options(s3.options)
        proxy.fail("GET", LOCK)   # every GET of the lock: HTTP 500 (answered: no short timeout needed)
        with pytest.raises(StorageError, match="lock could not be read.*not taken over"):
            Claim.take(open_storage(url, via, timeout=30), "chief", heartbeat_secs=60)
        assert _lock(direct)["token"] == mine and any(a == "fail" for *_, a in proxy.requests)
        proxy.release()
        proxy.hang("GET", LOCK)   # the lock's GET is accepted and never answered
        with pytest.raises(StorageError, match="lock could not be read.*not taken over"):
            Claim.take(open_storage(url, via, timeout=1), "chief", heartbeat_secs=60)
        assert _lock(direct)["token"] == mine
        proxy.release()
        proxy.fail("GET", LOCK, times=2)   # two 500s: botocore's retries read it on the third try
        with pytest.raises(RunLockedError, match="live writer"):
            Claim.take(open_storage(url, via, timeout=30), "chief", heartbeat_secs=60)
        assert _lock(direct)["token"] == mine
    finally:
        proxy.release()
        first.close()
    run = inspector.open_run(url, storage_options=s3.options)
    assert list(run.sessions["session"]) == [1] and run.status == "finished"


def test_a_holder_with_a_slow_clock_is_not_judged_stale(s3):
    """A lock written just now by a host whose clock is an hour behind (its ``updated`` says
    an hour ago): its age by the store's clock is ~0 s, so it is live (before: judged by the
    record's own time, it read as stalled and was taken over)."""
    url = s3.url("skew")
    store = open_storage(url, s3.options)
    store.write("lock.chief.json", [_other_host_lock(updated="2020-01-01T00:00:00+00:00")])
    with pytest.raises(RunLockedError, match="live writer.*another-host"):
        Claim.take(store, "chief", heartbeat_secs=60)
    assert _lock(store)["token"] == "theirs"


def test_a_lock_old_by_the_store_clock_is_taken_over(tmp_path):
    """A lock whose record claims a fresh heartbeat but that nobody rewrote for longer than its
    lease (the file's mtime: this disk's clock) belongs to a gone writer: taken over."""
    (tmp_path / "lock.chief.json").write_bytes(_other_host_lock())
    with pytest.raises(RunLockedError, match="live writer"):   # fresh by the store's clock: live
        Claim.take(tmp_path, "chief", heartbeat_secs=60)
    old = time.time() - 3600
    os.utime(tmp_path / "lock.chief.json", (old, old))
    claim = Claim.take(tmp_path, "chief", heartbeat_secs=60)
    assert _lock(open_storage(tmp_path))["token"] == claim.token
    claim.release()


@pytest.mark.parametrize("where", ["local", "memory", "s3"])
def test_replace_swaps_only_the_version_read(where, tmp_path, request):
    """The takeover's compare and swap: of two writers replacing the version both read, one
    wins (S3 ``If-Match``; on disk a rename; memory:// under a lock)."""
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        store = open_storage(s3.url("cas"), s3.options)
    else:
        store = open_storage(tmp_path if where == "local" else _memory_url("cas"))
    assert store.create("lock.chief.json", b"dead")
    seen = store.read_version("lock.chief.json")
    assert seen is not None and seen.data == b"dead" and seen.age is not None and 0 <= seen.age < 60
    assert store.replace("lock.chief.json", b"first", seen.tag)
    assert not store.replace("lock.chief.json", b"second", seen.tag)
    assert store.read("lock.chief.json") == b"first"
    store.delete("lock.chief.json")
    assert store.read_version("lock.chief.json") is None
    assert not store.replace("lock.chief.json", b"third", seen.tag)
    assert [e.name for e in store.list("") if e.name.startswith(".")] == []


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_deleted_lock_is_recreated_by_its_holder(where, tmp_path, request):
    """The lock deleted by hand (or a wiped bucket): the holder's next write recreates it and
    records that in the manifest's errors; a second writer of the worker is still refused
    (before: the lock stayed gone, and a second writer started beside the first)."""
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        url, opts = s3.url("recreate"), s3.options
    else:
        url, opts = str(tmp_path / "run"), None
    w = RunWriter(url, manifest={"tensors": []}, storage_options=opts)
    store = open_storage(url, opts)
    store.delete("lock.chief.json")
    assert w.add_dump(1, {"forward/a:0": np.ones(4, np.float32)}) and w.drain(60)
    assert _lock(store)["token"] == w.claim.token
    with pytest.raises(RunLockedError, match="live writer"):
        RunWriter(url, manifest={"tensors": []}, storage_options=opts)
    w.close()
    run = inspector.open_run(url, storage_options=opts)
    assert run.steps == [1] and run.status == "finished"
    assert [(e.what, "recreated" in e.reason) for e in run.errors.itertuples()] == [("lock", True)]


def test_a_writer_whose_lock_another_holds_stops_writing(tmp_path):
    """Another writer holds the lock now (it judged this one gone): the next write finds it,
    the session writes nothing more and ends failed, saying why; the other's lock stays."""
    w = RunWriter(tmp_path, manifest={"tensors": []})
    (tmp_path / "lock.chief.json").write_bytes(_other_host_lock(session=2))
    assert w.add_dump(1, {"forward/a:0": np.ones(4, np.float32)})
    w.drain(60)
    w.close()
    assert json.loads((tmp_path / "lock.chief.json").read_text())["token"] == "theirs"
    run = inspector.open_run(tmp_path)
    assert run.steps == []
    m = run.manifests[("chief", 1)]
    assert m["status"] == "failed" and "held by another writer" in m["error"] and "another-host" in m["error"]
    assert [d["what"] for d in m["dropped"]] == ["dump"]


def test_a_holder_trusts_an_unreadable_lock_only_within_its_lease(s3, proxy):
    """The holder cannot read its lock (HTTP 500): right after its heartbeat it keeps writing
    (no other writer can judge it stale before the lease runs out); once the lease could have
    run out, it writes nothing until it reads the lock again."""
    url = s3.url("lease")
    claim = Claim.take(open_storage(url, proxy.options(s3.options), timeout=30), "chief", heartbeat_secs=60)
    try:
        proxy.fail("GET", LOCK)
        claim.ensure()                     # just written: within the lease
        claim._written -= 3600             # as if the last heartbeat were an hour ago
        with pytest.raises(StorageError, match="does not write until it can"):
            claim.ensure()
        proxy.release()
        claim.ensure()
        claim.refresh()                    # read again, then rewritten: the lease renewed
        assert claim._lease_left() > 0 and claim.lost is None
        direct = open_storage(url, s3.options)
        direct.write("lock.chief.json", [_other_host_lock(session=2)])
        with pytest.raises(LeaseLostError, match="held by another writer"):
            claim.ensure()
    finally:
        proxy.release()
        claim.release()
    assert _lock(open_storage(url, s3.options))["token"] == "theirs"   # release never removes another's lock


def test_lock_holder_on_this_host_and_pid_is_judged_by_the_process():
    """Same host, a pid that is not running: gone at once (no waiting out the lease)."""
    store = open_storage(_memory_url("pid"))
    import subprocess
    import sys
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    store.write("lock.chief.json", [_other_host_lock(host=socket.gethostname(), pid=gone)])
    claim = Claim.take(store, "chief", heartbeat_secs=60)
    assert _lock(store)["token"] == claim.token
    claim.release()


def test_a_start_that_fails_halfway_leaves_no_lock(monkeypatch):
    """The lock taken, then the store fails the listing that numbers the session: the error
    reaches the caller and the lock is removed (else the worker stayed locked for a lease)."""
    import inspector.sessions.lease as claim_module
    store = open_storage(_memory_url("half"))

    def fail(*args, **kwargs):
        raise StorageError("memory://x/stats: cannot list (injected)", "memory://x/stats", "injected")

    monkeypatch.setattr(claim_module, "scan", fail)
    with pytest.raises(StorageError, match="injected"):
        Claim.take(store, "chief", heartbeat_secs=60)
    assert store.read_version("lock.chief.json") is None
    monkeypatch.undo()
    Claim.take(store, "chief", heartbeat_secs=60).release()
