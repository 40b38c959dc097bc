"""DumpHook over real training lifecycles: reruns, resumes, evaluation, exceptions, async steps."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from inspector import cli  # noqa: E402
from hooks import DumpHook, mark  # noqa: E402
from tfmodels import BATCH, HW, batch_images, batch_labels, build_cnn, conv_net  # noqa: E402

v1 = tf.compat.v1
HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(getattr(tf, "estimator", None), "Estimator")
HW_FLAT = HW * HW
needs_estimator = pytest.mark.skipif(not HAS_ESTIMATOR, reason="this TensorFlow has no tf.estimator (2.16+)")


def train_session(model, hooks, steps, ckpt=None, nan_at=None, between=None):
    """``steps`` runs of the train op in a MonitoredTrainingSession (resuming from ``ckpt``);
    ``between`` is run before each step outside the hooks (another worker's steps)."""
    with v1.train.MonitoredTrainingSession(checkpoint_dir=ckpt, hooks=hooks, save_checkpoint_steps=1,
                                           save_summaries_steps=None, log_step_count_steps=None) as sess:
        for _ in range(steps):
            if between is not None:
                sess.run_step_fn(lambda step_context: step_context.session.run(between))
            step = int(sess.run_step_fn(lambda step_context: step_context.session.run(model.global_step))) + 1
            sess.run(model.train_op, model.feed(step, nan=step == nan_at))


def test_reruns_into_one_run_dir_accumulate(tmp_path):
    """Three sessions of 10 steps resuming from a checkpoint: every step's statistics stay,
    and each session is recorded with its step range."""
    for _ in range(3):
        with tf.Graph().as_default():
            m = build_cnn()
            hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=5, strict=True)
            train_session(m, [hook], 10, ckpt=str(tmp_path / "ckpt"))
    run = inspector.open_run(tmp_path / "run")
    assert sorted(run.stats["step"].unique()) == list(range(1, 31))
    assert run.steps == [5, 10, 15, 20, 25, 30]
    s = run.sessions
    assert list(s["session"]) == [1, 2, 3] and list(s["state"]) == ["finished"] * 3
    assert list(zip(s["first_step"], s["last_step"])) == [(1, 10), (11, 20), (21, 30)]


def test_an_exception_ends_training_and_nothing_is_lost(tmp_path):
    """NanTensorHook raises at the NaN step: end() never runs. The buffered statistics, the
    dump of the NaN step itself and a 'failed' status with the reason are all on disk, the
    writer's threads are gone, and the next session in the same process starts cleanly."""
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, dump_every_n_steps=0,
                        dump_on_nonfinite=True, stats_flush_secs=1000, strict=True)
        with pytest.raises(v1.train.NanLossDuringTrainingError):
            train_session(m, [hook, v1.train.NanTensorHook(m.loss)], 6, nan_at=3)
        old = hook._writer
    assert old.closed and not old._thread.is_alive() and not any(t.is_alive() for t in old._dump_threads)
    run = inspector.open_run(tmp_path / "run")
    assert run.status == "failed" and "NaN/Inf first seen at step 3" in run.sessions.iloc[0]["error"]
    assert sorted(run.stats["step"].unique()) == [1, 2, 3]          # buffered for 1000 s, flushed anyway
    assert run.steps == [3] and np.isnan(run.tensor("x:0", 3)).any()
    assert run.dump_metadata(3)["reason"] == "NaN/Inf in the loss"
    assert run.first_nonfinite()["step"] == 3
    with tf.Graph().as_default():                                     # the notebook's next cell
        m = build_cnn()
        hook2 = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, strict=True)
        train_session(m, [hook2], 2)
    run = inspector.open_run(tmp_path / "run")
    assert list(run.sessions["state"]) == ["failed", "finished"] and run.status == "finished"
    assert json.loads((tmp_path / "run" / "manifest.chief.s0001.json").read_text())["status"] == "failed"


def test_a_second_hook_on_a_live_run_is_refused(tmp_path, caplog):
    with tf.Graph().as_default():
        m = build_cnn()
        first = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1)
        second = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1)
        train_session(m, [first, second], 2)
    assert second._disabled and "already has a live writer for worker 'chief'" in caplog.text
    run = inspector.open_run(tmp_path / "run")
    assert list(run.sessions["session"]) == [1] and sorted(run.stats["step"].unique()) == [1, 2]


def test_eval_mode_keeps_batches_apart(tmp_path):
    with tf.Graph().as_default():
        m = build_cnn()
        train_session(m, [DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1)], 4,
                      ckpt=str(tmp_path / "ckpt"))
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, mode="eval", eval_dump_batches=2)
        creator = v1.train.ChiefSessionCreator(checkpoint_dir=str(tmp_path / "ckpt"))
        with v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
            for b in range(3):
                sess.run(m.loss, m.feed(100 + b))
    run = inspector.open_run(tmp_path / "run")
    assert sorted(run.stats["step"].unique()) == [1, 2, 3, 4]
    ev = run.query_stats(mode="eval", tensors=["x:0"], groups=["all"], kinds=["forward"])
    assert list(ev["step"]) == [4, 4, 4] and list(ev["batch"]) == [0, 1, 2]
    np.testing.assert_allclose(ev["mean"], [batch_images(100 + b).mean() for b in range(3)], rtol=1e-5)
    assert run.dump_steps(mode="eval") == [4] and run.steps == []
    np.testing.assert_array_equal(run.tensor("x:0", 4, mode="eval", batch=1),
                                  batch_images(101)[run.samples(4, mode="eval", batch=1)["index"]])


def test_the_schedule_fires_once_per_crossing_when_the_global_step_jumps(tmp_path, monkeypatch):
    """Asynchronous workers move the global step between one worker's runs (here: by 2, then
    this worker's own step): statistics fire once per multiple crossed, at this worker's first
    run after it saw the crossing, never before the multiple."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    with tf.Graph().as_default():
        m = build_cnn()
        others = v1.assign_add(m.global_step, 2)
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=5, dump_every_n_steps=10, strict=True)
        train_session(m, [hook], 12, between=others)                   # global step 3, 6, ..., 36
    run = inspector.open_run(tmp_path / "run")
    steps = sorted(run.stats["step"].unique())
    crossed = list(range(5, steps[-1] + 1, 5))
    assert len(steps) == len(crossed) >= 5, steps
    assert all(k <= s <= k + 6 for k, s in zip(crossed, steps)), steps
    assert len(run.steps) == len(range(10, run.steps[-1] + 1, 10)) and run.workers == ["worker-0"]


class _ReadsTheStepLast(DumpHook):
    """DumpHook whose in-run global step read comes after the run's own update, as the executor
    may order it (it often did on a small net): the worst case of the race, made certain."""

    def __init__(self, *args, train_op, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_op = train_op

    def begin(self):
        super().begin()
        with tf.control_dependencies([self._train_op]):
            self._late_read = tf.identity(v1.train.get_global_step().read_value())

    def before_run(self, run_context):
        args = super().before_run(run_context)
        if args is not None and "global_step" in args.fetches:
            args.fetches["global_step"] = self._late_read
        return args


@pytest.mark.parametrize("late", [False, True])
def test_a_worker_alone_in_a_cluster_samples_at_the_multiples(tmp_path, monkeypatch, late):
    """A TF_CONFIG cluster makes the hook read the global step in each run; with no other
    worker moving it, statistics and dumps fall exactly on the multiples, as without a cluster."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    with tf.Graph().as_default():
        m = build_cnn()
        kwargs = dict(labels=m.y, stats_every_n_steps=5, dump_every_n_steps=10, strict=True)
        hook = (_ReadsTheStepLast(tmp_path / "run", train_op=m.train_op, **kwargs) if late
                else DumpHook(tmp_path / "run", **kwargs))
        train_session(m, [hook], 40)
    run = inspector.open_run(tmp_path / "run")
    # a read after the update once taken as the value before it sampled step 14, not 15
    assert sorted(run.stats["step"].unique()) == list(range(5, 41, 5))
    assert run.steps == [10, 20, 30, 40] and run.workers == ["worker-0"]


def test_runs_that_do_not_train_are_no_steps(tmp_path):
    """Runs through the monitored session that do not advance the global step (a validation
    fetch, a read of the step) are no training steps. Counted as steps, they made the schedule
    drift off the multiples and one was sampled: written as the training step before it, with
    the validation batch's values and a zero update."""
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=4, dump_every_n_steps=4, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], save_checkpoint_steps=None, save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for step in range(1, 13):
                sess.run(m.train_op, m.feed(step))
                if step % 3 == 2:
                    sess.run(m.loss, m.feed(100 + step))   # validation, through the hooks
                    sess.run({"step": m.global_step})
    run = inspector.open_run(tmp_path / "run")
    assert sorted(run.stats["step"].unique()) == [4, 8, 12] and run.steps == [4, 8, 12]
    for step in run.steps:
        kept = run.samples(step)["index"].to_numpy()
        np.testing.assert_array_equal(run.tensor("x:0", step), batch_images(step)[kept])
        assert np.abs(run.tensor("conv1/w", step, "update")).max() > 0


def test_a_train_op_that_leaves_the_step_to_another_run_is_sampled(tmp_path):
    """SyncReplicasOptimizer's workers apply gradients to accumulators and the
    chief increments the global step in a run of its own. Taking only runs that reach the
    increment as training, the hook sampled none of them; a run that changes state counts."""
    with tf.Graph().as_default():
        m = build_cnn()
        own_step = v1.assign_add(m.global_step, 1)            # the chief's run, outside the hooks
        apply = v1.train.GradientDescentOptimizer(0.1).minimize(m.loss)   # no global_step=
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=4, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], save_checkpoint_steps=None, save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for step in range(1, 13):
                sess.run(apply, m.feed(step))
                sess.run_step_fn(lambda step_context: step_context.session.run(own_step))
    # (the step is the other run's: read after a sampled run, it lags this run's count by one)
    assert len(inspector.open_run(tmp_path / "run").stats["step"].unique()) >= 2


@pytest.mark.parametrize("k", [1, 2])
def test_gradient_accumulation_is_warned_about(tmp_path, caplog, k):
    """A train op applying its accumulated gradients (and advancing the
    global step) every k-th run gets rows labelled with the global step after a micro-batch's
    run, on a schedule of runs. Not supported, and said once: the global step advanced less
    than the runs between two sampled runs. Plain training (k = 1) says nothing."""
    with tf.Graph().as_default():
        m = build_cnn()
        opt = v1.train.GradientDescentOptimizer(0.1)
        grads = opt.compute_gradients(m.loss)
        acc = [v1.get_variable(f"acc{i}", v.shape, initializer=v1.zeros_initializer(), trainable=False)
               for i, (_, v) in enumerate(grads)]
        runs = v1.get_variable("runs", [], tf.int64, initializer=v1.zeros_initializer(), trainable=False)
        with tf.control_dependencies([a.assign_add(g) for a, (g, _) in zip(acc, grads)]):
            count = runs.assign_add(1)

        def apply():
            with tf.control_dependencies([opt.apply_gradients([(a / k, v) for a, (_, v) in zip(acc, grads)],
                                                              global_step=m.global_step)]):
                return tf.group(*[a.assign(tf.zeros_like(a)) for a in acc])
        train = tf.cond(tf.equal(count % k, 0), lambda: tf.group(apply()), lambda: tf.group(tf.no_op()))
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=2, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], save_checkpoint_steps=None, save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            for step in range(1, 9):
                sess.run(train, m.feed(step))
    assert ("gradient accumulation" in caplog.text) == (k > 1)


def test_a_recovered_session_is_no_gradient_accumulation(tmp_path, caplog):
    """MonitoredTrainingSession recovering from an AbortedError restores the
    last checkpoint, so the global step goes back; the lag check compared across the recovery
    and warned of gradient accumulation. Each session starts the check afresh."""

    class Preempt(v1.train.SessionRunHook):
        done = False

        def after_run(self, run_context, run_values):
            if not self.done and run_context.session.run(v1.train.get_global_step()) == 9:
                self.done = True
                raise tf.errors.AbortedError(None, None, "preempted (test)")
    with tf.Graph().as_default():
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=4, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path / "ckpt"), save_checkpoint_steps=5,
                                               save_summaries_steps=None, log_step_count_steps=None,
                                               hooks=[hook, Preempt()]) as sess:
            for step in range(1, 17):
                sess.run(m.train_op, m.feed(step))
    assert "Aborted" in caplog.text or len(inspector.open_run(tmp_path / "run").sessions) == 2
    assert "gradient accumulation" not in caplog.text


def test_sync_replicas_training_with_the_default_capture_runs(tmp_path):
    """The default capture selected SyncReplicasOptimizer's accumulator takes,
    which the chief runs in a queue runner of its own; fetched in a training step they waited
    forever for gradients, and training hung at the first sampled step. In a child process with
    a timeout, so a hang fails the test instead of the suite."""
    script = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        import inspector
        from hooks import DumpHook
        v1 = tf.compat.v1
        v1.disable_eager_execution()
        x = v1.placeholder(tf.float32, [4, 3], name="x")
        y = v1.placeholder(tf.int32, [4], name="y")
        w = v1.get_variable("w", [3, 2])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(x, w)))
        gs = v1.train.get_or_create_global_step()
        opt = v1.train.SyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=1,
                                             total_num_replicas=1)
        train = opt.minimize(loss, global_step=gs)
        hook = DumpHook({str(tmp_path / "run")!r}, loss=loss, labels=y, stats_every_n_steps=4, dump_every_n_steps=0)
        with v1.train.MonitoredTrainingSession(hooks=[opt.make_session_run_hook(is_chief=True), hook],
                                               save_checkpoint_steps=None, save_summaries_steps=None,
                                               log_step_count_steps=None, stop_grace_period_secs=3) as sess:
            for i in range(12):
                sess.run(train, {{x: np.full((4, 3), i, np.float32), y: np.arange(4) % 2}})
        print("STEPS", len(inspector.open_run({str(tmp_path / "run")!r}).stats["step"].unique()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split("STEPS")[-1]) >= 2, out.stdout


def test_a_hook_reused_after_a_session_never_closed_records_the_next(tmp_path):
    """A session never closed (a notebook loop without `with`) looked like
    the live session of a nested evaluation, so the next session was ignored. Only an
    evaluation graph begun inside a live session is; any other takes over (the first: failed)."""
    hook = DumpHook(tmp_path / "run", loss="loss:0", labels="labels:0", stats_every_n_steps=2, dump_every_n_steps=0,
                    strict=True)
    with tf.Graph().as_default():
        m = build_cnn()
        left_open = v1.train.MonitoredTrainingSession(hooks=[hook], save_checkpoint_steps=None,
                                                      save_summaries_steps=None, log_step_count_steps=None)
        for step in range(1, 5):
            left_open.run(m.train_op, m.feed(step))
    with tf.Graph().as_default():   # the cell run again: a new graph, the same hook
        train_session(build_cnn(), [hook], 4)
    run = inspector.open_run(tmp_path / "run")
    assert run.sessions[["session", "state"]].values.tolist() == [[1, "failed"], [2, "finished"]]
    assert sorted(run.query_stats(session=2)["step"].unique()) == [2, 4]


def test_a_new_training_into_a_used_run_dir_warns_and_is_shown_alone(tmp_path, caplog):
    """A second training written into the run directory from step 0 (a fresh model): the hook
    warns when the session starts, and readers show that training alone (its steps 1-2 are not
    the first training's), the first one readable by number. A resume from an older checkpoint
    (the step before what an earlier session recorded) warns that it replaces those steps."""
    run_dir = tmp_path / "run"

    def fit(steps, ckpt=None, save=True):
        with tf.Graph().as_default():
            m = build_cnn()
            hook = DumpHook(run_dir, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
            with v1.train.MonitoredTrainingSession(checkpoint_dir=ckpt, hooks=[hook], save_checkpoint_steps=1 if save
                                                   else None, save_checkpoint_secs=None, save_summaries_steps=None,
                                                   log_step_count_steps=None) as sess:
                for step in range(steps):
                    sess.run(m.train_op, m.feed(step))

    fit(4)
    with caplog.at_level("WARNING", logger="tf_inspector"):
        fit(2)
    assert "already holds training steps up to 4 (worker chief, session 1), and this session starts a new training " \
           "at step 0 (a fresh or warm-started model)" in caplog.text
    run = inspector.open_run(run_dir)
    assert sorted(run.stats["step"].unique()) == [1, 2] and set(run.stats["session"]) == {2}
    assert sorted(run.query_stats(session=1)["step"].unique()) == [1, 2, 3, 4]
    assert run.sessions["hidden_by"].tolist()[0] == 2 and run.sessions["start_step"].tolist() == [0, 0]
    caplog.clear()
    ckpt = str(tmp_path / "ckpt")
    fit(3, ckpt)               # session 3: a new training again, its checkpoint at step 3
    fit(3, ckpt, save=False)   # session 4: steps 4-6, no checkpoint
    with caplog.at_level("WARNING", logger="tf_inspector"):
        fit(1, ckpt)           # session 5: resumes from step 3
    assert "this session resumes at global step 3, before step 6 that session 4 recorded" in caplog.text
    run = inspector.open_run(run_dir)
    stats = run.stats.drop_duplicates("step").set_index("step")["session"].sort_index()
    assert stats.to_dict() == {1: 3, 2: 3, 3: 3, 4: 5, 5: 4, 6: 4}


def test_a_session_that_records_nothing_says_why(tmp_path, caplog):
    """A worker started after its chief finished (the last step already reached: no run at
    all), and a training shorter than the schedule: each session's manifest, the log (a
    WARNING at its end) and ``info`` say why it recorded nothing and what to change."""
    ckpt = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        m = build_cnn()
        train_session(m, [DumpHook(tmp_path / "run", labels=m.y, stats_every_n_steps=1, strict=True)], 3, ckpt=ckpt)
    with tf.Graph().as_default(), caplog.at_level("WARNING", logger="tf_inspector"):
        m = build_cnn()
        hook = DumpHook(tmp_path / "run", labels=m.y, worker="worker-1", stats_every_n_steps=1, strict=True)
        with v1.train.MonitoredTrainingSession(checkpoint_dir=ckpt, hooks=[hook], save_summaries_steps=None,
                                               log_step_count_steps=None) as sess:
            while sess.run_step_fn(lambda step_context: step_context.session.run(m.global_step)) < 3:
                sess.run(m.train_op, m.feed(0))   # the worker's loop: the training already reached step 3
    assert "worker worker-1" in caplog.text and "no training step ran: the session began at global step 3" in caplog.text
    with tf.Graph().as_default():
        m = build_cnn()
        train_session(m, [DumpHook(tmp_path / "short", labels=m.y, stats_every_n_steps=100, strict=True)], 2)
    run = inspector.open_run(tmp_path / "run")
    note = run.sessions.set_index("worker").loc["worker-1", "note"]
    assert "max_steps, a StopAtStepHook, or a chief that finished before this worker started" in note
    assert f"recorded nothing: {note}" in cli.summary(run)
    short = inspector.open_run(tmp_path / "short").sessions["note"][0]
    assert short.startswith("2 training runs (global steps 1..2) and none was a statistics or dump step "
                            "(stats_every_n_steps=100, dump_every_n_steps=1000): lower stats_every_n_steps")


def _estimator_input_fn():
    images = np.concatenate([batch_images(s) for s in range(1, 11)])
    labels = np.concatenate([batch_labels(s) for s in range(1, 11)])
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(BATCH, drop_remainder=True)


def _model_fn(features, labels, mode):
    if mode == tf.estimator.ModeKeys.PREDICT:
        w = v1.get_variable("w", [HW_FLAT, 2])
        logits = tf.matmul(tf.reshape(features, [-1, HW_FLAT]), w, name="logits")
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    v1.get_variable("w", [HW_FLAT, 2])
    labels = tf.identity(labels, name="labels")
    loss = conv_net(features, labels)
    mark(loss=loss, labels=labels)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@needs_estimator
def test_train_and_evaluate_with_one_hook_or_two(tmp_path, caplog):
    """Local train_and_evaluate evaluates inside the training session. One
    hook in both specs took each evaluation for a new session: it closed the live training
    session as failed at the first checkpoint and lost everything after. Now it records the
    training whole and logs an error; an evaluator hook of its own records the evaluations."""
    for two in (False, True):
        run_dir = tmp_path / f"run{int(two)}"
        est = tf.estimator.Estimator(_model_fn, model_dir=str(tmp_path / f"model{int(two)}"),
                                     config=tf.estimator.RunConfig(save_checkpoints_steps=4))
        hook = DumpHook(run_dir, stats_every_n_steps=2, dump_every_n_steps=4, strict=True)
        evaluator = DumpHook(run_dir, worker="evaluator-0", strict=True) if two else hook
        tf.estimator.train_and_evaluate(
            est, tf.estimator.TrainSpec(_estimator_input_fn, max_steps=12, hooks=[hook]),
            tf.estimator.EvalSpec(_estimator_input_fn, steps=2, hooks=[evaluator], throttle_secs=0,
                                  start_delay_secs=0))
        run = inspector.open_run(run_dir)
        train = run.sessions[run.sessions["mode"] == "train"]
        assert train[["worker", "state", "first_step", "last_step"]].values.tolist() == [["chief", "finished", 2, 12]]
        assert sorted(run.stats["step"].unique()) == [2, 4, 6, 8, 10, 12] and run.steps == [4, 8, 12]
        evaluations = run.query_stats(mode="eval", worker="all")
        assert evaluations.empty != two and (set(evaluations["worker"]) == {"evaluator-0"} if two else True)
        # logged once, at the first evaluation (three ran), never at each
        assert caplog.text.count("another session began inside it") == (0 if two else 1)
        caplog.clear()


@needs_estimator
def test_estimator_train_evaluate_loop(tmp_path):
    """The classic loop: train 10 steps, evaluate 2 batches, three times, one hook for both."""
    images = np.concatenate([batch_images(s) for s in range(1, 11)])
    input_fn, model_fn = _estimator_input_fn, _model_fn
    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, dump_every_n_steps=10, strict=True)
    for _ in range(3):
        est.train(input_fn, hooks=[hook], steps=10)
        est.evaluate(input_fn, hooks=[hook], steps=2)
    preds = est.predict(lambda: tf.data.Dataset.from_tensor_slices(images[:16]).batch(BATCH), hooks=[hook])
    assert len(list(preds)) == 16
    run = inspector.open_run(tmp_path / "run")
    assert list(run.sessions["mode"]) == ["train", "eval"] * 3 + ["predict"]
    assert set(run.sessions["state"]) == {"finished"}
    pr = run.query_stats(mode="predict", tensors=["logits:0"], groups=["all"])
    assert sorted(set(zip(pr["step"], pr["batch"]))) == [(30, 0), (30, 1)] and set(pr["kind"]) == {"forward"}
    assert sorted(run.stats["step"].unique()) == list(range(1, 31)) and set(run.stats["mode"]) == {"train"}
    ev = run.query_stats(mode="eval", tensors=["labels:0"] if "labels:0" in run.tensors.index else None)
    assert sorted(set(zip(ev["step"], ev["batch"]))) == [(s, b) for s in (10, 20, 30) for b in (0, 1)]
    assert run.steps == [10, 20, 30] and run.dump_steps(mode="eval") == [10, 20, 30]


@needs_estimator
@pytest.mark.parametrize("how", ["close", "error"])
def test_predict_stopped_by_its_caller_is_finished_and_an_error_inside_is_failed(tmp_path, how):
    """Estimator.predict is a generator: a caller that stops iterating exits the session between
    batches, and DumpHook.end() is skipped. Every batch it ran is recorded; the session finished
    (it had been closed as failed, "training raised"). An error inside a batch's run still fails."""
    images = np.concatenate([batch_images(s) for s in range(1, 5)])
    est = tf.estimator.Estimator(_model_fn, model_dir=str(tmp_path / "model"))
    est.train(_estimator_input_fn, steps=1)
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=1, strict=True)

    def input_fn():
        ds = tf.data.Dataset.from_tensor_slices(images).batch(BATCH)
        if how == "error":   # the third batch's run raises inside the session
            ds = ds.enumerate().map(lambda i, x: tf.cond(
                i < 2, lambda: x, lambda: tf.debugging.check_numerics(x * np.nan, "bad batch")))
        return ds

    preds = est.predict(input_fn, hooks=[hook])
    if how == "close":
        for _ in range(BATCH + 1):   # into the second batch
            next(preds)
        preds.close()
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="bad batch"):
            list(preds)
    run = inspector.open_run(tmp_path / "run")
    row = run.sessions[run.sessions["mode"] == "predict"].iloc[0]
    assert row["state"] == ("finished" if how == "close" else "failed"), row.to_dict()
    batches = sorted(run.query_stats(mode="predict", tensors=["logits:0"], groups=["all"])["batch"].unique())
    assert batches == [0, 1]
    if how == "error":
        assert "prediction raised" in row["error"]


@needs_estimator
def test_estimator_nan_dump_is_on_disk_when_training_raises(tmp_path):
    images = np.concatenate([batch_images(s, nan=s == 4) for s in range(1, 9)])
    labels = np.concatenate([batch_labels(s) for s in range(1, 9)])

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH, drop_remainder=True)

    def model_fn(features, labels, mode):
        loss = conv_net(features, labels)
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    hook = DumpHook(tmp_path / "run", loss="loss:0", stats_every_n_steps=0, dump_every_n_steps=0,
                    dump_on_nonfinite=True, strict=True)
    with pytest.raises(v1.train.NanLossDuringTrainingError):
        est.train(input_fn, hooks=[hook], steps=8)
    run = inspector.open_run(tmp_path / "run")
    assert run.status == "failed" and run.steps == [4]
    assert np.isnan(run.tensor("IteratorGetNext:0", 4)).any()
