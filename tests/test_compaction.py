"""Writer-side compaction of statistics parts (inspector.stats_parts): the same rows as a run
never compacted (the oracle), small parts gone, and no row counted twice or lost when a crash
leaves a compacted part beside the parts it replaced."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

import inspector
from inspector import stats_parts
from inspector.format import stats_name
from inspector.testing import SyntheticRun

KEYS = ["step", "tensor", "kind", "group"]


def write(path: Path, steps: int, compact_rows: int | None) -> Path:
    """A synthetic run with one small part per step (stats_flush_secs=0)."""
    b = SyntheticRun(path, tensors=12, steps_hint=steps, dump_every=None, stats_flush_secs=0)
    b.writer._compactor.rows = compact_rows
    b.write_steps(0, steps)
    b.close()
    return path


def table(run) -> pd.DataFrame:
    df = run.stats.sort_values(KEYS).reset_index(drop=True)
    df["histogram"] = df["histogram"].map(list)
    return df


def parts(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "stats").glob("*.parquet"))


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> pd.DataFrame:
    return table(inspector.open_run(write(tmp_path_factory.mktemp("plain") / "run", 9, None)))


def test_compacted_run_reads_the_same_rows(tmp_path, monkeypatch, oracle):
    monkeypatch.setattr(stats_parts, "ROW_GROUP_ROWS", 64)  # several row groups: the index prunes
    rows_per_step = len(oracle) // 9
    path = write(tmp_path / "run", 9, compact_rows=4 * rows_per_step)
    # 4 + 4 rolled up while writing, the last one alone: nothing to roll it with
    assert parts(path) == ["chief.s0001.000001-000004.parquet", "chief.s0001.000005-000008.parquet",
                           "chief.s0001.000009.parquet"]
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == []
    name = run.tensors.index[5]
    got = run.query_stats([name], kinds=["forward"]).sort_values(KEYS).reset_index(drop=True)
    want = oracle[(oracle.tensor == name) & (oracle.kind == "forward")].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.assign(histogram=got.histogram.map(list)), want)
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path / "stats" / "chief.s0001.000001-000004.parquet")
    groups = stats_parts.row_groups_for(pf, [name])
    assert groups and len(groups) < pf.num_row_groups  # only this tensor's row groups are read


def test_leftovers_are_compacted_at_close(tmp_path, oracle):
    path = write(tmp_path / "run", 9, compact_rows=10 ** 9)
    assert parts(path) == ["chief.s0001.000001-000009.parquet"]
    pd.testing.assert_frame_equal(table(inspector.open_run(path)), oracle)


def crash_after_rename(path: Path, seqs: range, keep: set[int], monkeypatch) -> None:
    """Compact ``seqs``, then 'crash' before deleting the small parts in ``keep``."""
    real = os.unlink
    monkeypatch.setattr(stats_parts.os, "unlink",
                        lambda p: None if int(Path(p).name.split(".")[2]) in keep else real(p))
    todo = [(s, path / stats_name("chief", 1, s)) for s in seqs]
    stats_parts.compact(path, "chief", 1, todo)
    monkeypatch.setattr(stats_parts.os, "unlink", real)


@pytest.mark.parametrize("keep", [{2}, {1, 2, 3, 4}])
def test_crash_between_rename_and_delete_counts_no_row_twice(tmp_path, monkeypatch, oracle, keep):
    path = write(tmp_path / "run", 9, compact_rows=None)
    crash_after_rename(path, range(1, 5), keep, monkeypatch)
    names = parts(path)
    assert "chief.s0001.000001-000004.parquet" in names and all(
        f"chief.s0001.{s:06d}.parquet" in names for s in keep)
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == []


def test_overlapping_ranges_are_reported_not_double_counted(tmp_path, monkeypatch, oracle):
    path = write(tmp_path / "run", 9, compact_rows=None)
    crash_after_rename(path, range(1, 4), {3}, monkeypatch)  # 1-3, small part 3 left over
    # a damaged listing: parts 3-5 rolled up again under a range that overlaps 1-3
    shutil.copy(path / stats_name("chief", 1, 3), path / "stats" / "chief.s0001.000003-000005.parquet")
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert any("000003-000005" in p and "overlaps" in p for p in run.problems)


def test_compact_refuses_gaps(tmp_path):
    with pytest.raises(ValueError, match=r"consecutive sequence numbers, not \[1, 3\]"):
        stats_parts.compact(tmp_path, "chief", 1, [(1, tmp_path / "a"), (3, tmp_path / "b")])


def test_failed_compaction_keeps_every_small_part(tmp_path, monkeypatch, oracle):
    def broken(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(stats_parts, "atomic_write", broken)
    path = write(tmp_path / "run", 9, compact_rows=1)
    assert len(parts(path)) == 9
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert [(e["what"], "No space left" in e["reason"]) for e in run.manifest["errors"]] == [("compaction", True)]
