"""Run directories in object storage: memory:// and a real S3 server (moto, over HTTP via s3fs).

The oracle for every remote read is the same run written to local disk: identical catalog,
statistics, sessions, dump keys, arrays and samples. Lazy reads are checked by counting the
requests and bytes an s3fs filesystem serves (a subclass that counts; the client is not patched).
"""
from __future__ import annotations

import re
import threading

import numpy as np
import pandas as pd
import pytest

import inspector
from inspector.sessions.lease import Claim, RunLockedError, next_session, scan
from inspector.storage import FsspecStorage, check_relative, open_storage
from inspector.testing import SyntheticRun, make_synthetic_run
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

fsspec = pytest.importorskip("fsspec")

RUN = dict(steps=12, tensors=14, dump_every=4, seed=3)


def _memory_url(name: str) -> str:
    import uuid
    return f"memory://tfi-{name}-{uuid.uuid4().hex[:8]}"


def assert_same_reads(a: inspector.Run, b: inspector.Run, same_bytes: bool = True) -> None:
    """Everything a reader shows of ``a`` (local) equals that of ``b`` (remote); ``same_bytes``:
    the byte counts too (False where the two recorded different graphs)."""
    assert a.problems == [] and b.problems == []
    pd.testing.assert_frame_equal(a.tensors, b.tensors)
    pd.testing.assert_frame_equal(a.stats, b.stats)
    cols = ["worker", "session", "mode", "state", "first_step", "last_step", "dumps", "error"]
    pd.testing.assert_frame_equal(a.sessions[cols + ["bytes"] * same_bytes], b.sessions[cols + ["bytes"] * same_bytes])
    assert a.status == b.status and a.workers == b.workers and a.steps == b.steps and a.steps
    assert a.size_bytes() == b.size_bytes() or not same_bytes
    q = dict(tensors=list(a.tensors.index[:3]), steps=(4, 8), kinds=["forward"], columns=["mean", "l2"])
    pd.testing.assert_frame_equal(a.query_stats(**q), b.query_stats(**q))
    for step in a.steps:
        assert a.dump_keys(step) == b.dump_keys(step)
        assert a.dump_metadata(step) == b.dump_metadata(step)
        pd.testing.assert_frame_equal(a.samples(step), b.samples(step))
        for key in a.dump_keys(step):
            x, y = a.dump_array(step, key), b.dump_array(step, key)
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
    t = a.tensors.index[2]
    edges_a, counts_a = a.histogram(t, 4)
    edges_b, counts_b = b.histogram(t, 4)
    np.testing.assert_array_equal(edges_a, edges_b)
    np.testing.assert_array_equal(counts_a, counts_b)


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with categories as strings (several workers' rows have more categories)."""
    df = df.reset_index(drop=True).copy()
    for c in df.columns:
        if isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype(str)
    return df


def test_memory_run_reads_like_local(tmp_path):
    local = inspector.open_run(make_synthetic_run(tmp_path / "r", **RUN))
    url = _memory_url("run")
    make_synthetic_run(url, **RUN)
    remote = inspector.open_run(url)
    assert remote.path == url and not remote.store.is_local
    assert_same_reads(local, remote)
    # nothing but the run's files: no temporary object, and the lock is gone after close
    names = sorted(p.rsplit("/", 1)[-1] for p in fsspec.filesystem("memory").find(url.split("://")[1]))
    assert not any(n.startswith(".") or n.startswith("lock.") for n in names), names
    assert inspector.find_runs(url.rsplit("/", 1)[0] + "/") != [] and inspector.is_run(url)


def test_file_url_is_local(tmp_path):
    make_synthetic_run(tmp_path / "r", steps=4, tensors=10, dump_every=2)
    run = inspector.open_run(f"file://{tmp_path / 'r'}")
    assert run.store.is_local and run.steps == [0, 2]


def test_s3_run_reads_like_local(tmp_path, s3):
    local = inspector.open_run(make_synthetic_run(tmp_path / "r", **RUN))
    url = s3.url("same")
    make_synthetic_run(url, storage_options=s3.options, **RUN)
    remote = inspector.open_run(url, storage_options=s3.options)
    assert_same_reads(local, remote)
    fs = s3.filesystem()
    keys = [k.rsplit("/", 1)[-1] for k in fs.find(url)]
    assert not any(k.startswith(".") or k.startswith("lock.") for k in keys), keys
    assert inspector.find_runs(url.rsplit("/", 1)[0], storage_options=s3.options)


def test_a_url_needs_its_package_named(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_fsspec(name, *args, **kwargs):
        if name == "fsspec" or name.startswith("fsspec."):
            raise ImportError("No module named 'fsspec'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fsspec)
    with pytest.raises(ImportError, match=r"s3fs.*tf-inspector\[s3\]"):
        inspector.open_run("s3://bucket/runs/x")


def test_names_never_leave_the_run():
    for bad in ("../x", "a/../b", "/abs", "a//b", "x\\y", "s3://other/x", ".", "a/./b", "x\x00"):
        with pytest.raises(ValueError, match="escapes"):
            check_relative(bad)
    store = open_storage(_memory_url("esc"))
    with pytest.raises(ValueError, match="escapes"):
        store.child("..")
    with pytest.raises(ValueError, match="escapes"):
        store.read("../other/manifest.chief.s0001.json")
    assert check_relative("dumps/chief.s0001.step-0000000001.safetensors")


def test_an_object_under_a_run_name_that_is_a_folder_is_damaged_not_fatal():
    url = _memory_url("dir")
    make_synthetic_run(url, steps=4, tensors=10, dump_every=2)
    fs = fsspec.filesystem("memory")
    root = url.split("://")[1]
    fs.pipe_file(f"{root}/stats/chief.s0002.000001.parquet/inner", b"x")
    fs.pipe_file(f"{root}/manifest.chief.s0002.json", fs.cat_file(f"{root}/manifest.chief.s0001.json")
                 .replace(b'"session": 1', b'"session": 2'))
    run = inspector.open_run(url)
    assert len(run.stats) and any("not a file" in p for p in run.problems), run.problems


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_lock_is_exclusive_and_sessions_count_up(where, request):
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        url, opts = s3.url("lock"), s3.options
    else:
        url, opts = _memory_url("lock"), None
    store = open_storage(url, opts)
    first = Claim.take(store, "chief", heartbeat_secs=60)
    assert first.session == 1 and store.exclusive == "atomic"
    with pytest.raises(RunLockedError, match="live writer for worker 'chief'"):
        Claim.take(store, "chief", heartbeat_secs=60)
    other = Claim.take(store, "worker-0", heartbeat_secs=60)  # another identity: its own lock
    store.write("manifest.chief.s0001.json", [b"{}"])
    first.release()
    other.release()
    assert next_session(store, "chief") == 2
    again = Claim.take(store, "chief", heartbeat_secs=60)
    assert again.session == 2
    again.release()
    assert not any(e.name.startswith("lock.") for e in store.list(""))


def test_s3_create_is_a_conditional_put(s3):
    """A second create of an existing object is refused by the server (PUT with
    If-None-Match: *, answered 412), and the object keeps the first writer's bytes; a plain
    PUT would have replaced them. (Concurrent creates are the server's business: moto, unlike
    S3, does not promise them atomic, so this test does not race.)"""
    store = FsspecStorage(s3.url("cond"), s3.options)
    assert store.create("lock.chief.json", b"first")
    assert not store.create("lock.chief.json", b"second")
    assert store.read("lock.chief.json") == b"first"
    store.delete("lock.chief.json")
    assert store.create("lock.chief.json", b"third") and store.read("lock.chief.json") == b"third"


def test_several_workers_write_one_s3_run_while_a_reader_reads(s3):
    """Three workers (threads, each its own writer and lock) write one remote run; a reader
    opens it again and again meanwhile: every read sees whole files only (no problems), and
    what it sees only grows. At the end each worker's statistics are its own run's."""
    url = s3.url("multi")
    workers = ["chief", "worker-0", "worker-1"]
    runs = {w: SyntheticRun(url, 12, steps_hint=12, dump_every=3, seed=i, worker=w, stats_flush_secs=0,
                            storage_options=s3.options) for i, w in enumerate(workers)}
    done, first = threading.Event(), threading.Event()
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def read_once() -> None:
        run = inspector.open_run(url, storage_options=s3.options)
        rows = len(run.query_stats(worker="all", columns=["mean"]))
        dumps = sum(len(run.dump_steps(worker=w)) for w in run.workers)
        assert run.problems == [], run.problems
        seen.append((rows, dumps))

    def read() -> None:
        while not done.is_set():
            try:
                read_once()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            finally:
                first.set()

    def write(w: str) -> None:
        first.wait(120)   # one read at least while they write, however the threads are scheduled
        for step in range(0, 12, 2):
            runs[w].write_steps(step, step + 2)
            runs[w].sync()

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in workers]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    for r in runs.values():
        r.close()
    done.set()
    reader.join()
    assert not errors, errors
    read_once()   # and one after every writer closed
    assert len(seen) >= 2 and all(a <= b for a, b in zip(seen, seen[1:])), seen
    run = inspector.open_run(url, storage_options=s3.options)
    assert sorted(run.workers) == sorted(workers) and run.status == "finished" and run.problems == []
    stats = run.query_stats(worker="all")
    for i, w in enumerate(workers):  # the oracle: the same worker written alone to memory://
        alone = _memory_url(w)
        b = SyntheticRun(alone, 12, steps_hint=12, dump_every=3, seed=i, worker=w, stats_flush_secs=0)
        for step in range(0, 12, 2):  # the same calls: the generator's draws follow them
            b.write_steps(step, step + 2)
        b.close()
        mine = _plain(stats[stats["worker"] == w])
        pd.testing.assert_frame_equal(mine, _plain(inspector.open_run(alone).query_stats(worker=w)))
        np.testing.assert_array_equal(run.tensor(run.tensors.index[1], 3, worker=w),
                                      inspector.open_run(alone).tensor(run.tensors.index[1], 3, worker=w))


def _counting_fs(s3):
    """An s3fs filesystem on the test server that logs every request it makes: listings,
    object infos and GETs with their byte range and the bytes that came back."""
    import s3fs

    class Counting(s3fs.S3FileSystem):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.log: list[tuple] = []

        async def _cat_file(self, path, version_id=None, start=None, end=None, **kwargs):
            data = await super()._cat_file(path, version_id=version_id, start=start, end=end, **kwargs)
            self.log.append(("get", path.rsplit("/", 1)[-1], start, end, len(data)))
            return data

        async def _info(self, path, **kwargs):
            self.log.append(("info", path.rsplit("/", 1)[-1]))
            return await super()._info(path, **kwargs)

        async def _ls(self, path, detail=False, **kwargs):
            self.log.append(("list", path.rsplit("/", 1)[-1]))
            return await super()._ls(path, detail=detail, **kwargs)

        def take(self) -> list[tuple]:
            out, self.log = self.log, []
            return out

    return s3.filesystem(Counting)


def test_remote_reads_are_lazy_byte_ranges(tmp_path, s3):
    """Opening a run reads its manifest only; the first statistics query reads each part's
    footer and the column chunks it needs (not the histograms); one tensor reads its dump's
    header and its own bytes. Counted at the filesystem: requests, ranges and bytes."""
    import pyarrow.parquet as pq
    from inspector.dumps.files import HEADER_PROBE
    kw = dict(steps=100, tensors=30, dump_every=50, seed=5)
    local = inspector.open_run(make_synthetic_run(tmp_path / "r", **kw))
    url = s3.url("lazy")
    make_synthetic_run(url, storage_options=s3.options, **kw)
    fs = _counting_fs(s3)

    run = inspector.open_run(url, filesystem=fs)
    log = fs.take()
    gets = [e for e in log if e[0] == "get"]
    manifest = local.path / "manifest.chief.s0001.json"
    assert [g[1] for g in gets] == [manifest.name] and gets[0][4] == manifest.stat().st_size, log
    assert len(log) <= 3, log  # the folder listed (exists, names) and one GET

    tensor = local.tensors.index[4]
    got = run.query_stats([tensor], kinds=["forward"], groups=["all"], columns=["mean"])
    pd.testing.assert_frame_equal(got, local.query_stats([tensor], kinds=["forward"], groups=["all"],
                                                         columns=["mean"]))
    log = fs.take()
    gets = [e for e in log if e[0] == "get"]
    (part,) = (local.path / "stats").iterdir()
    meta = pq.ParquetFile(part).metadata  # our own valid file: listing its column chunks is safe
    wanted = {"worker", "session", "mode", "step", "batch", "tensor", "kind", "group", "mean"}
    needed = sum(meta.row_group(i).column(j).total_compressed_size for i in range(meta.num_row_groups)
                 for j in range(meta.num_columns) if meta.schema.column(j).path in wanted)
    read = sum(g[4] for g in gets)
    assert all(g[1] == part.name and g[2] is not None and g[3] is not None for g in gets), gets
    assert read <= needed + 64 * 1024 + meta.serialized_size, (read, needed)  # the footer read: 64 KiB
    assert read < part.stat().st_size / 2, (read, part.stat().st_size)
    assert not [e for e in log if e[0] == "info"], log  # sizes come from the listing

    fs.take()
    step = local.steps[-1]
    key = f"forward/{tensor}"
    x = run.tensor(tensor, step)
    np.testing.assert_array_equal(x, local.tensor(tensor, step))
    log = fs.take()
    gets = [e for e in log if e[0] == "get"]
    dump = local._dump(step, None)
    size = (local.path / dump.rel).stat().st_size
    header, start = local._header(dump)
    begin, end = header[key]["data_offsets"]
    assert [(g[2], g[3]) for g in gets] == [(0, min(size, HEADER_PROBE)), (start + begin, start + end)], gets
    assert sum(g[4] for g in gets) == min(size, HEADER_PROBE) + x.nbytes < size / 4
    run.tensor(tensor, step, kind="gradient")  # the header is cached: one GET, the array's bytes
    gets = [e for e in fs.take() if e[0] == "get"]
    assert len(gets) == 1 and gets[0][4] == local.tensor(tensor, step, kind="gradient").nbytes


def test_cli_reads_a_bucket(tmp_path, s3, capsys):
    import json

    from inspector import cli
    url = s3.url("cli")
    make_synthetic_run(f"{url}/exp1", storage_options=s3.options, **RUN)
    local = make_synthetic_run(tmp_path / "exp1", **RUN)
    opts = json.dumps(s3.options)
    assert cli.main(["info", url, "--storage-options", opts]) == 0  # a folder of runs in the bucket
    out = capsys.readouterr().out
    assert f"{url}/exp1" in out and "finished" in out
    assert cli.main(["export", f"{url}/exp1", "--storage-options", opts, "--format", "parquet",
                     "--out", str(tmp_path / "remote.parquet")]) == 0
    assert cli.main(["export", str(local), "--format", "parquet", "--out", str(tmp_path / "local.parquet")]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "remote.parquet"),
                                  pd.read_parquet(tmp_path / "local.parquet"))
    with pytest.raises(SystemExit):  # argparse names the bad --storage-options value
        cli.main(["info", url, "--storage-options", "[1]"])
    assert "storage-options" in capsys.readouterr().err
    # as a user runs it: a new process, the options from the environment
    import os
    import subprocess
    import sys
    from pathlib import Path
    out = subprocess.run([sys.executable, "-m", "inspector", "info", f"{url}/exp1"], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "TF_INSPECTOR_STORAGE_OPTIONS": opts})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "finished" in out.stdout and "chief" in out.stdout, out.stdout


def test_viewer_shows_a_bucket_run(s3, monkeypatch):
    """The viewer started on a folder of runs in the bucket (storage options from the
    environment): every page renders; a path leading out of that folder is refused."""
    pytest.importorskip("streamlit")
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest
    url = s3.url("viewer")
    make_synthetic_run(f"{url}/exp1", storage_options=s3.options, steps=20, tensors=20, dump_every=10)
    monkeypatch.setenv("TF_INSPECTOR_STORAGE_OPTIONS", json.dumps(s3.options))
    monkeypatch.setenv("TF_INSPECTOR_RUNS", url)
    app = str(Path(__file__).resolve().parents[1] / "app.py")
    for page in ("Summary", "Training overview", "Distributions", "Tensor browser"):
        at = AppTest.from_file(app, default_timeout=120)
        at.session_state["page"] = page
        at.run()
        assert not at.exception and not at.error, (page, [e.value for e in at.error], at.exception)
        if page == "Summary":
            assert any("exp1" in h.value for h in at.header), [h.value for h in at.header]
    at = AppTest.from_file(app, default_timeout=120)
    at.session_state["path"] = "../other"
    at.run()
    assert any("outside the runs folder" in e.value for e in at.error)


def test_local_runs_never_import_fsspec(tmp_path):
    """fsspec and s3fs are for URLs only: reading and writing on local disk imports neither
    (nor TensorFlow)."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys, inspector\n"
            "from inspector.testing import make_synthetic_run\n"
            f"run = inspector.open_run(make_synthetic_run({str(tmp_path / 'r')!r}, steps=4, tensors=10, dump_every=2))\n"
            "run.stats; run.tensor(run.tensors.index[1], 2)\n"
            "print(sorted(m for m in ('fsspec', 's3fs', 'botocore', 'tensorflow') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_missing_and_partial_objects_are_damaged_files_not_crashes():
    """An object listed then deleted, and partial objects another tool wrote (a dump cut
    short, a Parquet part without its footer): each is named in run.problems and skipped;
    the rest of the run reads as before."""
    url = _memory_url("partial")
    make_synthetic_run(url, steps=8, tensors=12, dump_every=4)
    fs = fsspec.filesystem("memory")
    root = url.split("://")[1]
    run = inspector.open_run(url)
    steps, tensor = run.steps, run.tensors.index[3]
    good = run.tensor(tensor, steps[0])
    fs.rm_file(f"{root}/dumps/chief.s0001.step-{steps[-1]:010d}.safetensors")  # gone after the listing
    with pytest.raises(inspector.DamagedFileError, match="no such object|cannot be read"):
        run.tensor(tensor, steps[-1])
    assert any(f"step-{steps[-1]:010d}" in p for p in run.problems)
    np.testing.assert_array_equal(run.tensor(tensor, steps[0]), good)

    dump = fs.cat_file(f"{root}/dumps/chief.s0001.step-{steps[0]:010d}.safetensors")
    part = fs.cat_file(f"{root}/stats/chief.s0001.000001.parquet")
    fs.pipe_file(f"{root}/dumps/chief.s0002.step-{steps[0]:010d}.safetensors", dump[:len(dump) // 2])
    fs.pipe_file(f"{root}/stats/chief.s0002.000001.parquet", part[:-200])
    manifest = fs.cat_file(f"{root}/manifest.chief.s0001.json").replace(b'"session": 1', b'"session": 2')
    fs.pipe_file(f"{root}/manifest.chief.s0002.json", manifest)
    run = inspector.open_run(url)
    stats = run.query_stats(session="all")  # every part: the cut one is named and skipped
    assert len(stats) and any("chief.s0002.000001.parquet" in p for p in run.problems), run.problems
    with pytest.raises(inspector.DamagedFileError, match="damaged dump file"):
        run.tensor(tensor, steps[0], session=2)
    np.testing.assert_array_equal(run.tensor(tensor, steps[0], session=1), good)


def test_check_then_write_backends_refuse_a_lost_race():
    """Where the backend has no exclusive create (gs://, abfs://: exists?, then PUT), a second
    writer's PUT can land right after ours: the lock read back holds its token, not ours, and
    the writer refuses (RunLockedError) instead of guessing which one holds the worker."""
    import json

    from inspector.sessions.liveness import now_iso

    class Racy(FsspecStorage):
        def create(self, rel, data):
            created = super().create(rel, data)
            if created:  # another host's writer of the same worker wins the race
                other = {"worker": "chief", "session": 1, "host": "elsewhere", "pid": 1, "updated": now_iso(),
                         "heartbeat_secs": 60, "token": "theirs"}
                self.fs.pipe_file(self._abs(rel), json.dumps(other).encode())
            return created

    store = Racy(_memory_url("racy"))
    store.kind, store.exclusive = "other", "check-then-write"
    with pytest.raises(RunLockedError, match="at the same moment"):
        Claim.take(store, "chief", heartbeat_secs=60)
    plain = FsspecStorage(store.url)
    plain.kind, plain.exclusive = "other", "check-then-write"
    with pytest.raises(RunLockedError, match="live writer"):  # the winner's lock stands
        Claim.take(plain, "chief", heartbeat_secs=60)


def test_viewer_reads_a_bucket_while_workers_write(s3, monkeypatch):
    """The viewer on an S3 run that two workers are writing: each page renders while they
    write, and a rerun after more was written shows the new steps and a third worker."""
    pytest.importorskip("streamlit")
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest
    url = s3.url("live")
    monkeypatch.setenv("TF_INSPECTOR_STORAGE_OPTIONS", json.dumps(s3.options))
    monkeypatch.setenv("TF_INSPECTOR_RUNS", url)
    root = Path(__file__).resolve().parents[1]
    kw = dict(steps_hint=10, dump_every=3, stats_flush_secs=0, storage_options=s3.options)
    runs = {w: SyntheticRun(url, 12, seed=i, worker=w, **kw) for i, w in enumerate(["chief", "worker-0"])}
    try:
        for r in runs.values():
            r.write_steps(0, 4)
            r.sync()

        def metrics(at: AppTest) -> dict:
            assert not at.exception, [e.value for e in at.exception]
            # the Summary's facts table: one Markdown table, a column per fact
            table = next(m.value for m in at.markdown if m.value.startswith("| Status |"))
            head, _, row = (re.sub(r"\\(.)", r"\1", line).strip("| ").split(" | ")
                            for line in table.splitlines())
            return dict(zip(head, row))

        at = AppTest.from_file(str(root / "app.py"), default_timeout=120).run()
        m = metrics(at)
        assert m["Status"] == "running" and m["Statistics steps"] == "4" and m["Last step"] == "3", m
        assert at.sidebar.selectbox(key="worker").options == ["chief", "worker-0"]

        errors: list[BaseException] = []

        def write_more() -> None:
            try:
                for step in range(4, 10, 2):
                    for r in runs.values():
                        r.write_steps(step, step + 2)
                        r.sync()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        writer = threading.Thread(target=write_more)
        writer.start()
        try:
            for page in ("overview", "distributions", "browser", "summary"):  # while they write
                page_at = AppTest.from_file(str(root / "app.py"), default_timeout=120)
                page_at.switch_page(f"viewer/app_pages/{page}.py")
                page_at.run()
                assert not page_at.exception, (page, [e.value for e in page_at.exception])
                assert not [e.value for e in page_at.error if "could not be drawn" in e.value], page
        finally:
            writer.join()
        assert not errors, errors
        runs["worker-1"] = SyntheticRun(url, 12, seed=2, worker="worker-1", **kw)
        runs["worker-1"].write_steps(0, 2)
        runs["worker-1"].sync()
        m = metrics(at.run())  # the same session, rerun: the new files are read
        assert m["Statistics steps"] == "10" and m["Last step"] == "9" and m["Dump steps"] == "4", m
        assert at.sidebar.selectbox(key="worker").options == ["chief", "worker-0", "worker-1"]
    finally:
        for r in runs.values():
            r.close()
    m = metrics(at.run())
    assert m["Status"] == "finished", m


def test_one_listing_finds_the_session_the_leftovers_and_the_bytes(tmp_path):
    """A session's start lists the run once: the next session number (a link's name counts,
    so it is never reused), the worker's own temporary files (another worker's stay), and the
    bytes a budget starts from (no temporary file, lock or link counted)."""
    run = tmp_path / "run"
    (run / "dumps").mkdir(parents=True)
    (run / "stats").mkdir()
    sizes = {"manifest.chief.s0003.json": 10, "dumps/chief.s0005.step-0000000001.safetensors": 100,
             "stats/worker-1.s0009.000001.parquet": 1000}
    for rel, n in sizes.items():
        (run / rel).write_bytes(b"x" * n)
    (run / "manifest.chief.s0007.json").symlink_to(tmp_path / "elsewhere.json")
    (run / "lock.chief.json").write_bytes(b"{}" * 50)
    (run / ".manifest.chief.s0002.json.ab12.tmp").write_bytes(b"x" * 7)
    (run / "dumps" / ".chief.s0002.step-0000000004.safetensors.cd34.tmp").write_bytes(b"x" * 7)
    (run / ".manifest.worker-1.s0001.json.ef56.tmp").write_bytes(b"x" * 7)
    found = scan(run, "chief")
    assert found.session == 8
    assert sorted(found.leftovers) == [".manifest.chief.s0002.json.ab12.tmp",
                                       "dumps/.chief.s0002.step-0000000004.safetensors.cd34.tmp"]
    assert found.bytes == sum(sizes.values())
    claim = Claim.take(run, "chief", heartbeat_secs=60)
    try:
        assert (claim.session, claim.bytes_before) == (8, sum(sizes.values()))
        assert not (run / ".manifest.chief.s0002.json.ab12.tmp").exists()
        assert (run / ".manifest.worker-1.s0001.json.ef56.tmp").exists()
    finally:
        claim.release()
