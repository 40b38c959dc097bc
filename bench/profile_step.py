"""Where a statistics step's extra time goes: op time per op type, a plain step beside a
statistics step, from TensorFlow's own trace.

Run::

    .venv/bin/python bench/profile_step.py --model vgg --n 1 --batch 128     # DumpHook, bench_hook's models
    .venv-latest/bin/python bench/profile_step.py --keras small                # InspectCallback(source="train_batch")
    .venv/bin/python bench/profile_step.py --configs plain,touch-every,stats-every   # any bench_hook configs

Method. Each configuration is built and warmed up as its benchmark builds it
(``bench_hook.Trainer``; ``bench_keras.build_model``), then ``--steps`` steps are traced: a
DumpHook session runs with ``RunOptions.FULL_TRACE`` (each node's time from its start to its
end), a Keras fit block runs under ``tf.profiler`` (the trace's op events, named
``name:Type``). Op time is summed over ops and divided by the steps. Ops run side by side on
the two cores (and an op's intra-op helper threads work inside its span), so the sum is CPU
time, not wall time, and tracing adds to it: read the differences, and take ratios of step
times from ``bench_hook.py`` / ``bench_keras.py``.

The table has one row per op type, sorted by the extra time: what the capture changes in the
model's own step shows there (a fused convolution split into Conv2D, BiasAdd and Relu once its
intermediate outputs are read; one more Conv2DBackpropInput, the gradient of the input images,
which plain training never computes) beside the statistics kernel (InspectorLogStats) and the
capture's small ops. Op types are compared, not node names: the Keras step capture builds the
step's one backward pass under its own name scope.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

try:
    from bench.common import format_table
except ImportError:  # run as `python bench/profile_step.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.common import format_table

import tensorflow as tf  # noqa: E402

Profile = dict[str, list[float]]   # op type -> [ms per step, ops per step]
OP_EVENT = re.compile(r"^([\w./\-]+):(\w+)$")   # a trace's op event: "scope/name:Type"
CALLS = {"StatefulPartitionedCall", "PartitionedCall"}   # a whole function's span, not an op


def _add(prof: Profile, typ: str, micros: float, steps: int) -> None:
    row = prof.setdefault(typ, [0.0, 0.0])
    row[0] += micros / 1e3 / steps
    row[1] += 1 / steps


def hook_profile(family: str, n: int, batch: int, key: str, steps: int) -> Profile:
    """One bench_hook configuration's op time per step, from ``RunMetadata`` node stats."""
    import bench_hook as bh
    v1 = tf.compat.v1
    cfg = {c.key: c for c in bh.configs(batch)}[key]
    trainer = bh.Trainer(cfg, Path(tempfile.mkdtemp(prefix="profile-", dir=_scratch())), n, batch, family)
    prof: Profile = {}
    try:
        trainer.block(10, record=False)
        for _ in range(steps):
            md = v1.RunMetadata()
            trainer.sess.run(trainer.model.train_op, run_metadata=md,
                             options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))
            for dev in md.step_stats.dev_stats:
                for ns in dev.node_stats:
                    typ = ns.timeline_label.split("(")[0].split("=")[-1].strip() if "=" in ns.timeline_label else ""
                    if typ:
                        _add(prof, typ, ns.all_end_rel_micros, steps)
    finally:
        trainer.close()
    return prof


def keras_profile(kind: str, key: str, steps: int) -> Profile:
    """``model.fit`` of bench_keras's model (plain, or statistics every step of its own batch):
    op time per step from a ``tf.profiler`` trace of one block."""
    import bench_keras as bk
    from hooks.keras import InspectCallback
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as e:   # an internal module: say so rather than guess at the trace
        raise SystemExit(f"this TensorFlow has no tensorflow.tsl.profiler.protobuf.xplane_pb2 ({e})") from e
    root = Path(tempfile.mkdtemp(prefix="profile-", dir=_scratch()))
    cbs = [] if key == "plain" else [InspectCallback(root / "run", source="train_batch", stats_every_n_steps=1,
                                                     dump_every_n_steps=0)]
    _, _, ds = bk.data()
    model = bk.build_model(0, kind)
    model.fit(ds, steps_per_epoch=10, epochs=1, verbose=0, callbacks=cbs)   # traced and warm
    tf.profiler.experimental.start(str(root / "trace"))
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=cbs)
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    space.ParseFromString(next((root / "trace").rglob("*.xplane.pb")).read_bytes())
    prof: Profile = {}
    for plane in space.planes:
        if not plane.name.lower().startswith("/host"):
            continue
        for line in plane.lines:
            for e in line.events:
                m = OP_EVENT.match(plane.event_metadata[e.metadata_id].name)
                if m and m.group(2) not in CALLS:
                    _add(prof, m.group(2), e.duration_ps / 1e6, steps)
    return prof


def _scratch() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def table(plain: Profile, stats: Profile, top: int) -> str:
    """One row per op type, the largest differences first, then the rest and the total."""
    types = sorted(set(plain) | set(stats), key=lambda t: -abs(_ms(stats, t) - _ms(plain, t)))
    rows = [(t, f"{_ms(plain, t):.3f}", f"{_ms(stats, t):.3f}", f"{_ms(stats, t) - _ms(plain, t):+.3f}",
             f"{plain.get(t, [0, 0])[1]:.0f} / {stats.get(t, [0, 0])[1]:.0f}") for t in types[:top]]
    for label, part in (("(other types)", types[top:]), ("total", types)):
        a, b = sum(_ms(plain, t) for t in part), sum(_ms(stats, t) for t in part)
        rows.append((label, f"{a:.3f}", f"{b:.3f}", f"{b - a:+.3f}", ""))
    return format_table(rows, ["op type", "plain ms/step", "stats ms/step", "extra", "ops/step"])


def _ms(p: Profile, t: str) -> float:
    return p.get(t, [0.0, 0.0])[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vgg", choices=["bn-resnet", "resnet-nobn", "vgg"])
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--configs", default="plain,stats-every",
                    help="two bench_hook configurations: the baseline, then the one profiled against it")
    ap.add_argument("--keras", choices=["small", "resnet"], help="profile bench_keras's model instead")
    ap.add_argument("--steps", type=int, default=20, help="steps traced per configuration")
    ap.add_argument("--top", type=int, default=14, help="op types shown")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.keras:
        base, other = "plain", "stats-every/train-batch"
        plain, stats = (keras_profile(args.keras, k, args.steps) for k in (base, other))
        title = f"bench_keras {args.keras}, batch 32, tf {tf.__version__}"
    else:
        base, other = args.configs.split(",")
        plain, stats = (hook_profile(args.model, args.n, args.batch, k, args.steps) for k in (base, other))
        title = f"bench_hook {args.model} n={args.n} batch {args.batch}, tf {tf.__version__}"
    print(f"{title}: op time per step, {base} against {other} ({args.steps} traced steps each)")
    print(table(plain, stats, args.top))


if __name__ == "__main__":
    main()
