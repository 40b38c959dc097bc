"""A slow, hanging or refusing object store never blocks the training thread: statistics are
queued without waiting (``writer._Inbox``), parts the store does not take wait on local disk
(``inspector.storage.spill``) and are uploaded in order once it answers; what the spill cannot keep is
dropped and recorded. Faults come from a proxy in front of the S3 test server
(``tests/faultproxy.py``)."""
from __future__ import annotations

import threading

import pytest

import inspector
from inspector.storage import open_storage
from inspector.testing import SyntheticRun
from faultproxy import FaultProxy
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

pytest.importorskip("fsspec")
STEPS = 200


@pytest.fixture(name="proxy")
def proxy_fixture(s3):
    p = FaultProxy(s3.endpoint)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_INSPECTOR_CACHE", str(tmp_path / "cache"))


def _spilled(tmp_path) -> list:
    return sorted((tmp_path / "cache").rglob("*.parquet"))


def _synthetic(store) -> SyntheticRun:
    return SyntheticRun(store, tensors=8, steps_hint=STEPS, dump_every=None, stats_flush_secs=0, graph=False)


def _steps(url: str, s3) -> list[int]:
    run = inspector.open_run(url, storage_options=s3.options)
    assert run.problems == [], run.problems
    return sorted(int(s) for s in run.stats["step"].unique())


def test_a_hanging_store_never_blocks_a_training_step(s3, proxy):
    """Every request is accepted and never answered (each may wait five minutes): a training
    loop queues every step's statistics without waiting (the old bounded queue filled and the
    step waited for the store). When the store answers again every step reaches it."""
    url = s3.url("hang")
    b = _synthetic(open_storage(url, proxy.options(s3.options), timeout=300))
    proxy.hang()
    done = threading.Event()
    loop = threading.Thread(target=lambda: (b.write_steps(0, STEPS), done.set()))
    loop.start()
    queued = done.wait(120)   # not a speed bound: with a waiting step the loop would wait for the store
    proxy.release()
    loop.join()
    assert queued, "a training step waited for the hanging store"
    b.close()
    assert _steps(url, s3) == list(range(STEPS))


def test_statistics_wait_on_local_disk_while_the_store_refuses(s3, proxy, tmp_path):
    """Connections refused: each flushed part goes to the spill (local disk, not memory);
    once the store listens again the parts are uploaded oldest first under consecutive numbers,
    the spill empties, and no step is missing or dropped."""
    url = s3.url("refuse")
    b = _synthetic(open_storage(url, proxy.options(s3.options), timeout=2))
    b.write_steps(0, 10)
    b.sync()
    proxy.refuse()
    b.write_steps(10, 20)
    b.writer.update_manifest(marker=1)
    for _ in range(600):   # the writer thread has tried (and spilled) what was queued
        if len(_spilled(tmp_path)) and not b.writer._queue.qsize():
            break
        threading.Event().wait(0.1)
    assert _spilled(tmp_path) and b.writer._buffered_rows == 0
    proxy.accept()
    b.writer._backoff.clear()   # retry now rather than after the back-off
    b.write_steps(20, 30)
    b.close()
    assert _spilled(tmp_path) == []
    assert _steps(url, s3) == list(range(30))
    run = inspector.open_run(url, storage_options=s3.options)
    assert run.dropped.empty and [e.what for e in run.errors.itertuples()] == ["stats"]
    names = sorted(e.name for e in run.store.list("stats"))
    assert all(n.startswith("chief.s0001.") for n in names) and len(names) >= 1


def test_what_the_spill_cannot_keep_is_dropped_and_recorded(s3, proxy, tmp_path):
    """A spill of one byte keeps nothing: the parts the refusing store did not take are
    dropped, and each of their steps is recorded (run.dropped), none silently missing."""
    url = s3.url("full")
    b = _synthetic(open_storage(url, proxy.options(s3.options), timeout=2))
    b.writer._spill.max_bytes = 1
    b.write_steps(0, 5)
    b.sync()
    proxy.refuse()
    b.write_steps(5, 15)
    b.writer.update_manifest(marker=1)
    for _ in range(600):
        if not b.writer._queue.qsize() and not b.writer._buffered_rows and len(b.writer.state.dropped.records()):
            break
        threading.Event().wait(0.1)
    proxy.accept()
    b.writer._backoff.clear()
    b.write_steps(15, 20)
    b.close()
    kept = _steps(url, s3)
    run = inspector.open_run(url, storage_options=s3.options)
    lost = sorted(set(range(20)) - set(kept))
    assert lost and set(range(5)) <= set(kept) and set(range(15, 20)) <= set(kept)
    d = run.dropped
    assert list(d["what"].unique()) == ["stats"] and "spill full" in d["reason"].iloc[0]
    assert d["count"].sum() == len(lost) and d["first_step"].min() == lost[0] and d["last_step"].max() == lost[-1]


def test_a_hanging_store_is_a_storage_error_naming_the_url(s3, proxy, capsys):
    """A read from a store that never answers: StorageError naming the object's URL and the
    client's timeout, after the timeout the user set, not a "damaged file" with rows silently
    missing; the CLI says it in one line (exit status 2)."""
    import json

    from inspector import cli
    from inspector.testing import make_synthetic_run
    url = s3.url("readhang")
    make_synthetic_run(url, storage_options=s3.options, steps=6, tensors=6, dump_every=3)
    via = proxy.options(s3.options)
    run = inspector.open_run(url, storage_options=via, timeout=1)
    steps = run.steps   # the dumps listed; each read after this hangs
    proxy.hang()
    with pytest.raises(inspector.StorageError, match=rf"{url}/stats\S*: cannot (list|read) \(.*(?i:timeout)") as e:
        run.query_stats(columns=["mean"])
    assert e.value.url.startswith(f"{url}/stats") and "timeout" in e.value.cause.lower()
    with pytest.raises(inspector.StorageError, match=rf"{url}/dumps/\S+: cannot read \(.*(?i:timeout)"):
        run.tensor(run.tensors.index[1], steps[-1])
    assert run.problems == []
    assert cli.main(["info", url, "--storage-options", json.dumps(via), "--timeout", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and url in err[0] and "timeout" in err[0].lower(), err
    with pytest.raises(SystemExit):
        cli.main(["info", url, "--timeout", "0"])
    assert "--timeout: must be a positive number of seconds, not '0'" in capsys.readouterr().err
    proxy.release()


def test_a_killed_writers_unfinished_upload_is_aborted_by_its_workers_next_session(s3):
    """A writer killed mid-upload leaves its multipart upload's parts in the bucket (no object,
    but stored and billed): the next session of its worker aborts them; another worker's
    unfinished upload (a live writer's, perhaps) is left alone."""
    from inspector.sessions.lease import Claim
    url = s3.url("mpu")
    fs = s3.filesystem()
    bucket, key = url.split("://", 1)[1].split("/", 1)
    for worker in ("chief", "worker-1"):
        name = f"{key}/dumps/{worker}.s0001.step-0000000001.safetensors"
        up = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=name)
        fs.call_s3("upload_part", Bucket=bucket, Key=name, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * (5 << 20))

    def pending() -> list[str]:
        out = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{key}/")
        return sorted(u["Key"].rsplit("/", 1)[-1] for u in out.get("Uploads", []))

    assert len(pending()) == 2
    claim = Claim.take(open_storage(url, s3.options), "chief", heartbeat_secs=60)
    claim.release()
    assert pending() == ["worker-1.s0001.step-0000000001.safetensors"]
