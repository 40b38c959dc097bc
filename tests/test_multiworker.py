"""Several workers and asynchronous steps (issue 9): a real localhost cluster.

One ps, one chief, one worker and one evaluator run ``tf.estimator.train_and_evaluate`` as
separate processes (tests/multiworker_task.py), each with its own TF_CONFIG, training
asynchronously (between-graph replication) with a DumpHook writing to one shared run
directory. The tests then read that directory as a user would: the reader, the CLI.
A cluster worker is named ``<task type>-<index>`` (FORMAT.md): ``chief-0``, ``worker-0``,
``evaluator-0``; the ps writes nothing.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector import cli  # noqa: E402
from tfmodels import build_cnn  # noqa: E402

v1 = tf.compat.v1
ROOT = Path(__file__).resolve().parent.parent
HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(getattr(tf, "estimator", None), "Estimator")
STATS_EVERY, DUMP_EVERY, MAX_STEPS = 5, 10, 60
TASK_TIMEOUT = 240  # seconds for the whole cluster; it takes 40-70 s on 2 busy cores


class _Jump(v1.train.SessionRunHook):
    """After run ``at`` (1-based), move the global step by ``by`` more, before the hooks listed
    after this one look at it: what other workers do during one of this worker's runs."""

    def __init__(self, global_step, at: int, by: int) -> None:
        self.op, self.at, self.runs = v1.assign_add(global_step, by), at, 0

    def after_run(self, run_context, run_values) -> None:
        self.runs += 1
        if self.runs == self.at:
            run_context.session.run(self.op)


def test_a_row_stands_for_every_multiple_up_to_its_step(tmp_path, monkeypatch):
    """Run 15 fires statistics; during it the global step moves past 20 (to 21): the row says 21
    and stands for 15 and 20, so the next row is at 25, not at 22 (two rows between 20 and 25).
    Dumps have their own schedule: 20 was crossed without a dump, so the next run dumps. Other
    workers move the step only in a cluster: TF_CONFIG says there is one (a worker alone reads
    the step in its own run, hooks.variables.SameRun)."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=STATS_EVERY, dump_every_n_steps=DUMP_EVERY,
                        strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[_Jump(m.global_step, 15, 6), hook], save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for step in range(1, 25):
                sess.run(m.train_op, m.feed(step))
    run = inspector.open_run(tmp_path / "run")
    assert sorted(run.stats["step"].unique()) == [5, 10, 21, 25, 30]
    assert run.steps == [10, 22, 30]


# ---- the cluster ----------------------------------------------------------------------------
TRAINERS = ("chief-0", "worker-0")


class Cluster:
    def __init__(self, base: Path) -> None:
        self.base, self.run_dir, self.model_dir = base, base / "run", base / "model"
        self.logs = {kind: base / f"{kind}.log" for kind in ("ps", "chief", "worker", "evaluator")}
        self.ps_served_to_the_end = False
        self.seconds = 0.0

    def log(self, kind: str) -> str:
        return self.logs[kind].read_text(errors="replace")

    def tails(self, n: int = 3000) -> str:
        return "\n".join(f"---- {kind} (last {n} characters) ----\n{self.log(kind)[-n:]}" for kind in self.logs)

    def start_step(self, worker: str) -> int:
        """The global step a trainer's hook session started from (its log says it)."""
        kind = worker.split("-")[0]
        m = re.search(rf"worker {worker} \(mode train\) from global step (\d+)", self.log(kind))
        assert m, self.tails()
        return int(m.group(1))


def _free_ports(n: int) -> list[int]:
    """n distinct free localhost ports (all bound at once, then released for the servers)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    """ps + chief + worker + evaluator, as processes with their TF_CONFIG; 40-70 s. The ps never
    returns (it serves until killed): it is killed once the others are done."""
    if not HAS_ESTIMATOR:
        pytest.skip("this TensorFlow has no tf.estimator (2.16+)")
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    ps, chief, worker = (f"localhost:{p}" for p in _free_ports(3))
    spec = {"ps": [ps], "chief": [chief], "worker": [worker]}
    procs: dict[str, subprocess.Popen] = {}
    start, failed = time.monotonic(), None
    try:
        for kind in c.logs:
            env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": kind, "index": 0}}),
                   "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"}
            with open(c.logs[kind], "wb") as out:
                procs[kind] = subprocess.Popen(
                    [sys.executable, str(ROOT / "tests" / "multiworker_task.py"), str(c.run_dir), str(c.model_dir),
                     str(MAX_STEPS)], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        others = [k for k in procs if k != "ps"]
        while failed is None and any(procs[k].poll() is None for k in others):
            bad = [f"{k} exited with {procs[k].returncode}" for k in procs if procs[k].poll() not in (None, 0)]
            if bad:
                failed = "; ".join(bad)
            elif time.monotonic() - start > TASK_TIMEOUT:
                failed = f"timed out after {TASK_TIMEOUT} s: " + ", ".join(k for k in others if procs[k].poll() is None)
            time.sleep(0.2)
        if failed is None and any(procs[k].returncode for k in others):
            failed = "; ".join(f"{k} exited with {procs[k].returncode}" for k in others if procs[k].returncode)
        c.ps_served_to_the_end = procs["ps"].poll() is None
        c.seconds = time.monotonic() - start
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    if failed:
        pytest.fail(f"the localhost cluster failed: {failed}\n{c.tails()}", pytrace=False)
    print(f"cluster trained and evaluated in {c.seconds:.0f} s")
    return c


def test_each_trainer_wrote_one_finished_session_and_the_ps_nothing(cluster):
    run = inspector.open_run(cluster.run_dir)
    assert run.workers == ["chief-0", "evaluator-0", "worker-0"] and run.default_worker == "chief-0", run.sessions
    assert run.status == "finished" and set(run.sessions["state"]) == {"finished"}, run.sessions
    train = run.sessions[run.sessions["mode"] == "train"]
    assert sorted(train["worker"]) == list(TRAINERS) and list(train["session"]) == [1, 1]
    assert cluster.ps_served_to_the_end                           # killed by us, never a writer
    assert not [p for p in cluster.run_dir.rglob("*") if "ps-" in p.name]
    assert not [p for p in cluster.run_dir.rglob("*") if p.name.startswith(".") or p.name.startswith("lock.")]
    for (w, s), m in run.manifests.items():
        assert m["is_chief"] == (w == "chief-0") and m["worker"] == w


def test_the_evaluator_writes_eval_sessions_and_is_the_default_for_eval(cluster):
    """Every evaluation is an eval session of evaluator-0 (the chief evaluates nothing in a
    cluster), so mode='eval' reads the evaluator without worker=."""
    run = inspector.open_run(cluster.run_dir)
    ev = run.sessions[run.sessions["worker"] == "evaluator-0"]
    assert len(ev) >= 1 and set(ev["mode"]) == {"eval"} and list(ev["session"]) == list(range(1, len(ev) + 1))
    assert ev["last_step"].max() >= MAX_STEPS                     # the final checkpoint, which ends the evaluator
    rows = run.query_stats(mode="eval")
    assert set(rows["worker"]) == {"evaluator-0"} and set(rows["mode"]) == {"eval"}
    assert set(zip(rows["step"], rows["batch"])) == {(s, b) for s in ev["first_step"] for b in (0, 1)}
    assert not rows.duplicated(["step", "batch", "tensor", "kind", "group"]).any()
    assert run.dump_steps(mode="eval") == sorted(ev["first_step"])
    assert set(run.samples(int(ev["first_step"].max()), mode="eval")["worker"]) == {"evaluator-0"}
    assert run.query_stats(mode="eval", worker="chief-0").empty


def test_the_chief_is_the_default_and_all_gives_every_worker(cluster):
    run = inspector.open_run(cluster.run_dir)
    key = ["step", "batch", "tensor", "kind", "group"]
    assert set(run.stats["worker"]) == {"chief-0"} and not run.stats.duplicated(key).any()
    both = run.query_stats(worker="all")
    assert set(both["worker"]) == set(TRAINERS) and not both.duplicated(["worker", *key]).any()
    assert len(both) == len(run.stats) + len(run.query_stats(worker="worker-0"))
    assert set(run.query_stats(worker="all", mode="all")["worker"]) == {*TRAINERS, "evaluator-0"}
    # dumps: the chief's by default; the worker's with worker=, and samples say whose they are
    mine = run.dump_steps(worker="worker-0")
    assert run.steps == run.dump_steps(worker="chief-0") and run.steps and mine
    only_worker = sorted(set(mine) - set(run.steps))
    assert only_worker, (run.steps, mine)
    step = only_worker[0]
    with pytest.raises(inspector.NoDumpError, match=r"workers \['worker-0'\] dumped it: pass worker="):
        run.samples(step)
    samples = run.samples(step, worker="worker-0")
    assert set(samples["worker"]) == {"worker-0"} and set(samples["session"]) == {1}
    assert len(run.tensor("conv1/relu:0", step, "gradient", worker="worker-0")) == len(samples)


def test_a_histogram_of_all_workers_must_name_one(cluster):
    """With worker='all' a step one trainer recorded answers; a step both recorded (it happens
    when both read the same global step after their runs; not every run has one) is refused."""
    run = inspector.open_run(cluster.run_dir)
    steps = {w: set(run.query_stats(worker=w, columns=[])["step"]) for w in TRAINERS}
    alone = sorted(steps["chief-0"] - steps["worker-0"])[0]
    edges, counts = run.histogram("conv1/relu:0", alone, worker="all")
    np.testing.assert_array_equal(counts, run.histogram("conv1/relu:0", alone)[1])
    both = sorted(steps["chief-0"] & steps["worker-0"])
    print(f"steps both trainers recorded: {both}")
    for step in both:
        with pytest.raises(inspector.InspectorError, match="several writers.*pass worker="):
            run.histogram("conv1/relu:0", step, worker="all")
        for w in TRAINERS:
            assert run.histogram("conv1/relu:0", step, worker=w)[1].sum() > 0


def test_the_schedule_under_asynchronous_global_steps(cluster):
    """Each trainer fires statistics once per multiple of 5 the global step crossed since its
    session began (other workers move it between and during its runs), never before the
    multiple; a row stands for every multiple up to its step, so no two rows of a trainer lie
    between the same two multiples. Dumps likewise for 10. How many multiples one run jumps
    depends on how fast the other trainer runs meanwhile (a trainer's first run, slow on busy
    cores, can span 15 steps of the other's), so rows are bounded above here, not below: the
    rule for a jump is checked exactly in test_a_row_stands_for_every_multiple_up_to_its_step."""
    run = inspector.open_run(cluster.run_dir)
    for worker in TRAINERS:
        start = cluster.start_step(worker)
        for every, steps in ((STATS_EVERY, sorted(set(run.query_stats(worker=worker, columns=[])["step"]))),
                             (DUMP_EVERY, run.dump_steps(worker=worker))):
            what = f"{worker} (from step {start}), every {every}: {steps}"
            assert steps and steps[0] >= (start // every + 1) * every, what
            slots = [s // every for s in steps]
            assert slots == sorted(set(slots)), what                    # one row per slot between multiples
            crossed = steps[-1] // every - start // every              # multiples in (start, last row]
            assert len(steps) <= crossed, what
    chief, worker = (sorted(set(run.query_stats(worker=w, columns=[])["step"])) for w in TRAINERS)
    assert worker[0] < chief[-1] and chief[0] < worker[-1]             # they trained at the same time
    assert max(chief[-1], worker[-1]) >= MAX_STEPS - 2 * STATS_EVERY


def _export(capsys, run_dir: Path, *args: str) -> tuple[int, str]:
    rc = cli.main(["export", str(run_dir), *args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_cli_export_chooses_worker_mode_and_session(cluster, tmp_path, capsys):
    run = inspector.open_run(cluster.run_dir)
    d = cluster.run_dir
    # statistics: the chief by default, every trainer with --worker all, the worker column always
    assert _export(capsys, d, "--format", "csv", "--out", str(tmp_path / "chief.csv"))[0] == 0
    chief = pd.read_csv(tmp_path / "chief.csv")
    assert set(chief["worker"]) == {"chief-0"} and len(chief) == len(run.stats)
    assert _export(capsys, d, "--format", "csv", "--out", str(tmp_path / "all.csv"), "--worker", "all")[0] == 0
    both = pd.read_csv(tmp_path / "all.csv")
    assert set(both["worker"]) == set(TRAINERS) and not both.duplicated(
        ["worker", "step", "batch", "tensor", "kind", "group"]).any()
    assert _export(capsys, d, "--format", "parquet", "--out", str(tmp_path / "w.parquet"), "--worker", "worker-0",
                   "--session", "1", "--tensors", "conv1/relu")[0] == 0
    t = pq.read_table(tmp_path / "w.parquet")
    assert set(t.column("worker").to_pylist()) == {"worker-0"} and set(t.column("tensor").to_pylist()) == {
        "conv1/relu:0"} and set(t.column("session").to_pylist()) == {1}
    assert _export(capsys, d, "--format", "parquet", "--out", str(tmp_path / "e.parquet"), "--mode", "eval")[0] == 0
    t = pq.read_table(tmp_path / "e.parquet")
    assert set(t.column("mode").to_pylist()) == {"eval"} and set(t.column("worker").to_pylist()) == {"evaluator-0"}
    assert set(t.column("batch").to_pylist()) == {0, 1}
    # dumps: keys name the worker only when several are exported, the batch in eval
    assert _export(capsys, d, "--format", "npz", "--out", str(tmp_path / "c.npz"))[0] == 0
    with np.load(tmp_path / "c.npz") as z:
        assert {k.split("/")[0] for k in z.files} == {f"step{s}" for s in run.steps}
    assert _export(capsys, d, "--format", "npz", "--out", str(tmp_path / "a.npz"), "--worker", "all",
                   "--tensors", "conv1/relu")[0] == 0
    with np.load(tmp_path / "a.npz") as z:
        prefixes = {tuple(k.split("/")[:2]) for k in z.files}
        assert prefixes == {(w, f"step{s}") for w in TRAINERS for s in run.dump_steps(worker=w)}
        s = run.dump_steps(worker="worker-0")[0]
        np.testing.assert_array_equal(z[f"worker-0/step{s}/forward/conv1/relu:0"],
                                      run.tensor("conv1/relu:0", s, worker="worker-0"))
        np.testing.assert_array_equal(z[f"worker-0/step{s}/samples/index"],
                                      run.samples(s, worker="worker-0")["index"])
    assert _export(capsys, d, "--format", "npz", "--out", str(tmp_path / "e.npz"), "--mode", "eval",
                   "--session", "all", "--tensors", "^loss")[0] == 0
    ev = run.sessions[run.sessions["worker"] == "evaluator-0"]
    with np.load(tmp_path / "e.npz") as z:
        assert {k.rsplit("/", 2)[0] for k in z.files if k.endswith("forward/loss:0")} == {
            f"s{r.session}/step{r.first_step}/batch{b}" for r in ev.itertuples() for b in (0,)}
    # errors say what to pass
    rc, text = _export(capsys, d, "--format", "csv", "--out", str(tmp_path / "x.csv"), "--worker", "ps-0")
    assert rc == 2 and "worker 'ps-0' wrote nothing" in text and "worker-0" in text
    rc, text = _export(capsys, d, "--format", "csv", "--out", str(tmp_path / "x.csv"), "--session", "last")
    assert rc == 2 and "--session 'last'" in text


def test_cli_from_a_shell_lists_every_worker(cluster, tmp_path):
    out = subprocess.run([sys.executable, "-m", "inspector", "info", str(cluster.run_dir)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "chief-0 s1 train" in out.stdout and "worker-0 s1 train" in out.stdout
    assert "evaluator-0 s1 eval" in out.stdout
    out = subprocess.run([sys.executable, "-m", "inspector", "export", str(cluster.run_dir), "--format", "csv",
                          "--out", str(tmp_path / "s.csv"), "--worker", "all", "--tensors", "loss"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert set(pd.read_csv(tmp_path / "s.csv")["worker"]) == set(TRAINERS)
