"""What a model.fit user gets from InspectCallback's defaults: the training step itself as the
source (its gradients are the ones the step's update came from), a word at the end of a fit
that sampled no step, and the sample groups of ``groups=`` (per class, or a function)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402
from test_keras import _find  # noqa: E402

import inspector  # noqa: E402
from inspector.format.provenance import PROBE_NOTE  # noqa: E402

LR = 0.1
BATCH = 16


def _classes(n: int = 64, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, rng.integers(0, k, n).astype("int32")


def _model(k: int = 3, seed: int = 0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                              keras.layers.Dense(k, name="logits")])
    model.compile(optimizer=keras.optimizers.SGD(LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _name(w) -> str:
    return getattr(w, "path", None) or w.name.split(":")[0]


def test_the_default_records_the_gradients_the_update_came_from(tmp_path):
    """Without probe= the callback records the training step: under plain SGD every variable's
    update is -lr times its recorded gradient (the probe's, on the weights after the update,
    is about 1e-2 off). The probe asked for by probe= is labelled so in the catalog."""
    x, y = _classes()
    for name, kw in (("step", {}), ("probe", {"probe": (x[:BATCH], y[:BATCH])})):
        model = _model()
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[
            InspectCallback(tmp_path / name, stats_every_n_steps=1, dump_steps=[3], strict=True, **kw)])
        run = inspector.open_run(tmp_path / name)
        off = max(float(np.abs(run.tensor(_name(w), 3, "update") + LR * run.tensor(_name(w), 3, "gradient")).max())
                  for w in model.trainable_variables)
        if name == "step":
            assert run.manifest["probe"]["source"] == "train_batch" and off < 1e-6
            assert run.tensors["captured_on"].isna().all()
        else:
            assert run.manifest["probe"]["source"] == "probe" and off > 1e-4
            assert set(run.tensors["captured_on"]) == {PROBE_NOTE}


def test_a_fit_that_samples_no_step_says_so_at_its_end(tmp_path, caplog):
    """The documented defaults (docs/guide/keras.md, "Options") on a 40-step fit: no step
    sampled, no run directory, and not a word even at INFO (open_run then raised
    NotARunError). The fit's end warns, naming the
    schedule, the next sampled step and a setting that samples this fit; a second such fit of
    the same callback (a fit per epoch) says it at INFO; a fit that samples says nothing."""
    x, y = _classes(n=640)
    model = _model()
    cb = InspectCallback(tmp_path / "r")
    with caplog.at_level(logging.INFO, logger="tf_inspector"):
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[cb])
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[cb])
    said = [r for r in caplog.records if "sampled none of them" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "INFO"]
    assert "steps 1-40" in said[0].getMessage() and "the next sampled step is 100" in said[0].getMessage()
    assert "stats_every_n_steps (4 gives ~10 points over 40 steps)" in said[0].getMessage()
    assert "steps 41-80" in said[1].getMessage() and not (tmp_path / "r").exists()
    caplog.clear()
    _model().fit(x[:64], y[:64], batch_size=BATCH, verbose=0, callbacks=[InspectCallback(tmp_path / "s",
                                                                                          stats_every_n_steps=2)])
    assert "sampled none" not in caplog.text and inspector.open_run(tmp_path / "s").stats["step"].max() == 4


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_groups_per_class_split_statistics_and_dumps_by_class(tmp_path, source):
    """groups="per_class" on a 3-class model (a TypeError before): one statistics row per class,
    counting that class's samples; the class count is the model's output's last axis; the
    dumped samples carry their class's group."""
    x, y = _classes()
    probe = {"probe": (x[:BATCH], y[:BATCH])} if source == "probe" else {}
    model = _model()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[
        InspectCallback(tmp_path / "r", groups="per_class", stats_every_n_steps=1, dump_steps=[2], strict=True,
                        **probe)])
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["groups"]["names"] == ["class_0", "class_1", "class_2"]
    logits = _find(run.tensors, "logits/BiasAdd")
    rows = run.query_stats([logits], kinds=["forward"], columns=["count"])
    for step in (1, 2, 3, 4):
        batch = y[:BATCH] if source == "probe" else y[(step - 1) * BATCH:step * BATCH]
        counts = rows[rows["step"] == step].set_index("group")["count"]
        assert [int(counts[f"class_{k}"]) for k in range(3)] == [3 * int((batch == k).sum()) for k in range(3)]
        assert int(counts["all"]) == 3 * BATCH
    samples = run.samples(2)
    assert list(samples["group"]) == [f"class_{int(label)}" for label in samples["label"]]


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_the_default_groups_of_a_many_class_model_are_named_with_a_hint(tmp_path, caplog, source):
    """A 3-class model at the defaults is split positive (label != 0) / negative: the manifest
    (so info) names that rule, and the log says it once, pointing at groups='per_class'."""
    x, y = _classes()
    probe = {"probe": (x[:BATCH], y[:BATCH])} if source == "probe" else {}
    with caplog.at_level(logging.INFO, logger="tf_inspector"):
        _model().fit(x, y, batch_size=BATCH, verbose=0, callbacks=[
            InspectCallback(tmp_path / "r", stats_every_n_steps=1, strict=True, **probe)])
    run = inspector.open_run(tmp_path / "r")
    assert run.manifest["groups"]["rule"].startswith("positive/negative: ") and run.groups[1:] == ["positive",
                                                                                                  "negative"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sample groups ")]
    assert len(said) == 1 and "the model has 3 outputs: groups='per_class' gives one group per class" in said[0]


def test_groups_a_function_of_targets_and_predictions(tmp_path):
    """groups=fn(y, y_pred) -> {name: bool [N]}: DumpHook's meaning, y_pred the model's output."""
    x, y = _classes()

    def correct(labels, logits):
        hit = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), tf.cast(labels, tf.int32))
        return {"correct": hit, "wrong": tf.logical_not(hit)}
    model = _model()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[
        InspectCallback(tmp_path / "r", groups=correct, stats_every_n_steps=1, strict=True)])
    run = inspector.open_run(tmp_path / "r")
    assert run.groups == ["all", "correct", "wrong"]
    rows = run.query_stats([_find(run.tensors, "logits/BiasAdd")], kinds=["forward"], columns=["count"])
    wide = rows.pivot_table(index="step", columns="group", values="count")
    assert (wide["correct"] + wide["wrong"] == wide["all"]).all() and (wide["wrong"] > 0).all()


def test_groups_that_do_not_fit_are_refused_with_the_reason(tmp_path, caplog):
    """Class ids outside num_classes: that step's statistics are 'all' only, and the error names
    the rule. A model whose output has no class axis: per_class asks for num_classes=."""
    x, y = _classes()
    model = _model()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[
        InspectCallback(tmp_path / "r", groups="per_class", num_classes=2, stats_every_n_steps=1)])
    assert "class ids outside [0, num_classes)" in caplog.text
    run = inspector.open_run(tmp_path / "r")
    assert set(run.query_stats(groups=None, kinds=["forward"], columns=["count"])["group"]) == {"all"}
    one = _model(k=1)
    one.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    with pytest.raises(RuntimeError, match="pass num_classes="):
        one.fit(x, (y > 0).astype("float32"), batch_size=BATCH, verbose=0, callbacks=[
            InspectCallback(tmp_path / "s", groups="per_class", stats_every_n_steps=1, strict=True)])
