"""A Keras layer is named by its layer everywhere, under tf.keras 2.15 and Keras 3: the catalog's
``keras_layer`` (variable records included), the TensorBoard per-layer export and the viewer's
rows. Keras 3's op scopes carry call suffixes (``net_1/d1_1``) and read a kernel under a scope
of its own (``d1_1/Cast``): neither may name a layer, and a variable never makes one."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorboard")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402

import inspector  # noqa: E402
from inspector.export.tensorboard import layer_labels  # noqa: E402
from test_tensorboard_export import export, read_back  # noqa: E402
from viewer.layers import layer_rows  # noqa: E402


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_a_keras_layer_is_named_by_its_layer_everywhere(tmp_path, source):
    keras.utils.set_random_seed(2)
    x = np.random.default_rng(2).normal(size=(16, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    inp = keras.Input((4,))
    h = keras.layers.Dense(3, activation="relu", name="d1")(inp)
    model = keras.Model(inp, keras.layers.Dense(2, name="d2")(h), name="net")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kw = {"probe": (x[:8], y[:8])} if source == "probe" else {"source": source}
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[InspectCallback(tmp_path / "r", stats_every_n_steps=1, **kw)])
    run = inspector.open_run(tmp_path / "r")
    cat = run.tensors
    relu = cat.index[cat["op_type"] == "Relu"][0]
    kernel = cat.index[(cat["kind"] == "variable") & (cat["variable"] == "d1/kernel")][0]
    reads = cat[(cat["op_type"] == "ReadVariableOp") & (cat["kind"] == "tensor")]
    assert cat.loc[relu, "keras_layer"] == cat.loc[kernel, "keras_layer"] == "net/d1"
    assert set(reads["keras_layer"]) == {"net/d1", "net/d2"}

    labels = layer_labels(cat, list(cat.index))
    assert labels[relu] == "net/d1"   # the layer's output is its activation, not a read
    model_layers = {v for v in labels.values() if "d1" in v or "d2" in v}
    assert model_layers == {"net/d1", "net/d2"}, labels   # no net_1/d1_1, no .../Cast, no bare d1

    export(tmp_path / "r", tmp_path / "logs", per_layer=True)
    tags = read_back(tmp_path / "logs")[0]["r/positive/train"]
    row = run.query_stats([relu], kinds=["forward"], groups=["positive"])
    assert tags["forward/net/d1/rms"] == dict(zip(row["step"], np.float32(row["l2"] / np.sqrt(row["count"])).tolist()))
    assert not [t for t in tags if "Cast" in t or "_1/" in t]

    rows = layer_rows(cat, list(cat.index))
    mine = rows[rows["layer"] == "net/d1"]
    assert kernel in set(mine["tensor"]) and relu in set(mine["tensor"])
    assert mine.loc[mine["output"], "tensor"].tolist() == [relu]
