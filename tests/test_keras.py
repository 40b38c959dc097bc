"""InspectCallback under tf.keras 2.15 and Keras 3: every captured value and gradient equals an
independent eager ``tf.GradientTape`` computation on the same probe batch and weights."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402

import inspector  # noqa: E402

KERAS3 = int(str(getattr(keras, "__version__", "2")).split(".")[0]) >= 3
N = 8           # probe samples
STEPS = 3       # training steps; the dump of the last one is checked against the final weights


def _data(seed=0, n=48, d=6):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype("float32")
    y = (x[:, 0] + 0.3 * rng.normal(size=n) > 0).astype("int32")
    return x, y


def sequential(name="seq"):
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                             keras.layers.Dense(2, name="logits")], name=name)


def functional():
    """A nested sub-model and a layer called twice."""
    inp = keras.Input((6,))
    shared = keras.layers.Dense(6, activation="tanh", name="shared")
    sub = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu", name="inner")], name="sub")
    h = sub(shared(shared(inp)))
    return keras.Model(inp, keras.layers.Dense(2, name="logits")(h), name="fun")


class Scale(keras.layers.Layer):
    """A custom layer with its own weight: x * exp(s)."""

    def build(self, shape):
        self.s = self.add_weight(name="s", shape=(shape[-1],), initializer="zeros")

    def call(self, x):
        return x * tf.exp(self.s)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="subm")
        self.hidden = keras.layers.Dense(5, name="hidden")
        self.scale = Scale(name="scale")
        self.out = keras.layers.Dense(2, name="logits")

    def call(self, x, training=False):
        return self.out(tf.nn.relu(self.scale(self.hidden(x))))


def _oracle(kind, model, x, y):
    """Eager forward pass written out from the layers' weights, under a GradientTape: the
    values and d loss / d value of the named intermediate tensors, and d loss / d variable."""
    x = tf.constant(x)
    dense = lambda layer, h: tf.matmul(h, layer.kernel) + layer.bias  # noqa: E731
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        vals = {}
        if kind == "sequential":
            vals["hidden/BiasAdd"] = dense(model.get_layer("hidden"), x)
            vals["hidden/Relu"] = tf.nn.relu(vals["hidden/BiasAdd"])
            vals["logits/BiasAdd"] = dense(model.get_layer("logits"), vals["hidden/Relu"])
        elif kind == "functional":
            shared, inner = model.get_layer("shared"), model.get_layer("sub").get_layer("inner")
            vals["shared/Tanh#0"] = tf.tanh(dense(shared, x))
            vals["shared/Tanh#1"] = tf.tanh(dense(shared, vals["shared/Tanh#0"]))
            vals["sub/inner/Relu"] = tf.nn.relu(dense(inner, vals["shared/Tanh#1"]))
            vals["logits/BiasAdd"] = dense(model.get_layer("logits"), vals["sub/inner/Relu"])
        else:
            vals["hidden/BiasAdd"] = dense(model.hidden, x)
            vals["scale/Mul"] = vals["hidden/BiasAdd"] * tf.exp(model.scale.s)
            vals["logits/BiasAdd"] = dense(model.out, tf.nn.relu(vals["scale/Mul"]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.constant(y), vals["logits/BiasAdd"]))
        vals["probe_x"] = x
    grads = dict(zip(vals, tape.gradient(loss, list(vals.values()))))
    var_grads = tape.gradient(loss, model.trainable_variables)
    return {k: v.numpy() for k, v in vals.items()}, {k: g.numpy() for k, g in grads.items()}, var_grads


def _find(cat, key: str) -> str:
    """Catalog name of the oracle's ``layer/OpType[#call]`` (names differ between Keras versions)."""
    if key == "probe_x":
        return "probe_x:0"
    path, op_type = key.split("#")[0].rsplit("/", 1)
    call = int(key.split("#")[1]) if "#" in key else 0
    rows = cat[(cat["op_type"] == op_type) & cat["keras_layer"].fillna("").str.endswith(path)
               & (cat["keras_call"] == call)]
    assert len(rows) == 1, (key, rows["name"].tolist())
    return rows.index[0]


BUILD = {"sequential": sequential, "functional": functional, "subclassed": Subclassed}


@pytest.mark.parametrize("kind", sorted(BUILD))
def test_values_and_gradients_match_gradient_tape(tmp_path, kind):
    keras.utils.set_random_seed(1)
    x, y = _data()
    model = BUILD[kind]()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "run", probe=(x[:N], y[:N]), stats_every_n_steps=1, dump_steps=[STEPS],
                         samples_per_group=N, strict=True)
    hist = model.fit(x, y, batch_size=16, epochs=1, callbacks=[cb], verbose=0)
    run = inspector.open_run(tmp_path / "run")
    assert run.status == "finished" and run.manifest["source"] == "keras"
    assert run.dump_steps() == [STEPS]
    np.testing.assert_array_equal(run.samples(STEPS)["index"], np.arange(N))
    cat = run.tensors
    vals, grads, var_grads = _oracle(kind, model, x[:N], y[:N])
    for key in vals:
        name = _find(cat, key)
        np.testing.assert_allclose(run.tensor(name, STEPS), vals[key], rtol=1e-5, atol=1e-6, err_msg=key)
        np.testing.assert_allclose(run.tensor(name, STEPS, "gradient"), grads[key], rtol=1e-4, atol=1e-7,
                                   err_msg=key)
    variables = run.variables
    assert len(variables) == len(model.trainable_variables)
    reads = cat[(cat["kind"] == "tensor") & cat["variable"].notna()]
    assert set(reads["variable"]) == set(variables.index)   # every variable's reads name it
    for v, g in zip(model.trainable_variables, var_grads):
        name = getattr(v, "path", None) or v.name.split(":")[0]
        np.testing.assert_allclose(run.tensor(name, STEPS), v.numpy(), rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(run.tensor(name, STEPS, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7, err_msg=name)
    assert np.isfinite(hist.history["loss"][0])


def test_update_is_the_step_delta_and_groups_match_numpy(tmp_path):
    keras.utils.set_random_seed(2)
    x, y = _data(1)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # one epoch of 3 steps; a dump at step 3 (its update: value after step 3 minus after step 2)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "r", probe=(x[:N], y[:N]), stats_every_n_steps=1,
                                         dump_steps=[2, 3], samples_per_group=N, strict=True)])
    run = inspector.open_run(tmp_path / "r")
    for v in model.trainable_variables:
        name = getattr(v, "path", None) or v.name.split(":")[0]
        np.testing.assert_allclose(run.tensor(name, 3, "update"), run.tensor(name, 3) - run.tensor(name, 2),
                                   rtol=1e-5, atol=1e-7)
    relu = _find(run.tensors, "hidden/Relu")
    values = np.asarray(run.tensor(relu, 3)).reshape(N, -1)
    pos = y[:N] != 0
    stats = run.stats
    rows = stats[(stats["tensor"] == relu) & (stats["step"] == 3) & (stats["kind"] == "forward")]
    for group, mask in (("all", np.ones(N, bool)), ("positive", pos), ("negative", ~pos)):
        row = rows[rows["group"] == group].iloc[0]
        part = values[mask]
        np.testing.assert_allclose([row["mean"], row["std"], row["min"], row["max"], row["count"]],
                                   [part.mean(), part.std(), part.min(), part.max(), part.size], rtol=1e-6,
                                   err_msg=group)


def test_probe_does_not_change_reported_loss(tmp_path):
    """fit's History is the same with and without the callback (the loss tracker is restored)."""
    x, y = _data(3)

    def train(callbacks):
        keras.utils.set_random_seed(3)
        m = sequential()
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(True))
        return m.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=callbacks).history["loss"]

    plain = train([])
    probed = train([InspectCallback(tmp_path / "r", probe=(x[:N], 1 - y[:N]), stats_every_n_steps=1, strict=True)])
    np.testing.assert_allclose(probed, plain, rtol=1e-6)


def test_bad_probe_is_refused(tmp_path):
    with pytest.raises(ValueError, match="probe has 4 elements"):
        InspectCallback(tmp_path / "r", probe=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="leading batch axis"):
        InspectCallback(tmp_path / "r", probe=(np.float32(1.0), np.int32(0)))


def test_a_probe_the_model_cannot_take_is_named(tmp_path):
    """A probe with the wrong feature count logged only Keras's
    own message, which does not say that the probe is what is wrong."""
    x, y = _data(22)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", probe=(x[:8, :4], y[:8]), stats_every_n_steps=1, strict=True)
    with pytest.raises(ValueError, match=r"could not run on probe= \(x, y shapes \[\(8, 4\), \(8,\)\]\)"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    alone = InspectCallback(tmp_path / "r2", probe=x[:8, :4], stats_every_n_steps=1, strict=True)   # no targets
    with pytest.raises(ValueError, match=r"could not run on probe= \(x, y shapes \[\(8, 4\), None\]\)"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[alone])


def test_keras_on_another_backend_is_refused(tmp_path, monkeypatch):
    """Keras 3 may run on JAX or PyTorch; the capture traces a TensorFlow graph, so the callback
    says which backend it needs instead of failing inside fit."""
    monkeypatch.setattr(tf.keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match="runs on 'jax': set KERAS_BACKEND=tensorflow"):
        InspectCallback(tmp_path / "r", source="train_batch")


class Gate(keras.layers.Layer):
    """A custom layer with a TF2 tf.cond on a tensor predicate."""

    def call(self, x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: tf.tanh(x))


def _fit_gate(path, optimizer=None, **filters) -> inspector.Run:
    """One epoch of a model with a :class:`Gate`, statistics of each training batch."""
    x, y = _data(22)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="hidden"), Gate(name="gate"),
                              keras.layers.Dense(2, name="logits")])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(path, source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0, strict=True,
                         **filters)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    return inspector.open_run(path)


def test_a_tf_cond_in_a_custom_layer_is_captured_not_skipped(tmp_path, caplog):
    """The If op's output cond:0 (marked not fetchable by TensorFlow) was
    listed as skipped although its value is captured as cond/Identity:0."""
    with caplog.at_level("INFO", logger="tf_inspector"):
        run = _fit_gate(tmp_path / "r")
    gate = run.tensors[run.tensors["keras_layer"].fillna("").str.endswith("gate")]
    identity = gate.index[gate["op_type"] == "Identity"].tolist()
    assert len(identity) == 1 and identity[0].endswith("cond/Identity:0")
    # the branches' own ops run inside functions: listed, never cond:0 itself
    skipped = run.manifest["skipped"]
    assert all("/then_branch/" in n or "/else_branch/" in n for n in skipped), skipped
    assert any(n.endswith("Tanh:0") and "/else_branch/" in n for n in skipped), skipped
    assert f"{identity[0].rpartition('/Identity')[0]}:0 as {identity[0]}" in caplog.text


def test_only_the_models_unfetchable_tensors_are_listed_as_skipped(tmp_path):
    """With the Identity left out by the filters, the model's cond:0 is skipped; the backward
    pass's If (under a LossScaleOptimizer tf.keras 2.15's tape builds gradient_tape/..., in
    the traced train step) is no candidate and is not listed."""
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    run = _fit_gate(tmp_path / "r", optimizer, exclude=r"Identity")
    # Keras 3 numbers its scopes: .../gate_1/cond:0; the branches' insides are listed too
    [skipped] = [n for n in run.manifest["skipped"] if "_branch/" not in n]
    assert skipped.endswith("/cond:0") and "/gate" in skipped


def test_a_callback_reused_for_another_model_warns(tmp_path, caplog):
    """One callback reused in a sweep loop spliced the second
    model's steps into the first's training with a warning about compile(). It names both
    models now (a rebuilt model resuming one training has another name too: not refused)."""
    x, y = _data(21)
    a, b = sequential(name="model_a"), sequential(name="model_b")
    for m in (a, b):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    with caplog.at_level("WARNING", logger="tf_inspector"):
        a.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[cb])
        a.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
        assert "was used with model" not in caplog.text
        b.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    assert "was used with model 'model_a'" in caplog.text and "trains model 'model_b'" in caplog.text


def test_a_new_callback_hiding_earlier_steps_warns(tmp_path, caplog):
    """compile() and a new callback on the same run directory
    started again at step 1, and its rows hid the first training's silently. Meant for a
    resume from a checkpoint, so it is not refused: the callback warns at its first write."""
    x, y = _data(23)
    model = sequential()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    first = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    with caplog.at_level("WARNING", logger="tf_inspector"):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[first])     # 1-6
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[first])     # 7-9: its own, no warning
    assert "hide" not in caplog.text
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    with caplog.at_level("WARNING", logger="tf_inspector"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                  callbacks=[InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1)])
    assert "already holds steps up to 9 (session 2); this callback writes from step 1 on" in caplog.text


class TwoHeads(keras.layers.Layer):
    """A custom layer with two outputs: class logits and a regression value."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.cls = keras.layers.Dense(2, name="cls")
        self.reg = keras.layers.Dense(1, name="reg")

    def call(self, h):
        return self.cls(h), self.reg(h)


def test_multi_output_layer_and_weighted_losses(tmp_path):
    """Two outputs of one custom layer, two losses with loss_weights: the probe's loss and the
    gradient at the shared trunk equal the tape's on sum_i w_i * loss_i."""
    keras.utils.set_random_seed(4)
    x, y = _data(4)
    r = x[:, 1:2] * 2.0
    inp = keras.Input((6,))
    trunk = keras.layers.Dense(5, activation="relu", name="trunk")(inp)
    cls, reg = TwoHeads(name="heads")(trunk)
    model = keras.Model(inp, [cls, reg], name="multi")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss_weights=[1.0, 0.5],
                  loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.losses.MeanSquaredError()])
    cb = InspectCallback(tmp_path / "m", probe=(x[:N], [y[:N], r[:N]]), positive=lambda t: t[0] != 0,
                         stats_every_n_steps=1, dump_steps=[STEPS], samples_per_group=N, strict=True)
    model.fit(x, [y, r], batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "m")
    cat = run.tensors
    xt = tf.constant(x[:N])
    trunk_layer, heads = model.get_layer("trunk"), model.get_layer("heads")
    with tf.GradientTape() as tape:
        h = tf.nn.relu(tf.matmul(xt, trunk_layer.kernel) + trunk_layer.bias)
        tape.watch(h)
        logits = tf.matmul(h, heads.cls.kernel) + heads.cls.bias
        value = tf.matmul(h, heads.reg.kernel) + heads.reg.bias
        loss = (tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.constant(y[:N]), logits))
                + 0.5 * tf.reduce_mean(tf.square(value - r[:N])))
    grad_h = tape.gradient(loss, h).numpy()
    np.testing.assert_allclose(run.tensor(run.manifest["loss"], STEPS), loss.numpy(), rtol=1e-5)
    relu = _find(cat, "trunk/Relu")
    np.testing.assert_allclose(run.tensor(relu, STEPS), h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.tensor(relu, STEPS, "gradient"), grad_h, rtol=1e-4, atol=1e-7)
    owned = cat[cat["keras_layer"].fillna("").str.endswith("heads/cls") & (cat["op_type"] == "BiasAdd")]
    assert len(owned) == 1
    groups = run.samples(STEPS)["group"]
    assert (groups == np.where(y[:N] != 0, "positive", "negative")).all()


def test_positive_array_must_match_the_probe(tmp_path):
    x, y = _data(5)
    model = sequential()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", probe=(x[:N], y[:N]), positive=[True, False], strict=True)
    with pytest.raises(ValueError, match=r"\[N\] = \[8\]"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    flags = np.arange(N) < 3
    model = sequential()   # the failed fit above ran a step: a fresh model starts at step 1
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "s", probe=(x[:N], y[:N]), positive=flags, stats_every_n_steps=0,
                         dump_steps=[1], samples_per_group=N, strict=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    groups = inspector.open_run(tmp_path / "s").samples(1)["group"]
    assert (groups == np.where(flags, "positive", "negative")).all()


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_a_new_compile_continues_the_steps(tmp_path, source):
    """Fine-tuning: fit, compile() again (a new optimizer counting from 0), fit again. The
    second fit's steps continue after the first's, so no step of the first training is hidden
    by the later session (a curve spliced from two trainings); the manifest gives the offset.
    Fitting again with the same optimizer, or restoring its count, keeps steps = iterations."""
    x, y = _data(3)
    model = sequential()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    probe = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=0, strict=True, **probe)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])            # steps 1-3
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])            # same optimizer: 4-6
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])            # new one: 7-9, not 1-3
    assert int(model.optimizer.iterations.numpy()) == 3
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == list(range(1, 10))
    stats = run.query_stats(kinds=["forward"], groups=["all"])
    assert stats.groupby("step")["session"].first().tolist() == [1] * 3 + [2] * 3 + [3] * 3
    assert [m["step_offset"] for _, m in sorted(run.manifests.items(), key=lambda kv: kv[0][1])] == [0, 0, 6]
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 3], [4, 6], [7, 9]]


class _Weights(keras.callbacks.Callback):
    """The trainable weights at each batch's end (placed before InspectCallback)."""

    def on_train_batch_begin(self, batch, logs=None):
        self.before = [v.numpy() for v in self.model.trainable_variables]

    def on_train_batch_end(self, batch, logs=None):
        self.after = [v.numpy() for v in self.model.trainable_variables]


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_fine_tuning_records_the_new_loss_and_the_unfrozen_layer(tmp_path, source):
    """Fit with a frozen layer, unfreeze it, compile() with another loss,
    fit again. The probe kept its first trace (the old loss's gradients, a third of the new
    ones; no records of the unfrozen layer's variables) and the step capture raised out of fit
    (its catalog taken for the first trace's). Both trace the new step now."""
    x, y = _data(4, n=32)
    model = sequential()
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.get_layer("hidden").trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=sce)
    probe = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_every_n_steps=1, samples_per_group=16, **probe)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    model.get_layer("hidden").trainable = True

    def triple(y_true, y_pred):
        return 3.0 * sce(y_true, y_pred)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=triple)
    weights = _Weights()
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[weights, cb])
    run = inspector.open_run(tmp_path / "r")
    step = run.dump_steps()[-1]
    assert step == 4 and run.manifests[("chief", 2)]["first_nonfinite"] is None
    names = [getattr(v, "path", None) or v.name.split(":")[0] for v in model.trainable_variables]
    assert len(names) == 4 and set(names) <= set(run.variables.index)
    if source == "train_batch":   # the step's gradient: what SGD(0.1) applied
        expected = [(b - a) / 0.1 for a, b in zip(weights.after, weights.before)]
    else:                         # the probe's, after the step, of the new loss
        with tf.GradientTape() as tape:
            loss = triple(y[:N], model(x[:N], training=False))
        expected = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    for name, g in zip(names, expected):
        np.testing.assert_allclose(run.tensor(name, step, "gradient"), g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_train_step_that_sets_trainable_itself_is_not_refused(tmp_path, caplog):
    """tf.keras 2.15: a custom train_step that unfreezes a layer, trains
    every variable and freezes it again (a GAN's habit) had its second fit refused as "does
    not update logits", though the logits trained. tf.keras 2.15's fit reports what trains;
    Keras 3 keeps its own check (a refusal there names compile())."""
    x, y = _data(23, n=48)

    class Toggling(keras.Model):
        def __init__(self):
            super().__init__(name="toggling")
            self.hidden, self.head = keras.layers.Dense(5, activation="relu", name="hidden"), keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.head(self.hidden(x))

        def train_step(self, data):
            x, y = data
            self.head.trainable = True
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(y, self(x, training=True))
            weights = self.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
            self.head.trainable = False
            return {"loss": loss}

    if KERAS3:
        pytest.skip("tf.keras 2.15's train_step (compiled_loss); Keras 3 refuses a flag changed since the trace")
    model = Toggling()
    model(x[:1])   # built: its weights exist before the first fit
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", probe=(x[:8], y[:8]), stats_every_n_steps=1, dump_every_n_steps=0)
    with caplog.at_level(logging.ERROR, logger="tf_inspector"):
        for _ in range(2):
            before = [w.numpy().copy() for w in model.head.weights]
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
            assert not all(np.array_equal(b, w.numpy()) for b, w in zip(before, model.head.weights))   # it trains
    assert not [r for r in caplog.records if r.name == "tf_inspector"]
    assert sorted(inspector.open_run(tmp_path / "r").stats_steps()) == list(range(1, 7))


@pytest.mark.parametrize("source", ["probe", "train_batch"])
@pytest.mark.parametrize("freeze", [True, False])
def test_trainable_changed_without_compile_is_refused(tmp_path, caplog, source, freeze):
    """Keras 3: a layer frozen without compile() again still trains (fit
    reuses its train step, traced with the layer trainable), and the probe's records silently
    left its weights out; unfrozen, it does not train, and its records showed it. Refused: one
    error naming the variables and saying to compile() again. tf.keras 2.15's fit trains the
    layers as compile() left them, and the records hold exactly those."""
    x, y = _data(21, n=64)
    model = sequential()
    model.get_layer("hidden").trainable = freeze
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    probe = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=2, dump_every_n_steps=2, **probe)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])   # steps 1-4
    model.get_layer("hidden").trainable = not freeze
    name = {id(v): getattr(v, "path", None) or v.name.split(":")[0] for v in model.weights}
    before = {id(v): v.numpy() for v in model.weights}
    with caplog.at_level("ERROR", logger="tf_inspector"):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])   # steps 5-8
    trained = {name[id(v)] for v in model.weights if not np.array_equal(before[id(v)], v.numpy())}
    hidden = {n for n in name.values() if "hidden" in n}
    run = inspector.open_run(tmp_path / "r")
    assert (hidden <= trained) == freeze   # what fit trains: the layers trainable at compile()
    if not KERAS3:   # and tf.keras 2.15's model.trainable_variables in fit: recorded, updates and all
        # (TensorFlow's own retracing warning may come, after other tests: only ours count)
        assert not [r for r in caplog.records if r.name == "tf_inspector"]
        assert list(run.stats_steps()) == list(range(2, 9, 2))
        for step in (6, 8):
            assert {k.partition("/")[2] for k in run.dump_keys(step) if k.startswith("update/")} == trained
        return
    assert list(run.stats_steps()) == [2, 4]   # the second fit is refused, not recorded as trainable says
    says = "still updates" if freeze else "does not update"
    assert f"{says} {', '.join(sorted(hidden, reverse=True))} (trainable={not freeze} now)" in caplog.text
    assert "Call model.compile(...) again" in caplog.text and caplog.text.count("ERROR") == 1


@pytest.mark.parametrize("source", ["probe", "train_batch"])
@pytest.mark.parametrize("scale", [2.0 ** 15, 2.0 ** 60])
def test_mixed_precision_gradients_are_the_loss_scaled_ones(tmp_path, source, scale):
    """Under mixed_float16 the capture differentiated the unscaled loss in
    float16, so small gradients read 0 (a ReLU layer's 87% zeros; the optimizer's loss-scaled
    gradients had none). Now d (loss * scale) / d t / scale in float32, as the optimizer
    applies them; where that overflows (a scale of 2^60: the step LossScaleOptimizer skips),
    the unscaled gradient, never a NaN/Inf the training did not have."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64, 8)).astype("float32")
        y = (x[:, :1] * 0.01).astype("float32")   # small targets: gradients below float16's range
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="h1"),
                                  keras.layers.Dense(1, dtype="float32", name="out",
                                                     kernel_initializer=keras.initializers.RandomNormal(stddev=1e-3))])
        opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1e-3), initial_scale=scale)
        model.compile(optimizer=opt, loss="mse")
        weights = [w.numpy() for w in model.weights]
        kw = {"probe": (x, y), "positive": np.arange(64) % 2 == 0} if source == "probe" else {"source": "train_batch"}
        cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_steps=[1], samples_per_group=64, strict=True,
                             **kw)
        model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
        if source == "train_batch":   # the step's own gradients: on the weights it started from
            for w, v in zip(model.weights, weights):
                w.assign(v)
        with tf.GradientTape(persistent=True) as tape:
            h = model.get_layer("h1")(tf.convert_to_tensor(x))
            tape.watch(h)
            loss = tf.reduce_mean(tf.square(tf.cast(model.get_layer("out")(h), tf.float32) - y))
            scaled = loss * scale
        applied = tf.cast(tape.gradient(scaled, h), tf.float32).numpy() / scale
        unscaled = tf.cast(tape.gradient(loss, h), tf.float32).numpy()
        expected = np.where(np.isfinite(applied), applied, unscaled)
        run = inspector.open_run(tmp_path / "r")
        name = _find(run.tensors, "h1/Relu")
        index = np.asarray(run.samples(1)["index"])
        got = run.tensor(name, 1, "gradient")
        assert got.dtype == np.float32 and run.manifest["first_nonfinite"] is None
        np.testing.assert_allclose(got, expected[index], rtol=2e-3, atol=1e-12)
        assert np.mean(got == 0) == np.mean(expected[index] == 0)
        assert (scale > 2 ** 40) == (not np.isfinite(applied).all())   # the 2^60 case did overflow
        # capturing float32 tensors only (no float16 one): the variables' gradients still come
        # through the float16 backward pass and are taken through the scale
        if scale < 2 ** 40:
            cb32 = InspectCallback(tmp_path / "f32", stats_every_n_steps=1, dump_every_n_steps=1,
                                   samples_per_group=64, strict=True, dtypes=[tf.float32], **kw)
            for w, v in zip(model.weights, weights):
                w.assign(v)
            model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[cb32])
            if source == "train_batch":   # the step's gradient: on the weights it started from
                for w, v in zip(model.weights, weights):
                    w.assign(v)
            kernel = model.get_layer("h1").kernel
            with tf.GradientTape() as tape:
                scaled = tf.reduce_mean(tf.square(tf.cast(model(x), tf.float32) - y)) * scale
            want = tape.gradient(scaled, kernel).numpy() / scale
            run = inspector.open_run(tmp_path / "f32")
            name = getattr(kernel, "path", None) or kernel.name.split(":")[0]
            np.testing.assert_allclose(run.tensor(name, run.steps[0], "gradient"), want, rtol=2e-3, atol=1e-12)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_steps_a_loss_scale_optimizer_skips_still_count(tmp_path, caplog):
    """Under mixed precision Keras 3's LossScaleOptimizer does not count the
    steps it skips (the loss scale overflowing float16), so a second fit started from
    optimizer.iterations again: its session rewrote steps 1-4 and hid the first fit's rows.
    Each batch is a step; the next fit continues from the callback's count."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        y = np.round(20.0 + 2.0 * x[:, :1]).astype("float32")      # mse ~400: its scaled gradients overflow
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=keras.optimizers.SGD(1e-6), loss="mse")
        cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0,
                             positive=lambda t: t[:, 0] > 20.0)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
        counted = int(model.optimizer.iterations.numpy())
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == list(range(1, 9))
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 4], [5, 8]]
    assert ("does not count the steps it skips" in caplog.text) == (counted < 4)


def test_a_probe_in_training_mode_leaves_the_dropout_masks_of_training(tmp_path):
    """Under Keras 3 a probe with training=True drew its dropout masks from
    the model's seed generator, so every later training step drew other masks: the trained
    weights differed from a fit without the callback. The seed states are put back now."""
    x, y = _data(7, n=48)

    def fit(callbacks):
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                                  keras.layers.Dropout(0.5, name="drop"), keras.layers.Dense(2, name="logits")])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return model, history.history["loss"]
    plain, plain_loss = fit([])
    cb = InspectCallback(tmp_path / "r", probe=(x[:N], y[:N]), training=True, stats_every_n_steps=1,
                         dump_every_n_steps=2, strict=True)
    probed, probed_loss = fit([cb])
    np.testing.assert_allclose(probed_loss, plain_loss, rtol=1e-6)
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(np.asarray(a.numpy()), np.asarray(b.numpy()), rtol=1e-6, atol=1e-7, err_msg=a.name)
    assert inspector.open_run(tmp_path / "r").stats["step"].max() == 6


def test_trainable_changed_without_compile_is_refused_for_a_new_callback_too(tmp_path, caplog):
    """Found in review: the refusal knew only the train functions its own callback saw traced,
    so a new callback per fit (a notebook cell run again) recorded a layer frozen without
    compile() as not training while Keras 3 kept training it, unrefused."""
    x, y = _data(22, n=64)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[InspectCallback(tmp_path / "r", probe=(x[:N], y[:N]),
                                                                                    stats_every_n_steps=2)])
    model.get_layer("hidden").trainable = False
    with caplog.at_level("ERROR", logger="tf_inspector"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[InspectCallback(
            tmp_path / "r", probe=(x[:N], y[:N]), stats_every_n_steps=2)])
    refused = "still updates" in caplog.text
    assert refused == KERAS3   # tf.keras 2.15's fit trains (and records) the layers as compile() left them


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_where_the_batch_axis_is_lost_before_the_output_is_said(tmp_path, caplog, source):
    """After a layer reversing the batch's order the logits are not per-sample,
    so they had group 'all' rows only and were dumped whole, with no word; a plain model's
    output keeps its groups and nothing is said."""
    keras.utils.set_random_seed(9)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(16, 5, 3)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    inp = keras.Input((5, 3))
    rev = keras.layers.Lambda(lambda t: tf.reverse(t, axis=[0]), name="rnn")   # rows no longer samples
    model = keras.Model(inp, keras.layers.Dense(2, name="logits")(keras.layers.Flatten()(rev(inp))), name="rnnm")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, strict=True, **kw)
    model.fit(x, y, batch_size=N, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    assert caplog.text.count("the batch axis of rnnm is lost at") == 1   # once, not every trace
    run = inspector.open_run(tmp_path / "r")
    logits = _find(run.tensors, "logits/BiasAdd")
    assert set(run.query_stats([logits])["group"]) == {"all"}   # what the warning says
    caplog.clear()
    plain = sequential()
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x2, y2 = _data(9)
    kw = {"probe": (x2[:N], y2[:N])} if source == "probe" else {"source": "train_batch"}
    plain.fit(x2, y2, batch_size=N, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "p", stats_every_n_steps=1, strict=True, **kw)])
    assert "batch axis" not in caplog.text


class FoldTime(keras.layers.Layer):
    """A Dense applied per time step by folding time into the batch: [B, T, F] -> [B*T, F] -> back."""

    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(shape[-1], 4))

    def call(self, h):
        rows = tf.nn.relu(tf.matmul(tf.reshape(h, [-1, h.shape[-1]]), self.w))
        return tf.reshape(rows, [-1, h.shape[1], 4])


@pytest.mark.parametrize("layer", ["fold", "time_distributed"])
@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_groups_come_back_after_the_batch_is_merged_with_time(tmp_path, caplog, source, layer):
    """After a reshape merging the batch with time (a folding layer,
    TimeDistributed: a reshape under tf.keras, a time-major transpose under Keras 3) every
    later tensor, the logits included, had group 'all' only. The batch is carried back: the
    logits have their groups, and a warning names where it left axis 0."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 5, 3)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    inp = keras.Input((5, 3))
    seq = FoldTime(name="fold")(inp) if layer == "fold" else \
        keras.layers.TimeDistributed(keras.layers.Dense(4, activation="relu"), name="fold")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="logits")(keras.layers.Flatten()(seq)), name="tm")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    model.fit(x, y, batch_size=N, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "r", stats_every_n_steps=1, strict=True, **kw)])
    run = inspector.open_run(tmp_path / "r")
    assert set(run.query_stats([_find(run.tensors, "logits/BiasAdd")])["group"]) == {"all", "positive", "negative"}
    assert "the batch axis of tm leaves axis 0 at" in caplog.text and "comes back before the output" in caplog.text
    assert "fold" in caplog.text.split("leaves axis 0 at")[1].split("(")[0]


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_an_rnns_loop_body_is_listed_as_skipped(tmp_path, source):
    """An LSTM's gates run inside a TF2 while loop's body (under tf.keras
    2.15, inside a function holding the loop): they were neither captured nor listed, and the
    manifest said nothing was skipped. The body's tensors are listed; the loop's output is
    captured, and its value and gradient are the tape's."""
    keras.utils.set_random_seed(8)
    rng = np.random.default_rng(8)
    x = rng.integers(1, 20, size=(16, 5)).astype("int32")
    y = (x[:, 0] > 10).astype("int32")
    inp = keras.Input((5,), dtype="int32")
    h = keras.layers.LSTM(3, name="rnn")(keras.layers.Embedding(20, 3, name="emb")(inp))
    model = keras.Model(inp, keras.layers.Dense(2, name="logits")(h), name="rnnm")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = {"probe": (x[:N], y[:N])} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_steps=[2], samples_per_group=N, strict=True,
                         **kw)
    model.fit(x, y, batch_size=N, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    skipped = run.manifest["skipped"]
    assert any("/body/" in n and "Sigmoid" in n for n in skipped), skipped
    assert not set(skipped) & set(run.tensors.index)
    if source == "probe":   # after the loop: the tape's values (step 2 is the last: the final weights)
        logits = _find(run.tensors, "logits/MatMul")
        rnn_out = model.get_layer("rnn")(model.get_layer("emb")(tf.constant(x[:N])))
        matmul = np.asarray(run.tensor(logits, 2))
        np.testing.assert_allclose(matmul, rnn_out.numpy() @ model.get_layer("logits").kernel.numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_an_output_the_loss_does_not_use_has_no_gradient(tmp_path, source):
    """tf.gradients fills zeros for an unused output of a multi-output op
    whose other output the loss uses (the cross entropy's backprop output, an LSTM's final
    states, batch norm's batch statistics): they were recorded with has_gradient and gradients
    of zeros, where the catalog promises none. A tensor the loss is not computed from has none."""
    keras.utils.set_random_seed(9)
    x, y = _data(9, n=16)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="hidden"),
                              keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2, name="logits")])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = {"probe": (x[:N], y[:N]), "training": True} if source == "probe" else {"source": "train_batch"}
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_steps=[2], strict=True, **kw)
    model.fit(x, y, batch_size=N, epochs=1, verbose=0, callbacks=[cb])
    cat = inspector.open_run(tmp_path / "r").tensors
    xent = cat[cat["op_type"] == "SparseSoftmaxCrossEntropyWithLogits"]
    assert xent["has_gradient"].tolist() == [True, False], xent.index.tolist()   # :0 the loss, :1 its backprop
    assert cat.loc[_find(cat, "logits/BiasAdd"), "has_gradient"]
