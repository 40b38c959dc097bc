"""TensorBoard export speed: ``export --tensorboard`` of a 10,000-step run, and the records'
framing beside the ``tensorboard`` package's own writer.

Run::

    .venv/bin/python bench/bench_export.py                     # 10,000 steps x 50 tensors
    .venv/bin/python bench/bench_export.py --tensors 100       # 10,000 steps x 100 tensors
    .venv/bin/python bench/bench_export.py --run runs/icnn     # an existing run
    .venv/bin/python bench/bench_export.py --quick             # smoke run

Method. The run is ``inspector.testing.make_long_run`` (the writer's compacted, merged and
summarised parts; 100 real synthetic steps repeated; statistics every step; groups all /
positive / negative; ~170 log-magnitude buckets a histogram), written in its own process.
Each repetition exports it in a fresh process into an empty logdir, as the CLI does
(``inspector.export.tensorboard.Exporter``, histograms at the default ~100 steps): wall time, CPU time
(user + system of every thread: the machine is shared, so wall time alone says more about the
neighbours than about the export), peak RSS and bytes written. Beside it, in another fresh
process, what reading alone costs: the scalar columns of every step, and the histogram
columns at the export's histogram steps.

Framing, side by side in one process (interleaved repetitions): the same event payloads
(scalar events of one step's 600 tags, as the export writes them) framed as TFRecords by
``inspector.export.tfevents`` (numpy CRC-32C: the per-step template path, and the general path) and by
``tensorboard.summary.writer.record_writer.RecordWriter`` (its pure-Python CRC-32C): MB/s each.
"""
from __future__ import annotations

import argparse
import io
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # first: imports below (noqa: E402) from this checkout

import numpy as np  # noqa: E402

from bench.common import du_bytes, format_table, human_bytes  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child_make(path: str, steps: int, tensors: int) -> dict:
    from inspector.testing import make_long_run
    t = time.perf_counter()
    make_long_run(path, steps=steps, tensors=tensors, real_steps=min(100, steps))
    return {"seconds": time.perf_counter() - t}


def _child_export(path: str, logdir: str) -> dict:
    import inspector
    from inspector.export.tensorboard import Exporter
    t, c = time.perf_counter(), _cpu()
    ex = Exporter(lambda: inspector.open_run(path), Path(logdir))
    steps = ex.poll()
    ex.close()
    return {"wall": time.perf_counter() - t, "cpu": _cpu() - c, "steps": steps, "tags": len(ex.tags),
            "hist_steps": ex.histogram_steps, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def _child_read(path: str) -> dict:
    import inspector
    from inspector.export.tensorboard import histogram_steps
    run = inspector.open_run(path)
    steps = run.stats_steps()
    at = histogram_steps(steps, 0, int(steps[0]), int(steps[-1]), None)   # the export's
    t, c = time.perf_counter(), _cpu()
    scalars = run.query_stats_table(columns=["count", "mean", "std", "l2", "zero_fraction", "nan", "inf"])
    t1, c1 = time.perf_counter(), _cpu()
    hist = run.query_stats_table(columns=["hist_bucket", "hist_count"], at_steps=at.tolist())
    return {"scalar_wall": t1 - t, "scalar_cpu": c1 - c, "hist_wall": time.perf_counter() - t1,
            "hist_cpu": _cpu() - c1, "scalar_rows": scalars.num_rows, "hist_rows": hist.num_rows}


def framing(reps: int, steps: int = 200, tags: int = 600) -> list[list[str]]:
    """MB/s of framing the same scalar events: ours (template, general) and tensorboard's."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    from inspector.export.tfevents import EventFile, frame
    rng = np.random.default_rng(0)
    names = [f"gradient/block{i // 6}/conv{i % 7}/Relu:0/{s}" for i, s in
             zip(range(tags), ["rms", "mean", "std", "zero_fraction", "nan", "inf"] * tags)]
    values = rng.normal(size=(steps, tags))
    with tempfile.TemporaryDirectory() as tmp:
        f = EventFile(Path(tmp))
        records = f._encode(names, 2, np.arange(200, 200 + steps), values, 1.0e9)
        f.close()
    payloads = [bytes(r[12:-4]) for r in records]
    mb = sum(len(p) for p in payloads) / 1e6
    times: dict[str, list[float]] = {"tf-inspector, a step's template (numpy CRC)": [],
                                     "tf-inspector, general records (numpy CRC)": [],
                                     "tensorboard RecordWriter (pure-Python CRC)": []}
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            f = EventFile(Path(tmp))
            t = time.perf_counter()
            f._encode(names, 2, np.arange(200, 200 + steps), values, 1.0e9)
            times["tf-inspector, a step's template (numpy CRC)"].append(time.perf_counter() - t)
            f.close()
        t = time.perf_counter()
        frame(payloads)
        times["tf-inspector, general records (numpy CRC)"].append(time.perf_counter() - t)
        w = RecordWriter(io.BytesIO())
        t = time.perf_counter()
        for p in payloads[:max(1, len(payloads) // 10)]:    # a tenth: the same bytes' rate, ten times sooner
            w.write(p)
        times["tensorboard RecordWriter (pure-Python CRC)"].append((time.perf_counter() - t) * len(payloads)
                                                                   / max(1, len(payloads) // 10))
    slowest = statistics.median(times["tensorboard RecordWriter (pure-Python CRC)"])
    return [[name, f"{mb / statistics.median(ts):.1f}", f"{slowest / statistics.median(ts):.0f}x"]
            for name, ts in times.items()]


def child(kind: str, *args: object) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)], capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"child {kind} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


CHILDREN = {"make": lambda p, s, t: _child_make(p, int(s), int(t)), "export": _child_export, "read": _child_read}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--tensors", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--run", help="an existing run to export instead of a generated one")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
        return
    if args.quick:
        args.steps, args.tensors, args.reps = 200, 10, 1
    root = Path(tempfile.mkdtemp(prefix="bench_export_"))
    try:
        run = Path(args.run) if args.run else root / "run"
        made = "" if args.run else f", written in {child('make', run, args.steps, args.tensors)['seconds']:.0f} s"
        rows = []
        for i in range(args.reps):
            logdir = root / f"logs{i}"
            e, r = child("export", run, logdir), child("read", run)
            rows.append([f"{e['wall']:.1f}", f"{e['cpu']:.1f}", f"{r['scalar_cpu'] + r['hist_cpu']:.1f}",
                         f"{r['hist_cpu']:.1f}", str(e["steps"]), str(e["hist_steps"]), str(e["tags"]),
                         human_bytes(du_bytes(logdir)), human_bytes(1024 * e["rss_kib"])])
            shutil.rmtree(logdir, ignore_errors=True)
        print(f"export --tensorboard of {run.name if args.run else f'{args.steps} steps x {args.tensors} tensors'}"
              f" ({human_bytes(du_bytes(run))} on disk{made})")
        print(format_table(rows, ["wall s", "CPU s", "of which reading (CPU s)", "histogram columns (CPU s)",
                                  "steps", "histogram steps", "scalar tags", "events written", "peak RSS"]))
        print()
        print(format_table(framing(args.reps), ["framing the same scalar events", "MB/s", "vs tensorboard's"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
