"""The feature maps in a dump, as Feature maps and Masks & templates both find them: which dumped
tensors are per-sample (N, H, W, C) maps, which of them is the model's input image (and why none
is), and how a kept sample is labelled in a picker."""
from __future__ import annotations

import numpy as np
import pandas as pd

from inspector.format import INPUT_OP_TYPES

from .ui import plain

#: Op types of convolutions: the Feature maps page opens on the first of them in graph order
#: (catalog order)
CONV_OP_TYPES = ("Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput")


def sample_label(samples: pd.DataFrame, i: int) -> str:
    r = samples.iloc[i]
    return (f"#{i}: batch index {r.get('index', '?')}, label {r.get('label', '?')}, "
            f"{r.get('group', '?')}")


def map_tensors(cat: pd.DataFrame, keys: set[str]) -> list[str]:
    """Names of the dumped per-sample 4-D (N, H, W, C) tensors, in graph (catalog) order."""
    return [n for n in cat["name"] if f"forward/{n}" in keys and bool(cat.loc[n, "batched"])
            and len(cat.loc[n, "shape"] or []) == 4]


def is_input(cat: pd.DataFrame, name: str) -> bool:
    return str(cat.loc[name, "op_type"]) in INPUT_OP_TYPES


def model_input(cat: pd.DataFrame, maps: list[str]) -> str | None:
    """The dumped model input image among ``maps``: an input op's output (``IteratorGetNext:0``,
    a Keras probe's ``probe_x:0``) that feeds a convolution, else the first input; None if the
    dump holds none."""
    inputs = [n for n in maps if is_input(cat, n)]
    feeds = [n for n in inputs if any(f in CONV_OP_TYPES for f in (_list(cat.loc[n].get("feeds"))))]
    return (feeds or inputs or [None])[0]


def _list(v) -> list:
    return list(v) if isinstance(v, (list, tuple, np.ndarray)) else []


def why_no_input(cat: pd.DataFrame, step: int) -> str:
    """Why the overlay has no input image at ``step``."""
    known = [n for n in cat["name"] if is_input(cat, n) and len(cat.loc[n, "shape"] or []) == 4]
    if known:
        return (f"The model input {plain(known[0])} is in the catalog but not in the dump of step "
                f"{step}: no overlay on the input image.")
    return ("The model input was not dumped: no 4-D output of an input op (IteratorGetNext, "
            "Placeholder) is in the catalog (an input fed as integers, or left out by "
            "include/exclude/op_types). No overlay on the input image.")
