"""A remote statistics query for one tensor reads only the row groups that hold its rows: a
compacted part's footer maps each tensor to its row groups (``stats_parts.INDEX_KEY``), and
the reader uses that index on an object store as on disk. Counted at the filesystem."""
from __future__ import annotations

import uuid

import pandas as pd
import pyarrow.parquet as pq
import pytest

import inspector
import numpy as np

from inspector.stats.parts import INDEX_KEY, MIN_GROUP_ROWS
from inspector.testing import SyntheticRun

fsspec = pytest.importorskip("fsspec")


def _counting_memory_fs():
    """A memory:// filesystem that adds up the bytes each ranged read returns."""
    from fsspec.implementations.memory import MemoryFileSystem

    class Counting(MemoryFileSystem):
        got: list[int] = []

        def cat_file(self, path, start=None, end=None, **kwargs):
            data = super().cat_file(path, start=start, end=end, **kwargs)
            if "/stats/" in path:
                self.got.append(len(data))
            return data

    return Counting(skip_instance_cache=True)


def test_one_tensor_reads_only_its_row_groups_remotely(tmp_path):
    local = tmp_path / "r"
    b = SyntheticRun(local, 100, steps_hint=120, dump_every=None, stats_flush_secs=0, graph=False)
    for a in range(0, 120, 20):   # six small parts, compacted into one at close
        b.write_steps(a, a + 20)
        b.sync()
    b.close()
    (part,) = (local / "stats").glob("*.parquet")
    meta = pq.ParquetFile(part).metadata
    assert meta.num_rows > 2 * MIN_GROUP_ROWS and INDEX_KEY in meta.metadata   # three row groups or more
    url = f"memory://tfi-index-{uuid.uuid4().hex[:8]}"
    fs = _counting_memory_fs()
    for f in local.rglob("*"):
        if f.is_file():
            fs.pipe_file(f"{url[len('memory://'):]}/{f.relative_to(local).as_posix()}", f.read_bytes())
    run = inspector.open_run(url, filesystem=fs)
    name = run.tensors.index[50]
    got = run.query_stats([name])
    pd.testing.assert_frame_equal(got, inspector.open_run(local).query_stats([name]))
    tensors = pq.ParquetFile(part).read(columns=["tensor"]).column("tensor").to_numpy(zero_copy_only=False)
    starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    # row groups end where a tensor's rows end: a tensor of fewer rows than a group is in one
    assert all(tensors[a - 1] != tensors[a] for a in starts[1:-1])
    rows = [i for i, t in enumerate(tensors) if t == name]
    held = {int(np.searchsorted(starts, r, "right")) - 1 for r in rows}
    assert len(held) == 1
    needed = sum(meta.row_group(g).total_byte_size for g in held)
    read = sum(fs.got)
    assert len(held) < meta.num_row_groups and read <= needed + 64 * 1024 + meta.serialized_size, (read, needed)
    unheld = [sum(meta.row_group(g).column(c).total_compressed_size for c in range(meta.num_columns))
              for g in range(meta.num_row_groups) if g not in held]
    assert read < part.stat().st_size - max(unheld) / 2, (read, part.stat().st_size, unheld)   # skipped a group
