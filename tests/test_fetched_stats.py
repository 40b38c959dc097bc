"""``RunWriter.add_fetched_stats``: a step's statistics as the graph returned them (parts,
a subset of the layout's rows), joined and checked on the writer thread: the rows read back are
those ``add_stats`` writes for the joined arrays, and a step that does not fit is recorded, not
raised."""
from __future__ import annotations

import queue
import threading

import numpy as np

import inspector
from inspector.format.loghist import sparse_of
from inspector.writer import RunWriter, StatsLayout

LAYOUT = StatsLayout(("a:0", "a:0", "b:0", "w"), ("forward", "gradient", "forward", "update"),
                     ("all",) * 4)


def _part(rng, rows: int):
    values = rng.normal(size=(rows, 9))
    values[:, 0], values[:, 7:] = 5, 0   # five values each, no NaN/Inf
    return (values, *sparse_of([rng.normal(size=5) for _ in range(rows)]))


def _read(path):
    st = inspector.open_run(path).stats.sort_values(["step", "tensor", "kind"])
    return st.reset_index(drop=True)


def test_parts_read_back_as_the_joined_rows(tmp_path):
    rng = np.random.default_rng(0)
    parts = [_part(rng, 3), _part(rng, 1)]
    fetched = RunWriter(tmp_path / "f", manifest={"tensors": []}, stats_layout=LAYOUT)
    fetched.add_fetched_stats(1, parts)
    fetched.close()
    joined = RunWriter(tmp_path / "j", manifest={"tensors": []}, stats_layout=LAYOUT)
    values = np.concatenate([parts[0][0], parts[1][0]])
    splits = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(p[1]) for p in parts]))])
    hist = (splits, np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]))
    joined.add_stats(1, values, hist)
    joined.close()
    a, b = _read(tmp_path / "f"), _read(tmp_path / "j")
    assert len(a) == 4 and a.drop(columns=["session"]).equals(b.drop(columns=["session"]))


def test_a_subset_of_rows_lands_on_those_rows(tmp_path):
    rng = np.random.default_rng(1)
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, stats_layout=LAYOUT)
    part = _part(rng, 2)
    w.add_fetched_stats(3, [part], rows=np.array([1, 2]))
    w.add_fetched_stats(4, [part], rows=np.array([1, 2]), keep=np.array([False, True]))
    w.close()
    st = _read(tmp_path / "r")
    assert list(zip(st.step, st.tensor, st.kind)) == [(3, "a:0", "gradient"), (3, "b:0", "forward"),
                                                      (4, "b:0", "forward")]
    np.testing.assert_allclose(st["mean"], [part[0][0, 1], part[0][1, 1], part[0][1, 1]])


def test_a_step_that_does_not_fit_is_recorded_and_later_steps_written(tmp_path):
    rng = np.random.default_rng(2)
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, stats_layout=LAYOUT)
    w.add_fetched_stats(1, [_part(rng, 3)])          # one row short: not raised here
    w.add_fetched_stats(2, [_part(rng, 3), _part(rng, 1)])
    w.close()
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.stats["step"].unique()) == [2]
    errors = run.manifest["errors"]
    assert [(e["what"], e["first_step"]) for e in errors] == [("stats", 1)]
    assert "shape" in errors[0]["reason"] and "(3, 9)" in errors[0]["reason"]


def test_flush_stats_writes_the_queued_steps_before_close(tmp_path):
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, stats_layout=LAYOUT,
                  stats_flush_secs=3600)
    w.add_fetched_stats(1, [_part(np.random.default_rng(0), 4)])
    assert w.flush_stats(30)
    assert len(list((tmp_path / "r" / "stats").glob("*.parquet"))) == 1
    w.close()
    assert not w.flush_stats(1)   # closed: nothing to wait for


def test_flush_stats_does_not_wait_for_a_writer_thread_that_has_ended(tmp_path, monkeypatch):
    """No thread left to write the part: flush_stats returns False instead of waiting forever."""
    w = RunWriter(tmp_path / "r", manifest={"tensors": []}, stats_layout=LAYOUT, stats_flush_secs=3600)
    try:
        ended = threading.Thread(target=lambda: None)
        ended.start()
        ended.join()
        monkeypatch.setattr(w, "_thread", ended)      # as if the writer's loop had exited:
        monkeypatch.setattr(w, "_queue", queue.Queue())   # nobody reads what is put
        assert w.flush_stats() is False
    finally:
        monkeypatch.undo()
        w.close()
