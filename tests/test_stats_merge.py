"""Levels of compaction (inspector.stats.merge): merged parts read exactly the rows of a run
never compacted (the oracle), a query for one tensor reads only its row groups, and a crash
between a merge's rename and its deletes counts no row twice."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import inspector
from inspector.stats import merge as stats_merge, parts as stats_parts
from inspector.format import stats_range_name
from inspector.stats.merge import Levels
from inspector.testing import SyntheticRun
from test_compaction import KEYS, parts, table  # the same oracle table and part listing

STEPS = 9


def write(path: Path, compact_rows: int | None, merge_parts: int = 2) -> Path:
    """A synthetic run, one small part per step, compacted every ``compact_rows`` rows and
    merged by levels of ``merge_parts``."""
    b = SyntheticRun(path, tensors=12, steps_hint=STEPS, dump_every=None, stats_flush_secs=0)
    b.writer._compactor.rows = compact_rows
    b.writer._compactor.after.levels = Levels(merge_parts)
    b.write_steps(0, STEPS)
    b.close()
    return path


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> pd.DataFrame:
    return table(inspector.open_run(write(tmp_path_factory.mktemp("plain") / "run", None)))


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(stats_parts, "ROW_GROUP_ROWS", 64)   # several row groups per part
    monkeypatch.setattr(stats_merge, "BATCH_GROUPS", 1)      # many batches per merge


def one_tensor(run, name: str) -> pd.DataFrame:
    got = run.query_stats([name], kinds=["forward"]).sort_values(KEYS).reset_index(drop=True)
    return got.assign(hist_bucket=got.hist_bucket.map(list), hist_count=got.hist_count.map(list))


def test_merged_levels_read_the_same_rows(tmp_path, oracle, small_groups):
    rows_per_step = len(oracle) // STEPS
    path = write(tmp_path / "run", compact_rows=2 * rows_per_step)
    # 1-2, 3-4 -> 1-4; 5-6, 7-8 -> 5-8; 1-4, 5-8 -> 1-8; step 9 alone stays a small part
    assert parts(path) == ["chief.s0001.000001-000008.parquet", "chief.s0001.000009.parquet"]
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == []
    for name in run.tensors.index[[0, 5, -1]]:
        want = oracle[(oracle.tensor == name) & (oracle.kind == "forward")].reset_index(drop=True)
        pd.testing.assert_frame_equal(one_tensor(run, name), want)
    pf = pq.ParquetFile(path / "stats" / "chief.s0001.000001-000008.parquet")
    groups = stats_parts.row_groups_for(pf, [run.tensors.index[5]])
    assert groups and len(groups) < pf.num_row_groups  # only this tensor's row groups are read
    # the index names every row's tensor: reading the named groups of each tensor gives all rows
    rows = sum(pf.read_row_groups(stats_parts.row_groups_for(pf, [t])).column("tensor").to_pylist().count(t)
               for t in run.tensors.index)
    assert rows == pf.metadata.num_rows


@pytest.mark.parametrize("keep", [{(1, 2)}, {(1, 2), (3, 4)}])
def test_crash_between_merge_rename_and_deletes_counts_no_row_twice(tmp_path, monkeypatch, oracle, small_groups, keep):
    rows_per_step = len(oracle) // STEPS
    path = write(tmp_path / "run", compact_rows=2 * rows_per_step, merge_parts=10)  # 1-2, 3-4, 5-6, 7-8, 9
    real = os.unlink
    monkeypatch.setattr(stats_merge.os, "unlink",
                        lambda p: None if stats_parts.seq_range(Path(p).name) in keep else real(p))
    stats_merge.merge(path, "chief", 1, [path / stats_range_name("chief", 1, a, a + 1) for a in (1, 3)])
    names = parts(path)
    assert "chief.s0001.000001-000004.parquet" in names
    assert all(f"chief.s0001.{a:06d}-{b:06d}.parquet" in names for a, b in keep)
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == []


def test_merge_refuses_what_it_cannot_merge(tmp_path, oracle):
    rows_per_step = len(oracle) // STEPS
    path = write(tmp_path / "run", compact_rows=2 * rows_per_step, merge_parts=10)
    with pytest.raises(ValueError, match="consecutive ranges"):
        stats_merge.merge(path, "chief", 1, [path / stats_range_name("chief", 1, a, a + 1) for a in (1, 5)])
    fake = path / "stats" / "chief.s0001.000009-000009.parquet"
    shutil.copy(path / "stats" / "chief.s0001.000009.parquet", fake)  # a plain part: no tensor index
    before = parts(path)
    with pytest.raises(ValueError, match="no tensor index"):
        stats_merge.merge(path, "chief", 1, [path / stats_range_name("chief", 1, 7, 8), fake])
    assert parts(path) == before
    pd.testing.assert_frame_equal(table(inspector.open_run(path)), oracle)


def test_failed_merge_keeps_every_part_and_is_recorded(tmp_path, monkeypatch, oracle):
    def broken(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(stats_merge, "_write_streaming", broken)
    rows_per_step = len(oracle) // STEPS
    path = write(tmp_path / "run", compact_rows=2 * rows_per_step)
    assert parts(path) == ["chief.s0001.000001-000002.parquet", "chief.s0001.000003-000004.parquet",
                           "chief.s0001.000005-000006.parquet", "chief.s0001.000007-000008.parquet",
                           "chief.s0001.000009.parquet"]
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert {(e["what"], "No space left" in e["reason"]) for e in run.manifest["errors"]} == {("compaction", True)}


def test_levels_merge_k_parts_of_one_level():
    lv = Levels(3)
    due = [lv.add(a, a) for a in range(1, 10)]
    assert [d for d in due if d] == [[[(1, 1), (2, 2), (3, 3)]], [[(4, 4), (5, 5), (6, 6)]],
                                     [[(7, 7), (8, 8), (9, 9)], [(1, 3), (4, 6), (7, 9)]]]
    assert lv.stack == [(1, 9, 2)]
    with pytest.raises(ValueError, match="merge_parts=1 must be >= 2"):
        Levels(1)
