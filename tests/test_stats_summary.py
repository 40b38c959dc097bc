"""Step-binned summaries (inspector.stats.summary): the overview matrix equals a numpy
reference of its aggregation (the mean of the finite values of each bin's rows, NaN if any is
NaN/Inf) computed from every row through the reader, whether answered from summaries, from
the parts' rows (summaries missing), or despite a stale or damaged summary (reported)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import inspector
from inspector.stats import summary as stats_summary
from inspector.stats.merge import Levels
from inspector.stats.summary import FOLDER, bin_rows, overview
from inspector.testing import SyntheticRun

STEPS = 40
NAN_STEP = 13


def write(path: Path, start: int = 0, stop: int = STEPS, merge_parts: int = 2, seed: int = 0) -> Path:
    """One small part per step, compacted every 4 steps, merged by twos; a NaN at NAN_STEP."""
    b = SyntheticRun(path, tensors=10, steps_hint=STEPS, dump_every=None, stats_flush_secs=0,
                     nonfinite_at=NAN_STEP, seed=seed)
    b.writer._compactor.rows = 4 * len(b.row_tensor)  # rows per step: one per (tensor, kind, group)
    b.writer._compactor.after.levels = Levels(merge_parts)
    b.write_steps(start, stop)
    b.close()
    return path


def reference(run, kind: str, group: str, stat: str, width: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(tensors, last step per column, matrix) from every row the reader returns, in numpy."""
    df = run.query_stats(kinds=[kind], groups=[group], columns=[stat])
    names = df["tensor"].astype(str).to_numpy()
    tensors = [t for t in run.tensors["name"] if t in set(names)]
    col = df["step"].to_numpy() // width
    cols = np.unique(col)
    m = np.full((len(tensors), len(cols)), np.nan)
    last = np.array([df["step"].to_numpy()[col == c].max() for c in cols])
    values = df[stat].to_numpy(np.float64)
    for i, t in enumerate(tensors):
        for j, c in enumerate(cols):
            v = values[(names == t) & (col == c)]
            if len(v) and np.isfinite(v).all():
                m[i, j] = v.mean()
    return tensors, last, m


def check(run, kind="gradient", group="all", stat="l2", max_columns=6):
    ov = overview(run, kind, group, stat, max_columns=max_columns)
    assert len(ov.steps) <= max_columns and ov.width > 1
    tensors, last, m = reference(run, kind, group, stat, ov.width)
    assert ov.tensors == tensors
    np.testing.assert_array_equal(ov.steps, last)
    np.testing.assert_allclose(ov.matrix, m, rtol=1e-12, equal_nan=True)
    return ov


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("s") / "run")


@pytest.fixture
def run_dir(made, tmp_path) -> Path:
    shutil.copytree(made, tmp_path / "run")
    return tmp_path / "run"


def test_overview_from_summaries_equals_numpy_reference(run_dir):
    summaries = sorted(p.name for p in (run_dir / FOLDER).iterdir())
    parts = sorted(p.name for p in (run_dir / "stats").iterdir() if "-" in p.name)
    assert summaries == parts and parts  # every compacted or merged part has one, merged-away ones none
    run = inspector.open_run(run_dir)
    for kind, group, stat in [("gradient", "all", "l2"), ("forward", "positive", "mean"), ("forward", "all", "nan")]:
        ov = check(run, kind, group, stat)
        assert ov.summarized == len(parts) and run.problems == []
    ov = overview(run, "forward", "all", "max", max_columns=6)
    j = int(np.searchsorted(ov.steps, NAN_STEP))  # the column of the bin holding NAN_STEP
    assert np.isfinite(ov.matrix[:, :j]).all() and np.isnan(ov.matrix[:, j]).any()  # greyed, never averaged away


def test_without_summaries_the_parts_rows_give_the_same_matrix(run_dir):
    shutil.rmtree(run_dir / FOLDER)
    run = inspector.open_run(run_dir)
    ov = check(run)
    assert ov.summarized == 0 and run.problems == []


def test_stale_summary_is_reported_and_not_used(run_dir):
    a, b = sorted((run_dir / FOLDER).iterdir())[:2]
    shutil.copy(b, a)  # another part's summary under this part's name
    run = inspector.open_run(run_dir)
    check(run)
    assert any("stale statistics summary" in p and a.name in p for p in run.problems)


@pytest.mark.parametrize("damage", ["truncate", "counts"])
def test_damaged_summary_is_reported_and_not_used(run_dir, damage):
    import pyarrow.parquet as pq
    s = sorted((run_dir / FOLDER).iterdir())[0]
    if damage == "truncate":
        s.write_bytes(s.read_bytes()[:-100])
    else:  # a summary that parses, with its metadata intact, but counts more finite values than rows
        pf = pq.ParquetFile(s)
        t = pf.read()
        t = t.set_column(t.schema.get_field_index("l2_finite"), "l2_finite", pa.compute.add(t.column("rows"), 1))
        with pq.ParquetWriter(s, t.schema) as w:
            w.write_table(t)
            w.add_key_value_metadata({k.decode(): v.decode() for k, v in pf.metadata.metadata.items()
                                      if k.startswith(b"tf_inspector")})
    run = inspector.open_run(run_dir)
    check(run)
    assert any("damaged statistics summary" in p and s.name in p for p in run.problems)


def test_overlapping_sessions_read_every_row_later_session_wins(run_dir):
    write(run_dir, start=20, stop=30, seed=1)  # session 2 records steps 20-29 again, other values
    run = inspector.open_run(run_dir)
    assert sorted(run.stats["session"].unique()) == [1, 2]
    ov = check(run)
    assert ov.notes and "overlapping" in ov.notes[0]


def test_overlapping_sessions_of_other_tensor_sets_are_drawn(tmp_path):
    """A resumed training that records other tensors (another include=)
    gives each session's parts their own dictionaries, which Arrow's group_by would not mix:
    the overview failed on exactly the multi-session runs its fallback exists for."""
    a = SyntheticRun(tmp_path / "run", tensors=30, steps_hint=STEPS, dump_every=None, seed=1)
    a.write_steps(0, STEPS)
    a.close()
    b = SyntheticRun(tmp_path / "run", tensors=12, steps_hint=STEPS, dump_every=None, seed=2)
    b.write_steps(STEPS // 2, STEPS + 20)
    b.close()
    run = inspector.open_run(tmp_path / "run")
    ov = check(run, "forward", "all", "mean")
    assert len(ov.tensors) == 30 and ov.notes and "overlapping" in ov.notes[0]


def test_bin_rows_sums_and_counts_finite_values():
    t = pa.table({"worker": ["c"] * 4, "session": [1] * 4, "mode": ["train"] * 4, "tensor": ["a"] * 4,
                  "kind": ["forward"] * 4, "group": ["all"] * 4, "step": [1, 2, 3, 9],
                  "l2": [1.0, float("nan"), 3.0, 5.0]})
    out = bin_rows(t, 4, ("l2",)).sort_by("bin").to_pydict()
    assert out["bin"] == [0, 2] and out["rows"] == [3, 1] and out["first_step"] == [1, 9]
    assert out["l2_sum"] == [4.0, 5.0] and out["l2_finite"] == [2, 1] and out["width"] == [4, 4]
    assert stats_summary.pow2_at_least(5) == 8


def test_a_summary_coarser_than_the_columns_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(stats_summary, "PART_BINS", 4)  # 8-step bins in the 32-step part
    run = inspector.open_run(write(tmp_path / "run"))
    coarse = overview(run, "gradient", "all", "l2", max_columns=6)
    assert coarse.width == 8 and coarse.summarized == 2
    fine = overview(run, "gradient", "all", "l2", max_columns=100)  # one column per step
    tensors, last, m = reference(run, "gradient", "all", "l2", 1)
    assert fine.width == 1 and fine.summarized < 2 and list(fine.steps) == list(last)
    np.testing.assert_allclose(fine.matrix, m, rtol=1e-12, equal_nan=True)


def test_coarsen_answers_every_summarized_part_from_its_summary(tmp_path, monkeypatch):
    """coarsen=True widens the columns to the coarsest summary's bins instead of reading that
    part's rows (a merged part of a long run: millions of rows), and gives the same numbers."""
    monkeypatch.setattr(stats_summary, "PART_BINS", 4)  # 8-step bins in the 32-step part
    run = inspector.open_run(write(tmp_path / "run"))
    ov = overview(run, "gradient", "all", "l2", max_columns=100, coarsen=True)
    assert ov.width == 8 and ov.summarized == 2       # not width 1 with the summarized parts read
    tensors, last, m = reference(run, "gradient", "all", "l2", 8)
    assert ov.tensors == tensors and list(ov.steps) == list(last)
    np.testing.assert_allclose(ov.matrix, m, rtol=1e-12, equal_nan=True)


def test_present_tells_a_nan_from_a_step_without_statistics():
    """present[i, j]: tensor i has rows in column j. A NaN cell with rows is a NaN/Inf; one
    without is a step range with no statistics of it (drawn as a gap, not as NaN)."""
    rows = {"worker": ["chief"] * 3, "session": [1] * 3, "mode": ["train"] * 3, "tensor": ["a:0", "a:0", "b:0"],
            "kind": ["gradient"] * 3, "group": ["all"] * 3, "step": [0, 1, 1], "l2": [1.0, float("nan"), 2.0]}
    piece = bin_rows(pa.table(rows), 1, ("l2",))

    class Run:
        tensors = {"name": ["a:0", "b:0"]}
    ov = stats_summary._matrix(Run(), [piece], "l2", 10, 0, 1, [])
    np.testing.assert_array_equal(ov.matrix, [[1.0, np.nan], [np.nan, 2.0]])
    assert ov.present.tolist() == [[True, True], [False, True]]


_READ_IN_CHILD = """
import json, sys
import inspector
from inspector.stats.summary import overview
run = inspector.open_run(sys.argv[1])
df = run.query_stats(steps=(20, 36), kinds=["gradient"], columns=["l2"])
ov = overview(run, "gradient", "all", "l2", max_columns=6)
print(json.dumps({"rows": df[["step", "tensor", "l2"]].astype(str).values.tolist(), "problems": run.problems,
                  "columns": len(ov.steps)}))
"""


def _read_in_child(run_dir: Path) -> dict:
    """A step-range query and the overview, read in a child with a time limit (a hang fails the
    test instead of stalling it)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", _READ_IN_CHILD, str(run_dir)], capture_output=True, text=True,
                          timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_summarised_part_that_is_a_fifo_is_reported_without_opening_it(run_dir, tmp_path):
    # The fuzz's hang: a step-range query (part skipping) and the overview check a summary against
    # its part's footer; a part replaced by a FIFO blocked that open forever.
    part = sorted((run_dir / "stats").iterdir())[0]
    assert (run_dir / FOLDER / part.name).exists()
    without = tmp_path / "without"  # the oracle: the same run without that part
    shutil.copytree(run_dir, without)
    (without / "stats" / part.name).unlink()
    (without / FOLDER / part.name).unlink()
    want = _read_in_child(without)
    part.unlink()
    os.mkfifo(part)
    got = _read_in_child(run_dir)
    assert got["rows"] == want["rows"] and got["columns"] == want["columns"] and want["rows"]
    assert any("not a regular file" in p and part.name in p for p in got["problems"]), got["problems"]
    assert not any("summary" in p for p in got["problems"]), got["problems"]  # the summary is fine
