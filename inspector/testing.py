"""A realistic run written without TensorFlow, for tests, demos of the viewer and benchmarks.

The run looks like a small conv net trained on a part-detection task: ``conv<i>/Conv2D``,
``conv<i>/BiasAdd`` and ``conv<i>/Relu`` tensors over three resolution stages, one ICNN mask
layer (``icnn/*``, roles per ICNN.md), a dense head and the loss. Statistics (groups all /
positive / negative, with histograms) are drawn from closed-form distributions, so a
1,000-step x 300-tensor run takes seconds; dumps hold per-sample feature maps whose positive
samples put each ICNN filter's activation on a consistent "part".

Built-in anomalies, for alerts: one dead ReLU (``dead_relu=True``), gradients that shrink
with depth from the loss, and optionally NaN/Inf from ``nonfinite_at`` and a dead ICNN filter
(``dead_filter``).

Example::

    from inspector.testing import make_synthetic_run
    path = make_synthetic_run("runs/demo", steps=200, tensors=40, dump_every=50)

    # a run that is still being written (the viewer's live mode):
    b = SyntheticRun("runs/live", tensors=20, stats_flush_secs=0)
    b.write_steps(0, 10); b.sync()      # files on disk now
    b.write_steps(10, 20); b.close()
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inspector.format.accounting import DEFAULT_RULES, Rule, record
from inspector.format.loghist import LogHistogram, bucket_edges, bucket_index
from inspector.format.manifest import CONFIG_DEFAULTS, hook_config
from inspector.graph.graphdef import Node, encode_graph_def
from inspector.icnn.masks import icnn_mask, icnn_mu

from .errors import InspectorError
from .format import GROUPS, HIST_MAX_ELEMENTS, STAT_COLUMNS, manifest_name
from .storage import normalize
from .writer import RunWriter, StatsLayout

BATCH = 32
#: Log-magnitude buckets per sign in a synthetic histogram: 12 powers of two below each row's
#: largest magnitude (a 16,384-value subsample of a Laplace spans about as many)
WINDOW = 96
ICNN_ROLES_SPEC = {  # role: (op_type, batched, has_gradient)
    "pre_mask": ("Identity", True, True), "mask": ("Maximum", True, False),
    "mu": ("Pack", True, False), "sqrtvar": ("Sqrt", True, False),
    "post_mask": ("Relu", True, True), "beta": ("ReadVariableOp", False, False),
    "strength": ("Mean", True, False), "filter_loss": ("Mean", False, False),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    op_type: str
    shape: tuple            # per-sample shape (without the batch) for batched tensors
    batched: bool
    has_gradient: bool
    depth: float            # 0 (input side) .. 1 (loss side)
    icnn_role: str | None = None

    def catalog_row(self) -> dict:
        op = self.name.rsplit(":", 1)[0]
        return {"name": self.name, "op": op, "op_type": self.op_type, "dtype": "float32",
                "shape": ([None] if self.batched else []) + list(self.shape),
                "scope": op.rsplit("/", 1)[0], "has_gradient": self.has_gradient,
                "batched": self.batched, "icnn_layer": "icnn" if self.icnn_role else None,
                "icnn_role": self.icnn_role}


def build_catalog(n_tensors: int, icnn: bool = True, icnn_hw: int = 8, icnn_channels: int = 8,
                  image: tuple[int, int, int] | None = None) -> list[Tensor]:
    """``n_tensors`` tensors in graph order: conv blocks, the ICNN layer, a dense head, the loss;
    with ``image`` (H, W, C), first the model's input, as an input pipeline feeds it
    (``IteratorGetNext:0``, no gradient: it is not counted in ``n_tensors``)."""
    head = [Tensor("dense/MatMul:0", "MatMul", (2,), True, True, 0.97),
            Tensor("dense/BiasAdd:0", "BiasAdd", (2,), True, True, 0.98),
            Tensor("loss/Mean:0", "Mean", (), False, True, 1.0)]
    icnn_t = [Tensor(f"icnn/{r}:0", op, _icnn_shape(r, icnn_hw, icnn_channels), b, g, 0.95, r)
              for r, (op, b, g) in ICNN_ROLES_SPEC.items()] if icnn else []
    n_conv = max(n_tensors - len(head) - len(icnn_t), 0)
    convs = []
    for i in range(n_conv):
        layer, part = divmod(i, 3)
        stage = min(3 * i // max(n_conv, 1), 2)         # three stages of resolution
        hw, c = (16, 4) if stage == 0 else (8, 8) if stage == 1 else (icnn_hw, icnn_channels)
        op = ("Conv2D", "BiasAdd", "Relu")[part]
        convs.append(Tensor(f"conv{layer + 1}/{op}:0", op, (hw, hw, c), True, True,
                            0.9 * i / max(n_conv, 1)))
    inputs = [Tensor("IteratorGetNext:0", "IteratorGetNext", tuple(image), True, False, 0.0)] \
        if image else []
    # at least the ICNN layer and the head, even if n_tensors is smaller
    return inputs + convs + icnn_t + head


def synthetic_graph(catalog: list[Tensor]) -> list[Node]:
    """A plausible op graph around ``catalog``: the input placeholder, each conv block's
    Conv2D -> BiasAdd -> Relu with its weights' reads, the ICNN layer's roles, the dense head and
    the loss (with the labels), and one backward op (``gradients/...``) per ReLU.

    >>> [(n.name, n.inputs) for n in synthetic_graph(build_catalog(3, icnn=False))][-1]
    ('loss/Mean', ('dense/BiasAdd', 'labels'))
    """
    nodes = [Node("images", "Placeholder"), Node("labels", "Placeholder"),
             Node("gradients/Fill", "Fill")]
    prev = "images"
    ops = [t.name.rsplit(":", 1)[0] for t in catalog]
    by_op = dict(zip(ops, catalog))
    roles = {t.icnn_role: op for op, t in by_op.items() if t.icnn_role}
    for op, t in by_op.items():
        scope = op.rsplit("/", 1)[0]
        if t.icnn_role:
            ins = {"pre_mask": [prev], "mu": [roles.get("pre_mask", prev)],
                   "sqrtvar": [roles.get("pre_mask", prev)],
                   "mask": [roles.get("mu", prev), roles.get("sqrtvar", prev)],
                   "post_mask": [roles.get("pre_mask", prev), roles.get("mask", prev)],
                   "beta": ["icnn/beta_var"],
                   "strength": [roles.get("pre_mask", prev), roles.get("beta", prev)],
                   "filter_loss": [roles.get("pre_mask", prev),
                                   roles.get("mask", prev)]}[t.icnn_role]
            if t.icnn_role == "beta":
                nodes.append(Node("icnn/beta_var", "VarHandleOp"))
            nodes.append(Node(op, t.op_type, tuple(ins)))
            prev = roles["post_mask"] if t.icnn_role == "post_mask" else prev
            continue
        weights = {"Conv2D": "w", "BiasAdd": "b", "MatMul": "w"}.get(t.op_type)
        ins = [prev]
        if weights:
            nodes += [Node(f"{scope}/{weights}", "VarHandleOp"),
                      Node(f"{scope}/{weights}/read", "ReadVariableOp", (f"{scope}/{weights}",))]
            ins.append(f"{scope}/{weights}/read")
        if op == "loss/Mean":
            ins.append("labels")
        nodes.append(Node(op, t.op_type, tuple(ins)))
        if t.op_type == "Relu":
            nodes.append(Node(f"gradients/{op}_grad/ReluGrad", "ReluGrad", ("gradients/Fill", op)))
        prev = op
    return nodes


#: The rule of a synthetic graph's ops the generator makes no values for
#: (the weights' reads, the input)
SYNTHETIC = Rule("synthetic",
                 "a synthetic run (inspector.testing) generates no values for it", "hook")


def synthetic_accounting(catalog: list[Tensor], nodes: list[Node]) -> dict:
    """The manifest's ``accounting`` of a :func:`synthetic_graph`: the catalog captured, the
    backward ops excluded by the default rule, the other float outputs by :data:`SYNTHETIC`."""
    outputs = [(f"{n.name}:0", n.op) for n in nodes if n.op != "VarHandleOp" and n.name != "labels"]
    return record(outputs, [t.name for t in catalog], {}, {}, {}, DEFAULT_RULES, SYNTHETIC)


def _icnn_shape(role: str, hw: int, c: int) -> tuple:
    return {"pre_mask": (hw, hw, c), "mask": (hw, hw, c), "post_mask": (hw, hw, c), "mu": (c, 2),
            "sqrtvar": (c,), "strength": (c,), "beta": (c,), "filter_loss": (c,)}[role]


class SyntheticRun:
    """Writes a synthetic run step by step (see the module docstring)."""

    def __init__(self, path: str | Path, tensors: int = 30, *, steps_hint: int = 100,
                 dump_every: int | None = 50, samples: int = 8, icnn: bool = True, seed: int = 0,
                 nonfinite_at: int | None = None, dead_relu: bool = True,
                 stats_flush_secs: float = 10.0, dropped_steps: tuple[int, ...] = (),
                 dead_filter: int | None = None, worker: str = "chief",
                 storage_options: dict | None = None, graph: bool = True,
                 image: tuple[int, int, int] | None = None, channels: int = 8) -> None:
        self.path: Any = normalize(path)  # a Path, or a URL (fsspec: object storage)
        self.dead_filter = dead_filter
        self.catalog = build_catalog(tensors, icnn, icnn_channels=channels, image=image)
        self.rng = np.random.default_rng(seed)
        self.seed, self.steps_hint, self.dump_every, self.samples = \
            seed, max(steps_hint, 1), dump_every, samples
        self.nonfinite_at, self.dropped_steps = nonfinite_at, set(dropped_steps)
        self._sync_token = 0
        relus = [i for i, t in enumerate(self.catalog) if t.op_type == "Relu" and not t.icnn_role]
        self.dead = relus[len(relus) // 3] if dead_relu and len(relus) >= 2 else None
        self.nonfinite_tensor = self.catalog[relus[len(relus) // 2] if relus else 0].name
        self._layout_rows()
        hw = next((t.shape for t in self.catalog if t.icnn_role == "pre_mask"), (8, 8, 8))
        c, self.map_hw = hw[2], hw[0]
        # ICNN: each filter's "part" position and its beta / filter-loss trajectories.
        self.parts = self.rng.uniform(1.5, hw[0] - 2.5, size=(c, 2))
        self.beta_target = self.rng.uniform(1.5, 3.0, size=c)
        self.loss_final = self.rng.uniform(-3.0, -1.0, size=c)
        # the same manifest keys as hooks.DumpHook writes (one schema: manifest_schema)
        config = hook_config(**{**CONFIG_DEFAULTS, "stats_every_n_steps": 1,
                                "dump_every_n_steps": dump_every, "samples_per_group": samples // 2,
                                "max_bytes": None, "native_stats": False})
        nodes = synthetic_graph(self.catalog) if graph else None
        manifest = {"tensorflow_version": None, "is_chief": worker == "chief",
                    "loss": "loss/Mean:0", "labels": "labels:0",
                    "config": config, "tensors": [t.catalog_row() for t in self.catalog],
                    "skipped": [], "first_nonfinite": None, "synthetic_seed": seed,
                    "accounting": synthetic_accounting(self.catalog, nodes) if nodes else None}
        layout = StatsLayout(tuple(self.row_tensor), tuple(self.row_kind), tuple(self.row_group))
        self.writer = RunWriter(self.path, manifest=manifest, stats_layout=layout, queue_size=64,
                                stats_flush_secs=stats_flush_secs, worker=worker,
                                storage_options=storage_options,
                                graph_def=encode_graph_def(nodes) if nodes else None)

    # ---- statistics ------------------------------------------------------------------------
    def _layout_rows(self) -> None:
        """One row per (tensor, kind, group), tensor-major, plus per-row distribution parameters."""
        tens, kinds, groups, idx = [], [], [], []
        for i, t in enumerate(self.catalog):
            for kind in ("forward", "gradient") if t.has_gradient else ("forward",):
                for g in GROUPS if t.batched else ("all",):
                    tens.append(t.name)
                    kinds.append(kind)
                    groups.append(g)
                    idx.append(i)
        self.row_tensor, self.row_kind, self.row_group = tens, kinds, groups
        self.row_idx = np.array(idx)
        r = len(idx)
        cat = self.catalog
        depth = np.array([cat[i].depth for i in idx])
        grad = np.array([k == "gradient" for k in kinds])
        relu = np.array([cat[i].op_type in ("Relu", "Identity", "Maximum", "Sqrt") for i in idx]) \
            & ~grad
        per_sample = np.array([int(np.prod(cat[i].shape, dtype=np.int64)) for i in idx])
        nb = np.array([cat[i].batched for i in idx])
        grp = np.array([GROUPS.index(g) for g in groups])      # 0 all, 1 pos, 2 neg
        self.r_depth, self.r_grad, self.r_relu, self.r_grp = depth, grad, relu, grp
        self.r_per_sample, self.r_batched = per_sample, nb
        rng = np.random.default_rng(self.seed + 1)
        t_rand = rng.uniform(0.7, 1.3, size=len(cat))[self.row_idx]
        self.r_scale0 = np.where(grad, 0.05 * np.exp(-4.0 * (1 - depth)) * t_rand, 0.5 * t_rand)
        self.r_zero = np.where(relu, rng.uniform(0.3, 0.6, size=len(cat))[self.row_idx], 0.0)
        self.r_contrast = np.where(grad, 0.2, 1.5 * depth) * (grp == 1) \
            - np.where(grad, 0.1, 0.5 * depth) * (grp == 2)
        self.r_loc = np.where(relu | grad, 0.0, rng.normal(0, 0.2, size=len(cat))[self.row_idx])
        self.special = [j for j in range(r) if cat[idx[j]].icnn_role in ("beta", "filter_loss")
                        or cat[idx[j]].name == "loss/Mean:0"]

    def _counts(self, steps: np.ndarray) -> np.ndarray:
        """Element counts [S, R]: the positive share of each batch varies from step to step."""
        rng = np.random.default_rng([self.seed, int(steps[0])])
        npos = rng.binomial(BATCH, 0.5, size=len(steps))[:, None]
        n = np.where(self.r_grp == 1, npos, np.where(self.r_grp == 2, BATCH - npos, BATCH))
        return np.where(self.r_batched, n, 1) * self.r_per_sample

    def stats_block(self, steps: np.ndarray):
        """values [S,R,9], histogram bucket indices [S,R,B] (ascending in each row) and counts
        [S,R,B] for ``steps`` (vectorised)."""
        s = np.asarray(steps, np.float64)[:, None]
        t = s / self.steps_hint
        rng = np.random.default_rng([self.seed, 7, int(steps[0])])
        noise = np.exp(rng.normal(0, 0.08, size=(len(steps), len(self.row_idx))))
        count = self._counts(np.asarray(steps)).astype(np.float64)
        grad = self.r_grad
        # activations grow and separate positive from negative as training goes on; gradients decay
        scale = self.r_scale0 * noise * np.where(grad, 1 / (1 + 4 * t), (1 + 0.3 * t)) \
            * (1 + self.r_contrast * t)
        zero = np.broadcast_to(self.r_zero, scale.shape).copy()
        if self.dead is not None:
            dead_rows = (self.row_idx == self.dead)
            zero[:, dead_rows & ~grad] = 1.0
            scale[:, dead_rows & grad] = 0.0        # a dead unit passes no gradient either
        relu = np.broadcast_to(self.r_relu, scale.shape)
        loc = np.broadcast_to(self.r_loc, scale.shape) * (1 + t)
        # relu rows: mixture of a point mass at 0 (zero) and Exp(scale); others: Laplace(loc, scale)
        mean = np.where(relu, (1 - zero) * scale, loc)
        ex2 = np.where(relu, (1 - zero) * 2 * scale ** 2, loc ** 2 + 2 * scale ** 2)
        std = np.sqrt(np.maximum(ex2 - mean ** 2, 0))
        tail = scale * np.log(np.maximum(count, 2))            # expected extreme of `count` draws
        lo = np.where(relu, 0.0, loc - tail)
        hi = np.where(relu, np.where(zero >= 1, 0.0, tail), loc + tail)
        l2 = np.sqrt(count * ex2)
        values = np.stack([count, mean, std, lo, hi, l2, np.where(relu, zero, 0.0),
                           np.zeros_like(count), np.zeros_like(count)], axis=-1)
        index, hist = self._log_hist(count, relu, zero, loc, scale,
                                     np.maximum(np.abs(lo), np.abs(hi)))
        self._special_rows(steps, values, index, hist)
        self._nonfinite(steps, values)
        # all NaN: no finite value counted
        hist[values[..., STAT_COLUMNS.index("nan")] >= count] = 0
        return values, index, hist

    def _log_hist(self, count, relu, zero, loc, scale, top) -> tuple[np.ndarray, np.ndarray]:
        """Log-magnitude histograms [S, R, 2W + 1] (bucket indices ascending, counts) of the
        rows' distributions: a window of W buckets below each row's largest magnitude on each
        side and bucket 0; the mass below the window goes to its first bucket. Counts are of
        ``min(count, HIST_MAX_ELEMENTS)`` values, as the hook's subsample."""
        w = WINDOW
        b_top = np.maximum(bucket_index(np.maximum(top, 1e-30))[0].astype(np.int64), w + 1)
        pos = b_top[..., None] - w + 1 + np.arange(w)                 # [S, R, W] ascending
        e_lo, e_hi = bucket_edges(pos)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            sc = np.maximum(scale, 1e-30)[..., None]
            rl, zr, lc = relu[..., None], zero[..., None], loc[..., None]

            def cdf(x):
                lap_z = (x - lc) / sc
                lap = np.where(lap_z < 0, 0.5 * np.exp(np.minimum(lap_z, 0)),
                               1 - 0.5 * np.exp(-np.maximum(lap_z, 0)))
                exp = np.where(x > 0, zr + (1 - zr) * (1 - np.exp(-np.maximum(x, 0) / sc)),
                               np.where(x == 0, zr, 0.0))
                return np.where(rl, exp, lap)

            at0 = cdf(np.zeros_like(e_lo[..., :1]))
            above = cdf(e_hi) - cdf(e_lo)
            above[..., 0] += cdf(e_lo[..., :1])[..., 0] - at0[..., 0]
            above[..., -1] += 1 - cdf(e_hi[..., -1:])[..., 0]
            below = cdf(-e_lo) - cdf(-e_hi)
            below[..., 0] += at0[..., 0] \
                - np.where(rl[..., 0], zr[..., 0], cdf(-e_lo[..., :1])[..., 0])
            zeros = np.where(relu, zero, 0.0)[..., None]
        mass = np.nan_to_num(np.concatenate([below[..., ::-1], zeros, above], -1))
        n = np.minimum(count, HIST_MAX_ELEMENTS)[..., None]
        index = np.concatenate([-pos[..., ::-1], np.zeros_like(pos[..., :1]), pos], -1)
        return index.astype(np.int16), np.rint(np.clip(mass, 0, 1) * n).astype(np.int32)

    def beta(self, step: int | np.ndarray) -> np.ndarray:
        """beta [.., C] at ``step``: from 2.0 toward the per-filter target (ICNN.md's update)."""
        decay = np.exp(-np.asarray(step, np.float64)[..., None] / (0.3 * self.steps_hint))
        return self.beta_target + (2.0 - self.beta_target) * decay

    def filter_loss(self, step: int | np.ndarray) -> np.ndarray:
        """A monitoring value of each filter's loss (-MI estimate), decreasing over training."""
        decay = np.exp(-np.asarray(step, np.float64)[..., None] / (0.4 * self.steps_hint))
        return self.loss_final + (0.0 - self.loss_final) * decay

    def _special_rows(self, steps, values, index, hist) -> None:
        """Exact statistics and histograms for the non-batched tensors (beta, filter loss, loss)."""
        for j in self.special:
            name = self.row_tensor[j]
            if self.row_kind[j] == "gradient":
                continue
            if "beta" in name:
                v = self.beta(np.asarray(steps))
            elif "filter_loss" in name:
                v = self.filter_loss(np.asarray(steps))
            else:
                v = (0.7 * np.exp(-np.asarray(steps) / (0.5 * self.steps_hint)) + 0.1)[:, None]
            lo, hi = v.min(1), v.max(1)
            hi = np.where(hi > lo, hi, lo + 1e-6)
            values[:, j] = np.stack([np.full(len(v), v.shape[1]), v.mean(1), v.std(1), lo, hi,
                                     np.sqrt((v ** 2).sum(1)), (v == 0).mean(1), 0 * lo, 0 * lo],
                                    -1)
            for k, row in enumerate(v):
                h = LogHistogram.of(row)
                index[k, j] = 0
                hist[k, j] = 0
                index[k, j, :len(h.index)] = h.index
                hist[k, j, :len(h.index)] = h.count
                index[k, j, len(h.index):] = h.index[-1] + 1 \
                    + np.arange(index.shape[-1] - len(h.index))

    def _nonfinite(self, steps, values) -> None:
        """At ``nonfinite_at`` one ReLU overflows (Inf); from the next step on, NaN spreads to
        every later activation and every gradient."""
        if self.nonfinite_at is None:
            return
        steps = np.asarray(steps)
        first = self.row_idx == [t.name for t in self.catalog].index(self.nonfinite_tensor)
        at = steps == self.nonfinite_at
        cnt = STAT_COLUMNS.index("count")
        if at.any():
            rows = first & ~self.r_grad
            sub = values[at][:, rows]
            sub[..., STAT_COLUMNS.index("inf")] = np.maximum(1, sub[..., cnt] // 100)
            sub[..., STAT_COLUMNS.index("max")] = np.inf
            sub[..., STAT_COLUMNS.index("mean")] = np.inf
            tmp = values[at]
            tmp[:, rows] = sub
            values[at] = tmp
        after = steps > self.nonfinite_at
        if after.any():
            k = [t.name for t in self.catalog].index(self.nonfinite_tensor)
            rows = self.r_grad | (self.row_idx >= k)
            tmp = values[after]
            sub = tmp[:, rows]
            sub[..., STAT_COLUMNS.index("nan")] = sub[..., cnt]
            for c in ("mean", "std", "min", "max", "l2"):
                sub[..., STAT_COLUMNS.index(c)] = np.nan
            tmp[:, rows] = sub
            values[after] = tmp

    # ---- dumps -----------------------------------------------------------------------------
    def dump_arrays(self, step: int) -> dict[str, np.ndarray]:
        """The arrays of a full dump at ``step``: samples/* then forward/* and
        gradient/* per tensor."""
        rng = np.random.default_rng([self.seed, 11, step])
        n = self.samples
        npos = n // 2
        group = np.array([1] * npos + [0] * (n - npos), np.int64)
        out: dict[str, np.ndarray] = {
            "samples/index": np.sort(rng.choice(BATCH, n, replace=False)).astype(np.int64),
            "samples/label": group.copy(), "samples/group": group}
        t = step / self.steps_hint
        icnn = self._icnn_dump(step, group, rng)
        for i, ten in enumerate(self.catalog):
            if ten.icnn_role:
                out[f"forward/{ten.name}"] = icnn[ten.icnn_role]
                if ten.has_gradient:
                    out[f"gradient/{ten.name}"] = self._grad_like(icnn[ten.icnn_role], ten, t, rng)
                continue
            if ten.op_type == "IteratorGetNext":
                out[f"forward/{ten.name}"] = _image(rng, group, ten.shape,
                                                    self.parts[0] / self.map_hw)
                continue
            if not ten.batched:
                out[f"forward/{ten.name}"] = \
                    np.float32(0.7 * np.exp(-step / (0.5 * self.steps_hint)) + 0.1)[None]
                continue
            if len(ten.shape) == 3:
                x = _blobs(rng, group, ten.shape,
                           self.parts if ten.shape[2] == len(self.parts) else None,
                           1 + 1.5 * ten.depth * t)
                if ten.op_type == "Relu":
                    x = np.maximum(x - 0.4, 0) * (0.0 if i == self.dead else 1.0)
                else:
                    x = x - 0.4 + (0.1 if ten.op_type == "BiasAdd" else 0.0)
            else:
                x = rng.normal(0, 1, (n, *ten.shape)) + (group[:, None] * 2 - 1) * t
            out[f"forward/{ten.name}"] = x.astype(np.float32)
            out[f"gradient/{ten.name}"] = self._grad_like(x, ten, t, rng) \
                * (0.0 if i == self.dead else 1.0)
        return out

    def _grad_like(self, x: np.ndarray, ten: Tensor, t: float, rng) -> np.ndarray:
        scale = 0.05 * np.exp(-4.0 * (1 - ten.depth)) / (1 + 4 * t)
        return (rng.laplace(0, scale, x.shape)
                * (x != 0 if ten.op_type == "Relu" else 1)).astype(np.float32)

    def _icnn_dump(self, step: int, group: np.ndarray, rng) -> dict[str, np.ndarray]:
        pre = next((t for t in self.catalog if t.icnn_role == "pre_mask"), None)
        if pre is None:
            return {}
        hw, _, c = pre.shape
        sharp = 0.3 + 0.7 * min(step / self.steps_hint, 1.0)     # parts get sharper with training
        x = _blobs(rng, group, pre.shape, self.parts, 1 + sharp, jitter=1.5 * (1 - sharp) + 0.4)
        x = np.maximum(x - 0.3, 0).astype(np.float32)
        if self.dead_filter is not None:
            # never fires: mu pinned at (-1, -1)
            x[..., self.dead_filter] = 0.0
        mu, sqrtvar = icnn_mu(x)
        beta = self.beta(step).astype(np.float32)
        mask = icnn_mask(mu, beta, hw, hw)
        post = np.maximum(x * mask, 0).astype(np.float32)
        return {"pre_mask": x, "mask": mask, "mu": mu, "sqrtvar": sqrtvar, "post_mask": post,
                "beta": beta, "strength": (x * mask).mean(axis=(1, 2)).astype(np.float32),
                "filter_loss": self.filter_loss(step).astype(np.float32)}

    # ---- driving the writer ----------------------------------------------------------------
    def write_steps(self, start: int, stop: int, chunk: int = 50) -> None:
        """Write statistics for steps ``start..stop-1`` and the dumps that fall in that range."""
        for a in range(start, stop, chunk):
            steps = np.arange(a, min(a + chunk, stop))
            values, index, hist = self.stats_block(steps)
            for k, s in enumerate(steps):
                self.writer.add_stats(int(s), values[k], sparse_rows(index[k], hist[k]))
                if self.dump_every and s % self.dump_every == 0:
                    if int(s) in self.dropped_steps:
                        self.writer.record_drop(int(s), "byte budget max_bytes=1000000 would be "
                                                        "exceeded", 10 ** 6)
                    else:
                        self.writer.add_dump(int(s), self.dump_arrays(int(s)))
                        # bound memory: let the writer catch up
                        while self.writer._queue.qsize() > 4:
                            time.sleep(0.01)

    def sync(self, timeout: float = 30.0) -> None:
        """Block until everything queued so far is on disk (statistics flushed only if the writer
        was made with ``stats_flush_secs=0``): the dump threads' queue first (they write apart
        from the manifest's thread), then a manifest token."""
        if not self.writer.drain(timeout):
            raise TimeoutError(f"the writer's dump threads did not finish within {timeout}s")
        self._sync_token += 1
        token = self._sync_token
        self.writer.update_manifest(synthetic_sync=token)
        deadline = time.monotonic() + timeout
        name = manifest_name(self.writer.worker, self.writer.session)
        while time.monotonic() < deadline:
            try:
                if json.loads(self.writer.store.read(name)).get("synthetic_sync") == token:
                    return
            except (OSError, ValueError, InspectorError):
                pass
            time.sleep(0.02)
        raise TimeoutError(f"writer did not reach sync point {token} within {timeout}s")

    def close(self, status: str = "finished") -> None:
        self.writer.close(status)


def sparse_rows(index: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(splits, index, count) of the non-zero counts of [R, B] histograms whose ``index`` rise
    along each row: the form ``RunWriter.add_stats`` takes."""
    nz = counts > 0
    splits = np.concatenate([[0], np.cumsum(nz.sum(1))]).astype(np.int64)
    return splits, index[nz].astype(np.int16), counts[nz].astype(np.int32)


def _blobs(rng, group: np.ndarray, shape: tuple, parts: np.ndarray | None, gain: float,
           jitter: float = 1.0) -> np.ndarray:
    """Feature maps [N,H,W,C]: one Gaussian blob per channel. With ``parts`` (per-channel
    (row, col)), positive samples put the blob near that part;
    negatives put a weaker one anywhere."""
    h, w, c = shape
    n = len(group)
    centre = rng.uniform(0, [h - 1, w - 1], size=(n, c, 2))
    amp = rng.uniform(0.5, 1.0, size=(n, c))
    if parts is not None:
        pos = group == 1
        centre[pos] = parts[None] + rng.normal(0, jitter, size=(pos.sum(), c, 2))
        amp = np.where(pos[:, None], amp * gain, amp * 0.6)
    rows = np.arange(h)[None, :, None, None]
    cols = np.arange(w)[None, None, :, None]
    sigma = max(h / 8, 0.8)
    d2 = (rows - centre[:, None, None, :, 0]) ** 2 + (cols - centre[:, None, None, :, 1]) ** 2
    noise = rng.normal(0, 0.05, size=(n, h, w, c))
    return amp[:, None, None, :] * np.exp(-d2 / (2 * sigma ** 2)) + noise


def _image(rng, group: np.ndarray, shape: tuple, part: np.ndarray) -> np.ndarray:
    """Input images [N, H, W, C] in [0, 1]: a soft background, and in positive samples a bright
    spot at ``part`` ((row, col) as fractions of the image), where their part filters fire."""
    h, w, c = shape
    n = len(group)
    rows = np.arange(h)[None, :, None]
    cols = np.arange(w)[None, None, :]
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
    img = 0.3 + 0.1 * np.sin(rows / 3.0 + phase) * np.cos(cols / 4.0 - phase)
    r, q = part[0] * h, part[1] * w
    spot = np.exp(-((rows - r) ** 2 + (cols - q) ** 2) / (2 * (h / 8) ** 2))
    img = img + 0.6 * spot * (group[:, None, None] == 1)
    img = img[..., None] * np.linspace(1.0, 0.8, c)[None, None, None, :] \
        + rng.normal(0, 0.02, (n, h, w, c))
    return np.clip(img, 0, 1).astype(np.float32)


def make_synthetic_run(path: str | Path, steps: int = 100, tensors: int = 30,
                       dump_every: int | None = 50, icnn: bool = True, seed: int = 0,
                       nonfinite_at: int | None = None, *, samples: int = 8,
                       dead_relu: bool = True, dropped_steps: tuple[int, ...] = (),
                       finish: bool = True, dead_filter: int | None = None,
                       storage_options: dict | None = None,
                       image: tuple[int, int, int] | None = None, channels: int = 8) -> Any:
    """Write a complete synthetic run of ``steps`` statistics steps and ``tensors`` tensors.

    Dumps at every ``dump_every``-th step (None: none); ``dropped_steps`` are recorded as dumps
    the hook dropped. ``finish=False`` leaves the run's status 'running'. ``dead_filter``: an
    ICNN filter whose pre-mask map is zero in every dump. ``image`` (H, W, C): the run also
    records the model's input images (``IteratorGetNext:0``, first in the catalog), as a run
    of the demo does. ``channels``: the channels of the last conv stage and the ICNN layer.

    >>> p = make_synthetic_run(tmp_path / "r", steps=20, tensors=15,
    ...                        dump_every=10)  # doctest: +SKIP
    """
    b = SyntheticRun(path, tensors, steps_hint=steps, dump_every=dump_every, samples=samples,
                     icnn=icnn, seed=seed, nonfinite_at=nonfinite_at, dead_relu=dead_relu,
                     dropped_steps=dropped_steps, dead_filter=dead_filter,
                     storage_options=storage_options, image=image, channels=channels)
    b.write_steps(0, steps)
    b.close("finished" if finish else "running")
    return b.path



def make_long_run(path: str | Path, steps: int = 10_000, tensors: int = 1_000,
                  real_steps: int = 100, part_rows: int | None = None) -> Path:
    """A run of ``steps`` statistics steps (tens of millions of rows) in minutes, not hours:
    ``real_steps`` steps are written by :func:`make_synthetic_run` (the writer, compaction
    included), then their rows are repeated with shifted step numbers into compacted parts as
    the writer's compaction writes them (``inspector.stats.parts``, ``part_rows`` rows each,
    default its ``COMPACT_ROWS``), merged by levels as the writer merges them
    (``inspector.stats.merge``); the manifest's step range is extended to match. For
    benchmarks of the reader at scale; the statistics repeat every ``real_steps`` steps.

    >>> p = make_long_run(tmp_path / "long", steps=1000, tensors=50)  # doctest: +SKIP
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from inspector.format import stats_range_name
    from inspector.stats.merge import Levels, after_compaction
    from inspector.stats.parts import COMPACT_ROWS, write_sorted
    from inspector.storage.atomic import write_json

    if steps % real_steps:
        raise ValueError(f"steps={steps} must be a multiple of real_steps={real_steps}")
    # local only: it writes parts with pyarrow
    path = Path(make_synthetic_run(path, steps=real_steps, tensors=tensors, dump_every=None,
                                   icnn=False, dead_relu=False))
    files = sorted((path / "stats").glob("*.parquet"))
    block = pa.concat_tables([pq.read_table(f) for f in files])
    per_part = max(1, (part_rows or COMPACT_ROWS) // max(block.num_rows, 1))
    seq, levels = 1000, Levels()
    for first in range(1, steps // real_steps, per_part):
        shifts = range(first, min(first + per_part, steps // real_steps))
        table = pa.concat_tables([block.set_column(block.schema.get_field_index("step"), "step",
                                                   pc.add(block.column("step"), k * real_steps))
                                  for k in shifts])
        part = path / stats_range_name("chief", 1, seq, seq + 1)
        write_sorted(table, part)
        after_compaction(levels, path, "chief", 1, part)  # the writer's summaries and merges
        seq += 2
    manifest = path / manifest_name("chief", 1)
    m = json.loads(manifest.read_text())
    m["steps"] = [m["steps"][0], m["steps"][0] + steps - 1] if m.get("steps") else m.get("steps")
    write_json(manifest, m)
    return path


def make_unindexed_run(path: str | Path, rows: int, tensors: int = 1_000, *,
                       linear: bool = False, row_group_rows: int | None = None) -> Path:
    """A run whose one statistics part holds ``rows`` rows without a row-group index, under a
    small part's name, as an older writer, a hand-made copy or a crash before compaction leaves
    one: :func:`make_synthetic_run`'s 10 steps repeated with shifted step numbers, in the order a
    writer flushes them (step by step, so every row group holds every tensor), written in row
    groups of ``row_group_rows`` (None: one per 10 steps). ``linear``: the histogram columns of
    runs before format version 4 (``hist_lo``, ``hist_hi``, ``histogram`` of 30 bins).

    >>> p = make_unindexed_run(tmp_path / "big", rows=100_000)  # doctest: +SKIP
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from inspector.format import stats_name
    from inspector.stats.parts import parquet_options
    from inspector.storage.atomic import write_json

    path = Path(make_synthetic_run(path, steps=10, tensors=tensors, dump_every=None, icnn=False,
                                   dead_relu=False))
    files = sorted((path / "stats").glob("*.parquet"))
    block = pa.concat_tables([pq.read_table(f) for f in files]).replace_schema_metadata(None)
    for f in files:
        f.unlink()
    if linear:
        block = _linear_histograms(block)
    step = block.schema.get_field_index("step")
    copies = -(-rows // max(block.num_rows, 1))
    with pq.ParquetWriter(path / stats_name("chief", 1, 1), block.schema,
                          **parquet_options(block.schema)) as w:
        left = rows
        for k in range(copies):
            t = block.set_column(step, "step", pc.add(block.column("step"), 10 * k))
            w.write_table(t.slice(0, left), row_group_size=row_group_rows or block.num_rows)
            left -= t.num_rows
    manifest = path / manifest_name("chief", 1)
    m = json.loads(manifest.read_text())
    m.update(stats_parts=1, steps=[0, 10 * copies - 1])
    write_json(manifest, m)
    return path


def _linear_histograms(table: Any) -> Any:
    """``table`` with the equal-width histogram of runs before format version 4 in place of its
    log-magnitude buckets: 30 bins between each row's min and max, its count spread evenly."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bins = 30
    counts = np.asarray(pc.fill_null(table.column("count"), 0).to_numpy(), np.int64)
    hist = np.repeat((counts // bins)[:, None], bins, axis=1).astype(np.int32)
    hist[:, 0] += (counts % bins).astype(np.int32)
    table = table.drop_columns(["hist_bucket", "hist_count"])
    return (table.append_column("hist_lo", pc.fill_null(table.column("min"), 0.0))
            .append_column("hist_hi", pc.fill_null(table.column("max"), 0.0))
            .append_column("histogram", pa.FixedSizeListArray.from_arrays(
                pa.array(hist.ravel(), pa.int32()), bins)))
