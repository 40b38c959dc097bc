"""Several trainings in one run directory, without TensorFlow: a session that starts a new
training at step 0 hides the sessions before it from merged views (inspector/sessions/trainings.py);
the errors, the sessions table and ``info`` say where the hidden data is."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import inspector
from inspector import cli
from inspector.format import manifest_name
from inspector.format.loghist import empty_rows
from inspector.sessions.trainings import view_note
from inspector.writer import RunWriter, StatsLayout

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = StatsLayout(("a:0",), ("forward",), ("all",))
CATALOG = [{"name": "a:0", "op": "a", "op_type": "Relu", "dtype": "float32", "shape": [None, 3], "scope": "",
            "has_gradient": False, "batched": True, "icnn_layer": None, "icnn_role": None}]


def session(path, steps, start, value, dumps=(), mode="train", keys=("forward/a:0",)) -> RunWriter:
    """One finished writer session that began at global step ``start`` (None: not recorded, as
    in older runs): statistics rows of mean ``value`` + step, dumps holding ``keys``."""
    w = RunWriter(path, manifest={"tensors": CATALOG, "is_chief": True, "start_step": start}, stats_layout=LAYOUT,
                  mode=mode, stats_flush_secs=1000)
    for i, s in enumerate(steps):
        vals = np.zeros((1, 9))
        vals[:, 0], vals[:, 1] = 4, value + s
        w.add_stats(s, vals, empty_rows(1), batch=i if mode != "train" else 0)
    for s in dumps:
        arrays = {k: np.full((2, 3), value, np.float32) for k in keys}
        w.add_dump(s, {**arrays, "samples/index": np.array([0, 1], np.int32)}, batch=None if mode == "train" else 0)
    w.close("finished")
    return w


def test_a_new_training_hides_the_sessions_before_it(tmp_path):
    """A second training written into the same run directory from step 0 (a fresh model):
    merged views show it alone (its steps 1..4 are not the first training's), not the first
    training's steps 5..10 after it; the first stays readable by number and is listed as hidden."""
    session(tmp_path, range(1, 11), 0, 100.0, dumps=(5, 10))
    session(tmp_path, [10], 10, 150.0, mode="eval")          # an evaluation of the first training
    session(tmp_path, range(1, 5), 0, 200.0, dumps=(2,))
    run = inspector.open_run(tmp_path)
    assert sorted(run.stats["step"]) == [1, 2, 3, 4] and set(run.stats["session"]) == {3}
    assert run.stats_steps().tolist() == [1, 2, 3, 4] and run.steps == [2]
    assert run.query_stats(mode="eval").empty                   # the first training's evaluation too
    assert sorted(run.query_stats(session=1)["step"]) == list(range(1, 11))
    assert set(run.query_stats(session="all")["session"]) == {1, 3}
    assert run.sessions["hidden_by"].tolist()[:2] == [3, 3] and run.sessions["hidden_by"].isna().tolist()[2]
    assert run.sessions["start_step"].tolist() == [0, 10, 0]
    text = cli.summary(run)
    assert "chief s1 train" in text and "hidden by the new training of s3 (--session 1 reads it)" in text
    # a dump only the hidden training has: the error says which session holds it
    with pytest.raises(inspector.NoDumpError, match=r"session 1 \(hidden: an earlier training.*pass session=1"):
        run.tensor("a:0", 10)
    np.testing.assert_array_equal(run.tensor("a:0", 10, session=1), np.full((2, 3), 100.0, np.float32))


def test_a_resume_continues_the_training(tmp_path):
    """A session that starts past step 0 (a resume from a checkpoint at step 5) continues the
    training: the later session wins the steps both recorded, nothing is hidden."""
    session(tmp_path, range(1, 11), 0, 100.0)
    session(tmp_path, range(6, 16), 5, 200.0)
    run = inspector.open_run(tmp_path)
    stats = run.stats.set_index("step").sort_index()
    assert list(stats.index) == list(range(1, 16))
    assert stats.loc[3, "mean"] == 103.0 and stats.loc[8, "mean"] == 208.0
    assert run.sessions["hidden_by"].isna().all()


def test_sessions_without_a_start_step_merge_as_before(tmp_path):
    """Older runs (and Keras fits) do not record where a session began: nothing is hidden."""
    session(tmp_path, range(1, 11), None, 100.0)
    session(tmp_path, range(1, 5), None, 200.0)
    run = inspector.open_run(tmp_path)
    assert sorted(run.stats["step"]) == list(range(1, 11)) and run.sessions["hidden_by"].isna().all()


def test_a_missing_tensor_names_the_session_whose_dump_holds_it(tmp_path):
    """A resume that dumps step 10 again without ``a:0`` (another include=): the merged view's
    dump of step 10 is the later one; the error names the session whose dump holds the tensor."""
    session(tmp_path, range(1, 11), 0, 100.0, dumps=(10,))
    session(tmp_path, range(6, 11), 5, 200.0, dumps=(10,), keys=("forward/b:0",))
    run = inspector.open_run(tmp_path)
    with pytest.raises(inspector.NoDumpError, match=r"step 10 \(session 2\) holds no forward of 'a:0'; the dump of "
                                                    r"that step by session 1 holds it: pass session=1"):
        run.tensor("a:0", 10)


def test_a_crashed_sessions_steps_count_its_statistics_on_disk(tmp_path):
    """A process killed between heartbeats: its manifest's steps lag (here: none, or only the
    dumps' 5..60) while its statistics on disk run 1..55. The session line counts them."""
    w = session(tmp_path, range(1, 56), 0, 0.0, dumps=(5, 60))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / manifest_name("chief", w.session)
    m = json.loads(path.read_text())
    for steps in (None, [5, 60]):
        path.write_text(json.dumps({**m, "status": "running", "pid": dead.pid, "steps": steps}))
        run = inspector.open_run(tmp_path)
        row = run.sessions.iloc[0]
        assert row["state"] == "crashed" and (row["first_step"], row["last_step"]) == (1, 60)
        assert "steps 1..60" in cli.summary(run)


def test_the_viewer_says_which_session_each_step_of_a_curve_is_from(tmp_path, monkeypatch):
    """A resumed training's curves join two sessions, and a new training hides the earlier:
    the sidebar's note (inspector.sessions.trainings.view_note) says which session each step is from
    and where the hidden training is read."""
    session(tmp_path / "resumed", range(1, 11), 0, 100.0)
    session(tmp_path / "resumed", range(6, 16), 5, 200.0)
    run = inspector.open_run(tmp_path / "resumed")
    note = view_note(run.sessions, "train", "chief")
    assert note == "Curves join sessions s1 (steps 1..10), s2 (steps 6..15, resumed at step 5: wins steps 6..10)."
    session(tmp_path / "resumed", range(1, 4), 0, 300.0)
    hidden = view_note(inspector.open_run(tmp_path / "resumed").sessions, "train", "chief")
    assert hidden.startswith("Hidden: s1 (steps 1..10), s2 (steps 6..15), an earlier training: session 3 began a new "
                             "one at step 0. Read it with run.query_stats(session=N)")
    session(tmp_path / "single", range(1, 4), 0, 1.0)
    assert view_note(inspector.open_run(tmp_path / "single").sessions, "train", "chief") is None
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("TF_INSPECTOR_RUNS", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["run"] = "resumed"
    at.run()
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in at.sidebar.caption]   # plain text: Markdown escaped
    assert not at.exception and hidden in shown
