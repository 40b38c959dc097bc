"""A very short run of the demo: the hook's run holds the ICNN tensors with their roles."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")  # first: the imports below (noqa: E402) need TensorFlow

import inspector  # noqa: E402
from inspector.format import ICNN_ROLES  # noqa: E402

from examples import models, train_demo  # noqa: E402
from examples.parts_data import make_parts_dataset  # noqa: E402

STEPS, BATCH = 4, 8


def _train(tmp_path, kind, use_estimator):
    images, labels, _ = make_parts_dataset(64, seed=1)
    params = dict(icnn=(kind == "icnn"), steps_per_epoch=2)
    # Capture little besides the ICNN role tensors (which the hook always captures): the hook's
    # graph building grows with the number of tensors and this test is about the roles.
    hook_kwargs = dict(stats_every_n_steps=2, dump_every_n_steps=0, dump_steps=[STEPS], samples_per_group=2,
                       include=[r"^conv3/Relu:0$"], exclude=[r"/monitor/"])
    run_dir = tmp_path / "runs" / kind
    train_demo.train(kind, run_dir, tmp_path / "models" / kind, images, labels, steps=STEPS, batch=BATCH,
                     seed=0, threads=1, hook_kwargs=hook_kwargs, params=params, use_estimator=use_estimator)
    return inspector.open_run(run_dir), images, params


def _check_icnn_run(run):
    cat = run.tensors
    roles = cat[cat["icnn_role"].notna()]
    assert sorted(roles["icnn_role"]) == sorted(ICNN_ROLES)
    assert set(roles["icnn_layer"]) == {"icnn_mask"}
    layers = run.icnn_layers()
    assert layers["layer"].tolist() == ["icnn_mask"]
    row = layers.iloc[0]
    assert row["mask"] == "icnn_mask/mask:0" and row["post_mask"] == "icnn_mask/post_mask:0"
    assert STEPS in run.steps
    samples = run.samples(STEPS)
    k = len(samples)
    assert k > 0 and set(samples["group"]) <= {"positive", "negative", 0, 1}
    pre = run.tensor("icnn_mask/pre_mask:0", step=STEPS)
    mask = run.tensor("icnn_mask/mask:0", step=STEPS)
    post = run.tensor("icnn_mask/post_mask:0", step=STEPS)
    mu = run.tensor("icnn_mask/mu:0", step=STEPS)
    assert pre.shape == mask.shape == post.shape == (k, 12, 12, 32)
    assert mu.shape == (k, 32, 2) and np.all(np.abs(mu) <= 1)
    np.testing.assert_allclose(post, np.maximum(pre * mask, 0), rtol=1e-5, atol=1e-6)
    assert run.tensor("icnn_mask/beta_value:0", step=STEPS).shape == (32,)
    assert run.tensor("icnn_mask/filter_loss:0", step=STEPS).shape == (32,)
    # The gradient at the pre-mask map exists (it carries the filter-loss term); the mask has none.
    by_name = cat.set_index("name")
    assert bool(by_name.loc["icnn_mask/pre_mask:0", "has_gradient"])
    assert not bool(by_name.loc["icnn_mask/mask:0", "has_gradient"])
    g = run.tensor("icnn_mask/pre_mask:0", step=STEPS, kind="gradient")
    assert g.shape == pre.shape and np.all(np.isfinite(g)) and np.any(g != 0)


def test_short_demo_run_holds_icnn_tensors_with_roles(tmp_path):
    run, images, params = _train(tmp_path, "icnn", use_estimator=None)   # Estimator where it exists
    _check_icnn_run(run)
    pred = train_demo.predict(tmp_path / "models" / "icnn", images[:10], params, threads=1)
    assert pred["top"].shape == (10, 12, 12, 32) and np.all((pred["probability"] >= 0) & (pred["probability"] <= 1))


@pytest.mark.skipif(not models.has_estimator(), reason="without tf.estimator the test above already "
                                                       "uses MonitoredTrainingSession")
def test_short_demo_run_with_monitored_training_session(tmp_path):
    _check_icnn_run(_train(tmp_path, "icnn", use_estimator=False)[0])


def test_plain_twin_has_no_icnn_roles(tmp_path):
    run, _, _ = _train(tmp_path, "plain", use_estimator=False)
    assert run.tensors["name"].tolist() == ["conv3/Relu:0"]
    assert run.tensors["icnn_role"].isna().all()
    assert run.icnn_layers().empty
