"""``export --tensorboard`` stays inside ``--logdir`` and writes only rows a writer writes:
symlinks below it and unsafe group names are refused, histogram rows no writer writes are
left out (the reader clears them for the viewer too), and a damaged part is named with a
non-zero exit (``--follow`` says it once and goes on)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import inspector
from inspector.errors import InspectorError
from inspector.export import tensorboard as tb_export
from inspector.format import check_group_name, stats_name
from inspector.stats.histograms import invalid_rows
from inspector.testing import make_synthetic_run

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'tf-inspector[tensorboard]'")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inspector", *args], env=ENV, capture_output=True,
                          text=True, timeout=300)


def _rewrite(path: Path, change) -> None:
    """Rewrite the run's one statistics part through ``change(table) -> table``."""
    part = path / stats_name("chief", 1, 1)
    table = change(pq.read_table(part).replace_schema_metadata(None))
    pq.write_table(table, part)


def _set_list(table: pa.Table, name: str, row: int, value: list) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row] = value
    return table.set_column(table.schema.get_field_index(name), name,
                            pa.array(values, table.schema.field(name).type))


def _events(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("events.out.tfevents.*"))


@pytest.fixture
def run_path(tmp_path):
    return make_synthetic_run(tmp_path / "runs" / "exp", steps=4, tensors=8, dump_every=None, icnn=False)


# ---- confinement ---------------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["exp", "exp/all", "exp/positive/train"])
def test_a_symlink_anywhere_below_the_logdir_is_refused(tmp_path, run_path, link):
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    outside.mkdir()
    (logs / link).parent.mkdir(parents=True, exist_ok=True)
    (logs / link).symlink_to(outside, target_is_directory=True)
    with pytest.raises(InspectorError, match="is a symlink"):
        ex = tb_export.Exporter(lambda: inspector.open_run(run_path), logs)
        ex.poll()
    assert not list(outside.rglob("*")), "nothing is written through the link"


def test_a_group_named_dot_dot_is_left_out_and_reported(tmp_path, run_path):
    def rename(t: pa.Table) -> pa.Table:
        g = t.column("group").combine_chunks()
        names = [".." if v == "positive" else v for v in g.dictionary.to_pylist()]
        return t.set_column(t.schema.get_field_index("group"), "group",
                            pa.DictionaryArray.from_arrays(g.indices, pa.array(names)))
    _rewrite(run_path, rename)
    logs = tmp_path / "tb" / "logs"
    out = _cli("export", "--tensorboard", str(run_path), "--logdir", str(logs))
    assert out.returncode == 1, out.stderr
    assert "the sample group '..' cannot name a folder" in out.stderr
    assert {p.relative_to(tmp_path).parts[:4] for p in _events(tmp_path)} == \
        {("tb", "logs", "exp", "all"), ("tb", "logs", "exp", "negative")}


@pytest.mark.parametrize("name", [".", ".."])
def test_the_hook_refuses_dot_groups_at_configuration(name):
    with pytest.raises(ValueError, match=f"group name '{name}'"):
        check_group_name(name)


# ---- histogram rows ------------------------------------------------------------------------------
BAD = {"out of range": ("hist_bucket", [-3000, 5], "a bucket outside"),
       "descending": ("hist_bucket", [1010, 1000], "buckets not ascending"),
       "negative count": ("hist_count", [-5, 3], "a negative count")}


@pytest.mark.parametrize("case", list(BAD))
def test_invalid_histogram_rows_are_found(case):
    column, value, why = BAD[case]
    good = {"hist_bucket": [[0, 1000], [3, 7]], "hist_count": [[1, 2], [4, 4]]}
    good[column] = [good[column][0], value]
    t = pa.table({"hist_bucket": pa.array(good["hist_bucket"], pa.list_(pa.int16())),
                  "hist_count": pa.array(good["hist_count"], pa.list_(pa.int32()))})
    bad, reasons = invalid_rows(t)
    assert bad.tolist() == [False, True] and why in reasons[0]
    assert invalid_rows(t.slice(1))[0].tolist() == [True]      # a slice's own rows
    assert invalid_rows(pa.concat_tables([t, t]))[0].tolist() == [False, True, False, True]


def test_invalid_equal_width_histograms_are_found():
    hist = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, -1, 0, 0, 5, 5, 5], pa.int32()), 3)
    t = pa.table({"hist_lo": [0.0, 0.0, 2.0], "hist_hi": [1.0, 1.0, 1.0], "histogram": hist})
    bad, reasons = invalid_rows(t)
    assert bad.tolist() == [False, True, True]
    assert reasons == ["a negative count", "hist_lo above hist_hi"]
    sliced, _ = invalid_rows(t.slice(1))
    assert sliced.tolist() == [True, True]


def test_bad_histogram_rows_are_skipped_and_reported_by_export_and_reader(tmp_path, run_path):
    rows = {}

    def damage(t: pa.Table) -> pa.Table:
        for i, (column, value, _) in enumerate(BAD.values()):
            r = 7 * i + 1
            other = "hist_count" if column == "hist_bucket" else "hist_bucket"
            t = _set_list(_set_list(t, column, r, value), other, r, [1, 1] if other == "hist_count" else [0, 1000])
            rows[r] = (t.column("tensor")[r].as_py(), t.column("kind")[r].as_py(), t.column("group")[r].as_py(),
                       t.column("step")[r].as_py())
        return t
    _rewrite(run_path, damage)
    run = inspector.open_run(run_path)
    for tensor, kind, group, step in rows.values():   # what the viewer draws: nothing
        assert len(run.log_histogram(tensor, step, kind, group).count) == 0
    assert sum("1 statistics row(s) hold a histogram no writer writes" in p for p in run.problems) == 3
    whole = inspector.open_run(run_path)
    whole.stats
    assert any("3 statistics row(s) hold a histogram no writer writes" in p for p in whole.problems), whole.problems
    logs = tmp_path / "logs"
    out = _cli("export", "--tensorboard", str(run_path), "--logdir", str(logs), "--histogram-every", "1")
    assert out.returncode == 1 and "histogram no writer writes" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    from test_tensorboard_export import read_back
    _, hists = read_back(logs)
    for tensor, kind, group, step in rows.values():
        got = hists.get(f"{group}/train", {}).get(f"{kind}/{tensor}", {})
        assert step not in got, (tensor, kind, group, step)
    # the good rows of the same tensors are there
    assert sum(len(steps) for tags in hists.values() for steps in tags.values()) > 0


# ---- damaged parts -------------------------------------------------------------------------------
def _second_part_damaged(path: Path) -> Path:
    first = path / stats_name("chief", 1, 1)
    t = pq.read_table(first)
    t = t.set_column(t.schema.get_field_index("step"), "step", pc.add(t.column("step"), 100))
    second = path / stats_name("chief", 1, 2)
    pq.write_table(t, second)
    second.write_bytes(second.read_bytes()[: second.stat().st_size // 2])
    return second


def test_a_damaged_part_is_named_with_a_non_zero_exit(tmp_path, run_path):
    second = _second_part_damaged(run_path)
    out = _cli("export", "--tensorboard", str(run_path), "--logdir", str(tmp_path / "logs"))
    assert out.returncode == 1 and second.name in out.stderr, out.stderr
    assert out.stderr.startswith("error: wrote 4 steps")


def test_follow_names_a_damaged_part_once_and_goes_on(tmp_path):
    path = make_synthetic_run(tmp_path / "runs" / "live", steps=4, tensors=8, dump_every=None,
                              icnn=False, finish=False)
    second = _second_part_damaged(path)
    polls, stop, lines = [], threading.Event(), []

    def open_run():
        polls.append(1)
        if len(polls) >= 4:
            stop.set()
        return inspector.open_run(path)
    ex = tb_export.Exporter(open_run, tmp_path / "logs")
    tb_export.follow(ex, 0.01, log=lines.append, stop=stop)
    ex.close()
    named = [line for line in lines if second.name in line]
    assert len(polls) >= 4 and len(named) == 1 and named[0].startswith("left out: "), lines
    assert ex.steps == 4 and ex.problems
