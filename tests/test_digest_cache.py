"""Digests of small statistics parts cached on local disk (inspector/stats/digest_cache.py): a
second reader of a run of many uncompacted parts reads none of them for its step lists, a
step-bounded query skips the parts a digest puts outside, and the run directory is not written."""
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import inspector
from inspector import cli
from inspector.format import manifest_name, stats_name
from inspector.stats import query
from inspector.stats.parts import parquet_options
from inspector.storage.atomic import write_json
from inspector.testing import make_synthetic_run

PARTS = 12


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TF_INSPECTOR_CACHE", str(d))
    return d


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The parts the reader opens (every statistics read goes through query.read_part)."""
    seen: list[str] = []
    real = query.read_part

    def counting(path, *a, **k):
        seen.append(Path(path).name)
        return real(path, *a, **k)
    monkeypatch.setattr(query, "read_part", counting)
    return seen


def small_parts_run(path: Path, parts: int = PARTS) -> Path:
    """A session of ``parts`` uncompacted one-step parts (steps 0..parts-1), as a writer that
    never compacted leaves them."""
    make_synthetic_run(path, steps=1, tensors=3, dump_every=None, icnn=False, dead_relu=False)
    table = pq.read_table(path / stats_name("chief", 1, 1))
    col = table.schema.get_field_index("step")
    for k in range(2, parts + 1):
        t = table.set_column(col, "step", pa.array(np.full(table.num_rows, k - 1, np.int64)))
        pq.write_table(t, path / stats_name("chief", 1, k), **parquet_options(t.schema))
    m = json.loads((path / manifest_name("chief", 1)).read_text())
    m.update(stats_parts=parts, steps=[0, parts - 1])
    write_json(path / manifest_name("chief", 1), m)
    return path


def name(seq: int) -> str:
    """The file name of the session's part ``seq`` (of step seq - 1)."""
    return Path(stats_name("chief", 1, seq)).name


def tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


def test_a_second_reader_reads_no_part_for_its_step_lists(tmp_path, cache, reads):
    run_dir = small_parts_run(tmp_path / "run")
    before = tree(run_dir)
    first = inspector.open_run(run_dir).stats_steps()
    assert len(reads) == PARTS
    reads.clear()
    second = inspector.open_run(run_dir).stats_steps()
    assert reads == []
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(second, np.arange(PARTS))
    assert tree(run_dir) == before   # the cache lives outside the run
    files = list((cache / "digests").iterdir())
    assert len(files) == 1 and files[0].stat().st_mode & 0o077 == 0


def test_a_replaced_part_is_read_again(tmp_path, cache, reads):
    run_dir = small_parts_run(tmp_path / "run")
    inspector.open_run(run_dir).stats_steps()
    part = run_dir / stats_name("chief", 1, 3)
    t = pq.read_table(part)
    t = t.set_column(t.schema.get_field_index("step"), "step",
                     pa.array(np.full(t.num_rows, 500, np.int64)))
    pq.write_table(t, part, **parquet_options(t.schema))
    os.utime(part, ns=(1, 1))   # a new stamp whatever the clock's resolution
    reads.clear()
    steps = inspector.open_run(run_dir).stats_steps()
    assert reads == [part.name]
    assert 500 in steps and 2 not in steps


def test_a_step_query_skips_parts_its_digest_puts_outside(tmp_path, cache, reads):
    run_dir = small_parts_run(tmp_path / "run")
    inspector.open_run(run_dir).stats_steps()
    run = inspector.open_run(run_dir)
    reads.clear()
    df = run.query_stats(at_steps=[4], kinds=["forward"], columns=["mean"])
    assert reads == [name(5)]
    assert set(df["step"]) == {4}
    whole = inspector.open_run(run_dir).stats
    assert len(df) == len(whole[(whole["step"] == 4) & (whole["kind"] == "forward")])


def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path, cache, reads):
    run_dir = small_parts_run(tmp_path / "run")
    inspector.open_run(run_dir).stats_steps()
    [f] = (cache / "digests").iterdir()
    data = json.loads(f.read_text())
    name = next(iter(data["parts"]))
    data["parts"][name][4] = [[0, 10 ** 15, 1]]   # a span no part holds
    data["parts"][name][3] = "not runs"
    f.write_text(json.dumps(data))
    reads.clear()
    np.testing.assert_array_equal(inspector.open_run(run_dir).stats_steps(), np.arange(PARTS))
    assert reads == [Path(name).name]
    f.write_text("{not json")
    reads.clear()
    np.testing.assert_array_equal(inspector.open_run(run_dir).stats_steps(), np.arange(PARTS))
    assert len(reads) == PARTS


def test_a_second_info_reads_only_the_parts_its_diagnosis_needs(tmp_path, cache, reads):
    from inspector.analysis.alerts import Thresholds
    parts = Thresholds().window + 20
    run_dir = small_parts_run(tmp_path / "run", parts)
    first = cli.summary(cli._open_checked(str(run_dir)))
    reads.clear()
    second = cli.summary(cli._open_checked(str(run_dir)))
    assert second == first
    # the diagnosis reads its window's last steps and the first step, each from the part that
    # holds it (one step a part): not the steps between
    window = {name(k + 1) for k in range(parts - Thresholds().window, parts)}
    assert reads and set(reads) <= window | {name(1)}


def test_many_small_parts_digests_are_read_in_threads(tmp_path, cache, monkeypatch):
    import threading
    run_dir = small_parts_run(tmp_path / "run")
    monkeypatch.setattr(query, "PREFETCH_FROM", 2)
    threads: list[tuple[str, int]] = []
    real = query.read_part
    # each thread's first read waits for the other's, so the pool cannot finish the first
    # task before the second is handed out and give both to one thread
    both = threading.Barrier(2, timeout=60)

    def recording(path, *a, **k):
        if threading.get_ident() not in {t for _, t in threads}:
            both.wait()
        threads.append((Path(path).name, threading.get_ident()))
        return real(path, *a, **k)
    monkeypatch.setattr(query, "read_part", recording)
    np.testing.assert_array_equal(inspector.open_run(run_dir).stats_steps(), np.arange(PARTS))
    assert sorted(n for n, _ in threads) == sorted(name(k) for k in range(1, PARTS + 1))
    ids = {t for _, t in threads}
    assert threading.get_ident() not in ids and len(ids) > 1


def test_a_damaged_part_among_prefetched_ones_is_named_once(tmp_path, cache, monkeypatch):
    run_dir = small_parts_run(tmp_path / "run")
    (run_dir / stats_name("chief", 1, 4)).write_bytes(b"PAR1 not a part PAR1")
    monkeypatch.setattr(query, "PREFETCH_FROM", 2)
    run = inspector.open_run(run_dir)
    np.testing.assert_array_equal(run.stats_steps(), [k for k in range(PARTS) if k != 3])
    assert len([m for m in run.problems if name(4) in m]) == 1


def _rewrite(part: Path, change) -> None:
    """Write ``change(part's table)`` in place of ``part``."""
    t = change(pq.read_table(part))
    pq.write_table(t, part, **parquet_options(t.schema))


def _retyped(t: pa.Table, column: str, type_: pa.DataType) -> pa.Table:
    return t.set_column(t.schema.get_field_index(column), column, t.column(column).cast(type_))


def _relabelled(t: pa.Table) -> pa.Table:
    """``kind`` holding a value no writer writes (dictionary_encode keeps the writer's type)."""
    kinds = pa.array([f"{v}x" for v in t.column("kind").to_pylist()]).dictionary_encode()
    return t.set_column(t.schema.get_field_index("kind"), "kind", kinds)


def test_info_names_every_damaged_small_part_among_sound_ones_of_one_schema(tmp_path, cache,
                                                                          monkeypatch):
    """Parts damaged in the ways each check catches, read after sound parts of the writer's
    schema (a schema or value verdict reused for them would let them through), first and
    with the digests cached."""
    run_dir = small_parts_run(tmp_path / "run")
    damaged = {4: lambda p: p.write_bytes(b"PAR1 not a part PAR1"),
               5: lambda p: _rewrite(p, lambda t: _retyped(t, "nan", pa.int32())),
               6: lambda p: _rewrite(p, _relabelled),
               7: lambda p: p.write_bytes(p.read_bytes()[:-100] + p.read_bytes()[-8:]),
               8: lambda p: _rewrite(p, lambda t: t.drop_columns(["group"]))}
    for seq, damage in damaged.items():
        damage(run_dir / stats_name("chief", 1, seq))
    monkeypatch.setattr(query, "PREFETCH_FROM", 2)
    sound = [k for k in range(PARTS) if k + 1 not in damaged]
    for _ in range(2):
        run = cli._open_checked(str(run_dir))
        text = cli.summary(run, all_problems=True)
        np.testing.assert_array_equal(run.stats_steps(), sound)
        assert f"statistics {len(sound)} steps" in text
        for seq in damaged:
            assert len([m for m in run.problems if name(seq) in m]) == 1, seq
            assert name(seq) in text


def test_a_cached_digest_is_decoded_once_per_reader(tmp_path, cache, monkeypatch):
    from inspector.stats import digest_cache
    run_dir = small_parts_run(tmp_path / "run")
    monkeypatch.setattr(query, "PREFETCH_FROM", 2)
    inspector.open_run(run_dir).stats_steps()
    decoded: list[int] = []
    real = digest_cache._decode

    def counting(e):
        decoded.append(1)
        return real(e)
    monkeypatch.setattr(digest_cache, "_decode", counting)
    run = inspector.open_run(run_dir)
    for _ in range(2):
        np.testing.assert_array_equal(run.stats_steps(), np.arange(PARTS))
    assert len(decoded) == PARTS
