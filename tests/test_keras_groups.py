"""Groups through the layers that move the batch off axis 0, under tf.keras 2.15 and Keras 3: an
LSTM or GRU (Keras 3: a time-major while loop; tf.keras 2.15: a function call), a
LayerNormalization (tf.keras 2.15: a [1, B*T, D, 1] reshape around a batch norm), a
MultiHeadAttention block. Their outputs and the logits keep their groups, every per-sample dump
has one row per sample of ``run.samples`` (its values the model's on those samples), and a tensor
that is stored whole says why (catalog ``batch_note``, ``info``) and refuses ``sample=``."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402

import inspector  # noqa: E402
from inspector.cli import summary  # noqa: E402

B = 16   # the batch: one training step per fit, a static batch size (the hard case: no tf.shape)


def _model(kind: str):
    inp = keras.Input((5, 3))
    if kind in ("lstm", "gru"):
        layer = keras.layers.LSTM if kind == "lstm" else keras.layers.GRU
        h = layer(4, name="seq")(inp)
    elif kind == "ln":
        h = keras.layers.Flatten()(keras.layers.LayerNormalization(name="seq")(inp))
    elif kind == "mha":
        h = keras.layers.Flatten()(keras.layers.MultiHeadAttention(2, 4, name="seq")(inp, inp))
    else:   # reversing the batch's order: its rows are no longer the samples
        rev = keras.layers.Lambda(lambda t: tf.reverse(t, axis=[0]), name="seq")
        h = keras.layers.Flatten()(rev(inp))
    return keras.Model(inp, keras.layers.Dense(2, name="logits")(h), name="m")


def _fit(tmp_path, kind: str):
    keras.utils.set_random_seed(4)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(B, 5, 3)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    model = _model(kind)
    # lr 0: the recorded step's weights are the final ones, so the model recomputes its values
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=1, dump_steps=[1], samples_per_group=2,
                         source="train_batch")
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    return model, x, inspector.open_run(tmp_path / "r")


def _logits(run) -> str:
    cat = run.tensors
    rows = cat[(cat["op_type"] == "BiasAdd") & cat["keras_layer"].fillna("").str.endswith("logits")]
    assert len(rows) == 1, rows["name"].tolist()
    return rows.index[0]


@pytest.mark.parametrize("kind", ["lstm", "gru", "ln", "mha"])
def test_the_layers_output_and_the_logits_keep_their_groups(tmp_path, kind):
    model, x, run = _fit(tmp_path, kind)
    cat = run.tensors
    logits = _logits(run)
    assert set(run.query_stats([logits])["group"]) == {"all", "positive", "negative"}
    # the layer's own output (its last op of rank >= 2) is per-sample too
    seq = cat[cat["keras_layer"].fillna("").str.endswith("/seq") & (cat["kind"] == "tensor")
              & cat["shape"].map(lambda s: s is not None and len(s) >= 2)]
    assert seq["batched"].iloc[-1], seq[["op_type", "batched", "batch_note"]].tail().to_string()
    kept = run.samples(1)["index"].tolist()
    assert len(kept) == 4 and kept != list(range(4))   # two per group, not the first rows
    want = model(x).numpy()
    for i in kept:
        np.testing.assert_allclose(run.tensor(logits, 1, sample=i), want[i], rtol=1e-5, atol=1e-6)
    # every per-sample dump has the rows of run.samples; a tensor stored whole whose B rows
    # differ (per-sample data, not a constant state of the batch's size) says why
    for name in cat.index[(cat["kind"] == "tensor")]:
        value = run.tensor(name, 1)
        if cat.loc[name, "batched"]:
            assert value.shape[0] == len(kept), name
        elif value.ndim >= 2 and value.shape[0] == B and not np.all(value == value[:1]):
            assert isinstance(cat.loc[name, "batch_note"], str), name


def test_a_tensor_stored_whole_says_why_and_refuses_a_sample_index(tmp_path):
    """A layer reversing the batch's order: the tensors after it are dumped whole (their rows are
    not run.samples'), the catalog and info say where the batch was lost, and sample= is
    refused with that reason rather than picking a wrong row."""
    _, _, run = _fit(tmp_path, "reverse")
    logits = _logits(run)
    assert set(run.query_stats([logits])["group"]) == {"all"}
    note = run.tensors.loc[logits, "batch_note"]
    assert "stops being the batch at" in note and "ReverseV2" in note
    assert run.tensor(logits, 1).shape[0] == B   # the whole batch
    with pytest.raises(ValueError, match="stored whole.*ReverseV2"):
        run.tensor(logits, 1, sample=int(run.samples(1)["index"][0]))
    with pytest.raises(ValueError, match="not per-sample.*ReverseV2"):
        run.samples(1, tensor=logits)
    text = summary(run)
    assert "ReverseV2" in text[text.index("per-sample"):]


def test_the_batch_folded_by_a_layer_norm_is_named_per_tensor(tmp_path):
    """tf.keras 2.15's LayerNormalization normalizes a [1, B*T, D, 1] reshape with a fused batch
    norm: the reshape and the norm's output are per-sample rows in another shape (carried back
    after it), its per-row means are not; each says so. Keras 3 normalizes in place."""
    _, _, run = _fit(tmp_path, "ln")
    notes = run.tensors["batch_note"].dropna()
    if int(str(getattr(keras, "__version__", "2")).split(".")[0]) >= 3:
        assert notes.empty, notes.to_dict()
        return
    assert any("folded into another shape" in n for n in notes), notes.to_dict()
    assert any("FusedBatchNorm" in n for n in notes), notes.to_dict()
    assert not run.tensors.loc[notes.index, "batched"].any()


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_a_two_output_model_without_positive_lists_no_empty_groups(tmp_path, caplog, source):
    """Two outputs, no positive=/groups=: no labels give groups. run.groups, info and the
    viewer listed positive and negative (with no rows); they list 'all' alone and say why,
    naming positive=/groups= and the batch actually recorded."""
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 4)).astype("float32")
    ys = [(x[:, 0] > 0).astype("int32"), (x[:, 1] > 0).astype("int32")]
    inp = keras.Input((4,))
    h = keras.layers.Dense(3, activation="relu", name="h")(inp)
    model = keras.Model(inp, [keras.layers.Dense(2, name="a")(h), keras.layers.Dense(2, name="b")(h)],
                        name="two")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=[loss, loss])
    kw = {"probe": (x[:8], [y[:8] for y in ys])} if source == "probe" else {"source": "train_batch"}
    model.fit(x, ys, batch_size=8, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "r", stats_every_n_steps=1, **kw)])
    run = inspector.open_run(tmp_path / "r")
    assert run.groups == ["all"]
    whose = "the probe batch" if source == "probe" else "the training step's batch"
    note = run.groups_note
    assert whose in note and "positive=" in note and "groups=" in note and "2 outputs" in note
    assert any(line.startswith("groups") and note in line for line in summary(run).split("\n"))
    assert set(run.query_stats()["group"]) == {"all"}
    with pytest.raises(inspector.errors.UnknownGroupError):
        run.query_stats(groups=["positive"])
    assert caplog.text.count("no sample groups for two") == 1
