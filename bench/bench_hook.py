"""Cost of DumpHook on a CIFAR ResNet v2, side by side with plain training and tfdbg.

Run::

    .venv/bin/python bench/bench_hook.py             # n=1 (ResNet-8), 5 reps of 100-step blocks
    .venv/bin/python bench/bench_hook.py --n 3 --reps 7
    .venv/bin/python bench/bench_hook.py --quick     # smoke run (seconds, numbers meaningless)
    # the statistics sweep (issue 13): every family, depth and batch, one process, interleaved
    .venv/bin/python bench/bench_hook.py --model bn-resnet resnet-nobn vgg --n 1 3 5 --batch 32 128 \
        --configs plain stats-every --block 10 --reps 5

Sweep. With several ``--model`` / ``--n`` / ``--batch`` values every combination gets its
own trainers (default configurations: ``plain``, ``stats-every`` and ``layers-every``), and all their blocks
are interleaved in one shuffled order, so each ratio compares blocks timed in the same
minutes. Per combination it prints the captured bytes a statistics step reads (every
captured tensor and gradient at the static batch), the statistics step's extra time per
captured MiB (flat across sizes = cost linear in the captured bytes), the physical floor
(one read of those bytes at the memory bandwidth measured here with numpy on one core,
and the ratio plain + floor would give; with ``touch-every`` named, the ratio
``touch-every`` + that read gives: below, 4g), and the hook's Python time per step
(``before_run`` + ``after_run``, wall and the training thread's CPU time, ``time.thread_time``:
the CPU time moves less with the machine's load than step ratios do; both include the extra
``session.run`` a sampled step makes where the training run cannot read the global step and the
variables' updates itself, ``hooks.variables.SameRun``).

Method. Every configuration gets its own graph (the same model, batch 32, random 32x32x3
images from an in-memory ``tf.data`` pipeline) and its own ``MonitoredTrainingSession``,
built once and kept alive. After a warm-up block each, the script interleaves timing
blocks: for each repetition, for each configuration (in an order shuffled every
repetition), run ``--block`` consecutive training steps and record each step's time. A
block of a dumping configuration ends by waiting for the hook's writer thread to write its
dumps, and that wait counts in the block, so the time per step is the sustainable rate (a
writer that fell behind would otherwise show up only as dropped dumps); then, untimed, the
block's statistics are written as a part, so that no trainer's part is written (and timed)
during another's block (a part's fixed cost at the rate training writes them, one per
``stats_flush_secs``, is in bench/README.md). The time per step of a
configuration is the median over repetitions of (block time / steps); ratios are to plain
training's, measured in the same process over the same minutes, so machine noise (2 shared
cores) hits every configuration alike.

Reported per configuration: the median step time and its ratio to plain training's median
(the issue's measure, and the one the idle and statistics targets are checked on), and the
mean time per step over whole blocks and its ratio (what the amortised defaults are checked
on: one statistics step in 100), and the process's CPU time per step (every thread, median over
blocks) and its ratio to plain's: the work a step costs, which other jobs on a shared machine
move less than wall time (with the step's ops on both cores, near the wall ratio a quiet
machine gives).

Configurations:

1. ``plain``: no hook.
2. ``hook-idle``: DumpHook attached, on steps where it neither computes statistics nor dumps.
3. ``defaults``: DumpHook with its default settings, amortised. A block is 100 consecutive
   steps, a multiple of ``stats_every_n_steps`` (100), so each block holds exactly its share
   of statistics steps. A default dump (every 1000 steps, 2 samples per group) is too rare to
   land in a block, so its cost is measured by ``dump-2/grp`` (a default dump on every step)
   and added with its frequency: ``t3 = block(defaults) + (t(dump-2/grp) - t(hook-idle)) / 1000``.
4. ``stats-every``: statistics on every step.
7. ``layers-every``: the always-on mode, ``layer_stats_every_n_steps=1`` (the layers' outputs
   as Grappler's fused ops produce them, and their gradients, every step) with the default
   statistics and dumps on their steps.
5. ``dump-full``: every captured op's forward value and gradient for the whole batch
   (``samples_per_group`` >= batch) on every step, no statistics.
6. ``tfdbg``: tfdbg v1's ``DumpingDebugHook`` (every tensor of the graph, every step).

By default the hook reuses the gradients of the optimizer's own ``tf.gradients`` (recorded
because ``hooks`` is imported before the model is built; ``hooks.recorders.gradients``).
3b/4b/5b (``*-shared``): 3, 4 and 5 with the model trained by ``hooks.minimize`` instead of
``optimizer.minimize`` (explicit sharing). 4c (``stats-every-own``): ``share_gradients=False``,
the hook's own second backward pass. 4d (``stats-every-stock``, only when named): the
stock-op statistics that run where the fused kernel cannot be compiled. 4e
(``stats-every-classes``, only when named): statistics with ``groups="per_class"`` (10
classes: 11 rows per tensor and kind instead of 3), in the same fused pass. 4f
(``stats-every-one-op``, only when named): the fused kernel as one op over every captured
tensor (how the kernel once ran) instead of one op per tensor. 4g (``touch-every``, only when
named): the statistics step's graph with one element of each captured tensor read instead of
the statistics (the cost of giving every op's output a consumer, e.g. the lost fusions).
Named beside ``stats-every``, it sets that target's floor: its p50 plus one read of the
captured bytes at the measured bandwidth, as a ratio to plain's p50 (the target is
``max(1.25, floor + 0.05)``); without it the target reads 1.25. 7g (``touch-layers``, only
when named) likewise for the always-on mode: named beside ``layers-every``, its p50 plus one
read of the bytes always-on reads is that row's floor.

After each block (untimed) its dumps are deleted and ``os.sync()`` flushes what is left of
its writeback, so a dumping block does not slow whichever block follows it.

Bytes per step: the growth of the run directory on disk (allocated blocks, as ``du``) over
the steps run. Dumps are deleted after every block (their bytes counted first) so the disk
does not fill; statistics Parquet parts stay until the end. For the dumping configurations a
second table gives dumps written per step (DumpHook drops a dump rather than block when its
writer queue is full, so fewer than 1 means the writer fell behind) and the time per written
dump, which is what the tfdbg comparison uses (tfdbg writes every step, blocking).
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # first: imports below (noqa: E402) from this checkout

import logging  # noqa: E402

import tensorflow as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench.common import du_bytes, format_table, human_bytes  # noqa: E402
from bench.resnet import FAMILIES, ResNet, build_resnet  # noqa: E402
from hooks import DumpHook  # noqa: E402
from hooks.stats import exact as exact_stats, fast as fast_stats  # noqa: E402
from hooks.dump_hook import _static_bytes  # noqa: E402
from inspector.dumps import files as safetensors_io  # noqa: E402

v1 = tf.compat.v1


def _hook_defaults() -> tuple[int, int]:
    import inspect
    p = inspect.signature(DumpHook.__init__).parameters
    return p["stats_every_n_steps"].default or 0, p["dump_every_n_steps"].default or 0


try:
    from tensorflow.python import debug as tf_debug
except Exception as e:  # noqa: BLE001 - any failure means "not available in this TF"
    tf_debug, TFDBG_ERROR = None, f"{type(e).__name__}: {e}"
else:
    TFDBG_ERROR = None


@dataclass
class Config:
    key: str
    label: str
    make_hooks: Callable[[Path, ResNet], list]
    shared: bool = False  # train with hooks.minimize (one backward pass shared with the hook)
    optional: bool = False  # only when named in --configs
    per_tensor_ops: bool = True  # fast_stats.PER_TENSOR_OPS while the graph is built
    stats_builder: Callable | None = None  # replaces fast_stats.build_stats while the graph is built


BUILD_STATS = fast_stats.build_stats


def touch_stats(captured, groups, use_native: bool = True):
    """(4g): one element of every captured tensor and gradient is read, and nothing computed:
    what plain training costs once every op's output has a consumer (the fusions Grappler can
    no longer make) and the extra gradients exist, without the statistics' own passes. The
    real fetch is built for its rows and shapes but never run; the rows written are zeros."""
    import tensorflow as tf
    real = BUILD_STATS(captured, groups, use_native)
    if real is None:
        return None
    unique = {t.name: t for c in captured for t in (c.tensor, c.gradient) if t is not None}
    one = [tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float64)) for t in unique.values()]
    # The sum is written (in the first row), not multiplied by 0: Grappler folds x * 0 away,
    # and every touch with it.
    r, cols = len(real.rows), real.values.shape[1]
    first = tf.concat([tf.reshape(tf.add_n(one), [1, 1]), tf.zeros([1, cols - 1], tf.float64)], 1)
    values = tf.concat([first, tf.zeros([r - 1, cols], tf.float64)], 0)
    empty = exact_stats.Sparse(tf.zeros([r + 1], tf.int64), tf.zeros([0], tf.int32), tf.zeros([0], tf.int32))
    return type(real)(values, empty, real.rows)


def configs(batch: int) -> list[Config]:
    def dump_hook(**kw) -> Callable[[Path, ResNet], list]:
        return lambda d, m: [DumpHook(d, loss=m.loss, labels=m.labels, **kw)]
    out = [
        Config("plain", "(1) plain training", lambda d, m: []),
        Config("hook-idle", "(2) hook, idle steps", dump_hook(stats_every_n_steps=0, dump_every_n_steps=0)),
        Config("defaults", "(3) defaults, amortised", dump_hook()),
        Config("dump-2/grp", "    default dump (2/grp), every step",
               dump_hook(stats_every_n_steps=0, dump_every_n_steps=1)),
        Config("stats-every", "(4) statistics every step", dump_hook(stats_every_n_steps=1, dump_every_n_steps=0)),
        Config("layers-every", "(7) always-on: layer statistics every step, defaults otherwise",
               dump_hook(layer_stats_every_n_steps=1)),
        Config("dump-full", "(5) full dump every step", dump_hook(stats_every_n_steps=0, dump_every_n_steps=1,
                                                               samples_per_group=batch, max_bytes=None)),
        Config("nan-watch", "(3c) defaults + dump_on_nonfinite", dump_hook(dump_on_nonfinite=True), optional=True),
        Config("defaults-shared", "(3b) defaults, hooks.minimize", dump_hook(), shared=True),
        Config("dump-2/grp-shared", "    default dump (2/grp), hooks.minimize",
               dump_hook(stats_every_n_steps=0, dump_every_n_steps=1), shared=True),
        Config("stats-every-shared", "(4b) statistics every step, hooks.minimize",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0), shared=True),
        Config("stats-every-own", "(4c) statistics, own backward pass",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0, share_gradients=False)),
        Config("stats-every-one-op", "(4f) statistics, one kernel op over all tensors",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0), optional=True, per_tensor_ops=False),
        Config("touch-every", "(4g) every captured tensor read by one element, no statistics",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0), optional=True, stats_builder=touch_stats),
        Config("touch-layers", "(7g) always-on, each layer tensor read by one element, no statistics",
               dump_hook(layer_stats_every_n_steps=1), optional=True, stats_builder=touch_stats),
        Config("stats-every-stock", "(4d) statistics, stock-op fallback",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0, native_stats=False), optional=True),
        Config("stats-every-classes", "(4e) statistics every step, groups='per_class' (10)",
               dump_hook(stats_every_n_steps=1, dump_every_n_steps=0, groups="per_class", num_classes=10),
               optional=True),
        Config("dump-full-shared", "(5b) full dump, hooks.minimize",
               dump_hook(stats_every_n_steps=0, dump_every_n_steps=1, samples_per_group=batch, max_bytes=None),
               shared=True),
        Config("dump-full-fsync", "(5) full dump, fsync=True",
               dump_hook(stats_every_n_steps=0, dump_every_n_steps=1, samples_per_group=batch, max_bytes=None,
                         fsync=True), optional=True),
    ]
    if tf_debug is not None:
        out.append(Config("tfdbg", "(6) tfdbg DumpingDebugHook",
                          lambda d, m: [tf_debug.DumpingDebugHook(str(d))]))
    return out


@dataclass
class Trainer:
    """One configuration: its graph and session, alive for the whole benchmark."""
    cfg: Config
    run_dir: Path
    n: int
    batch: int
    family: str = "bn-resnet"
    device: str = "cpu"
    block_times: list[float] = field(default_factory=list)   # seconds per step, one per block
    cpu_times: list[float] = field(default_factory=list)   # process CPU seconds per step, one per block
    step_times: list[float] = field(default_factory=list)
    steps: int = 0
    bytes_removed: int = 0
    raw_dump_bytes: int = 0
    tensors_per_dump: int = 0
    dumps: int = 0
    hook_seconds: float = 0.0  # DumpHook's before_run + after_run (wall), recorded blocks only
    hook_cpu_seconds: float = 0.0  # the same calls' CPU time on the training thread
    recording: bool = False
    built: list[list] = field(default_factory=list)   # what each build_stats call read, in order

    def __post_init__(self) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default():
            # --device gpu: the model pinned to the GPU (the input pipeline soft-placed on the
            # host); the hook's ops are built outside the scope, so its own placement decides
            with tf.device("/device:GPU:0" if self.device == "gpu" else ""):
                self.model = build_resnet(self.n, self.batch, shared_gradients=self.cfg.shared, family=self.family)
            self.hooks = self.cfg.make_hooks(self.run_dir, self.model)
            # read when the hooks' begin() builds the statistics
            fast_stats.PER_TENSOR_OPS = self.cfg.per_tensor_ops
            builder = self.cfg.stats_builder or BUILD_STATS

            def recording(captured, groups, use_native=True):
                self.built.append(list(captured))
                return builder(captured, groups, use_native)
            fast_stats.build_stats = recording
            try:
                self.sess = v1.train.MonitoredTrainingSession(
                    config=v1.ConfigProto(allow_soft_placement=True),
                    hooks=self.hooks, checkpoint_dir=None, save_checkpoint_secs=None, save_checkpoint_steps=None,
                    save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None)
            finally:
                fast_stats.PER_TENSOR_OPS, fast_stats.build_stats = True, BUILD_STATS
        self.baseline = du_bytes(self.run_dir)
        for h in self.hooks:
            if isinstance(h, DumpHook):
                h.before_run, h.after_run = self._timed(h.before_run), self._timed(h.after_run)

    def _timed(self, fn: Callable) -> Callable:
        def wrapper(*a, **k):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                if self.recording:
                    self.hook_seconds += time.perf_counter() - t
                    self.hook_cpu_seconds += time.thread_time() - c
        return wrapper

    @property
    def hook_ms(self) -> tuple[float, float]:
        """(wall, CPU) ms of the hook's own Python per step: before_run + after_run."""
        steps = max(len(self.step_times), 1)
        return 1e3 * self.hook_seconds / steps, 1e3 * self.hook_cpu_seconds / steps

    @property
    def combo(self) -> tuple[str, int, int]:
        return self.family, self.n, self.batch

    def _bytes(self, captured: Iterable) -> int:
        """The bytes of ``captured``'s tensors and gradients at the static batch."""
        return sum(_static_bytes(t, c.batched) * (self.batch if c.batched else 1)
                   for c in captured for t in (c.tensor, c.gradient) if t is not None)

    @property
    def captured_bytes(self) -> int:
        """What one statistics step reads: every captured tensor and gradient at the static batch."""
        return self._bytes(c for h in self.hooks if isinstance(h, DumpHook) for c in h.captured)

    @property
    def layer_bytes(self) -> int:
        """What an always-on step reads: the layer outputs and gradients of the hook's second
        build_stats call (the first builds the statistics step's), 0 without one."""
        return self._bytes(self.built[1]) if len(self.built) > 1 else 0

    def block(self, steps: int, record: bool = True) -> None:
        times = []
        self.recording = record
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            t = time.perf_counter()
            self.sess.run(self.model.train_op)
            times.append(time.perf_counter() - t)
        self._drain()
        total, cpu = time.perf_counter() - start, time.process_time() - cpu
        # untimed: this block's statistics written as a part now, so that no part is written
        # (and timed) in another configuration's block; a block writes ~1.7 s of steps, a
        # training run a part every stats_flush_secs (10 s), so timing it here would count a
        # part's fixed cost six times over (a part at the real rate: bench/README.md)
        for w in self._writers():
            w.flush_stats()
        self.steps += steps
        if record:
            self.block_times.append(total / steps)
            self.cpu_times.append(cpu / steps)
            self.step_times += times
        self._clear_dumps()
        os.sync()  # untimed: what is left of this block's writeback does not slow the next block

    def _writers(self) -> list:
        return [h._writer for h in self.hooks if isinstance(h, DumpHook) and h._writer is not None]

    def _drain(self) -> None:
        """Wait until every queued dump is on disk (statistics stay buffered, as in training)."""
        for w in self._writers():
            while (not w._queue.empty() or w._pending_bytes) and w.error is None:
                time.sleep(0.0005)

    def _dump_files(self) -> list[Path]:
        if self.cfg.key == "tfdbg":
            return [p for p in self.run_dir.glob("run_*")]
        return sorted((self.run_dir / "dumps").glob("*.safetensors"))

    def _clear_dumps(self) -> None:
        files = self._dump_files()
        if files and not self.raw_dump_bytes and self.cfg.key != "tfdbg":
            header, _ = safetensors_io.read_header(files[-1])
            self.raw_dump_bytes = sum(v["data_offsets"][1] - v["data_offsets"][0]
                                      for k, v in header.items() if k != "__metadata__")
            self.tensors_per_dump = len(header) - ("__metadata__" in header)
        for f in files:
            self.bytes_removed += du_bytes(f)
            self.dumps += 1
            shutil.rmtree(f) if f.is_dir() else f.unlink()

    def close(self) -> None:
        self.sess.close()  # hooks' end(): the writer flushes its statistics
        self.bytes_per_step = (du_bytes(self.run_dir) + self.bytes_removed - self.baseline) / max(self.steps, 1)

    @property
    def per_step(self) -> float:
        return statistics.median(self.block_times)

    @property
    def cpu_per_step(self) -> float:
        """The process's CPU seconds per step (every thread: the step's ops, the hook, its writer),
        median over blocks: the work a step costs, which other jobs on a shared machine move
        less than its wall time."""
        return statistics.median(self.cpu_times)

    @property
    def written(self) -> float:
        """Dumps written per step run: below 1 when the writer fell behind and the hook dropped dumps."""
        return self.dumps / max(self.steps, 1)


def combos(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    return list(itertools.product(args.model, args.n, args.batch))


def run(args: argparse.Namespace) -> list[Trainer]:
    root = Path(tempfile.mkdtemp(prefix="bench_hook_", dir=args.dir))
    stats_every, dump_every = _hook_defaults()
    sweep = len(combos(args)) > 1
    wanted = args.configs or (["plain", "stats-every", "layers-every"] if sweep else None)
    chosen = [(family, n, batch, c) for family, n, batch in combos(args) for c in configs(batch)
              if (c.key in wanted if wanted else not c.optional)]
    if args.block % max(stats_every, 1) and not args.quick and any(c.key.startswith("defaults") for *_, c in chosen):
        raise SystemExit(f"--block must be a multiple of the default stats_every_n_steps ({stats_every})")
    try:
        trainers = []
        for family, n, batch, c in tqdm(chosen, desc="build graphs + sessions", file=sys.stderr):
            name = f"{family}-n{n}-b{batch}-{c.key.replace('/', '_')}"
            trainers.append(Trainer(c, root / name, n, batch, family, args.device))
        total = len(trainers) * (args.reps + 1)
        with tqdm(total=total, desc="timing blocks", file=sys.stderr) as bar:
            for t in trainers:  # warm-up: first-use executors (stats/dump fetches), caches
                t.block(args.block, record=False)
                bar.update()
            order = random.Random(0)
            for _ in range(args.reps):
                # a fresh order every repetition: no configuration always follows the same one
                # (a dumping block leaves the disk's writeback busy for the next)
                for t in order.sample(trainers, len(trainers)):
                    t.block(args.block)
                    bar.update()
        for t in trainers:
            t.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return trainers


def memory_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Bytes per second of one read of a ``mib`` MiB float32 array (numpy's max, one core; best of ``reps``)."""
    import numpy as np
    a = np.ones(mib << 18, np.float32)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a.max()
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best


def sweep_report(trainers: list[Trainer], args: argparse.Namespace, bandwidth: float) -> str:
    """One row per (family, n, batch): statistics every step against plain training."""
    rows = []
    # any other configuration named in --configs: its ratio to plain in a column of its own
    extra = sorted({t.cfg.key for t in trainers} - {"plain", "stats-every"})
    for combo in combos(args):
        by = {t.cfg.key: t for t in trainers if t.combo == combo}
        plain, stats = by.get("plain"), by.get("stats-every")
        if plain is None or stats is None:
            continue
        p_ms = 1e3 * statistics.median(plain.step_times)
        s_ms = 1e3 * statistics.median(stats.step_times)
        mib = stats.captured_bytes / 2 ** 20
        floor_ms = 1e3 * stats.captured_bytes / bandwidth
        ratio = s_ms / p_ms
        floor = touch_floor("stats-every", by, bandwidth, p_ms / 1e3) or (p_ms + floor_ms) / p_ms
        hook_ms, hook_cpu = stats.hook_ms
        others = [f"{1e3 * statistics.median(by[k].step_times) / p_ms:.3f} / "
                  f"{by[k].cpu_per_step / plain.cpu_per_step:.3f}" for k in extra]
        if "touch-layers" in extra:   # the always-on row's floor beside its ratio
            always = touch_floor("layers-every", by, bandwidth, p_ms / 1e3)
            others.append("" if always is None else f"{always:.3f}")
        rows.append([*map(str, combo), f"{mib:.1f}", f"{p_ms:.1f}", f"{s_ms:.1f}", f"{ratio:.3f}",
                     "yes" if ratio <= max(1.25, floor + 0.05) else "NO",
                     f"{(s_ms - p_ms) / mib:.2f}", f"{floor_ms:.2f}",
                     f"{floor:.3f}", f"{hook_ms:.2f}", f"{hook_cpu:.2f}",
                     f"{stats.cpu_per_step / plain.cpu_per_step:.3f}", *others])
    head = (f"TensorFlow {tf.__version__}, {args.reps} reps x {args.block} steps per config, all interleaved; "
            f"memory bandwidth (numpy, one read, one core): {bandwidth / 1e9:.1f} GB/s; ratios: p50 step times")
    return head + "\n" + format_table(rows, ["model", "n", "batch", "captured MiB", "plain ms", "stats ms", "ratio",
                                             "<=max(1.25,floor+.05)", "extra ms/MiB", "floor ms", "floor ratio", "hook py ms", "hook cpu ms",
                                             "stats cpu ratio", *(f"{k} ratio / cpu" for k in extra),
                                             *(["always-on floor"] if "touch-layers" in extra else [])])


#: configuration -> (the touch configuration that bounds it, the bytes one of its steps reads):
#: ``touch-every``'s p50 is what every op's output costs once it has a consumer (the fusions
#: Grappler cannot make, ``d loss / d input``), ``touch-layers``' what the always-on layers'
#: outputs and gradients cost (the loss's forward included)
TOUCHES: dict[str, tuple[str, Callable[[Trainer], int]]] = {
    "stats-every": ("touch-every", lambda t: t.captured_bytes),
    "layers-every": ("touch-layers", lambda t: t.layer_bytes),
}


def touch_floor(key: str, by: dict[str, Trainer], bandwidth: float,
                p50_plain: float | None) -> float | None:
    """Configuration ``key``'s floor as a ratio to plain: its touch configuration's p50 plus one
    read of the bytes its step reads at ``bandwidth`` (:data:`TOUCHES`); None without both."""
    touch, nbytes = TOUCHES[key]
    if p50_plain is None or touch not in by or key not in by:
        return None
    return (statistics.median(by[touch].step_times) + nbytes(by[key]) / bandwidth) / p50_plain


def report(trainers: list[Trainer], args: argparse.Namespace, bandwidth: float) -> str:
    by = {t.cfg.key: t for t in trainers}
    stats_every, dump_every = _hook_defaults()
    plain = by["plain"].per_step if "plain" in by else None
    per_step = {k: t.per_step for k, t in by.items()}
    for suffix in ("", "-shared"):
        if {"defaults" + suffix, "dump-2/grp" + suffix, "hook-idle"} <= by.keys() and dump_every:
            per_step["defaults" + suffix] += (per_step["dump-2/grp" + suffix] - per_step["hook-idle"]) / dump_every
    # Time per WRITTEN dump: a hook whose writer falls behind drops dumps rather than block,
    # which makes its time per step look better than the work it did.
    per_dump = {k: per_step[k] / max(by[k].written, 1e-9) for k in by if k.startswith("dump-full") or k == "tfdbg"}
    dbg = per_dump.get("tfdbg")
    # The target of a per-step configuration is on the median step (the measure; a
    # slow step of the shared machine does not move it); of the defaults, on the mean
    # (amortised: one statistics step in 100); of full dumps, per written dump (vs tfdbg).
    targets = {"hook-idle": ("p50 <= 1.02", "p50", 1.02), "defaults": ("mean <= 1.05", "mean", 1.05),
               "stats-every": ("p50 <= 1.25", "p50", 1.25), "layers-every": ("p50 <= 1.10", "p50", 1.10)}
    p50_plain = statistics.median(by["plain"].step_times) if "plain" in by else None
    floor = touch_floor("stats-every", by, bandwidth, p50_plain)
    if floor is not None:
        limit = round(max(1.25, floor + 0.05), 3)
        targets["stats-every"] = (f"p50 <= max(1.25, floor {floor:.3f} + 0.05) = {limit:.3f}", "p50", limit)
    if (always := touch_floor("layers-every", by, bandwidth, p50_plain)) is not None:
        targets["layers-every"] = (f"p50 <= 1.10 (floor {always:.3f})", "p50", 1.10)
    rows = []
    for k, t in by.items():
        p50 = statistics.median(t.step_times)
        ratio = per_step[k] / plain if plain else float("nan")
        p50_ratio = p50 / p50_plain if p50_plain else float("nan")
        target, on, limit = targets.get(re.sub(r"-(shared|own|stock)$", "", k), ("", None, None))
        met = "" if on is None else ("yes" if (p50_ratio if on == "p50" else ratio) <= limit else "NO")
        if k.startswith("dump-full") and dbg:
            target, met = "tfdbg/x >= 4", "yes" if dbg / per_dump[k] >= 4 else "NO"
        wall, cpu = t.hook_ms
        cpu_ratio = t.cpu_per_step / by["plain"].cpu_per_step if "plain" in by else float("nan")
        rows.append([t.cfg.label, f"{1e3 * p50:.1f}", f"{p50_ratio:.3f}", f"{1e3 * per_step[k]:.1f}",
                     f"{ratio:.3f}", f"{1e3 * t.cpu_per_step:.1f}", f"{cpu_ratio:.3f}",
                     human_bytes(t.bytes_per_step), f"{wall:.3f} / {cpu:.3f}", target, met])
    out = [f"TensorFlow {tf.__version__}, {args.model[0]} {6 * args.n[0] + 2} layers (n={args.n[0]}), "
           f"batch {args.batch[0]}, "
           f"{args.reps} reps x {args.block} steps per config (interleaved); DumpHook defaults: "
           f"stats every {stats_every}, dump every {dump_every}",
           format_table(rows, ["config", "p50 step ms", "p50 ratio", "mean ms/step", "mean ratio",
                               "cpu ms/step", "cpu ratio", "disk/step",
                               "hook py ms wall/cpu", "target", "met"])]
    dumpers = [k for k in ("dump-full", "dump-full-shared", "dump-full-fsync", "tfdbg") if k in by]
    if dumpers:
        lines = []
        for k in dumpers:
            t = by[k]
            ours = k != "tfdbg"
            lines.append([t.cfg.label.strip(), t.tensors_per_dump if ours else "all",
                          human_bytes(t.raw_dump_bytes) if ours else "", human_bytes(t.bytes_per_step),
                          f"{t.written:.2f}", f"{1e3 * per_dump[k]:.1f}"])
            if ours and dbg:
                out.append(f"tfdbg time per written dump / {t.cfg.label.strip()}'s: {dbg / per_dump[k]:.2f}x")
        out.append(format_table(lines, ["dump", "arrays", "raw bytes/dump", "disk/step", "written/step",
                                        "ms/written dump"]))
    if TFDBG_ERROR:
        out.append(f"tfdbg unavailable in TensorFlow {tf.__version__}: {TFDBG_ERROR}")
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", choices=FAMILIES, default=["bn-resnet"],
                   help="model families (bench/resnet.py); several: the sweep table")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="gpu: the model on /device:GPU:0 (needs one; see bench/README.md for what to expect)")
    p.add_argument("--n", type=int, nargs="+", default=[1], help="blocks per stage (6n+2 layers); default 1")
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--reps", type=int, default=5, help="timed blocks per configuration")
    p.add_argument("--block", type=int, default=max(_hook_defaults()[0], 1),
                   help="steps per timing block (a multiple of the default stats_every_n_steps)")
    p.add_argument("--configs", nargs="*", help="only these configurations (keys: plain hook-idle defaults "
                                                "dump-2/grp stats-every dump-full tfdbg, and defaults-shared "
                                                "dump-2/grp-shared stats-every-shared dump-full-shared; "
                                                "dump-full-fsync only when named)")
    p.add_argument("--dir", help="where the runs are written (default: a temporary directory); e.g. /dev/shm "
                                 "to take the disk's write bandwidth out of the full-dump comparison")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 rep, n=1")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.reps, args.block = [1], 1, 20  # numbers meaningless: (3) is not amortised right
    logging.getLogger("tf_inspector").setLevel(logging.WARNING)
    if args.device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise SystemExit("--device gpu: TensorFlow sees no GPU here (tf.config.list_physical_devices('GPU') is empty)")
    trainers = run(args)
    bandwidth = memory_bandwidth()
    if len(combos(args)) > 1:
        print(sweep_report(trainers, args, bandwidth))
    else:
        print(report(trainers, args, bandwidth), sweep_report(trainers, args, bandwidth), sep="\n\n")


if __name__ == "__main__":
    main()
