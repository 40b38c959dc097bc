"""beta's update: the release's pseudo-gradient can diverge under SGD; the watch warns, the
stable option stays in range, and the watch does not change any value."""
import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from inspector.icnn import layer as icnn  # noqa: E402
from inspector.format import ICNN_COLLECTION  # noqa: E402

tf1 = tf.compat.v1


def _maps(rng, n=8, h=6, w=6, c=4):
    # One compact bump per map at a random place: a realistic post-ReLU map with a finite sqrtvar.
    x = np.zeros((n, h, w, c))
    for i in range(n):
        for k in range(c):
            r, q = rng.integers(0, h), rng.integers(0, w)
            x[i, r, q, k] = rng.uniform(0.5, 2.0)
            x[i, max(r - 1, 0), q, k] += 0.4 * rng.uniform(0, 1)
    return x


def _train_beta(steps=8, lr=0.05, batch=8, **kwargs):
    """Plain SGD on beta alone (its only gradient is the pseudo-gradient); beta after each step."""
    rng = np.random.default_rng(0)
    pos = np.arange(batch) % 2 == 0
    with tf.Graph().as_default():
        xp = tf1.placeholder(tf.float32, [batch, 6, 6, 4])
        post = icnn.conv_mask(xp, tf.constant(pos), 1.0, name="m", **kwargs)
        (beta,) = tf1.get_collection(icnn.BETA_COLLECTION)
        loss = tf.reduce_mean(tf.reduce_sum(post, axis=[1, 2, 3]))
        train = tf1.train.GradientDescentOptimizer(lr).minimize(loss, var_list=[beta])
        mask = tf1.get_default_graph().get_tensor_by_name("m/mask:0")
        betas, masks = [], []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            for _ in range(steps):
                _, m = sess.run([train, mask], {xp: _maps(rng, batch)})
                betas.append(sess.run(beta))
                masks.append(m)
    return np.array(betas), np.array(masks)


def test_release_update_diverges_at_lr_005_batch_8_and_is_warned_once(caplog):
    # k = lr * 0.05 * 1e4 / N = 3.125 > 2: each update overshoots by more than it corrects.
    with caplog.at_level(logging.WARNING, logger="tf_inspector.icnn"):
        betas, _ = _train_beta(steps=8)
    assert np.abs(betas[-1] - 2.25).max() > 10           # ran away from every target in [1.5, 3]
    warned = [r.getMessage() for r in caplog.records if r.name == "tf_inspector.icnn"]
    assert sum("outside [1.5, 3]" in m for m in warned) == 1, warned   # once, not once per step
    assert sum("consecutive updates" in m for m in warned) == 1, warned


def test_stable_update_stays_in_the_target_range_and_moves_toward_it(caplog):
    with caplog.at_level(logging.WARNING, logger="tf_inspector.icnn"):
        betas, masks = _train_beta(steps=20, beta_update="stable", beta_rate=0.3)
    assert betas.min() >= 1.5 and betas.max() <= 3.0
    assert masks.min() >= -1.0 and masks.max() <= 1.0
    assert np.abs(betas[-1] - 2.0).max() > 0.1           # it did move
    assert not [r for r in caplog.records if r.name == "tf_inspector.icnn"]


def test_stable_update_equals_its_formula():
    # One step from beta0: beta1 = beta0 + rate * (target - beta0), target from the release's rule.
    rng = np.random.default_rng(3)
    x = _maps(rng)
    pos = np.arange(8) % 2 == 0
    with tf.Graph().as_default():
        xt = tf.constant(x, tf.float64)
        post = icnn.conv_mask(xt, tf.constant(pos), 1.0, name="m", beta_update="stable", beta_rate=0.25)
        (beta,) = tf1.get_collection(icnn.BETA_COLLECTION)
        (dbeta,) = tf.gradients(tf.reduce_sum(post), [beta])
        g = tf1.get_default_graph()
        s, sv = g.get_tensor_by_name("m/strength:0"), g.get_tensor_by_name("m/sqrtvar:0")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            s_v, sv_v, db = sess.run([s, sv, dbeta])
            after = sess.run(beta)
    t = (s_v[pos] * sv_v[pos]).sum(0) / s_v[pos].sum(0)
    target = np.clip(3.0 / t, 1.5, 3.0)
    np.testing.assert_allclose(after, 2.0 + 0.25 * (target - 2.0), rtol=1e-12)
    np.testing.assert_array_equal(db, 0.0)


def test_default_is_bit_identical_with_and_without_the_watch():
    rng = np.random.default_rng(1)
    x, up = _maps(rng), rng.normal(size=(8, 6, 6, 4))
    pos = np.arange(8) % 3 == 0
    outs = []
    for watch in (True, False):
        with tf.Graph().as_default():
            xt = tf.constant(x, tf.float32)
            post = icnn.conv_mask(xt, tf.constant(pos), 2.0, name="m", beta_watch=watch)
            (beta,) = tf1.get_collection(icnn.BETA_COLLECTION)
            grads = tf.gradients(tf.reduce_sum(post * up.astype(np.float32)), [xt, beta])
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                outs.append(sess.run([post, *grads]))
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_bad_beta_options_are_refused():
    with tf.Graph().as_default():
        x = tf.zeros([2, 3, 3, 1])
        with pytest.raises(ValueError, match="beta_update must be one of"):
            icnn.conv_mask(x, tf.constant([True, False]), 1.0, beta_update="adam")
        with pytest.raises(ValueError, match=r"beta_rate must be a number in \(0, 1\)"):
            icnn.conv_mask(x, tf.constant([True, False]), 1.0, beta_update="stable", beta_rate=1.5)
        with pytest.raises(ValueError, match=r"got '0.1'"):   # e.g. read from a config file: refused, not cast
            icnn.conv_mask(x, tf.constant([True, False]), 1.0, beta_update="stable", beta_rate="0.1")
        assert not tf1.get_collection(ICNN_COLLECTION)


def test_diverging_beta_reaches_the_viewers_alerts(tmp_path):
    # The demo's network under SGD lr 0.05, batch 8: the DumpHook's statistics of beta_value
    # carry the divergence to analysis.run_alerts (the viewer's Summary).
    import inspector
    from inspector import analysis

    from examples import train_demo
    from examples.parts_data import make_parts_dataset

    images, labels, _ = make_parts_dataset(32, seed=1)
    alerts = {}
    for update in ("release", "stable"):
        params = dict(icnn=True, steps_per_epoch=4, optimizer="sgd", learning_rate=0.05, beta_update=update)
        hook_kwargs = dict(stats_every_n_steps=1, dump_every_n_steps=0, samples_per_group=1,
                           include=[r"^conv3/Relu:0$"], exclude=[r"/monitor/"])
        train_demo.train("icnn", tmp_path / update, tmp_path / f"m_{update}", images, labels, steps=6, batch=8,
                         seed=0, threads=1, hook_kwargs=hook_kwargs, params=params, use_estimator=False)
        alerts[update] = [a for a in analysis.run_alerts(inspector.open_run(tmp_path / update))
                          if a.kind == "icnn_beta_diverged"]
    assert len(alerts["release"]) == 1 and alerts["release"][0].tensor == "icnn_mask/beta_value:0"
    assert alerts["stable"] == []


def test_viewer_notes_what_gradients_mean_below_an_icnn_layer():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("streamlit")
    from viewer.app_pages.browser import icnn_gradient_note

    cat = pd.DataFrame({"icnn_role": [None, "pre_mask", "beta", None], "icnn_layer": [None, "m", "m", None],
                        "variable": [None, None, None, "m/beta"]},
                       index=["conv1/Relu:0", "m/pre_mask:0", "m/beta_value:0", "m/beta"])
    assert "not a pure d loss / d tensor" in icnn_gradient_note(cat, "conv1/Relu:0")
    assert "ICNN layer(s) m" in icnn_gradient_note(cat, "m/pre_mask:0")
    for beta in ("m/beta_value:0", "m/beta"):
        assert "pseudo-gradient" in icnn_gradient_note(cat, beta)
    plain = cat.assign(icnn_role=None, icnn_layer=None)
    assert icnn_gradient_note(plain, "conv1/Relu:0") is None


@pytest.mark.parametrize("share", [True, False])
def test_the_hooks_backward_pass_leaves_the_stable_update_alone(tmp_path, monkeypatch, share):
    """DumpHook's gradients are an observer's pass: with its own tf.gradients
    (share_gradients=False) or completing the optimizer's, the layer's side effects run once
    per step, in training's pass: beta and the weights are those of training without the
    hook, and the beta watch sees each step once (twice would reset its overshoot count)."""
    from hooks import DumpHook
    calls = []
    real = icnn.BetaWatch.__call__
    monkeypatch.setattr(icnn.BetaWatch, "__call__", lambda self, *a: calls.append(1) or real(self, *a))

    def train(hook: bool):
        rng = np.random.default_rng(0)
        pos = np.arange(8) % 2 == 0
        with tf.Graph().as_default():
            tf1.set_random_seed(0)
            xp = tf1.placeholder(tf.float32, [8, 6, 6, 4], name="x")
            w = tf1.get_variable("w", [3, 3, 4, 4], initializer=tf1.glorot_uniform_initializer(seed=1))
            top = tf.nn.relu(tf.nn.conv2d(xp, w, 1, "SAME"))
            post = icnn.conv_mask(top, tf.constant(pos), 1.0, name="m", beta_update="stable", beta_rate=0.3)
            loss = tf.reduce_mean(tf.reduce_sum(post, axis=[1, 2, 3]))
            step = tf1.train.get_or_create_global_step()
            train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
            (beta,) = tf1.get_collection(icnn.BETA_COLLECTION)
            hooks = [DumpHook(tmp_path / f"run{share}", loss=loss, stats_every_n_steps=1, dump_every_n_steps=2,
                              share_gradients=share, strict=True)] if hook else []
            with tf1.train.MonitoredTrainingSession(hooks=hooks) as sess:
                for _ in range(6):
                    sess.run(train_op, {xp: _maps(rng)})
                return sess.run_step_fn(lambda step_context: step_context.session.run([beta, w]))   # no hook in this read

    plain = train(False)
    assert len(calls) == 6
    hooked = train(True)
    assert len(calls) == 12                                        # 6 more: once a step with the hook too
    assert np.abs(plain[0] - 2.0).max() > 0.05                     # beta moved
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)
