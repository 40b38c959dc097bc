"""A run over a lifecycle, without TensorFlow: sessions, merge rules, locks, write errors, leftovers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import inspector
from inspector.format.loghist import empty_rows
from inspector import cli, writer
from inspector.sessions.lease import RunLockedError
from inspector.format import dump_name, lock_name, manifest_name, stats_name
from inspector.writer import RunWriter, StatsLayout

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = StatsLayout(("a:0", "a:0"), ("forward", "gradient"), ("all", "all"))
CATALOG = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [None, 3], "scope": "",
            "has_gradient": True, "batched": True, "icnn_layer": None, "icnn_role": None}]


def session(path: Path, steps, value: float, dumps=(), mode: str = "train", worker: str = "chief",
            close: str | None = "finished", **kw) -> RunWriter:
    """One writer session: statistics rows whose mean is ``value`` + step, dumps of ``value``."""
    w = RunWriter(path, worker=worker, manifest={"tensors": CATALOG, "is_chief": worker in ("chief", "chief-0")},
                  stats_layout=LAYOUT, mode=mode, stats_flush_secs=1000, **kw)
    for i, s in enumerate(steps):
        vals = np.zeros((2, 9))
        vals[:, 0], vals[:, 1] = 4, value + s
        w.add_stats(s, vals, empty_rows(2), batch=i if mode != "train" else 0)
    for s in dumps:
        w.add_dump(s, {"forward/a:0": np.full((2, 3), value, np.float32), "samples/index": np.array([0, 1], np.int32)},
                   batch=None if mode == "train" else 0)
    if close:
        w.close(close)
    return w


def means(df, step):
    return sorted(df[(df.step == step) & (df.kind == "forward")]["mean"])


def test_sessions_accumulate_and_the_later_session_wins_a_step(tmp_path):
    """A resume after a crash re-runs steps 6..10: the reader shows them from the later session,
    and the earlier session stays readable by number."""
    session(tmp_path, range(1, 11), 100.0, dumps=(5, 10), close="failed")
    session(tmp_path, range(6, 16), 200.0, dumps=(10, 15))
    run = inspector.open_run(tmp_path)
    assert list(run.sessions["session"]) == [1, 2]
    assert sorted(run.stats["step"].unique()) == list(range(1, 16))
    assert means(run.stats, 3) == [103.0] and means(run.stats, 8) == [208.0]   # one row per step, no mix
    assert set(run.stats["session"][run.stats.step >= 6]) == {2}
    assert means(run.query_stats(session=1), 8) == [108.0]                    # the earlier, by number
    assert means(run.query_stats(session="all"), 8) == [108.0, 208.0]
    assert run.steps == [5, 10, 15]
    assert run.tensor("a:0", 10)[0, 0] == 200.0 and run.tensor("a:0", 10, session=1)[0, 0] == 100.0
    assert run.tensor("a:0", 5)[0, 0] == 100.0


def test_a_later_session_recording_gradients_gives_the_catalog_its_gradient(tmp_path):
    """The merged catalog took a tensor's entry from the first session
    listing it, so a resume recording gradients where the first session did not (gradients=
    False then, or no loss) read has_gradient=False, and run.tensor(..., "gradient") refused
    the later session's dumped gradient."""
    w = RunWriter(tmp_path, manifest={"tensors": [{**CATALOG[0], "has_gradient": False}]}, stats_layout=LAYOUT,
                  stats_flush_secs=1000)
    w.close()
    later = session(tmp_path, [], 0.0, close=None)
    later.add_dump(3, {"forward/a:0": np.zeros((2, 3), np.float32), "gradient/a:0": np.ones((2, 3), np.float32),
                       "samples/index": np.array([0, 1], np.int32)})
    later.close()
    run = inspector.open_run(tmp_path)
    assert bool(run.tensors.loc["a:0", "has_gradient"])
    np.testing.assert_array_equal(run.tensor("a:0", 3, "gradient"), np.ones((2, 3)))


def test_eval_sessions_are_kept_apart_per_batch(tmp_path):
    session(tmp_path, range(1, 11), 0.0)
    session(tmp_path, [10, 10, 10], 50.0, dumps=(10,), mode="eval")      # three eval batches at step 10
    session(tmp_path, range(11, 21), 0.0)
    run = inspector.open_run(tmp_path)
    assert sorted(run.stats["step"].unique()) == list(range(1, 21)) and set(run.stats["mode"]) == {"train"}
    ev = run.query_stats(mode="eval")
    assert sorted(ev["batch"].unique()) == [0, 1, 2] and set(ev["step"]) == {10}
    assert run.steps == [] and run.dump_steps(mode="eval") == [10]
    assert run.tensor("a:0", 10, mode="eval")[0, 0] == 50.0
    assert list(run.sessions["mode"]) == ["train", "eval", "train"]


def test_a_second_live_writer_with_one_identity_is_refused(tmp_path):
    first = session(tmp_path, [1], 0.0, close=None)
    with pytest.raises(RunLockedError, match="already has a live writer for worker 'chief'.*session 1"):
        RunWriter(tmp_path, manifest={"tensors": []})
    other = RunWriter(tmp_path, worker="worker-1", manifest={"tensors": []})  # another identity: fine
    other.close()
    first.close()
    assert RunWriter(tmp_path, manifest={"tensors": []}).session == 2  # once it ended, the next session


def test_a_writer_in_another_process_holds_its_lock(tmp_path):
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from inspector.writer import RunWriter
        w = RunWriter({str(tmp_path)!r}, manifest={{"tensors": []}})
        print("ready", flush=True); sys.stdin.readline(); w.close()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(RunLockedError, match=f"pid {proc.pid}"):
            RunWriter(tmp_path, manifest={"tensors": []})
    finally:
        proc.communicate("\n", timeout=60)
    assert RunWriter(tmp_path, manifest={"tensors": []}).session == 2


def test_the_lock_of_a_dead_writer_is_taken_over(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket
    (tmp_path / lock_name("chief")).write_text(json.dumps(
        {"worker": "chief", "session": 1, "host": socket.gethostname(), "pid": int(gone.stdout),
         "updated": "2026-01-01T00:00:00+00:00", "heartbeat_secs": 60}))
    w = RunWriter(tmp_path, manifest={"tensors": []})
    assert json.loads((tmp_path / lock_name("chief")).read_text())["pid"] == os.getpid()
    w.close()
    assert not (tmp_path / lock_name("chief")).exists()


def test_byte_budget_covers_the_whole_run(tmp_path):
    a = {"forward/a:0": np.ones((64, 64), np.float32)}  # 16 KiB
    w = RunWriter(tmp_path, manifest={"tensors": []}, max_bytes=40_000)
    assert w.add_dump(1, a) and w.add_dump(2, a)
    w.close()
    w = RunWriter(tmp_path, manifest={"tensors": []}, max_bytes=40_000)  # the next session starts at ~33 KB
    assert not w.add_dump(3, a)
    w.close()
    run = inspector.open_run(tmp_path)
    assert run.steps == [1, 2] and run.dropped.iloc[0]["session"] == 2
    assert "max_bytes" in run.dropped.iloc[0]["reason"]


def test_a_second_dump_of_a_step_in_one_session_is_dropped_and_recorded(tmp_path):
    """DumpHook, a TF1 loss-scale optimizer skipping steps: the
    global step did not advance between two sampled runs, so both dumps had one file name; the
    second replaced the first while the manifest counted two written and none dropped. The
    first is kept, the second recorded as dropped; another batch index of the step is another
    dump."""
    w = RunWriter(tmp_path, manifest={"tensors": CATALOG}, mode="eval")
    first, second = np.ones(4, np.float32), np.full(4, 2.0, np.float32)
    assert w.add_dump(3, {"forward/a:0": first}, batch=0)
    assert not w.add_dump(3, {"forward/a:0": second}, batch=0)
    assert w.add_dump(3, {"forward/a:0": second}, batch=1)
    w.close()
    run = inspector.open_run(tmp_path)
    manifest = run.manifests[("chief", 1)]
    assert manifest["dumps_written"] == 2 and len(list((tmp_path / "dumps").iterdir())) == 2
    assert [(d["what"], d["steps"], d["count"]) for d in manifest["dropped"]] == [("dump", [3], 1)]
    assert "already in this session" in manifest["dropped"][0]["reason"]
    np.testing.assert_array_equal(run.tensor("a:0", step=3, batch=0, mode="eval"), first)


def test_leftover_temporary_files_are_cleaned_and_not_counted(tmp_path):
    session(tmp_path, [1], 0.0, dumps=(1,))
    mine = [tmp_path / "dumps" / f".{Path(dump_name('chief', 1, 7)).name}.abc.tmp",
            tmp_path / "stats" / f".{Path(stats_name('chief', 1, 9)).name}.abc.tmp",
            tmp_path / f".{manifest_name('chief', 1)}.abc.tmp"]
    theirs = tmp_path / "dumps" / f".{Path(dump_name('worker-1', 1, 7)).name}.abc.tmp"
    for p in [*mine, theirs]:
        p.write_bytes(b"x" * 100_000)
    before = inspector.open_run(tmp_path).size_bytes()
    assert before < 100_000  # temporary files are not part of the run
    session(tmp_path, [2], 0.0)
    assert not any(p.exists() for p in mine) and theirs.exists()  # only this worker's leftovers


def test_drops_aggregate_so_the_manifest_stays_small(tmp_path):
    w = RunWriter(tmp_path, manifest={"tensors": []}, max_bytes=1)
    for s in range(5000):
        w.add_dump(s, {"forward/a:0": np.ones(4, np.float32)})
    w.close()
    run = inspector.open_run(tmp_path)
    assert len(run.dropped) == 1 and run.dropped.iloc[0]["count"] == 5000
    assert (run.dropped.iloc[0]["first_step"], run.dropped.iloc[0]["last_step"]) == (0, 4999)
    assert (tmp_path / manifest_name("chief", 1)).stat().st_size < 5000


WRITE_ERRORS = """
import resource, signal, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import numpy as np
import pandas as pd
from inspector import writer
from test_sessions import session
from inspector.format.loghist import empty_rows
writer.BACKOFF_SECS = {backoff}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
w = session({run!r}, range(1, 6), 0.0, close=None)
w.add_dump(1, {{"forward/a:0": np.ones(100_000, np.float32)}})   # 400 KB: fails
import time
deadline = time.monotonic() + 30
while w.state.errors.count() == 0 and time.monotonic() < deadline:
    time.sleep(0.01)   # wait for the dump thread to have tried (not for luck: a condition)
w.add_dump(2, {{"forward/a:0": np.ones(100, np.float32)}})     # small: written, or dropped while backing off
for s in range(6, 9):
    vals = np.zeros((2, 9)); vals[:, 0] = 4
    w.add_stats(s, vals, empty_rows(2))
w.close()
"""


@pytest.mark.parametrize("backoff", [0.0, 1000.0])
def test_a_failed_file_is_recorded_and_later_files_are_still_written(tmp_path, backoff):
    """A dump larger than the file-size limit fails (EFBIG, a real kernel error): it is dropped
    with its reason, statistics and smaller dumps keep being written (or, while backing off,
    dropped with that reason), the run still finishes, and `info` shows the error."""
    script = WRITE_ERRORS.format(root=str(ROOT), tests=str(ROOT / "tests"), run=str(tmp_path), backoff=backoff)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    run = inspector.open_run(tmp_path)
    assert run.status == "finished"
    assert sorted(run.stats["step"].unique()) == list(range(1, 9))
    errors = run.errors
    assert len(errors) == 1 and "Errno 27" in errors.iloc[0]["reason"] and errors.iloc[0]["first_step"] == 1
    reasons = dict(zip(run.dropped["first_step"], run.dropped["reason"]))
    assert "write error" in reasons[1] and "Errno 27" in reasons[1]
    if backoff:
        assert "backing off" in reasons[2] and run.steps == []
    else:
        assert run.steps == [2]
    out = subprocess.run([sys.executable, "-m", "inspector", "info", str(tmp_path)], capture_output=True, text=True,
                         cwd=ROOT)
    assert "ERROR" in out.stdout and "Errno 27" in out.stdout


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_full_disk_drops_big_dumps_and_keeps_statistics(tmp_path):
    """ENOSPC on a real (tiny tmpfs) filesystem."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        writer_mod = writer
        old, writer_mod.BACKOFF_SECS = writer_mod.BACKOFF_SECS, 0.0
        try:
            w = session(disk / "run", range(1, 4), 0.0, close=None)
            for s in range(1, 4):
                w.add_dump(s, {"forward/a:0": np.ones(40_000, np.float32)})   # 160 KB each: the 2nd fills it
            w.close()
        finally:
            writer_mod.BACKOFF_SECS = old
        run = inspector.open_run(disk / "run")
        assert run.status == "finished" and sorted(run.stats["step"].unique()) == [1, 2, 3]
        assert len(run.steps) == 1 and "Errno 28" in run.errors.iloc[0]["reason"]
        assert run.dropped["count"].sum() == 2
        assert not [p for p in (disk / "run" / "dumps").iterdir() if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)  # lazy: detach even if a handle lingers


def test_a_disk_that_stays_full_still_gets_the_final_manifest(tmp_path):
    """With the disk full to the end, every manifest write after the first
    failed, so the run read "running", then "crashed", and said nothing of what it lost. The
    session's reserve file is deleted to make room for the final manifest."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "512k"):
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        w = session(disk / "run", range(1, 4), 0.0, close=None)
        assert [p.name for p in (disk / "run").iterdir() if p.name.endswith(".reserve.tmp")]
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)   # the disk full, to the last block
        with pytest.raises(OSError):
            while True:
                os.write(fd, bytes(4096))
        os.close(fd)
        w.add_dump(4, {"forward/a:0": np.ones(1000, np.float32)})
        w.close()
        run = inspector.open_run(disk / "run")
        assert run.status == "finished" and run.sessions["state"].tolist() == ["finished"]
        lost = run.dropped.groupby("what")["count"].sum().to_dict()
        assert lost == {"dump": 1, "stats": 3} and "Errno 28" in run.errors.iloc[0]["reason"]
        assert not [p for p in (disk / "run").iterdir() if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_version_1_runs_read_as_session_0(tmp_path):
    """A run written before sessions (format 1): file names without a session, no identity
    columns, a list of single drops. The reader shows it as session 0, mode train."""
    session(tmp_path, range(1, 4), 10.0, dumps=(2,))
    m = json.loads((tmp_path / manifest_name("chief", 1)).read_text())
    for k in ("session", "mode", "errors", "steps"):
        m.pop(k)
    m.update(format_version=1, dropped=[{"step": 3, "reason": "byte budget", "bytes": 10}], writer_error="OSError: x")
    (tmp_path / "manifest.chief.json").write_text(json.dumps(m))
    (tmp_path / manifest_name("chief", 1)).unlink()
    (tmp_path / dump_name("chief", 1, 2)).rename(tmp_path / "dumps" / "chief.step-0000000002.safetensors")
    part = next((tmp_path / "stats").iterdir())
    pq.write_table(pq.read_table(part).drop(["worker", "session", "mode", "batch"]),
                   tmp_path / "stats" / "chief.000001.parquet")
    part.unlink()
    run = inspector.open_run(tmp_path)
    assert list(run.sessions[["session", "mode"]].itertuples(index=False)) == [(0, "train")]
    assert means(run.stats, 2) == [12.0] and set(run.stats["session"]) == {0} and set(run.stats["batch"]) == {0}
    assert run.steps == [2] and run.tensor("a:0", 2)[0, 0] == 10.0
    assert run.dropped.iloc[0][["first_step", "count"]].tolist() == [3, 1]
    assert run.errors.iloc[0]["reason"] == "OSError: x"


def test_several_workers_are_told_apart(tmp_path):
    session(tmp_path, range(1, 4), 1.0, dumps=(2,))
    session(tmp_path, range(1, 4), 2.0, dumps=(2,), worker="worker-1")
    run = inspector.open_run(tmp_path)
    assert run.workers == ["chief", "worker-1"] and run.default_worker == "chief"
    assert means(run.stats, 2) == [3.0]                                       # the chief by default
    both = run.query_stats(worker="all")
    assert sorted(map(str, both["worker"].unique())) == ["chief", "worker-1"] and means(both, 2) == [3.0, 4.0]
    with pytest.raises(inspector.InspectorError, match="several writers"):
        run.histogram("a:0", 2, worker="all")
    assert run.tensor("a:0", 2, worker="worker-1")[0, 0] == 2.0 and run.tensor("a:0", 2)[0, 0] == 1.0
    assert list(run.samples(2, worker="worker-1")["worker"]) == ["worker-1"] * 2
    with pytest.raises(inspector.InspectorError, match="worker 'ps-0' wrote nothing"):
        run.query_stats(worker="ps-0")


def test_cli_info_lists_sessions_and_failures(tmp_path):
    session(tmp_path, range(1, 4), 0.0, close="failed")
    session(tmp_path, range(4, 6), 0.0)
    text = cli.summary(inspector.open_run(tmp_path))
    assert "FAILED chief s1" in text and "chief s2 train" in text


def test_a_process_that_exits_without_closing_its_writer_flushes_it(tmp_path):
    """A script that ends without end() (no exception handler closed the session): the writer is
    closed at interpreter exit, buffered statistics included, status 'failed' with the reason."""
    script = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
        from test_sessions import session
        w = session({str(tmp_path)!r}, range(1, 4), 0.0, close=None)   # buffered for 1000 s
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    run = inspector.open_run(tmp_path)
    assert run.status == "failed" and "process exited" in run.sessions.iloc[0]["error"]
    assert sorted(run.stats["step"].unique()) == [1, 2, 3]
    assert not (tmp_path / lock_name("chief")).exists()


def test_a_mode_only_one_worker_ran_defaults_to_that_worker(tmp_path):
    """In a TF_CONFIG cluster the evaluator runs every evaluation and the chief none:
    mode='eval' reads the evaluator without worker=; a chief that evaluated stays the default."""
    session(tmp_path, range(1, 4), 0.0, worker="chief-0")
    session(tmp_path, range(1, 4), 0.0, worker="worker-0")
    session(tmp_path, [3, 3], 7.0, dumps=(3,), mode="eval", worker="evaluator-0")
    run = inspector.open_run(tmp_path)
    assert set(run.stats["worker"]) == {"chief-0"}
    ev = run.query_stats(mode="eval")
    assert set(ev["worker"]) == {"evaluator-0"} and sorted(ev["batch"].unique()) == [0, 1]
    assert run.dump_steps(mode="eval") == [3] and run.tensor("a:0", 3, mode="eval")[0, 0] == 7.0
    assert run.query_stats(mode="predict").empty
    session(tmp_path, [3], 1.0, mode="eval", worker="chief-0")
    assert set(inspector.open_run(tmp_path).query_stats(mode="eval")["worker"]) == {"chief-0"}


def test_cli_export_takes_worker_mode_and_session(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "out"
    session(run, range(1, 4), 1.0, dumps=(2,))
    session(run, range(1, 4), 2.0, dumps=(2,), worker="worker-1")
    session(run, [3, 3], 5.0, dumps=(3,), mode="eval")
    session(run, [3], 6.0, dumps=(3,), mode="eval")
    out.mkdir()

    def export(name, *args):
        assert cli.main(["export", str(run), "--out", str(out / name), *args]) == 0, capsys.readouterr()
        return out / name

    csv = pd.read_csv(export("a.csv", "--format", "csv", "--worker", "all"))
    assert sorted(csv["worker"].unique()) == ["chief", "worker-1"] and set(csv["mode"]) == {"train"}
    assert set(pd.read_csv(export("w.csv", "--format", "csv", "--worker", "worker-1"))["worker"]) == {"worker-1"}
    ev = pq.read_table(export("e.parquet", "--format", "parquet", "--mode", "eval", "--session", "2")).to_pandas()
    assert set(ev["session"]) == {2} and list(ev["batch"].unique()) == [0, 1]
    with np.load(export("c.npz", "--format", "npz")) as z:
        assert sorted(z.files) == ["step2/forward/a:0", "step2/samples/index"] and z["step2/forward/a:0"][0, 0] == 1
    with np.load(export("all.npz", "--format", "npz", "--worker", "all")) as z:
        assert z["worker-1/step2/forward/a:0"][0, 0] == 2 and z["chief/step2/forward/a:0"][0, 0] == 1
    with np.load(export("ev.npz", "--format", "npz", "--mode", "eval", "--session", "all")) as z:
        assert z["s2/step3/batch0/forward/a:0"][0, 0] == 5 and z["s3/step3/batch0/forward/a:0"][0, 0] == 6
    with np.load(export("ev1.npz", "--format", "npz", "--mode", "eval")) as z:    # the later session wins
        assert sorted(z.files) == ["step3/batch0/forward/a:0", "step3/batch0/samples/index"]
        assert z["step3/batch0/forward/a:0"][0, 0] == 6
    assert cli.main(["export", str(run), "--out", str(out / "x.csv"), "--format", "csv",
                     "--worker", "ps-0"]) == 2
    assert "worker 'ps-0' wrote nothing" in capsys.readouterr().err


def test_nonfinite_evidence_lists_both_sightings_by_step(tmp_path):
    """The hook's loss check saw step 5 in loss:0; statistics (every 2 steps) see step 6."""
    w = session(tmp_path, [2, 4], 0.0, close=None)
    vals = np.zeros((2, 9))
    vals[:, 0], vals[1, 7] = 4, 3          # gradient row: 3 NaN
    w.add_stats(6, vals, empty_rows(2))
    w.update_manifest(first_nonfinite={"step": 5, "tensor": "loss:0", "kind": "forward", "source": "loss check"})
    w.close()
    run = inspector.open_run(tmp_path)
    ev = run.nonfinite_evidence()
    assert [(e["step"], e["source"], e["tensor"]) for e in ev] == [(5, "loss check", "loss:0"),
                                                                    (6, "statistics", "a:0")]
    assert run.first_nonfinite()["step"] == 5
    text = cli.summary(run)
    assert "first NaN/Inf at step 5 in loss:0" in text and "also NaN/Inf at step 6 in a:0" in text


def test_nonfinite_evidence_names_a_later_session_that_ran_its_step_again(tmp_path):
    """Session 1's loss check saw a NaN at step 8 and it failed; session 2 resumed from step 5 and
    ran steps 6..15 cleanly. The reader shows session 2's finite rows at step 8: the evidence
    (and the alert, the CLI's line) says it was session 1's, and that session 2 re-ran the step,
    instead of reporting a NaN at a step whose shown rows hold none."""
    from inspector.analysis import run_alerts
    w = session(tmp_path, range(1, 11), 100.0, close=None)
    w.update_manifest(first_nonfinite={"step": 8, "tensor": "loss:0", "kind": "forward", "source": "loss check"})
    w.close("failed", error="NaN loss")
    session(tmp_path, range(6, 16), 200.0)
    run = inspector.open_run(tmp_path)
    assert run.query_stats(steps=(8, 8))["nan"].sum() == 0
    first = run.first_nonfinite()
    assert (first["step"], first["session"], first["rerun_by"]) == (8, 1, 2)
    alert = next(a for a in run_alerts(run) if a.kind == "nonfinite")
    assert "seen by session 1, whose step session 2 ran again" in alert.message
    assert "whose step session 2 ran again" in cli.summary(run)
    w = session(tmp_path / "one", range(1, 11), 100.0, close=None)
    w.update_manifest(first_nonfinite={"step": 8, "tensor": "loss:0", "kind": "forward", "source": "loss check"})
    w.close()
    first = inspector.open_run(tmp_path / "one").first_nonfinite()
    assert first["session"] == 1 and "rerun_by" not in first


@pytest.mark.parametrize("field, value", [("worker", "{}"), ("worker", "worker-9"), ("session", 7)])
def test_a_manifest_naming_another_writer_than_its_file_is_damaged(tmp_path, field, value):
    """A manifest's own worker field reached file-name building."""
    session(tmp_path, [1], 0.0)
    session(tmp_path, [2], 0.0)
    path = tmp_path / manifest_name("chief", 2)
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    run = inspector.open_run(tmp_path)
    assert list(run.sessions["session"]) == [1] and run.manifest["session"] == 1
    assert any(f"its {field}" in p and "file name" in p for p in run.problems), run.problems


def test_a_session_part_without_its_identity_columns_is_damaged(tmp_path):
    """A flipped byte renamed `session` in a part's footer.
    Only version 1 parts (no session in the file name) may lack the identity columns."""
    session(tmp_path, [1, 2], 0.0)
    part = next((tmp_path / "stats").iterdir())
    t = pq.read_table(part)
    pq.write_table(t.rename_columns(["ses{ion" if c == "session" else c for c in t.column_names]), part)
    run = inspector.open_run(tmp_path)
    assert run.stats.empty and any("no column session" in p for p in run.problems), run.problems


def test_drain_returns_once_every_queued_dump_is_written(tmp_path, monkeypatch):
    """drain() waits for the dump threads, which write apart from the manifest's thread: a
    reader syncing on a manifest token alone could miss a dump still being written."""
    import threading
    gate = threading.Event()
    real = RunWriter._write_dump

    def slow(self, item):
        gate.wait(30)                       # held until the test has seen drain() time out
        real(self, item)

    monkeypatch.setattr(RunWriter, "_write_dump", slow)
    w = RunWriter(tmp_path, manifest={"tensors": []})
    w.add_dump(3, {"forward/x:0": np.ones((2, 2), np.float32)})
    assert w.drain(0.05) is False           # the dump is still held
    gate.set()
    assert w.drain(30) is True
    assert (tmp_path / dump_name("chief", w.session, 3)).is_file()
    w.close()


def test_a_session_whose_manifest_is_damaged_is_in_no_modes_view(tmp_path):
    """A session whose manifest is damaged was read as training. An
    evaluation's rows and dump then stood for training step 10. Its mode is unknown now: it is
    read only with mode='all' or by its number, and run.problems names the manifest."""
    session(tmp_path, range(1, 11), 0.0, dumps=(10,))
    session(tmp_path, [10, 10], 50.0, dumps=(10,), mode="eval")
    path = tmp_path / manifest_name("chief", 2)
    path.write_text(json.dumps({**json.loads(path.read_text()), "dumps_written": "two"}))
    run = inspector.open_run(tmp_path)
    assert any("dumps_written" in p for p in run.problems), run.problems
    assert means(run.stats, 10) == [10.0] and set(run.stats["session"]) == {1}
    assert run.tensor("a:0", 10)[0, 0] == 0.0 and run.steps == [10]
    assert run.query_stats(mode="eval").empty
    assert means(run.query_stats(session=2), 10) == [60.0, 60.0]
    assert set(run.query_stats(mode="all")["session"]) == {1, 2}


def _session_of(path: Path, tensor: str, steps, value: float, mode: str = "train", batches: int = 1) -> None:
    """A session of one tensor ``tensor`` (another catalog than :func:`session`'s)."""
    layout = StatsLayout((tensor,), ("forward",), ("all",))
    catalog = [{**CATALOG[0], "name": tensor, "op": tensor.split(":")[0]}]
    w = RunWriter(path, worker="chief", manifest={"tensors": catalog, "is_chief": True}, stats_layout=layout,
                  mode=mode, stats_flush_secs=1000)
    for s in steps:
        for b in range(batches):
            vals = np.zeros((1, 9))
            vals[:, 0], vals[:, 1] = 4, value + b
            w.add_stats(s, vals, empty_rows(1), batch=b)
    w.close("finished")


def test_the_later_session_wins_a_step_whatever_a_query_asks(tmp_path):
    """The rule ran on the rows a query's filters let through, so asking
    for one tensor (or one eval batch) brought back an earlier session's rows of steps a later
    session had recorded, and the answer depended on the question. A resumed training that
    records other tensors, and two evaluations at one step, one of three batches, one of one."""
    _session_of(tmp_path, "a:0", range(0, 40), 0.0)
    _session_of(tmp_path, "b:0", range(20, 60), 1000.0)
    _session_of(tmp_path, "a:0", [40], 100.0, mode="eval", batches=3)
    _session_of(tmp_path, "a:0", [40], 200.0, mode="eval", batches=1)
    run = inspector.open_run(tmp_path)
    whole = run.stats
    assert sorted(whole[whole.tensor == "a:0"]["step"]) == list(range(20))
    assert sorted(run.query_stats(["a:0"])["step"]) == list(range(20))
    assert sorted(run.query_stats(["b:0"])["step"]) == list(range(20, 60))
    assert run.query_stats(mode="eval")["mean"].tolist() == [200.0]
    assert run.query_stats(mode="eval", batch=2).empty and run.view(mode="eval", batch=2).stats.empty
    assert run.query_stats(mode="eval", batch=2, session=3)["mean"].tolist() == [102.0]


def test_a_session_its_owner_check_is_ending_survives_the_process_exit(tmp_path):
    """The owner check (RunWriter(owner_gone=)) ending a session while the process exits (a
    script whose fit raised): atexit waits for that end, so the daemon writer thread is not
    killed halfway (the session would read "running", its unflushed statistics lost)."""
    script = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from inspector import writer
        from inspector.writer import RunWriter, StatsLayout
        from inspector.format.loghist import empty_rows
        writer.OWNER_CHECK_SECS = 0.01
        flush = RunWriter._flush_stats
        def slow(self, final=False, **kw):
            if final:
                time.sleep(1.0)   # slow storage: the process exits while the session ends
            return flush(self, final=final, **kw)
        RunWriter._flush_stats = slow
        gone = []
        w = RunWriter({str(tmp_path)!r}, manifest={{"tensors": []}}, stats_flush_secs=1000,
                      stats_layout=StatsLayout(("a:0",), ("forward",), ("all",)),
                      owner_gone=lambda: "owner gone" if gone else None)
        for s in (1, 2, 3):
            w.add_stats(s, np.ones((1, 9)), empty_rows(1))
        gone.append(1)
        deadline = time.monotonic() + 60
        while not w.closed and time.monotonic() < deadline:   # until the check has begun ending it
            time.sleep(0.01)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    run = inspector.open_run(tmp_path)
    assert run.manifests[("chief", 1)]["status"] == "failed"
    assert run.manifests[("chief", 1)]["error"] == "owner gone"
    assert sorted(run.stats_steps()) == [1, 2, 3]
