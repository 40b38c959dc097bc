"""A large statistics part without a row-group index gets a tensor-sorted copy in the local
cache on its first one-tensor query (inspector/stats/sorted_cache.py); later queries of that
part version read the copy's row groups instead of decoding the part; a changed part gets a new
copy; a damaged or foreign copy is never read, but deleted and written again."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import inspector
from inspector.stats import sorted_cache
from inspector.testing import make_unindexed_run


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TF_INSPECTOR_CACHE", str(d))
    # small enough for a test's part: several buckets, several row groups in each
    monkeypatch.setattr(sorted_cache, "SORT_ROWS", 5_000)
    monkeypatch.setattr(sorted_cache, "BUCKET_ROWS", 3_000)
    monkeypatch.setattr(sorted_cache, "SPLIT_ROWS", 2_000)
    return d / "sorted"


@pytest.fixture()
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(file name, rows) of every batch or row group decoded from any Parquet file."""
    seen: list[tuple[str, int]] = []
    real_batches, real_groups = pq.ParquetFile.iter_batches, pq.ParquetFile.read_row_groups
    real_group = pq.ParquetFile.read_row_group

    def batches(self, *a, **k):
        for b in real_batches(self, *a, **k):
            seen.append((_name(self), b.num_rows))
            yield b

    def groups(self, *a, **k):
        t = real_groups(self, *a, **k)
        seen.append((_name(self), t.num_rows))
        return t
    def group(self, *a, **k):
        t = real_group(self, *a, **k)
        seen.append((_name(self), t.num_rows))
        return t
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", batches)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", group)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", groups)
    return seen


def _name(pf: pq.ParquetFile) -> str:
    """"copy" for a sorted copy (its footer names its part), else "part"."""
    return "copy" if sorted_cache.SOURCE_KEY in (pf.metadata.metadata or {}) else "part"


def _part(run: Path) -> Path:
    return next((run / "stats").glob("*.parquet"))


def _expected(run: Path, name: str) -> pa.Table:
    t = pq.read_table(_part(run))
    return t.filter(pc.equal(pc.cast(t.column("tensor"), pa.string()), name))


def _query(run: Path, name: str):
    r = inspector.open_run(run)
    df = r.query_stats([name])
    assert r.problems == []
    return df


def _same_rows(df, expected: pa.Table) -> None:
    key = ["step", "kind", "group"]
    assert len(df) == expected.num_rows > 0
    got = df.sort_values(key)[key + ["mean"]].reset_index(drop=True)
    want = expected.to_pandas().sort_values(key)[key + ["mean"]].reset_index(drop=True)
    assert got.astype(str).equals(want.astype(str))


@pytest.mark.parametrize("linear", [False, True], ids=["log-histogram", "before-version-4"])
def test_second_query_reads_the_sorted_copy_not_the_part(tmp_path, cache, decoded, linear):
    run = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=40, linear=linear,
                             row_group_rows=4_000)
    names = inspector.open_run(run).tensors.index
    first = _query(run, names[5])
    _same_rows(first, _expected(run, names[5]))
    copies = list(cache.glob("*.parquet"))
    assert len(copies) == 1
    copy = pq.ParquetFile(copies[0])
    assert copy.metadata.num_rows == 20_000 and copy.num_row_groups > 1
    decoded.clear()
    second = _query(run, names[17])
    _same_rows(second, _expected(run, names[17]))
    part_rows = sum(n for f, n in decoded if f == "part")
    copy_rows = sum(n for f, n in decoded if f == "copy")
    # the part is not decoded at all (not even its tensor column); of the copy, the row
    # groups holding the tensor only
    assert part_rows == 0
    assert len(second) <= copy_rows < 20_000 // 2, decoded
    decoded.clear()   # a scalar query writes no copy, but reads one that is there
    r = inspector.open_run(run)
    assert len(r.query_stats([names[30]], columns=["mean"])) == _expected(run, names[30]).num_rows
    assert not [n for f, n in decoded if f == "part"] and decoded


def test_small_or_scalar_queries_make_no_copy(tmp_path, cache, monkeypatch):
    run = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=40, row_group_rows=4_000)
    name = inspector.open_run(run).tensors.index[3]
    inspector.open_run(run).query_stats([name], columns=["mean"])  # no histogram: cheap as is
    assert not cache.exists() or not list(cache.glob("*.parquet"))
    monkeypatch.setenv("TF_INSPECTOR_SORTED_BYTES", "0")   # copies turned off
    _same_rows(_query(run, name), _expected(run, name))
    assert not cache.exists() or not list(cache.glob("*.parquet"))


def test_a_changed_part_gets_a_new_copy(tmp_path, cache):
    run = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=40, row_group_rows=4_000)
    name = inspector.open_run(run).tensors.index[9]
    _query(run, name)
    old = {p.name for p in cache.glob("*.parquet")}
    part = _part(run)
    t = pq.read_table(part)   # same rows, other means: as a part rewritten in place
    t = t.set_column(t.schema.get_field_index("mean"), "mean",
                     pc.add(t.column("mean"), 1000.0))
    pq.write_table(t, part, row_group_size=4_000)
    df = _query(run, name)
    _same_rows(df, _expected(run, name))
    assert (df["mean"] > 500).all()
    assert {p.name for p in cache.glob("*.parquet")} - old   # a new key


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign", "bad page"])
def test_a_damaged_or_foreign_copy_is_never_read(tmp_path, cache, damage):
    run = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=40, row_group_rows=4_000)
    name = inspector.open_run(run).tensors.index[11]
    _query(run, name)
    [copy] = cache.glob("*.parquet")
    if damage == "garbage":
        copy.write_bytes(b"PAR1" + os.urandom(5000) + b"PAR1")
    elif damage == "truncated":
        copy.write_bytes(copy.read_bytes()[:-100])
    elif damage == "foreign":
        # another part's copy (other means) under this part's key
        other = make_unindexed_run(tmp_path / "o", rows=20_000, tensors=40, row_group_rows=4_000)
        t = pq.read_table(_part(other))
        t = t.set_column(t.schema.get_field_index("mean"), "mean", pc.negate(t.column("mean")))
        pq.write_table(t, _part(other), row_group_size=4_000)
        copy.unlink()
        _query(other, name)
        [foreign] = cache.glob("*.parquet")
        shutil.move(foreign, copy)
    else:   # a data page flipped, the footer intact: the checksum fails when read
        data = bytearray(copy.read_bytes())
        for i in range(1000, len(data) // 2, 97):
            data[i] ^= 0xFF
        copy.write_bytes(bytes(data))
    df = _query(run, name)
    _same_rows(df, _expected(run, name))
    # the next query reads a good copy again (rebuilt now or by this query)
    _query(run, name)
    [again] = cache.glob("*.parquet")
    meta = pq.ParquetFile(again).metadata
    assert meta.num_rows == 20_000
    assert meta.metadata[sorted_cache.SOURCE_KEY] == again.stem.encode()


# the child writes the copy of a 120,000-row part in 4,000-row buckets, prints Arrow's peak
CHILD = """
import json, sys
import pyarrow as pa
import inspector
from inspector.stats import sorted_cache
sorted_cache.SORT_ROWS, sorted_cache.BUCKET_ROWS, sorted_cache.SPLIT_ROWS = 5000, 4000, 2000
run = inspector.open_run(sys.argv[1])
df = run.query_stats([run.tensors.index[1]])
print(json.dumps({"rows": len(df), "peak": pa.default_memory_pool().max_memory()}))
"""


def test_writing_the_copy_holds_a_bucket_not_the_part(tmp_path):
    run = make_unindexed_run(tmp_path / "r", rows=120_000, tensors=100, row_group_rows=20_000)
    whole = pq.read_table(_part(run)).nbytes
    env = {**os.environ, "TF_INSPECTOR_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(run)], capture_output=True,
                         text=True, check=True, env=env)
    got = json.loads(out.stdout)
    assert got["rows"] > 0 and list((tmp_path / "cache" / "sorted").glob("*.parquet"))
    # sorting the part in memory would hold it whole, twice
    assert got["peak"] < whole / 5, (got["peak"], whole)


def test_the_bounded_read_still_answers_without_a_writable_cache(tmp_path, monkeypatch):
    run = make_unindexed_run(tmp_path / "r", rows=20_000, tensors=40, row_group_rows=4_000)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TF_INSPECTOR_CACHE", str(blocker))
    monkeypatch.setattr(sorted_cache, "SORT_ROWS", 5_000)
    name = inspector.open_run(run).tensors.index[2]
    _same_rows(_query(run, name), _expected(run, name))
