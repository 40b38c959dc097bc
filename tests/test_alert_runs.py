"""Alerts on real runs: a healthy batch-norm CNN with weight decay is silent; injected vanishing,
exploding, dead-ReLU and NaN faults are each flagged by the right alert kind."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import inspector  # noqa: E402
from hooks import DumpHook  # noqa: E402
from inspector import analysis  # noqa: E402
from tfmodels import BATCH, batch_images, batch_labels, bn_cnn  # noqa: E402

v1 = tf.compat.v1


def train_bn_cnn(path, steps: int = 40, stats_every: int = 2, nan_at: int | None = None, **model) -> inspector.Run:
    """``bn_cnn`` trained with SGD under MonitoredTrainingSession, statistics every few steps."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        loss = bn_cnn(x, y, **model)
        train_op = v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=gs)
        hook = DumpHook(path, loss=loss, labels=y, stats_every_n_steps=stats_every, dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], checkpoint_dir=None) as sess:
            for step in range(1, steps + 1):
                sess.run(train_op, {x: batch_images(step, nan=step == nan_at), y: batch_labels(step)})
    return inspector.open_run(path)


def kinds(run: inspector.Run) -> dict[str, list[analysis.Alert]]:
    out: dict[str, list[analysis.Alert]] = {}
    for a in analysis.run_alerts(run):
        out.setdefault(a.kind, []).append(a)
    return out


def test_healthy_run_is_silent_and_knows_its_structural_zeros(tmp_path):
    run = train_bn_cnn(tmp_path / "healthy")
    assert analysis.run_alerts(run) == []
    cat = run.tensors
    # the conv biases feed batch norm: their gradients are ~0 by construction, and recorded so
    zero = set(cat.index[cat["zero_gradient_expected"].astype(bool)])
    assert zero == {"block1/conv/ReadVariableOp:0", "block2/conv/ReadVariableOp:0"}
    # the bias variables are also read by the weight decay: their gradient is that, not ~0
    assert not cat.loc["block1/b", "zero_gradient_expected"] and "L2Loss" in cat.loc["block1/b", "feeds"]
    assert cat.loc["block1/conv:0", "feeds"] == ["FusedBatchNormV3"]
    g = run.query_stats(kinds=["gradient"], groups=["all"])
    tiny = g[g["tensor"].isin(zero)]["l2"]
    assert (tiny < 1e-5).all()  # what the old rules called "vanishing"
    # ... as were the weight-decay reads of the biases, and the span across every tensor
    old = {a.kind for a in analysis.gradient_alerts(run.query_stats(groups=["all"]))}
    assert "vanishing_gradient" in old or "gradient_ratio" in old


def test_injected_vanishing_gradient_is_found(tmp_path):
    found = kinds(train_bn_cnn(tmp_path / "vanish", steps=20, scale=1e-8))
    assert {a.tensor for a in found["vanishing_gradient"]} >= {"block1/relu:0", "block2/relu:0"}
    assert "exploding_gradient" not in found and "nonfinite" not in found


def test_injected_exploding_gradient_is_found(tmp_path):
    run = train_bn_cnn(tmp_path / "explode", steps=3, stats_every=1, scale=1e8)
    found = kinds(run)
    exploding = {a.tensor for a in found["exploding_gradient"]}
    assert "block2/relu:0" in exploding and exploding <= analysis.layer_outputs(run.tensors)
    assert found["exploding_gradient"][0].severity == "error" and "vanishing_gradient" not in found


def test_injected_dead_relu_is_found(tmp_path):
    found = kinds(train_bn_cnn(tmp_path / "dead", steps=20, dead_bias=-100.0))
    assert [a.tensor for a in found["dead_relu"]] == ["block2/relu:0"]
    assert set(found) == {"dead_relu"}  # the zero gradients below it are not "vanishing"


def test_injected_nan_is_found(tmp_path):
    found = kinds(train_bn_cnn(tmp_path / "nan", steps=6, stats_every=1, nan_at=4))
    nf = found["nonfinite"][0]
    assert nf.severity == "error" and nf.step == 4 and np.isfinite(nf.step)


def test_healthy_resnet8_with_weight_decay_is_silent(tmp_path):
    """bench/resnet.py's ResNet-8 (BN, weight decay, momentum): the run that showed 18 warnings."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("bench_resnet", Path(__file__).parents[1] / "bench" / "resnet.py")
    resnet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resnet)
    with tf.Graph().as_default():
        m = resnet.build_resnet(n=1, batch=16, hw=16, examples=64)
        hook = DumpHook(tmp_path / "resnet", loss=m.loss, labels=m.labels, stats_every_n_steps=3,
                        dump_every_n_steps=0, strict=True)
        with v1.train.MonitoredTrainingSession(hooks=[hook], checkpoint_dir=None) as sess:
            for _ in range(30):
                sess.run(m.train_op)
    run = inspector.open_run(tmp_path / "resnet")
    assert analysis.run_alerts(run) == []
    assert len(run.variables) == 25 and run.variables["has_update"].all()
    ratios = analysis.update_ratios(run.query_stats(kinds=["forward", "update"], groups=["all"]), run.tensors)
    assert ratios.shape[1] == 25 and ((ratios > 0) & (ratios < 1)).all().all()
