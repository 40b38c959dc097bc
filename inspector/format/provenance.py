"""Which batch and weights a session's values, gradients and updates were recorded on, in words.

``DumpHook`` and ``InspectCallback(source="train_batch")`` (the Keras default) record the
training step itself: its batch, the weights before its update, the gradients the update was
computed from. ``InspectCallback`` with the probe as its source (``source="probe"``, or where
the step could not be captured exactly: the manifest's ``probe.fallback``) runs a fixed probe
batch after the step's update: its gradients are the probe's on the updated weights, not the
ones the update came from, and a variable's ``update`` is the step's change beside them. The
catalog's ``captured_on`` says so on every entry of such a session (FORMAT.md); runs written
before that field existed get it from the manifest here.

Example::

    captured_on({"source": "keras",
                 "probe": {"source": "probe"}})   # 'probe batch, after the update'
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

#: the catalog's ``captured_on`` in a session recorded on the probe (FORMAT.md)
PROBE_NOTE = "probe batch, after the update"


def probe_sourced(manifest: Mapping[str, Any]) -> bool:
    """Whether a manifest's session recorded a Keras probe batch (a Keras manifest without
    ``probe.source`` predates ``source="train_batch"``: a probe)."""
    probe = manifest.get("probe")
    return manifest.get("source") == "keras" and (
        not isinstance(probe, Mapping) or probe.get("source", "probe") == "probe")


def captured_on(manifest: Mapping[str, Any]) -> str | None:
    """:data:`PROBE_NOTE` for a session recorded on the probe,
    else None (the training step's own)."""
    return PROBE_NOTE if probe_sourced(manifest) else None


def gradient_meaning(note: str | None) -> str | None:
    """One sentence for a gradient or update recorded under ``note`` (None: nothing to say)."""
    if note != PROBE_NOTE:
        return None
    return ("Recorded on the probe batch, after the update: each gradient is the probe's on the "
            "weights the step produced, not the gradient that step's update was computed from; a "
            "variable's update is the step's change (InspectCallback source='probe').")


def first_note(values: Iterable[Any]) -> str | None:
    """The first ``captured_on`` note among a catalog column's values (None: none is set)."""
    return next((v for v in values if isinstance(v, str) and v), None)
