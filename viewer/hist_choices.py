"""What the pages that show histograms (Distributions, Compare, Tensor browser) choose and say
alike: the kinds and groups of a tensor's histograms, the x-axis and re-binning pickers, and the
words their captions use (a kind's noun, what the bins are, whether buckets were re-binned)."""
from __future__ import annotations

import streamlit as st

from inspector.analysis import hist_view
from inspector.analysis.binning import Bins
from inspector.format.loghist import LogHistogram


def kinds_of(run, tensor: str) -> list[str]:
    return ["forward"] + (["gradient"] if bool(run.tensors.loc[tensor, "has_gradient"]) else [])


def pick_groups(hists: dict) -> dict:
    """The named groups (positive/negative, classes, a function's) where the tensor has them, else
    'all'."""
    named = {g: h for g, h in hists.items() if g != "all"}
    return named or hists


BIN_LABELS = {"auto": "auto", "linear": "linear", "symlog": "symmetric log"}
AXIS_LABELS = {"auto": "auto", "log": "signed log", "linear": "linear"}
#: What a kind's values are called in the read-off line.
NOUNS = {"forward": "value", "gradient": "gradient", "update": "update"}


def axis_choice(key: str, container=st) -> str:
    """The histograms' x axis: 'auto', 'log' (signed log-magnitude) or 'linear'
    (:func:`inspector.analysis.hist_view.choose_axis`)."""
    return container.radio("x axis", list(AXIS_LABELS), format_func=AXIS_LABELS.get, key=key,
                           horizontal=True, bind="query-params",
                           help="signed log: one bar per stored bucket (8 per power of two), "
                                "negative values mirrored left of the zeros' bar, so a gradient "
                                "spanning 1e-9..1e-1 shows whole; linear: 40 equal bins over the "
                                "exact min..max. auto: signed log for gradients, linear for "
                                "forward values unless one bin would hold over "
                                f"{hist_view.SPIKE:.0%} of the non-zero values")


def bins_choice(key: str, container=st) -> str:
    """How to re-bin dumped values with ``np.histogram`` (the tensor browser): 'auto'
    (symmetric log for long-tailed values), 'linear' or 'symlog'
    (:mod:`inspector.analysis.binning`)."""
    return container.radio("Bins of dumped values", list(BIN_LABELS), format_func=BIN_LABELS.get,
                           key=key, horizontal=True,
                           help="symmetric log: bins spaced geometrically in |x| on both sides of "
                                "a small linear zone around 0 (like TensorBoard's exponential "
                                "buckets), so a long-tailed gradient is not one spike")


def bins_caption(bins: Bins) -> str:
    """What the bins are, for the figure's caption."""
    if bins.scale == "symlog":
        return (f"{len(bins.edges) - 1} symmetric-log bins (linear within ±{bins.linthresh:.2g}); "
                f"y = fraction of values per bin")
    return f"{len(bins.edges) - 1} equal bins"


def rebinned(hists) -> bool:
    """Whether a linear axis re-bins log-magnitude buckets (else it draws stored equal-width
    bins)."""
    return any(isinstance(h, LogHistogram) for h in hists)
