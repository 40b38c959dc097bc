"""``steps_per_execution > 1`` under tf.keras 2.15 and Keras 3: Keras calls batch callbacks once
per execution, so the callback records the probe (the step capture records one step's batch) on
the last step of each execution that holds a sampled step. Such fits were refused and recorded
nothing."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = tf.keras

from hooks.keras import InspectCallback  # noqa: E402

import inspector  # noqa: E402


@pytest.mark.parametrize("source", ["train_batch", "probe"])
def test_a_fit_of_several_steps_per_execution_records_each_sampled_executions_last_step(
        tmp_path, caplog, source):
    keras.utils.set_random_seed(6)
    x = np.random.default_rng(6).normal(size=(16, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu", name="h"),
                              keras.layers.Dense(2, name="logits")], name="spe")
    model.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=3,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    probe = (x[:8], y[:8])
    kw = {"probe": probe} if source == "probe" else {"source": "train_batch", "probe": probe}
    # 4 steps an epoch: executions of steps 1-3 and 4, then 5-7 and 8; statistics on even steps
    cb = InspectCallback(tmp_path / "r", stats_every_n_steps=2, dump_steps=[8], strict=True, **kw)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
    run = inspector.open_run(tmp_path / "r")
    assert sorted(set(run.stats_steps())) == [3, 4, 7, 8]
    assert run.steps == [8]
    if source == "train_batch":   # the step capture cannot: the probe instead, said so
        assert "steps_per_execution=3" in caplog.text
    assert run.manifest["probe"]["source"] == "probe"
    # the probe after the last update: the model's own output on it
    cat = run.tensors
    logits = cat.index[(cat["op_type"] == "BiasAdd") & cat["keras_layer"].fillna("").str.endswith("logits")][0]
    kept = run.samples(8)["index"].to_numpy()
    np.testing.assert_allclose(run.tensor(logits, 8), model(probe[0]).numpy()[kept], rtol=1e-5, atol=1e-6)
