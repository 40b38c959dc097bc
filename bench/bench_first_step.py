"""The first statistics step of a session, with and without the executor pre-built (hooks/prewarm.py).

Each repetition builds the ResNet (``--family``, n, batch) with a DumpHook in a fresh graph and
MonitoredTrainingSession, runs ``--plain`` unsampled steps (the pre-build starts after the first
and runs beside them), then times the first statistics step and the median of the next
statistics steps (statistics every ``--plain`` + 1 steps, no dumps). Configurations alternate
within each repetition. ``first - later`` is what the first sampled step still pays for its
executor.

    .venv/bin/python bench/bench_first_step.py --reps 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # noqa: E402 - this checkout first

import tensorflow as tf  # noqa: E402

from bench.common import format_table  # noqa: E402
from bench.resnet import FAMILIES, build_resnet  # noqa: E402
from hooks import DumpHook, prewarm  # noqa: E402

v1 = tf.compat.v1
v1.disable_eager_execution()


def one(family: str, n: int, batch: int, plain: int, later: int, warm: bool) -> tuple[float, float]:
    """(first statistics step, median later statistics step) in seconds."""
    prewarm.ENABLED = warm
    with tempfile.TemporaryDirectory() as d, tf.Graph().as_default():
        model = build_resnet(n, batch, family=family)
        hook = DumpHook(d, loss=model.loss, labels=model.labels,
                        stats_every_n_steps=plain + 1, dump_every_n_steps=0)
        with v1.train.MonitoredTrainingSession(
                hooks=[hook], checkpoint_dir=None, save_checkpoint_secs=None,
                save_checkpoint_steps=None, save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=None) as sess:
            sampled = []
            for _ in range(later + 1):
                for _ in range(plain):
                    sess.run(model.train_op)
                t = time.perf_counter()
                sess.run(model.train_op)
                sampled.append(time.perf_counter() - t)
    prewarm.ENABLED = True
    return sampled[0], statistics.median(sampled[1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=FAMILIES, default="resnet-nobn")
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--plain", type=int, default=20, help="unsampled steps before each statistics step")
    p.add_argument("--later", type=int, default=3, help="statistics steps timed after the first")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a smoke run: one repetition of 2 + 1 steps")
    a = p.parse_args(argv)
    if a.quick:
        a.reps, a.plain, a.later = 1, 2, 1
    res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(a.reps):
        for warm in ((False, True) if r % 2 == 0 else (True, False)):
            res[warm].append(one(a.family, a.n, a.batch, a.plain, a.later, warm))
    rows = []
    for warm in (False, True):
        first = statistics.median(f for f, _ in res[warm])
        later = statistics.median(later_ for _, later_ in res[warm])
        rows.append(["pre-built" if warm else "built in the step", f"{1e3 * first:.0f}",
                     f"{1e3 * later:.0f}", f"{1e3 * (first - later):.0f}"])
    print(f"{a.family} n={a.n} batch={a.batch}, {a.reps} reps, load {os.getloadavg()[0]:.1f}")
    print(format_table(rows, ["first statistics step", "first ms", "later ms (median)", "first - later ms"]))


if __name__ == "__main__":
    main()
