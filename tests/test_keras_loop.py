"""inspect_step: a custom loop's step function (tf.function or eager) recorded on its own batch, each
value equal to an eager GradientTape on that batch and the weights the step started from, and training
unchanged by it (README's example included, run as pasted)."""
from __future__ import annotations

import logging
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import inspect_step  # noqa: E402
from test_keras import _data, _find, _oracle, sequential  # noqa: E402

import inspector  # noqa: E402

BATCH = 16
README = Path(__file__).resolve().parent.parent / "README.md"


def _var(w) -> str:
    """The run's name of a Keras variable (Keras 3's path, tf.keras's name without ':0')."""
    return getattr(w, "path", None) or w.name.split(":")[0]


def _twin(model, run, step: int, build=sequential):
    """A model holding the weights ``step`` of ``run`` started from (its dumped variable values)."""
    twin = build()
    twin(np.zeros((1,) + tuple(model.input_shape[1:]), np.float32))
    for v, w in zip(twin.trainable_variables, model.trainable_variables):
        v.assign(run.tensor(_var(w), step))
    return twin


def _loop(model, optimizer, eager: bool):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return train_step if eager else tf.function(train_step)


def _side_by_side(tmp_path, make, x, y, **kw):
    """A model trained through ``inspect_step(make(model), tmp_path / "r", model, **kw)`` beside a
    plain twin that starts from its weights and trains through ``make(twin)`` on the same batches:
    each step's loss (where the step returns one) and the final weights must be the twin's, since
    the wrapper must never change training. Returns the wrapper and the model."""
    model, plain = sequential(), sequential()
    plain.set_weights(model.get_weights())
    step, reference = inspect_step(make(model), tmp_path / "r", model, **kw), make(plain)
    with step:
        for i in range(0, len(x), BATCH):
            loss, want = step(x[i:i + BATCH], y[i:i + BATCH]), reference(x[i:i + BATCH], y[i:i + BATCH])
            if want is not None:
                np.testing.assert_allclose(loss, want, rtol=1e-6)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    return step, model


def _readme_example() -> str:
    text = README.read_text()
    section = text.split("## Custom training loops: `inspect_step`", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_records_its_steps_exactly(tmp_path, monkeypatch):
    """The README's loop, run as pasted: step 20's batch (x[96:128]), its variables' gradients and the
    dumped samples' values and d loss / d output equal a GradientTape's on the weights step 20 read."""
    script = tmp_path / "example.py"
    script.write_text(_readme_example())
    monkeypatch.chdir(tmp_path)
    keras.utils.set_random_seed(3)
    ns = runpy.run_path(str(script))
    model, x, y = ns["model"], ns["x"], ns["y"]
    run = inspector.open_run(tmp_path / "runs/loop1")
    assert run.status == "finished" and run.dump_steps() == [20, 40]
    assert sorted(run.stats["step"].unique()) == list(range(5, 41, 5))
    step, rows = 20, slice(96, 128)            # step 20: epoch 3's 4th batch of 32
    index = np.asarray(run.samples(step)["index"])
    assert len(index) == 4                    # 2 samples per group (the default)
    np.testing.assert_array_equal(run.samples(step)["label"], y[rows][index])
    np.testing.assert_array_equal(run.tensor(run.manifest["probe"]["inputs"][0], step), x[rows][index])
    twin = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    for v, w in zip(twin.trainable_variables, model.trainable_variables):
        v.assign(run.tensor(_var(w), step))
    xb = tf.constant(x[rows])
    with tf.GradientTape(persistent=True) as tape:
        hidden = tf.nn.relu(tf.matmul(xb, twin.layers[0].kernel) + twin.layers[0].bias)
        logits = tf.matmul(hidden, twin.layers[1].kernel) + twin.layers[1].bias
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y[rows], logits))
    for w, g in zip(model.trainable_variables, tape.gradient(loss, twin.trainable_variables)):
        np.testing.assert_allclose(run.tensor(_var(w), step, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7)
    cat = run.tensors
    for ref, op_type, layer in ((hidden, "Relu", model.layers[0].name), (logits, "BiasAdd", model.layers[1].name)):
        name = cat[(cat["op_type"] == op_type) & cat["keras_layer"].fillna("").str.endswith(layer)].index[0]
        np.testing.assert_allclose(run.tensor(name, step), ref.numpy()[index], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run.tensor(name, step, "gradient"), tape.gradient(loss, ref).numpy()[index],
                                   rtol=1e-4, atol=1e-7)
        mean = run.query_stats([name], kinds=["forward"], steps=(step, step), groups=["all"])["mean"]
        np.testing.assert_allclose(mean, [ref.numpy().mean()], rtol=1e-5)
    # the last step's update is what it left: the model's weights now minus those it read
    for w in model.trainable_variables:
        np.testing.assert_allclose(run.tensor(_var(w), 40) + run.tensor(_var(w), 40, "update"), w.numpy(),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("eager", [False, True], ids=["tf_function", "eager"])
def test_every_dumped_value_is_the_steps_own(tmp_path, eager):
    """Whole batches dumped at steps 2 and 3 (the last one smaller): every value and gradient of the
    model's ops equals the oracle's on that batch and the weights the step read; training is that of
    the same loop without the wrapper."""
    keras.utils.set_random_seed(5)
    x, y = _data(5, n=40)
    step, model = _side_by_side(tmp_path, lambda m: _loop(m, keras.optimizers.SGD(0.3), eager), x, y,
                                stats_every_n_steps=1, dump_steps=[2, 3], samples_per_group=BATCH, strict=True)
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["source"] == "train_batch" and step.step == 3
    assert sorted(run.stats["step"].unique()) == [1, 2, 3]
    for s, rows in ((2, slice(16, 32)), (3, slice(32, 40))):
        xb, yb = x[rows], y[rows]
        index = np.asarray(run.samples(s)["index"])
        np.testing.assert_array_equal(np.sort(index), np.arange(len(xb)))
        order = np.argsort(index)
        vals, grads, var_grads = _oracle("sequential", _twin(model, run, s), xb, yb)
        for w, g in zip(model.trainable_variables, var_grads):
            np.testing.assert_allclose(run.tensor(_var(w), s, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7)
        for key in vals:
            name = run.manifest["probe"]["inputs"][0] if key == "probe_x" else _find(run.tensors, key)
            np.testing.assert_allclose(np.asarray(run.tensor(name, s))[order], vals[key], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(np.asarray(run.tensor(name, s, "gradient"))[order], grads[key],
                                       rtol=1e-4, atol=1e-7, err_msg=f"{key} at {s}")
    for w in model.trainable_variables:   # step 2's read plus its update is step 3's read
        np.testing.assert_allclose(run.tensor(_var(w), 2) + run.tensor(_var(w), 2, "update"),
                                   run.tensor(_var(w), 3), rtol=1e-5, atol=1e-7)


def _gan():
    gen = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6, activation="tanh", name="g_out")], name="gen")
    disc = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu", name="d_hidden"),
                             keras.layers.Dense(1, name="d_logit")], name="disc")
    return gen, disc


def _gan_step(gen, disc, g_opt, d_opt):
    bce = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(real, noise):
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = gen(noise, training=True)
            real_out, fake_out = disc(real, training=True), disc(fake, training=True)
            g_loss = bce(tf.ones_like(fake_out), fake_out)
            d_loss = bce(tf.ones_like(real_out), real_out) + bce(tf.zeros_like(fake_out), fake_out)
        g_opt.apply_gradients(zip(g_tape.gradient(g_loss, gen.trainable_variables), gen.trainable_variables))
        d_opt.apply_gradients(zip(d_tape.gradient(d_loss, disc.trainable_variables), disc.trainable_variables))
        return g_loss, d_loss
    return train_step


@pytest.mark.parametrize("recorded", ["disc", "gen"])
def test_a_gan_records_the_loss_of_the_model_it_is_given(tmp_path, recorded):
    """Two tapes, two optimizers: the recorded model's gradients are those of the loss differentiated
    w.r.t. its own weights (the discriminator's d_loss, the generator's g_loss), and both models train
    as without the wrapper."""
    keras.utils.set_random_seed(9)
    rng = np.random.default_rng(9)
    real, noise = rng.normal(size=(4, 8, 6)).astype("float32"), rng.normal(size=(4, 8, 3)).astype("float32")
    (gen, disc), (gen2, disc2), (g_ref, d_ref) = _gan(), _gan(), _gan()
    for twins in ((gen2, g_ref), (disc2, d_ref)):
        for m in twins:
            m.set_weights((gen if twins[0] is gen2 else disc).get_weights())
    model = disc if recorded == "disc" else gen
    step = inspect_step(_gan_step(gen, disc, keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.2)),
                        tmp_path / "r", model, labels=lambda real, noise: None, stats_every_n_steps=1,
                        dump_steps=[3], samples_per_group=8, strict=True)
    plain = _gan_step(gen2, disc2, keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.2))
    replay = _gan_step(g_ref, d_ref, keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.2))
    with step:
        for i in range(4):
            step(real[i], noise[i])
            plain(real[i], noise[i])
            if i < 2:
                replay(real[i], noise[i])    # the weights step 3 starts from
    for a, b in zip(gen.get_weights() + disc.get_weights(), gen2.get_weights() + disc2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    run = inspector.open_run(tmp_path / "r")
    assert {_var(w) for w in model.trainable_variables} == set(run.variables.index)
    ref_model = d_ref if recorded == "disc" else g_ref
    for v, w in zip(ref_model.trainable_variables, model.trainable_variables):
        np.testing.assert_allclose(run.tensor(_var(w), 3), v.numpy(), rtol=1e-6, atol=1e-7)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    with tf.GradientTape(persistent=True) as tape:
        fake = g_ref(noise[2])
        real_out, fake_out = d_ref(real[2]), d_ref(fake)
        g_loss = bce(tf.ones_like(fake_out), fake_out)
        d_loss = bce(tf.ones_like(real_out), real_out) + bce(tf.zeros_like(fake_out), fake_out)
    loss = d_loss if recorded == "disc" else g_loss
    for w, g in zip(model.trainable_variables, tape.gradient(loss, ref_model.trainable_variables)):
        np.testing.assert_allclose(run.tensor(_var(w), 3, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7)


def test_gradient_accumulation_records_each_batchs_gradients_and_the_applied_update(tmp_path):
    """Gradients summed over k=2 batches and applied every second step (a tf.cond from autograph): a
    step's recorded gradients are its own batch's, its update zero where nothing was applied and the
    applied update where it was."""
    keras.utils.set_random_seed(11)
    x, y = _data(11, n=64)
    model = sequential()
    optimizer = keras.optimizers.SGD(0.5)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
    count = tf.Variable(0, trainable=False)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / 2
        for s, g in zip(sums, tape.gradient(loss, model.trainable_variables)):
            s.assign_add(g)
        count.assign_add(1)
        if count % 2 == 0:
            optimizer.apply_gradients(zip([tf.identity(s) for s in sums], model.trainable_variables))
            for s in sums:
                s.assign(tf.zeros_like(s))
        return loss

    with inspect_step(train_step, tmp_path / "r", model, stats_every_n_steps=1, dump_steps=[3, 4],
                      samples_per_group=BATCH, strict=True) as step:
        for i in range(0, 64, BATCH):
            step(x[i:i + BATCH], y[i:i + BATCH])
    run = inspector.open_run(tmp_path / "r")
    w3 = {_var(w): run.tensor(_var(w), 3) for w in model.trainable_variables}
    _, _, grads3 = _oracle("sequential", _twin(model, run, 3), x[32:48], y[32:48])
    _, _, grads4 = _oracle("sequential", _twin(model, run, 4), x[48:64], y[48:64])
    for w, g3, g4 in zip(model.trainable_variables, grads3, grads4):
        name = _var(w)
        np.testing.assert_allclose(run.tensor(name, 3, "gradient"), g3.numpy() / 2, rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(run.tensor(name, 3, "update"), 0)          # step 3 only accumulates
        np.testing.assert_array_equal(run.tensor(name, 4), w3[name])
        np.testing.assert_allclose(run.tensor(name, 4, "update"), -0.5 * (g3.numpy() + g4.numpy()) / 2,
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("in_scope", [False, True], ids=["outside_scope", "inside_scope"])
def test_strategy_run_on_one_replica_is_recorded_exactly(tmp_path, in_scope):
    """A distributed step (strategy.run of a replica step, compute_average_loss) on one replica, the
    loop run outside or inside strategy.scope(): the step's gradients and values are recorded as
    without a strategy (several replicas: tests/test_replicas.py)."""
    import contextlib
    keras.utils.set_random_seed(12)
    x, y = _data(12, n=48)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = sequential()
        optimizer = keras.optimizers.SGD(0.3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    batches = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))
    with strategy.scope() if in_scope else contextlib.nullcontext(), \
            inspect_step(train_step, tmp_path / "r", model, stats_every_n_steps=1, dump_steps=[2, 3],
                         samples_per_group=BATCH, strict=True) as step:
        for xb, yb in batches:
            step(xb, yb)
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.stats["step"].unique()) == [1, 2, 3]
    index = np.asarray(run.samples(2)["index"])
    np.testing.assert_array_equal(np.sort(index), np.arange(BATCH))
    vals, grads, var_grads = _oracle("sequential", _twin(model, run, 2), x[16:32], y[16:32])
    for w, g in zip(model.trainable_variables, var_grads):
        np.testing.assert_allclose(run.tensor(_var(w), 2, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7)
    name = _find(run.tensors, "logits/BiasAdd")
    np.testing.assert_allclose(np.asarray(run.tensor(name, 2))[np.argsort(index)], vals["logits/BiasAdd"],
                               rtol=1e-5, atol=1e-6)
    for w in model.trainable_variables:   # the update read after the step, outside the replica
        np.testing.assert_allclose(run.tensor(_var(w), 2) + run.tensor(_var(w), 2, "update"), run.tensor(_var(w), 3),
                                   rtol=1e-5, atol=1e-7)


def test_an_eager_step_that_cannot_be_traced_trains_on_unrecorded(tmp_path, caplog):
    """A step reading a value eagerly (``.numpy()``) cannot run as a traced function: the wrapper says
    so, records nothing, and every step still trains (as the function itself does)."""
    keras.utils.set_random_seed(2)
    x, y = _data(2, n=32)
    losses = []

    def make(m):
        optimizer, loss_fn = keras.optimizers.SGD(0.3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, m(x, training=True))
            losses.append(float(loss.numpy()))
            optimizer.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return train_step
    with caplog.at_level(logging.ERROR, "tf_inspector"):
        step, _ = _side_by_side(tmp_path, make, x, y, stats_every_n_steps=1)
    assert "tracing the step function with the capture failed" in step.disabled
    assert "inspect_step stops recording" in caplog.text
    assert len(losses) == 4 and not (tmp_path / "r").exists()   # 2 steps each, run eagerly; nothing written


def test_a_step_with_two_losses_of_one_model_stops_recording_and_trains_on(tmp_path, caplog):
    """Two targets differentiated w.r.t. the recorded model's variables (sharpness-aware
    minimization's two passes, say): which is the loss would be a guess, so recording stops, said
    once, and the loop trains as without the wrapper."""
    keras.utils.set_random_seed(6)
    x, y = _data(6, n=32)

    def make(m):
        optimizer, loss_fn = keras.optimizers.SGD(0.3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def train_step(x, y):
            with tf.GradientTape(persistent=True) as tape:
                logits = m(x, training=True)
                loss, other = loss_fn(y, logits), tf.reduce_mean(logits ** 2)
            grads = tape.gradient(loss, m.trainable_variables)
            extra = tape.gradient(other, m.trainable_variables)
            optimizer.apply_gradients(zip([g + 0.1 * e for g, e in zip(grads, extra)], m.trainable_variables))
        return train_step
    with caplog.at_level(logging.ERROR, "tf_inspector"):
        step, _ = _side_by_side(tmp_path, make, x, y, stats_every_n_steps=1)
    assert "differentiates 2 targets" in step.disabled and "inspect_step records a step" in step.disabled
    assert caplog.text.count("inspect_step stops recording") == 1


def test_arguments_are_checked(tmp_path):
    model = sequential()
    fn = _loop(model, keras.optimizers.SGD(0.1), eager=True)
    with pytest.raises(TypeError, match="model= must be the Keras model"):
        inspect_step(fn, tmp_path / "r", model=fn)
    with pytest.raises(TypeError, match="labels= must be a function"):
        inspect_step(fn, tmp_path / "r", model, labels=1)
    with pytest.raises(ValueError, match="initial_step must be an int >= 0.*-1"):
        inspect_step(fn, tmp_path / "r", model, initial_step=-1)
    with pytest.raises(TypeError, match="needs the step function"):
        inspect_step(None, tmp_path / "r", model)


def test_steps_continue_from_initial_step(tmp_path):
    keras.utils.set_random_seed(4)
    x, y = _data(4, n=32)
    model = sequential()
    with inspect_step(_loop(model, keras.optimizers.SGD(0.1), eager=False), tmp_path / "r", model,
                      initial_step=10, stats_every_n_steps=2) as step:
        for i in range(0, 32, 8):
            step(x[i:i + 8], y[i:i + 8])
    assert step.step == 14
    assert sorted(inspector.open_run(tmp_path / "r").stats["step"].unique()) == [12, 14]
