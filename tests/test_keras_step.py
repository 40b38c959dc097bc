"""InspectCallback(source="train_batch"): what the capture inside fit's own train step records
equals an eager GradientTape on that step's batch and the weights it started from, and training
itself is unchanged by it."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402
from test_keras import BUILD, _data, _find, _oracle, sequential  # noqa: E402

import inspector  # noqa: E402
from hooks.variables import numpy_stats  # noqa: E402
from inspector.format import STAT_COLUMNS  # noqa: E402
from inspector.sessions.lease import RunLockedError  # noqa: E402
from inspector import writer as writer_module  # noqa: E402

BATCH = 16
KERAS3 = int(str(getattr(keras, "__version__", "2")).split(".")[0]) >= 3


def _fit(model, x, y, callbacks, epochs=1):
    model.compile(optimizer=keras.optimizers.SGD(0.3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize("kind", sorted(BUILD))
def test_train_batch_values_and_gradients_are_the_steps_own(tmp_path, kind):
    keras.utils.set_random_seed(5)
    x, y = _data(5, n=40)          # steps of 16, 16 and 8 samples
    model = BUILD[kind]()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2, 3],
                         samples_per_group=BATCH, strict=True)
    _fit(model, x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["source"] == "train_batch"
    assert run.dump_steps() == [2, 3]
    for step, rows in ((2, slice(16, 32)), (3, slice(32, 40))):
        xb, yb = x[rows], y[rows]
        index = np.asarray(run.samples(step)["index"])
        np.testing.assert_array_equal(np.sort(index), np.arange(len(xb)))   # the whole batch, this one
        np.testing.assert_array_equal(run.samples(step)["label"], yb[index])
        # the oracle runs on a twin holding the weights the step started from (the dumped values)
        twin = BUILD[kind]()
        twin(xb[:1])
        for v, w in zip(twin.trainable_variables, model.trainable_variables):
            v.assign(run.tensor(_var(w), step))
        vals, grads, var_grads = _oracle(kind, twin, xb, yb)
        for w, g in zip(model.trainable_variables, var_grads):
            np.testing.assert_allclose(run.tensor(_var(w), step, "gradient"), g.numpy(), rtol=1e-4, atol=1e-7,
                                       err_msg=f"{_var(w)} at {step}")
        for key in vals:
            name = run.manifest["probe"]["inputs"][0] if key == "probe_x" else _find(run.tensors, key)
            order = np.argsort(index)
            np.testing.assert_allclose(np.asarray(run.tensor(name, step))[order], vals[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key} at {step}")
            np.testing.assert_allclose(np.asarray(run.tensor(name, step, "gradient"))[order], grads[key],
                                       rtol=1e-4, atol=1e-7, err_msg=f"{key} at {step}")
    # step 2's values are the weights before step 2; plus its update they are step 3's
    for w in model.trainable_variables:
        np.testing.assert_allclose(run.tensor(_var(w), 2) + run.tensor(_var(w), 2, "update"), run.tensor(_var(w), 3),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_statistics_are_those_of_the_steps_tensors(tmp_path, source):
    """Every statistics row of a step (the columns and the histogram, as read back) equals the
    reference statistics of the tensor dumped at that step, whole batch or probe: the rows the
    step writes are the ones its capture computed, column for column."""
    keras.utils.set_random_seed(7)
    x, y = _data(7, n=32)
    probe = {"probe": (x[:BATCH], y[:BATCH])} if source == "probe" else {}
    cb = InspectCallback(tmp_path / "r", source=source, stats_every_n_steps=1, dump_steps=[2],
                         samples_per_group=BATCH, strict=True, **probe)
    _fit(sequential(), x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    rows = run.query_stats(steps=(2, 2), groups=["all"])
    checked = 0
    keys = set(run.dump_keys(2))
    for r in rows.itertuples():
        if f"{r.kind}/{r.tensor}" not in keys:
            continue
        a = np.asarray(run.tensor(r.tensor, 2, r.kind), np.float64)
        values, _, index, count = numpy_stats([a])
        got = [getattr(r, c) for c in STAT_COLUMNS]
        np.testing.assert_allclose(got, values[0], rtol=1e-5, atol=1e-7, err_msg=f"{r.tensor} {r.kind}")
        # buckets come from the values' bits: exactly numpy's
        assert list(r.hist_bucket) == index.tolist() and list(r.hist_count) == count.tolist(), r.tensor
        checked += 1
    assert checked >= 8, checked


def test_regression_targets_still_dump_the_steps_samples(tmp_path):
    """Float targets that are not class ids break the default group rule: the step's statistics
    are 'all' only, and its dump keeps the batch's first 2 x samples_per_group samples,
    ungrouped (not none: every batched tensor dumped empty)."""
    keras.utils.set_random_seed(8)
    x, _ = _data(8, n=32)
    y = (x @ np.arange(1.0, 7.0, dtype=np.float32) / 7).astype(np.float32)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2],
                         samples_per_group=3)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert set(run.stats["group"].astype(str)) == {"all"} and run.manifest["groups_refused"]["first_step"] == 1
    samples = run.samples(2)
    assert samples["index"].tolist() == list(range(6)) and "group" not in samples
    np.testing.assert_allclose(samples["label"].to_numpy().ravel(), y[BATCH:BATCH + 6])
    np.testing.assert_array_equal(run.tensor(run.manifest["probe"]["inputs"][0], 2), x[BATCH:BATCH + 6])
    assert run.dump_metadata(2)["groups"] == "refused"


@pytest.mark.parametrize("spe", ["auto"])
@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_auto_steps_per_execution_is_refused(tmp_path, caplog, spe, source):
    """"auto" starts at 1 under tf.keras 2.15 and rises during fit: step numbers would come out
    silently wrong (a recorded 'step 500' was iteration 1223). Refused before fit trains;
    without strict, the callback is disabled and training goes on. (An int > 1 is recorded:
    test_keras_execution.py.)"""
    if KERAS3 and spe == "auto":
        pytest.skip("Keras 3.15's TensorFlow trainer cannot fit with steps_per_execution='auto' itself")
    x, y = _data(9, n=32)
    model = sequential()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True), steps_per_execution=spe)
    probe = {"probe": (x[:8], y[:8])} if source == "probe" else {}
    with pytest.raises(ValueError, match="steps_per_execution"):
        model.fit(x, y, batch_size=8, verbose=0,
                  callbacks=[InspectCallback(tmp_path / "s", source=source, strict=True, **probe)])
    cb = InspectCallback(tmp_path / "n", source=source, **probe)
    hist = model.fit(x, y, batch_size=8, verbose=0, callbacks=[cb])
    assert np.isfinite(hist.history["loss"][0]) and "steps_per_execution" in caplog.text
    # fixed and fitted again with the same callback: it stays disabled, and says so at this
    # fit's start, naming the first error
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True), steps_per_execution=1)
    caplog.clear()
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[cb])
    said = [r.getMessage() for r in caplog.records if "disabled by an earlier error" in r.getMessage()]
    assert len(said) == 1 and "steps_per_execution" in said[0] and "create a new InspectCallback" in said[0]


def _var(w) -> str:
    """The run's name of a Keras variable (Keras 3's path, tf.keras's name without ':0')."""
    return getattr(w, "path", None) or w.name.split(":")[0]


def test_capture_leaves_training_unchanged_with_batch_norm(tmp_path):
    """Capturing inside the step changes nothing the step computes: the trained model (batch-norm
    moving statistics included) and the History equal a run without the callback."""
    x, y = _data(6, n=48)
    # Keras 3's dropout draws from a seed variable: the capturing function draws what fit's own
    # would. tf.keras 2.15's stateful random ops restart their stream in another function
    # (docs/guide/keras.md, "The training step"), so there the check is without dropout.

    def model():
        keras.utils.set_random_seed(6)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="hidden"),
                                 keras.layers.BatchNormalization(name="bn"),
                                 *([keras.layers.Dropout(0.3)] if KERAS3 else []),
                                 keras.layers.Dense(2, name="logits")])
    plain = model()
    plain_loss = _fit(plain, x, y, [], epochs=2).history["loss"]
    probed = model()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1,
                         dump_every_n_steps=2, strict=True)
    probed_loss = _fit(probed, x, y, [cb], epochs=2).history["loss"]
    np.testing.assert_allclose(probed_loss, plain_loss, rtol=1e-6)
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    assert inspector.open_run(tmp_path / "r").stats["step"].max() == 6
    # the wrapper is gone after fit: a later fit without the callback runs the model's own step
    assert "train_step" not in probed.__dict__


def test_source_arguments_are_checked(tmp_path):
    """The training step is the default source; probe= alone asks for the probe; a probe with
    source='train_batch' is its fallback, so a positive= array (the probe's) is refused there."""
    x, y = _data()
    assert InspectCallback(tmp_path / "a").source == "train_batch"
    assert InspectCallback(tmp_path / "b", probe=(x[:8], y[:8])).source == "probe"
    assert InspectCallback(tmp_path / "c", probe=(x[:8], y[:8]), source="train_batch").probe is not None
    with pytest.raises(ValueError, match="probe= is required with source='probe'"):
        InspectCallback(tmp_path / "d", source="probe")
    with pytest.raises(ValueError, match="expected 'train_batch'"):
        InspectCallback(tmp_path / "e", probe=(x[:8], y[:8]), source="batch")
    with pytest.raises(ValueError, match="callable"):
        InspectCallback(tmp_path / "f", source="train_batch", positive=np.ones(8, bool))
    with pytest.raises(ValueError, match="fits the probe only"):
        InspectCallback(tmp_path / "g", probe=(x[:8], y[:8]), source="train_batch", positive=np.ones(8, bool))


@pytest.mark.parametrize("jit", [True, "auto"])
def test_under_xla_the_default_falls_back_to_the_probe_and_says_so(tmp_path, caplog, jit):
    """Under XLA the capture cannot be compiled: before fit traces its step, the default source
    gives way to the probe (fit's first batch, no probe= given), with a warning naming the
    reason; training is untouched and the catalog says "probe batch, after the update".
    tf.keras 2.15 keeps jit_compile="auto" as it is and compiles by XLA: there too fit must not
    crash at the first sampled step."""
    x, y = _data(7, n=32)
    model = sequential()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True), jit_compile=jit)
    if not model.jit_compile:   # Keras 3 resolves "auto" at compile: here, to no XLA
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[InspectCallback(tmp_path / "a", stats_every_n_steps=1,
                                                                             strict=True)])
        assert inspector.open_run(tmp_path / "a").manifest["probe"]["source"] == "train_batch"
        return
    hist = model.fit(x, y, batch_size=8, verbose=0, callbacks=[InspectCallback(tmp_path / "n", stats_every_n_steps=1,
                                                                                strict=True)])
    assert np.isfinite(hist.history["loss"][0]) and "train_step" not in model.__dict__
    assert f"jit_compile={jit!r}" in caplog.text and "records a 8-sample probe batch instead" in caplog.text
    run = inspector.open_run(tmp_path / "n")
    probe = run.manifest["probe"]
    assert probe["source"] == "probe" and f"jit_compile={jit!r}" in probe["fallback"]
    assert probe["origin"] == "the first 8 samples of fit's x and y" and probe["samples"] == 8
    assert set(run.tensors["captured_on"]) == {"probe batch, after the update"}
    assert run.stats["step"].max() == 4


def test_the_fallback_probe_is_the_one_given_else_the_first_batch_of_a_dataset(tmp_path, caplog):
    """With probe= and source='train_batch', the probe given is the fallback; a dataset's first
    batch otherwise; data that cannot be read without taking batches from training (a
    generator) leaves the callback disabled, saying to pass probe=."""
    x, y = _data(8, n=32)
    for name, data, kw, want in (("given", (x, y), {"probe": (x[:4], y[:4])}, 4),
                                 ("dataset", (tf.data.Dataset.from_tensor_slices((x, y)).batch(8),), {}, 8)):
        model = sequential()
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True), run_eagerly=True)
        model.fit(*data, **({"batch_size": 16} if len(data) == 2 else {}), verbose=0, callbacks=[
            InspectCallback(tmp_path / name, source="train_batch", stats_every_n_steps=1, strict=True, **kw)])
        assert inspector.open_run(tmp_path / name).manifest["probe"]["samples"] == want, name

    def batches():
        while True:
            yield x[:8], y[:8]
    model = sequential()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True), run_eagerly=True)
    model.fit(batches(), steps_per_epoch=2, verbose=0, callbacks=[InspectCallback(tmp_path / "gen",
                                                                                    stats_every_n_steps=1)])
    assert "no probe batch to record instead" in caplog.text and "pass probe=(x, y)" in caplog.text
    assert not (tmp_path / "gen").exists()


def test_dropout_masks_are_the_steps_own(tmp_path):
    """The capture reads the step's own dropout output: d loss / d (dropout input) is the gradient
    at its output times the step's mask / keep, element by element, and zero exactly where the
    output is."""
    keras.utils.set_random_seed(8)
    x, y = _data(8, n=32)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dropout(0.5, name="drop"), keras.layers.Dense(2, name="logits")])
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=0, dump_steps=[2],
                         samples_per_group=BATCH, strict=True)
    _fit(model, x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    cat = run.tensors
    relu = cat[(cat["op_type"] == "Relu") & cat["keras_layer"].fillna("").str.endswith("hidden")].index[0]
    # the dropout layer's output: the last tensor its call created
    drop_out = [n for n in cat.index if str(cat.loc[n, "keras_layer"]).endswith("drop") and cat.loc[n, "kind"] == "tensor"]
    a, out = np.asarray(run.tensor(relu, 2)), np.asarray(run.tensor(drop_out[-1], 2))
    kept = out != 0
    np.testing.assert_allclose(out[kept], 2.0 * a[kept], rtol=1e-6)            # inverted dropout, keep 0.5
    live = a > 0                                                              # where the mask shows
    assert 0.2 < kept[live].mean() < 0.8                                      # a real mask was drawn
    g_in, g_out = np.asarray(run.tensor(relu, 2, "gradient")), np.asarray(run.tensor(drop_out[-1], 2, "gradient"))
    np.testing.assert_allclose(g_in[live], np.where(kept, 2.0 * g_out, 0.0)[live], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_nonfinite_loss_is_recorded_and_the_next_step_dumped(tmp_path, source):
    """A NaN in the third batch: fit's loss turns NaN at step 3, the manifest says so (the loss
    check: no statistics are scheduled) and step 4 is dumped, with its reason."""
    x, y = _data(9, n=64)
    x[40] = 3e38       # in the third batch of 16: inf in the hidden layer, NaN logits (a NaN input would vanish in the ReLU)
    keras.utils.set_random_seed(9)
    probe = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **probe, stats_every_n_steps=0, dump_every_n_steps=0,
                         dump_on_nonfinite=True, strict=True)
    _fit(sequential(), x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    first = run.manifest["first_nonfinite"]
    assert (first["step"], first["source"]) == (3, "loss check")
    assert run.manifest["config"]["dump_on_nonfinite"] is True
    assert run.dump_steps() == [4]
    assert run.dump_metadata(4)["reason"] == "after NaN/Inf"
    hidden = _find(run.tensors, "hidden/Relu")
    assert not np.isfinite(np.asarray(run.tensor(hidden, 4))).all()   # the NaN weights show


@pytest.mark.parametrize("place", ["before", "after"])
def test_terminate_on_nan_still_gets_the_probe_dump(tmp_path, place):
    """With Keras's TerminateOnNaN the fit stops at the NaN step,
    so 'dump the next step' never ran and a diverged run had no dump. The probe's dump is taken
    at the fit's end instead: the weights training left, under the NaN step's number."""
    x, y = _data(9, n=64)
    x[40] = 3e38       # the third batch of 16: NaN logits
    keras.utils.set_random_seed(9)
    cb = InspectCallback(tmp_path / "r", probe=(x[:8], y[:8]), stats_every_n_steps=0, dump_every_n_steps=0,
                         dump_on_nonfinite=True, strict=True)
    stop = keras.callbacks.TerminateOnNaN()
    model = sequential()
    _fit(model, x, y, [stop, cb] if place == "before" else [cb, stop])
    assert int(model.optimizer.iterations.numpy()) == 3
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["first_nonfinite"]["step"] == 3
    assert run.dump_steps() == [3] and run.dump_metadata(3)["reason"] == "after NaN/Inf"
    assert not np.isfinite(np.asarray(run.tensor(_find(run.tensors, "hidden/Relu"), 3))).all()


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_a_fit_that_samples_nothing_leaves_no_session(tmp_path, source):
    """A writer session opens at a fit's first sampled step, not at every fit (~8 ms a fit for
    nothing, the idle callback's cost on short fits); a NaN on a step that samples nothing
    still opens one, so the manifest records it (once the catalog exists)."""
    x, y = _data(11, n=48)
    probe = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    model = sequential()
    cb = InspectCallback(tmp_path / "r", **probe, stats_every_n_steps=5, dump_every_n_steps=0,
                         dump_on_nonfinite=True, strict=True)
    _fit(model, x, y, [cb])                                 # steps 1-3: nothing sampled
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("manifest.*"))
    _fit(model, x, y, [cb])                                 # steps 4-6: step 5
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == [5] and sorted(run.sessions["session"]) == [1]
    # a NaN output bias: the loss is NaN from step 7 (inputs of 3e38 left it finite when the
    # unseeded weights had ReLU zero every unit: a flaky test)
    bias = model.layers[-1].bias
    bias.assign(np.full(bias.shape, np.nan, np.float32))
    # steps 7-9: nothing sampled (no compile: after one the step capture has no catalog until
    # its first capture, and a NaN before it is logged only)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.sessions["session"]) == [1, 2]
    first = run.manifests[("chief", 2)]["first_nonfinite"]
    assert (first["step"], first["source"]) == (7, "loss check")


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_a_fit_ended_by_an_exception_is_a_failed_session_of_its_own(tmp_path, source):
    """Keras skips on_train_end when a fit raises (here another callback, in step 2's end):
    the next fit closes that session as failed, and writes its own; the interrupted step's
    capture does not leak into the next fit's first step."""
    x, y = _data(12, n=48)
    probe = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise RuntimeError("boom")

    model = sequential()
    cb = InspectCallback(tmp_path / "r", **probe, stats_every_n_steps=2, dump_every_n_steps=0, strict=True)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(model, x, y, [cb, Boom()])                     # steps 1-2, step 2 sampled, then the exception
    _fit(model, x, y, [cb])                                 # its steps continue: 3-5, step 4 sampled
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.set_index("session")["state"].to_dict() == {1: "failed", 2: "finished"}
    assert "exception" in run.manifests[("chief", 1)]["error"]
    stats = run.query_stats(kinds=["forward"], groups=["all"])
    assert stats.groupby("step")["session"].first().to_dict() == {2: 1, 4: 2}


def _manifest_state(run_dir, session: int) -> tuple[str, str | None]:
    m = inspector.open_run(run_dir).manifests[("chief", session)]
    return m["status"], m.get("error")


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_the_session_of_a_fit_that_raised_ends_as_failed_by_itself(tmp_path, monkeypatch, source):
    """Found in review: Keras skips on_train_end after an exception, so the session read
    "running", its heartbeat live, until the next fit, close() or the process's exit (a
    notebook after a KeyboardInterrupt: hours). The writer sees that the fit it was opened in
    has left the thread's stack and ends the session as failed, every row kept."""
    monkeypatch.setattr(writer_module, "OWNER_CHECK_SECS", 0.01)
    x, y = _data(12, n=48)
    probe = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **probe, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    with pytest.raises(KeyboardInterrupt):
        _fit(sequential(), x, y, [cb, _Stop(2)])             # steps 1-2, then the interrupt
    cb._writer._thread.join(timeout=60)                      # ends by itself: nothing else calls it
    status, error = _manifest_state(tmp_path / "r", 1)
    assert status == "failed" and "on_train_end was not called" in error
    assert sorted(inspector.open_run(tmp_path / "r").stats_steps()) == [1, 2]
    # nothing holds the ended fit's frame (its locals: fit's data) once the session ended
    assert cb._fit_watch is None and cb._writer._owner_gone is None


def test_batches_driven_by_hand_after_a_fit_that_raised_are_never_ended(tmp_path, monkeypatch):
    """Found in review: after a fit that raised before it wrote, the callback kept that fit's
    watch; a loop then calling its batch methods by hand (no on_train_begin) opened its
    session with it, and the writer ended the live session at once, 'the fit ended by an
    exception', a new failed session per sampled step."""
    monkeypatch.setattr(writer_module, "OWNER_CHECK_SECS", 0.0)
    import time

    class Boom(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            raise RuntimeError("boom")
    x, y = _data(15, n=32)
    model = sequential()
    cb = InspectCallback(tmp_path / "r", probe=(x[:8], y[:8]), stats_every_n_steps=1, dump_every_n_steps=0,
                         strict=True)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(model, x, y, [cb, Boom()])
    for i in range(3):
        cb.on_train_batch_begin(i)
        model.optimizer.apply_gradients(zip([tf.zeros_like(v) for v in model.trainable_variables],
                                            model.trainable_variables))
        cb.on_train_batch_end(i, {"loss": 1.0})
        time.sleep(0.05)
    cb.on_train_end()
    run = inspector.open_run(tmp_path / "r")
    assert {k: m["status"] for k, m in run.manifests.items()} == {("chief", 1): "finished"}
    assert sorted(run.stats_steps()) == [1, 2, 3]


def test_a_live_fit_is_never_ended_by_the_owner_check(tmp_path, monkeypatch):
    """The check runs on every wake of the writer while the fit trains (here at every
    statistics step) and finds the fit's frame each time: the session ends as the fit does,
    finished, with every step."""
    monkeypatch.setattr(writer_module, "OWNER_CHECK_SECS", 0.0)
    calls = []
    real = writer_module.RunWriter._ended_by_owner

    def counted(self):
        calls.append(1)
        return real(self)
    monkeypatch.setattr(writer_module.RunWriter, "_ended_by_owner", counted)
    x, y = _data(13, n=96)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0,
                         strict=True)
    _fit(sequential(), x, y, [cb])
    assert len(calls) >= 6                                   # one per statistics step at least
    assert _manifest_state(tmp_path / "r", 1) == ("finished", None)
    assert sorted(inspector.open_run(tmp_path / "r").stats_steps()) == list(range(1, 7))


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_callback_writes_to_a_url(tmp_path, monkeypatch, source):
    """An fsspec URL is a URL (object storage; memory:// here), never a local folder 'memory:'."""
    monkeypatch.chdir(tmp_path)
    x, y = _data(10, n=32)
    url = f"memory://tfi-keras-{source}/runs/k1"
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    _fit(sequential(), x, y, [InspectCallback(url, **where, stats_every_n_steps=1, dump_steps=[2], strict=True,
                                              storage_options={})])
    assert not any(tmp_path.iterdir())                      # nothing written locally
    run = inspector.open_run(url)
    assert run.dump_steps() == [2] and sorted(run.stats["step"].unique()) == [1, 2]


class HandLoss(keras.Sequential):
    """A custom train_step computing its loss by hand (never model.compute_loss)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = self(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(y, tf.int32), logits))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_a_train_step_computing_its_own_loss_records_its_gradients(tmp_path, caplog):
    """A custom train_step computing its loss by hand and compile() without loss=: the capture
    takes the target the step differentiates as the loss (the gradients were missing, and the
    warning sent users to the probe, which fails there): SGD's update is -lr times the recorded
    gradient, and training is what it is without the callback."""
    x, y = _data(11, n=32)

    def build():
        keras.utils.set_random_seed(11)
        model = HandLoss([keras.Input((6,)), keras.layers.Dense(4, activation="relu", name="hidden"),
                          keras.layers.Dense(2, name="logits")])
        model.compile(optimizer=keras.optimizers.SGD(0.3))
        return model
    plain = build()
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    model = build()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[
        InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_steps=[2], strict=True)])
    for a, b in zip(model.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["loss"] is not None and "never called model.compute_loss" not in caplog.text
    for w in model.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        assert np.abs(grad).max() > 0
        np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))
    logits = _find(run.tensors, "logits/BiasAdd")
    assert bool(run.tensors.loc[logits, "has_gradient"])


def test_the_probe_of_a_model_compiled_without_a_loss_says_what_it_records(tmp_path, caplog):
    """source='probe' on such a model: the probe runs the compiled loss, and there is none. It
    failed saying "give a batch like the training data's" (Keras 3), or recorded no gradients
    with no word (tf.keras 2.15); it records forward values and says why, and what records the
    step's own loss."""
    x, y = _data(12, n=32)
    model = HandLoss([keras.Input((6,)), keras.layers.Dense(2, name="logits")])
    model.compile(optimizer=keras.optimizers.SGD(0.3))
    model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[
        InspectCallback(tmp_path / "r", probe=(x[:8], y[:8]), stats_every_n_steps=1, strict=True)])
    assert "compiled without loss=" in caplog.text and "source='train_batch'" in caplog.text
    assert not inspector.open_run(tmp_path / "r").tensors["has_gradient"].any()


class ScaledStep(keras.Sequential):
    """A custom train_step differentiating a scaled loss: not the loss compute_loss returned."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            scaled = loss * 4.0
        grads = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply_gradients(zip([g / 4.0 for g in grads], self.trainable_variables))
        return {"loss": loss}


class ExtraTerm(keras.Sequential):
    """A custom train_step adding a term to compute_loss's result (a regularizer of its own)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred) + 0.5 * tf.reduce_mean(tf.square(y_pred))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class TwoTargets(keras.Sequential):
    """A custom train_step stepping along the gradients of two targets (as sharpness-aware
    minimization or two optimizers do)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            other = tf.reduce_mean(tf.square(y_pred))
        first, second = (tape.gradient(t, self.trainable_variables) for t in (loss, other))
        self.optimizer.apply_gradients(zip([a + 0.1 * b for a, b in zip(first, second)], self.trainable_variables))
        return {"loss": loss}


def _custom(cls, seed: int):
    keras.utils.set_random_seed(seed)
    return cls([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                keras.layers.Dense(2, name="logits")])


def test_a_step_adding_to_compute_loss_records_the_gradients_it_trains_on(tmp_path):
    """A custom step training on compute_loss's result plus a term of its
    own had the gradients of compute_loss's part recorded (0.6 off the applied ones on a logits
    tensor), with no word. The capture takes the loss the step differentiates, as DumpHook does:
    SGD's update is -lr times the recorded gradients, and training is what it is without it."""
    x, y = _data(21, n=48)
    plain = _custom(ExtraTerm, 21)
    _fit(plain, x, y, [])
    probed = _custom(ExtraTerm, 21)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
    _fit(probed, x, y, [cb])
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    run = inspector.open_run(tmp_path / "r")
    for w in probed.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))


def test_the_probe_of_a_model_with_its_own_train_step_says_what_it_records(tmp_path, caplog):
    """The probe differentiates compute_loss's result: a train_step of the user's own may train
    on more (ExtraTerm's added term); it says so, once, and a standard model says nothing."""
    x, y = _data(26, n=32)
    for cls in (ExtraTerm, keras.Sequential):
        caplog.clear()
        model = _custom(cls, 26)
        _fit(model, x, y, [InspectCallback(tmp_path / cls.__name__, probe=(x[:8], y[:8]), stats_every_n_steps=1)])
        assert caplog.text.count("has a train_step of its own") == (cls is ExtraTerm)


def test_a_step_differentiating_two_targets_falls_back_to_the_probe(tmp_path, caplog):
    """Which of two targets' gradients are the step's is a guess: the probe is recorded instead
    (warned, the manifest says why), training untouched."""
    _falls_back_without_crashing(tmp_path, caplog, lambda: _custom(TwoTargets, 24), _data(24, n=48),
                                 "differentiates 2 targets")


@pytest.mark.skipif(not hasattr(keras.optimizers.SGD(), "loss_scale_factor"), reason="Keras 3's loss_scale_factor")
def test_a_step_adding_to_compute_loss_under_loss_scaling_falls_back(tmp_path, caplog):
    """Under loss scaling a target that is not compute_loss's result times the scale cannot be
    unscaled: not recorded at the scale's multiple; the probe is recorded instead."""
    x, y = _data(25, n=48)
    model = _custom(ExtraTerm, 25)
    model.compile(optimizer=keras.optimizers.SGD(0.3, loss_scale_factor=8.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, strict=True)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert "cannot be unscaled" in inspector.open_run(tmp_path / "r").manifest["probe"]["fallback"]
    assert "cannot be unscaled" in caplog.text


@pytest.mark.skipif(not hasattr(keras.optimizers.SGD(), "loss_scale_factor"), reason="Keras 3's loss_scale_factor")
def test_an_optimizers_loss_scale_factor_is_not_refused(tmp_path):
    """Keras 3's ``optimizer.scale_loss`` multiplies the loss (``loss_scale_factor``) and the
    optimizer divides the gradients again: a scaled loss, not another target. Recorded: d loss
    / d t, so SGD's update is -lr times it."""
    x, y = _data(22, n=48)
    keras.utils.set_random_seed(22)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.3, loss_scale_factor=64.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    for w in model.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        assert np.abs(grad).max() > 0
        np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))


class TargetStep(keras.Sequential):
    """A custom train_step differentiating ``target(loss, y_pred)`` and applying the gradients
    times ``unscale`` (a loss scaled by hand is unscaled by hand)."""
    target = staticmethod(lambda loss, y_pred: loss)
    unscale = 1.0

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            target = self.target(loss, y_pred)
        grads = tape.gradient(target, self.trainable_variables)
        self.optimizer.apply_gradients(zip([g * self.unscale for g in grads], self.trainable_variables))
        return {"loss": loss}


def _target_step(target, unscale=1.0) -> keras.Model:
    keras.utils.set_random_seed(24)
    model = TargetStep([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                        keras.layers.Dense(2, name="logits")])
    model.target, model.unscale = target, unscale
    return model


@pytest.mark.parametrize("how", ["identity", "over a count", "a mean of it", "times a stopped gradient"])
def test_the_loss_over_a_count_or_seen_through_an_identity_is_the_loss(tmp_path, how):
    """``tf.identity(loss)``, ``loss / n`` (a gradient accumulation by
    hand) and ``tf.reduce_mean(loss)`` are the loss (times a factor), but only a Mul was seen
    as one, and the capture of such a step was refused. Recorded: d loss / d t, so SGD's update
    is -lr times it where the step unscales its gradients."""
    target, unscale = {"identity": (lambda loss, y_pred: tf.identity(loss), 1.0),
                       "over a count": (lambda loss, y_pred: loss / 4.0, 4.0),
                       "a mean of it": (lambda loss, y_pred: tf.reduce_mean(loss), 1.0),
                       "times a stopped gradient": (
                           lambda loss, y_pred: loss * tf.stop_gradient(tf.reduce_mean(y_pred ** 2)), None)}[how]
    x, y = _data(24, n=48)
    model = _target_step(target, unscale or 1.0)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
    _fit(model, x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    for w in model.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        assert np.abs(grad).max() > 0
        if unscale is not None:   # a stopped gradient's factor is the batch's: the update is not -lr * grad
            np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))


def test_the_loss_times_a_factor_computed_from_the_output_is_the_target(tmp_path):
    """``loss * mean(y_pred ** 2)`` is a Mul of the loss, so it passed as
    "the loss times a factor", and its gradients were recorded as the loss's alone (0.7 off the
    applied update, relative, with no word). The factor's gradient flows to the weights: another
    target, whose own gradients are recorded (SGD's update is -lr times them)."""
    x, y = _data(25, n=48)
    model = _target_step(lambda loss, y_pred: loss * tf.reduce_mean(y_pred ** 2))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
    _fit(model, x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    for w in model.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))


class TwoViews(keras.Sequential):
    """A custom train_step calling the model on two views of the batch (a consistency loss,
    kept inside compute_loss's result so the step is not refused)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            again = self(x * 0.5, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred + 0.0 * again)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_a_step_calling_the_model_twice_says_only_the_first_call_is_recorded(tmp_path, caplog):
    """The capture records the ops of the model's first call in the step; a second call's were
    missing from the catalog with no word. It says so now (once), and records the first."""
    x, y = _data(23, n=32)
    keras.utils.set_random_seed(23)
    model = TwoViews([keras.Input((6,)), keras.layers.Dense(2, name="logits")])
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, strict=True)
    _fit(model, x, y, [cb])
    assert caplog.text.count("calls the model 2 times") == 1
    assert sum("logits" in n and n.endswith("MatMul:0") for n in inspector.open_run(tmp_path / "r").tensors.index) == 1


def _graph_ops(cb) -> list[str]:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(cb._graph.graph_def)
    return [n.name for n in graph.node]


@pytest.mark.parametrize("scaled", [False, True])
def test_the_steps_backward_pass_is_shared(tmp_path, scaled):
    """fit's step differentiates the loss once: its tape's ``gradient(loss, weights)`` is answered
    by the capture's one ``tf.gradients`` (no tape backward ops in the capturing step), and
    training is what it is without the callback. A step differentiating something else (a
    scaled loss) keeps its tape's own pass, beside the capture's, and is as exact."""
    x, y = _data(12, n=48)

    def model():
        keras.utils.set_random_seed(12)
        layers = [keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                  keras.layers.Dense(2, name="logits")]
        return ScaledStep(layers) if scaled else keras.Sequential(layers)
    plain = model()
    plain_loss = _fit(plain, x, y, [], epochs=2).history["loss"]
    probed = model()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
    probed_loss = _fit(probed, x, y, [cb], epochs=2).history["loss"]
    np.testing.assert_allclose(probed_loss, plain_loss, rtol=1e-6)
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    ops = _graph_ops(cb)
    assert any("tf_inspector/gradients/" in n for n in ops)
    assert any(n.startswith("gradient_tape/") for n in ops) == scaled
    # the captured gradients are d loss / d weights whichever pass the step took: SGD(0.3)'s
    # update is -0.3 times them
    run = inspector.open_run(tmp_path / "r")
    assert run.dump_steps() == [2]
    stats = run.stats
    for w in probed.trainable_variables:
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        assert np.abs(grad).max() > 0
        np.testing.assert_allclose(update, -0.3 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))
        # the update's statistics row (computed in the graph) describes the same array
        row = stats[(stats["tensor"] == _var(w)) & (stats["step"] == 2) & (stats["kind"] == "update")].iloc[0]
        # (float32 values are summed in float32: a mean near 0 is exact to ~1e-7 of their size)
        np.testing.assert_allclose([row["count"], row["mean"], row["std"], row["min"], row["max"]],
                                   [update.size, update.mean(), update.std(), update.min(), update.max()],
                                   rtol=1e-5, atol=1e-6 * np.abs(update).max(), err_msg=_var(w))


def test_a_fit_per_epoch_traces_the_step_once_and_compile_starts_over(tmp_path, monkeypatch):
    """fit called again (a fit per epoch) reuses the capturing step traced by the first fit; after
    compile (a new optimizer: learning rate 0) it is traced again, so training follows the new
    compile, not a stale trace; and a fit without the callback runs the model's own step."""
    import hooks.keras.step as ks
    traces = []
    original = ks.StepGraph._capturing_step
    monkeypatch.setattr(ks.StepGraph, "_capturing_step", lambda self, *a: traces.append(1) or original(self, *a))
    x, y = _data(13, n=32)
    model = sequential()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    _fit(model, x, y, [cb])
    first = len(traces)
    assert first >= 1
    for _ in range(2):
        model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[cb])
    assert len(traces) == first                   # reused
    before = [w.numpy() for w in model.trainable_variables]
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[cb])
    assert len(traces) > first                    # traced again for the new compile
    for w, b in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(w.numpy(), b)  # learning rate 0: the new optimizer ran
    count = len(traces)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    assert len(traces) == count and "train_step" not in model.__dict__


def test_a_layer_frozen_and_rebuilt_within_fit_stops_training_on_sampled_steps_too(tmp_path, caplog):
    """Found in review: a callback freezing a layer mid-fit and rebuilding fit's train function
    (make_train_function(force=True), as the trainable refusal advises) froze it for fit's
    own steps only: the capturing functions, traced before, kept training it on every sampled
    step, and nothing was refused. Now fit trains with its rebuilt function, and the callback
    refuses to go on (it cannot capture a step other than the one it traced first)."""
    class FreezeAfterFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.model.get_layer("hidden").trainable = False
                self.model.make_train_function(force=True)
                self.kernel = self.model.get_layer("hidden").kernel.numpy().copy()

    x, y = _data(14, n=64)
    model, freeze = sequential(), FreezeAfterFirstEpoch()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    with caplog.at_level("ERROR", logger="tf_inspector"):
        _fit(model, x, y, [freeze, cb], epochs=2)
    np.testing.assert_array_equal(model.get_layer("hidden").kernel.numpy(), freeze.kernel)
    assert "train function was rebuilt during this fit" in caplog.text
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.stats_steps()) == [1, 2, 3, 4] and run.manifests[("chief", 1)]["status"] == "failed"


def test_soft_targets_are_not_split_by_the_default_rule(tmp_path, caplog):
    """Float targets that are not class ids (soft, regression): label != 0 would call every
    sample positive. A probe of them is refused when the callback is made; with the training
    batch, such steps write group 'all' only and the manifest says why."""
    import logging
    x, y = _data(4, n=32)
    soft = np.where(y == 1, 0.9, 0.1).astype("float32")
    with pytest.raises(ValueError, match=r"not all whole numbers \(e.g. 0.1\).*pass positive="):
        InspectCallback(tmp_path / "p", probe=(x[:8], soft[:8]))
    InspectCallback(tmp_path / "p", probe=(x[:8], soft[:8]), positive=lambda t: t > 0.5)   # a rule of one's own
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="logit")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    for name, targets in (("hard", y.astype("float32")), ("soft", soft)):
        cb = InspectCallback(tmp_path / name, source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0,
                             strict=True)
        with caplog.at_level(logging.ERROR, logger="tf_inspector"):
            model.fit(x, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
        run = inspector.open_run(tmp_path / name)
        groups = set(run.stats["group"].astype(str))
        if name == "hard":
            assert groups == {"all", "positive", "negative"} and "groups_refused" not in run.manifest
        else:
            assert groups == {"all"} and "not whole numbers" in run.manifest["groups_refused"]["why"]
            assert "some samples are in no group" in caplog.text
    # each fit is a session of its own, with its own record (the model's steps go on: 3..4, 5..6)
    model.fit(x, soft, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    refused = inspector.open_run(tmp_path / "soft").groups_refused
    assert refused[["session", "first_step", "last_step", "steps"]].values.tolist() == [[1, 3, 4, 2], [2, 5, 6, 2]]
    from inspector.analysis import run_alerts
    alerts = sorted(a.message for a in run_alerts(inspector.open_run(tmp_path / "soft")) if a.kind == "groups_refused")
    assert ["2 statistics step(s), 3..4" in alerts[0], "2 statistics step(s), 5..6" in alerts[1]] == [True, True]


def test_train_batch_under_a_one_replica_strategy(tmp_path):
    """fit under MirroredStrategy with one device (the variables are the strategy's): the
    capture writes each step's own batch (the refused case is several replicas, each a slice)."""
    keras.utils.set_random_seed(5)
    x, y = _data(5, n=40)          # steps of 16, 16 and 8 samples
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = sequential()
        cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2], strict=True)
        _fit(model, x, y, [cb])
    run = inspector.open_run(tmp_path / "r")
    name = run.manifest["probe"]["inputs"][0]
    rows = run.query_stats(tensors=[name], groups=["all"], kinds=["forward"]).sort_values("step")
    assert list(rows["step"]) == [1, 2, 3] and run.dump_steps() == [2]
    np.testing.assert_allclose(rows["mean"], [x[:16].mean(), x[16:32].mean(), x[32:].mean()], rtol=1e-5)


@pytest.mark.parametrize("inside", [False, True], ids=["outside_scope", "inside_scope"])
def test_the_probe_runs_under_a_strategy(tmp_path, inside):
    """The probe runs under MirroredStrategy, fit called inside strategy.scope() or outside it, under
    both Kerases: its loss's metric updates are not traced (tf.keras 2.15's loss tracker is a
    sync-on-read variable, not updatable outside a replica) and its variables are read through the
    component the model's reads use (a distributed variable has no one handle there). Two replicas,
    exact values: tests/test_replicas.py."""
    import contextlib
    x, y = _data(5, n=32)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = sequential()
        model.compile(optimizer=keras.optimizers.SGD(0.3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", probe=(x[:8], y[:8]), stats_every_n_steps=1, strict=True)
    with strategy.scope() if inside else contextlib.nullcontext():
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert sorted(run.stats["step"].unique()) == [1, 2]
    name = run.manifest["probe"]["inputs"][0]
    mean = run.query_stats([name], kinds=["forward"], steps=(2, 2), groups=["all"])["mean"]
    np.testing.assert_allclose(mean, [x[:8].mean()], rtol=1e-5)


class _Stop(keras.callbacks.Callback):
    """Raises at the end of batch ``at`` (an interrupted fit: Keras skips on_train_end)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.at:
            raise KeyboardInterrupt("stopped")


def test_a_fit_ended_by_an_exception_then_compile_trains_the_new_compile(tmp_path):
    """After a fit ended by an exception (no on_train_end: the capture still
    installed), compile() with another loss and fit trained every step with the old compile's
    function: old optimizer, old loss (weights off by 0.1 from a run without the callback)."""
    x, y = _data(12, n=64)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train(callbacks):
        keras.utils.set_random_seed(12)
        model = sequential()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=sce)
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[_Stop(2), *callbacks])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=lambda t, p: 3.0 * sce(t, p))
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return model
    plain = train([])
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    probed = train([cb])
    assert int(probed.optimizer.iterations.numpy()) == 4
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    assert "train_step" not in probed.__dict__


def test_a_recompiled_fit_whose_first_sampled_step_only_dumps_keeps_its_statistics(tmp_path):
    """After compile() the step capture kept the old catalog's rows; a fit
    whose first sampled step was a dump wrote no statistics at all (a layout of the old rows)."""
    x, y = _data(13, n=64)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=2, dump_every_n_steps=5,
                         strict=True)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # steps 1-4
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=lambda t, p: keras.losses.sparse_categorical_crossentropy(t, p, from_logits=True) + 0.01)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # 5 (dump only)-8
    run = inspector.open_run(tmp_path / "r")
    assert list(run.stats_steps()) == [2, 4, 6, 8] and run.dump_steps() == [5] and run.problems == []
    catalog = set(run.manifests[("chief", 2)]["tensors"][i]["name"] for i in range(len(run.manifests[("chief", 2)]["tensors"])))
    assert {k.split("/", 1)[1] for k in run.dump_keys(5) if k.startswith("forward/")} <= catalog


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_a_step_another_callback_interrupted_still_counts_after_compile(tmp_path, source):
    """Another callback raising in a batch's end (listed before this one)
    ends the fit after that step trained but before this callback counted it. After compile()
    (a new optimizer counting from 0), the next fit's steps began one too low: step 3 again,
    a step the first optimizer had already applied."""
    x, y = _data(15, n=64)
    model = sequential()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **where, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[_Stop(3), cb])  # 1-3
    assert int(model.optimizer.iterations.numpy()) == 3
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # 4-7
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 2], [4, 7]]
    assert run.manifests[("chief", 2)]["step_offset"] == 3


def test_an_interrupted_fit_counts_no_step_trained_without_the_callback(tmp_path):
    """Only the step in flight counts. Steps
    trained by fits without the callback are not numbered after an interrupted fit, as they
    are not after a fit that ended well."""
    x, y = _data(16, n=96)
    model = sequential()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb, _Stop(3)])  # 1-3
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)                   # 6 steps unseen
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    model.fit(x[:48], y[:48], batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # 4-6
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 3], [4, 6]]


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_backup_and_restore_listed_after_the_callback_numbers_the_resumed_steps(tmp_path, source):
    """BackupAndRestore restores optimizer.iterations in its own
    on_train_begin; listed after InspectCallback, the callback had read the count before the
    restore, and wrote the resumed steps 5-12 as 7-14 (steps 13-14 never ran)."""
    x, y = _data(17, n=128)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **where, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    seen = []

    class Preempt(keras.callbacks.Callback):
        armed = True

        def on_train_batch_end(self, batch, logs=None):
            seen.append(int(self.model.optimizer.iterations.numpy()))
            if self.armed and seen[-1] == 6:
                self.armed = False
                raise RuntimeError("preempted")
    preempt = Preempt()

    def fit():
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[cb, backup, preempt])
    with pytest.raises(RuntimeError, match="preempted"):
        fit()                                   # epoch 1: steps 1-4 (backed up), epoch 2: 5-6, then preempted
    seen.clear()
    fit()                                       # resumed from the end of epoch 1
    run = inspector.open_run(tmp_path / "r")
    last = run.sessions.sort_values("session").iloc[-1]
    assert [last["first_step"], last["last_step"]] == [seen[0], seen[-1]] == [5, 12]


def test_close_hands_an_interrupted_fits_run_to_a_new_callback(tmp_path, monkeypatch):
    """A notebook cell run again after a fit failed makes a new
    callback on the same run directory; the old one's session was still open, so the new one
    was refused (naming DumpHook) and the whole fit went unrecorded. The refusal now names
    close(), which ends the old session and puts the model's own train_step back. (The
    writer ends such a session itself within OWNER_CHECK_SECS: held off here, so the new
    callback comes while it is still open.)"""
    monkeypatch.setattr(writer_module, "OWNER_CHECK_SECS", 1e9)
    x, y = _data(18, n=64)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    old = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[old, _Stop(2)])  # 1-2
    new = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0,
                          strict=True)
    with pytest.raises(RunLockedError, match=r"InspectCallback\(\.\.\., worker='name'\).*call its close\(\)"):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[new])
    assert int(model.optimizer.iterations.numpy()) == 3          # refused at its first write, step 3's end
    old.close()
    assert "train_step" not in model.__dict__
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[new])            # 4-7
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["state", "first_step", "last_step"]].values.tolist() == [
        ["failed", 1, 2], ["finished", 4, 7]]


def test_a_variable_record_holds_one_variable_when_a_layer_is_unfrozen(tmp_path):
    """tf.keras 2.15, where two sub-models' layers both name their
    kernel proj/kernel: the records were told apart by '#2' in trainable_variables' order, so
    after unfreezing the first encoder, 'proj/kernel' held the other encoder's kernel: one
    curve of two variables. Keras 3 names them by path and runs the same test."""
    x, y = _data(19, n=64)

    def block(name):
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="proj")], name=name)
    inp = keras.Input((6,))
    enc_a, enc_b = block("enc_a"), block("enc_b")
    model = keras.Model(inp, keras.layers.Dense(2, name="head")(keras.layers.Concatenate()([enc_a(inp), enc_b(inp)])))
    kernels = {}

    class Kernels(keras.callbacks.Callback):   # before each step: source="train_batch" records these
        def on_train_batch_begin(self, batch, logs=None):   # steps go on after compile(): 1-4, then 5-8
            kernels[len(kernels) + 1] = {e.name: e.layers[0].kernel.numpy() for e in (enc_a, enc_b)}
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2, 6])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    enc_a.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Kernels(), cb])   # 1-4
    assert len(kernels) == 4
    enc_a.trainable = True
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Kernels(), cb])   # 5-8
    run = inspector.open_run(tmp_path / "r")
    names = [n for n in run.variables.index if "proj/kernel" in n]
    held = {n: {step: next(enc for enc, k in kernels[step].items() if np.array_equal(run.tensor(n, step), k))
                for step in (2, 6) if f"forward/{n}" in run.dump_keys(step)} for n in names}
    assert held and all(len(set(steps.values())) == 1 for steps in held.values()), held
    assert any(len(steps) == 2 for steps in held.values())   # enc_b's, recorded in both fits


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_close_during_the_fit_is_ignored(tmp_path, source):
    """close() called by another callback during the fit set the train
    function to None (training crashed: 'NoneType' is not callable), and in its on_train_end
    it closed a good fit's session as failed. Inside fit it is ignored, with a warning."""
    x, y = _data(20, n=64)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **where, stats_every_n_steps=2, dump_every_n_steps=0, strict=True)

    class Tidy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            cb.close()

        def on_train_end(self, logs=None):
            cb.close()
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Tidy(), cb])
    assert int(model.optimizer.iterations.numpy()) == 4
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions[["state", "first_step", "last_step"]].values.tolist() == [["finished", 2, 4]]


def test_a_checkpoint_restored_after_an_interrupted_fit_is_a_resume(tmp_path):
    """The optimizer count the last fit left (to tell Keras 3's skipped
    loss-scale steps) was stale after a fit ended by an exception, so a checkpoint restored to
    that count read as skipped steps: the resumed steps were written 3 past the optimizer's."""
    x, y = _data(14, n=64)
    model = sequential()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # steps 1-4
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    saved = ckpt.save(str(tmp_path / "ckpt" / "c"))
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb, _Stop(3)])  # 5-7
    ckpt.restore(saved)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])    # 5-8 again
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 4], [5, 7], [5, 8]]
    assert [m["step_offset"] for _, m in sorted(run.manifests.items())] == [0, 0, 0]


class _SelfLoss(keras.layers.Layer):
    """An ``add_loss`` term: the model trains without targets (an autoencoder's own loss)."""

    def call(self, h):
        self.add_loss(tf.reduce_mean(tf.square(h - 1.0)))
        return h


def test_a_fit_without_targets_records_the_loss_it_minimizes(tmp_path):
    """fit(x) with no y, the loss from add_loss (compile() without loss=).
    The step still calls compute_loss and differentiates its result, but the capture dropped that
    loss for want of targets and then built the step's own gradients of None: fit crashed with
    AttributeError ('NoneType' object has no attribute 'op'), strict or not. The loss is the
    one the step minimizes, targets or none: its gradients are recorded, and training is
    unchanged."""
    x, _ = _data(18, n=48)

    def model():
        keras.utils.set_random_seed(18)
        inp = keras.Input((6,))
        out = _SelfLoss(name="self_loss")(keras.layers.Dense(5, name="hidden")(inp))
        m = keras.Model(inp, out)
        m.compile(optimizer=keras.optimizers.SGD(0.1))
        return m
    plain = model()
    plain_loss = plain.fit(x, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"]
    probed = model()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_steps=[2])
    probed_loss = probed.fit(x, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[cb]).history["loss"]
    np.testing.assert_allclose(probed_loss, plain_loss, rtol=1e-6)
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["probe"]["targets"] is False and run.manifest["loss"] is not None
    assert run.dump_steps() == [2]
    for w in probed.trainable_variables:   # SGD(0.1): the step's update is -0.1 times its gradient
        grad, update = (np.asarray(run.tensor(_var(w), 2, kind)) for kind in ("gradient", "update"))
        assert np.abs(grad).max() > 0
        np.testing.assert_allclose(update, -0.1 * grad, rtol=1e-4, atol=1e-7, err_msg=_var(w))


class _Wrapper(keras.Model):
    """A custom train_step that calls an inner model, never the model itself (a GAN's or a
    distillation's step calls its parts)."""

    def __init__(self):
        super().__init__(name="wrapper")
        self.inner = sequential("inner")

    def call(self, x, training=False):
        return self.inner(x, training=training)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self.inner(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_a_train_step_that_never_calls_the_model_falls_back_without_crashing_fit(tmp_path, caplog):
    """The capture's refusal of such a step was raised inside fit's trace
    of its train function, so fit crashed instead of training on. Now the step trains as it
    is, and at its end the callback records the probe instead, saying why."""
    x, y = _data(19, n=48)

    def model():
        keras.utils.set_random_seed(19)
        m = _Wrapper()
        m(x[:1])
        return m
    probed = _falls_back_without_crashing(tmp_path, caplog, model, (x, y), "did not call the model")
    assert "train_step" not in probed.__dict__


def _falls_back_without_crashing(tmp_path, caplog, build, data, why: str):
    """Fit ``build()``'s model with a statistics-every-step capture (strict) whose step capture
    is refused saying ``why`` at its first sampled step: the probe (fit's first batch) is
    recorded from that step on, a warning says why, and training is what it is without the
    callback (returns the fitted model)."""
    x, y = data
    plain = build()
    plain_loss = _fit(plain, x, y, []).history["loss"]
    probed = build()
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, strict=True)
    probed_loss = _fit(probed, x, y, [cb]).history["loss"]
    assert why in caplog.text and "records a 16-sample probe batch instead" in caplog.text
    np.testing.assert_allclose(probed_loss, plain_loss, rtol=1e-6)
    for a, b in zip(probed.variables, plain.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)
    run = inspector.open_run(tmp_path / "r")
    assert why in run.manifest["probe"]["fallback"] and sorted(run.stats["step"].unique()) == [1, 2, 3]
    return probed


@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_a_model_loaded_from_a_checkpoint_resumes_at_its_count(tmp_path, caplog, source):
    """The same callback given a model loaded from an earlier checkpoint
    (keras.models.load_model: a new optimizer object, its count restored to 3) numbered the
    resumed steps 4-6 as 7-9, warning 'compile() again': a new optimizer was taken for one
    counting from 0, and the run showed the checkpoint's training after the first's as steps
    it never had. A new optimizer whose count is not 0 was restored: steps follow its count
    (docs/guide/keras.md: 'restored from a checkpoint keeps step = optimizer.iterations'), as they
    do for a new callback, and the later session wins the steps it repeats."""
    x, y = _data(20, n=48)
    keras.utils.set_random_seed(20)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    cb = InspectCallback(tmp_path / "r", **where, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
    save = keras.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch}.keras"), save_freq="epoch")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[cb, save])     # steps 1-6
    resumed = keras.models.load_model(str(tmp_path / "e1.keras"))
    assert int(resumed.optimizer.iterations.numpy()) == 3
    resumed.fit(x, y, batch_size=16, epochs=2, initial_epoch=1, shuffle=False, verbose=0, callbacks=[cb])  # 4-6
    assert int(resumed.optimizer.iterations.numpy()) == 6
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 6], [4, 6]]
    assert [m["step_offset"] for _, m in sorted(run.manifests.items())] == [0, 0]
    assert "restored to 3" in caplog.text and "compile() again" not in caplog.text


@pytest.mark.skipif(not KERAS3, reason="gradient_accumulation_steps is Keras 3's")
@pytest.mark.parametrize("source", ["probe", "train_batch"])
def test_gradient_accumulation_numbers_every_batch_across_fits(tmp_path, source):
    """With Keras 3's gradient_accumulation_steps=2, optimizer.iterations
    counts updates (batches // 2) while the callback numbers batches within a fit. A new
    callback (a notebook cell run again, a process resumed from a checkpoint) started at that
    count: the second fit's batches 4-6 were written as steps 2-4, hiding the first fit's rows
    of steps 2-3 (other batches, other weights). Steps count the optimizer's applied batches
    (its ``_iterations``), which checkpoints keep too."""
    x, y = _data(21, n=48)
    model = sequential()
    model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    where = dict(probe=(x[:8], y[:8])) if source == "probe" else dict(source="train_batch")
    for _ in range(2):   # a new callback per fit: steps 1-3, then 4-6
        cb = InspectCallback(tmp_path / "r", **where, stats_every_n_steps=1, dump_every_n_steps=0, strict=True)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 3], [4, 6]]


@pytest.mark.skipif(not KERAS3, reason="gradient_accumulation_steps is Keras 3's")
def test_gradient_accumulation_under_a_loss_scale_optimizer_numbers_every_batch_across_fits(tmp_path):
    """Mixed precision wraps the optimizer in a
    LossScaleOptimizer (compile() does so under 'mixed_float16'), whose ``iterations`` is its
    inner optimizer's, updates (batches // k), and which has no gradient_accumulation_steps of
    its own: a new callback started at the updates' count and wrote the second fit's batches
    4-6 as steps 2-4, hiding the first fit's rows. The inner optimizer's applied batches count."""
    x, y = _data(21, n=48)
    model = sequential()
    inner = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for _ in range(2):   # a new callback per fit: steps 1-3, then 4-6
        cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0,
                             strict=True)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 3], [4, 6]]


@pytest.mark.skipif(not KERAS3, reason="tf.keras 2 wraps an optimizer in one LossScaleOptimizer only, counting skips")
def test_compile_again_with_the_same_optimizer_under_a_loss_scale_continues_the_steps(tmp_path, caplog):
    """compile() under mixed precision wraps the optimizer in a
    new LossScaleOptimizer each time, around the same inner optimizer (one the user holds, passed
    again), whose count goes on. Where the loss scale skipped a step (Keras 3 does not count
    it), that count was below the steps written: the new wrapper was taken for a model loaded
    from a checkpoint, 'restored to 2', and the second fit's batches were written as steps 3-5,
    hiding the first fit's row of step 3. The count is the same variable: steps continue, 4-6."""
    x, y = _data(22, n=48)
    bad = x.copy()
    bad[0, 0] = np.nan   # the first batch's gradients are NaN: the loss scale skips it
    model = sequential()
    inner = keras.optimizers.SGD(0.1)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=1, dump_every_n_steps=0)
    for data in (bad, x):
        model.compile(optimizer=keras.mixed_precision.LossScaleOptimizer(inner),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(data, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert run.sessions.sort_values("session")[["first_step", "last_step"]].values.tolist() == [[1, 3], [4, 6]]
    assert "restored to" not in caplog.text


def test_a_first_fit_traces_each_kind_of_sampled_step_once(tmp_path, monkeypatch):
    """A first fit traces the capture once per kind of sampled step (statistics; statistics and
    dump): the variables holding its results are created outside tf.function's variable
    lifting, which would otherwise trace the whole step a second time. Full batches only (a
    smaller last batch is a new input shape: a retrace of its own), and every sampled step is
    recorded from those traces."""
    import hooks.keras.step as ks
    traces: list = []
    original = ks.StepGraph._capturing_step
    monkeypatch.setattr(ks.StepGraph, "_capturing_step",
                        lambda self, run, data, key: traces.append(key) or original(self, run, data, key))
    x, y = _data(14, n=8 * BATCH)
    cb = InspectCallback(tmp_path / "r", source="train_batch", stats_every_n_steps=2, dump_steps=[4, 8],
                         strict=True)
    _fit(sequential(), x, y, [cb])
    assert sorted(traces) == [(True, False), (True, True)]
    run = inspector.open_run(tmp_path / "r")
    assert sorted(set(run.query_stats()["step"])) == [2, 4, 6, 8]
    assert run.dump_steps() == [4, 8]
