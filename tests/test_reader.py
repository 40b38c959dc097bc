"""The run directory and the lazy reader, without TensorFlow."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector.format.loghist import LogHistogram, empty_rows, sparse_of
from inspector import cli
from inspector.format import FORMAT_VERSION, STAT_COLUMNS, dump_name, manifest_name
from inspector.storage.atomic import safe_join
from inspector.testing import make_synthetic_run
from inspector.writer import RunWriter, StatsLayout

ROOT = Path(__file__).resolve().parent.parent


def write_run(path: Path, steps=(1, 2, 3), dumps=(2, 3), max_bytes=None) -> dict:
    """A small run: two tensors, stats at ``steps``, dumps at ``dumps``. Returns what was written."""
    lay = StatsLayout(("a:0", "a:0", "b:0"), ("forward", "gradient", "forward"), ("all", "all", "all"))
    catalog = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [None, 3],
                "scope": "", "has_gradient": True, "batched": True, "icnn_layer": None, "icnn_role": None},
               {"name": "b:0", "op": "b", "op_type": "Softmax", "dtype": "float32", "shape": [None, 3],
                "scope": "", "has_gradient": False, "batched": True, "icnn_layer": None, "icnn_role": None}]
    w = RunWriter(path, manifest={"tensors": catalog, "loss": "loss:0"}, stats_layout=lay, max_bytes=max_bytes)
    rng = np.random.default_rng(0)
    written = {}
    for s in steps:
        vals, x = rng.normal(size=(3, 9)), [rng.normal(size=5) for _ in range(3)]
        vals[:, 7:] = 0   # no NaN/Inf counted: the reader shows a row that counts one as NaN
        w.add_stats(s, vals, sparse_of(x))
        written[("stats", s)], written[("hist", s)] = vals, x
    for s in dumps:
        a = rng.normal(size=(2, 3)).astype(np.float32)
        w.add_dump(s, {"forward/a:0": a, "gradient/a:0": -a, "forward/b:0": a * 2,
                       "samples/index": np.array([0, 5], np.int32), "samples/group": np.array([1, 0], np.int32),
                       "samples/label": np.array([1, 0], np.int64)})
        written[("dump", s)] = a
    w.close()
    return written


def test_steps_of_one_part_keep_their_own_rows_and_values(tmp_path):
    """The writer builds a part from many buffered steps at once: each step's rows (all, or the
    rows its ``keep`` mask names) and values land in order, with its own step and batch."""
    lay = StatsLayout(("a:0",) * 3, ("forward",) * 3, ("all", "positive", "negative"))
    w = RunWriter(tmp_path / "r", manifest={"tensors": [], "loss": None}, stats_layout=lay)
    rng = np.random.default_rng(1)
    sent = {}
    for s, keep in [(1, None), (2, np.array([True, False, False])), (3, None), (4, np.array([False, True, True]))]:
        vals, x = rng.normal(size=(3, 9)), [rng.normal(size=rng.integers(0, 9)) * 10.0 ** s for _ in range(3)]
        vals[:, 7:] = 0   # no NaN/Inf counted: the reader shows a row that counts one as NaN
        w.add_stats(s, vals, sparse_of(x), keep=keep)
        rows = range(3) if keep is None else np.flatnonzero(keep)
        sent.update({(s, lay.groups[r]): (vals[r], LogHistogram.of(x[r])) for r in rows})
    w.close()
    st = inspector.open_run(tmp_path / "r").stats
    assert sorted(zip(st.step, st.group)) == sorted(sent)
    for row in st.itertuples():
        vals, hist = sent[(row.step, row.group)]
        np.testing.assert_allclose([row.mean, row.std, row.l2], vals[[1, 2, 5]])
        assert row.count == int(vals[0])
        assert list(row.hist_bucket) == hist.index.tolist() and list(row.hist_count) == hist.count.tolist()


def test_statistics_of_the_wrong_shape_are_refused_where_they_are_added(tmp_path):
    lay = StatsLayout(("a:0", "b:0"), ("forward", "forward"), ("all", "all"))
    w = RunWriter(tmp_path / "r", manifest={"tensors": [], "loss": None}, stats_layout=lay)
    try:
        w.add_stats(1, np.zeros((2, 9)), empty_rows(2))
        with pytest.raises(ValueError, match=r"step 2: hist splits has shape \(4,\), the layout needs \(3,\)"):
            w.add_stats(2, np.zeros((2, 9)), empty_rows(3))
        with pytest.raises(ValueError, match=r"step 3: values has shape \(3, 9\)"):
            w.add_stats(3, np.zeros((3, 9)), empty_rows(2))
        with pytest.raises(ValueError, match=r"step 6: hist splits must rise from 0 to the 1 buckets"):
            w.add_stats(6, np.zeros((2, 9)), (np.array([0, 2, 1]), np.array([3], np.int16), np.array([1])))
        with pytest.raises(ValueError, match=r"step 7: hist buckets must lie in -2034..2034"):
            w.add_stats(7, np.zeros((2, 9)), (np.array([0, 1, 1]), np.array([4000]), np.array([1])))
        with pytest.raises(ValueError, match=r"step 4: values is not float64"):
            w.add_stats(4, np.array([["n/a"] * 9] * 2, object), empty_rows(2))
        w.add_stats(5, np.ones((2, 9)), empty_rows(2))
    finally:
        w.close()
    assert sorted(set(inspector.open_run(tmp_path / "r").stats.step)) == [1, 5]   # the good steps, both


def test_a_group_with_no_sample_in_the_batch_has_no_row(tmp_path):
    """A group empty in a step's batch (a batch of 1, a small imbalanced
    one) was written with count 0 and a NaN mean, and the overview drew its whole column as
    NaN/Inf (grey), the other rows' finite means discarded. Such a row is not written; the
    `all` row always is."""
    from inspector.stats.summary import overview
    lay = StatsLayout(("a:0",) * 3, ("forward",) * 3, ("all", "positive", "negative"))
    catalog = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [None, 3], "scope": "",
                "has_gradient": False, "batched": True, "icnn_layer": None, "icnn_role": None}]
    w = RunWriter(tmp_path / "r", manifest={"tensors": catalog, "loss": None}, stats_layout=lay)
    count, mean = STAT_COLUMNS.index("count"), STAT_COLUMNS.index("mean")
    for step in (1, 2, 3):
        values = np.ones((3, 9))
        values[:, 7:] = 0   # no NaN/Inf counted
        values[:, mean] = [2.0, 3.0, 1.0]
        if step == 2:   # no positive sample in this batch
            values[1, count], values[1, mean] = 0, np.nan
        w.add_stats(step, values, empty_rows(3))
    w.close()
    run = inspector.open_run(tmp_path / "r")
    pos = run.query_stats(group="positive")
    assert pos["step"].tolist() == [1, 3] and len(run.query_stats(group="all")) == 3
    ov = overview(run, "forward", "positive", "mean")
    assert not np.isnan(ov.matrix).any() and ov.matrix[0].tolist() == [3.0, 3.0]


def test_a_later_session_wins_its_steps_where_it_has_no_row_of_a_group(tmp_path):
    """Two sessions recording steps 1-6 (a re-run), the first with negatives
    at steps 1-3 only, the second at 4-6 only. The reader shows the second's (it wins every
    step); the overview's overlap check compared one group's rows, missed the overlap, and drew
    the first session's superseded rows at 1-3; stats_steps listed them too."""
    from inspector.stats.summary import overview
    lay = StatsLayout(("a:0",) * 3, ("forward",) * 3, ("all", "positive", "negative"))
    catalog = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [None, 3], "scope": "",
                "has_gradient": False, "batched": True, "icnn_layer": None, "icnn_role": None}]
    count, mean = STAT_COLUMNS.index("count"), STAT_COLUMNS.index("mean")
    for scale, negatives in ((1.0, {1, 2, 3}), (100.0, {4, 5, 6})):
        w = RunWriter(tmp_path / "r", manifest={"tensors": catalog, "loss": None}, stats_layout=lay)
        for step in range(1, 7):
            values = np.ones((3, 9))
            values[:, 7:] = 0   # no NaN/Inf counted
            values[:, mean] = scale * step
            if step not in negatives:
                values[2, count], values[2, mean] = 0, np.nan
            w.add_stats(step, values, empty_rows(3))
        w.close()
    run = inspector.open_run(tmp_path / "r")
    q = run.query_stats(group="negative")
    assert dict(zip(q["step"], q["mean"])) == {4: 400.0, 5: 500.0, 6: 600.0}
    assert run.stats_steps("forward", "negative").tolist() == [4, 5, 6]
    ov = overview(run, "forward", "negative", "mean")
    shown = {int(s): v for s, v in zip(ov.steps, ov.matrix[0]) if not np.isnan(v)}
    assert shown == {4: 400.0, 5: 500.0, 6: 600.0}, shown


def test_dump_threads_start_at_the_first_dump(tmp_path):
    """A session that writes no dump (most fits at the defaults) starts no dump thread; the
    first dump starts them and is written."""
    import threading

    def dump_threads():
        return [t for t in threading.enumerate() if t.name.startswith("tf-inspector-dumps-w7-")]
    lay = StatsLayout(("a:0",), ("forward",), ("all",))
    catalog = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [3], "scope": "",
                "has_gradient": False, "batched": False, "icnn_layer": None, "icnn_role": None}]
    w = RunWriter(tmp_path / "r", worker="w7", manifest={"tensors": catalog, "loss": None}, stats_layout=lay)
    w.add_stats(1, np.zeros((1, 9)), empty_rows(1))
    assert dump_threads() == []
    w.add_dump(2, {"forward/a:0": np.arange(3, dtype=np.float32)})
    assert len(dump_threads()) == 2
    w.close()
    assert dump_threads() == []
    np.testing.assert_array_equal(inspector.open_run(tmp_path / "r").tensor("a:0", 2, worker="w7"), [0, 1, 2])


def test_roundtrip_stats_dumps_samples(tmp_path):
    written = write_run(tmp_path / "r")
    run = inspector.open_run(tmp_path / "r")
    assert run.status == "finished" and run.steps == [2, 3]
    assert list(run.tensors.index) == ["a:0", "b:0"]
    np.testing.assert_array_equal(run.tensor("a:0", 3), written[("dump", 3)])
    np.testing.assert_array_equal(run.tensor("a:0", 3, kind="gradient"), -written[("dump", 3)])
    assert not isinstance(run.tensor("a:0", 2), np.memmap)  # small: read (a copy), so truncation cannot SIGBUS
    s = run.stats
    row = s[(s.step == 2) & (s.tensor == "b:0")].iloc[0]
    np.testing.assert_allclose(row[["mean", "std", "min"]].astype(float), written[("stats", 2)][2, 1:4])
    assert row["count"] == int(written[("stats", 2)][2, 0])
    samples = run.samples(2)
    assert list(samples["index"]) == [0, 5] and list(samples["group"]) == ["positive", "negative"]
    edges, counts = run.histogram("a:0", 3, "gradient")
    x = written[("hist", 3)][1]
    assert len(edges) == len(counts) + 1 and counts.sum() == 5 and edges[0] < x.min() and edges[-1] > x.max()
    assert np.array_equal(np.histogram(x, edges)[0], counts)   # each value in its bin
    h = run.log_histogram("a:0", 3, "gradient")
    assert h.index.tolist() == LogHistogram.of(x).index.tolist() and h.total == 5


def test_dump_files_are_plain_safetensors(tmp_path):
    from safetensors.numpy import load_file
    written = write_run(tmp_path / "r")
    loaded = load_file(str(tmp_path / "r" / dump_name("chief", 1, 2)))
    np.testing.assert_array_equal(loaded["forward/a:0"], written[("dump", 2)])
    assert set(loaded) >= {"samples/index", "samples/group", "gradient/a:0"}


def _write_aliased_dump(path: Path, aliases: dict) -> np.ndarray:
    """A run whose dump of step 4 stores 'gradient/a:0' once, aliased by ``aliases``."""
    write_run(path, dumps=())
    from inspector.dumps import files as safetensors_io
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    safetensors_io.write(path / dump_name("chief", 1, 4), {"gradient/a:0": g, "forward/a:0": g + 1},
                         {"step": "4", "worker": "chief", "format_version": str(FORMAT_VERSION),
                          "aliases": json.dumps(aliases)})
    return g


def test_aliases_resolve_to_the_stored_array(tmp_path):
    g = _write_aliased_dump(tmp_path / "r", {"forward/b:0": "gradient/a:0"})
    run = inspector.open_run(tmp_path / "r")
    assert set(run.dump_keys(4)) == {"gradient/a:0", "forward/a:0", "forward/b:0"}
    np.testing.assert_array_equal(run.tensor("b:0", 4), g)
    np.testing.assert_array_equal(run.dump_array(4, "forward/b:0"), run.tensor("a:0", 4, "gradient"))
    from safetensors.numpy import load_file  # plain readers: the stored keys only
    assert set(load_file(str(tmp_path / "r" / dump_name("chief", 1, 4)))) == {"gradient/a:0", "forward/a:0"}


def test_dangling_alias_is_a_damaged_file(tmp_path):
    _write_aliased_dump(tmp_path / "r", {"forward/b:0": "gradient/nope:0"})
    run = inspector.open_run(tmp_path / "r")
    with pytest.raises(inspector.DamagedFileError, match="step-0000000004.*aliases"):
        run.tensor("b:0", 4)
    assert any("aliases" in p for p in run.problems)


def test_status_tells_running_crashed_and_stalled_runs(tmp_path):
    from inspector.run import worker_status
    import datetime as dt
    import socket
    now = dt.datetime.now(dt.timezone.utc)
    live = {"status": "running", "host": socket.gethostname(), "pid": os.getpid(), "heartbeat_secs": 60,
            "updated": now.isoformat()}
    assert worker_status(live) == "running"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert worker_status({**live, "pid": int(gone.stdout)}) == "crashed"  # that process has exited
    elsewhere = {**live, "host": "another-host", "pid": 1}
    assert worker_status(elsewhere) == "running"
    late = (now - dt.timedelta(seconds=60 * 6)).isoformat()  # 6 heartbeats late
    assert worker_status({**elsewhere, "updated": late}) == "stalled"
    assert worker_status({**elsewhere, "updated": late, "status": "finished"}) == "finished"
    assert worker_status({"status": "running", "updated": late}) == "running"  # older runs: no heartbeat


def test_live_writer_beats_and_its_run_reads_running(tmp_path):
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, heartbeat_secs=0.02)
    path = tmp_path / "r" / manifest_name("chief", 1)
    first = path.stat().st_ino
    deadline = time.monotonic() + 30
    while path.stat().st_ino == first and time.monotonic() < deadline:
        time.sleep(0.01)  # polling for the heartbeat's rewrite, not waiting for luck
    assert path.stat().st_ino != first, "the writer did not rewrite its manifest"
    assert inspector.open_run(tmp_path / "r").status == "running"
    w.close()
    assert inspector.open_run(tmp_path / "r").status == "finished"


def test_query_stats_filters(tmp_path):
    write_run(tmp_path / "r", steps=range(1, 11))
    run = inspector.open_run(tmp_path / "r")
    df = run.query_stats(tensors=["a:0"], steps=(3, 5), kinds=["forward"], columns=["mean"])
    assert sorted(df.step) == [3, 4, 5] and set(df.tensor) == {"a:0"} and "std" not in df


def test_not_a_run(tmp_path):
    with pytest.raises(inspector.NotARunError, match="not a run directory"):
        inspector.open_run(tmp_path)
    with pytest.raises(inspector.NotARunError, match="missing does not exist"):
        inspector.open_run(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(inspector.NotARunError, match="file is not a directory"):
        inspector.open_run(tmp_path / "file")
    # an object-store prefix holding nothing is no "directory" to be or not to be: it says so
    with pytest.raises(inspector.NotARunError, match="holds no object .the prefix does not exist"):
        inspector.open_run("memory://tfi-no-such-bucket/runs/x")
    write_run(tmp_path / "inner")
    with pytest.raises(inspector.NotARunError, match="inner"):
        inspector.open_run(tmp_path)  # a folder of runs: the error names the runs inside


def test_unknown_tensor_suggests_close_names(tmp_path):
    write_run(tmp_path / "r")
    run = inspector.open_run(tmp_path / "r")
    with pytest.raises(inspector.UnknownTensorError, match=r"'a:1'.*Did you mean: a:0"):
        run.tensor("a:1", 2)


def test_step_without_dump_lists_nearest(tmp_path):
    write_run(tmp_path / "r", dumps=(10, 20, 30))
    run = inspector.open_run(tmp_path / "r")
    with pytest.raises(inspector.NoDumpError, match=r"step 21.*\[10, 20, 30\]"):
        run.tensor("a:0", 21)


def test_no_gradient_is_not_zeros(tmp_path):
    write_run(tmp_path / "r")
    run = inspector.open_run(tmp_path / "r")
    assert not run.tensors.loc["b:0", "has_gradient"]
    with pytest.raises(inspector.NoDumpError, match="no gradient"):
        run.tensor("b:0", 2, kind="gradient")


def test_future_format_version(tmp_path):
    write_run(tmp_path / "r")
    path = tmp_path / "r" / manifest_name("chief", 1)
    m = json.loads(path.read_text())
    m["format_version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(m))
    with pytest.raises(inspector.FormatVersionError, match=f"version {FORMAT_VERSION + 1}.*upgrade"):
        inspector.open_run(tmp_path / "r")


def test_truncated_dump_is_named_and_the_rest_reads(tmp_path):
    written = write_run(tmp_path / "r")
    bad = tmp_path / "r" / dump_name("chief", 1, 2)
    bad.write_bytes(bad.read_bytes()[:-10])
    run = inspector.open_run(tmp_path / "r")
    with pytest.raises(inspector.DamagedFileError, match=str(bad.name)):
        run.tensor("a:0", 2)
    assert any(bad.name in p for p in run.problems)
    np.testing.assert_array_equal(run.tensor("a:0", 3), written[("dump", 3)])


def test_damaged_stats_part_is_skipped(tmp_path):
    write_run(tmp_path / "r")
    (tmp_path / "r" / "stats" / "chief.s0001.000099.parquet").write_bytes(b"not parquet")
    run = inspector.open_run(tmp_path / "r")
    assert len(run.stats) == 9
    assert any("000099" in p for p in run.problems)


def test_damaged_manifest_of_one_worker(tmp_path):
    write_run(tmp_path / "r")
    (tmp_path / "r" / manifest_name("worker-1", 1)).write_text("{truncated")
    run = inspector.open_run(tmp_path / "r")
    assert run.workers == ["chief"] and any("worker-1" in p for p in run.problems)


def test_byte_budget_drops_and_records(tmp_path):
    write_run(tmp_path / "r", dumps=(1, 2, 3, 4), max_bytes=2000)
    run = inspector.open_run(tmp_path / "r")
    assert 0 < len(run.steps) < 4
    assert run.dropped["count"].sum() == 4 - len(run.steps)
    assert run.dropped["reason"].str.contains("max_bytes").all()
    dumped = sum(p.stat().st_size for p in (tmp_path / "r" / "dumps").iterdir())
    assert dumped <= 2000


def test_safe_join_refuses_escape(tmp_path):
    assert safe_join(tmp_path, "dumps/x") == (tmp_path / "dumps/x").resolve()
    with pytest.raises(ValueError, match="escapes"):
        safe_join(tmp_path, "../../etc/passwd")


def test_import_inspector_leaves_tensorflow_out():
    code = ("import sys, inspector, inspector.cli, inspector.run, inspector.testing, inspector.icnn.templates, "
            "inspector.icnn.stability; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_info_and_export(tmp_path, capsys):
    write_run(tmp_path / "r", steps=range(1, 6))
    assert cli.main(["info", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "2 captured" in out and "dumps      2 steps: 2, 3" in out
    assert cli.main(["export", str(tmp_path / "r"), "--format", "npz", "--out", str(tmp_path / "x.npz"),
                     "--tensors", "^a", "--steps", "3:3"]) == 0
    z = np.load(tmp_path / "x.npz")
    assert sorted(z.files) == ["step3/forward/a:0", "step3/gradient/a:0", "step3/samples/group",
                               "step3/samples/index", "step3/samples/label"]
    assert cli.main(["export", str(tmp_path / "r"), "--format", "csv", "--out", str(tmp_path / "s.csv"),
                     "--steps", "2:3"]) == 0
    import pandas as pd
    df = pd.read_csv(tmp_path / "s.csv")
    assert sorted(df.step.unique()) == [2, 3] and len(df) == 6
    assert cli.main(["export", str(tmp_path / "r"), "--format", "parquet", "--out", str(tmp_path / "s.parquet"),
                     "--tensors", "b:0"]) == 0
    assert set(pd.read_parquet(tmp_path / "s.parquet").tensor) == {"b:0"}


def test_cli_errors_are_clear(tmp_path, capsys):
    assert cli.main(["info", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    write_run(tmp_path / "r")
    assert cli.main(["export", str(tmp_path / "r"), "--format", "npz", "--out", str(tmp_path / "x.npz"),
                     "--tensors", "zzz"]) == 2
    assert "matches none" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "r"), "--format", "csv", "--out", str(tmp_path / "x.csv"),
                     "--steps", "abc"]) == 2
    assert "A:B" in capsys.readouterr().err


@pytest.mark.parametrize("fsync", [False, True])
def test_writer_fsyncs_manifest_always_and_data_files_only_when_asked(tmp_path, monkeypatch, fsync):
    import os
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    lay = StatsLayout(("a:0",), ("forward",), ("all",))
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, stats_layout=lay, fsync=fsync)
    w.add_stats(1, np.zeros((1, 9)), empty_rows(1))
    w.add_dump(1, {"forward/a:0": np.ones(3, np.float32)})
    w.close()
    names = [Path(p).name for p in synced]
    assert any(n.startswith(".manifest.chief.s0001.json.") for n in names)
    data = [n for n in names if ".safetensors." in n or ".parquet." in n]
    assert len(data) == (2 if fsync else 0)
    run = inspector.open_run(tmp_path / "r")  # either way, complete and readable
    assert run.steps == [1] and not run.problems and len(run.stats) == 1


def test_parallel_dump_threads_write_every_dump_and_count_them(tmp_path):
    """Several dump threads: every queued dump lands whole, close() waits for all of them,
    and the manifest's totals add up."""
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, queue_size=16, dump_threads=3)
    rng = np.random.default_rng(3)
    sent = {s: rng.normal(size=(64, 256)).astype(np.float32) for s in range(1, 11)}
    for s, a in sent.items():
        assert w.add_dump(s, {"forward/a:0": a})
    w.close()
    run = inspector.open_run(tmp_path / "r")
    assert run.steps == list(sent) and run.manifest["dumps_written"] == len(sent)
    for s, a in sent.items():
        np.testing.assert_array_equal(run.dump_array(s, "forward/a:0"), a)
    with pytest.raises(ValueError, match="dump_threads=0"):
        RunWriter(tmp_path / "r2", manifest={"tensors": []}, dump_threads=0)


def test_byte_budget_counts_the_exact_file_size(tmp_path):
    """The size a queued dump is charged is its file's size, writer metadata included: a budget
    one byte short of the file drops it, an exact one keeps it."""
    a = {"forward/a:0": np.ones((4, 5), np.float32)}
    w = RunWriter(tmp_path / "free", manifest={"tensors": []})
    assert w.add_dump(7, a, {"aliases": "{}"})
    w.close()
    size = (tmp_path / "free" / dump_name("chief", 1, 7)).stat().st_size
    for budget, kept in ((size - 1, False), (size, True)):
        w = RunWriter(tmp_path / f"b{budget}", manifest={"tensors": []}, max_bytes=budget)
        assert w.add_dump(7, a, {"aliases": "{}"}) is kept
        w.close()
        dropped = inspector.open_run(tmp_path / f"b{budget}").dropped
        assert (list(dropped["bytes"]) == [size]) if not kept else dropped.empty


def test_statistics_without_a_layout_are_refused_at_once(tmp_path):
    """Refused by ``add_stats`` itself, on the caller's thread, not queued to fail later on the
    writer's."""
    w = RunWriter(tmp_path / "r", manifest={})
    with pytest.raises(ValueError, match="no stats_layout"):
        w.add_stats(1, np.zeros((1, 9)), empty_rows(1))
    w.close()
    assert inspector.open_run(tmp_path / "r").stats.empty


def test_graph_of_an_unknown_worker_names_the_workers(tmp_path):
    """An InspectorError naming the run's workers, not a TypeError from inside the reader."""
    RunWriter(tmp_path / "r", manifest={}, graph_def=b"g").close()
    run = inspector.open_run(tmp_path / "r")
    assert run.graph_def_bytes() == b"g"
    with pytest.raises(inspector.InspectorError, match="no worker 'nope' in .*; workers: chief"):
        run.graph_def_bytes(worker="nope")


def test_a_session_killed_before_its_manifest_beat_shows_the_steps_of_its_dumps(tmp_path):
    """A process killed between heartbeats leaves a manifest without steps, but its dumps are
    on disk: the session's steps and dump count come from them (here a copy taken at that
    moment stands for the killed process's directory)."""
    import shutil
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, heartbeat_secs=3600)
    for step in (3, 7):
        w.add_dump(step, {"forward/x:0": np.full((2, 2), step, np.float32)})
    assert w.drain(60)
    shutil.copytree(tmp_path / "r", tmp_path / "killed")
    w.close()
    killed = json.loads((tmp_path / "killed" / manifest_name("chief", 1)).read_text())
    assert killed.get("steps") is None and not killed.get("dumps_written")  # the manifest lags
    s = inspector.open_run(tmp_path / "killed").sessions.iloc[0]
    assert (s["first_step"], s["last_step"], s["dumps"]) == (3, 7, 2)
    assert "steps 3..7" in cli.summary(inspector.open_run(tmp_path / "killed"))


def test_samples_of_a_tensor_that_is_not_per_sample_are_refused(tmp_path):
    """A tensor that is not per-sample is dumped whole: its rows are not the kept samples, and
    labelling them with run.samples(step, tensor=...) pointed at the wrong samples."""
    make_synthetic_run(tmp_path / "r", steps=20, tensors=10, dump_every=10)
    run = inspector.open_run(tmp_path / "r")
    whole = next(n for n in run.tensors.index[~run.tensors["batched"].astype(bool)] if f"forward/{n}" in run.dump_keys(10))
    with pytest.raises(ValueError, match=rf"{re.escape(whole)} is not per-sample \(catalog batched=False\)"):
        run.samples(10, tensor=whole)
    per_sample = run.tensors.index[run.tensors["batched"].astype(bool)][0]
    assert len(run.samples(10, tensor=per_sample)) == len(run.samples(10)) == len(run.tensor(per_sample, 10))


def test_a_sample_index_picks_its_row_and_is_refused_on_a_tensor_stored_whole(tmp_path):
    """run.tensor(..., sample=i) picks batch sample i's row of a per-sample dump (row k is
    run.samples' k-th index, not sample k); a tensor stored whole has no such row."""
    make_synthetic_run(tmp_path / "r", steps=20, tensors=10, dump_every=10)
    run = inspector.open_run(tmp_path / "r")
    per_sample = run.tensors.index[run.tensors["batched"].astype(bool)][0]
    kept = run.samples(10)["index"].tolist()
    whole_value = run.tensor(per_sample, 10)
    for k, i in enumerate(kept):
        np.testing.assert_array_equal(run.tensor(per_sample, 10, sample=i), whole_value[k])
    missing = next(i for i in range(1000) if i not in kept)
    with pytest.raises(inspector.errors.NoDumpError, match=f"sample {missing} was not kept"):
        run.tensor(per_sample, 10, sample=missing)
    with pytest.raises(ValueError, match="sample must be a batch index"):
        run.tensor(per_sample, 10, sample="0")
    whole = next(n for n in run.tensors.index[~run.tensors["batched"].astype(bool)]
                 if f"forward/{n}" in run.dump_keys(10))
    with pytest.raises(ValueError, match=rf"{re.escape(whole)} is stored whole.*catalog batched=False"):
        run.tensor(whole, 10, sample=kept[0])
