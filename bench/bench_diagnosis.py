"""Does the tool name the culprit? Small models trained with one injected fault each (plus healthy
controls), recorded by the hooks, then asked what went wrong; per case hit, wrong or miss.

Run::

    .venv/bin/python bench/bench_diagnosis.py                 # every fault, graph and Keras, 4 healthy runs
    .venv/bin/python bench/bench_diagnosis.py --quick         # 6 cases (smoke test, ~30 s)
    .venv/bin/python bench/bench_diagnosis.py --full          # + BN ResNet, VGG and a transformer block, healthy
    .venv/bin/python bench/bench_diagnosis.py --only nan_forward graph/healthy_mlp --keep /tmp/diag
    .venv-latest/bin/python bench/bench_diagnosis.py --json diag-latest.json   # TF >= 2.16, Keras 3

Method. Each case trains in a fresh subprocess (its own TF graph and the hooks' recorders;
``import hooks`` comes before the model is built), seeded, 60 steps of batch 32 on a small
synthetic binary task, recorded with the hook's defaults except ``stats_every_n_steps=5``:
graph mode builds a ``tf.compat.v1`` graph (variables and ops, no ``tf.compat.v1.layers``, so
it also builds under Keras 3) trained by ``MonitoredTrainingSession(hooks=[DumpHook(...)])``
with ``hooks.mark(loss=..., labels=...)``; Keras mode is ``model.fit(callbacks=[InspectCallback
(...)])``. Faults that start at a known step read the step the hooks will record (global
steps, the first is 1): graph mode feeds it, Keras mode reads a variable a callback sets
before each batch.

Then the parent (no TensorFlow) opens the run and asks the tool: ``inspector.analysis.diagnose
(run)`` (findings, most likely culprit first; docs/guide/diagnose.md).

Scoring. A case expects a ``layer`` (a scope substring such as ``fc2``), a ``step`` (or None
where the fault has no single step) and a ``kind``. The first finding of severity error or
warning is the tool's answer: ``hit`` if it names the layer (a substring of its layer, op or
tensor; for a case without a layer, a finding of the expected kind) and, where the case has a
step, its step lies within one statistics interval (5 steps) of it; ``wrong`` if it names
something else; ``miss`` if there is none. A healthy control counts each error or warning
that names a layer, op or tensor as a false alarm.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # first: imports below (noqa: E402) from this checkout

from bench.common import format_table  # noqa: E402

STATS_EVERY = 5
STEPS = 60
BATCH = 32
SEED = 7


@dataclass(frozen=True)
class Case:
    """One training: its mode, model, what was injected (``fault``: options of the model
    builders below) and what the tool should name. ``kind == "healthy"``: a control."""
    name: str
    mode: str                    # "graph" | "keras"
    model: str                   # "mlp" | "cnn" | "resnet" | "vgg" | "transformer"
    kind: str
    layer: str | None = None
    step: int | None = None
    fault: dict = field(default_factory=dict)
    tier: str = "default"        # "quick" (also in the default set) | "default" | "full"
    steps: int = STEPS

    @property
    def key(self) -> str:
        return f"{self.mode}/{self.name}"

    @property
    def healthy(self) -> bool:
        return self.kind == "healthy"


def _faults() -> list[tuple[str, str, str | None, int | None, dict]]:
    """(name, kind, layer, step, fault options): the same faults in both modes."""
    return [
        # log of a value made negative from step 20 on: the Log op in fc2 is the first NaN
        ("nan_forward", "nonfinite", "fc2", 20, {"nan_forward_at": 20}),
        # the norm of a vector that is exactly zero from step 30 on: forward finite (0),
        # its gradient 0/0 in fc1; the update then makes every weight NaN from step 31
        ("nan_backward", "nonfinite", "fc1", 30, {"nan_backward_at": 30}),
        # a custom-gradient identity scaling fc1's gradient by 10: fc1's updates grow until the
        # weights overflow (NaN from step 11). fc1 is linear here: with a ReLU the net rather
        # kills its units than diverges; the same net without the x10 trains at lr 1.2.
        ("exploding", "exploding", "fc1", None, {"grad_scale": 10.0, "act1": "none", "lr": 0.8}),
        # fc2's variables left out of what the optimizer applies: update exactly 0
        ("frozen", "frozen", "fc2", None, {"frozen": "fc2"}),
        # inputs x100 into a tanh layer: |tanh| ~ 1, its input gradient ~ 0
        ("saturated_tanh", "saturated", "fc1", None, {"input_scale": 100.0, "act1": "tanh"}),
        # every label 0 (binary task): the positive group is empty at every step
        ("empty_group", "empty_group", None, None, {"labels": "one_class"}),
        # dropout given the keep probability as its rate: 90% dropped after fc1's ReLU
        ("dropout_rate", "dropout", "drop1", None, {"dropout": 0.9}),
        # fc1's bias initialised at -10: its ReLU never fires
        ("dead_relu", "dead", "fc1", None, {"fc1_bias": -10.0}),
        # a schedule whose decimal point slipped: SGD at lr 0.1, then 10 from step 20 on
        ("lr_too_high", "loss_diverges", None, 20, {"lr_from": (20, 10.0)}),
    ]


#: --quick: a forward and a backward NaN, a silent fault per mode, a healthy run per mode
QUICK = {"graph/nan_forward", "keras/nan_backward", "graph/frozen", "keras/saturated_tanh", "graph/healthy_mlp",
         "keras/healthy_cnn"}


def all_cases() -> list[Case]:
    cases = []
    for mode in ("graph", "keras"):
        for name, kind, layer, step, fault in _faults():
            cases.append(Case(name, mode, "mlp", kind, layer, step, fault))
        cases += [Case("healthy_mlp", mode, "mlp", "healthy"), Case("healthy_cnn", mode, "cnn", "healthy")]
        cases += [Case(f"healthy_{m}", mode, m, "healthy", tier="full", steps=40) for m in ("resnet", "vgg")]
    cases.append(Case("healthy_transformer", "keras", "transformer", "healthy", tier="full", steps=40))
    return [dataclasses.replace(c, tier="quick") if c.key in QUICK else c for c in cases]


# ---- data (numpy, seeded) -------------------------------------------------------------------

def make_data(model: str, n: int, labels: str | None = None):
    """Inputs and binary labels of a learnable task; ``labels="one_class"``: every label 0."""
    import numpy as np
    rng = np.random.default_rng(SEED)
    if model == "mlp":
        x = rng.normal(size=(n, 16)).astype(np.float32)
        y = (x @ rng.normal(size=16) > 0).astype(np.int32)
    elif model == "transformer":
        x = rng.normal(size=(n, 8, 16)).astype(np.float32)
        y = (x[:, :, 0].sum(1) > 0).astype(np.int32)
    else:   # images: the centre of channel 0 is brighter in class 1, darker in class 0
        hw, q = (16, 4) if model in ("resnet", "vgg") else (8, 2)
        y = rng.integers(0, 2, n).astype(np.int32)
        x = rng.normal(size=(n, hw, hw, 1 if model == "cnn" else 3)).astype(np.float32)
        x[:, q:hw - q, q:hw - q, 0] += 0.3 * (2 * y - 1)[:, None, None]
        # 10% of the labels flipped: the loss cannot reach 0, whose gradients would vanish
        y = np.where(rng.random(n) < 0.1, 1 - y, y)
    return x, (np.zeros_like(y) if labels == "one_class" else y)


# ---- graph mode -----------------------------------------------------------------------------

def _gate(step, at: int):
    """1.0 from global step ``at`` on, else 0.0 (``step``: the step the run will be recorded at)."""
    import tensorflow as tf
    return tf.cast(step >= at, tf.float32)


def log_turning_nan(h, step, at: int):
    """log(1 + h) of a ReLU's output ``h``, whose argument flips sign from step ``at``: the NaN
    is born in the Log op, its inputs finite."""
    import tensorflow as tf
    sign = 1.0 - 2.0 * _gate(step, at)
    return tf.math.log(sign * (h + 1.0))


def norm_turning_zero(h, step, at: int):
    """h + 0.1 ||h * (1 - gate)||: from step ``at`` the norm's vector is exactly 0; its value is
    finite (0), its gradient 0/0."""
    import tensorflow as tf
    return h + 0.1 * tf.norm(h * (1.0 - _gate(step, at)), axis=-1, keepdims=True)


def amplify_gradient(scale: float) -> Callable:
    """An identity whose gradient is ``scale`` times the incoming one."""
    import tensorflow as tf

    @tf.custom_gradient
    def amplify(x):
        return tf.identity(x), lambda dy: dy * scale
    return amplify


def _act(name: str):
    import tensorflow as tf
    return {"relu": tf.nn.relu, "tanh": tf.nn.tanh, "none": tf.identity}[name]


def glorot(name: str, fan_in: int, units: int):
    """A dense kernel drawn by numpy, seeded by its layer's name: the graph and Keras MLPs start
    from the same weights on every TensorFlow, so a fault diverges alike in both."""
    import numpy as np
    limit = np.sqrt(6 / (fan_in + units))
    rng = np.random.default_rng([SEED, *name.encode()])
    return rng.uniform(-limit, limit, (fan_in, units)).astype(np.float32)


def _dense(x, units: int, bias: float = 0.0):
    import tensorflow as tf
    v1 = tf.compat.v1
    kernel = glorot(v1.get_variable_scope().name, int(x.shape[-1]), units)
    w = v1.get_variable("kernel", initializer=kernel)
    b = v1.get_variable("bias", [units], initializer=v1.constant_initializer(bias))
    return tf.nn.bias_add(tf.matmul(x, w), b)


def graph_mlp(x, step, f: dict):
    """x -> fc1 (32) -> [drop1] -> fc2 (32, ReLU) -> logits (2), with ``f``'s faults."""
    import tensorflow as tf
    v1 = tf.compat.v1
    h = x * f["input_scale"] if "input_scale" in f else x
    with v1.variable_scope("fc1"):
        h = _dense(h, 32, f.get("fc1_bias", 0.0))
        if "grad_scale" in f:
            h = amplify_gradient(f["grad_scale"])(h)
        if "nan_backward_at" in f:
            h = norm_turning_zero(h, step, f["nan_backward_at"])
        h = _act(f.get("act1", "relu"))(h)
    if "dropout" in f:
        with tf.name_scope("drop1"):
            h = tf.nn.dropout(h, rate=f["dropout"], seed=SEED)
    with v1.variable_scope("fc2"):
        h = tf.nn.relu(_dense(h, 32))
        if "nan_forward_at" in f:
            h = log_turning_nan(h, step, f["nan_forward_at"])
    with v1.variable_scope("logits"):
        return _dense(h, 2)


def graph_cnn(x, step, f: dict):
    """conv1 (3x3x8, ReLU) -> max pool -> conv2 (3x3x16, ReLU) -> mean -> logits (2)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    h = x
    for name, filters in (("conv1", 8), ("conv2", 16)):
        with v1.variable_scope(name):
            w = v1.get_variable("kernel", [3, 3, int(h.shape[-1]), filters],
                                initializer=v1.glorot_uniform_initializer(seed=SEED))
            b = v1.get_variable("bias", [filters], initializer=v1.zeros_initializer())
            h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w, 1, "SAME"), b))
        if name == "conv1":
            h = tf.nn.max_pool2d(h, 2, 2, "SAME")
    with v1.variable_scope("logits"):
        return _dense(tf.reduce_mean(h, [1, 2]), 2)


def bench_net(family: str) -> Callable:
    """bench/resnet.py's 8-layer network of ``family`` ("bn-resnet": ResNet v2 with batch norm,
    "vgg": its plain CNN), two classes."""
    from bench.resnet import inference
    return lambda x, step, f: inference(x, 1, filters=8, classes=2, family=family)


def train_graph(case: Case, run_dir: str) -> None:
    """MonitoredTrainingSession with DumpHook, fed from numpy; the step placeholder carries
    the global step the run will be recorded at (the first run is step 1). The ResNet and VGG
    train as bench_hook.py's do: weight decay, momentum, batch-norm updates in UPDATE_OPS."""
    import tensorflow as tf

    import hooks
    from bench.resnet import WEIGHT_DECAY
    v1 = tf.compat.v1
    f, deep = case.fault, case.model in ("resnet", "vgg")
    build = {"mlp": graph_mlp, "cnn": graph_cnn}.get(case.model) or bench_net(
        "bn-resnet" if case.model == "resnet" else "vgg")
    xs, ys = make_data(case.model, case.steps * BATCH, f.get("labels"))
    with tf.Graph().as_default():
        v1.set_random_seed(SEED)
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [BATCH, *xs.shape[1:]], name="x")
        y = v1.placeholder(tf.int32, [BATCH], name="labels")
        step = v1.placeholder(tf.int32, [], name="step")
        logits = build(x, step, f)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="xent")
        if deep:
            loss = tf.add(loss, WEIGHT_DECAY * tf.add_n([tf.nn.l2_loss(v) for v in v1.trainable_variables()]),
                          name="loss")
        hooks.mark(loss=loss, labels=y)
        lr = f.get("lr", 0.1)
        if "lr_from" in f:   # the rate of step k is read at global step k - 1, before its update
            lr = v1.train.piecewise_constant(gs, [f["lr_from"][0] - 2], [lr, f["lr_from"][1]])
        opt = v1.train.MomentumOptimizer(0.05, 0.9) if deep else v1.train.GradientDescentOptimizer(lr)
        var_list = [v for v in v1.trainable_variables() if not v.name.startswith(f"{f.get('frozen')}/")]
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train_op = opt.minimize(loss, global_step=gs, var_list=var_list)
        hook = hooks.DumpHook(run_dir, stats_every_n_steps=STATS_EVERY)
        with v1.train.MonitoredTrainingSession(hooks=[hook], checkpoint_dir=None) as sess:
            for i in range(case.steps):
                b = slice(i * BATCH, (i + 1) * BATCH)
                sess.run(train_op, {x: xs[b], y: ys[b], step: i + 1})


# ---- Keras ----------------------------------------------------------------------------------

def keras_layers():
    """The Keras classes, built on whichever Keras ``tf.keras`` is (2.15, or Keras 3)."""
    import tensorflow as tf
    keras = tf.keras

    class Fc(keras.layers.Layer):
        """A dense layer with graph_mlp's faults inside it (so their ops carry its name).
        ``clock``: a variable holding the step being trained (``StepClock``)."""

        def __init__(self, units: int, activation: str = "relu", fault: dict | None = None, clock=None, **kw):
            super().__init__(**kw)
            self.units, self.activation, self.fault, self.clock = units, activation, dict(fault or {}), clock

        def build(self, input_shape):
            kernel = glorot(self.name, int(input_shape[-1]), self.units)
            self.kernel = self.add_weight(name="kernel", shape=kernel.shape, initializer=lambda *a, **k: kernel)
            self.bias = self.add_weight(name="bias", shape=(self.units,),
                                        initializer=keras.initializers.Constant(self.fault.get("bias", 0.0)))

        def call(self, x):
            f = self.fault
            h = tf.nn.bias_add(tf.matmul(x, self.kernel), self.bias)
            if "grad_scale" in f:
                h = amplify_gradient(f["grad_scale"])(h)
            if "nan_backward_at" in f:
                h = norm_turning_zero(h, self.clock, f["nan_backward_at"])
            h = _act(self.activation)(h)
            if "nan_forward_at" in f:
                h = log_turning_nan(h, self.clock, f["nan_forward_at"])
            return h

    class PartialApply(keras.Model):
        """A train step that differentiates every variable but applies the gradients of those
        outside ``self.frozen`` only (graph mode's ``var_list`` mistake)."""
        frozen = ""

        def train_step(self, data):
            x, y = data[:2]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, self.trainable_variables)
                                            if not _var_name(v).startswith(f"{self.frozen}/")])
            return {"loss": loss}

    class StepClock(keras.callbacks.Callback):
        """Sets ``clock`` to the step the next batch trains (the step InspectCallback records)."""

        def __init__(self, clock):
            super().__init__()
            self.clock, self.n = clock, 0

        def on_train_batch_begin(self, batch, logs=None):
            self.n += 1
            self.clock.assign(self.n)

    return keras, Fc, PartialApply, StepClock


def _var_name(v) -> str:
    return getattr(v, "path", None) or v.name   # Keras 3: path "fc2/kernel"; tf.keras: name "fc2/kernel:0"


def keras_mlp(f: dict, clock):
    keras, Fc, PartialApply, _ = keras_layers()
    x = keras.Input((16,), name="x")
    h = keras.layers.Rescaling(f["input_scale"], name="scale")(x) if "input_scale" in f else x
    fc1 = {k: f[k] for k in ("grad_scale", "nan_backward_at") if k in f} | {"bias": f.get("fc1_bias", 0.0)}
    h = Fc(32, f.get("act1", "relu"), fc1, clock, name="fc1")(h)
    if "dropout" in f:
        h = keras.layers.Dropout(f["dropout"], seed=SEED, name="drop1")(h)
    h = Fc(32, "relu", {k: f[k] for k in ("nan_forward_at",) if k in f}, clock, name="fc2")(h)
    out = Fc(2, "none", name="logits")(h)
    if "frozen" in f:
        model = PartialApply(x, out)
        model.frozen = f["frozen"]
        return model
    return keras.Model(x, out)


def keras_cnn(model: str):
    """"cnn": graph_cnn's model; "vgg": 2x(conv, conv, pool), dense; "resnet": conv, 2 residual
    blocks (conv-BN-ReLU), pool, dense; "transformer": one encoder block (attention, FFN,
    LayerNorm) over 8 tokens, mean, dense."""
    import tensorflow as tf
    keras, L = tf.keras, tf.keras.layers
    init = keras.initializers.GlorotUniform(seed=SEED)
    shape = {"cnn": (8, 8, 1), "transformer": (8, 16)}.get(model, (16, 16, 3))
    x = keras.Input(shape, name="x")
    if model == "cnn":
        h = L.Conv2D(8, 3, padding="same", activation="relu", kernel_initializer=init, name="conv1")(x)
        h = L.MaxPooling2D(2, name="pool1")(h)
        h = L.Conv2D(16, 3, padding="same", activation="relu", kernel_initializer=init, name="conv2")(h)
        h = L.GlobalAveragePooling2D(name="gap")(h)
    elif model == "vgg":
        h = x
        for i, filters in enumerate((8, 8, 16, 16)):
            h = L.Conv2D(filters, 3, padding="same", activation="relu", kernel_initializer=init, name=f"conv{i + 1}")(h)
            if i % 2:
                h = L.MaxPooling2D(2, name=f"pool{i // 2 + 1}")(h)
        h = L.Flatten(name="flatten")(h)
    elif model == "resnet":
        h = L.Conv2D(16, 3, padding="same", kernel_initializer=init, name="stem")(x)
        for b in (1, 2):
            r = L.Conv2D(16, 3, padding="same", use_bias=False, kernel_initializer=init, name=f"block{b}_conv")(h)
            r = L.BatchNormalization(name=f"block{b}_bn")(r)
            h = L.ReLU(name=f"block{b}_relu")(L.Add(name=f"block{b}_add")([h, r]))
        h = L.GlobalAveragePooling2D(name="gap")(h)
    else:
        a = L.MultiHeadAttention(2, 8, kernel_initializer=init, name="attention")(x, x)
        h = L.LayerNormalization(name="norm1")(L.Add(name="res1")([x, a]))
        ff = L.Dense(16, kernel_initializer=init, name="ffn_out")(
            L.Dense(32, activation="relu", kernel_initializer=init, name="ffn_in")(h))
        h = L.GlobalAveragePooling1D(name="pool")(L.LayerNormalization(name="norm2")(L.Add(name="res2")([h, ff])))
    return keras.Model(x, L.Dense(2, kernel_initializer=init, name="logits")(h))


def train_keras(case: Case, run_dir: str) -> None:
    """``model.fit`` with InspectCallback (after StepClock, so the clock is set before the
    callback's batch begins), ``case.steps`` batches in one epoch, unshuffled."""
    import tensorflow as tf

    from hooks.keras import InspectCallback
    keras, _, _, StepClock = keras_layers()
    keras.utils.set_random_seed(SEED)
    f = case.fault
    clock = tf.Variable(0, dtype=tf.int32, trainable=False, name="clock")
    model = keras_mlp(f, clock) if case.model == "mlp" else keras_cnn(case.model)
    lr = f.get("lr", 0.1)
    if "lr_from" in f:   # as in train_graph: step k's rate is read at optimizer.iterations k - 1
        lr = keras.optimizers.schedules.PiecewiseConstantDecay([f["lr_from"][0] - 2], [lr, f["lr_from"][1]])
    opt = keras.optimizers.SGD(0.05, momentum=0.9) if case.model in ("resnet", "vgg") else keras.optimizers.SGD(lr)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    xs, ys = make_data(case.model, case.steps * BATCH, f.get("labels"))
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[StepClock(clock), InspectCallback(run_dir, stats_every_n_steps=STATS_EVERY)])


def child(key: str, run_dir: str) -> None:
    """Train one case (in its own process) and print a RESULT line: versions, seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import hooks  # noqa: F401 - before any model is built: records the optimizer's gradients
    case = {c.key: c for c in all_cases()}[key]
    t0 = time.perf_counter()
    (train_graph if case.mode == "graph" else train_keras)(case, run_dir)
    try:
        import keras
        keras_version = keras.__version__
    except ImportError:
        keras_version = "?"
    print("RESULT " + json.dumps({"tf": tf.__version__, "keras": keras_version,
                                  "train_s": round(time.perf_counter() - t0, 1)}), flush=True)


# ---- asking the tool ------------------------------------------------------------------------

#: what answers (printed with the results)
SOURCE = "inspector.analysis.diagnose"


#: Words a finding's kind may use for a fault that has no layer (the detector's names are its own).
KIND_WORDS = {"empty_group": ("empty", "group"), "loss_diverges": ("loss", "diverg")}


def _names(f) -> str:
    return " ".join(str(getattr(f, k)) for k in ("layer", "op", "tensor") if getattr(f, k, None))


def score(case: Case, findings: list) -> dict:
    """The case's verdict and what the tool named (its first error or warning)."""
    serious = [f for f in findings if getattr(f, "severity", None) in ("error", "warning")]
    if case.healthy:
        alarms = [f for f in serious if _names(f)]
        first = alarms[0] if alarms else None
        return {"verdict": f"{len(alarms)} false alarm(s)" if alarms else "silent", "false_alarms": len(alarms),
                **_named(first)}
    if not serious:
        return {"verdict": "miss", **_named(None)}
    first = serious[0]
    if case.layer is not None:
        right = case.layer in _names(first)
    else:   # no layer to name: the finding's kind must say what went wrong
        right = any(w in str(first.kind) for w in KIND_WORDS.get(case.kind, (case.kind,)))
    if right and case.step is not None:
        right = first.step is not None and abs(int(first.step) - case.step) <= STATS_EVERY
    return {"verdict": "hit" if right else "wrong", **_named(first)}


def _named(f) -> dict:
    if f is None:
        return {"named": None, "named_step": None, "named_kind": None, "severity": None, "evidence": None}
    where = f.layer or ""
    if f.op or f.tensor:
        where += f" ({f.op or f.tensor})" if where else (f.op or f.tensor)
    return {"named": where or None, "named_step": f.step, "named_kind": f.kind, "severity": f.severity,
            "evidence": f.evidence}


# ---- the parent: run every case, score, report ----------------------------------------------

def run_case(case: Case, root: Path, python: str) -> dict:
    """Train ``case`` in a subprocess, then diagnose its run here (no TensorFlow needed). A
    case that fails to train or to diagnose gets the verdict ``error`` and the error's tail."""
    import inspector
    run_dir = root / case.key.replace("/", "-")
    shutil.rmtree(run_dir, ignore_errors=True)   # a --keep directory reused: one session per run
    row = {"mode": case.mode, "case": case.name, "kind": case.kind, "expected_layer": case.layer,
           "expected_step": case.step}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, __file__, "--child", case.key, "--run-dir", str(run_dir)], timeout=900,
                              capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    except subprocess.TimeoutExpired:
        return {**row, "seconds": 900, **_failed("training timed out after 900 s")}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row.update(next((json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")), {}))
    if proc.returncode:
        return {**row, **_failed(" | ".join(proc.stderr.strip().splitlines()[-3:]))}
    from inspector.analysis import diagnose
    source = SOURCE
    try:
        findings = diagnose(inspector.open_run(run_dir))
    except Exception as e:  # noqa: BLE001 - a detector's error is the case's verdict, not the bench's end
        return {**row, **_failed(f"{source}: {type(e).__name__}: {e}")}
    return {**row, "answered_by": source, **score(case, findings),
            "findings": [dataclasses.asdict(f) if dataclasses.is_dataclass(f) else vars(f) for f in findings]}


def _failed(why: str) -> dict:
    return {"verdict": "error", "false_alarms": 0, **_named(None), "evidence": why}


def markdown(rows: list[dict]) -> str:
    def expected(r: dict) -> str:
        return "healthy" if r["kind"] == "healthy" else f"{r['expected_layer'] or '-'}, {r['expected_step'] or '-'}"

    def named(r: dict) -> str:
        if r["named"] is None and r["named_kind"] is None:
            return "-"
        step = "-" if r["named_step"] is None else r["named_step"]
        return f"{r['named'] or '-'}, {step}, {r['named_kind']}"

    lines = ["| mode | case | expected (layer, step) | named (layer/op, step, kind) | verdict |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['case']} | {expected(r)} | {named(r)} | {r['verdict']} |" for r in rows]
    return "\n".join(lines)


def totals(rows: list[dict]) -> str:
    faults = [r for r in rows if r["kind"] != "healthy"]
    healthy = [r for r in rows if r["kind"] == "healthy"]
    hits = sum(r["verdict"] == "hit" for r in faults)
    alarms = sum(r.get("false_alarms", 0) for r in healthy)
    errors = sum(r["verdict"] == "error" for r in rows)
    return (f"{hits} of {len(faults)} localized, {alarms} false alarms on {len(healthy)} healthy runs"
            + (f"; {errors} case(s) failed (verdict error)" if errors else ""))


def select(args: argparse.Namespace) -> list[Case]:
    """--only: the cases it names, of any tier; else the tier's (the default set holds --quick's)."""
    if args.only:
        return [c for c in all_cases() if any(o in c.key for o in args.only)]
    tiers = {"quick"} if args.quick else {"quick", "default"} | ({"full"} if args.full else set())
    return [c for c in all_cases() if c.tier in tiers]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(sorted(QUICK))} (smoke test)")
    p.add_argument("--full", action="store_true", help="add the larger healthy controls (ResNet, VGG, transformer)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="cases whose mode/name contains NAME")
    p.add_argument("--keep", metavar="DIR", help="write the runs here and keep them (else a temporary directory)")
    p.add_argument("--json", metavar="PATH", help="also write the rows (and every finding) as JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.run_dir)
    cases = select(args)
    if not cases:
        p.error(f"no case matches {args.only}; cases: {', '.join(c.key for c in all_cases())}")
    source = SOURCE
    print(f"answered by: {source}", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_diagnosis_") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        for case in cases:
            rows.append(run_case(case, root, sys.executable))
            r = rows[-1]
            print(f"  {case.key}: {r['verdict']} ({r['seconds']} s)", flush=True)
    wall = time.perf_counter() - t0
    versions = next((f"TF {r['tf']}, Keras {r['keras']}" for r in rows if r.get("tf")), "TF ?")
    print(f"\n{versions}; answered by {source}; stats_every_n_steps={STATS_EVERY}; {wall:.0f} s\n")
    print(markdown(rows))
    print(f"\n{totals(rows)}")
    print("\n" + format_table([(r["mode"] + "/" + r["case"], r["seconds"]) for r in rows], ["case", "seconds"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions, "answered_by": source, "seconds": round(wall, 1),
                                               "totals": totals(rows), "rows": rows}, indent=1, default=str))
    if any(r["verdict"] == "error" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
