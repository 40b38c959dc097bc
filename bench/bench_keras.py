"""Cost of InspectCallback on ``model.fit``, side by side with plain fit, Keras TensorBoard and
Debugger V2.

Run::

    .venv-latest/bin/python bench/bench_keras.py              # 5 reps of 100-step blocks
    .venv/bin/python bench/bench_keras.py --reps 7            # tf.keras 2.15
    .venv-latest/bin/python bench/bench_keras.py --quick      # smoke run (seconds, numbers meaningless)
    .venv-latest/bin/python bench/bench_keras.py --model resnet --reps 9   # ResNet-8 v2 (bench_hook's)

Method. One model per configuration (the same model and seed: ``--model small``, conv 16 / pool
/ conv 32 / pool / conv 32 / dense 10 on 32x32x3, a ~5 ms step here; or ``--model resnet``,
bench_hook.py's ResNet-8 v2 with batch norm in Keras layers; batch 32, random images from an
in-memory ``tf.data`` pipeline), compiled and warmed up once. Then, for each repetition, for
each configuration (in an order shuffled every repetition), one
``model.fit(steps_per_epoch=--block, epochs=1)``; a timing callback placed last measures from
the end of the block's first step to the end of ``on_train_end`` (which, for the callback,
closes its writer session after the last dump is on disk, so writing counts). Per
configuration: the median over repetitions of the time per step, and its ratio to plain fit's
in the same process over the same minutes. Run directories are deleted (untimed) after each
block and ``os.sync()`` flushes their writeback.

Each configuration's model also fits a plain block (no callbacks) beside each of its blocks,
in a random order of the two: ``ratio to own plain`` is the median over repetitions of the
block's time over that plain block's. Two models built alike train at different speeds here
(``plain (twin)`` differs from ``plain`` by up to several percent, and single models by more:
one trial had one model's steps 20% faster than another's over a whole run), so
``ratio to plain`` (another model's plain fit) carries that spread into every row; ``ratio to
own plain`` does not (its ``plain`` row: plain against plain, the noise floor).

For the statistics rows, ``read floor``: plain's step plus one read of every byte the step
captures (each captured tensor and its gradient at the batch size, or the probe's) at the
memory bandwidth measured here (``bench_hook.memory_bandwidth``: numpy, one core), over
plain's step: a lower bound the statistics step cannot go below (it leaves out the fusions
Grappler cannot make once an intermediate tensor is read).

Besides the step times, the callback's own time: every call of its batch methods and
``on_train_end`` is timed, per step (``callback ms/step``), and ``1 + callback/plain`` is the
ratio that time alone gives. For the idle callback that is the cost to read: 100-step blocks
of two identical plain models differ by several percent here (row ``plain (twin)``), more than
the 2% the idle target allows.

Configurations, each with both sources: the default, the training step itself (no suffix or
``/train-batch``: the capture inside fit's own train step, on its batch, no second pass), and
``/probe`` (``--probe`` fixed samples, default 32, the batch size, run after the step's update):

1. ``plain``: fit without callbacks; ``plain (twin)``: a second, identical plain model (the
   noise between configurations).
2. ``idle``, ``idle/probe``: InspectCallback attached, on steps where it neither computes
   statistics nor dumps.
3. ``defaults``, ``defaults/probe``: InspectCallback's defaults (statistics every 100 steps, a
   dump of 2 samples per group every 1000), amortised: a block is 100 steps, so it holds one
   statistics step; a dump is added with its frequency: ``t(defaults) + (t(dump-2/grp) -
   t(idle)) / 1000`` (the ``/probe`` rows for ``defaults/probe``).
4. ``stats-every/train-batch``, ``stats-every/probe``: statistics on every step.
   ``stats-every/tb/no-input``: the former with the input images excluded (``exclude=``, their
   value and their gradient): what ``d loss / d input``, the one gradient plain training never
   computes, costs a statistics step.
5. ``dump-full/probe``: every op's forward value and gradient for every probe sample, every step.
6. ``dump-2/grp``, ``dump-2/grp/probe``: the default dump (2 positive + 2 negative samples)
   every step (for 3).
8. ``tensorboard``: ``keras.callbacks.TensorBoard(histogram_freq=1)``: weight histograms once
   per epoch (a block is one epoch); it records no activations or gradients.
9. ``debugger-v2``: ``tf.debugging.experimental.enable_dump_debug_info(...,
   tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1)``. It instruments every function
   traced and every eager op run after it is enabled, process-wide, and
   ``disable_dump_debug_info`` does not remove the instrumentation from functions already
   traced. So it runs in its own process segment (this script re-run with ``--segment
   debugger``): there ``plain`` is compiled and traced before Debugger V2 is enabled, the
   debugger's model after, and the two are interleaved as above; its ratio is to that
   segment's plain fit (whose eager function call also passes the debugger's op callback).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    from bench.common import format_table
except ImportError:  # run as `python bench/bench_keras.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.common import format_table
from bench.bench_hook import memory_bandwidth  # noqa: E402 - after the path set-up

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from hooks.keras import InspectCallback  # noqa: E402

keras = tf.keras
BATCH = 32
#: the batch's input images in the traced train step (Keras 3, tf.keras 2.15); not the labels
INPUT = r"^(data|IteratorGetNext):0$"


class Timer(keras.callbacks.Callback):
    """Seconds from the end of the first step to the end of fit (writers closed)."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def build_model(seed: int = 0, kind: str = "small"):
    """``small``: the CNN below (a ~5 ms step here: fixed per-step costs weigh most). ``resnet``:
    the ResNet-8 v2 of ``bench_hook.py`` (batch norm, 16/32/64 filters) in Keras layers."""
    keras.utils.set_random_seed(seed)
    if kind == "resnet":
        return _compiled(resnet8())
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2, name="pool1"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2, name="pool2"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv3"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(10, name="logits")], name="cnn")
    return _compiled(model)


def _compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def resnet8():
    """Pre-activation ResNet v2, 6n+2 layers with n = 1 (bench/resnet.py's bn-resnet)."""
    layers = keras.layers

    def bn_relu(x, name):
        return layers.ReLU(name=f"{name}_relu")(layers.BatchNormalization(name=f"{name}_bn")(x))

    inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv1")(inp)
    for stage, filters in enumerate((16, 32, 64)):
        stride = 1 if stage == 0 else 2
        pre = bn_relu(x, f"stage{stage}_pre")
        shortcut = x if stage == 0 else layers.Conv2D(filters, 1, stride, use_bias=False,
                                                      name=f"stage{stage}_projection")(pre)
        h = layers.Conv2D(filters, 3, stride, padding="same", use_bias=False, name=f"stage{stage}_conv1")(pre)
        h = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"stage{stage}_conv2")(
            bn_relu(h, f"stage{stage}_mid"))
        x = layers.Add(name=f"stage{stage}_add")([h, shortcut])
    x = layers.GlobalAveragePooling2D(name="gap")(bn_relu(x, "final"))
    return keras.Model(inp, layers.Dense(10, name="logits")(x), name="resnet8")


def data(n: int = 512):
    rng = np.random.default_rng(0)
    x = rng.random((n, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, n).astype("int32")
    return x, y, tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True).prefetch(2)


def configs(root: Path, probe) -> dict[str, list]:
    def cb(name, **kw):   # a fixed probe batch, run after the step's update
        return [InspectCallback(root / name, probe=probe, source="probe", **kw)]

    def tb(name, **kw):   # the default: the step's own batch, captured inside the step
        return [InspectCallback(root / name, **kw)]
    never = dict(stats_every_n_steps=0, dump_every_n_steps=0)
    return {
        "plain": [],
        "plain (twin)": [],   # a second plain model: how far two identical configurations differ here
        "idle": tb("idle", **never),
        "idle/probe": cb("idle-probe", **never),
        "defaults": tb("defaults"),
        "defaults/probe": cb("defaults-probe"),
        "stats-every/train-batch": tb("stats-every-tb", stats_every_n_steps=1, dump_every_n_steps=0),
        "stats-every/probe": cb("stats-every", stats_every_n_steps=1, dump_every_n_steps=0),
        "dump-full/probe": cb("dump-full", stats_every_n_steps=0, dump_every_n_steps=1,
                              samples_per_group=len(probe[0])),
        "dump-2/grp": tb("dump-2grp", stats_every_n_steps=0, dump_every_n_steps=1),
        "dump-2/grp/probe": cb("dump-2grp-probe", stats_every_n_steps=0, dump_every_n_steps=1),
        # the same with the input images left out: their gradient is the one backward op
        # training never runs (a backward-data convolution to 3 channels); what that costs
        "stats-every/tb/no-input": tb("stats-every-tb-no-input", stats_every_n_steps=1, dump_every_n_steps=0,
                                      exclude=INPUT),
        "tensorboard": [keras.callbacks.TensorBoard(str(root / "tensorboard"), histogram_freq=1)],
    }


class CallbackClock:
    """Seconds spent inside the callbacks' batch methods and on_train_end (their own Python and
    the reads they do: the idle cost, without the block-to-block noise of the step times)."""

    METHODS = ("on_train_batch_begin", "on_train_batch_end", "on_train_end")

    def __init__(self, callbacks) -> None:
        self.seconds = 0.0
        self.spent: list[float] = []   # per block: seconds in the callbacks per step
        for cb in callbacks:
            for name in self.METHODS:
                setattr(cb, name, self._timed(getattr(cb, name)))

    def _timed(self, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
        return wrapper


def captured_bytes(callbacks: list) -> int:
    """What one statistics step of the callback in ``callbacks`` reads: every captured tensor and
    gradient, a training batch's unknown batch axis taken as ``BATCH`` (0: no callback)."""
    graph = next((cb._graph for cb in callbacks if isinstance(cb, InspectCallback)), None)
    if graph is None:
        return 0
    total = 0
    for t in (t for c in graph.captured for t in (c.tensor, c.gradient) if t is not None):
        dims = [BATCH if d is None else d for d in t.shape.as_list()] if t.shape.rank is not None else [1]
        total += int(np.prod(dims, dtype=np.int64)) * t.dtype.size
    return total


def measure(names, models, callbacks, ds, reps: int, block: int, root: Path,
            clocks: dict | None = None, paired: dict | None = None) -> dict[str, list[float]]:
    """Seconds per step of each configuration's blocks. ``paired`` (a dict, filled): each block
    of a configuration has a plain block (no callbacks) of the same model beside it, in a random
    order of the two: ``paired[name]`` holds those blocks' seconds per step."""
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up: traces the train function (and the callback's probe graph)
        models[name].fit(ds, steps_per_epoch=2, epochs=1, verbose=0, callbacks=callbacks[name] + [Timer()])
    for _ in range(reps):
        order = list(names)
        random.shuffle(order)
        for name in order:
            runs = [False, True] if paired is not None else [False]
            random.shuffle(runs)
            for plain in runs:
                seconds = _block(models[name], [] if plain else callbacks[name], ds, block,
                                 None if plain or not clocks else clocks[name])
                (paired.setdefault(name, []) if plain else times[name]).append(seconds)
            for p in root.iterdir():  # untimed: the block's files, then their writeback
                if p.name != "debugger":
                    shutil.rmtree(p, ignore_errors=True)
            os.sync()
    return times


def _block(model, callbacks, ds, block: int, clock: CallbackClock | None) -> float:
    """One fit of ``block`` steps: seconds per step (the callbacks' own time into ``clock``)."""
    timer = Timer()
    clock_before = clock.seconds if clock else 0.0
    model.fit(ds, steps_per_epoch=block, epochs=1, verbose=0, callbacks=callbacks + [timer])
    if clock:
        clock.spent.append((clock.seconds - clock_before) / block)
    return timer.seconds / (block - 1)


def debugger_segment(reps: int, block: int, kind: str) -> dict[str, list[float]]:
    """plain and Debugger V2 in this process: plain traced before the debugger is enabled."""
    _, _, ds = data()
    root = Path(tempfile.mkdtemp(prefix="bench_keras_dbg_"))
    try:
        plain = build_model(kind=kind)
        plain.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
        tf.debugging.experimental.enable_dump_debug_info(str(root / "debugger"), tensor_debug_mode="FULL_HEALTH",
                                                         circular_buffer_size=-1)
        models = {"plain": plain, "debugger-v2": build_model(kind=kind)}
        return measure(list(models), models, {n: [] for n in models}, ds, reps, block, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def mlp(seed: int = 0):
    """A 2-layer MLP (Dense 64 relu, Dense 10) on 32 features: the fixed-cost mode's small model."""
    keras.utils.set_random_seed(seed)
    return _compiled(keras.Sequential([keras.Input((32,)),
                                       keras.layers.Dense(64, activation="relu", name="hidden"),
                                       keras.layers.Dense(10, name="logits")], name="mlp"))


def fixed_cost(reps: int, kind: str, root: Path) -> list[tuple]:
    """Per-fit fixed cost of the callback (tracing its functions, opening its run): a short fit
    (8 steps; statistics on steps 4 and 8, a dump on 8) of a fresh model with the callback, then
    a second fit of the same model and callback, each beside the same fits of a fresh plain model
    (which trace fit's own function the same way); wall and process CPU seconds, medians over
    ``reps`` in a shuffled order. CPU time is the steadier measure on a loaded machine."""
    rng = np.random.default_rng(0)
    shape = (32,) if kind == "mlp" else (32, 32, 3)
    x = rng.normal(size=(8 * BATCH, *shape)).astype("float32")
    y = rng.integers(0, 10, size=8 * BATCH).astype("int32")
    build = (lambda: mlp()) if kind == "mlp" else (lambda: build_model(kind=kind))
    sources = {"plain": None, "train-batch": {"source": "train_batch"},
               "probe": {"probe": (x[:BATCH], y[:BATCH])}}
    times: dict[tuple[str, int], list[float]] = {(n, i): [] for n in sources for i in (1, 2)}
    cpu: dict[tuple[str, int], list[float]] = {(n, i): [] for n in sources for i in (1, 2)}
    for rep in range(reps):
        for name in random.sample(list(sources), len(sources)):
            model = build()
            cbs = [] if sources[name] is None else [InspectCallback(
                root / f"{name}-{rep}", stats_every_n_steps=4, dump_steps=[8], **sources[name])]
            for i in (1, 2):
                start, used = time.perf_counter(), time.process_time()
                model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=cbs)
                times[(name, i)].append(time.perf_counter() - start)
                cpu[(name, i)].append(time.process_time() - used)
            shutil.rmtree(root / f"{name}-{rep}", ignore_errors=True)
    med = {k: float(np.median(v)) for k, v in times.items()}
    mc = {k: float(np.median(v)) for k, v in cpu.items()}
    return [(kind, n, *(f"{m[(n, i)]:.2f} ({m[(n, i)] - m[('plain', i)]:+.2f})"
                        for i in (1, 2) for m in (med, mc))) for n in sources]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--probe", type=int, default=BATCH, help="probe samples (a statistics step's cost scales with it)")
    ap.add_argument("--model", choices=["small", "resnet"], default="small",
                    help="small: a 3-conv CNN; resnet: ResNet-8 v2 with batch norm (bench_hook.py's)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 rep of 4-step blocks")
    ap.add_argument("--per-block", action="store_true",
                    help="also print every block's ratio to its own plain block (a slow block: a trace, a dump)")
    ap.add_argument("--segment", choices=["main", "debugger"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--no-debugger", action="store_true", help="skip the Debugger V2 segment")
    ap.add_argument("--configs", nargs="+", metavar="NAME",
                    help="only these configurations (plain always; 'defaults' brings 'idle' and 'dump-2/grp', "
                         "'defaults/probe' their '/probe' rows)")
    ap.add_argument("--fixed-cost", action="store_true",
                    help="instead: each fit's fixed cost (tracing) with the callback, first fit and later "
                         "fits, on a 2-layer MLP and the small CNN")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.block = 1, 4
    if args.fixed_cost:
        root = Path(tempfile.mkdtemp(prefix="bench_keras_"))
        try:
            rows = [r for kind in ("mlp", "small") for r in fixed_cost(args.reps, kind, root)]
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"TensorFlow {tf.__version__}, Keras {getattr(keras, '__version__', '?')}; 8-step fits, batch "
              f"{BATCH}, statistics on steps 4 and 8, a dump on 8; median seconds over {args.reps} reps (in "
              "parentheses: minus plain's); CPU: the process's, all threads")
        print(format_table(rows, ["model", "config", "fit 1 wall", "fit 1 CPU", "fit 2 wall", "fit 2 CPU"]))
        return
    if args.segment == "debugger":
        print(json.dumps(debugger_segment(args.reps, args.block, args.model)))
        return
    x, y, ds = data()
    root = Path(tempfile.mkdtemp(prefix="bench_keras_"))
    try:
        probe = (x[:args.probe], y[:args.probe])
        callbacks = configs(root, probe)
        if args.configs:
            unknown = set(args.configs) - set(callbacks)
            if unknown:
                ap.error(f"unknown configurations {sorted(unknown)}; known: {sorted(callbacks)}")
            wanted = {"plain", *args.configs} | {f"{part}{suffix}" for suffix in ("", "/probe")
                                                  if f"defaults{suffix}" in args.configs
                                                  for part in ("idle", "dump-2/grp")}
            callbacks = {n: cb for n, cb in callbacks.items() if n in wanted}
        models = {name: build_model(kind=args.model) for name in callbacks}
        clocks = {name: CallbackClock(cbs) for name, cbs in callbacks.items()}
        paired: dict[str, list[float]] = {}
        times = measure(list(callbacks), models, callbacks, ds, args.reps, args.block, root, clocks, paired)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    dbg = {}
    if not args.no_debugger:
        out = subprocess.run([sys.executable, __file__, "--segment", "debugger", "--reps", str(args.reps),
                              "--block", str(args.block), "--model", args.model],
                             capture_output=True, text=True, check=True)
        dbg = json.loads(out.stdout.strip().splitlines()[-1])
    med = {n: float(np.median(t)) for n, t in times.items()}
    # each block over the same model's plain block beside it: no model-to-model spread
    own = {n: float(np.median(np.asarray(times[n]) / np.asarray(paired[n]))) for n in times}
    for suffix in ("", "/probe"):
        if f"defaults{suffix}" in med:   # one default dump per 1000 steps
            dump = (med[f"dump-2/grp{suffix}"] - med[f"idle{suffix}"]) / 1000
            med[f"defaults{suffix}"] += dump
            own[f"defaults{suffix}"] += dump / float(np.median(paired[f"defaults{suffix}"]))
    base = med["plain"]
    spent = {n: float(np.median(c.spent)) if c.spent else 0.0 for n, c in clocks.items()}
    bandwidth = memory_bandwidth()
    floor = {n: f"{(base + captured_bytes(callbacks[n]) / bandwidth) / base:.3f}" if n.startswith("stats-every")
             else "-" for n in med}
    rows = [(n, f"{1e3 * med[n]:.2f}", f"{med[n] / base:.3f}", f"{own[n]:.3f}", floor[n], f"{1e3 * spent[n]:.3f}",
             f"{1 + spent[n] / base:.3f}") for n in med]
    if dbg:
        d = {n: float(np.median(t)) for n, t in dbg.items()}
        rows.append(("plain (debugger segment)", f"{1e3 * d['plain']:.2f}", "1.000", "-", "-", "-", "-"))
        dbg_ratio = d["debugger-v2"] / d["plain"]
        rows.append(("debugger-v2 FULL_HEALTH", f"{1e3 * d['debugger-v2']:.2f}", f"{dbg_ratio:.3f}", "-", "-", "-",
                     "-"))
    print(f"TensorFlow {tf.__version__}, Keras {getattr(keras, '__version__', '?')}; model {args.model}, "
          f"batch {BATCH}, probe {args.probe}; {args.reps} reps of {args.block}-step blocks; median ms per step; "
          f"callback ms/step: inside the callback's batch methods and on_train_end, per step; read floor at "
          f"{bandwidth / 1e9:.1f} GB/s (numpy, one read, one core)")
    print(format_table(rows, ["config", "ms/step", "ratio to plain", "ratio to own plain", "read floor",
                              "callback ms/step", "1 + callback/plain"]))
    if args.per_block:
        for n in times:
            ratios = np.asarray(times[n]) / np.asarray(paired[n])
            print(f"{n}: blocks over their own plain blocks, in order: {' '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
