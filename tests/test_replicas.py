"""MirroredStrategy on two logical CPU devices (tests/replicas_task.py, a process of its own): fit with
InspectCallback records the training step's global batch, and the probe, exactly (each value and
gradient equal to a GradientTape's on that batch and the weights the step read, or those after it
for the probe), inside strategy.scope() or outside it, under both TensorFlows; and inspect_step of
a custom loop calling strategy.run, likewise."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

import inspector  # noqa: E402

TASK = Path(__file__).resolve().parent / "replicas_task.py"


def _task(*args: str) -> str:
    out = subprocess.run([sys.executable, str(TASK), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def _reference(x, y, weights):
    """GradientTape on the batch ``x, y`` with ``weights`` (hidden kernel, bias, logits kernel,
    bias): the pre-activation, hidden and logits tensors, the loss and the tape."""
    hk, hb, lk, lb = map(tf.constant, weights)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([hk, hb, lk, lb])
        pre = tf.matmul(tf.constant(x), hk) + hb
        hidden = tf.nn.relu(pre)
        logits = tf.matmul(hidden, lk) + lb
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    return (pre, hidden, logits), loss, tape, (hk, hb, lk, lb)


def _check_step_2(run, x, y, weights) -> list[np.ndarray]:
    """Step 2's records equal a GradientTape's on ``x, y`` and ``weights``: the variables, the
    values and ``d loss / d t`` of three per-sample tensors on every dumped sample, the variable
    gradients. Returns the recorded gradients in ``weights``' order."""
    names = sorted(run.variables.index)          # hidden/bias, hidden/kernel, logits/bias, logits/kernel
    assert len(names) == 4
    order = (names[1], names[0], names[3], names[2])
    for n, want in zip(order, weights):
        np.testing.assert_allclose(run.tensor(n, 2), want, rtol=1e-6, err_msg=n)
    refs, loss, tape, variables = _reference(x, y, weights)
    index = np.asarray(run.samples(2)["index"])
    np.testing.assert_array_equal(np.sort(index), np.arange(16))
    cat = run.tensors
    for ref, op_type, layer in zip(refs, ("BiasAdd", "Relu", "BiasAdd"), ("hidden", "hidden", "logits")):
        name = cat[(cat["op_type"] == op_type) & cat["keras_layer"].fillna("").str.endswith(layer)].index[0]
        np.testing.assert_allclose(run.tensor(name, 2), ref.numpy()[index], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(run.tensor(name, 2, "gradient"), tape.gradient(loss, ref).numpy()[index],
                                   rtol=1e-4, atol=1e-7, err_msg=name)
    got = [np.asarray(run.tensor(n, 2, "gradient")) for n in order]
    for n, g, want in zip(order, got, tape.gradient(loss, list(variables))):
        np.testing.assert_allclose(g, want.numpy(), rtol=1e-4, atol=1e-7, err_msg=n)
    return got


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_fit_on_two_replicas_records_the_training_steps_global_batch_exactly(tmp_path, where):
    """Each replica trains on 8 of the step's 16 samples; the record is the 16-sample batch in
    replica order, each value and gradient equal to a GradientTape's on that batch and the
    weights the step read, the variable gradients the sum the optimizer applied."""
    _task("fit", tmp_path / "r", tmp_path / "out.npz", "train_batch", *(["inside"] if where == "inside" else []))
    saved = np.load(tmp_path / "out.npz")
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["source"] == "train_batch" and sorted(run.stats["step"].unique()) == [1, 2]
    before, after = [saved[f"b{i}"] for i in range(4)], [saved[f"w{i}"] for i in range(4)]
    grads = _check_step_2(run, saved["x"][16:], saved["y"][16:], before)
    # the gradients recorded are those applied: SGD(0.3) on the step's weights gives the trained ones
    for b, g, a in zip(before, grads, after):
        np.testing.assert_allclose(b - 0.3 * g, a, rtol=1e-5, atol=1e-6)
    # a replica's mean loss has no value over the global batch: not recorded, and said why
    skipped = run.manifest["skipped"]
    assert skipped and all("one replica's slice" in run.why(n).reason for n in skipped)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_fit_on_two_replicas_records_the_probe_exactly(tmp_path, where):
    _task("fit", tmp_path / "r", tmp_path / "out.npz", "probe", *(["inside"] if where == "inside" else []))
    saved = np.load(tmp_path / "out.npz")
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["source"] == "probe" and sorted(run.stats["step"].unique()) == [1, 2]
    # the probe (the first 16 samples) runs after the step's update: the trained weights
    _check_step_2(run, saved["x"][:16], saved["y"][:16], [saved[f"w{i}"] for i in range(4)])


def test_inspect_step_of_strategy_run_on_two_replicas_records_the_global_batch_exactly(tmp_path):
    """A custom loop calling strategy.run (GradientTape, compute_average_loss) wrapped by
    inspect_step: recorded as fit's step is, the global batch in replica order."""
    _task("loop", tmp_path / "r", tmp_path / "out.npz")
    saved = np.load(tmp_path / "out.npz")
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.stats["step"].unique()) == [1, 2]
    before, after = [saved[f"b{i}"] for i in range(4)], [saved[f"w{i}"] for i in range(4)]
    grads = _check_step_2(run, saved["x"][16:], saved["y"][16:], before)
    for b, g, a in zip(before, grads, after):
        np.testing.assert_allclose(b - 0.3 * g, a, rtol=1e-5, atol=1e-6)
