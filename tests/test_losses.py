"""Losses are always reported: every file a session's manifest says it wrote (statistics parts,
dumps, the graph) that the run lacks is named in ``run.problems`` and by ``info`` (exit 1); a
dump is read as the step its own header names; a statistics part too large for the memory left
is a MemoryError that says what to do, not a "damaged" file; absurd manifest numbers are
refused. On disk and on S3 (moto over HTTP)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pytest

import inspector
from inspector import cli
from inspector.sessions.crosscheck import decode_dumps, encode_dumps, missing_seqs
from inspector.format.manifest import check_manifest
from inspector.testing import SyntheticRun, make_synthetic_run
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

KW = dict(tensors=8, steps_hint=40, dump_every=5, stats_flush_secs=0)


def _write(run: SyntheticRun, start: int, stop: int) -> None:
    for step in range(start, stop):   # one part per step: stats_flush_secs=0 and a sync
        run.write_steps(step, step + 1)
        run.sync()


def test_the_encoding_of_dumps_round_trips():
    for keys in ([], [(3, None)], [(0, None), (5, None), (10, None), (12, None)],
                 [(10, 0), (10, 1), (10, 2), (20, 0), (20, 1), (20, 2)], [(7, None), (7, 0), (7, 1)]):
        runs = encode_dumps(keys)
        assert sorted(decode_dumps(runs), key=lambda k: (k[0], -1 if k[1] is None else k[1])) == \
            sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    assert encode_dumps([(i * i, None) for i in range(3000)]) is None   # too irregular: only counted
    assert missing_seqs([(1, 10), (21, 30)], 40) == [(11, 20), (31, 40)] and missing_seqs([(1, 5)], 5) == []


def test_a_store_wiped_mid_run_names_every_lost_file(s3, capsys):
    """Statistics parts 1-31, dumps of steps 5-30 and the graph deleted while the writer runs
    (the lock and manifest too: the writer recreates both): the reader names each lost file
    and info exits 1 (before: info exited 0 with no problem line, the gaps silent)."""
    url = s3.url("wiped")
    b = SyntheticRun(url, storage_options=s3.options, **KW)
    _write(b, 0, 31)
    fs = s3.filesystem()
    for key in fs.find(url):
        fs.rm_file(key)
    _write(b, 31, 40)
    b.close()
    run = inspector.open_run(url, storage_options=s3.options)
    assert sorted(run.stats["step"].unique()) == list(range(31, 40))
    run.check_dumps()
    problems = "\n".join(run.problems)
    assert f"{url}/graph.chief.s0001.pb: missing" in problems
    assert f"{url}/stats/chief.s0001.000001-000031.parquet: missing" in problems
    for step in range(0, 31, 5):
        assert f"{url}/dumps/chief.s0001.step-{step:010d}.safetensors: missing" in problems
    assert f"step-{35:010d}" not in problems and run.steps == [35]
    # the writer recreated its lock, and says so; its compaction at close missed the lost parts
    assert sorted(e.what for e in run.errors.itertuples()) == ["compaction", "lock"]
    # info lists the first dumps' losses and counts the rest; --all-problems lists every file
    assert cli.main(["info", url, "--storage-options", json.dumps(s3.options)]) == 1
    out = capsys.readouterr().out
    assert "000001-000031.parquet: missing" in out and "... and 2 more like" in out
    assert cli.main(["info", url, "--all-problems", "--storage-options", json.dumps(s3.options)]) == 1
    out = capsys.readouterr().out
    assert out.count("problem    ") == len(run.problems) >= 9 and "more like" not in out


def test_a_part_deleted_between_listing_and_reading_is_named(tmp_path):
    """The query listed the parts, then one was deleted (not compacted): its rows are
    missing from the answer, and run.problems says which part (before: fewer rows, no word)."""
    path = tmp_path / "r"
    b = SyntheticRun(path, **KW)
    _write(b, 0, 6)   # a live session: six parts, not compacted yet
    run = inspector.open_run(path)
    everything = len(run.query_stats(columns=["mean"]))
    (path / "stats" / "chief.s0001.000003.parquet").unlink()
    fewer = len(run.query_stats(columns=["mean"]))
    b.close()
    assert fewer < everything
    assert [p for p in run.problems if "000003" in p] == \
        [f"{path}/stats/chief.s0001.000003.parquet: missing; manifest.chief.s0001.json says statistics parts "
         f"1-6 were written (their rows are not read)"]


@pytest.mark.parametrize("damage", ["dump deleted", "stats is a file", "dumps is a file"])
def test_lost_files_on_disk_make_info_fail(damage, tmp_path, capsys):
    path = make_synthetic_run(tmp_path / "r", steps=12, tensors=8, dump_every=4)
    assert cli.main(["info", str(path)]) == 0
    capsys.readouterr()
    if damage == "dump deleted":
        (path / "dumps" / "chief.s0001.step-0000000004.safetensors").unlink()
        want = "dumps/chief.s0001.step-0000000004.safetensors: missing"
    else:
        sub = damage.split()[0]
        shutil.rmtree(path / sub)
        (path / sub).write_bytes(b"not a folder")
        want = f"{sub} is a file, not a folder"
    assert cli.main(["info", str(path)]) == 1
    out = capsys.readouterr().out
    assert want in out, out
    if damage == "stats is a file":
        assert "stats/chief.s0001.000001.parquet: missing" in out


def test_a_dump_is_read_as_the_step_its_header_names(tmp_path):
    """A dump copied to another step's file name is refused (its header says step 4, its name
    step 8), not served as step 8; the other dumps read as before."""
    path = make_synthetic_run(tmp_path / "r", steps=12, tensors=8, dump_every=4)
    good = inspector.open_run(path).tensor(inspector.open_run(path).tensors.index[1], 0)
    dumps = path / "dumps"
    shutil.copyfile(dumps / "chief.s0001.step-0000000004.safetensors", dumps / "chief.s0001.step-0000000008.safetensors")
    run = inspector.open_run(path)
    name = run.tensors.index[1]
    with pytest.raises(inspector.DamagedFileError, match="header says step 4, its file name step 8"):
        run.tensor(name, 8)
    assert run.check_dumps() == 1 and any("step 8" in p for p in run.problems)
    np.testing.assert_array_equal(run.tensor(name, 0), good)


def test_out_of_memory_is_a_memory_error_not_a_damaged_file(tmp_path, monkeypatch):
    """pyarrow failing to allocate ("realloc failed": an ArrowMemoryError) while reading a
    valid part: a MemoryError that says the file is fine and how to ask for less (before: the
    part was reported damaged and the query answered 0 rows)."""
    import pyarrow.parquet as pq
    path = make_synthetic_run(tmp_path / "r", steps=6, tensors=8)
    run = inspector.open_run(path)

    def no_memory(*args, **kwargs):
        raise pa.ArrowMemoryError("realloc of size 1073741824 failed")

    for name in ("read", "read_row_groups", "read_row_group", "iter_batches"):   # every way a part is read
        monkeypatch.setattr(pq.ParquetFile, name, no_memory)
    with pytest.raises(MemoryError, match=r"needs more memory.*the file is not damaged.*query_stats"):
        run.query_stats(columns=["mean"])
    assert run.problems == []
    monkeypatch.undo()
    assert len(run.query_stats(columns=["mean"]))


@pytest.mark.parametrize("field, value, says", [
    ("tensors", [{"name": "a:0", "shape": [2 ** 62]}], r"tensors\[0\].shape\[0\] must be a dimension"),
    ("tensors", [{"name": "a:0", "shape": [4, -1]}], r"tensors\[0\].shape\[1\] must be a dimension"),
    ("tensors", [{"name": "a:0", "shape": [2 ** 30, 2 ** 30]}], r"tensors\[0\].shape must have at most"),
    ("bytes_written", 10 ** 30, "bytes_written must be an integer from 0"),
    ("dumps_written", -1, "dumps_written must be an integer from 0"),
    ("stats_parts", 10 ** 30, "stats_parts must be an integer from 0"),
    ("steps", [-5, 10], r"steps\[0\] must be an integer from 0"),
    ("heartbeat_secs", 10 ** 30, "heartbeat_secs must be seconds"),
    ("dropped", [{"what": "dump", "reason": "x", "count": 10 ** 30}], r"dropped\[0\].count must be an integer"),
    ("dump_runs", [[0, -1, 10 ** 12, 1, 0]], r"dump_runs\[0\] must list 1 to"),
])
def test_absurd_manifest_numbers_are_refused(field, value, says):
    m = {"format": "tf-inspector", "format_version": 2, "dumps_written": 3, field: value}
    with pytest.raises(inspector.DamagedFileError, match=says):
        check_manifest(m, "manifest.chief.s0001.json")


def test_dump_runs_must_agree_with_the_count():
    m = {"format": "tf-inspector", "format_version": 2, "dumps_written": 3, "dump_runs": [[0, -1, 2, 5, 0]]}
    with pytest.raises(inspector.DamagedFileError, match="dump_runs lists 2 dumps, not the dumps_written 3"):
        check_manifest(m, "manifest.chief.s0001.json")


def test_info_strict_fails_on_recorded_losses(tmp_path, capsys):
    """A run whose writer recorded dropped dumps: info reports them and exits 0 (every file
    there reads); --strict makes any recorded loss an exit status of 1."""
    path = make_synthetic_run(tmp_path / "r", steps=12, tensors=8, dump_every=4, dropped_steps=(8,))
    assert cli.main(["info", str(path)]) == 0
    assert "dropped    1 dump(s)" in capsys.readouterr().out
    assert cli.main(["info", str(path), "--strict"]) == 1
