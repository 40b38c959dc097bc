"""Training on two logical CPU devices under MirroredStrategy, for tests/test_replicas.py (a process
of its own: the logical devices must be set before TensorFlow initialises its devices).

    python tests/replicas_task.py fit RUN_DIR OUT.npz SOURCE [inside]   # fit + InspectCallback
    python tests/replicas_task.py loop RUN_DIR OUT.npz                   # inspect_step, strategy.run

``fit`` trains 2 steps of 16 samples (8 per replica) with ``source=SOURCE`` (``train_batch``: the
step's global batch; ``probe``: the first 16 samples), dumped at step 2, and saves x, y, the
weights step 2 read (``b0``...) and the trained weights (``w0``...) (numpy's npz) for the test's
oracle; ``inside`` calls fit inside ``strategy.scope()``. ``loop`` trains the same 2 steps in a
custom loop (``strategy.run`` of a GradientTape replica step, ``tf.nn.compute_average_loss``)
wrapped by inspect_step, and saves the same.
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
        loop(strategy, model, x, y, run_dir)
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


def loop(strategy, model, x, y, run_dir) -> None:
    """The custom-loop guide's distributed loop: 2 steps of 16 samples, the second dumped."""
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    optimizer = model.optimizer

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_sample(y, model(x, training=True)), global_batch_size=16)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
    before: list = []
    with inspect_step(train_step, run_dir, model, stats_every_n_steps=1, dump_steps=[2],
                      samples_per_group=16, strict=True) as step:
        for i, (xb, yb) in enumerate(dataset):
            before = model.get_weights() if i == 1 else before
            step(xb, yb)
    np.savez(sys.argv[3], x=x, y=y, **{f"w{i}": w for i, w in enumerate(model.get_weights())},
             **{f"b{i}": w for i, w in enumerate(before)})


if __name__ == "__main__":
    main()
