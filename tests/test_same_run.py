"""The reads after a sampled step (the global step, the variables' updates and their statistics)
made in the training run itself (``hooks.variables.SameRun``): no extra ``session.run``, and the
rows identical to the extra run's; runs that make other writes fall back to the extra run."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook, variables  # noqa: E402
from tfmodels import batch_images, batch_labels, conv_net, placeholders  # noqa: E402

v1 = tf.compat.v1
STEPS = 4


def _extra_runs(hook: DumpHook) -> list[list]:
    """A list that gets the reads of each extra ``session.run`` the hook makes after a sampled
    step, as it makes it (empty while the training run itself carries them)."""
    extra: list[list] = []
    reads = hook._run_reads
    hook._run_reads = lambda session, r: extra.append(sorted(r)) or reads(session, r)
    return extra


def _train(path, same_run: bool, monkeypatch, extra_write: bool = False) -> tuple[int, dict]:
    """Train STEPS steps with statistics and a dump on every step; (extra runs made, the
    variables' values after the last step)."""
    if not same_run:
        monkeypatch.setattr(variables.SameRun, "reads_for", lambda self, key, fetches: None)
    with tf.Graph().as_default():
        gs, x, y = placeholders()
        loss = conv_net(x, y)
        train_op = v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=gs)
        fc = [w for w in v1.trainable_variables() if w.op.name == "fc/w"][0]
        # a write of fc/w that is no optimizer's, fetched with the training op
        shrink = fc.assign(fc * 0.5) if extra_write else None
        values = {w.op.name: w.read_value() for w in v1.trainable_variables()}
        hook = DumpHook(path, loss=loss, labels=y, stats_every_n_steps=1, dump_every_n_steps=1,
                        strict=True)
        extra = _extra_runs(hook)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(1, STEPS + 1):
                feed = {x: batch_images(step), y: batch_labels(step)}
                sess.run([train_op, shrink] if extra_write else train_op, feed)
            after = sess.run_step_fn(lambda step_context: step_context.session.run(values))
    return len(extra), after


def test_sampled_steps_read_the_step_and_updates_in_their_own_run(tmp_path, monkeypatch):
    extra_runs, _ = _train(tmp_path / "same", True, monkeypatch)
    assert extra_runs == 0
    with monkeypatch.context() as m:
        extra_runs, _ = _train(tmp_path / "extra", False, m)
    assert extra_runs == STEPS   # the twin took one extra run per sampled step
    same, twin = inspector.open_run(tmp_path / "same"), inspector.open_run(tmp_path / "extra")
    a, b = same.query_stats(), twin.query_stats()
    assert list(a["step"].unique()) == list(range(1, STEPS + 1))
    assert len(a[a["kind"] == "update"]) == 3 * STEPS
    cols = ["tensor", "kind", "group", "step", "count", "mean", "std", "min", "max", "l2"]
    a, b = (f.sort_values(["tensor", "kind", "group", "step"])[cols].reset_index(drop=True) for f in (a, b))
    assert a.equals(b)
    for step in range(1, STEPS + 1):
        for name in ("conv1/w", "fc/w"):
            np.testing.assert_array_equal(same.tensor(name, step, "update"), twin.tensor(name, step, "update"))


def test_a_run_with_another_write_of_a_variable_takes_the_extra_run(tmp_path, monkeypatch):
    extra_runs, after = _train(tmp_path / "run", True, monkeypatch, extra_write=True)
    assert extra_runs == STEPS
    run = inspector.open_run(tmp_path / "run")
    last = run.tensor("fc/w", STEPS) + run.tensor("fc/w", STEPS, "update")
    # the update is the step's whole change, the extra write's halving included
    np.testing.assert_allclose(last, after["fc/w"], rtol=1e-6, atol=1e-7)


def test_updates_a_cond_applies_take_the_extra_run(tmp_path):
    """An update inside a TF2 cond (applied every other step, as gradient accumulation does): no
    read waits on it, so no training run can fail on it; each row's update is the step's own."""
    with tf.Graph().as_default():
        gs, x, y = placeholders()
        loss = conv_net(x, y)
        opt = v1.train.GradientDescentOptimizer(0.1)
        grads = opt.compute_gradients(loss)
        apply = tf.cond(tf.equal(gs % 2, 0), lambda: opt.apply_gradients(grads, global_step=gs),
                        lambda: tf.group(gs.assign_add(1)))
        values = {w.op.name: w.read_value() for w in v1.trainable_variables()}
        hook = DumpHook(tmp_path / "run", loss=loss, labels=y, stats_every_n_steps=1,
                        dump_every_n_steps=1, strict=True)
        extra = _extra_runs(hook)
        seen = []
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in range(1, STEPS + 1):
                seen.append(sess.run_step_fn(lambda step_context: step_context.session.run(values)))
                sess.run(apply, {x: batch_images(step), y: batch_labels(step)})
            seen.append(sess.run_step_fn(lambda step_context: step_context.session.run(values)))
    assert hook._same_run is not None and not hook._same_run.usable and len(extra) == STEPS
    run = inspector.open_run(tmp_path / "run")
    for step in range(1, STEPS + 1):
        np.testing.assert_allclose(run.tensor("fc/w", step, "update"),
                                   seen[step]["fc/w"] - seen[step - 1]["fc/w"], rtol=1e-6, atol=1e-7)
    assert np.any(run.tensor("fc/w", 1, "update")) and not np.any(run.tensor("fc/w", 2, "update"))
