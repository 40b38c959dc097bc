"""Cost of ``inspect_step`` on a custom training loop, side by side with the plain loop.

Run::

    .venv/bin/python bench/bench_loops.py                 # tf.keras 2.15, 5 reps
    .venv-latest/bin/python bench/bench_loops.py          # Keras 3
    .venv/bin/python bench/bench_loops.py --quick         # smoke run (seconds, numbers meaningless)

Method. The README's loop: a 2-layer MLP (8 -> 16 -> 2), batch 32, Adam, a ``tf.function``
step with ``tf.GradientTape``, random data in memory. Per repetition, a fresh model and
optimizer for each of two loops, run in a random order: the plain step function, and the same
wrapped by ``inspect_step`` (statistics every ``--every`` steps, a dump of 2 samples per group
at the first statistics step, every op captured), each ``--steps`` steps from a fresh model, so
that every repetition pays the tracing again, as a short training would. Timed per loop:

- ``fixed``: the first call minus the plain loop's first call (both trace their step function),
  plus the first statistics-and-dump step and the first statistics-only step each minus a
  plain step: the tracing a loop pays once per kind of sampled step; in wall seconds and in
  the process's CPU seconds (all threads; the steadier measure on a loaded machine);
- ``sampled step``: a later statistics step's time (its function traced already) over the
  median plain step;
- ``idle step``: the median unsampled step over the median plain step;
- ``whole loop``: the inspected loop's total time over the plain loop's (tracing and closing
  the writer session included).

Medians over repetitions; ratios only (the machine is shared, absolute times move).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

from common import format_table

import numpy as np


def _build(tf):
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.Adam()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return model, train_step


def _loop(step, batches) -> tuple[list[float], list[float]]:
    """Each step's wall and process CPU seconds (CPU moves less with a shared machine's load)."""
    times, cpu = [], []
    for x, y in batches:
        t, c = time.perf_counter(), time.process_time()
        step(x, y).numpy()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return times, cpu


def one_rep(tf, inspect_step, batches, every: int, root: str) -> dict[str, float]:
    runs: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    close = 0.0
    for kind in random.sample(["plain", "inspected"], 2):
        model, train_step = _build(tf)
        if kind == "plain":
            runs[kind], cpus[kind] = _loop(train_step, batches)
            continue
        run_dir = os.path.join(root, "r")
        step = inspect_step(train_step, run_dir, model, stats_every_n_steps=every,
                            dump_steps=[every])
        runs[kind], cpus[kind] = _loop(step, batches)
        t = time.perf_counter()
        step.close()
        close = time.perf_counter() - t
        shutil.rmtree(run_dir)
    plain, ins = runs["plain"], runs["inspected"]
    base = statistics.median(plain[1:])
    sampled = sorted(range(every - 1, len(ins), every))   # the first one dumps too
    idle = [t for i, t in enumerate(ins[1:], 1) if i not in sampled]
    later = [ins[i] for i in sampled[2:]]     # statistics only, their function traced
    traced = [ins[i] - base for i in sampled[:2]]   # the two kinds' first steps: their traces
    cpu_plain, cpu_ins = cpus["plain"], cpus["inspected"]
    cpu_base = statistics.median(cpu_plain[1:])
    return {"fixed": (ins[0] - plain[0]) + sum(traced),
            "fixed_cpu": (cpu_ins[0] - cpu_plain[0]) + sum(cpu_ins[i] - cpu_base for i in sampled[:2]),
            "sampled": statistics.median(later) / base if later else float("nan"),
            "idle": statistics.median(idle) / base,
            "whole": (sum(ins) + close) / sum(plain), "plain_ms": 1000 * base}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.steps, a.every = 1, 16, 4
    import tensorflow as tf
    from hooks.keras import inspect_step
    rng = np.random.default_rng(0)
    x = rng.random((a.steps * 32, 8), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype(np.int32)
    batches = [(tf.constant(x[i:i + 32]), tf.constant(y[i:i + 32])) for i in range(0, len(x), 32)]
    with tempfile.TemporaryDirectory() as root:
        reps = [one_rep(tf, inspect_step, batches, a.every, root) for _ in range(a.reps)]
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    print(f"TensorFlow {tf.__version__}, Keras {getattr(tf.keras, '__version__', None) or __import__('keras').__version__}; "
          f"{a.steps} steps, statistics every {a.every}, {a.reps} reps; plain step "
          f"{med['plain_ms']:.2f} ms; load average {os.getloadavg()[0]:.1f}")
    print(format_table([("fixed (tracing) s", f"{med['fixed']:.2f}"),
                        ("fixed (tracing), CPU s", f"{med['fixed_cpu']:.2f}"),
                        ("sampled step / plain step", f"{med['sampled']:.1f}"),
                        ("idle step / plain step", f"{med['idle']:.2f}"),
                        ("whole loop / plain loop", f"{med['whole']:.2f}")],
                       ["measure", "median"]))


if __name__ == "__main__":
    main()
