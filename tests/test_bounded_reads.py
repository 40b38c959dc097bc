"""A statistics part without a row-group index is read in bounded batches with the tensor
filter applied as it is read: a one-tensor query's memory follows its answer, not the part;
the reader's memory budget turns a larger answer into an error naming a narrower question."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import inspector
from inspector.errors import MemoryBudgetError
from inspector.stats import schema
from inspector.testing import make_unindexed_run

# the child reads the part in batches of 4,096 rows and prints Arrow's peak allocation
CHILD = """
import json, sys
import pyarrow as pa
import inspector
from inspector.stats import schema
schema.BATCH_ROWS = 4096
run = inspector.open_run(sys.argv[1])
name = run.tensors.index[len(run.tensors) // 2]
df = run.query_stats([name])
print(json.dumps({"rows": len(df), "tensors": df.tensor.nunique(), "steps": int(df.step.nunique()),
                  "peak": pa.default_memory_pool().max_memory(), "problems": run.problems}))
"""


def _decoded_bytes(path) -> int:
    return pq.read_table(next((path / "stats").glob("*.parquet"))).nbytes


@pytest.mark.parametrize("linear", [False, True], ids=["log-histogram", "before-version-4"])
def test_one_tensor_of_an_unindexed_part_reads_in_bounded_batches(tmp_path, linear):
    # 120,000 rows in ONE row group: without batches the whole group is decoded at once
    path = make_unindexed_run(tmp_path / "r", rows=120_000, tensors=200, linear=linear,
                              row_group_rows=120_000)
    whole = _decoded_bytes(path)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                         text=True, check=True)
    got = json.loads(out.stdout)
    assert got["problems"] == []
    # ~6 rows a tensor and step: about 100 steps of the one tensor
    assert got["tensors"] == 1 and got["steps"] >= 90 and got["rows"] >= got["steps"]
    # the answer and a few 4,096-row batches, far below the part decoded whole
    assert got["peak"] < whole / 4, (got["peak"], whole)


def _spy_batches(monkeypatch) -> list[int]:
    """The rows of every batch the reader decodes."""
    decoded: list[int] = []
    real = pq.ParquetFile.iter_batches

    def spy(self, batch_size=65536, row_groups=None, columns=None, **kw):
        for b in real(self, batch_size, row_groups=row_groups, columns=columns, **kw):
            decoded.append(b.num_rows)
            yield b
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    return decoded


def test_batched_read_answers_as_the_whole_part(tmp_path, monkeypatch):
    path = make_unindexed_run(tmp_path / "r", rows=30_000, tensors=50, row_group_rows=6_000)
    everything = inspector.open_run(path).query_stats(columns=["mean"])
    decoded = _spy_batches(monkeypatch)
    monkeypatch.setattr(schema, "BATCH_ROWS", 1000)
    run = inspector.open_run(path)
    name = run.tensors.index[0]
    df = run.query_stats([name], columns=["mean"])
    assert decoded and max(decoded) <= 1000
    assert len(everything) == 30_000 and set(df.tensor) == {name}
    assert df.reset_index(drop=True).equals(
        everything[everything.tensor == name].reset_index(drop=True))


def test_row_groups_without_the_tensor_are_not_decoded(tmp_path, monkeypatch):
    # an older writer's compacted part: sorted by tensor, no index in its footer
    path = make_unindexed_run(tmp_path / "r", rows=30_000, tensors=50)
    part = next((path / "stats").glob("*.parquet"))
    table = pq.read_table(part)
    table = table.take(pc.sort_indices(pc.cast(table.column("tensor"), pa.string())))
    pq.write_table(table, part, row_group_size=1000)
    decoded = _spy_batches(monkeypatch)
    monkeypatch.setattr(schema, "BATCH_ROWS", 500)
    run = inspector.open_run(path)
    name = run.tensors.index[7]
    df = run.query_stats([name])
    assert len(df) == pc.sum(pc.equal(pc.cast(table.column("tensor"), pa.string()), name)).as_py()
    # its ~600 rows lie in one or two 1,000-row groups: the other 28 are never decoded
    assert 0 < sum(decoded) <= 2000


def test_memory_budget_names_a_narrower_query(tmp_path):
    path = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=50)
    whole = _decoded_bytes(path)
    run = inspector.open_run(path, memory_budget=whole // 4)
    with pytest.raises(MemoryBudgetError, match=r"memory budget of .*query_stats\(\[tensor\]"):
        run.query_stats()
    name = run.tensors.index[3]
    one = run.query_stats([name])   # its answer fits
    run.memory_budget = None
    everything = run.query_stats()
    assert len(everything) == 20_000
    assert len(one) == (everything.tensor == name).sum() > 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1GB", True])
def test_memory_budget_is_checked(tmp_path, bad):
    path = make_unindexed_run(tmp_path / "r", rows=100, tensors=10)
    with pytest.raises(ValueError, match=f"memory_budget={bad!r}"):
        inspector.open_run(path, memory_budget=bad)
