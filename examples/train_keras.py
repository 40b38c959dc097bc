"""Train the ICNN and its plain twin with ``model.fit`` and ``InspectCallback`` (Keras 3 on the
latest TensorFlow, or tf.keras 2.15), then compare them: the Keras twin of ``train_demo``.

Run::

    python -m examples.train_keras --runs runs-keras --epochs 6
    streamlit run app.py -- runs-keras            # or: python -m inspector app runs-keras

writes ``runs-keras/icnn`` and ``runs-keras/plain`` and prints held-out accuracy and the location
instability of the 32 conv3 filters (the map the ICNN masks), as ``train_demo`` does. The
architecture is ``examples/models.py``'s, from Keras layers; the ICNN mask is
``hooks.keras.icnn.ICNNMask``, fed the labels as a second input (``positive``; zeros at
inference: the mask alone, as the TF-compat model). The callback probes 16 fixed held-out images.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Dict

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the imports below (noqa: E402): TF reads it once
import tensorflow as tf  # noqa: E402

from examples.parts_data import make_parts_dataset  # noqa: E402
from examples.train_demo import evaluate  # noqa: E402
from hooks.keras import InspectCallback  # noqa: E402
from hooks.keras.icnn import ICNNEpoch, ICNNMask  # noqa: E402

keras = tf.keras
PROBE = 16
#: The mask layer's internal ops (Abs, Floor, Gather, ... and its monitor's templates): left out
#: of the capture, which still holds the layer's role tensors (always captured). With them the
#: ICNN run captured 148 tensors against the plain twin's 84, each with statistics and dump ops
#: to build.
ICNN_INTERNALS = r"(^|/)icnn_mask(_\d+)?/"


def build(icnn: bool, weight_decay: float = 1e-4, filter_loss_weight: float = 1.0, mu: str = "centroid"):
    """(training model on [images, positive], inference model images -> [probability, conv3 map,
    conv3 before its ReLU]: the release's stability metric reads the raw conv output)."""
    reg = keras.regularizers.l2(weight_decay / 2)  # tf.nn.l2_loss is sum(w**2) / 2, as in models.py
    images = keras.Input((48, 48, 1), name="image")
    positive = keras.Input((), dtype="bool", name="positive")

    def conv(x, name, k, cout, activation="relu"):
        return keras.layers.Conv2D(cout, k, padding="same", activation=activation, kernel_regularizer=reg,
                                   kernel_initializer="he_normal", name=name)(x)

    x = keras.layers.MaxPooling2D(2, name="pool1")(conv(images, "conv1", 5, 16))
    x = keras.layers.MaxPooling2D(2, name="pool2")(conv(x, "conv2", 3, 32))
    top_raw = conv(x, "conv3", 3, 32, activation=None)
    top = keras.layers.ReLU(name="conv3_relu")(top_raw)
    post = (ICNNMask(name="icnn_mask", mu=mu, filter_loss_weight=filter_loss_weight)([top, positive])
            if icnn else top)
    feat = keras.layers.GlobalMaxPooling2D(name="global_max_pool")(conv(post, "conv4", 3, 32))
    logits = keras.layers.Reshape((), name="logits")(keras.layers.Dense(1, kernel_regularizer=reg, name="logit")(feat))
    model = keras.Model([images, positive], logits, name="icnn" if icnn else "plain")
    infer = keras.Model([images, positive], [keras.layers.Activation("sigmoid")(logits), top, top_raw])
    return model, infer


def train(kind: str, run_dir: Path, x, y, x_probe, y_probe, *, epochs: int, batch: int, seed: int,
          callback_kwargs: Dict, filter_loss_weight: float = 1.0):
    keras.utils.set_random_seed(seed)
    model, infer = build(kind == "icnn", filter_loss_weight=filter_loss_weight)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    probe = ([x_probe, y_probe == 1], y_probe.astype("float32"))
    cb = InspectCallback(run_dir, probe=probe, **callback_kwargs)
    model.fit([x, y == 1], y.astype("float32"), batch_size=batch, epochs=epochs, verbose=0,
              callbacks=[cb, ICNNEpoch()])
    return infer


def predict(infer, images, chunk: int = 250) -> Dict[str, np.ndarray]:
    out: Dict[str, list] = {"probability": [], "top": [], "top_raw": []}
    for i in range(0, len(images), chunk):
        got = infer([images[i:i + chunk], np.zeros(len(images[i:i + chunk]), bool)], training=False)
        for key, value in zip(out, got):
            out[key].append(np.asarray(value))
    return {key: np.concatenate(parts) for key, parts in out.items()}


def main(argv=None) -> Dict[str, Dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="runs-keras", help="folder for the runs icnn/ and plain/")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--train-size", type=int, default=6000)
    ap.add_argument("--test-size", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--filter-loss-weight", type=float, default=1.0)
    ap.add_argument("--models", nargs="+", default=["icnn", "plain"], choices=["icnn", "plain"])
    ap.add_argument("--stats-every", type=int, default=50)
    ap.add_argument("--dump-every", type=int, default=200)
    args = ap.parse_args(argv)
    t0 = time.time()
    x_tr, y_tr, _ = make_parts_dataset(args.train_size, seed=args.seed)
    x_te, y_te, p_te = make_parts_dataset(args.test_size, seed=args.seed + 10_000)
    last = args.epochs * (args.train_size // args.batch + (args.train_size % args.batch > 0))
    kwargs = dict(stats_every_n_steps=args.stats_every, dump_every_n_steps=args.dump_every, dump_steps=[last],
                  samples_per_group=4, exclude=[ICNN_INTERNALS])
    results: Dict[str, Dict[str, float]] = {}
    for kind in args.models:
        t = time.time()
        infer = train(kind, Path(args.runs) / kind, x_tr, y_tr, x_te[:PROBE], y_te[:PROBE], epochs=args.epochs,
                      batch=args.batch, seed=args.seed, callback_kwargs=kwargs,
                      filter_loss_weight=args.filter_loss_weight)
        results[kind] = {**evaluate(predict(infer, x_te), y_te, p_te, args.top_k), "train_seconds": time.time() - t}
    print(f"\nheld-out set: {args.test_size} images ({int(y_te.sum())} positive); conv3 filters, top-{args.top_k}")
    print(f"{'model':<7}{'accuracy':>10}{'instability':>13}{'(alive only)':>14}{'dead filters':>14}{'train s':>9}")
    for kind, r in results.items():
        print(f"{kind:<7}{r['accuracy']:>10.3f}{r['instability']:>13.4f}{r['instability_alive']:>14.4f}"
              f"{r['dead_filters']:>14d}{r['train_seconds']:>9.1f}")
    print(f"wall time {time.time() - t0:.1f} s; runs in {Path(args.runs).resolve()}")
    return results


if __name__ == "__main__":
    logging.basicConfig(format="%(name)s %(levelname)s: %(message)s")
    logging.getLogger("tf_inspector").setLevel(logging.INFO)
    main()
