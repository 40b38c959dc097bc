"""MirroredStrategy on two logical CPU devices (tests/replicas_task.py, a process of its own): fit with
InspectCallback records the probe, exactly (each value and gradient equal to a GradientTape's on the
probe batch and the weights after the step), inside strategy.scope() or outside it, under both
TensorFlows; inspect_step refuses such a model at once, saying why."""
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


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_fit_on_two_replicas_records_the_probe_exactly(tmp_path, where):
    log = _task("fit", tmp_path / "r", tmp_path / "out.npz", *(["inside"] if where == "inside" else []))
    assert "MirroredStrategy with 2 replicas" in log and "records a 16-sample probe batch instead" in log
    saved = np.load(tmp_path / "out.npz")
    x, y, weights = saved["x"][:16], saved["y"][:16], [saved[f"w{i}"] for i in range(4)]
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["fallback"] and sorted(run.stats["step"].unique()) == [1, 2]
    names = sorted(run.variables.index)          # hidden/bias, hidden/kernel, logits/bias, logits/kernel
    assert len(names) == 4
    # the probe runs after the step's update: step 2's variables are the trained weights
    by_name = {n: np.asarray(run.tensor(n, 2)) for n in names}
    hk, hb, lk, lb = (by_name[n] for n in (names[1], names[0], names[3], names[2]))
    for got, want in zip((hk, hb, lk, lb), weights):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    xb = tf.constant(x)
    hk, hb, lk, lb = map(tf.constant, (hk, hb, lk, lb))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([hk, hb, lk, lb])
        pre = tf.matmul(xb, hk) + hb
        hidden = tf.nn.relu(pre)
        logits = tf.matmul(hidden, lk) + lb
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    index = np.asarray(run.samples(2)["index"])
    np.testing.assert_array_equal(np.sort(index), np.arange(16))
    cat = run.tensors
    checked = 0
    for ref, op_type, layer in ((pre, "BiasAdd", "hidden"), (hidden, "Relu", "hidden"), (logits, "BiasAdd", "logits")):
        name = cat[(cat["op_type"] == op_type) & cat["keras_layer"].fillna("").str.endswith(layer)].index[0]
        np.testing.assert_allclose(run.tensor(name, 2), ref.numpy()[index], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(run.tensor(name, 2, "gradient"), tape.gradient(loss, ref).numpy()[index],
                                   rtol=1e-4, atol=1e-7, err_msg=name)
        checked += 1
    grads = dict(zip(names, tape.gradient(loss, [hb, hk, lb, lk])))
    for n in names:
        np.testing.assert_allclose(run.tensor(n, 2, "gradient"), grads[n].numpy(), rtol=1e-4, atol=1e-7, err_msg=n)
    assert checked == 3


def test_inspect_step_refuses_a_model_on_two_replicas_at_once(tmp_path):
    out = _task("loop", tmp_path / "r")
    assert "REFUSED: inspect_step of a model under MirroredStrategy with 2 replicas" in out
    assert "one-replica run" in out and not (tmp_path / "r").exists()
