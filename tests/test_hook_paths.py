"""The hook under tf.estimator (TF 2.15), and a training process killed mid-run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow
import inspector  # noqa: E402
from hooks import DumpHook, mark  # noqa: E402
from tfmodels import BATCH, batch_images, conv_net  # noqa: E402

v1 = tf.compat.v1
ROOT = Path(__file__).resolve().parent.parent
HAS_ESTIMATOR = hasattr(tf, "estimator") and hasattr(getattr(tf, "estimator", None), "Estimator")


@pytest.mark.skipif(not HAS_ESTIMATOR, reason="this TensorFlow has no tf.estimator (2.16+)")
def test_estimator_train_with_marked_loss_and_labels(tmp_path):
    images = np.concatenate([batch_images(s) for s in range(1, 7)])
    labels = np.tile(np.array([1, 0, 1, 0, 0, 1, 1, 0], np.int32), 6)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH, drop_remainder=True)

    def model_fn(features, labels, mode):
        labels = tf.identity(labels, name="labels")
        loss = conv_net(features, labels)
        mark(loss=loss, labels=labels, positive=lambda y: tf.equal(y, 1))
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    hook = DumpHook(tmp_path / "run", stats_every_n_steps=2, dump_every_n_steps=3, strict=True)
    est.train(input_fn, hooks=[hook], steps=6)
    run = inspector.open_run(tmp_path / "run")
    assert run.status == "finished" and run.steps == [3, 6]
    assert run.manifest["labels"] == "labels:0" and run.manifest["loss"] == "loss:0"
    assert {"conv1/relu:0", "conv2/relu:0", "fc/logits:0"} <= set(run.tensors.index)
    assert sorted(run.stats.step.unique()) == [2, 4, 6]
    s = run.samples(6)  # step 6 trains on the sixth batch
    np.testing.assert_array_equal(s["label"], labels[40:48][s["index"]])
    np.testing.assert_allclose(run.tensor("IteratorGetNext:0", 6), images[40:48][s["index"]])


KILL_SCRIPT = """
import sys, numpy as np, tensorflow as tf
sys.path[:0] = [{root!r}, {tests!r}]
from hooks import DumpHook
from tfmodels import build_cnn
v1 = tf.compat.v1
with tf.Graph().as_default():
    m = build_cnn()
    hook = DumpHook({run!r}, labels=m.y, stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=8,
                    stats_flush_secs=0.05)
    with v1.train.MonitoredSession(hooks=[hook]) as sess:
        for step in range(1, 100000):
            sess.run(m.train_op, m.feed(step))
"""


def test_sigkill_mid_run_leaves_completed_dumps_readable(tmp_path):
    run_dir = tmp_path / "run"
    script = KILL_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"), run=str(run_dir))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            dumps = list((run_dir / "dumps").glob("*.safetensors")) if (run_dir / "dumps").exists() else []
            if len(dumps) >= 5 and list((run_dir / "stats").glob("*.parquet")):
                break
            time.sleep(0.05)  # polling for progress, not waiting for luck
        assert proc.poll() is None, "the training process ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    run = inspector.open_run(run_dir)
    assert run.manifest["status"] == "running"  # never reached end()
    assert run.status == "crashed"  # ... and the reader sees that its process is gone
    assert len(run.steps) >= 5
    for step in run.steps:
        idx = run.samples(step)["index"].to_numpy()
        np.testing.assert_array_equal(run.tensor("x:0", step), batch_images(step)[idx])
        assert np.isfinite(run.tensor("conv1/relu:0", step, "gradient")).all()
    assert not run.problems
    assert len(run.stats) > 0
