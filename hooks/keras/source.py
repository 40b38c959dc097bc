"""Which batch ``InspectCallback`` records: the training step itself, or a probe batch.

The default, ``source="train_batch"``, captures inside ``fit``'s train step (``keras_step``):
the step's batch, the weights before its update, the gradients the update came from. Where
that cannot be exact (XLA, ``run_eagerly``, a custom ``train_step`` the
capture refuses) the callback falls back to the probe, with a warning naming why: the batch
given as ``probe=``, else the first batch of ``fit``'s own data (:func:`first_batch`). With
``probe=`` and no ``source`` the probe is the source (the fixed batch asked for).

Example::

    source = resolve_source(None, None)                   # 'train_batch'
    batch = first_batch(fit_arguments(model))             # inside fit: (x, y, sw) tensors, or None
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from hooks import capture

SOURCES = ("train_batch", "probe")
#: probe size taken from fit's data where fit's batch_size is not known (Keras's default batch)
DEFAULT_BATCH = 32


def resolve_source(source: str | None, probe: Any) -> str:
    """``source``, or where it is None: ``"probe"`` when ``probe=`` is given (a fixed batch was
    asked for), else ``"train_batch"``. ValueError for anything else."""
    if source is None:
        return "train_batch" if probe is None else "probe"
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: expected 'train_batch' (the training step itself, "
                         "the default) or 'probe' (a fixed batch, run after each sampled step's "
                         "update)")
    return source


def probe_batch(probe) -> tuple[Any, Any, Any]:
    """(x, y, sample_weight) tensors from ``(x, y)``, ``(x, y, sample_weight)``, ``x`` alone or a
    ``tf.data.Dataset`` (its first element). Raises ValueError naming what was given."""
    if isinstance(probe, tf.data.Dataset):
        probe = next(iter(probe))
    if isinstance(probe, (tuple, list)) and len(probe) in (2, 3):
        parts = list(probe) + [None] * (3 - len(probe))
    elif isinstance(probe, (tuple, list)):
        raise ValueError(f"probe has {len(probe)} elements: pass (x, y), (x, y, sample_weight) or "
                         f"a dataset whose elements are those")
    else:
        parts = [probe, None, None]
    x, y, sw = (None if p is None else tf.nest.map_structure(tf.convert_to_tensor, p)
                for p in parts)
    first = tf.nest.flatten(x)[0] if x is not None else None
    if first is None or first.shape.rank in (None, 0):
        raise ValueError("probe x must be a batch (a tensor with a leading batch axis), got "
                         f"{probe!r:.80}")
    return x, y, sw


def check_probe(source: str, probe, positive) -> tuple[Any, Any, Any] | None:
    """The probe batch (None where none is given), or ValueError naming what is wrong."""
    if source == "probe" and probe is None:
        raise ValueError("probe= is required with source='probe': pass (x, y) of a fixed batch, or "
                         "leave source out to record the training step itself")
    if probe is None:
        if positive is not None and not callable(positive):
            raise ValueError("positive= as an array needs a fixed probe; with source='train_batch' "
                             "pass a callable on the batch's targets (y -> bool [N])")
        return None
    batch = probe_batch(probe)
    y = batch[1]
    unsure = capture.not_class_ids(y) if positive is None and isinstance(y, tf.Tensor) else None
    if unsure is not None and bool(np.any(unsure.numpy())):
        raise ValueError(f"the probe's targets are floats that are not all whole numbers (e.g. "
                         f"{float(tf.boolean_mask(tf.reshape(y, [-1]), unsure)[0]):g}): the "
                         "default positive rule (label != 0) needs class ids; pass positive= (a "
                         f"callable on the targets, or a bool array [N])")
    if source == "train_batch" and positive is not None and not callable(positive):
        raise ValueError("positive= as an array fits the probe only, but source='train_batch' "
                         "records each step's own batch (the probe is its fallback); pass a "
                         "callable on the targets (y -> bool [N])")
    return batch


@dataclass
class FitArguments:
    """What ``model.fit`` was called with (after its validation split): the data a fallback
    probe is taken from. Held for the fit's length only."""
    x: Any
    y: Any
    sample_weight: Any
    batch_size: int | None


def fit_frame(model, frame) -> Any:
    """The frame of ``model.fit`` that ``frame`` runs inside (a function named fit whose
    ``self`` is the model), or None."""
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def fit_arguments(model) -> FitArguments | None:
    """The arguments of the ``model.fit`` this thread is in (None outside one: a loop calling
    the callback's methods by hand). Read from fit's frame, which is not kept."""
    frame = fit_frame(model, sys._getframe(1))
    if frame is None:
        return None
    local = frame.f_locals
    size = local.get("batch_size")
    return FitArguments(local.get("x"), local.get("y"), local.get("sample_weight"),
                        size if isinstance(size, int) and size > 0 else None)


def _sliceable(value) -> bool:
    return all(isinstance(a, (np.ndarray, tf.Tensor)) and len(a.shape) >= 1
               for a in tf.nest.flatten(value))


def first_batch(args: FitArguments | None) -> tuple[tuple[Any, Any, Any], str] | None:
    """A probe from fit's own data, and where it came from in words: a ``tf.data.Dataset``'s
    first element (a batch), or the first ``batch_size`` (default 32) samples of arrays. None
    for data that cannot be read without taking batches from training (a generator, a
    ``PyDataset``, a ``Sequence``)."""
    if args is None or args.x is None:
        return None
    if isinstance(args.x, tf.data.Dataset):
        return probe_batch(args.x), "the first batch of fit's dataset"
    parts = [p for p in (args.x, args.y, args.sample_weight) if p is not None]
    if not all(map(_sliceable, parts)):
        return None
    n = args.batch_size or DEFAULT_BATCH
    cut = [tf.nest.map_structure(lambda a: a[:n], p) for p in parts]
    return probe_batch(tuple(cut) if len(cut) > 1 else cut[0]), \
        f"the first {n} samples of fit's x and y"
