"""The dump-step picker every page shares: says why each step was dumped, marks damaged dumps,
and defaults to the newest readable one (headers only, via :func:`viewer.data.dump_infos`).

Example::

    step = dump_step_picker(ctx, "Dump step", key="fm_step")      # None (after a message) if none
"""
from __future__ import annotations

import streamlit as st

from . import data
from .ui import Ctx, need


def explicit(step: int, config: dict) -> bool:
    """True if ``step`` is in one of ``config['dump_steps']`` ([first, last] inclusive ranges)
    and not a multiple of ``dump_every_n_steps``: the hook dumped it because it was listed.

    >>> explicit(25, {"dump_every_n_steps": 10, "dump_steps": [[25, 25]]})
    True
    """
    every = config.get("dump_every_n_steps")
    if isinstance(every, int) and every > 0 and step % every == 0:
        return False
    ranges = config.get("dump_steps")
    return any(isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(v, int) for v in r)
               and r[0] <= step <= r[1] for r in (ranges if isinstance(ranges, list) else []))


def reason_of(meta: dict, step: int, run) -> str:
    """Why ``step`` was dumped, from its ``__metadata__`` (``meta``): the hook's reason ('schedule'
    when the key is absent: older runs), with 'schedule' told apart into 'explicit step' by the
    writing session's ``dump_steps`` (the hook writes 'schedule' for both)."""
    reason = str(meta.get("reason") or "schedule")
    if reason != "schedule":
        return reason
    try:
        manifest = run.manifests.get((meta.get("worker"), int(meta.get("session", -1))), run.manifest)
    except (TypeError, ValueError):
        manifest = run.manifest
    config = manifest.get("config") if isinstance(manifest, dict) else None
    return "explicit step" if explicit(int(step), config if isinstance(config, dict) else {}) else "schedule"


def label(info: dict) -> str:
    """'34 (NaN/Inf in the loss)', '40 (damaged: unreadable)' (a select box shows it as text)."""
    why = "damaged: unreadable" if info["damaged"] else str(info["reason"])[:60]
    return f"{info['step']} ({why})"


def default_index(infos: list[dict], near: int | None = None) -> int:
    """Index of the newest readable dump, or of the readable one nearest ``near`` (the earlier
    on a tie); the newest if none is readable."""
    ok = [i for i, d in enumerate(infos) if not d["damaged"]] or [len(infos) - 1]
    if near is None:
        return ok[-1]
    return min(ok, key=lambda i: (abs(infos[i]["step"] - near), infos[i]["step"]))


def dump_step_picker(ctx: Ctx, title: str, key: str, near: int | None = None, container=st,
                     help: str | None = None) -> int | None:
    """A select box of the run's dump steps, each labelled with why it was dumped (damaged
    ones marked); defaults to the newest readable dump (or the readable one nearest ``near``).
    None, after a message, if the run has no dumps."""
    infos = data.dump_infos(ctx.path, ctx.sig)
    if not need(bool(infos), "No full dumps in this run (the hook dumps every dump_every_n_steps)."):
        return None
    by_step = {d["step"]: d for d in infos}
    return container.selectbox(title, list(by_step), index=default_index(infos, near), key=key, help=help,
                               bind="query-params",
                               format_func=lambda s: label(by_step[s]))
