"""A run's trainings: a session that starts a new training hides the sessions before it.

A run directory accumulates writer sessions (FORMAT.md, "Sessions"). A training session whose
manifest says ``start_step: 0`` began at global step 0: a fresh or warm-started model, or a
graph without a global step whose hook counts its runs anew. Where its worker already
recorded training steps, it *begins a new training*: its steps 1, 2, ... are not those of the
earlier training, so splicing the two into one curve (the later session winning each step it
recorded, the earlier one showing through after it) mixes two trainings. Readers therefore
show, per worker, the sessions from its latest new training on; the earlier ones stay
readable by number (``session=N``) and are listed in ``Run.sessions`` with ``hidden_by``.

A session that starts past step 0 (a resume from a checkpoint) continues the training before
it: the later session wins the steps both recorded, as before.

The writer side, :func:`last_training`, finds what a new session of a worker would overlap, so
the hook can warn when the session starts (``hooks.DumpHook``).

Example::

    hidden = hidden_sessions(run.manifests)     # {("chief", 1): 3}: session 1 hidden by session 3
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .errors import InspectorError
from .format import manifest_name
from .manifest_schema import MAX_MANIFEST_BYTES, load_manifest

#: How many earlier manifests of a worker :func:`last_training` reads at most (evaluations
#: between two trainings each add one): a bound on the object-store requests of a new session.
MAX_LOOKBACK = 64


def begins_training(manifest: Mapping[str, Any]) -> bool:
    """Whether the session started a training at global step 0 (``start_step``, written by
    ``DumpHook``; sessions without it, older runs and Keras fits, never do)."""
    start = manifest.get("start_step")
    return manifest.get("mode") == "train" and isinstance(start, int) and not isinstance(start, bool) and start == 0


def recorded(manifest: Mapping[str, Any]) -> bool:
    """Whether a session recorded a step (its manifest's ``steps`` or dumps)."""
    return bool(manifest.get("steps")) or bool(manifest.get("dumps_written"))


def hidden_sessions(manifests: Mapping[tuple[str, int], Mapping[str, Any]]) -> dict[tuple[str, int], int]:
    """{(worker, session): the later session of that worker whose new training hides it}, for
    every session before a new training (:func:`begins_training`) of a worker that had
    recorded training steps; each is hidden by the first new training after it."""
    by_worker: dict[str, list[int]] = {}
    for w, s in manifests:
        by_worker.setdefault(w, []).append(s)
    out: dict[tuple[str, int], int] = {}
    for w, numbers in by_worker.items():
        numbers.sort()
        starts, trained = [], False
        for s in numbers:
            m = manifests[(w, s)]
            if trained and begins_training(m):
                starts.append(s)
            trained = trained or (m.get("mode") == "train" and recorded(m))
        for s in numbers:
            later = next((r for r in starts if r > s), None)
            if later is not None:
                out[(w, s)] = later
    return out


def last_training(read: Callable[[str, int], bytes], worker: str, session: int) -> tuple[int, int] | None:
    """(session, last step) of ``worker``'s latest training session before ``session`` that
    recorded steps, read from its manifest with ``read(name, limit)`` (``Storage.read``);
    None if there is none among the ``MAX_LOOKBACK`` sessions before, or they cannot be read
    (nothing to compare: the caller says nothing)."""
    for s in range(session - 1, max(0, session - 1 - MAX_LOOKBACK), -1):
        name = manifest_name(worker, s)
        try:
            m = load_manifest(name, data=read(name, MAX_MANIFEST_BYTES))
        except (OSError, InspectorError):
            continue
        steps = m.get("steps") or [None, None]
        if m.get("mode") == "train" and isinstance(steps[1], int):
            return s, steps[1]
    return None
