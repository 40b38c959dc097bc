"""One task of the localhost cluster of tests/test_multiworker.py (TF_CONFIG says which).

    TF_CONFIG=... python tests/multiworker_task.py RUN_DIR MODEL_DIR MAX_STEPS

Every task calls ``tf.estimator.train_and_evaluate`` with a small conv net and a ``DumpHook``
writing to the shared RUN_DIR: the ps serves variables (and never returns), the chief and the
worker train asynchronously (between-graph replication), the evaluator evaluates checkpoints.
Two test-only hooks make the chief and the worker overlap without relying on timing: the chief
waits at GATE_STEP until the worker has finished a training run (its first, the slowest, can
outlast the chief's remaining steps on busy cores), and both take PACE_SECS per step.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # first: the imports below (noqa: E402) from this checkout

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hooks import DumpHook, mark  # noqa: E402

logging.basicConfig(level=logging.WARNING)
logging.getLogger("tf_inspector").setLevel(logging.INFO)  # an application: show the hook's choices
from tfmodels import BATCH, batch_images, batch_labels, conv_net  # noqa: E402

v1 = tf.compat.v1
GATE_STEP, PACE_SECS, WAIT_SECS = 10, 0.05, 120


def wait_for(pattern: str, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECS
    while not glob.glob(pattern):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not appear within {WAIT_SECS} s ({pattern})")
        time.sleep(0.1)


class Pace(v1.train.SessionRunHook):
    """Chief: wait at GATE_STEP until the worker has run a training step (``ran`` exists, a file
    beside the run directory); worker: create it after its first run; everyone: sleep PACE_SECS
    after each step, so that the two trainers interleave their global steps."""

    def __init__(self, ran: str, gate: bool) -> None:
        self.ran, self.gate, self.told = ran, gate, gate

    def begin(self) -> None:
        self.global_step = v1.train.get_global_step()

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self.global_step)

    def after_run(self, run_context, run_values) -> None:
        if self.gate and run_values.results >= GATE_STEP:
            wait_for(self.ran, "the worker's first training run")
            self.gate = False
        if not self.told:
            Path(self.ran).touch()
            self.told = True
        time.sleep(PACE_SECS)


def main() -> None:
    run_dir, model_dir, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
    images = np.concatenate([batch_images(s) for s in range(1, 21)])
    labels = np.concatenate([batch_labels(s) for s in range(1, 21)])

    def input_fn():
        return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(BATCH, drop_remainder=True)

    def model_fn(features, labels, mode):
        labels = tf.identity(labels, name="labels")
        loss = conv_net(features, labels)
        mark(loss=loss, labels=labels)
        train_op = None
        if mode == tf.estimator.ModeKeys.TRAIN:
            train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=30, save_summary_steps=1000,
                                    log_step_count_steps=1000, experimental_max_worker_delay_secs=0)
    est = tf.estimator.Estimator(model_fn, config=config)
    hook = DumpHook(run_dir, stats_every_n_steps=5, dump_every_n_steps=10, strict=True)
    train_hooks = [hook]
    if task in ("chief", "worker"):
        train_hooks.append(Pace(os.path.join(os.path.dirname(os.path.abspath(run_dir)), "worker-ran"),
                               gate=task == "chief"))
    if task == "worker":
        # Start once the chief has initialized the variables (its hook writes after that):
        # a worker that asks earlier sleeps 30 s (SessionManager.recovery_wait_secs) before asking again.
        wait_for(os.path.join(run_dir, "manifest.chief-0.s*.json"), "the chief's manifest")
    train_spec = tf.estimator.TrainSpec(input_fn, max_steps=max_steps, hooks=train_hooks)
    eval_spec = tf.estimator.EvalSpec(input_fn, steps=2, hooks=[hook], start_delay_secs=0, throttle_secs=1)
    tf.estimator.train_and_evaluate(est, train_spec, eval_spec)
    print(f"task {task} done", flush=True)


if __name__ == "__main__":
    main()
