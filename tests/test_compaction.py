"""Writer-side compaction of statistics parts (inspector.stats.parts): the same rows as a run
never compacted (the oracle), small parts gone, and no row counted twice or lost when a crash
leaves a compacted part beside the parts it replaced."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

import inspector
from inspector.stats import parts as stats_parts
from inspector.format import stats_name
from inspector.storage import open_storage
from inspector.testing import SyntheticRun
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

KEYS = ["step", "tensor", "kind", "group"]


def write(path, steps: int, compact_rows: int | None, storage_options: dict | None = None):
    """A synthetic run with one small part per step (stats_flush_secs=0); ``path``: local or a URL."""
    b = SyntheticRun(path, tensors=12, steps_hint=steps, dump_every=None, stats_flush_secs=0,
                     storage_options=storage_options)
    b.writer._compactor.rows = compact_rows
    b.write_steps(0, steps)
    b.close()
    return path


def table(run) -> pd.DataFrame:
    df = run.stats.sort_values(KEYS).reset_index(drop=True)
    df["hist_bucket"], df["hist_count"] = df["hist_bucket"].map(list), df["hist_count"].map(list)
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
    pd.testing.assert_frame_equal(got.assign(hist_bucket=got.hist_bucket.map(list), hist_count=got.hist_count.map(list)),
                                  want)
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path / "stats" / "chief.s0001.000001-000004.parquet")
    groups = stats_parts.row_groups_for(pf, [name])
    assert groups and len(groups) < pf.num_row_groups  # only this tensor's row groups are read


def test_leftovers_are_compacted_at_close(tmp_path, oracle):
    path = write(tmp_path / "run", 9, compact_rows=10 ** 9)
    assert parts(path) == ["chief.s0001.000001-000009.parquet"]
    pd.testing.assert_frame_equal(table(inspector.open_run(path)), oracle)


def test_many_small_parts_are_compacted_whatever_their_rows(tmp_path, oracle):
    """A small model's parts never reach compact_rows: their count bounds them, so a live session
    leaves at most max_parts small parts for a reader to open one by one."""
    path = write(tmp_path / "run", 9, compact_rows=None)   # 9 small parts, as a live session has them
    rows = len(oracle) // 9
    c = stats_parts.Compactor(path, "chief", 1, rows=10 ** 9, max_parts=4)
    for seq in range(1, 10):
        c.added(seq, rows)
        c.join()
    # 4 + 4 rolled up by their count alone (far under compact_rows), the last one waiting
    assert parts(path) == ["chief.s0001.000001-000004.parquet", "chief.s0001.000005-000008.parquet",
                           "chief.s0001.000009.parquet"]
    pd.testing.assert_frame_equal(table(inspector.open_run(path)), oracle)
    with pytest.raises(ValueError, match="max_parts=1 must be >= 2"):
        stats_parts.Compactor(path, "chief", 1, max_parts=1)


def test_every_statistics_file_has_dictionaries_only_for_repeating_columns(tmp_path, oracle):
    """Small parts, compacted parts and summaries: strings and integers dictionary-encoded,
    float statistics and histogram counts plain (a float's dictionary is given up after a page:
    time spent for a larger file)."""
    path = write(tmp_path / "run", 7, compact_rows=3 * (len(oracle) // 9))
    import pyarrow.parquet as pq
    files = sorted(path.rglob("*.parquet"))
    kinds = {"summary" if f.parent.name != "stats" else "compacted" if "-" in f.name else "small" for f in files}
    assert kinds == {"small", "compacted", "summary"}, [str(f.relative_to(path)) for f in files]
    for f in files:
        meta = pq.ParquetFile(f).metadata
        for c in (meta.row_group(0).column(i) for i in range(meta.num_columns)):
            repeats = c.physical_type not in ("FLOAT", "DOUBLE") and "." not in c.path_in_schema
            assert c.has_dictionary_page == repeats, (f.name, c.path_in_schema, c.physical_type)


def crash_after_rename(path, seqs: range, keep: set[int], monkeypatch) -> None:
    """Compact ``seqs`` (``path``: a local run or a Storage), then 'crash' before deleting the
    small parts in ``keep``."""
    store = open_storage(path)
    real = type(store).delete
    monkeypatch.setattr(type(store), "delete",
                        lambda self, rel: None if int(rel.rsplit("/", 1)[-1].split(".")[2]) in keep else real(self, rel))
    todo = [(s, stats_name("chief", 1, s)) for s in seqs]
    stats_parts.compact(store, "chief", 1, todo)
    monkeypatch.setattr(type(store), "delete", real)


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
    monkeypatch.setattr(stats_parts, "sorted_part", broken)
    path = write(tmp_path / "run", 9, compact_rows=1)
    assert len(parts(path)) == 9
    run = inspector.open_run(path)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert [(e["what"], "No space left" in e["reason"]) for e in run.manifest["errors"]] == [("compaction", True)]


def test_a_compaction_that_failed_on_a_full_disk_is_retried_at_the_next_flush(tmp_path, monkeypatch, oracle):
    real, full = stats_parts.sorted_part, [True]

    def disk(table):
        if full[0]:
            raise OSError(28, "No space left on device")
        return real(table)
    monkeypatch.setattr(stats_parts, "sorted_part", disk)
    b = SyntheticRun(tmp_path / "run", tensors=12, steps_hint=9, dump_every=None, stats_flush_secs=0)
    c = b.writer._compactor
    c.rows, c.max_parts = 10 ** 9, 3          # compact every 3 small parts
    b.write_steps(0, 3)
    b.sync()
    c.join()
    assert parts(tmp_path / "run") == [stats_name("chief", 1, k).split("/")[-1] for k in (1, 2, 3)]
    full[0] = False                            # space freed
    b.write_steps(3, 4)
    b.sync()
    c.join()
    # the next flush compacted the failed parts with its own
    assert parts(tmp_path / "run") == ["chief.s0001.000001-000004.parquet"]
    b.write_steps(4, 9)
    b.close()
    assert not [p for p in parts(tmp_path / "run") if "-" not in p]
    run = inspector.open_run(tmp_path / "run")
    # every row once (written in other chunks than the oracle's, so other values)
    pd.testing.assert_frame_equal(table(run)[KEYS], oracle[KEYS])
    assert [(e["what"], e["count"]) for e in run.manifest["errors"]] == [("compaction", 1)]


def test_failed_parts_are_retried_only_with_consecutive_ones(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(stats_parts, "compact",
                        lambda run_dir, w, s, parts, *a: calls.append([q for q, _ in parts]) or ("x", 0))
    c = stats_parts.Compactor(tmp_path, "chief", 1, rows=1, max_parts=2)
    c._failed = [(1, 1), (2, 1)]   # a compaction of 1-2 failed while one of 3-4 went through
    c.added(5, 1)
    c.added(6, 1)
    c.finish()
    assert all(seqs == list(range(seqs[0], seqs[0] + len(seqs))) for seqs in calls), calls
    assert sorted(q for seqs in calls for q in seqs) == [1, 2, 5, 6]


# ---- object stores: no rename; the compacted part is one object written whole ----------------
def _remote_parts(url: str, options: dict | None) -> list[str]:
    return sorted(e.name for e in open_storage(url, options).list("stats"))


@pytest.fixture(params=["memory", "s3"])
def remote(request):
    """(a fresh run URL, its storage options) on memory:// and on the moto S3 server."""
    import uuid
    if request.param == "memory":
        return f"memory://tfi-compact-{uuid.uuid4().hex[:8]}", None
    s3 = request.getfixturevalue("s3")
    return s3.url("compact"), s3.options


def test_compaction_on_an_object_store_reads_the_same_rows(remote, oracle):
    url, options = remote
    rows_per_step = len(oracle) // 9
    write(url, 9, compact_rows=4 * rows_per_step, storage_options=options)
    assert _remote_parts(url, options) == ["chief.s0001.000001-000004.parquet", "chief.s0001.000005-000008.parquet",
                                           "chief.s0001.000009.parquet"]
    run = inspector.open_run(url, storage_options=options)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == [] and run.manifest["errors"] == []


@pytest.mark.parametrize("keep", [{2}, {1, 2, 3, 4}])
def test_object_store_crash_between_write_and_delete_counts_no_row_twice(remote, monkeypatch, oracle, keep):
    url, options = remote
    write(url, 9, compact_rows=None, storage_options=options)
    crash_after_rename(open_storage(url, options), range(1, 5), keep, monkeypatch)
    names = _remote_parts(url, options)
    assert "chief.s0001.000001-000004.parquet" in names and all(
        f"chief.s0001.{s:06d}.parquet" in names for s in keep) and len(names) == 1 + len(keep) + 5
    run = inspector.open_run(url, storage_options=options)
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == []


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_reader_that_listed_before_a_compaction_reads_it_after(where, tmp_path, remote, oracle):
    """A reader lists the small parts, then a writer compacts them (and deletes them) before
    the reader reads: it finds them gone, lists again and reads the compacted part: the same
    rows, no problem reported (not a stale listing's gap)."""
    url, options = (tmp_path / "run", None) if where == "local" else remote
    write(url, 9, compact_rows=None, storage_options=options)
    run = inspector.open_run(url, storage_options=options)
    assert len(run._stats_files) == 9  # listed now
    stats_parts.compact(open_storage(url, options), "chief", 1, [(s, stats_name("chief", 1, s)) for s in range(1, 6)])
    pd.testing.assert_frame_equal(table(run), oracle)
    assert run.problems == [] and len(run._stats_files) == 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_groups_end_at_tensor_ends_and_the_index_names_them(seed, monkeypatch):
    """Groups end where a tensor's rows end once they hold the target (one tensor's query then
    reads few other tensors' rows), hold at most ROW_GROUP_ROWS, and the index names each
    tensor's groups exactly."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    monkeypatch.setattr(stats_parts, "ROW_GROUP_ROWS", 50)
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 3, 7, 20, 120], size=40)
    names = np.repeat([f"t{i:03d}" for i in range(len(sizes))], sizes)
    table = pa.table({"tensor": pa.array(names).dictionary_encode(), "x": np.arange(len(names))})
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema) as w:
        index, groups = stats_parts.write_groups(w, lambda a, b: table.slice(a, b - a), table.column("tensor"),
                                                 target=15, first_group=3)
    pf = pq.ParquetFile(pa.BufferReader(sink.getvalue()))
    assert pf.num_row_groups == groups
    held: dict[str, set[int]] = {}
    for g in range(groups):
        t = pf.read_row_group(g).column("tensor").to_pylist()
        assert len(t) <= 50
        for name in t:
            held.setdefault(name, set()).add(g + 3)
        ends_a_tensor = g == groups - 1 or pf.read_row_group(g + 1).column("tensor")[0].as_py() != t[-1]
        assert (ends_a_tensor and len(t) >= 15) or len(t) == 50 or g == groups - 1
        # a group that reached the target at a tensor's end ended there
        run_ends = np.flatnonzero(np.array(t[1:]) != np.array(t[:-1])) + 1
        assert all(e < 15 for e in run_ends)
    assert index == {n: [min(g), max(g)] for n, g in held.items()}
    assert all(max(g) - min(g) + 1 == len(g) for g in held.values())
