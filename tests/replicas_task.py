"""Training on two logical CPU devices under MirroredStrategy, for tests/test_replicas.py (a process
of its own: the logical devices must be set before TensorFlow initialises its devices).

    python tests/replicas_task.py fit RUN_DIR OUT.npz SOURCE [inside]   # fit + InspectCallback
    python tests/replicas_task.py loop RUN_DIR                           # inspect_step: refused

``fit`` trains 2 steps of 16 samples (8 per replica) with ``source=SOURCE`` (``train_batch``: the
step's global batch; ``probe``: the first 16 samples), dumped at step 2, and saves x, y, the
weights step 2 read (``b0``...) and the trained weights (``w0``...) (numpy's npz) for the test's
oracle; ``inside`` calls fit inside ``strategy.scope()``.
``loop`` prints the ValueError inspect_step raises for a model under the strategy.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from hooks.keras import InspectCallback, inspect_step  # noqa: E402

logging.basicConfig(level=logging.WARNING)
keras = tf.keras


def build():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                             keras.layers.Dense(2, name="logits")])


def main() -> None:
    mode, run_dir = sys.argv[1], sys.argv[2]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    with strategy.scope():
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if mode == "loop":
        try:
            inspect_step(lambda x, y: None, run_dir, model)
        except ValueError as e:
            print(f"REFUSED: {e}")
        return
    before: dict = {}
    keep = keras.callbacks.LambdaCallback(   # the weights the second step reads
        on_train_batch_begin=lambda b, logs: before.update(enumerate(model.get_weights())) if b == 1 else None)
    probe = (x[:16], y[:16]) if sys.argv[4] == "probe" else None
    cb = InspectCallback(run_dir, source=sys.argv[4], probe=probe, stats_every_n_steps=1,
                         dump_steps=[2], samples_per_group=16, strict=True)
    fit = dict(batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[keep, cb])
    if sys.argv[5:] == ["inside"]:
        with strategy.scope():
            model.fit(x, y, **fit)
    else:
        model.fit(x, y, **fit)
    np.savez(sys.argv[3], x=x, y=y, **{f"w{i}": w for i, w in enumerate(model.get_weights())},
             **{f"b{i}": w for i, w in before.items()})


if __name__ == "__main__":
    main()
