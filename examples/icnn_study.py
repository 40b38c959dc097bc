"""Does the ICNN make conv filters more part-stable? A paired multi-seed study.

Run::

    python -m examples.icnn_study                 # 5 seeds, ~10 minutes on 2 idle cores
    python -m examples.icnn_study --seeds 10 --json study.json
    python -m examples.icnn_study --quick         # 2 tiny seeds: checks the machinery only

For each seed: one training set and one held-out set of ``examples.parts_scene`` images
(objects of four parts among distractor parts on textured backgrounds); the ICNN
(``examples.models`` with the conv-mask layer after conv3) and its plain twin start from the
**same initial weights** and see the **same batches**. On the held-out positives, the study
measures conv3's raw output (before the ReLU and the mask, as the release does):

- ``instability``: the release's location instability (``inspector.icnn.stability``; lower is
  better), all 32 filters, top 100 images per filter;
- ``consistency``: the mean over filters of ``stability.part_consistency`` (how often a
  filter's peak lands on its most frequent part, within ``--radius`` pixels; higher is better);
- ``accuracy``: held-out classification accuracy.

It prints one row per seed, then per metric the mean and standard deviation of each model,
the paired difference ICNN - plain (mean, sd, t, two-sided p of the paired t-test, and the
sign count), and a plain-language verdict that says when the effect did not appear.
Determinism: one intra-op and one inter-op thread by default, a graph seed per seed and
NumPy generators seeded from it, so a seed reproduces its numbers (a test checks it).
TensorFlow's process-wide ``enable_op_determinism`` is not switched on: it cannot be switched
off again without a private API, and it breaks unseeded random ops elsewhere in the process.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the imports below (noqa: E402): TF reads it once
import tensorflow as tf  # noqa: E402

from examples import models  # noqa: E402
from examples.parts_scene import make_scene_dataset  # noqa: E402
from inspector.icnn import layer as icnn  # noqa: E402
from inspector.icnn.stability import location_instability, part_consistency  # noqa: E402

tf1 = tf.compat.v1
METRICS = ("instability", "consistency", "accuracy")
#: For each metric, +1 if higher is better, -1 if lower is better.
BETTER = {"instability": -1, "consistency": 1, "accuracy": 1}
QUICK = dict(seeds=2, steps=6, batch=8, train_size=48, test_size=40, top_k=10)


# ----------------------------------------------------------------------------- statistics
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                    -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom.

    >>> round(t_two_sided_p(2.776445, 4), 4)        # the 97.5% quantile for 4 df
    0.05
    """
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def paired_stats(icnn: Sequence[float], plain: Sequence[float]) -> Dict[str, float]:
    """Mean and sd (ddof 1) of each, and the paired difference icnn - plain: its mean, sd,
    t = mean / (sd / sqrt(n)), the two-sided p of the paired t-test, and the sign count
    (``icnn_higher``, ``icnn_lower``, ``ties``).

    >>> s = paired_stats([1.0, 2.0, 3.0], [1.5, 2.5, 3.0])
    >>> s["mean_diff"], s["icnn_lower"], s["ties"]
    (-0.3333333333333333, 2, 1)
    """
    a, b = np.asarray(icnn, float), np.asarray(plain, float)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"need two equal-length series of at least 2 values, got {a.shape} and {b.shape}")
    d = a - b
    sd = float(d.std(ddof=1))
    mean = float(d.mean())
    t = mean / (sd / math.sqrt(d.size)) if sd > 0 else (float("nan") if mean == 0 else math.copysign(math.inf, mean))
    return {"n": int(d.size), "icnn_mean": float(a.mean()), "icnn_sd": float(a.std(ddof=1)),
            "plain_mean": float(b.mean()), "plain_sd": float(b.std(ddof=1)), "mean_diff": mean, "sd_diff": sd,
            "t": t, "p": t_two_sided_p(t, d.size - 1), "icnn_higher": int((d > 0).sum()),
            "icnn_lower": int((d < 0).sum()), "ties": int((d == 0).sum())}


# ----------------------------------------------------------------------------- training
def _config(threads: int):
    return tf1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1)


def train_and_measure(kind: str, data: Dict[str, np.ndarray], *, seed: int, steps: int, batch: int, threads: int,
                      init: Dict[str, np.ndarray], params: Dict, top_k: int, radius: float) -> Dict[str, float]:
    """Train one twin from ``init`` (filled in by the first twin, reused by the second) and
    measure it on the held-out set."""
    x_tr, y_tr = data["x_train"], data["y_train"]
    with tf.Graph().as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [None, *x_tr.shape[1:]])
        labels = tf1.placeholder(tf.int64, [None])
        params = dict(params, icnn=(kind == "icnn"), steps_per_epoch=max(len(y_tr) // batch, 1), monitor=False)
        out = models.build(images, labels, "train", params)
        shared = {v.op.name: v for v in icnn.weight_decay_variables()}   # trainable, less ICNN's beta
        with tf1.Session(config=_config(threads)) as sess:
            sess.run(tf1.global_variables_initializer())
            for name, var in shared.items():        # both twins start from the same weights
                if name in init:
                    var.load(init[name], sess)
                else:
                    init[name] = sess.run(var)
            rng = np.random.default_rng(seed)        # the same batches for both twins
            order: List[int] = []
            for _ in range(steps):
                if len(order) < batch:
                    order += rng.permutation(len(y_tr)).tolist()
                idx, order = order[:batch], order[batch:]
                sess.run(out["train_op"], {images: x_tr[idx], labels: y_tr[idx]})
            keys = ("probability", "top", "top_raw")
            chunks = [sess.run([out[k] for k in keys], {images: data["x_test"][i:i + 200]})
                      for i in range(0, len(data["x_test"]), 200)]
    pred = {k: np.concatenate([c[j] for c in chunks]) for j, k in enumerate(keys)}
    return measure(pred, data["y_test"], data["p_test"], top_k=top_k, radius=radius,
                   image_size=data["x_test"].shape[1:3])


def measure(pred: Dict[str, np.ndarray], labels: np.ndarray, parts: np.ndarray, *, top_k: int, radius: float,
            image_size) -> Dict[str, float]:
    """accuracy, instability and consistency of conv3's raw maps on the positives."""
    pos = labels == 1
    maps, where = pred["top_raw"][pos], parts[pos]
    kw = dict(stride=models.RF_STRIDE, center=models.RF_CENTER, top_k=top_k)
    cons, _ = part_consistency(maps, where, radius=radius, **kw)
    return {"accuracy": float(np.mean((pred["probability"] > 0.5).astype(np.int64) == labels)),
            "instability": location_instability(maps, where, image_size=tuple(image_size), **kw),
            "consistency": float(np.nanmean(cons)) if np.isfinite(cons).any() else float("nan"),
            "dead_filters": int(np.sum(pred["top"][pos].max(axis=(0, 1, 2)) <= 0))}


# ----------------------------------------------------------------------------- the study
def run_study(*, seeds: int, steps: int, batch: int, train_size: int, test_size: int, threads: int = 1,
              top_k: int = 100, radius: float = 4.0, first_seed: int = 0, params: Optional[Dict] = None,
              progress: bool = True) -> Dict:
    """Train the twins for every seed; return ``{"rows": [...], "summary": {metric: paired_stats}}``."""
    if seeds < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {seeds}")
    from tqdm import tqdm

    rows = []
    bar = tqdm(total=2 * seeds, desc="icnn study", unit="model", disable=not progress, file=sys.stderr)
    for seed in range(first_seed, first_seed + seeds):
        x_tr, y_tr, _ = make_scene_dataset(train_size, seed=seed)
        x_te, y_te, p_te = make_scene_dataset(test_size, seed=seed + 100_000)
        data = dict(x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, p_test=p_te)
        init: Dict[str, np.ndarray] = {}
        for kind in ("icnn", "plain"):
            bar.set_postfix(seed=seed, model=kind)
            t0 = time.time()
            r = train_and_measure(kind, data, seed=seed, steps=steps, batch=batch, threads=threads, init=init,
                                  params=params or {}, top_k=top_k, radius=radius)
            rows.append({"seed": seed, "model": kind, **r, "seconds": time.time() - t0})
            bar.update(1)
    bar.close()
    summary = {m: paired_stats([r[m] for r in rows if r["model"] == "icnn"],
                               [r[m] for r in rows if r["model"] == "plain"]) for m in METRICS}
    return {"rows": rows, "summary": summary}


def verdict(summary: Dict, alpha: float = 0.05) -> List[str]:
    """One sentence per metric, saying plainly whether ICNN differs from plain."""
    lines = []
    for m in METRICS:
        s = summary[m]
        better = "lower" if BETTER[m] < 0 else "higher"
        head = (f"{m}: ICNN {s['icnn_mean']:.4f} vs plain {s['plain_mean']:.4f}, paired difference "
                f"{s['mean_diff']:+.4f} (sd {s['sd_diff']:.4f}, t = {s['t']:.2f}, p = {s['p']:.3g}); ICNN "
                f"{better} in {s['icnn_lower'] if BETTER[m] < 0 else s['icnn_higher']} of {s['n']} seeds.")
        if not s["p"] < alpha:
            tail = f" No significant difference at p < {alpha}: this study does not show an ICNN effect on {m}."
        elif s["mean_diff"] * BETTER[m] > 0:
            tail = f" ICNN is significantly better ({better} is better) at p < {alpha}."
        else:
            tail = f" ICNN is significantly WORSE ({better} is better) at p < {alpha}."
        lines.append(head + tail)
    return lines


def format_table(result: Dict) -> str:
    rows, summary = result["rows"], result["summary"]
    out = [f"{'seed':>5} {'model':<6}{'instability':>12}{'consistency':>12}{'accuracy':>10}{'dead':>6}{'s':>7}"]
    out += [f"{r['seed']:>5} {r['model']:<6}{r['instability']:>12.4f}{r['consistency']:>12.3f}{r['accuracy']:>10.3f}"
            f"{r['dead_filters']:>6d}{r['seconds']:>7.1f}" for r in rows]
    out.append("")
    out.append(f"{'metric':<12}{'ICNN mean':>10}{'sd':>8}{'plain mean':>11}{'sd':>8}{'diff':>9}{'sd':>8}"
               f"{'t':>7}{'p':>8}{'  ICNN<plain':>12}{'>':>3}{'=':>3}")
    for m in METRICS:
        s = summary[m]
        out.append(f"{m:<12}{s['icnn_mean']:>10.4f}{s['icnn_sd']:>8.4f}{s['plain_mean']:>11.4f}{s['plain_sd']:>8.4f}"
                   f"{s['mean_diff']:>+9.4f}{s['sd_diff']:>8.4f}{s['t']:>7.2f}{s['p']:>8.3g}{s['icnn_lower']:>12d}"
                   f"{s['icnn_higher']:>3d}{s['ties']:>3d}")
    return "\n".join(out)


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-size", type=int, default=3000)
    ap.add_argument("--test-size", type=int, default=400, help="half of them positive (the metric's images)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (1: reproducible and light)")
    ap.add_argument("--top-k", type=int, default=100, help="images per filter (the release: 100)")
    ap.add_argument("--radius", type=float, default=4.0, help="part consistency: a peak within this many "
                                                              "pixels of a part lands on it")
    ap.add_argument("--beta-update", default="release", choices=["release", "stable"])
    ap.add_argument("--filter-loss-weight", type=float, default=1.0,
                    help="factor on the ICNN's filter-loss gradient (0: the mask alone, an ablation)")
    ap.add_argument("--quick", action="store_true", help="2 tiny seeds (tests): numbers mean nothing")
    ap.add_argument("--json", default=None, help="also write rows and summary here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    opts = dict(seeds=args.seeds, steps=args.steps, batch=args.batch, train_size=args.train_size,
                test_size=args.test_size, top_k=args.top_k)
    if args.quick:
        opts.update(QUICK)
    t0 = time.time()
    result = run_study(**opts, threads=args.threads, radius=args.radius, first_seed=args.first_seed,
                       params=dict(beta_update=args.beta_update, filter_loss_weight=args.filter_loss_weight),
                       progress=not args.no_progress)
    result["settings"] = {**opts, "threads": args.threads, "radius": args.radius, "first_seed": args.first_seed,
                          "beta_update": args.beta_update, "filter_loss_weight": args.filter_loss_weight,
                          "tensorflow": tf.__version__}
    print(f"ICNN vs plain twin, {opts['seeds']} seeds, {opts['steps']} steps of batch {opts['batch']}, "
          f"{opts['train_size']} training / {opts['test_size']} held-out parts_scene images; conv3 raw maps, "
          f"top-{opts['top_k']} positive images per filter")
    print(format_table(result))
    print()
    print("\n".join(verdict(result["summary"])))
    print(f"wall time {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
