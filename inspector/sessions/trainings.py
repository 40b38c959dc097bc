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

import pandas as pd

from inspector.errors import InspectorError
from inspector.format import manifest_name
from inspector.format.manifest import MAX_MANIFEST_BYTES, load_manifest

#: How many earlier manifests of a worker :func:`last_training` reads at most (evaluations
#: between two trainings each add one): a bound on the object-store requests of a new session.
MAX_LOOKBACK = 64


def begins_training(manifest: Mapping[str, Any]) -> bool:
    """Whether the session started a training at global step 0 (``start_step``, written by
    ``DumpHook``; sessions without it, older runs and Keras fits, never do)."""
    start = manifest.get("start_step")
    return manifest.get("mode") == "train" and isinstance(start, int) \
        and not isinstance(start, bool) and start == 0


def recorded(manifest: Mapping[str, Any]) -> bool:
    """Whether a session recorded a step (its manifest's ``steps`` or dumps)."""
    return bool(manifest.get("steps")) or bool(manifest.get("dumps_written"))


def hidden_sessions(manifests: Mapping[tuple[str, int], Mapping[str, Any]]
                    ) -> dict[tuple[str, int], int]:
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


def last_training(read: Callable[[str, int], bytes], worker: str,
                  session: int) -> tuple[int, int] | None:
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


def view_note(sessions: pd.DataFrame, mode: str, worker: str | None) -> str | None:
    """Which sessions a merged view's curves are from (``sessions``: ``Run.sessions``; ``mode``
    and ``worker`` the view's), where that is not a single session: the sessions shown with
    the steps each recorded (a later one wins the steps both recorded), and those hidden by a
    new training, with how to read them. None where one session (or none) has steps.

    >>> print(view_note(run.sessions, "train", "chief"))   # doctest: +SKIP
    Curves join sessions s1 (steps 1..60), s3 (steps 51..120, resumed at step 50: wins steps
    51..60)."""
    rows = sessions[(sessions["worker"] == worker) & (sessions["mode"] == mode)
                    & sessions["first_step"].notna()]
    shown = rows[rows["hidden_by"].isna()].sort_values("session")
    hidden = rows[rows["hidden_by"].notna()].sort_values("session")
    parts = []
    if len(shown) > 1:
        parts.append("Curves join sessions "
                     + ", ".join(_shown(r, shown) for r in shown.itertuples()) + ".")
    if len(hidden):
        spans = ", ".join(f"s{r.session} (steps {int(r.first_step)}..{int(r.last_step)})"
                          for r in hidden.itertuples())
        later = int(hidden["hidden_by"].max())
        parts.append(f"Hidden: {spans}, an earlier training: session {later} began a new one at "
                     "step 0. Read it with run.query_stats(session=N) or tf-inspector export "
                     "--session N.")
    return " ".join(parts) or None


def _shown(r: Any, shown: pd.DataFrame) -> str:
    """One shown session: its steps, and those it takes over from the sessions before it."""
    first, last = int(r.first_step), int(r.last_step)
    earlier = shown[shown["session"] < r.session]
    overlap = int(earlier["last_step"].max()) if len(earlier) else first - 1
    if overlap < first:
        return f"s{r.session} (steps {first}..{last})"
    how = "a later session" if pd.isna(r.start_step) else f"resumed at step {int(r.start_step)}"
    return f"s{r.session} (steps {first}..{last}, {how}: wins steps {first}..{min(overlap, last)})"
